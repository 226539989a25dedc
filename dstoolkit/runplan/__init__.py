"""dstoolkit.runplan: one run to estimate, and the one reader of a DeepSpeed JSON (no torch import).

    from dstoolkit.runplan import RunPlan, DsView, read_ds_config, plan_from_spec

`RunPlan` (model shape + DeepSpeed JSON + cluster + layout) checks its layout with `dstoolkit.layout`;
`DsView` is the JSON parsed by `dstoolkit.dsconfig.DeepSpeedConfig` with DeepSpeed's defaults filled in;
`plan_from_spec` is the one Spec -> RunPlan adapter; `AutoTp` / `autotp_layout` say what DeepSpeed AutoTP does
with the embedding, the LM head and the logits, and `tp_splits` whether TP splits a parameter entry. Sits between `models` and `estimate`.
"""
from dstoolkit.runplan.autotp import AutoTp, autotp_layout, tp_splits
from dstoolkit.runplan.dsview import DsView, read_ds_config
from dstoolkit.runplan.plan import Fp8Selection, Precision, RunPlan, plan_from_spec

__all__ = ["AutoTp", "DsView", "Fp8Selection", "Precision", "RunPlan", "autotp_layout", "plan_from_spec", "read_ds_config",
           "tp_splits"]
