"""Spec-level FP8 gate: the recipe must run on the spec's GPU and CUDA (issue #6)."""
import pytest

from dstoolkit.spec import SpecError, spec_from_dict


def _spec(gpu, fp8=None, cuda=None, precision="fp8"):
    return spec_from_dict({
        "model": {"preset": "tiny"},
        "cluster": {"gpu": gpu, "gpus_per_node": 8, "cuda_version": cuda},
        "training": {"seq_len": 128, "global_batch": 64, "precision": precision, "fp8": fp8},
    })


def test_block_recipe_on_hopper_with_cuda_12_9_is_accepted():
    spec = _spec("H100-SXM", {"recipe": "block"}, "12.9")
    assert spec.training.fp8_config().recipe == "block"


def test_default_recipe_is_transformer_engines():
    cfg = _spec("H100-SXM").training.fp8_config()
    assert (cfg.recipe, cfg.amax_history_len, cfg.amax_compute_algo) == ("delayed", 1024, "max")


@pytest.mark.parametrize("gpu, fp8, cuda, match", [
    ("A100-80G", None, None, "has no fp8 tensor cores"),
    ("H100-SXM", {"recipe": "block"}, "12.4", r"needs CUDA >= 12.9 but CUDA is 12.4"),
    ("L40S", {"recipe": "block"}, None, r"needs compute capability sm_90\+ but 'L40S' is sm_89"),
    ("H100-SXM", {"recipe": "mxfp8"}, None, r"sm_100"),
    ("H100-SXM", {"recipe": "blok"}, None, r"training\.fp8\.recipe"),
])
def test_fp8_the_gpu_cannot_run_is_reported(gpu, fp8, cuda, match):
    with pytest.raises(SpecError, match=match):
        _spec(gpu, fp8, cuda)


def test_fp8_section_without_fp8_precision_is_an_error():
    with pytest.raises(SpecError, match=r"training\.fp8 is set but training\.precision='bf16'"):
        _spec("H100-SXM", {"recipe": "block"}, precision="bf16")
