"""Argument checks of the training helpers used as a library (`guard.Guard`, `hf.DstoolkitCallback`), at
construction: a bad value is one `SettingError` naming the parameter, the value and the fix in the caller's terms,
never a bare OS error or a late failure on every rank. The path wording is `dstoolkit.common.atomic`'s, the same the
trainer's command line gives (`trainer_inputs.check_output_paths`), with the parameter's name passed in."""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Optional

from dstoolkit.runtime.train.spike import SettingError, check_int


class PathSettingError(SettingError):
    """An output path parameter that cannot be written (a `SettingError`; the message is the whole line)."""

    def __init__(self, name: str, value: object, message: str) -> None:
        ValueError.__init__(self, message)
        self.name, self.value, self.need = name, value, message


def label(where: str, name: str, value: object) -> str:
    """How a message names a parameter and its value: ``Guard: checkpoint_dir='ck'``."""
    return f"{where}: {name}={os.fspath(value)!r}" if isinstance(value, (str, os.PathLike)) else \
        f"{where}: {name}={value!r}"


def check_folder_param(where: str, name: str, value: Any) -> None:
    """`value` (a folder the helper creates and writes into) must be writable: no file at or above it, no dangling
    link, a writable first existing folder (`PathSettingError`)."""
    from dstoolkit.common.atomic import check_output_parents

    text = label(where, name, value)
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value).strip():
        raise SettingError(name, value, "must be a folder path (None: no checkpoints)", where)
    try:
        check_output_parents(value, name=text)
    except OSError as exc:
        raise PathSettingError(name, value, str(exc)) from None
    if Path(value).exists() and not Path(value).is_dir():
        raise PathSettingError(name, value, f"{text}: is a file, not a folder; give a new or existing folder to "
                                            "write into (or move the file away)")


def make_folder(where: str, name: str, value: Any) -> None:
    """Create the folder `value` (after `check_folder_param`); an OS error names the parameter."""
    try:
        Path(value).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PathSettingError(name, value, f"{label(where, name, value)}: cannot be created "
                                            f"({exc.strerror or type(exc).__name__}); give a folder this user can "
                                            "write") from None


def check_file_param(where: str, name: str, value: Any) -> None:
    """`value` (a file the helper appends to) must be writable, as the command line checks its --metrics-out."""
    from dstoolkit.common.atomic import check_output_path

    text = label(where, name, value)
    if not isinstance(value, (str, os.PathLike)) or not os.fspath(value).strip():
        raise SettingError(name, value, "must be a file path (None: no metrics file)", where)
    try:
        check_output_path(value, name=text, append=True)
    except OSError as exc:
        raise PathSettingError(name, value, str(exc)) from None
    if Path(value).is_dir():  # a link to a folder
        raise PathSettingError(name, value, f"{text}: is a link to a folder, not a file; give the path of the "
                                            "JSON-lines file to append to")


def open_append(where: str, name: str, value: Any) -> Any:
    """Open the file `value` for appending (line-buffered), after `check_file_param`; an OS error names it."""
    check_file_param(where, name, value)
    try:
        Path(value).parent.mkdir(parents=True, exist_ok=True)
        return open(value, "a", buffering=1)
    except OSError as exc:
        raise PathSettingError(name, value, f"{label(where, name, value)}: cannot be opened for appending "
                                            f"({exc.strerror or type(exc).__name__})") from None


def check_optional_step(where: str, name: str, value: Any) -> None:
    """None, or a whole number >= 1 (an optimizer step)."""
    if value is not None:
        check_int(name, value, 1, "an optimizer step, counted from 1; None: off", where=where)


def check_blowup(where: str, value: Any) -> None:
    """`lr_blowup`: None or (step >= 1, a finite factor > 0)."""
    if value is None:
        return
    ok = (isinstance(value, (tuple, list)) and len(value) == 2 and isinstance(value[0], int)
          and not isinstance(value[0], bool) and value[0] >= 1 and isinstance(value[1], (int, float))
          and not isinstance(value[1], bool) and math.isfinite(value[1]) and value[1] > 0)
    if not ok:
        raise SettingError("lr_blowup", value, "must be (step, factor): a whole step >= 1 and a finite factor > 0, "
                           "e.g. (5, 100.0); None: off", where)


def load_spec_param(where: str, value: Any, source: str = "spec") -> tuple[Any, Any]:
    """The spec (and its resolved model shape) a helper reads its estimate from; `source` names where the path came
    from (the `spec` parameter or the DSTOOLKIT_SPEC variable). A missing or broken spec is refused."""
    from dstoolkit.models import resolve_model
    from dstoolkit.spec import load_spec

    path = Path(os.fspath(value)) if isinstance(value, (str, os.PathLike)) else None
    if path is None or not path.is_file():
        why = "is a folder" if path is not None and path.is_dir() else "is not a file"
        raise SettingError(source, value, f"{why}: give the spec.yaml of the generated folder (or leave {source} "
                           "out: no estimate beside the measured figures)", where)
    try:
        spec = load_spec(path)
        return spec, resolve_model(spec.model, path.parent)
    except Exception as exc:  # noqa: BLE001 - SpecError, a model that does not resolve: one line, the cause kept
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise SettingError(source, value, f"does not load: {first}", where) from exc


def callback_args(spec: Any, metrics_path: Any, *, max_rollbacks: Any, cross_rank_every: Any, poison_step: Any,
                  lr_blowup: Any) -> tuple[Optional[str], Any, Any, Optional[str]]:
    """`hf.DstoolkitCallback`'s arguments, checked when it is built: (spec path, spec, model shape, metrics path),
    the paths from the parameters or else DSTOOLKIT_SPEC / DSTOOLKIT_CALLBACK_METRICS."""
    where = "DstoolkitCallback"
    check_int("cross_rank_every", cross_rank_every, 0, "optimizer steps between cross-rank views; 0: off",
              where=where)
    check_int("max_rollbacks", max_rollbacks, 0, "rollbacks in a row that may fail to clear a spike", where=where)
    check_optional_step(where, "poison_step", poison_step)
    check_blowup(where, lr_blowup)
    spec_path = spec or os.environ.get("DSTOOLKIT_SPEC") or None
    loaded, shape = load_spec_param(where, spec_path, "spec" if spec else "DSTOOLKIT_SPEC") if spec_path \
        else (None, None)
    metrics = metrics_path or os.environ.get("DSTOOLKIT_CALLBACK_METRICS") or None
    if metrics:
        check_file_param(where, "metrics_path" if metrics_path else "DSTOOLKIT_CALLBACK_METRICS", metrics)
    return (os.fspath(spec_path) if spec_path else None), loaded, shape, metrics
