"""A NaN loss the HF Trainer callback skips never reaches the weights: real 2-rank gloo HF Trainer + DeepSpeed runs
where the LM head's output goes NaN on rank 1 only, at one micro-batch of step NAN_STEP (rank 0's loss is finite:
the guard's mean over the ranks makes both skip).

Was: `DstoolkitCallback` "skipped" the batch by multiplying its loss by 0; 0 x NaN is NaN, the backward through the
NaN forward made every gradient NaN. Measured before the fix (same runs): ZeRO-0 fp32, all 106,816 weights NaN from
step 4 on (every later loss NaN, the guard escalating to a rollback it had no checkpoint for); ZeRO-2 bf16 with
`bf16.check_grad_overflow: false`, 91,584 NaN at step 4 and 103,744 by step 7; ZeRO-2 bf16 and ZeRO-3 bf16 (default
overflow check), grad norm inf and the whole step dropped, the other micro-batch's gradient with it (weights
finite). Now (`dstoolkit.runtime.train.hfskip.ZeroBatch`) the batch's backward adds exact zeros: no weight is NaN,
the step keeps the other micro-batch's gradient (a finite grad norm), the ranks hold the same weights.

This file is also the rank script (`torchrun tests/dist/test_s29b_train_hf_nan.py ...`)."""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(900)]

NAN_STEP, NAN_RANK, STEPS = 4, 1, 7


# ---------------------------------------------------------------------------------------------- the rank script
def _rank_main(argv: list[str]) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments

    from dstoolkit.runtime.train.hf import DstoolkitCallback
    from dstoolkit.runtime.train.spike import SpikeGuardConfig

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--precision", choices=["bf16", "fp32"], required=True)
    ap.add_argument("--grad_accum", type=int, required=True)
    ap.add_argument("--zero", type=int, default=2)
    ap.add_argument("--nan_micro", type=int, default=0, help="the micro-batch of step NAN_STEP that goes NaN")
    ap.add_argument("--ds_extra", default="{}", help="JSON merged into the DeepSpeed config")
    a = ap.parse_args(argv)
    out = Path(a.out)
    ds = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
          "gradient_clipping": "auto", "zero_optimization": {"stage": a.zero}, "bf16": {"enabled": "auto"}}
    for k, v in json.loads(a.ds_extra).items():
        ds[k] = {**ds.get(k, {}), **v} if isinstance(v, dict) else v
    args = TrainingArguments(output_dir=str(out / "hf"), deepspeed=ds, per_device_train_batch_size=2,
                             gradient_accumulation_steps=a.grad_accum, learning_rate=0.01, lr_scheduler_type="constant",
                             max_steps=STEPS, use_cpu=True, bf16=a.precision == "bf16", report_to="none",
                             save_strategy="no", logging_steps=1, seed=0)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=256, max_position_embeddings=16)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    rank = int(os.environ.get("RANK", "0"))
    micro = {"n": 0}
    nan_at = (NAN_STEP - 1) * a.grad_accum + a.nan_micro  # micro-batch nan_micro (0-based) of step NAN_STEP

    def nan_head(module, inputs, output):  # a NaN in the forward (an overflow, a bad sample), this rank only
        if not module.training:
            return None
        n, micro["n"] = micro["n"], micro["n"] + 1
        return output + float("nan") if (n == nan_at and rank == NAN_RANK) else None

    model.lm_head.register_forward_hook(nan_head)

    class Weights(TrainerCallback):
        """Per step: how many weight elements are not finite, and a checksum (ranks must agree)."""

        def on_step_end(self, args, state, control, model=None, **kw):
            import contextlib

            import deepspeed

            params = list(model.parameters())
            gather = (deepspeed.zero.GatheredParameters(params) if any(hasattr(p, "ds_id") for p in params)
                      else contextlib.nullcontext())  # ZeRO-3: the full weights
            with torch.no_grad(), gather:
                ps = [p.detach().float().clone() for p in params]
                bad = sum(int((~torch.isfinite(p)).sum()) for p in ps)
                total = sum(p.numel() for p in ps)
                csum = sum(float(p.nan_to_num(0.0).double().sum()) for p in ps)
            with open(out / f"weights_rank{rank}.jsonl", "a") as f:
                f.write(json.dumps({"step": state.global_step, "nonfinite": bad, "total": total, "checksum": csum})
                        + "\n")

        def on_log(self, args, state, control, logs=None, **kw):
            if rank == 0 and logs and "grad_norm" in logs:
                with open(out / "hf_log.jsonl", "a") as f:
                    f.write(json.dumps({"step": state.global_step, "loss": logs.get("loss"),
                                        "grad_norm": logs["grad_norm"]}, default=float) + "\n")

    g = torch.Generator().manual_seed(0)
    start = torch.randint(0, 256, (512, 1), generator=g)
    seq = [start]
    for _ in range(15):
        seq.append((seq[-1] * 3 + 1) % 256)
    x = torch.cat(seq, 1)
    data = [{"input_ids": r, "labels": r} for r in x]
    # z_threshold 50: this tiny run's loss falls fast and noisily; only the NaN is to be judged (always caught)
    cb = DstoolkitCallback(metrics_path=str(out / "cb.jsonl"), config=SpikeGuardConfig(z_threshold=50.0))
    Trainer(model=model, args=args, train_dataset=data, callbacks=[cb, Weights()]).train()


if __name__ == "__main__":
    _rank_main(sys.argv[1:])
    sys.exit(0)


# ---------------------------------------------------------------------------------------------- the tests
CASES = {  # name: (precision, gradient accumulation, ZeRO stage, DeepSpeed config extra, NaN micro-batch of the step)
    "zero0-fp32": ("fp32", 1, 0, {}, 0),  # before: every weight NaN
    "zero2-bf16-no-overflow-check": ("bf16", 2, 2, {"bf16": {"check_grad_overflow": False}}, 0),  # before: NaN weights
    "zero2-bf16": ("bf16", 2, 2, {}, 1),  # before: the whole step dropped (grad norm inf)
    "zero3-bf16": ("bf16", 2, 3, {"zero_optimization": {"stage3_param_persistence_threshold": 0}}, 1),  # the same
}


def _run(tmp_path: Path, precision: str, grad_accum: int, zero: int, extra: dict,
         nan_micro: int) -> subprocess.CompletedProcess:
    from dstoolkit.runtime.train.launch import free_port

    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    cmd = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--nproc_per_node", "2", "--master_port",
           str(free_port()), __file__, "--out", str(tmp_path), "--precision", precision, "--grad_accum",
           str(grad_accum), "--zero", str(zero), "--ds_extra", json.dumps(extra), "--nan_micro", str(nan_micro)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _rows(path: Path) -> list[dict]:
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.is_file() else []


@pytest.mark.parametrize("case", list(CASES))
def test_a_nan_loss_on_one_rank_is_skipped_and_never_reaches_the_weights(tmp_path, case):
    precision, grad_accum, zero, extra, nan_micro = CASES[case]
    p = _run(tmp_path, precision, grad_accum, zero, extra, nan_micro)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    w0, w1 = _rows(tmp_path / "weights_rank0.jsonl"), _rows(tmp_path / "weights_rank1.jsonl")
    bad = [r["nonfinite"] for r in w0]
    print(f"[{case}] non-finite weights per step (of {w0[0]['total']}): {bad}")
    assert [r["step"] for r in w0] == [r["step"] for r in w1] == list(range(1, STEPS + 1))
    assert bad == [r["nonfinite"] for r in w1] == [0] * STEPS, bad
    assert [r["checksum"] for r in w0] == [r["checksum"] for r in w1]  # the ranks hold the same weights
    norms = {r["step"]: r["grad_norm"] for r in _rows(tmp_path / "hf_log.jsonl")}
    if norms:  # DeepSpeed reports no grad norm for ZeRO-0 fp32
        print(f"[{case}] grad norm per step: {norms}")
        assert 0 < norms[NAN_STEP] < 100, norms  # the other micro-batch's gradient (measured 1.73-1.76), not inf
        assert all(0 < v < 100 for v in norms.values()), norms
    cb = _rows(tmp_path / "cb.jsonl")
    spikes = [e for e in cb if e.get("event") == "spike"]
    assert [(e["step"], e["kind"], e["action"]) for e in spikes] == [(NAN_STEP, "nonfinite_loss", "skip")], spikes
    rows = [r for r in cb if "event" not in r]  # no row for a step whose only micro-batch was skipped
    assert [r["step"] for r in rows] == [s for s in range(1, STEPS + 1) if s != NAN_STEP or grad_accum > 1]
    assert all(0 < r["loss"] < 10 for r in rows), rows  # trains on; no NaN
