"""`dstoolkit ckpt export`: a DeepSpeed checkpoint -> model.safetensors + config.json for transformers.

The weights are DeepSpeed's own consolidation (`deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint`:
the fp32 master partitions of every rank, merged, ZeRO-1/2/3); ZeRO-0 checkpoints have whole weights in
mp_rank_00_model_states.pt already: in fp32 runs the module states are exact, in bf16/fp16 runs they are rounded
copies of the fp32 masters, which DeepSpeed's fp16/bf16 optimizer wrapper saves beside them (runtime/fp16/
unfused_optimizer.py `state_dict`: `fp32_groups`, one tensor per parameter; fused_optimizer.py: `fp32_groups_flat`,
one flat tensor per group), so those are exported (`ZERO0_MASTER`). Which source the weights came from is part
of the result (`Exported.weights_from`) and of the CLI's output. The engine's parameter names carry the wrapper's
prefix (the project's trainer wraps the transformers model as `hf.`): the prefix that maps every name onto the config's model is found
from the model itself (built on the meta device, no memory) and stripped; a weight the model does not have, a
shape that differs, or a missing weight that is not tied is an error, never a silent partial export.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from dstoolkit.ckpt.errors import CkptError
from dstoolkit.ckpt.info import incomplete_fix
from dstoolkit.ckpt.inspect import CheckpointInfo, inspect_checkpoint
from dstoolkit.ckpt.torchzip import is_legacy
from dstoolkit.runtime.ckpt.outputs import atomic_output_folder, check_new_output_folder
from dstoolkit.runtime.ckpt.quiet import quiet_tool

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
    weights_from: str = ""
    """Where the exported values came from: ZERO_MASTER, ZERO0_MASTER or MODULE_STATES (with its dtype)."""


ZERO_MASTER = "the fp32 master partitions (DeepSpeed zero_to_fp32)"
ZERO0_MASTER = "the fp32 master copies in the model states' optimizer (ZeRO-0 mixed precision)"
MODULE_STATES = "the module states"


def find_config(info: CheckpointInfo, given: Optional[Path]) -> Path:
    """The HF config.json to export with: `given` (--config: the file, or a folder holding config.json, resolved
    as `model.hf_config` is, by `dstoolkit.models.hf.hf_config_file`), else the one beside the checkpoint."""
    if given is not None:
        from dstoolkit.models.hf import HFConfigError, hf_config_file

        try:
            path = hf_config_file(given)
        except HFConfigError:
            raise CkptError(str(given), f"is a folder without {CONFIG_NAME}",
                            f"give --config the model's HF {CONFIG_NAME}, or the folder the model was saved to "
                            f"(it holds {CONFIG_NAME})") from None
        if not path.is_file():
            raise CkptError(str(given), "does not exist", f"give --config the model's HF {CONFIG_NAME} (or the "
                            "folder holding it)")
        return path
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


def _master_tensors(optimizer: Any) -> tuple[Optional[str], list[list[Any]]]:
    """(kind, groups) of the fp32 masters a ZeRO-0 fp16/bf16 optimizer wrapper saved: 'unfused' (a list of tensors
    per group, one per parameter) or 'fused' (one flat tensor per group); (None, []) when there are none."""
    import torch

    if not isinstance(optimizer, dict):
        return None, []
    groups = optimizer.get("fp32_groups")
    if isinstance(groups, list) and groups and all(isinstance(g, list) and all(isinstance(t, torch.Tensor)
                                                                                  for t in g) for g in groups):
        return "unfused", groups
    flat = optimizer.get("fp32_groups_flat")
    if isinstance(flat, list) and flat and all(isinstance(t, torch.Tensor) for t in flat):
        return "fused", [[t] for t in flat]
    return None, []


def _match_masters(params: list[tuple[str, Any]], kind: str, groups: list[list[Any]]) -> Optional[dict[str, Any]]:
    """{parameter name: its fp32 master} or None when the masters do not map onto `params` one by one.

    The wrapper builds its groups from the optimizer's param groups, each in model.parameters() order (which is
    the order of the module states); a master belongs to a parameter when it has its shape (a flat group: its
    numel at the running offset) and rounds to exactly the saved low-precision value. Within a group the masters
    are taken in order, so two parameters with equal rounded values still get their own master."""
    import torch

    used: set[int] = set()
    out: dict[str, Any] = {}
    for group in groups:
        start = 0
        if kind == "unfused":
            for m in group:
                for i in range(start, len(params)):
                    name, p = params[i]
                    if (i not in used and tuple(m.shape) == tuple(p.shape)
                            and torch.equal(m.to(p.dtype), p)):
                        used.add(i)
                        out[name] = m.float()
                        start = i + 1
                        break
                else:
                    return None
        else:
            flat, off = group[0].reshape(-1), 0
            while off < flat.numel():
                for i in range(start, len(params)):
                    name, p = params[i]
                    n = p.numel()
                    if i not in used and off + n <= flat.numel():
                        piece = flat[off:off + n].view(p.shape)
                        if torch.equal(piece.to(p.dtype), p):
                            used.add(i)
                            out[name] = piece.float()
                            off += n
                            start = i + 1
                            break
                else:
                    return None
    return out


def _storage_key(t: Any) -> int:
    return t.data_ptr() if t.numel() else -id(t)


def _float_shared(sd: dict) -> dict:
    """{name: fp32 tensor}; names that shared one tensor (tied weights) share the converted one too, so the export
    still sees them as tied (`.float()` copies a bf16 tensor once per call)."""
    done: dict[int, Any] = {}
    out = {}
    for k, v in sd.items():
        key = _storage_key(v)
        if key not in done:
            done[key] = v.float()
        out[k] = done[key]
    return out


def consolidated_state_dict(info: CheckpointInfo) -> tuple[dict, str]:
    """({name: fp32 tensor} of the whole model, where the values came from).

    ZeRO >= 1: DeepSpeed's zero_to_fp32. ZeRO-0: the module states, each parameter replaced by its fp32 master
    when the run kept one (bf16/fp16 mixed precision); tied names keep sharing one tensor. Masters that do not map
    onto the parameters one by one are not used, and the returned source says so.
    """
    import torch

    if info.zero_stage and info.zero_stage >= 1:
        from deepspeed.utils import zero_to_fp32

        with quiet_tool(zero_to_fp32):  # its "Processing zero checkpoint ..." lines and shard bar, not ours
            return zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(info.root), tag=info.tag), ZERO_MASTER
    path = info.tag_dir / "mp_rank_00_model_states.pt"
    states = torch.load(path, map_location="cpu", weights_only=False)
    sd = states["module"]
    low = sorted({str(v.dtype).replace("torch.", "") for v in sd.values()
                  if isinstance(v, torch.Tensor) and v.dtype in (torch.bfloat16, torch.float16)})
    kind, groups = _master_tensors(states.get("optimizer"))
    if not low or kind is None:
        dtypes = "+".join(sorted({str(v.dtype).replace("torch.", "") for v in sd.values()})) or "?"
        source = f"{MODULE_STATES} ({dtypes}" + (
            "; no fp32 master copy was saved, so these are the rounded values)" if low else ")")
        return _float_shared(sd), source
    buffers = set(states.get("buffer_names") or [])
    params: list[tuple[str, Any]] = []
    names_of: dict[int, list[str]] = {}
    for name, t in sd.items():  # tied weights: one parameter, several names sharing its storage
        if name in buffers or not isinstance(t, torch.Tensor):
            continue
        key = _storage_key(t)
        if key not in names_of:
            names_of[key] = []
            params.append((name, t))
        names_of[key].append(name)
    masters = _match_masters(params, kind, groups)
    if masters is None:  # said in the result, never silently: the values are the rounded ones the forward used
        return _float_shared(sd), (
            f"{MODULE_STATES} ({'+'.join(low)}, rounded: the fp32 master copies saved beside them "
            f"({'fp32_groups' if kind == 'unfused' else 'fp32_groups_flat'}) do not map onto the parameters one by "
            "one, so they were not used)")
    out: dict = {}
    shared: dict[str, Any] = {}
    for name, t in sd.items():
        if name in buffers or not isinstance(t, torch.Tensor):
            out[name] = t.float() if isinstance(t, torch.Tensor) else t
            continue
        key = _storage_key(t)
        first = names_of[key][0]
        if first not in shared:
            shared[first] = masters.get(first, t.float())  # frozen parameters have no master: their own value
        out[name] = shared[first]
    n = len(masters)
    return out, f"{ZERO0_MASTER}, {n} of {len(params)} parameters" + (
        "" if n == len(params) else f"; the other {len(params) - n} (frozen) from {MODULE_STATES}")


TINY_TRANSFORMER_NAMES = ("embed_tokens.weight", "blocks.")
"""The parameter names of dstoolkit's own TinyTransformer (dstoolkit/runtime/model.py: embed_tokens, blocks.N.*,
norm, lm_head at the top level), which `dstoolkit train` builds without --shrink: not a transformers model."""


def _module_names(info: CheckpointInfo) -> list[str]:
    from dstoolkit.ckpt.torchzip import TorchFileError, read_meta

    files = sorted(info.tag_dir.glob("mp_rank_*_model_states.pt")) or sorted(
        info.tag_dir.glob("zero_pp_rank_*_mp_rank_*_model_states.pt"))
    try:
        head = read_meta(files[0]) if files else None
    except TorchFileError:
        return []
    module = head.get("module") if isinstance(head, dict) else None
    if isinstance(module, dict) and module:
        return [str(k) for k in module]
    shapes = head.get("param_shapes") if isinstance(head, dict) else None
    return [str(k) for g in shapes or [] if isinstance(g, dict) for k in g] if isinstance(shapes, list) else []


def _is_tiny_transformer(names: list[str]) -> bool:
    return TINY_TRANSFORMER_NAMES[0] in names and any(n.startswith(TINY_TRANSFORMER_NAMES[1]) for n in names)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().split(". Should contain one of")[0]  # transformers then lists every model type
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    # huggingface_hub's strict-dataclass errors put the reason on the second line
    return (" ".join(lines[:2]) if len(lines) > 1 and lines[0].endswith(":") else (lines[0] if lines else
            type(exc).__name__))[:240]


def export_hf(src: Path, out: Path, *, config: Optional[Path] = None, dtype: str = "fp32") -> Exported:
    """Write OUT/model.safetensors + OUT/config.json from the checkpoint at `src`.

    Raises:
        CkptError: not a checkpoint, incomplete, MoE with experts outside the ZeRO partitions, a model that is not
            a transformers model, no config or one transformers rejects, weights that do not fit the config,
            `out` inside the checkpoint, or `out` exists.
        OutputSpaceError: the disk filled while writing (`atomic_output_folder`: nothing is left, as after an
            interrupt; a killed run's temporary folder is removed by the next).
        FileInPathError: a part of `out` above it is a file (`check_new_output_folder`; nothing is written).
    """
    out = Path(out)
    check_new_output_folder(Path(src), out, "--hf", "_hf")
    info = inspect_checkpoint(src)
    if not info.complete:
        raise CkptError(info.problems[0].file, info.problems[0].problem, incomplete_fix(info, "export"))
    if (info.tag_dir / "zero").is_dir():
        raise CkptError(str(info.tag_dir), "is a universal checkpoint",
                        "export the ZeRO checkpoint it was made from (zero_to_fp32 reads ZeRO partitions)")
    if info.num_experts and (info.ep or 1) > 1:
        raise CkptError(str(info.tag_dir), f"native DeepSpeed MoE at ep={info.ep}: zero_to_fp32 merges the ZeRO "
                        "partitions of the dense parameters only; the experts sit in layer_*_expert_* files",
                        "export from a run with the transformers MoE model (its experts are plain parameters)")
    legacy = [p for p in sorted(info.tag_dir.glob("*_optim_states.pt")) if is_legacy(p)]
    if info.zero_stage and info.zero_stage >= 1 and legacy:
        raise CkptError(str(legacy[0]), "is in torch's legacy (non-zip) format: DeepSpeed's zero_to_fp32 opens the "
                        "optimizer partitions with torch.load(mmap=True) (deepspeed/utils/zero_to_fp32.py:204), "
                        "which torch refuses for that format",
                        "re-save each *_optim_states.pt in the zip format into a copy of the checkpoint "
                        "(torch.save(torch.load(f, weights_only=False), copy)) and export the copy; "
                        "`dstoolkit ckpt reshard` reads this checkpoint as it is")
    names = _module_names(info)
    if _is_tiny_transformer(names):
        raise CkptError(str(info.tag_dir), "holds dstoolkit's own TinyTransformer (weights embed_tokens.weight, "
                        "blocks.N.*: what `dstoolkit train` builds without --shrink), which is not a transformers "
                        "model: no HF config.json describes it, so there is nothing to export to",
                        "export a checkpoint of a transformers model (`dstoolkit train ... -- --shrink auto`, the HF "
                        "Trainer, or your own script's transformers model) with --config its config.json")
    cfg_path = find_config(info, config)
    import torch
    import transformers as tf
    from safetensors.torch import save_file

    fix = ("pass --config the config.json of the transformers model that was trained (an object with model_type "
           "and the model's sizes)")
    try:
        cfg_dict = json.loads(cfg_path.read_bytes().decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise CkptError(str(cfg_path), f"is not valid JSON ({_first_line(exc)})", fix) from None
    if not isinstance(cfg_dict, dict):
        raise CkptError(str(cfg_path), f"holds a JSON {type(cfg_dict).__name__}, not a config object", fix)
    if not isinstance(cfg_dict.get("model_type"), str):
        raise CkptError(str(cfg_path), f"has no model_type string (model_type: {cfg_dict.get('model_type')!r})",
                        fix)
    try:  # transformers validates the fields (huggingface_hub strict dataclasses): any failure is the config's
        cfg = tf.AutoConfig.for_model(**{k: v for k, v in cfg_dict.items() if k not in ("transformers_version",)})
        with torch.device("meta"):
            meta = tf.AutoModelForCausalLM.from_config(cfg)
    except Exception as exc:  # noqa: BLE001 - one line naming the file, never a traceback
        raise CkptError(str(cfg_path), f"is not an HF config transformers can build a causal LM from "
                        f"({type(exc).__name__}: {_first_line(exc)})", fix) from None
    expected = {k: tuple(v.shape) for k, v in meta.state_dict().items()}
    sd, weights_from = consolidated_state_dict(info)
    prefix = _strip_prefix(list(sd), set(expected))
    unmatched = [n for n in sd if not (n.startswith(prefix) and n[len(prefix):] in expected)]
    cfg_fix = (f"check that {cfg_path} is the config.json of the model that was trained (its model_type and "
               "sizes)")
    want = torch.float32 if dtype == "fp32" else torch.bfloat16
    outsd: dict = {}
    seen_ptr: dict[int, str] = {}
    for name, t in sd.items():
        if not name.startswith(prefix):
            raise CkptError(str(info.tag_dir), f"weight {name!r} is outside the model prefix {prefix!r} "
                            f"({len(unmatched)} of the checkpoint's {len(sd)} weights do not fit the "
                            f"{type(meta).__name__} that {cfg_path} builds)", cfg_fix)
        key = name[len(prefix):]
        if key not in expected:
            raise CkptError(str(info.tag_dir), f"weight {key!r} is not in the {type(meta).__name__} that {cfg_path} "
                            f"builds ({len(unmatched)} of the checkpoint's {len(sd)} weights are not)", cfg_fix)
        if tuple(t.shape) != expected[key]:
            raise CkptError(str(info.tag_dir), f"weight {key!r} has shape {tuple(t.shape)}, {cfg_path} builds "
                            f"{expected[key]}", cfg_fix)
        ptr = _storage_key(t)
        if ptr in seen_ptr:  # a tied weight (lm_head = embed_tokens): saved once, as from_pretrained expects
            continue
        seen_ptr[ptr] = key
        outsd[key] = t.detach().to(want).contiguous().clone()
    tied = {"lm_head.weight"} if getattr(cfg, "tie_word_embeddings", False) else set()
    missing = sorted(set(expected) - set(outsd) - tied)
    if missing:
        raise CkptError(str(info.tag_dir), f"{len(missing)} weight(s) of the {type(meta).__name__} that {cfg_path} "
                        f"builds are not in the checkpoint, e.g. {missing[0]!r}", cfg_fix)
    # the weights, plus room for safetensors' JSON header and config.json (a few KiB each)
    needs = sum(t.numel() * t.element_size() for t in outsd.values()) + 2**16
    with atomic_output_folder(out, "--hf", needs) as partial:
        save_file(outsd, str(partial / WEIGHTS_NAME), metadata={"format": "pt"})
        cfg_out = dict(cfg_dict)
        # transformers 5 reads "dtype" (older releases "torch_dtype"); the run's config may name its original dtype
        for key in ("dtype", "torch_dtype"):
            cfg_out[key] = "float32" if dtype == "fp32" else "bfloat16"
        (partial / CONFIG_NAME).write_text(json.dumps(cfg_out, indent=2, sort_keys=True))
        # safetensors writes through a private temporary file (mode 0600): give the weights the config's mode
        os.chmod(partial / WEIGHTS_NAME, (partial / CONFIG_NAME).stat().st_mode & 0o777)
    return Exported(source=str(info.tag_dir), weights=str(out / WEIGHTS_NAME), config=str(out / CONFIG_NAME),
                    tensors=len(outsd), params=int(sum(t.numel() for t in outsd.values())), prefix=prefix,
                    weights_from=weights_from)
