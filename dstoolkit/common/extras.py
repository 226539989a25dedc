"""Which `pip install 'dstoolkit[EXTRA]'` provides a missing module, and the one message that says so.

The extras and what each holds are declared once, in pyproject.toml's ``[project.optional-dependencies]``; this
module reads them back from the installed distribution's metadata (``Requires-Dist: torch==2.13.0; extra ==
"train"``), so a new extra or a moved dependency needs no second list here. What stays here is the part the
metadata cannot say: which extra a verb needs (``VERB_EXTRA``) and the few distributions whose import name is not
their normalised project name (``IMPORT_NAME``).

Stdlib only: the CLI's exit map (dstoolkit/cli/options.py) imports this module.
"""
from __future__ import annotations

import importlib.util
import re
from functools import lru_cache
from typing import Optional

DISTRIBUTION = "dstoolkit"

VERB_EXTRA: dict[str, str] = {
    "train": "train",   # launches torchrun / deepspeed ranks running dstoolkit.runtime.train
    "bench": "bench",   # real ranks, and matplotlib for the plots
    "tune": "tune",     # optuna + matplotlib; real trials launch the user's own command
}
"""The extra each verb cannot start without (checked before it runs). Verbs not listed start on the core install
and name an extra only when a path they take imports a missing module (`report`'s matplotlib, `--model-class`'s
transformers, `ckpt`'s torch where a tensor must be loaded)."""

IMPORT_NAME: dict[str, str] = {"megatron-core": "megatron"}
"""Project name -> top-level import name, where normalising the name (``-`` to ``_``) does not give it."""

# Requires-Dist: "transformer-engine[pytorch]; extra == \"te\"" -> ("transformer-engine", "te")
_REQ = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)[^;]*;\s*extra\s*==\s*[\"']([^\"']+)[\"']\s*$")


def _import_name(project: str) -> str:
    key = project.lower().replace("_", "-")
    return IMPORT_NAME.get(key, key.replace("-", "_").replace(".", "_"))


@lru_cache(maxsize=1)
def extras_modules() -> dict[str, tuple[str, ...]]:
    """Extra -> the top-level import names it installs, in pyproject order; {} when dstoolkit's metadata is
    not installed (a source tree on PYTHONPATH)."""
    import importlib.metadata  # start-up time: ~15 ms that `dstoolkit validate` (no extra to check) must not pay

    try:
        requires = importlib.metadata.requires(DISTRIBUTION) or []
    except importlib.metadata.PackageNotFoundError:
        return {}
    out: dict[str, list[str]] = {}
    for line in requires:
        m = _REQ.match(line)
        if m is None or m.group(1).lower() == DISTRIBUTION:  # core dependencies; dev's self-reference
            continue
        out.setdefault(m.group(2), []).append(_import_name(m.group(1)))
    return {extra: tuple(mods) for extra, mods in out.items()}


def extra_for(module: str, verb: Optional[str] = None) -> Optional[str]:
    """The extra to name for a missing top-level `module`: the verb's own extra when it holds the module,
    else the first extra (pyproject order) that does; None when no extra installs it."""
    extras = extras_modules()
    own = VERB_EXTRA.get(verb or "")
    if own is not None and module in extras.get(own, ()):
        return own
    for extra, mods in extras.items():
        if extra != "dev" and module in mods:
            return extra
    return None


def missing_extra_message(verb: str, module: str) -> str:
    """``MODULE is not installed: dstoolkit VERB needs dstoolkit[EXTRA]: pip install 'dstoolkit[EXTRA]'``, or,
    for a module no extra installs, ``MODULE is not installed; dstoolkit VERB needs it``."""
    extra = extra_for(module, verb)
    if extra is None:
        return f"{module} is not installed; `dstoolkit {verb}` needs it"
    return f"{module} is not installed: dstoolkit {verb} needs dstoolkit[{extra}]: pip install 'dstoolkit[{extra}]'"


def require_verb_extra(verb: str) -> None:
    """Raise ModuleNotFoundError (name = the first missing module) when the verb's extra is not installed.

    Looks modules up with importlib.util.find_spec, which imports nothing, so the check costs milliseconds
    and the verb still pays for torch only where it uses it. A source tree without installed metadata has no
    extras to check against and passes.
    """
    extra = VERB_EXTRA.get(verb)
    if extra is None:
        return
    for module in extras_modules().get(extra, ()):
        if importlib.util.find_spec(module) is None:
            raise ModuleNotFoundError(f"No module named {module!r}", name=module)
