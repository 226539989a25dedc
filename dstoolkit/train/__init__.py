"""dstoolkit.train: batch ramp, checkpoint policy, spike guard, monitor, atomic checkpoints, example trainer.

Pure-Python pieces import without torch:
    from dstoolkit.train.ramp import BatchRamp
    from dstoolkit.train.spike import SpikeGuard, SpikeGuardConfig
    from dstoolkit.train.monitor import Monitor
    from dstoolkit.train.ckpt import CheckpointManager
Torch pieces: dstoolkit.train.checkpointing (apply_checkpoint_policy, measure_saved_activation_bytes) and
the trainer (`python -m dstoolkit.train.trainer`, launched by deepspeed / torchrun).
"""
from dstoolkit.train.ramp import BatchRamp, RampPoint
from dstoolkit.train.spike import Decision, SpikeGuard, SpikeGuardConfig

__all__ = ["BatchRamp", "RampPoint", "SpikeGuard", "SpikeGuardConfig", "Decision"]
