"""The bundled specs under ds_configs/ and their committed outputs under ds_configs/generated/<spec stem>/.

Regenerate them after changing the generator or the estimator (the golden test fails on any diff):

    python -m dstoolkit.generate.bundled            # rewrites ds_configs/generated/
"""
from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Optional, Sequence

from dstoolkit.generate.core import TARGETS, generate, write_generated
from dstoolkit.generate.result import GenerateResult
from dstoolkit.generate.io import load_spec_and_shape

BUNDLED_SPECS = ("tiny_cpu", "tiny_moe_cpu", "llama3_8b_1x8_h100", "mixtral_8x7b_2x8_h100", "deepseek_v3_32x8_h800")
"""Spec stems in ds_configs/, in the order they are documented."""
GENERATED_DIR = "generated"


GOLDEN_TARGETS = TARGETS
"""The committed outputs show every target (paths inside them are relative to the strategy folder)."""


def generate_bundled(ds_configs: Path, stem: str) -> GenerateResult:
    """Generate one bundled spec in memory, for every target."""
    spec, shape = load_spec_and_shape(Path(ds_configs) / f"{stem}.yaml")
    return generate(spec, shape, targets=GOLDEN_TARGETS)


@functools.lru_cache(maxsize=None)
def cached_bundled(ds_configs: str, stem: str) -> GenerateResult:
    """`generate_bundled`, computed once per process (tests share it; treat the result as read-only)."""
    return generate_bundled(Path(ds_configs), stem)


def regenerate_all(ds_configs: Path) -> list[Path]:
    """Rewrite ds_configs/generated/<stem>/ for every bundled spec (atomically, replacing the old folders)."""
    out = []
    for stem in BUNDLED_SPECS:
        target = Path(ds_configs) / GENERATED_DIR / stem
        write_generated(generate_bundled(ds_configs, stem), target, force=True)
        out.append(target)
    return out


def build_parser() -> argparse.ArgumentParser:
    """The entry point's parser: no options, so --help prints what running it rewrites and exits before any work
    (it had no parser: every argument, --help included, was ignored and the folders were rewritten)."""
    return argparse.ArgumentParser(
        prog="python -m dstoolkit.generate.bundled",
        description=f"Regenerate the committed outputs of the bundled specs: rewrites "
                    f"ds_configs/{GENERATED_DIR}/<stem>/ (every target) for {', '.join(BUNDLED_SPECS)}, replacing "
                    "the old folders. Run it after changing the generator or the estimator; the golden test fails on "
                    "any diff. CPU specs use the packaged reference calibration.")


def main(argv: Optional[Sequence[str]] = None) -> int:
    build_parser().parse_args(argv)  # --help: prints and exits 0; anything else: usage error, exit 2; nothing written
    # The committed outputs must not depend on the machine that regenerates them: CPU specs are estimated
    # with the packaged reference calibration, as the golden test does (tests/conftest.py).
    os.environ.setdefault("DSTOOLKIT_CALIBRATION", "reference")
    root = Path(__file__).resolve().parents[2] / "ds_configs"
    for p in regenerate_all(root):
        print(f"wrote {p}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
