"""The torch side of `dstoolkit ckpt`: conversion to a universal checkpoint (DeepSpeed's ds_to_universal),
export to Hugging Face safetensors (DeepSpeed's zero_to_fp32), and the real runs that prove both.
The metadata reading that needs no tensors is `dstoolkit.ckpt` (core)."""
