"""The user's own module, imported and built: `--model mypkg.models:build` (or `model.module` in a spec) read as
`module.path:attribute`, imported (the current folder and the spec's folder searched too), and called with its
keyword arguments on the meta device where its code allows (no memory, no weights), else on the CPU with a note.
What the built module holds is measured by `dstoolkit.models.user_module`.

torch is imported inside build_user_module only: the core imports this module without it. Every input problem
is a `UserModelError` naming the field, the value and the fix, never a traceback.
"""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path
from typing import Any, Optional, Sequence


class UserModelError(ValueError):
    """A user-module reference that cannot be used: `field` (--model, model.module, ...), its `value`, the
    problem and the fix."""

    def __init__(self, field: str, value: Any, problem: str, fix: str):
        self.field = field
        self.value = value
        self.problem = problem
        self.fix = fix
        super().__init__(f"{field} {value!r}: {problem} ({fix})")


def is_module_ref(text: str) -> bool:
    """Whether `text` reads as `module.path:attribute` (not a file path, not a preset name)."""
    if not isinstance(text, str) or text.count(":") != 1 or "/" in text or "\\" in text or text.endswith(".json"):
        return False
    if Path(text).exists():
        return False
    module, attr = text.split(":")
    return bool(module) and all(p.isidentifier() for p in module.split(".")) and bool(attr)


def parse_ref(ref: str, field: str = "--model") -> tuple[str, str]:
    """(module path, attribute path) of `module.path:attribute`."""
    if not isinstance(ref, str) or ref.count(":") != 1:
        raise UserModelError(field, ref, "not a module reference",
                             "write it as package.module:callable, e.g. mypkg.models:build")
    module, attr = ref.split(":")
    if not module or not all(p.isidentifier() for p in module.split(".")):
        raise UserModelError(field, ref, f"{module!r} is not a dotted module path",
                             "write it as package.module:callable, e.g. mypkg.models:build")
    if not attr or not all(p.isidentifier() for p in attr.split(".")):
        raise UserModelError(field, ref, f"{attr!r} is not an attribute name",
                             "name a callable or class after the colon, e.g. mypkg.models:MyNet")
    return module, attr


def parse_kwargs(value: Any, field: str = "--model-kwargs") -> dict:
    """Keyword arguments for the builder: a JSON object (text) or a mapping (a spec's YAML)."""
    if value is None:
        return {}
    if isinstance(value, dict):
        data = value
    elif isinstance(value, str):
        try:
            data = json.loads(value)
        except json.JSONDecodeError as exc:
            raise UserModelError(field, value, f"not JSON ({exc.msg} at column {exc.colno})",
                                 """give a JSON object, e.g. '{"d": 256, "layers": 4}'""") from None
    else:
        raise UserModelError(field, value, f"expected a mapping of keyword arguments, got {type(value).__name__}",
                             "give a mapping, e.g. {d: 256, layers: 4}")
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise UserModelError(field, value, f"expected a JSON object of keyword arguments, got {type(data).__name__}",
                             """give a JSON object, e.g. '{"d": 256}'""")
    return data


def _import_module(module: str, ref: str, field: str, search_dirs: Sequence[str]):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        missing = exc.name or ""
        if not (module == missing or module.startswith(missing + ".")):
            raise UserModelError(field, ref, f"importing {module!r} failed: a module it imports is missing "
                                 f"(No module named {missing!r})", f"install {missing.split('.')[0]!r}") from None
    except Exception as exc:  # noqa: BLE001 - the user's code failed while importing: report, never a traceback
        raise UserModelError(field, ref, f"importing {module!r} raised {type(exc).__name__}: {str(exc)[:300]}",
                             "fix the module so that it imports cleanly") from None
    # Not found on sys.path: the console script does not put the current folder there (python -m does).
    added = [d for d in dict.fromkeys([str(Path.cwd()), *map(str, search_dirs)]) if d not in sys.path]
    sys.path.extend(added)
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        raise UserModelError(field, ref, f"module {module!r} is not importable (No module named {exc.name!r})",
                             "install it, or add its folder to PYTHONPATH ("
                             + ("the current folder and the spec's folder were" if search_dirs else
                                "the current folder was") + " searched too)") from None
    except Exception as exc:  # noqa: BLE001
        raise UserModelError(field, ref, f"importing {module!r} raised {type(exc).__name__}: {str(exc)[:300]}",
                             "fix the module so that it imports cleanly") from None


def _resolve_attr(mod, attr: str, ref: str, field: str):
    obj = mod
    for part in attr.split("."):
        if not hasattr(obj, part):
            public = sorted(n for n in dir(obj) if not n.startswith("_") and callable(getattr(obj, n, None)))[:12]
            raise UserModelError(field, ref, f"{getattr(obj, '__name__', type(obj).__name__)!r} has no attribute "
                                 f"{part!r}", "name one of its callables: " + (", ".join(public) or "(none)"))
        obj = getattr(obj, part)
    return obj


def build_user_module(ref: str, kwargs: Optional[dict] = None, *, field: str = "--model",
                      kwargs_field: str = "--model-kwargs", search_dirs: Sequence[str] = ()):
    """Import `ref` and build its module (meta device first, else the CPU).

    Returns:
        (module, device, notes): device is "meta" or "cpu".

    Raises:
        UserModelError: not importable, attribute missing, not callable, the call failed, or it returned
            something that is not an nn.Module.
    """
    module, attr = parse_ref(ref, field)
    try:
        import torch  # lazy: only the user-module path needs torch
    except ImportError:
        raise UserModelError(field, ref, "torch is not installed", "pip install torch (a user module is a "
                             "torch.nn.Module)") from None
    obj = _resolve_attr(_import_module(module, ref, field, search_dirs), attr, ref, field)
    kwargs = dict(kwargs or {})
    notes: list[str] = []
    if isinstance(obj, torch.nn.Module):
        if kwargs:
            raise UserModelError(kwargs_field, json.dumps(kwargs), f"{ref} is a module instance, not a callable",
                                 "drop the keyword arguments, or point at the class / builder instead")
        return obj, next((p.device.type for p in obj.parameters()), "cpu"), notes
    if not callable(obj):
        raise UserModelError(field, ref, f"is a {type(obj).__name__} object, not a callable or an nn.Module",
                             "name a function returning an nn.Module, or an nn.Module class")
    built, device, meta_error = None, "meta", None
    try:
        with torch.device("meta"):
            built = obj(**kwargs)
    except TypeError as exc:
        raise UserModelError(kwargs_field, json.dumps(kwargs), f"calling {ref}(**kwargs) raised TypeError: {exc}",
                             "pass the keyword arguments it takes") from None
    except Exception as exc:  # noqa: BLE001 - e.g. a builder that loads weights or reads a tensor's value
        meta_error = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
    if built is None and meta_error is not None:
        device = "cpu"
        try:
            built = obj(**kwargs)
        except Exception as exc:  # noqa: BLE001
            raise UserModelError(field, ref, f"calling it raised {type(exc).__name__}: {str(exc)[:300]}",
                                 f"check {kwargs_field} and the builder") from None
        notes.append(f"built on the CPU: building on the meta device failed ({meta_error})")
    if not isinstance(built, torch.nn.Module):
        raise UserModelError(field, ref, f"returned a {type(built).__name__}, not a torch.nn.Module",
                             "return the model (an nn.Module) from the builder")
    if not any(True for _ in built.parameters()):
        raise UserModelError(field, ref, f"the {type(built).__name__} it returned has no parameters",
                             "return the model to train")
    return built, device, notes
