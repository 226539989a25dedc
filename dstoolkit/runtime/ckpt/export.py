"""`dstoolkit ckpt export`: a DeepSpeed checkpoint -> model.safetensors + config.json for transformers.

The weights are DeepSpeed's own consolidation (`deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint`:
the fp32 master partitions of every rank, merged, ZeRO-1/2/3); ZeRO-0 checkpoints have whole weights in
mp_rank_00_model_states.pt already. The engine's parameter names carry the wrapper's prefix (the project's
trainer wraps the transformers model as `hf.`): the prefix that maps every name onto the config's model is found
from the model itself (built on the meta device, no memory) and stripped; a weight the model does not have, a
shape that differs, or a missing weight that is not tied is an error, never a silent partial export.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from dstoolkit.ckpt.errors import CkptError
from dstoolkit.ckpt.inspect import CheckpointInfo, inspect_checkpoint

WEIGHTS_NAME = "model.safetensors"
CONFIG_NAME = "config.json"


@dataclass(frozen=True)
class Exported:
    source: str
    weights: str
    config: str
    tensors: int
    params: int
    prefix: str


def find_config(info: CheckpointInfo, given: Optional[Path]) -> Path:
    if given is not None:
        if not given.is_file():
            raise CkptError(str(given), "does not exist", "give --config the model's HF config.json")
        return given
    for cand in (info.root / CONFIG_NAME, info.tag_dir / CONFIG_NAME, info.root.parent / CONFIG_NAME):
        if cand.is_file():
            return cand
    raise CkptError(str(info.root / CONFIG_NAME), "does not exist (the checkpoint holds weights, not the model "
                    "architecture)", "pass --config PATH/config.json (the HF config the run built its model from)")


def _strip_prefix(names: list[str], expected: set[str]) -> str:
    """The prefix p with name[len(p):] in `expected` for the most names ('' when they match as they are)."""
    votes: dict[str, int] = {}
    for n in names:
        parts = n.split(".")
        for i in range(len(parts)):
            if ".".join(parts[i:]) in expected:
                p = ".".join(parts[:i]) + ("." if i else "")
                votes[p] = votes.get(p, 0) + 1
                break
    return max(votes, key=votes.get) if votes else ""


def consolidated_state_dict(info: CheckpointInfo) -> dict:
    """{name: fp32 tensor} of the whole model, from DeepSpeed's zero_to_fp32 (ZeRO >= 1) or the module states."""
    import torch

    if info.zero_stage and info.zero_stage >= 1:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return get_fp32_state_dict_from_zero_checkpoint(str(info.root), tag=info.tag)
    sd = torch.load(info.tag_dir / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)["module"]
    return {k: v.float() for k, v in sd.items()}


def export_hf(src: Path, out: Path, *, config: Optional[Path] = None, dtype: str = "fp32") -> Exported:
    """Write OUT/model.safetensors + OUT/config.json from the checkpoint at `src`.

    Raises:
        CkptError: not a checkpoint, incomplete, MoE with experts outside the ZeRO partitions, no config,
            weights that do not fit the config, or `out` exists.
    """
    if out.exists():
        raise CkptError(str(out), "already exists", "give --hf a new folder (nothing is overwritten)")
    info = inspect_checkpoint(src)
    if not info.complete:
        raise CkptError(info.problems[0].file, info.problems[0].problem,
                        "export a complete checkpoint: pick an older tag, or re-save it")
    if info.format in ("deepspeed-universal",):
        raise CkptError(str(info.tag_dir), "is a universal checkpoint",
                        "export the ZeRO checkpoint it was made from (zero_to_fp32 reads ZeRO partitions)")
    if info.num_experts and (info.ep or 1) > 1:
        raise CkptError(str(info.tag_dir), f"native DeepSpeed MoE at ep={info.ep}: zero_to_fp32 merges the ZeRO "
                        "partitions of the dense parameters only; the experts sit in layer_*_expert_* files",
                        "export from a run with the transformers MoE model (its experts are plain parameters)")
    cfg_path = find_config(info, config)
    import torch
    import transformers as tf
    from safetensors.torch import save_file

    try:
        cfg_dict = json.loads(cfg_path.read_text())
        cfg = tf.AutoConfig.for_model(**{k: v for k, v in cfg_dict.items() if k not in ("transformers_version",)})
    except (ValueError, KeyError, TypeError) as exc:
        raise CkptError(str(cfg_path), f"is not an HF config transformers can read ({str(exc).splitlines()[0][:200]})",
                        "pass --config the config.json of the model that was trained") from None
    with torch.device("meta"):
        meta = tf.AutoModelForCausalLM.from_config(cfg)
    expected = {k: tuple(v.shape) for k, v in meta.state_dict().items()}
    sd = consolidated_state_dict(info)
    prefix = _strip_prefix(list(sd), set(expected))
    want = torch.float32 if dtype == "fp32" else torch.bfloat16
    outsd: dict = {}
    seen_ptr: dict[int, str] = {}
    for name, t in sd.items():
        if not name.startswith(prefix):
            raise CkptError(str(info.tag_dir), f"weight {name!r} is outside the model prefix {prefix!r}",
                            f"check that {cfg_path} is the config of the trained model")
        key = name[len(prefix):]
        if key not in expected:
            raise CkptError(str(info.tag_dir), f"weight {key!r} is not in the {type(meta).__name__} that {cfg_path} "
                            "builds", f"check that {cfg_path} is the config of the trained model")
        if tuple(t.shape) != expected[key]:
            raise CkptError(str(info.tag_dir), f"weight {key!r} has shape {tuple(t.shape)}, {cfg_path} builds "
                            f"{expected[key]}", f"check that {cfg_path} is the config of the trained model")
        ptr = t.data_ptr() if t.numel() else -id(t)
        if ptr in seen_ptr:  # a tied weight (lm_head = embed_tokens): saved once, as from_pretrained expects
            continue
        seen_ptr[ptr] = key
        outsd[key] = t.detach().to(want).contiguous().clone()
    tied = {"lm_head.weight"} if getattr(cfg, "tie_word_embeddings", False) else set()
    missing = sorted(set(expected) - set(outsd) - tied)
    if missing:
        raise CkptError(str(info.tag_dir), f"{len(missing)} weight(s) of the model are not in the checkpoint, "
                        f"e.g. {missing[0]!r}", f"check that {cfg_path} is the config of the trained model")
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        raise CkptError(str(partial), "exists (a previous export did not finish)", "remove it, then export again")
    partial.mkdir(parents=True)
    try:
        save_file(outsd, str(partial / WEIGHTS_NAME), metadata={"format": "pt"})
        cfg_out = dict(cfg_dict)
        # transformers 5 reads "dtype" (older releases "torch_dtype"); the run's config may name its original dtype
        for key in ("dtype", "torch_dtype"):
            cfg_out[key] = "float32" if dtype == "fp32" else "bfloat16"
        (partial / CONFIG_NAME).write_text(json.dumps(cfg_out, indent=2, sort_keys=True))
        os.replace(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)  # ours: created above
        raise
    return Exported(source=str(info.tag_dir), weights=str(out / WEIGHTS_NAME), config=str(out / CONFIG_NAME),
                    tensors=len(outsd), params=int(sum(t.numel() for t in outsd.values())), prefix=prefix)
