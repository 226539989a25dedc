"""Load a spec file and resolve its model, turning every input problem into one `SpecLoadError` message."""
from __future__ import annotations

from pathlib import Path
from typing import Union

from dstoolkit.hardware.calibration import calibration_for_spec
from dstoolkit.models.resolve import resolve_spec_model
from dstoolkit.models.shape import ModelShape
from dstoolkit.spec import Spec, load_spec


class SpecLoadError(ValueError):
    """The spec cannot be used (missing file, YAML/schema error, unknown model); the message says where."""


def load_spec_and_shape(path: Union[str, Path]) -> tuple[Spec, ModelShape]:
    """`load_spec(path)`, `resolve_spec_model(spec)`, and a check that its calibration file (if any) is usable.

    Raises:
        SpecLoadError: with the `file:line:col: error: ...` text of the underlying `SpecError`.
    """

    p = Path(path)  # a missing file or a folder: load_spec's SpecError says which
    try:
        spec = load_spec(p)
        shape = resolve_spec_model(spec)
        calibration_for_spec(spec)  # cluster.calibration: a missing/unusable file is the spec's error
    except ValueError as exc:  # SpecError is a ValueError carrying file:line:col findings
        raise SpecLoadError(str(exc)) from None
    except OSError as exc:
        raise SpecLoadError(f"{p}: error: cannot read ({exc.strerror or exc})") from None
    return spec, shape
