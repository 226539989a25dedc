"""The batch ramp, as the trainer imports it. The schedule lives in the core (`dstoolkit.estimate.batch_ramp`) so
that `dstoolkit estimate --tokens` counts the same steps the trainer runs; this module re-exports it."""
from dstoolkit.estimate.batch_ramp import BatchRamp, RampPoint

__all__ = ["BatchRamp", "RampPoint"]
