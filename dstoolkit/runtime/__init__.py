"""dstoolkit.runtime: the torch side. The example trainer and training helpers (`train`), the benchmarks
(`bench`), the FP8 layer swaps (`fp8`), the tiny model for real runs (`model`) and the multi-host test hosts
(`testhosts`). The core (hardware, dsconfig, validate, spec, models, layout, estimate, generate) never imports
this package; it needs the `[train]` extra (torch, deepspeed)."""
