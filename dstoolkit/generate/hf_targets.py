"""The `hf` and `accelerate` targets: what a Hugging Face Trainer (or `accelerate launch`) user needs to run one
strategy, as pure functions of a `Candidate`, the spec and the model shape. No torch import.

Per strategy folder:

- ``ds_config_hf.json``: DeepSpeed JSON in HF style: "auto" wherever HF Trainer fills the value from its own
  arguments (transformers ``integrations/deepspeed.py`` ``trainer_config_process`` / ``trainer_config_finalize``:
  batch triad, optimizer lr/betas/eps/weight_decay, scheduler params, gradient_clipping, fp16/bf16 enabled,
  reduce_bucket_size and the two stage-3 sizes from hidden_size), numbers where nothing fills it (the ZeRO
  stage, offload, AutoTP size, overlap/contiguous flags). It passes ``dstoolkit validate --mode hf``.
- ``training_args.json`` and the same values as command-line flags (`training_args_flags`), so that "auto"
  resolves to what the estimate assumed.
- the ``torchrun ... your_train.py --deepspeed ds_config_hf.json ...`` launch line (`hf_launch.hf_launch_line`).
- for accelerate: ``accelerate_config.yaml`` (DeepSpeed plugin pointing at the JSON) and the
  ``accelerate launch`` line. Under accelerate the script gets no ``--deepspeed``: TrainingArguments picks the
  plugin up from ACCELERATE_USE_DEEPSPEED, and HF fills the same "auto" values.

Mapping from a `Candidate`: ``tp > 1`` becomes DeepSpeed AutoTP (``tensor_parallel.autotp_size``; HF Trainer
has no Megatron TP), at ZeRO stage 0-2 only: at stage 3 transformers' from_pretrained refuses AutoTP
(``dstoolkit.runplan.autotp.HF_ZERO3_AUTOTP_NOTE``), so the HF group's sweep keeps tp 1 there and its figures are
those of tp 1; ``pp > 1`` and ``ep > 1`` have no HF target (`hf_unavailable_reason` says why: the pipeline
engine needs a `PipelineModule`, which HF Trainer cannot drive; AutoEP does not start in DeepSpeed 0.19.8, see
``dstoolkit.dsconfig.rule_facts.AUTOEP_TRANSFORMERS_NOTE``). An HF MoE model at ZeRO-3 is fine (its experts are plain
modules, not ``deepspeed.moe``): the JSON names the MoE block as a ZeRO-3 leaf module and the notes say how to
set it in code (``deepspeed.utils.set_z3_leaf_modules``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Union

from dstoolkit.dsconfig.rule_facts import AUTOEP_TRANSFORMERS_NOTE
from dstoolkit.generate.candidates import Candidate
from dstoolkit.generate.ds_json import (ADAM_BETAS, ADAM_EPS, GRADIENT_CLIPPING, STEPS_PER_PRINT, WEIGHT_DECAY,
                                        data_types_section, is_cpu_cluster, scheduler_section)
from dstoolkit.generate.hf_launch import (ACCELERATE_CONFIG, HF_DS_CONFIG, TRAINING_ARGS, accelerate_config,
                                          accelerate_config_yaml, accelerate_launch_line, hf_launch_line,
                                          render_hf_launch_sh)
from dstoolkit.generate.rules import hpz_partition_size
from dstoolkit.models.shape import ModelShape
from dstoolkit.models.tp_plan import tp_plan_of
from dstoolkit.runplan.autotp import HF_ZERO3_AUTOTP_NOTE, hf_zero3_autotp_refusal, shape_tp_refusal
from dstoolkit.spec import Spec
from dstoolkit.validate import validate_config

AUTO = "auto"

# HF MoE block classes per model_type (transformers 5.x module paths): the module ZeRO-3 should fetch whole.
# Without it ZeRO-3 gathers each expert on first use, and ranks that route no token to an expert never gather
# it, so the collective hangs; DeepSpeed's fix is to treat the block as a leaf.
MOE_BLOCK_CLASSES: dict[str, str] = {
    "qwen3_moe": "transformers.models.qwen3_moe.modeling_qwen3_moe.Qwen3MoeSparseMoeBlock",
    "qwen2_moe": "transformers.models.qwen2_moe.modeling_qwen2_moe.Qwen2MoeSparseMoeBlock",
    "mixtral": "transformers.models.mixtral.modeling_mixtral.MixtralSparseMoeBlock",
    "deepseek_v2": "transformers.models.deepseek_v2.modeling_deepseek_v2.DeepseekV2Moe",
    "deepseek_v3": "transformers.models.deepseek_v3.modeling_deepseek_v3.DeepseekV3MoE",
}

PIPELINE_REASON = ("the DeepSpeed pipeline engine needs the model written as a deepspeed.pipe.PipelineModule "
                   "(a flat list of layers, with the loss inside) and trains with engine.train_batch(); HF Trainer "
                   "and Accelerate call model(**batch) and cannot drive it")
ULYSSES_NOTE = ("Ulysses sequence parallelism is not generated for HF: sequence_parallel_size in the JSON only "
                "changes DeepSpeed's batch arithmetic; the script itself must register "
                "deepspeed.runtime.sequence_parallel.ulysses_sp.UlyssesSPAttentionHF and pass its mpu to "
                "deepspeed.initialize, which HF Trainer does not do")


def hf_unavailable_reason(cand: Candidate, shape: ModelShape) -> Optional[str]:
    """Why this candidate has no HF / Accelerate form, or None."""
    if cand.pp > 1:
        return f"pp={cand.pp}: {PIPELINE_REASON}"
    if cand.ep > 1:
        return f"ep={cand.ep} (AutoEP): {AUTOEP_TRANSFORMERS_NOTE}"
    if cand.tp > 1:
        if shape.num_attention_heads % cand.tp:
            return f"AutoTP size {cand.tp} does not divide num_attention_heads={shape.num_attention_heads}"
        refusal = (shape_tp_refusal(shape, tp_plan_of(shape), cand.tp, "tp (tensor_parallel.autotp_size)")
                   or hf_zero3_autotp_refusal(cand.zero_stage, cand.tp, "tp (tensor_parallel.autotp_size)"))
        if refusal:
            return refusal
    if cand.sequence_parallel:
        return "Megatron sequence parallelism has no HF form (it needs Megatron tensor parallelism)"
    return None


def hf_batch_ramp_note(spec: Spec) -> Optional[str]:
    """The launch note for a spec with training.batch_ramp, or None: HF Trainer and Accelerate have no batch ramp
    (TrainingArguments holds one per_device_train_batch_size and gradient_accumulation_steps for the whole run;
    trainer.py builds the dataloader and the accumulation loop from them once), so the HF files train at
    training.global_batch from step 0, and a --tokens plan for them counts no ramp steps
    (`generate.costing.batch_ramp_of_targets`)."""
    if spec.training.batch_ramp is None:
        return None
    return (f"training.batch_ramp is not applied: HF Trainer / Accelerate cannot ramp the batch, so these files train "
            f"at training.global_batch={spec.training.global_batch} from step 0; fix: remove training.batch_ramp, "
            "or ramp with --target deepspeed / megatron-lm / megatron-deepspeed.")


def _mixed_precision(spec: Spec) -> str:
    p = spec.training.precision
    return {"bf16": "bf16", "fp8": "bf16", "fp16": "fp16"}.get(p, "no")


HF_FILLED_SCHEDULER_PARAMS = ("total_num_steps", "warmup_num_steps", "warmup_min_lr", "warmup_max_lr")
"""Scheduler params HF Trainer fills from its arguments (max_steps, warmup_steps, 0, learning_rate)."""


def hf_scheduler_section(spec: Spec) -> Optional[dict]:
    """The DeepSpeed JSON's schedule (`ds_json.scheduler_section`: same type, warm-up and floor), with "auto" where
    HF fills a value from training_args.json (it checks a number there against its own and refuses a mismatch).
    None: no scheduler, and training_args.json says lr_scheduler_type "constant" (HF's default decays to 0)."""
    sched = scheduler_section(spec)
    if sched is None:
        return None
    params = {k: (AUTO if k in HF_FILLED_SCHEDULER_PARAMS else v) for k, v in sched["params"].items()}
    return {"type": sched["type"], "params": params}


def build_hf_ds_config(spec: Spec, shape: ModelShape, cand: Candidate) -> dict:
    """The HF-style DeepSpeed JSON for one candidate ("auto" where HF Trainer / Accelerate fill it).

    Raises:
        ValueError: when the candidate has no HF form (`hf_unavailable_reason`).
    """
    reason = hf_unavailable_reason(cand, shape)
    if reason:
        raise ValueError(reason)
    on_gpu = not is_cpu_cluster(spec)
    cfg: dict[str, Any] = {
        "train_batch_size": AUTO,
        "train_micro_batch_size_per_gpu": AUTO,
        "gradient_accumulation_steps": AUTO,
        "gradient_clipping": AUTO,
        "steps_per_print": STEPS_PER_PRINT,
        "wall_clock_breakdown": False,
    }
    mp = _mixed_precision(spec)
    if mp == "bf16":
        cfg["bf16"] = {"enabled": AUTO}
        cfg.update(data_types_section(spec))
    elif mp == "fp16":
        cfg["fp16"] = {"enabled": AUTO, "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                       "hysteresis": 2, "min_loss_scale": 1}
    params: dict[str, Any] = {"lr": AUTO, "betas": AUTO, "eps": AUTO, "weight_decay": AUTO}
    if is_cpu_cluster(spec) and not cand.offload_optimizer:
        params["torch_adam"] = True  # no FusedAdam JIT build on CPU; offload keeps DeepSpeedCPUAdam (required)
    cfg["optimizer"] = {"type": "AdamW", "params": params}
    sched = hf_scheduler_section(spec)
    if sched is not None:
        cfg["scheduler"] = sched
    z: dict[str, Any] = {"stage": cand.zero_stage}
    if cand.zero_stage in (1, 2):
        z.update({"overlap_comm": on_gpu, "contiguous_gradients": True, "reduce_scatter": True,
                  "reduce_bucket_size": AUTO, "allgather_partitions": True})
    elif cand.zero_stage == 3:
        z.update({"overlap_comm": on_gpu, "contiguous_gradients": True, "reduce_bucket_size": AUTO,
                  "stage3_prefetch_bucket_size": AUTO, "stage3_param_persistence_threshold": AUTO,
                  "stage3_gather_16bit_weights_on_model_save": True})
        block = MOE_BLOCK_CLASSES.get(shape.model_type) if shape.num_experts else None
        if block:
            z["leaf_module"] = {"classes": [block]}
    if cand.offload_optimizer:
        z["offload_optimizer"] = {"device": "cpu", "pin_memory": on_gpu}
    if cand.offload_param:
        z["offload_param"] = {"device": "cpu", "pin_memory": on_gpu}
    if cand.zeropp:
        z.update({"zero_quantized_weights": True, "zero_quantized_gradients": True,
                  "zero_hpz_partition_size": hpz_partition_size(spec, cand)})
    cfg["zero_optimization"] = z
    if cand.tp > 1:
        cfg["tensor_parallel"] = {"autotp_size": cand.tp}
    return cfg


def training_args(spec: Spec, shape: ModelShape, cand: Candidate, *, output_dir: Optional[str] = None,
                  deepspeed: Optional[str] = HF_DS_CONFIG) -> dict:
    """The `TrainingArguments` values that make HF fill the JSON's "auto" with what the estimate assumed.

    Gradient accumulation is global_batch / (micro_batch x dp), dp = world / tp (AutoTP ranks share a batch).
    Checkpoints go to training.save_dir (`output_dir`, relative to where the job is launched) every
    `TrainingSpec.save_interval()` steps. `deepspeed=None` leaves ``deepspeed`` out (the accelerate target:
    the plugin comes from the YAML).
    """
    t = spec.training
    output_dir = t.save_dir if output_dir is None else output_dir
    world = spec.cluster.world_size
    args: dict[str, Any] = {
        "output_dir": output_dir,
        "per_device_train_batch_size": cand.micro_batch,
        "gradient_accumulation_steps": cand.grad_accum(world, t.global_batch),
        "learning_rate": t.lr,
        "adam_beta1": ADAM_BETAS[0],
        "adam_beta2": ADAM_BETAS[1],
        "adam_epsilon": ADAM_EPS,
        "weight_decay": WEIGHT_DECAY,
        "max_grad_norm": GRADIENT_CLIPPING,
        "warmup_steps": t.warmup_steps,
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_steps": t.save_interval(),
        "report_to": "none",
    }
    if scheduler_section(spec) is None:
        args["lr_scheduler_type"] = "constant"  # the DeepSpeed JSON has no scheduler: constant LR there too
    if t.train_steps:
        args["max_steps"] = t.train_steps
    mp = _mixed_precision(spec)
    if mp != "no":
        args[mp] = True
    if cand.checkpoint.kind != "none":
        args["gradient_checkpointing"] = True
    if is_cpu_cluster(spec):
        args["use_cpu"] = True
        args["ddp_backend"] = "gloo"  # DeepSpeed's CPU accelerator would pick ccl
    if deepspeed:
        args["deepspeed"] = deepspeed
    return args


def launch_notes(spec: Spec, shape: ModelShape, cand: Candidate) -> list[str]:
    """What the user's script must do besides the flags (leaf modules, AutoTP, what is not generated)."""
    notes: list[str] = [n for n in (hf_batch_ramp_note(spec),) if n]
    if shape.num_experts and cand.zero_stage == 3:
        block = MOE_BLOCK_CLASSES.get(shape.model_type, f"the {shape.model_type} MoE block class")
        cls = block.rsplit(".", 1)[-1]
        notes.append(
            f"HF MoE model at ZeRO-3: experts are replicated plain modules (not deepspeed.moe). Make the MoE block a "
            f"ZeRO-3 leaf so it is gathered whole: ds_config_hf.json sets zero_optimization.leaf_module.classes = "
            f"[{block}]; in code the same is `from deepspeed.utils import set_z3_leaf_modules; "
            f"set_z3_leaf_modules(model, [{cls}])` before Trainer(...) (DeepSpeed's z3 leaf-module setting).")
    if cand.zero_stage == 3:  # tp is 1 here (hf_unavailable_reason): say why, so no one adds the section by hand
        notes.append(f"No tensor_parallel section (AutoTP) at ZeRO-3, and the estimate is for tp 1: "
                     f"{HF_ZERO3_AUTOTP_NOTE}. AutoTP runs at ZeRO stage 0-2 (strategies zero0, zero1, zero2).")
    if cand.tp > 1:
        notes.append(f"AutoTP: tensor_parallel.autotp_size={cand.tp}; DeepSpeed shards the HF model at "
                     f"deepspeed.initialize (HF Trainer passes the config through). Ranks of one TP group must see "
                     f"the same batch; data parallel size is {cand.dp(spec.cluster.world_size)}.")
    if cand.offload_optimizer:
        notes.append("Optimizer offload: DeepSpeed JIT-builds its CPU Adam op once per machine "
                     "(~/.cache/torch_extensions); keep the optimizer from the JSON (no optim=... override).")
    if cand.ulysses > 1:  # a Ulysses layout only (generate refuses the hf targets for one: targets.py)
        notes.append(ULYSSES_NOTE)
    return notes


def hf_target_files(spec: Spec, shape: ModelShape, cand: Candidate, *, accelerate: bool = False,
                    strategy: str = "", folder: Union[None, str, Path] = None) -> dict[str, str]:
    """File name -> text for one strategy folder (`hf`; with `accelerate` also the accelerate files).

    `folder` is where the folder will live: training_args.json's ``deepspeed`` and accelerate_config.yaml's
    ``deepspeed_config_file`` name its ds_config_hf.json by absolute path (HF and accelerate read a relative one
    against the directory they are launched from); None writes the bare file name (committed goldens). The launch
    scripts pass the JSON's current path either way.

    Raises:
        ValueError: the candidate has no HF form, or the JSON fails ``validate --mode hf`` (a bug here).
    """

    ds = build_hf_ds_config(spec, shape, cand)
    errors = [f for f in validate_config(ds, mode="hf", world_size=spec.cluster.world_size,
                                         gpus_per_node=spec.cluster.nvlink_domain,
                                         num_heads=shape.num_attention_heads,
                                         num_kv_heads=shape.num_key_value_heads) if f.severity == "error"]
    if errors:
        raise ValueError("generated HF DeepSpeed JSON fails validate --mode hf: "
                         + "; ".join(f"{f.code} {f.pointer}: {f.message}" for f in errors))
    ds_path = HF_DS_CONFIG if folder is None else str(Path(folder).expanduser().resolve() / HF_DS_CONFIG)
    args = training_args(spec, shape, cand, deepspeed=ds_path)
    notes = launch_notes(spec, shape, cand)
    what = f"strategy {strategy}, " if strategy else ""
    files = {
        HF_DS_CONFIG: json.dumps(ds, indent=2) + "\n",
        TRAINING_ARGS: json.dumps(args, indent=2) + "\n",
        "launch_hf.sh": render_hf_launch_sh(spec, hf_launch_line(spec, args), notes, name="launch_hf.sh",
                                            what=what + "HF Trainer with DeepSpeed (torchrun on every node)"),
    }
    if accelerate:
        acc_args = training_args(spec, shape, cand, deepspeed=None)
        files[ACCELERATE_CONFIG] = accelerate_config_yaml(accelerate_config(spec, cand, ds_config=ds_path))
        files["launch_accelerate.sh"] = render_hf_launch_sh(
            spec, accelerate_launch_line(spec, acc_args), notes, name="launch_accelerate.sh",
            what=what + "accelerate launch with the DeepSpeed plugin (on every node)")
    return files


def write_hf_target(folder: Path, spec: Spec, shape: ModelShape, cand: Candidate, *, accelerate: bool = False,
                    strategy: str = "") -> list[Path]:
    """Write `hf_target_files` into `folder` (created); returns the paths written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, text in hf_target_files(spec, shape, cand, accelerate=accelerate, strategy=strategy).items():
        p = folder / name
        p.write_text(text, encoding="utf-8")
        if name.endswith(".sh"):
            p.chmod(0o755)
        out.append(p)
    return out


HF_TARGETS = ("hf", "accelerate")
"""The `generate --target` names this module writes."""


class HfTargetFiles:
    """What `hf_targets_for` adds to one strategy folder: files, and the targets it could not write (why)."""

    def __init__(self, files: dict[str, str], skipped: dict[str, str]):
        self.files = files
        self.skipped = skipped


def hf_targets_for(spec: Spec, shape: ModelShape, cand: Candidate, targets, *, strategy: str = "",
                   folder: Union[None, str, Path] = None) -> HfTargetFiles:
    """Files of the requested HF targets (``hf`` and/or ``accelerate``; others ignored) for one strategy folder.

    ``accelerate`` includes the hf files (the YAML points at the same ds_config_hf.json). A candidate with no
    HF form (pipeline, AutoEP) yields no files and a reason per requested target, like
    ``megatron_target_files(...).skipped``.
    """
    wanted = [t for t in targets if t in HF_TARGETS]
    if not wanted:
        return HfTargetFiles({}, {})
    reason = hf_unavailable_reason(cand, shape)
    if reason:
        return HfTargetFiles({}, {t: reason for t in wanted})
    return HfTargetFiles(hf_target_files(spec, shape, cand, accelerate="accelerate" in wanted, strategy=strategy,
                                         folder=folder), {})
