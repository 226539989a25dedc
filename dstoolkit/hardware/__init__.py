"""dstoolkit.hardware: the machine's facts. The GPU table with cited rows (`table`) and measured rates that
replace its nominal ones (`calibration`). The bottom of the core: imports nothing else from dstoolkit."""
from dstoolkit.hardware.table import GPU_TABLE, GpuSpec, get_gpu, gpu_name_error, known_gpu_names, lookup_gpu_name

__all__ = ["GPU_TABLE", "GpuSpec", "get_gpu", "gpu_name_error", "known_gpu_names", "lookup_gpu_name"]
