"""s34 validate finding 4: HF TrainingArguments names map to their DeepSpeed keys (a did-you-mean picked the
global batch for per_device_train_batch_size), max_grad_norm is an error (DeepSpeed trains without clipping), and a
weak nearest name (io_parallel -> tensor_parallel, checkpoint-factor -> checkpoint) is no longer an error."""
from dstoolkit.validate import validate_config

BASE = {"train_micro_batch_size_per_gpu": 1}


def _ds101(key: str) -> list:
    return [(f.severity, f.message, f.suggestion) for f in validate_config({**BASE, key: 1}) if f.code == "DS101"]


def test_hf_argument_names_point_at_the_deepspeed_key():
    for key, ds in (("per_device_train_batch_size", "train_micro_batch_size_per_gpu"),
                    ("micro_batch_size", "train_micro_batch_size_per_gpu"),
                    ("max_grad_norm", "gradient_clipping"), ("global_batch_size", "train_batch_size"),
                    ("learning_rate", "optimizer.params.lr"), ("warmup_steps", "scheduler.params.warmup_num_steps")):
        assert _ds101(key) == [("error", f"unknown top-level key {key!r}: DeepSpeed ignores it",
                                f"DeepSpeed reads {ds}")], key


def test_weak_nearest_names_are_warnings():
    for key, near in (("io_parallel", "tensor_parallel"), ("checkpoint-factor", "checkpoint")):
        assert _ds101(key) == [("warning", f"unknown key {key!r} in the top level; DeepSpeed ignores unknown "
                                "top-level keys silently", "fine if another tool reads it (e.g. MS-AMP's 'msamp'); "
                                "otherwise check its name: DeepSpeed never applies it (the nearest DeepSpeed key is "
                                f"{near!r})")], key


def test_typos_and_abbreviations_stay_errors():
    for key, hint in (("gradient_cliping", "gradient_clipping"), ("step_per_print", "steps_per_print"),
                      ("grad_accum_steps", "gradient_accumulation_steps"), ("gradient_clip", "gradient_clipping"),
                      ("train_micro_batch_size", "train_micro_batch_size_per_gpu"),
                      ("gradient_accumulation", "gradient_accumulation_steps")):
        [(severity, _, suggestion)] = _ds101(key)
        assert (severity, suggestion) == ("error", f"did you mean {hint!r}?"), key
    from dstoolkit.validate.schema_findings import close_typo

    assert not close_typo("io_parallel", "tensor_parallel") and not close_typo("checkpoint-factor", "checkpoint")
