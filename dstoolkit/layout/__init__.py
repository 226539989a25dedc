"""dstoolkit.layout: the parallel layout, once. `dims` holds the arithmetic (ParallelDims, dp/edp, the batch
triad, layers per stage, hpZ groups, the ramp increment); the layout rules, each with a code (LY0xx), a title, the
facts it reads, an explanation and a check, are declared in `degree_rules` (how the ranks are split) and
`step_rules` (how a step runs over them) through `registry`, and asked through `constraints`.

Pure Python and at the bottom of the core (beside `hardware`): the spec loader, `validate`'s cross-field
rules, the sweep, the estimator, the tuner and the trainer all ask it."""
from dstoolkit.layout.constraints import (CONSTRAINTS, LayoutFacts, Violation, check_layout, explain,
                                          first_violation, require)
from dstoolkit.layout.dims import (BatchTriad, LayoutError, MegatronSplit, ParallelDims, data_parallel_size,
                                   megatron_split, pipeline_split, ramp_increment, resolve_batch, stage_layer_range,
                                   stage_layers)

__all__ = ["BatchTriad", "CONSTRAINTS", "LayoutError", "LayoutFacts", "MegatronSplit", "ParallelDims", "Violation",
           "check_layout", "data_parallel_size", "explain", "first_violation", "megatron_split", "pipeline_split",
           "ramp_increment", "require", "resolve_batch", "stage_layer_range", "stage_layers"]
