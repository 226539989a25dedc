"""Read a `torch.save` file without torch: check the zip container, and unpickle its metadata with every tensor
replaced by a `TensorMeta` (dtype, shape, bytes) and every class the pickle names replaced by an inert stub.

torch >= 1.6 writes a zip archive (`<name>/data.pkl`, `<name>/data/<key>` one entry per storage, `<name>/version`);
the pickle refers to storages through persistent ids `('storage', <torch.XStorage>, key, location, numel)` and
rebuilds tensors with `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)` (torch/serialization.py,
torch/_utils.py). No code from the file runs: `find_class` never imports anything except plain containers.
A truncated file has no zip end-of-central-directory record; a damaged one fails the member CRC check.

torch < 1.6 (and `torch.save(..., _use_new_zipfile_serialization=False)`) writes the legacy format instead, which
`torch.load` still reads (torch/serialization.py `_legacy_save` / `_legacy_load`): five pickles in a row - the magic
number 0x1950a86a20f9469cfc6c, the protocol version 1001, a sys_info dict, the object (storages as persistent ids
`('storage', <torch.XStorage>, key, location, numel, view_metadata)`), the sorted list of storage keys - then per
key an int64 element count and the raw bytes. It has no checksums: a legacy file is checked by that structure
and its exact length (a cut file ends inside a pickle or a storage), never by CRC.
"""
from __future__ import annotations

import pickle
import struct
import zipfile
from collections import OrderedDict
from dataclasses import dataclass, field
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


LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
"""torch/serialization.py MAGIC_NUMBER: the first pickle of a legacy (non-zip) torch.save file."""
LEGACY_PROTOCOL = 1001


class TorchFileError(ValueError):
    """The file is not a readable torch.save archive; the message says why (truncated, damaged, not torch)."""


@dataclass(frozen=True)
class TensorMeta:
    """A tensor in the file, never loaded: its dtype, shape and the bytes of its storage."""

    dtype: str
    shape: tuple[int, ...]
    storage_bytes: int
    storage: str = field(default="", compare=False, repr=False)
    """The key of its storage in the file: tensors that are views of one storage share it (`storage_bytes_of`)."""

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
            return TensorMeta(storage.dtype, tuple(int(d) for d in size), _nbytes(storage),
                              storage.key if isinstance(storage, _Storage) else "")
        return rebuild
    if module == "torch._tensor" and name == "_rebuild_from_type_v2":
        # a tensor saved with Python attributes or as a subclass (torch/_tensor.py __reduce_ex__: func(*args), then
        # the type and state set on it); DeepSpeed's ZeRO-3 fp32 partitions (fp32_flat_groups) are saved so
        return lambda func, new_type, args, state: func(*args) if callable(func) else Opaque(func, args)
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


def is_legacy(path: Path) -> bool:
    """True when `path` starts like a legacy (non-zip) torch.save file: a pickle (protocol 2+) holding the magic
    number. Says nothing about whether the rest of the file is whole (`check_archive` does)."""
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return False
    return head[:1] == b"\x80" and head[2:3] == b"\x8a" and int.from_bytes(head[4:14], "little") == LEGACY_MAGIC


def _read_legacy(path: Path, *, want_object: bool) -> tuple[Any, int]:
    """(the object with tensors as TensorMeta, bytes of its storages) of a legacy torch.save file.

    Raises:
        TorchFileError: the file is cut short, has trailing bytes, or its pickles are not torch.save's.
    """
    size = path.stat().st_size
    storages: dict[str, _Storage] = {}

    class Recorder(_MetaUnpickler):
        def persistent_load(self, pid: Any) -> Any:
            st = super().persistent_load(pid)
            if isinstance(st, _Storage):
                storages.setdefault(st.key, st)
            return st

    with open(path, "rb") as f:
        try:
            magic = _MetaUnpickler(f, {}).load()
            if magic != LEGACY_MAGIC:
                raise TorchFileError("is not a torch.save file (no torch magic number)")
            proto = _MetaUnpickler(f, {}).load()
            if proto != LEGACY_PROTOCOL:
                raise TorchFileError(f"is a legacy torch.save file of protocol {proto!r}, not {LEGACY_PROTOCOL}")
            sys_info = _MetaUnpickler(f, {}).load()
            little = not isinstance(sys_info, dict) or sys_info.get("little_endian", True)
            obj = Recorder(f, {}).load()
            keys = _MetaUnpickler(f, {}).load()
        except TorchFileError:
            raise
        except (EOFError, pickle.UnpicklingError) as exc:
            if not isinstance(exc, EOFError) and "truncated" not in str(exc):
                raise TorchFileError(f"is a legacy (non-zip) torch.save file with an unreadable pickle "
                                     f"({type(exc).__name__}: {exc})") from None
            raise TorchFileError(f"is a legacy (non-zip) torch.save file cut short ({size} bytes, it ends inside "
                                 "its pickled metadata): the save did not finish or the copy was cut") from None
        except (AttributeError, TypeError, ValueError, IndexError, KeyError) as exc:
            raise TorchFileError(f"is a legacy (non-zip) torch.save file with an unreadable pickle "
                                 f"({type(exc).__name__}: {exc})") from None
        if not isinstance(keys, list):
            raise TorchFileError("is a legacy (non-zip) torch.save file without its storage key list")
        payload = 0
        for key in keys:
            head = f.read(8)
            if len(head) < 8:
                raise TorchFileError(f"is a legacy (non-zip) torch.save file cut short ({size} bytes): storage "
                                     f"{key!r} is missing: the save did not finish or the copy was cut")
            numel = struct.unpack("<q" if little else ">q", head)[0]
            st = storages.get(str(key))
            elem = _ELEMENT_BYTES.get(st.dtype, 1) if st is not None else 1
            if numel < 0 or (st is not None and st.numel != numel):
                raise TorchFileError(f"is a damaged legacy torch.save file: storage {key!r} says {numel} elements, "
                                     f"its tensors {st.numel if st is not None else '?'}")
            nbytes = numel * elem
            here = f.tell()
            if here + nbytes > size:
                raise TorchFileError(f"is a legacy (non-zip) torch.save file cut short ({size} bytes): storage "
                                     f"{key!r} needs {nbytes} bytes from offset {here}: the save did not finish "
                                     "or the copy was cut")
            f.seek(nbytes, 1)
            payload += nbytes
        if f.tell() != size:
            raise TorchFileError(f"is a damaged legacy torch.save file: {size - f.tell()} bytes after its last "
                                 "storage")
    return (obj if want_object else None), payload


_EOCD = b"PK\x05\x06"
_ZIP64_LOCATOR = b"PK\x06\x07"
_EOCD_BYTES = 22  # the end-of-central-directory record without its comment (PKWARE APPNOTE 4.3.16)


def _zip_end(path: Path, size: int, chunk: int = 1 << 20) -> Optional[int]:
    """Where a zip archive's end record stops when bytes follow it, further back than zipfile looks (its last
    64 KiB): the offset just past the record, or None when the file holds none (it was cut short). A record counts
    when its central directory ends where the record starts, or a zip64 locator precedes it (torch's writer adds
    the zip64 records), so tensor bytes that happen to spell the signature are not taken. Read backwards, only for a file zipfile refused."""
    with open(path, "rb") as f:
        pos = size
        tail = b""
        while pos > 0:
            start = max(0, pos - chunk)
            f.seek(start)
            buf = f.read(pos - start) + tail
            at = buf.rfind(_EOCD)
            while at >= 0:
                rec = buf[at:at + _EOCD_BYTES]
                if len(rec) == _EOCD_BYTES:
                    cd_size, cd_offset, comment = struct.unpack("<IIH", rec[12:22])
                    here = start + at
                    if cd_offset + cd_size == here or (here >= 20 and _read_at(f, here - 20, 4) == _ZIP64_LOCATOR):
                        end = here + _EOCD_BYTES + comment
                        return end if end < size else None
                at = buf.rfind(_EOCD, 0, at)
            tail = buf[:_EOCD_BYTES]
            pos = start
    return None


def _read_at(f: Any, offset: int, n: int) -> bytes:
    here = f.tell()
    f.seek(offset)
    data = f.read(n)
    f.seek(here)
    return data


def check_archive(path: Path, *, crc: bool = True) -> Optional[str]:
    """None when `path` is an intact torch.save file, else what is wrong with it (one line).

    A zip archive (torch >= 1.6) is checked by its end record and, with `crc`, every member's CRC; a legacy
    file (`is_legacy`) by its structure and exact length (it has no checksums).
    """
    try:
        size = path.stat().st_size
    except OSError as exc:
        return f"cannot read ({exc.strerror})"
    if size == 0:
        return "is empty (0 bytes): the save did not finish"
    if is_legacy(path):
        try:
            _read_legacy(path, want_object=False)
        except TorchFileError as exc:
            return str(exc)
        except OSError as exc:
            return f"cannot read ({exc.strerror})"
        return None
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
            end = _zip_end(path, size)
            if end is not None:
                return (f"has {size - end} bytes after its zip end record (at byte {end} of {size}): the file grew "
                        "after the save (bytes appended, or extended by truncate or a copy)")
            return f"is truncated ({size} bytes, no zip end record): the save did not finish or the copy was cut"
        return "is not a torch.save file (neither a zip archive nor torch's legacy pickle format)"
    except (OSError, EOFError, ValueError) as exc:  # zipfile on a cut-off member
        return f"is truncated or damaged ({exc})"
    return None


def read_meta(path: Path) -> Any:
    """The object `torch.load(path)` would return, with tensors as `TensorMeta` and classes as stubs.

    Raises:
        TorchFileError: when the file is not an intact torch.save file (zip archive or legacy format).
    """
    problem = check_archive(path, crc=False)
    if problem is not None:
        raise TorchFileError(problem)
    if is_legacy(path):
        return _read_legacy(path, want_object=True)[0]
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


def storage_bytes_of(obj: Any) -> int:
    """The bytes of the distinct storages of the tensors inside a read_meta result (views and tied tensors that
    share a storage are counted once)."""
    seen: dict[str, int] = {}
    total = 0
    for _, t in tensors(obj):
        if t.storage:
            seen[t.storage] = t.storage_bytes
        else:
            total += t.storage_bytes
    return total + sum(seen.values())


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
    """Bytes of the tensor storages in a torch.save file (a zip archive's data/ members, a legacy file's storages),
    without the pickle or zip headers."""
    if is_legacy(path):
        return _read_legacy(path, want_object=False)[1]
    with zipfile.ZipFile(path) as zf:
        return sum(i.file_size for i in zf.infolist() if "/data/" in i.filename and not i.filename.endswith("/"))
