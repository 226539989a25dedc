"""dstoolkit: validate, generate, estimate and benchmark DeepSpeed configs before you launch.

Importing the package imports no torch or deepspeed; the heavy modules import them lazily.
"""
__version__ = "0.1.0"
