"""A user's HF Trainer script (not dstoolkit's trainer): a Llama-style model built from a config, random tokens.

    torchrun --nproc_per_node 2 hf_train.py --deepspeed ds.json --per_device_train_batch_size 4 \
        --gradient_accumulation_steps 1 --bf16 --max_steps 8 --output_dir out --use_cpu
    accelerate launch --config_file acc.yaml hf_train.py --per_device_train_batch_size 4 ...

Only HF's own flags (TrainingArguments) plus the script's: --seq_len, --dstoolkit_callback (attach
dstoolkit.runtime.train.hf.DstoolkitCallback), --poison_step / --lr_blowup STEP:FACTOR (the callback's fault
injection, for the spike test), --spec, --resume (continue from the newest checkpoint-N in --output_dir).
"""
from dataclasses import dataclass

import torch
from transformers import HfArgumentParser, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments


@dataclass
class ScriptArgs:
    seq_len: int = 32
    dstoolkit_callback: bool = False
    poison_step: int = 0
    lr_blowup: str = ""
    spec: str = ""
    resume: bool = False


class Tokens(torch.utils.data.Dataset):
    """Learnable random sequences: token t+1 = (token t * 3 + 1) % vocab."""

    def __init__(self, n, seq_len, vocab):
        g = torch.Generator().manual_seed(0)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        seq = [start]
        for _ in range(seq_len - 1):
            seq.append((seq[-1] * 3 + 1) % vocab)
        self.x = torch.cat(seq, 1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def main():
    script, args = HfArgumentParser((ScriptArgs, TrainingArguments)).parse_args_into_dataclasses()
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=256, max_position_embeddings=script.seq_len)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    callbacks = []
    if script.dstoolkit_callback:
        from dstoolkit.runtime.train.hf import DstoolkitCallback

        blow = tuple(float(v) for v in script.lr_blowup.split(":")) if script.lr_blowup else None
        callbacks.append(DstoolkitCallback(spec=script.spec or None, poison_step=script.poison_step or None,
                                           lr_blowup=(int(blow[0]), blow[1]) if blow else None))
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(4096, script.seq_len, cfg.vocab_size),
                      callbacks=callbacks)
    resume = None
    if script.resume:  # the newest checkpoint HF finished writing (a killed rank can leave the last one partial)
        from dstoolkit.runtime.train.hf import last_complete_checkpoint

        resume = last_complete_checkpoint(args.output_dir)
    trainer.train(resume_from_checkpoint=resume)


if __name__ == "__main__":
    main()
