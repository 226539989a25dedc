"""Fp8Config -> Transformer Engine recipe objects (TE imported lazily, only when a recipe is built)."""
from __future__ import annotations

from typing import Any

from dstoolkit.dsconfig.fp8 import TE_RECIPE_CLASS, Fp8Config

TE_INSTALL_HINT = (
    "install Transformer Engine on a CUDA machine with `pip install 'dstoolkit[te]'` "
    "(transformer-engine[pytorch]; needs CUDA 12.x and an sm_89+ GPU), "
    "or use dstoolkit.runtime.fp8.convert(model, cfg, backend='emulated') to run the FP8 numerics on CPU"
)


class Fp8BackendUnavailable(RuntimeError):
    """The requested FP8 backend cannot run here; the message says what to install or use instead."""


def import_te() -> Any:
    """Import `transformer_engine.pytorch`, or raise Fp8BackendUnavailable with the fix."""
    try:
        import transformer_engine.pytorch as te  # noqa: F401  (heavy; needs CUDA libraries to import)
    except Exception as exc:  # ImportError, or OSError/RuntimeError when CUDA libraries are missing
        raise Fp8BackendUnavailable(
            f"Transformer Engine is not importable ({type(exc).__name__}: {exc}); {TE_INSTALL_HINT}") from None
    return te


def te_recipe_class_and_kwargs(cfg: Fp8Config) -> tuple[str, dict]:
    """The TE recipe class name and its kwargs (fp8_format still as a name), without importing TE."""
    return TE_RECIPE_CLASS[cfg.recipe], cfg.te_recipe_kwargs()


def build_te_recipe(cfg: Fp8Config) -> Any:
    """A `transformer_engine.common.recipe` object for `cfg` (imports TE).

    Raises:
        Fp8BackendUnavailable: TE missing, or too old to have the recipe class (block needs TE >= 2.3-ish,
            mxfp8 >= 2.0; the message names the class).
    """
    import_te()
    # optional extra (dstoolkit[te]): imported only where FP8 runs
    from transformer_engine.common import recipe as te_recipe

    cls_name, kwargs = te_recipe_class_and_kwargs(cfg)
    cls = getattr(te_recipe, cls_name, None)
    if cls is None:
        raise Fp8BackendUnavailable(
            f"fp8.recipe={cfg.recipe!r} needs transformer_engine.common.recipe.{cls_name}, which this TE version "
            "lacks: upgrade transformer-engine or choose recipe 'delayed'")
    kwargs["fp8_format"] = te_recipe.Format[kwargs["fp8_format"]]
    return cls(**kwargs)
