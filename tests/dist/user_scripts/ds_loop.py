"""A user's plain DeepSpeed training loop (not dstoolkit's trainer).

    torchrun --nproc_per_node 2 ds_loop.py --config ds.json --steps 8

--guard wraps the loop in dstoolkit.runtime.train.guard.Guard (spike skip / rollback through
engine.save_checkpoint / load_checkpoint); --poison-step N feeds one batch with garbage labels at step N,
--lr-blowup N:F multiplies the LR by F from step N; --ckpt DIR --save-every K for checkpoints (resume from the
newest in DIR at start).
"""
import argparse
import json

import deepspeed
import torch
import torch.nn as nn


class TinyLM(nn.Module):
    def __init__(self, vocab=256, hidden=64):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))
        self.out = nn.Linear(hidden, vocab)

    def forward(self, input_ids, labels):
        h = self.emb(input_ids)
        h = h + self.mlp(h)
        logits = self.out(h).float()
        return nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1))


def batch(step, micro, mb, seq, vocab=256):
    g = torch.Generator().manual_seed(1000 * step + micro)
    start = torch.randint(0, vocab, (mb, 1), generator=g)
    seqs = [start]
    for _ in range(seq - 1):
        seqs.append((seqs[-1] * 3 + 1) % vocab)
    x = torch.cat(seqs, 1)
    return x, x.clone()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--guard", action="store_true")
    ap.add_argument("--poison-step", type=int, default=0)
    ap.add_argument("--lr-blowup", default="")
    ap.add_argument("--ckpt", default="")
    ap.add_argument("--save-every", type=int, default=0)
    ap.add_argument("--metrics", default="")
    ap.add_argument("--local_rank", type=int, default=-1)
    args = ap.parse_args()
    from dstoolkit.runtime.rankexit import install_exit_guard

    install_exit_guard()  # what a user's loop adds: the groups released before exit (dstoolkit/runtime/rankexit.py)
    deepspeed.init_distributed(dist_backend="gloo")
    torch.manual_seed(0)
    model = TinyLM()
    cfg = json.load(open(args.config))
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
    mb, ga = engine.train_micro_batch_size_per_gpu(), engine.gradient_accumulation_steps()
    rank = torch.distributed.get_rank()
    blow_step, blow_f = (int(args.lr_blowup.split(":")[0]), float(args.lr_blowup.split(":")[1])) \
        if args.lr_blowup else (0, 1.0)
    guard = None
    if args.guard:
        from dstoolkit.runtime.train.guard import Guard

        guard = Guard(engine, checkpoint_dir=args.ckpt or None, save_every=args.save_every,
                      metrics_path=args.metrics or None)
        guard.resume()
    step = guard.step_count if guard else 0
    poisoned = blown = False
    while step < args.steps:
        if blow_step and step == blow_step and not blown:  # the user's own LR blow-up, once
            blown = True
            for g in engine.optimizer.param_groups:
                g["lr"] *= blow_f
        for micro in range(ga):
            pos = guard.data_pos if guard else step * ga + micro
            x, y = batch(pos, rank, mb, args.seq_len)
            if args.poison_step and step == args.poison_step and not poisoned:
                poisoned = True
                y = torch.randint(0, 256, y.shape)  # garbage labels: a loss spike
            loss = engine(x, y)
            if guard is not None:
                guard.step(loss)  # backward + step, or skip / roll back
            else:
                engine.backward(loss)
                engine.step()
        step = guard.step_count if guard else step + 1
    if guard is not None:
        guard.__exit__(None, None, None)
    if rank == 0:
        print(f"done steps={step}", flush=True)


if __name__ == "__main__":
    main()
