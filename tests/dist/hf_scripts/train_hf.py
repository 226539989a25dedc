"""A small HF Trainer script for the hf / accelerate target runs (tests/dist/test_hf_targets.py).

Builds a tiny transformers model from a config (never downloads weights), trains it with `Trainer` on a fixed
synthetic token set for the --max_steps the generated flags give, and writes a result JSON on rank 0: loss per
step, step time, peak resident memory per rank. DeepSpeed comes from `--deepspeed ds_config_hf.json` (hf
target) or from `accelerate launch`'s plugin (accelerate target); the script is the same.

    torchrun --nproc_per_node 2 train_hf.py --model llama --result r.json <generated TrainingArguments flags>
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time

import torch
from transformers import HfArgumentParser, Trainer, TrainerCallback, TrainingArguments

VOCAB, SEQ, SAMPLES = 128, 32, 64


def build_model(kind: str):
    torch.manual_seed(0)
    if kind == "qwen3_moe":
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        cfg = Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                             num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                             num_experts=4, num_experts_per_tok=2, max_position_embeddings=SEQ,
                             decoder_sparse_step=1, mlp_only_layers=[])
        return Qwen3MoeForCausalLM(cfg)
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQ,
                      tie_word_embeddings=False)
    return LlamaForCausalLM(cfg)


class Tokens(torch.utils.data.Dataset):
    """Repeating short patterns: learnable in a few steps, so the loss falls visibly."""

    def __init__(self):
        g = torch.Generator().manual_seed(1)
        base = torch.randint(0, VOCAB, (8, 8), generator=g)
        self.x = torch.stack([base[i % 8].repeat(SEQ // 8) for i in range(SAMPLES)])

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


class Record(TrainerCallback):
    def __init__(self):
        self.losses, self.times, self._t = [], [], None

    def on_step_begin(self, args, state, control, **kw):
        self._t = time.perf_counter()

    def on_step_end(self, args, state, control, **kw):
        self.times.append(time.perf_counter() - self._t)

    def on_log(self, args, state, control, logs=None, **kw):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def main(argv=None):
    from dstoolkit.runtime.rankexit import install_exit_guard

    install_exit_guard()  # what a user's script adds: the groups released before exit (dstoolkit/runtime/rankexit.py)
    argv = list(sys.argv[1:] if argv is None else argv)
    own = {"--model": "llama", "--result": "result.json", "--leaf_modules": None, "--also": None}
    for k in list(own):
        if k in argv:
            i = argv.index(k)
            if k == "--leaf_modules":
                own[k] = True
                argv.pop(i)
            else:
                own[k] = argv[i + 1]
                del argv[i:i + 2]
    runs = [(argv, own["--result"])]
    # --also DIR1,DIR2: after this run, the same flags with DIRn/ds_config_hf.json, result to DIRn/result.json
    # (one process for several strategies: importing transformers + deepspeed is most of a run's time)
    for d in (own["--also"] or "").split(",") if own["--also"] else []:
        a = list(argv)
        a[a.index("--deepspeed") + 1] = os.path.join(d, "ds_config_hf.json")
        runs.append((a, os.path.join(d, "result.json")))
    for i, (a, result) in enumerate(runs):
        if i:
            from accelerate.state import AcceleratorState
            from accelerate.utils import is_deepspeed_available  # noqa: F401

            AcceleratorState._reset_state(reset_partial_state=False)
        run_one(a, own, result)


def run_one(argv, own, result):
    (args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses(argv)
    model = build_model(own["--model"])
    if own["--leaf_modules"]:
        from deepspeed.utils import set_z3_leaf_modules
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

        set_z3_leaf_modules(model, [Qwen3MoeSparseMoeBlock])
    rec = Record()
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[rec])
    trainer.train()
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
    peaks = torch.tensor([peak_mib], dtype=torch.float64)
    if torch.distributed.is_initialized():
        torch.distributed.all_reduce(peaks, op=torch.distributed.ReduceOp.MAX)
    if int(os.environ.get("RANK", "0")) == 0:
        ds = getattr(trainer, "deepspeed", None) or getattr(trainer.model_wrapped, "optimizer", None)
        stage, offload = None, {}
        if trainer.accelerator.state.deepspeed_plugin is not None:
            z = trainer.accelerator.state.deepspeed_plugin.deepspeed_config.get("zero_optimization", {})
            stage = z.get("stage")
            offload = {k: z[k].get("device") for k in ("offload_optimizer", "offload_param") if k in z}
        out = {"losses": rec.losses, "step_s": rec.times[1:] or rec.times, "peak_rss_mib": float(peaks.item()),
               "zero_stage": stage, "offload": offload, "engine": type(ds).__name__ if ds is not None else None,
               "optimizer": type(getattr(ds, "optimizer", None)).__name__,
               "params_per_rank": sum(p.numel() for p in trainer.model_wrapped.parameters()),
               "world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1}
        print(f"train_hf: world_size={out['world_size']} steps={len(rec.losses)} "
              f"last_loss={rec.losses[-1] if rec.losses else None}", flush=True)
        with open(result, "w") as f:
            json.dump(out, f)


if __name__ == "__main__":
    main()
