"""Read a `torch.save` file without torch: check the zip container, and unpickle its metadata with every tensor
replaced by a `TensorMeta` (dtype, shape, bytes) and every class the pickle names replaced by an inert stub.

torch >= 1.6 writes a zip archive (`<name>/data.pkl`, `<name>/data/<key>` one entry per storage, `<name>/version`);
the pickle refers to storages through persistent ids `('storage', <torch.XStorage>, key, location, numel)` and
rebuilds tensors with `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)` (torch/serialization.py,
torch/_utils.py). No code from the file runs: `find_class` never imports anything except plain containers.
A truncated file has no zip end-of-central-directory record; a damaged one fails the member CRC check.
"""
from __future__ import annotations

import pickle
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

STORAGE_DTYPES = {
    "FloatStorage": "float32", "DoubleStorage": "float64", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
    "ByteStorage": "uint8", "BoolStorage": "bool", "UntypedStorage": "uint8",
}
"""torch's typed-storage class names (torch/storage.py) -> the dtype name they hold."""
DTYPE_NAMES = {"float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
               "float8_e4m3fn", "float8_e5m2", "complex64"}
SAFE_GLOBALS = {("collections", "OrderedDict"): OrderedDict, ("builtins", "set"): set,
                ("builtins", "frozenset"): frozenset, ("builtins", "slice"): slice, ("builtins", "complex"): complex}


class TorchFileError(ValueError):
    """The file is not a readable torch.save archive; the message says why (truncated, damaged, not torch)."""


@dataclass(frozen=True)
class TensorMeta:
    """A tensor in the file, never loaded: its dtype, shape and the bytes of its storage."""

    dtype: str
    shape: tuple[int, ...]
    storage_bytes: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= int(d)
        return n


class Opaque:
    """Stand-in for any class the pickle names (a DeepSpeed enum, a torch.Size, an argparse Namespace ...)."""

    module = "?"
    qualname = "?"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.args = args
        self.state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        return f"<{self.module}.{self.qualname}>"


@dataclass
class _Storage:
    dtype: str
    key: str
    numel: int


def _stub(module: str, name: str) -> Any:
    if (module, name) in SAFE_GLOBALS:
        return SAFE_GLOBALS[(module, name)]
    if module == "torch" and name in STORAGE_DTYPES:
        return ("storage-type", STORAGE_DTYPES[name])
    if module == "torch" and name in DTYPE_NAMES:
        return ("dtype", name)
    if module == "torch" and name == "Size":
        return lambda dims=(): tuple(int(d) for d in dims)
    if module == "torch._utils" and name.startswith("_rebuild_tensor"):
        def rebuild(storage, offset, size, *rest):
            return TensorMeta(storage.dtype, tuple(int(d) for d in size), _nbytes(storage))
        return rebuild
    if module == "torch._utils" and name == "_rebuild_parameter":
        return lambda data, *rest: data
    if module == "torch._utils" and name == "_rebuild_parameter_with_state":
        return lambda data, *rest: data
    return type(name, (Opaque,), {"module": module, "qualname": name})


_ELEMENT_BYTES = {"float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
                  "int8": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1, "complex64": 8}


def _nbytes(storage: Any) -> int:
    return int(storage.numel) * _ELEMENT_BYTES.get(storage.dtype, 1) if isinstance(storage, _Storage) else 0


class _MetaUnpickler(pickle.Unpickler):
    def __init__(self, f, sizes: dict[str, int]) -> None:
        super().__init__(f)
        self.sizes = sizes

    def find_class(self, module: str, name: str) -> Any:
        return _stub(module, name)

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and pid and pid[0] == "storage":
            _, stype, key, _location, numel = pid[:5]
            dtype = stype[1] if isinstance(stype, tuple) and stype[0] in ("storage-type", "dtype") else "uint8"
            if dtype == "uint8" and isinstance(stype, tuple) and stype[0] == "storage-type":
                # UntypedStorage: numel counts bytes; the dtype comes with the tensor (torch >= 2 writes typed ids)
                pass
            return _Storage(dtype, str(key), int(numel))
        return Opaque(pid)


def check_archive(path: Path, *, crc: bool = True) -> Optional[str]:
    """None when `path` is an intact torch.save zip archive, else what is wrong with it (one line)."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        return f"cannot read ({exc.strerror})"
    if size == 0:
        return "is empty (0 bytes): the save did not finish"
    try:
        with zipfile.ZipFile(path) as zf:
            names = zf.namelist()
            if not any(n.endswith("data.pkl") for n in names):
                return "is a zip archive without data.pkl: not a torch.save file"
            if crc:
                bad = zf.testzip()
                if bad is not None:
                    return f"is damaged: member {bad} fails its CRC check"
    except zipfile.BadZipFile:
        with open(path, "rb") as f:
            head = f.read(4)
        if head == b"PK\x03\x04":
            return f"is truncated ({size} bytes, no zip end record): the save did not finish or the copy was cut"
        return "is not a torch.save zip archive (legacy or foreign format)"
    except (OSError, EOFError, ValueError) as exc:  # zipfile on a cut-off member
        return f"is truncated or damaged ({exc})"
    return None


def read_meta(path: Path) -> Any:
    """The object `torch.load(path)` would return, with tensors as `TensorMeta` and classes as stubs.

    Raises:
        TorchFileError: when the file is not an intact torch.save archive.
    """
    problem = check_archive(path, crc=False)
    if problem is not None:
        raise TorchFileError(problem)
    with zipfile.ZipFile(path) as zf:
        pkl = next(n for n in zf.namelist() if n.endswith("data.pkl"))
        prefix = pkl[: -len("data.pkl")]
        sizes = {n[len(prefix) + len("data/"):]: zf.getinfo(n).file_size for n in zf.namelist()
                 if n.startswith(prefix + "data/")}
        try:
            with zf.open(pkl) as f:
                return _MetaUnpickler(f, sizes).load()
        except (pickle.UnpicklingError, EOFError, AttributeError, TypeError, ValueError, IndexError) as exc:
            raise TorchFileError(f"has an unreadable pickle ({type(exc).__name__}: {exc})") from None


def tensors(obj: Any, prefix: str = "") -> list[tuple[str, TensorMeta]]:
    """Every TensorMeta inside a read_meta result, with its key path (a.b.0.c)."""
    out: list[tuple[str, TensorMeta]] = []
    if isinstance(obj, TensorMeta):
        out.append((prefix, obj))
    elif isinstance(obj, dict):
        for k, v in obj.items():
            out.extend(tensors(v, f"{prefix}.{k}" if prefix else str(k)))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out.extend(tensors(v, f"{prefix}.{i}" if prefix else str(i)))
    return out


def payload_bytes(path: Path) -> int:
    """Bytes of the tensor storages in a torch.save archive (its data/ members), without the pickle or zip headers."""
    with zipfile.ZipFile(path) as zf:
        return sum(i.file_size for i in zf.infolist() if "/data/" in i.filename and not i.filename.endswith("/"))
