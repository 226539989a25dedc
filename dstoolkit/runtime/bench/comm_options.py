"""What `dstoolkit bench comm` is asked to run: the collectives, the sizes (nccl-tests' -b/-e notation), the dtype
and the timing settings, parsed and checked before any rank starts (split from runtime.bench.comm, which measures
them). No torch import: the CLI parses and refuses bad flags without it."""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any, Optional, Sequence

from dstoolkit.runtime.bench.harness import BenchInputError

BENCH_NAME = "comm"

#: Supported collectives, in the order they are run and printed.
OPS: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


#: User-facing dtype names -> (torch dtype attribute, nccl-tests type name).
DTYPES: dict[str, tuple[str, str]] = {
    "float32": ("float32", "float"), "float": ("float32", "float"), "fp32": ("float32", "float"),
    "float16": ("float16", "half"), "half": ("float16", "half"), "fp16": ("float16", "half"),
    "bfloat16": ("bfloat16", "bfloat16"), "bf16": ("bfloat16", "bfloat16"),
    "float64": ("float64", "double"), "double": ("float64", "double"),
    "int32": ("int32", "int32"), "int": ("int32", "int32"),
    "int64": ("int64", "int64"),
    "int8": ("int8", "int8"), "uint8": ("uint8", "uint8"),
}

#: Bytes per element for each torch dtype name above (avoids importing torch to parse arguments).
ELEMENT_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8, "int8": 1, "uint8": 1}

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(I?B?)?\s*$", re.IGNORECASE)
#: nccl-tests' -b/-e suffixes are binary: 1K = 1024 bytes.
_SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_size(text: str) -> int:
    """Parse '64M', '1K', '4096' (binary suffixes, as nccl-tests) into bytes; size 0 is an error."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise BenchInputError(f"--sizes: cannot parse size {text!r}; use e.g. 1K, 64M, 1G or a byte count")
    value = float(m.group(1)) * _SUFFIX[m.group(2).upper()]
    if value < 1:
        raise BenchInputError(f"--sizes: size {text!r} is 0 bytes; every size must be at least 1 byte (e.g. 1K)")
    return int(value)


def parse_sizes(spec: str) -> list[int]:
    """Parse a size list: 'MIN:MAX' (x2 steps), 'MIN:MAX:FACTOR', or comma-separated sizes; mixable by commas."""
    sizes: list[int] = []
    for part in str(spec).split(","):
        part = part.strip()
        if not part:
            continue
        if ":" in part:
            fields = part.split(":")
            if len(fields) not in (2, 3):
                raise BenchInputError(f"--sizes: {part!r} must be MIN:MAX or MIN:MAX:FACTOR")
            lo, hi = parse_size(fields[0]), parse_size(fields[1])
            factor = float(fields[2]) if len(fields) == 3 else 2.0
            if factor <= 1:
                raise BenchInputError(f"--sizes: step factor {fields[2]!r} in {part!r} must be > 1")
            if hi < lo:
                raise BenchInputError(f"--sizes: MAX {fields[1]!r} is below MIN {fields[0]!r} in {part!r}")
            s = float(lo)
            while s <= hi * (1 + 1e-9):
                sizes.append(int(s))
                s *= factor
        else:
            sizes.append(parse_size(part))
    if not sizes:
        raise BenchInputError(f"--sizes: {spec!r} gives no sizes; use e.g. 1K:256M")
    return sorted(set(sizes))


def parse_ops(spec: str | Sequence[str]) -> list[str]:
    """Parse 'all_reduce,all_gather' (or 'all'); unknown names are an error naming the valid ones."""
    items = spec.split(",") if isinstance(spec, str) else list(spec)
    items = [i.strip().replace("-", "_") for i in items if i.strip()]
    if items == ["all"]:
        return list(OPS)
    bad = [i for i in items if i not in OPS]
    if bad:
        raise BenchInputError(f"--ops: unknown op {bad[0]!r}; choose from {', '.join(OPS)} (or 'all')")
    if not items:
        raise BenchInputError("--ops: no op given; choose from " + ", ".join(OPS))
    return [op for op in OPS if op in items]


def parse_dtype(name: str) -> str:
    """User dtype name -> canonical torch dtype name."""
    try:
        return DTYPES[name.lower()][0]
    except KeyError:
        raise BenchInputError(f"--dtype: unknown dtype {name!r}; choose from {', '.join(sorted(DTYPES))}") from None


@dataclasses.dataclass
class CommOptions:
    """Everything `run_comm` needs (the CLI fills this from flags)."""

    ops: list[str]
    sizes: list[int]
    dtype: str = "float32"
    iters: int = 20
    """Ops per timed repetition (nccl-tests -n)."""
    warmup: int = 5
    """Untimed ops before timing (nccl-tests -w)."""
    reps: int = 5
    """Timed repetitions per row: the samples behind the median and spread."""
    backend: str = "gloo"
    world_size: int = 2
    out: Optional[str] = None
    """JSON Lines file to append rows to (resumable)."""
    resume: bool = True
    time_budget_s: float = 20.0
    """Per-row timing budget: iters is reduced (never below 1) for sizes where iters x reps would exceed it."""
    timeout_s: float = 1800.0
    progress: bool = True

    def check(self) -> None:
        """Validate values that argparse cannot (exit 2 in the CLI)."""
        parse_ops(self.ops)
        if self.backend not in ("gloo", "nccl"):
            raise BenchInputError(f"--backend: {self.backend!r} is not supported; use gloo (CPU) or nccl (GPU)")
        if self.world_size < 2:
            raise BenchInputError(f"--world-size: {self.world_size} ranks measure no communication; use at least 2")
        if self.iters < 1 or self.reps < 1 or self.warmup < 0:
            raise BenchInputError(
                f"--iters {self.iters}, --reps {self.reps}, --warmup {self.warmup}: iters and reps must be >= 1, warmup >= 0"
            )
        if any(s <= 0 for s in self.sizes):
            raise BenchInputError("--sizes: every size must be at least 1 byte")
        for flag, value in (("--time-budget-s", self.time_budget_s), ("--timeout-s", self.timeout_s)):
            if not (value > 0 and math.isfinite(value)):
                raise BenchInputError(f"{flag} {value}: must be a positive number of seconds")

    def config(self) -> dict[str, Any]:
        """The fields that define 'the same experiment' (hashed for resume and comparison)."""
        return {"bench": BENCH_NAME, "ops": self.ops, "sizes": self.sizes, "dtype": self.dtype, "iters": self.iters,
                "warmup": self.warmup, "reps": self.reps, "backend": self.backend, "world_size": self.world_size,
                "time_budget_s": self.time_budget_s}
