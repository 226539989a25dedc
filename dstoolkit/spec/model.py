"""The training spec: model + cluster + training plan, as a pydantic schema.

This is the contract between generation, estimation, sweeps and real runs. No torch import. The YAML file
format and its line-located errors live in `dstoolkit.spec.loader`. The model section is resolved to a
`dstoolkit.models.shape.ModelShape` by `dstoolkit.models.resolve_model`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from dstoolkit.common.model import Auto, StrictModel as _Strict  # the one strict base and "auto"
from dstoolkit.dsconfig.fp8 import Fp8Config, check_fp8_hardware, token_problem
from dstoolkit.spec.checkpoint import CheckpointPolicy
from dstoolkit.spec.cluster import ClusterSpec
from dstoolkit.spec.cluster_fields import ClusterModelFields, check_engine_fields
from dstoolkit.spec.layout_facts import raise_spec_layout, raise_training_layout
from dstoolkit.spec.errors import Loc, SpecError, SpecFieldError, SpecFinding, SpecSource, _did_you_mean, _dotted
from dstoolkit.spec.whole_numbers import WholeNumberFields

# ----------------------------------------------------------------------------------------------------------
# Schema
# ----------------------------------------------------------------------------------------------------------




class ModelSpec(BaseModel):
    """Exactly one of: `preset`, `hf_config`, or inline Hugging Face config fields (model_type, hidden_size, ...)."""

    model_config = ConfigDict(extra="allow", use_attribute_docstrings=True)

    preset: Optional[str] = None
    """Name of a bundled preset (llama-3-8b, llama-3-70b, llama-3.1-405b, mixtral-8x7b, deepseek-v3, tiny, ...)."""
    hf_config: Optional[str] = None
    """Path to a Hugging Face config.json, relative to the spec file."""
    model_class: Optional[str] = None
    """With hf_config or inline fields: the transformers class to build the config with (e.g.
    DeepseekV3ForCausalLM for a kimi_k2 config); an unknown model_type's error offers the class its
    `architectures` names."""

    module: Optional[str] = None
    """The user's own torch module instead of a config: `package.module:attribute`, a callable returning an
    nn.Module or an nn.Module class (imported from the spec's folder too); see module_kwargs."""
    module_kwargs: Optional[dict[str, Any]] = None
    """With module: keyword arguments of the call, e.g. {d: 256, layers: 4}."""

    _source: Optional[SpecSource] = PrivateAttr(default=None)
    _loc: Loc = PrivateAttr(default=("model",))

    @property
    def inline(self) -> dict[str, Any]:
        """The inline Hugging Face fields (everything except preset / hf_config); empty for the other forms."""
        return dict(self.model_extra or {})

    @property
    def form(self) -> Literal["preset", "hf_config", "module", "inline"]:
        """Which of the four forms this is."""
        if self.preset is not None:
            return "preset"
        if self.hf_config is not None:
            return "hf_config"
        if self.module is not None:
            return "module"
        return "inline"

    def error(self, field: Optional[Union[str, Loc]], problem: str, fix: str, at_key: bool = False,
              code: str = "SP004") -> SpecError:
        """A `SpecError` located at `model.<field>` in the spec file (when loaded from a file).

        Used by `dstoolkit.models.resolve_model` so that a bad preset name, a missing HF field or an unreadable
        hf_config points at its YAML line (`code` SP006 for a file that cannot be read: exit 2).
        """
        sub: Loc = () if field is None else ((field,) if isinstance(field, str) else tuple(field))
        loc = tuple(self._loc) + sub
        if self._source is not None:
            return SpecError([self._source.finding(loc, problem, fix, at_key, code=code)])
        return SpecError([SpecFinding("", None, None, _dotted(loc), problem, fix, code)])

    @model_validator(mode="after")
    def _check_module_form(self) -> "ModelSpec":
        if self.module_kwargs is not None and self.module is None:
            raise SpecFieldError(("module_kwargs",), "module_kwargs is set but model.module is not",
                                 "add module: package.module:callable, or remove module_kwargs")
        if self.module is None:
            return self
        others = [k for k in ("preset", "hf_config", "model_class") if getattr(self, k) is not None]
        others += list(self.model_extra or {})
        if others:
            raise SpecFieldError((others[0],), f"model.module={self.module!r} and {others[0]} are exclusive",
                                 f"keep module (your nn.Module) or {others[0]}, not both")
        return self

    @model_validator(mode="after")
    def _check_exactly_one_form(self) -> "ModelSpec":
        inline = self.model_extra or {}
        if self.module is not None:
            return self
        if self.preset is None and self.hf_config is None and not inline:
            raise SpecFieldError(
                (), "no model given",
                "set `preset: NAME`, `hf_config: path/to/config.json`, or inline HF fields starting with `model_type:` "
                "(or `module: package.module:callable` for your own nn.Module)",
            )
        if self.preset is not None and self.model_class is not None:
            raise SpecFieldError(("model_class",), f"model_class={self.model_class!r} builds an HF config, not a preset",
                                 "drop model_class, or give hf_config / inline fields instead of the preset")
        if self.preset is not None and self.hf_config is not None:
            raise SpecFieldError(
                ("hf_config",), f"preset={self.preset!r} and hf_config={self.hf_config!r} are exclusive",
                "keep exactly one of preset / hf_config / inline fields",
            )
        if inline and (self.preset is not None or self.hf_config is not None):
            first = next(iter(inline))
            other = "preset" if self.preset is not None else "hf_config"
            raise SpecFieldError(
                (first,), f"inline field {first!r} cannot be combined with {other}",
                f"remove {first!r}, or drop {other} and give every field inline",
            )
        if inline and "model_type" not in inline:
            for key in inline:
                guess = _did_you_mean(key, ["preset", "hf_config", "model_type"])
                if guess:
                    raise SpecFieldError((key,), f"unknown key {key!r}", f"did you mean {guess!r}?")
            raise SpecFieldError(
                ("model_type",), "inline model fields need model_type",
                "add e.g. `model_type: llama` (llama, mistral, mixtral, qwen2, qwen2_moe, deepseek_v2, deepseek_v3, gpt2)",
            )
        return self


class BatchRampSpec(WholeNumberFields):
    """Batch-size ramp. Either token-based (DeepSeek-style) or Megatron's rampup_batch_size triple."""

    kind: Literal["tokens", "megatron"] = "tokens"
    """tokens: start_batch -> global_batch over ramp_tokens; megatron: start, increment, ramp_samples."""
    start_batch: int = Field(gt=0)
    """Global batch (sequences) at step 0."""
    increment: Optional[int] = Field(default=None, gt=0)
    """Sequences added per ramp step (megatron) or the rounding step (tokens; default micro x dp)."""
    ramp_tokens: Optional[int] = Field(default=None, gt=0)
    """tokens kind: tokens over which the batch ramps to training.global_batch."""
    ramp_samples: Optional[int] = Field(default=None, gt=0)
    """megatron kind: samples over which the batch ramps."""

    @model_validator(mode="after")
    def _check_kind_fields(self) -> "BatchRampSpec":
        if self.kind == "tokens":
            if self.ramp_tokens is None:
                raise SpecFieldError(("ramp_tokens",), "kind='tokens' needs ramp_tokens", "add ramp_tokens: <tokens over which the batch ramps>")
            if self.ramp_samples is not None:
                raise SpecFieldError(("ramp_samples",), "ramp_samples is only used with kind='megatron'", "use ramp_tokens, or set kind: megatron")
        else:
            for name in ("increment", "ramp_samples"):
                if getattr(self, name) is None:
                    raise SpecFieldError((name,), f"kind='megatron' needs {name}", f"add {name} (Megatron --rampup-batch-size START INCREMENT SAMPLES)")
            if self.ramp_tokens is not None:
                raise SpecFieldError(("ramp_tokens",), "ramp_tokens is only used with kind='tokens'", "use ramp_samples, or set kind: tokens")
        return self


# Steps between saves when the spec gives none: about an hour of a large pre-training run at 3-4 s per step, the
# order of Megatron-LM's example scripts (--save-interval 1000 in examples/gpt3/train_gpt3_175b_distributed.sh).
DEFAULT_SAVE_INTERVAL_STEPS = 1000


class TrainingSpec(ClusterModelFields):
    """The training plan (the cluster-model fields: `dstoolkit.spec.cluster_fields`)."""

    seq_len: int = Field(gt=0)
    """Tokens per sequence."""
    global_batch: int = Field(gt=0)
    """Sequences per optimizer step over all data-parallel ranks."""
    micro_batch: Union[int, Auto] = "auto"
    """Sequences per rank per forward/backward; "auto" lets the generator pick the largest that fits."""
    precision: Literal["bf16", "fp16", "fp8", "fp32"] = "bf16"
    """Compute precision; fp8 means FP8 GEMMs with bf16 elsewhere."""
    optimizer: Literal["adamw", "adam", "sgd", "lamb", "adafactor"] = "adamw"
    """Optimizer family."""
    lr: float = Field(default=3e-4, gt=0)
    """Peak learning rate."""
    warmup_steps: int = Field(default=0, ge=0)
    """Linear LR warm-up steps."""
    train_steps: Optional[int] = Field(default=None, gt=0)
    """Total optimizer steps (for the scheduler); None leaves the decay open."""
    activation_checkpointing: Literal["none", "full", "every-k", "ratio", "selective", "auto"] = "none"
    """Recompute policy; see checkpoint_every_k / checkpoint_ratio."""
    checkpoint_every_k: int = Field(default=1, ge=1)
    """every-k policy: checkpoint one of every k layers."""
    checkpoint_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """ratio policy: fraction of layers checkpointed."""
    flash_attention: bool = True
    """Fused/flash attention (removes the s^2 score activations)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism alongside TP."""
    tp: Union[int, Auto] = 1
    """Tensor-parallel degree."""
    pp: Union[int, Auto] = 1
    """Pipeline-parallel degree."""
    ep: Union[int, Auto] = 1
    """Expert-parallel degree (MoE only)."""
    zero_stage: Union[Literal[0, 1, 2, 3], Auto] = "auto"
    """ZeRO stage."""
    grad_accum_dtype: Optional[Literal["fp32"]] = None
    """Accumulate gradients in fp32 under bf16 / fp8 (DeepSpeed `data_types.grad_accum_dtype`); None: in the model
    dtype, DeepSpeed's default. With it DeepSpeed runs BF16_Optimizer at ZeRO 1 without offload (engine.py
    _do_optimizer_sanity_check): a full-size fp32 gradient buffer beside the bf16 parameters; stages 2 and 3 keep
    their ZeRO optimizer, and stage 0 is refused (rule DS229), so zero0 strategies are not generated with it."""
    offload: bool = False
    """Whether CPU offload of optimizer (and at stage 3 parameters) may be used."""
    zeropp: bool = False
    """Whether ZeRO++ (qwZ/hpZ/qgZ) may be used (stage 3)."""
    batch_ramp: Optional[BatchRampSpec] = None
    """Optional batch-size ramp."""
    save_dir: str = "checkpoints"
    """Folder the generated launch files save model checkpoints to (and resume from), relative to where the job
    is launched unless absolute. One fact for every target: DeepSpeed/HF output_dir, Megatron --save/--load."""
    save_interval_steps: Optional[int] = Field(default=None, gt=0)
    """Optimizer steps between checkpoint saves; None: `DEFAULT_SAVE_INTERVAL_STEPS`, capped at train_steps so a
    run shorter than that still saves once at its end (see `save_interval`)."""
    fp8: Optional[dict[str, Any]] = None
    """FP8 settings with precision fp8: the fields of `dstoolkit.dsconfig.fp8.Fp8Config` (recipe, format, amax_history_len, ...).
    Kept as a mapping so a located finding can name the bad sub-field; `Spec._check_fp8_supported` validates it."""

    def fp8_config(self):
        """The `Fp8Config` for this plan (Transformer Engine defaults when `fp8` is not given)."""
        return Fp8Config.model_validate(self.fp8 or {})

    @field_validator("micro_batch", "tp", "pp", "ep")
    @classmethod
    def _check_positive_degree(cls, value: Union[int, str], info) -> Union[int, str]:
        if isinstance(value, int) and value < 1:
            raise SpecFieldError((), f"{info.field_name}={value} must be >= 1", "give a positive integer or 'auto'")
        return value

    @model_validator(mode="after")
    def _check_checkpoint_params_match_policy(self) -> "TrainingSpec":
        if self.activation_checkpointing != "every-k" and self.checkpoint_every_k != 1:
            raise SpecFieldError(
                ("checkpoint_every_k",),
                f"checkpoint_every_k={self.checkpoint_every_k} is only used with activation_checkpointing='every-k' "
                f"(training.activation_checkpointing={self.activation_checkpointing!r})",
                "set activation_checkpointing: every-k, or remove checkpoint_every_k",
            )
        if self.activation_checkpointing != "ratio" and self.checkpoint_ratio != 1.0:
            raise SpecFieldError(
                ("checkpoint_ratio",),
                f"checkpoint_ratio={self.checkpoint_ratio} is only used with activation_checkpointing='ratio' "
                f"(training.activation_checkpointing={self.activation_checkpointing!r})",
                "set activation_checkpointing: ratio, or remove checkpoint_ratio",
            )
        return self

    @model_validator(mode="after")
    def _check_grad_accum_dtype(self) -> "TrainingSpec":
        if self.grad_accum_dtype is not None and self.precision not in ("bf16", "fp8"):
            raise SpecFieldError(
                ("grad_accum_dtype",),
                f"grad_accum_dtype={self.grad_accum_dtype!r} needs precision bf16 or fp8, not "
                f"{self.precision!r} (fp32 training accumulates in fp32 already; DeepSpeed refuses fp16 with fp32 "
                "accumulation at ZeRO 0: engine.py 'unsupported mix of model_dtype and grad_accum_dtype')",
                "remove grad_accum_dtype, or set precision: bf16",
            )
        if self.grad_accum_dtype is not None and self.zero_stage == 0:
            raise SpecFieldError(
                ("grad_accum_dtype",),
                f"grad_accum_dtype={self.grad_accum_dtype!r} with zero_stage: 0: DeepSpeed 0.19 refuses a gradient "
                "accumulation dtype other than the model's without ZeRO (engine.py NotImplementedError "
                "'unsupported mix of model_dtype and grad_accum_dtype'; rule DS229)",
                "set zero_stage: 1 (BF16_Optimizer) or auto, or remove grad_accum_dtype",
            )
        return self

    @model_validator(mode="after")
    def _check_layout(self) -> "TrainingSpec":
        # The layout constraints that need no cluster facts and no engine (the engine's: Spec._check_layout).
        raise_training_layout(self)
        return self

    def save_interval(self) -> int:
        """Steps between checkpoint saves that every target writes (save_interval_steps, or the default capped at
        train_steps)."""
        if self.save_interval_steps is not None:
            return self.save_interval_steps
        if self.train_steps is not None:
            return min(DEFAULT_SAVE_INTERVAL_STEPS, self.train_steps)
        return DEFAULT_SAVE_INTERVAL_STEPS

    def checkpoint_policy(self) -> CheckpointPolicy:
        """The `CheckpointPolicy` for activation_checkpointing / checkpoint_every_k / checkpoint_ratio.

        Raises:
            ValueError: activation_checkpointing is "auto" (the generator or sweep must choose first).
        """
        kind = self.activation_checkpointing
        if kind == "auto":
            raise ValueError(
                "training.activation_checkpointing='auto' has no policy yet "
                "(resolve it first: the generator/sweep picks none, selective, every-k or full)"
            )
        if kind == "every-k":
            return CheckpointPolicy(kind="every-k", every_k=self.checkpoint_every_k)
        if kind == "ratio":
            return CheckpointPolicy(kind="ratio", ratio=self.checkpoint_ratio)
        return CheckpointPolicy(kind=kind)


class Spec(_Strict):
    """A whole spec file."""

    name: str = "spec"
    """Short name used for output folders."""
    model: ModelSpec
    """Which model."""
    cluster: ClusterSpec = Field(default_factory=ClusterSpec)
    """Where it runs."""
    training: TrainingSpec
    """How it trains."""
    targets: list[Literal["deepspeed", "megatron-lm", "megatron-deepspeed", "hf", "accelerate"]] = Field(
        default_factory=list)
    """Launchers the run is for (`generate --target` / `sweep --target` when not given on the command line); the
    sweep keeps only layouts one of them runs (dstoolkit.generate.targets). Empty: every layout, deepspeed files."""

    _source: Optional[SpecSource] = PrivateAttr(default=None)

    @property
    def world_size(self) -> int:
        """Total ranks: cluster.nodes * cluster.gpus_per_node."""
        return self.cluster.world_size

    @property
    def source_path(self) -> Optional[Path]:
        """The YAML file this spec came from (None when built in Python)."""
        return self._source.path if self._source is not None else None

    @property
    def base_dir(self) -> Path:
        """Directory relative paths (model.hf_config) resolve against: the spec file's folder, else the cwd."""
        return self._source.path.parent if self._source is not None else Path.cwd()

    def error(self, loc: Union[str, Loc], problem: str, fix: str, at_key: bool = False) -> SpecError:
        """A `SpecError` at a field path such as ("training", "ep") or "training.ep" (line:col when loaded
        from a file). For rules that need more than the spec, e.g. the resolved model shape."""
        path: Loc = tuple(loc.split(".")) if isinstance(loc, str) else tuple(loc)
        if self._source is not None:
            return SpecError([self._source.finding(path, problem, fix, at_key)])
        return SpecError([SpecFinding("", None, None, _dotted(path), problem, fix)])

    @model_validator(mode="after")
    def _check_layout(self, info) -> "Spec":
        # The layout constraints that need the world size or the targets (dstoolkit.spec.layout_facts); targets given
        # on the command line (load_spec(targets=...)) are the spec's, and the fixes name the flag
        cli = (info.context or {}).get("targets_from") == "--target"
        raise_spec_layout(self, from_command_line=cli)
        check_engine_fields(self, from_command_line=cli)  # recompute_modules: a target (or the framework) runs Megatron
        return self

    @model_validator(mode="after")
    def _check_fp8_supported(self) -> "Spec":
        if self.training.precision != "fp8":
            if self.training.fp8 is not None:
                raise SpecFieldError(
                    ("training", "fp8"),
                    f"training.fp8 is set but training.precision={self.training.precision!r}",
                    "set precision: fp8, or remove the fp8 section",
                )
            return self
        gpu = self.cluster.gpu_spec
        if gpu.peak_fp8_flops is None:
            raise SpecFieldError(
                ("training", "precision"),
                f"training.precision='fp8' but cluster.gpu={gpu.name!r} has no fp8 tensor cores",
                "use bf16, or a Hopper/Ada/MI300 GPU (H100-SXM, H200, H800, L40S, MI300X)",
            )
        try:
            cfg = self.training.fp8_config()
        except ValidationError as exc:
            err = exc.errors()[0]
            raise SpecFieldError(
                ("training", "fp8", *err["loc"]),
                err["msg"],
                "see dstoolkit.dsconfig.fp8.Fp8Config for the allowed fields and values",
            ) from None
        problems = check_fp8_hardware(cfg, gpu, self.cluster.cuda_version)
        if problems:
            raise SpecFieldError(("training", "fp8"), "; ".join(problems), "pick a recipe this GPU runs, or another GPU")
        t = self.training  # micro_batch "auto" is picked later, by the planner
        problem = None if t.micro_batch == "auto" else token_problem(
            cfg, t.micro_batch, t.seq_len, {"micro_batch": "training.micro_batch", "seq_len": "training.seq_len"})
        if problem:
            what, _, near = problem.rpartition(": use ")
            raise SpecFieldError(("training", "seq_len"), what, f"use {near}, or precision bf16")
        return self


