"""What DeepSpeed's engine does with the optimizer section and the class it builds (DS245, DS236-DS237): a section
without a type builds nothing, ZeRO refuses classes it has not tested, and two torch.optim classes cannot take a step
inside the engine at all. Which class a config builds is
`rules_optim.optimizer_build` (type, torch_adam, optimizer offload), and whether ZeRO tested it is declared on that
class (`facts.OptimizerBuild.zero_tested`). Each verdict was measured on a 1-rank gloo CPU engine
(deepspeed.initialize on a torch.nn.Linear, two steps). Declared with `dstoolkit.dsconfig.registry.rule`;
``dstoolkit.dsconfig.rules`` imports this module after the optimizer value rules (import that, never this module
alone).
"""
from __future__ import annotations

from typing import Mapping

from dstoolkit.dsconfig.facts import ONEBIT_OPTIMIZER_PARAMS
from dstoolkit.dsconfig.registry import RuleContext, RuleViolation, rule, section, zero_stage
from dstoolkit.dsconfig.rules_optim import optimizer_build

ZERO_TESTED_TYPES = "Adam / AdamW, Adagrad, Lion or Muon"
"""The optimizer.type values whose every class ZeRO tested (FusedAdam, DeepSpeedCPUAdam, torch.optim.Adam / AdamW,
torch.optim.Adagrad, DeepSpeedCPUAdagrad, FusedLion, DeepSpeedCPULion, MuonWithAuxAdam), for the fix."""


@rule("DS245", "optimizer section without optimizer.type")
def _check_optimizer_type_given(cfg: Mapping, ctx: RuleContext) -> None:
    """DeepSpeed builds an optimizer from the config only when optimizer.type is set: runtime/config.py
    get_optimizer_name returns None without the key (or with "type": null), get_optimizer_params then returns None,
    and runtime/engine.py DeepSpeedEngine.__init__ sets has_optimizer only for a client optimizer or a name. Without
    a client optimizer nothing trains: at ZeRO stage 1-2 _configure_zero_optimizer asserts 'zero stage N requires an
    optimizer' at deepspeed.initialize, otherwise the first engine.backward() asserts 'must provide optimizer during
    init in order to use backward' (stage 0; with bf16 an assert without a message) or fails with AttributeError
    (stage 3, DeepSpeedZeRoOffload). HF Trainer / Accelerate
    take the mere presence of an optimizer section as "DeepSpeed builds it" (transformers integrations/deepspeed.py
    deepspeed_optim_sched passes accelerate's DummyOptim, which hands DeepSpeed no optimizer), so under HF it always
    fails. With a client optimizer (deepspeed.initialize(optimizer=...)) the params are ignored without a word
    (measured: lr 1e-3 in the section, the client's 0.5 is used). An error: the section either breaks the run or is
    dead text; the scheduler's counterpart, DS238, is a warning because a run without a scheduler still trains."""
    opt = cfg.get("optimizer") if isinstance(cfg, Mapping) else None
    if not isinstance(opt, dict) or opt.get("type") is not None:
        return
    params = opt.get("params")
    if not (isinstance(params, dict) and params):
        return
    raise RuleViolation("/optimizer/params",
                        f"optimizer.params ({', '.join(params)}) without optimizer.type: DeepSpeed builds no optimizer "
                        "(runtime/config.py get_optimizer_name returns None): without an optimizer passed to "
                        "deepspeed.initialize the run fails ('must provide optimizer during init in order to use "
                        "backward', or 'zero stage N requires an optimizer' at ZeRO-1/2; under HF Trainer always), "
                        "and with one these params are ignored",
                        'add "type" (e.g. "AdamW"), or remove the optimizer section when the script passes its own')


@rule("DS236", "ZeRO with an optimizer it has not tested, without zero_allow_untested_optimizer")
def _check_zero_untested_optimizer(cfg: Mapping, ctx: RuleContext) -> None:
    """At ZeRO stage 1, 2 or 3 DeepSpeed 0.19.8 accepts only the optimizer classes in runtime/zero/utils.py
    ZERO_SUPPORTED_OPTIMIZERS (torch.optim.Adam, torch.optim.AdamW, FusedAdam, DeepSpeedCPUAdam, ZenFlowCPUAdam,
    torch.optim.Adagrad, DeepSpeedCPUAdagrad, DeepSpeedCPULion, FusedLion, and MuonWithAuxAdam once it imports),
    compared by exact type; for any other, runtime/engine.py _do_optimizer_sanity_check asserts 'You are using an
    untested ZeRO Optimizer. Please add <"zero_allow_untested_optimizer": true> in the configuration file to use
    it.' at deepspeed.initialize, unless the top-level zero_allow_untested_optimizer is true (DeepSpeed tests the
    value for truth: then it only warns). Untested: every torch.optim class reached by name (SGD, RMSprop, Adamax,
    NAdam, RAdam, ASGD, Adadelta, Adafactor, LBFGS, Rprop, SparseAdam), DeepSpeed's Lamb (FusedLamb) and mup's
    MuSGD (torch.optim.SGD); MuAdam / MuAdamW build torch.optim.Adam / AdamW and pass (read from microsoft/mup
    mup/optim.py; mup is not installed here). Optimizer offload changes the class the way the engine does
    (Adam -> DeepSpeedCPUAdam, Adagrad -> DeepSpeedCPUAdagrad, Lion -> DeepSpeedCPULion, all tested) and leaves an
    untested class untested (measured: SGD at stage 2 with offload_optimizer cpu raises the same assert);
    zero_force_ds_cpu_optimizer only concerns an optimizer the script passes in, never the config's. Measured on a
    1-rank gloo engine: SGD at stages 2 and 3, RMSprop at stage 1, Adamax at stage 1 and SGD with "stage": "2" raise;
    SGD at stage 0, Adagrad / torch_adam AdamW / Muon at stage 2 and SGD at stage 2 with the flag train. HF Trainer
    sets the flag itself only when the config has no optimizer section (transformers integrations/deepspeed.py
    deepspeed_optim_sched). The 1-bit optimizers of DeepSpeed 0.16 are not checked."""
    stage = zero_stage(cfg)
    if not stage or cfg.get("zero_allow_untested_optimizer"):
        return
    opt = section(cfg, "optimizer")
    name, params = opt.get("type"), opt.get("params")
    if not isinstance(name, str) or (ctx.deepspeed_version.startswith("0.16")
                                     and name.lower() in ONEBIT_OPTIMIZER_PARAMS):
        return
    build = optimizer_build(name, params if isinstance(params, dict) else {}, cfg, ctx.deepspeed_version)
    if build is None or build.zero_tested:
        return
    raise RuleViolation("/optimizer/type",
                        f"optimizer.type {name!r} builds {build.cls}, which is not among ZeRO's tested optimizers "
                        f"(runtime/zero/utils.py ZERO_SUPPORTED_OPTIMIZERS): at zero_optimization.stage={stage} "
                        "DeepSpeed asserts at engine start ('You are using an untested ZeRO Optimizer. Please add "
                        '<"zero_allow_untested_optimizer": true> in the configuration file to use it.\')',
                        'add "zero_allow_untested_optimizer": true at the top level (DeepSpeed then warns and '
                        f"trains), or use {ZERO_TESTED_TYPES}")


STEP_FAILURES: dict[str, tuple[str, str, str]] = {
    "LBFGS": ("TypeError(\"LBFGS.step() missing 1 required positional argument: 'closure'\")",
              "torch.optim.LBFGS re-evaluates the loss through a closure several times per step, and DeepSpeed's "
              "engine (and its ZeRO, fp16 and bf16 wrappers) calls optimizer.step() without one",
              "use a first-order optimizer such as AdamW; L-BFGS needs its own training loop outside the engine"),
    "SparseAdam": ("RuntimeError('SparseAdam does not support dense gradients, please consider Adam instead')",
                   "torch.optim.SparseAdam takes only sparse gradients (nn.Embedding(sparse=True)), and DeepSpeed "
                   "hands it every model parameter (ZeRO flattens them into dense buffers), so any dense layer's "
                   "gradient reaches it",
                   "use AdamW (DeepSpeed's FusedAdam), which takes the dense gradients DeepSpeed produces"),
}
"""torch.optim class (exact case) -> (what its first step raises inside DeepSpeed's engine, why, the fix)."""


@rule("DS237", "optimizer that cannot take a step inside DeepSpeed's engine")
def _check_optimizer_step(cfg: Mapping, ctx: RuleContext) -> None:
    """DeepSpeed builds torch.optim.LBFGS and torch.optim.SparseAdam by name and starts, but the first engine.step()
    fails. LBFGS.step(closure) needs a closure that re-evaluates the loss, and DeepSpeed's engine calls
    optimizer.step() without one: TypeError. SparseAdam refuses dense gradients and DeepSpeed hands it every model
    parameter: RuntimeError 'SparseAdam does not support dense gradients'. Measured on a 1-rank gloo engine over a
    torch.nn.Linear at stage 0 and at stage 2 with zero_allow_untested_optimizer (without the flag ZeRO refuses
    both first, rule DS236)."""
    name = section(cfg, "optimizer").get("type")
    if not isinstance(name, str) or name not in STEP_FAILURES:
        return
    raised, why, fix = STEP_FAILURES[name]
    raise RuleViolation("/optimizer/type", f"optimizer.type {name!r}: DeepSpeed builds torch.optim.{name} and starts, "
                        f"but the first engine step raises {raised}: {why}", fix)
