"""Short real DeepSpeed runs that save, convert and resume checkpoints at another layout (the proof of
`dstoolkit ckpt reshard` and `ckpt export`).

Launch (one process group runs a list of segments in order, so engines at several ZeRO stages share one start):

    torchrun --nproc_per_node N -m dstoolkit.runtime.ckpt.runs PLAN.json

PLAN.json: {"segments": [...], "result": "out.json"}. A segment is one of
  {"kind": "train", "name", "model": {"kind": "tiny", "shape": {ModelShape fields}} | {"kind": "hf", "config": {...}},
   "zero_stage", "bf16", "micro", "ga", "ep", "steps_to", "load": {"dir", "tag", "universal"} | null,
   "save": [{"step", "dir"}], "probe": [steps], "offload": bool, "logits": bool}
  {"kind": "convert", "src": "ROOT/TAG", "out": "OUTROOT"}   (rank 0 runs `reshard.to_universal`, the others wait)
The result JSON (rank 0) holds per train segment: the global mean loss of every step it ran, and at each probe
step the optimizer state (`probe_dir`/<name>_step<k>_rank<r>.pt: fp32 master weights, Adam exp_avg /
exp_avg_sq by global parameter name, the optimizer's step count, the LR and the scheduler position).

The data of a step is a function of the global step and the global sample index only (never of the rank or
the layout), so a run at dp 2 x micro 2 and one at dp 1 x micro 2 x ga 2 see the same samples in every step.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from dstoolkit.runtime.model import _global_name

SEQ_LEN = 16
DATA_SEED = 1234
LR = 3e-3
WARMUP_STEPS = 2
"""WarmupDecayLR: warm-up steps, then linear decay to 0 at the plan's "total_steps": the LR moves every step,
so a resume that lost the schedule position shows in the loss and in the probed LR."""


def global_batch(step: int, n_samples: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All samples of one optimizer step: a learnable affine bigram chain with noise; a pure function of the step."""
    gen = torch.Generator().manual_seed(DATA_SEED * 7919 + step)
    first = torch.randint(0, vocab, (n_samples, 1), generator=gen)
    noise = torch.randint(0, vocab, (n_samples, SEQ_LEN), generator=gen)
    follow = torch.rand(n_samples, SEQ_LEN, generator=gen) < 0.8
    toks = [first[:, 0]]
    for t in range(SEQ_LEN):
        toks.append(torch.where(follow[:, t], (toks[-1] * 5 + 3) % vocab, noise[:, t]))
    seq = torch.stack(toks, dim=1)
    return seq[:, :-1].contiguous(), seq[:, 1:].contiguous()


def ds_config(seg: dict, world: int, total_steps: int) -> dict:
    """The DeepSpeed JSON of a segment; `load_universal` only when it resumes a universal checkpoint."""
    zero: dict[str, Any] = {"stage": seg["zero_stage"]}
    if seg.get("offload"):
        zero["offload_optimizer"] = {"device": "cpu"}
    cfg = {
        "train_micro_batch_size_per_gpu": seg["micro"],
        "gradient_accumulation_steps": seg["ga"],
        "train_batch_size": seg["micro"] * seg["ga"] * world,
        "zero_optimization": zero,
        "bf16": {"enabled": bool(seg.get("bf16"))},
        "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": LR,
                                                          "warmup_num_steps": WARMUP_STEPS,
                                                          "total_num_steps": total_steps}},
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": 10 ** 9,
        "wall_clock_breakdown": False,
    }
    load = seg.get("load")
    if load and load.get("universal"):
        from dstoolkit.runtime.ckpt.reshard import resume_config

        cfg = resume_config(cfg)
    return cfg


def build(seg: dict) -> tuple[torch.nn.Module, int]:
    """(model, vocab) of a segment, with weights that do not depend on the rank or the layout."""
    m = seg["model"]
    if m["kind"] == "tiny":
        from dstoolkit.models.shape import ModelShape
        from dstoolkit.runtime.model import build_model

        shape = ModelShape(**m["shape"])
        return build_model(shape, ep_size=seg.get("ep", 1) if shape.is_moe else 1, seed=0), shape.vocab_size
    from dstoolkit.runtime.hf_model import build_hf_model

    return build_hf_model(m["config"], seed=0), int(m["config"]["vocab_size"])


def _names(engine: Any, ep: int) -> dict[str, torch.nn.Parameter]:
    """Parameters by global name (expert indices rewritten from local to global)."""
    module = engine.module
    num_local = 0
    shape = getattr(module, "shape", None)
    if shape is not None and getattr(shape, "is_moe", False):
        num_local = shape.num_experts // ep
    ep_rank = dist.get_rank() % ep if ep > 1 else 0
    return {_global_name(n, ep_rank, num_local): p for n, p in module.named_parameters()}


def probe(engine: Any, seg: dict, step: int, probe_dir: Path) -> None:
    """Write this rank's view of the optimizer state (collective under ZeRO-3: every rank calls it)."""
    from deepspeed.utils import safe_get_full_fp32_param, safe_get_full_optimizer_state

    out: dict[str, Any] = {"fp32": {}, "exp_avg": {}, "exp_avg_sq": {}}
    for name, p in _names(engine, seg.get("ep", 1)).items():
        out["fp32"][name] = safe_get_full_fp32_param(p).detach().clone()
        out["exp_avg"][name] = safe_get_full_optimizer_state(p, "exp_avg").detach().clone()
        out["exp_avg_sq"][name] = safe_get_full_optimizer_state(p, "exp_avg_sq").detach().clone()
    base = getattr(engine.optimizer, "optimizer", engine.optimizer)
    steps = sorted({float(s["step"]) for s in base.state.values() if "step" in s})
    out["optimizer_steps"] = steps
    out["lr"] = float(engine.get_lr()[0])
    out["scheduler_position"] = int(engine.lr_scheduler.state_dict()["last_batch_iteration"])
    out["global_steps"] = int(engine.global_steps)
    torch.save(out, probe_dir / f"{seg['name']}_step{step}_rank{dist.get_rank()}.pt")


def fixed_logits(engine: Any, vocab: int) -> torch.Tensor:
    """Logits of the engine's module on a fixed batch (eval mode, no grad; collective under ZeRO-3)."""
    ids, _ = global_batch(10 ** 6, 2, vocab)
    engine.module.eval()
    with torch.no_grad():
        hf = getattr(engine.module, "hf", None)
        if hf is None:
            raise ValueError("logits need a transformers model (model kind 'hf')")
        out = hf(input_ids=ids, use_cache=False).logits.float()
    engine.module.train()
    return out


def train_segment(seg: dict, plan: dict, probe_dir: Path) -> dict:
    import deepspeed

    from dstoolkit.runtime.model import moe_param_groups

    world, rank = dist.get_world_size(), dist.get_rank()
    model, vocab = build(seg)
    opt = torch.optim.AdamW(moe_param_groups(model), lr=LR, weight_decay=0.0)
    engine, *_ = deepspeed.initialize(model=model, optimizer=opt, config=ds_config(seg, world, plan["total_steps"]))
    load = seg.get("load")
    if load:
        path, _ = engine.load_checkpoint(load["dir"], tag=load.get("tag"))
        if path is None:
            raise RuntimeError(f"could not load {load}")
    start = int(engine.global_steps)
    micro, ga = seg["micro"], seg["ga"]
    n = micro * ga * world
    losses = {}
    if start in seg.get("probe", []):
        probe(engine, seg, start, probe_dir)
    for step in range(start, seg["steps_to"]):
        ids, labels = global_batch(step, n, vocab)
        total = torch.zeros(())
        for m in range(ga):
            lo = (m * world + rank) * micro  # samples of micro-step m on this rank: layout-independent set per step
            loss = engine(ids[lo:lo + micro], labels[lo:lo + micro])
            engine.backward(loss)
            engine.step()
            total += loss.detach().float()
        dist.all_reduce(total)
        losses[step + 1] = float(total) / (ga * world)
        done = step + 1
        if done in seg.get("probe", []):
            probe(engine, seg, done, probe_dir)
        for s in seg.get("save", []):
            if s["step"] == done:
                engine.save_checkpoint(s["dir"], tag=f"global_step{done}")
                if rank == 0 and seg["model"]["kind"] == "hf":
                    engine.module.hf.config.to_json_file(str(Path(s["dir"]) / "config.json"))
    rec: dict[str, Any] = {"name": seg["name"], "losses": losses, "world": world}
    if seg.get("logits"):
        logits = fixed_logits(engine, vocab)
        if rank == 0:
            torch.save(logits, probe_dir / f"{seg['name']}_logits.pt")
    return rec


def pipeline_segment(seg: dict) -> dict:
    """A 2-stage `deepspeed.pipe.PipelineModule` (an MLP regression, ZeRO-1) trained and saved: the pipeline
    checkpoint layout (layer_XX-model_states.pt per layer, pp degree in the model states)."""
    import deepspeed
    from deepspeed.pipe import PipelineModule

    torch.manual_seed(0)
    layers = [torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)]
    model = PipelineModule(layers=layers, num_stages=dist.get_world_size(), loss_fn=torch.nn.MSELoss(),
                           partition_method="uniform")
    cfg = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2, "zero_optimization": {"stage": 1},
           "optimizer": {"type": "AdamW", "params": {"lr": LR, "torch_adam": True}}, "steps_per_print": 10 ** 9}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=list(model.parameters()), config=cfg)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(4, 16, generator=gen)
    y = x[:, :1] * 2

    def batches():
        i = 0
        while True:
            yield x[i % 4:i % 4 + 2], y[i % 4:i % 4 + 2]
            i += 2

    it = batches()
    losses = {s + 1: float(engine.train_batch(data_iter=it)) for s in range(seg["steps_to"])}
    for s in seg.get("save", []):
        engine.save_checkpoint(s["dir"], tag=f"global_step{s['step']}")
    return {"name": seg["name"], "losses": losses, "world": dist.get_world_size()}


def main(argv: list[str]) -> int:
    plan = json.loads(Path(argv[0]).read_text())
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    from dstoolkit.runtime.rankexit import end_ranks, install_rank_guards

    install_rank_guards("dstoolkit ckpt run")  # groups released before exit; JIT-lock waits reported (rankexit)
    deepspeed.init_distributed(dist_backend="gloo")
    probe_dir = Path(plan["probe_dir"])
    probe_dir.mkdir(parents=True, exist_ok=True)
    records = []
    for seg in plan["segments"]:
        if seg["kind"] == "convert":
            if dist.get_rank() == 0:
                from dstoolkit.runtime.ckpt.reshard import to_universal

                to_universal(Path(seg["src"]), Path(seg["out"]))
            dist.barrier()
            continue
        records.append(pipeline_segment(seg) if seg["kind"] == "pipe" else train_segment(seg, plan, probe_dir))
        dist.barrier()
    if dist.get_rank() == 0:
        Path(plan["result"]).write_text(json.dumps({"segments": records}, indent=1))
    end_ranks()  # barrier, then every group destroyed (and released at exit: rankexit)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
