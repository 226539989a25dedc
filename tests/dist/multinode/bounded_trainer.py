"""The package's example trainer with a bounded process-group timeout on every group (tests only).

`TRAIN_MODULE=tests.dist.multinode.bounded_trainer DSTK_PG_TIMEOUT_S=10 bash launch.sh` runs
`dstoolkit.train.trainer` unchanged except that collectives fail after DSTK_PG_TIMEOUT_S seconds instead of
hanging: DeepSpeed's `init_distributed` timeout (default 10 min, DEEPSPEED_TIMEOUT in whole minutes) covers
only the world group, and the ZeRO / expert groups DeepSpeed makes with `dist.new_group` take torch's
default (30 min for gloo). A cut link would otherwise hang the job for half an hour.
TODO(#9): remove when the trainer takes a process-group timeout itself (see docs/across_nodes.md).
"""
from __future__ import annotations

import datetime
import functools
import os
import sys


def main() -> int:
    timeout = datetime.timedelta(seconds=float(os.environ.get("DSTK_PG_TIMEOUT_S", "60")))
    import torch.distributed.distributed_c10d as c10d

    c10d.default_pg_timeout = timeout  # read by every later dist.new_group (DeepSpeed's ZeRO/EP groups)
    import deepspeed

    deepspeed.init_distributed = functools.partial(deepspeed.init_distributed, timeout=timeout)
    from dstoolkit.train.trainer import main as trainer_main

    return trainer_main()


if __name__ == "__main__":
    sys.exit(main())
