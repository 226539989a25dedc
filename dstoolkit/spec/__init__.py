"""dstoolkit.spec: the user's training spec (model + cluster + training plan) and its YAML loader with
line-located findings. No torch import.

    from dstoolkit.spec import load_spec
    spec = load_spec("ds_configs/tiny_cpu.yaml")
"""
from dstoolkit.spec.checkpoint import CheckpointPolicy
from dstoolkit.spec.errors import SpecError, SpecFieldError, SpecFinding, SpecSource
from dstoolkit.spec.loader import load_spec, spec_from_dict
from dstoolkit.spec.cluster import ClusterSpec
from dstoolkit.spec.model import BatchRampSpec, ModelSpec, Spec, TrainingSpec

__all__ = ["BatchRampSpec", "CheckpointPolicy", "ClusterSpec", "ModelSpec", "Spec", "SpecError", "SpecFieldError",
           "SpecFinding", "SpecSource", "TrainingSpec", "load_spec", "spec_from_dict"]
