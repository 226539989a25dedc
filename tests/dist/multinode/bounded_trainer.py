"""The package's example trainer with --dist-timeout-s taken from DSTK_PG_TIMEOUT_S (benchmark shim).

`TRAIN_MODULE=tests.dist.multinode.bounded_trainer DSTK_PG_TIMEOUT_S=10 bash launch.sh` is now the same as
`DIST_TIMEOUT_S=10 bash launch.sh`: the trainer itself sets the timeout on the world group and on every
group DeepSpeed creates later. The tests use DIST_TIMEOUT_S; only benchmarks/multinode_faults.py still
names this module. The flag is appended, so it wins over the --dist-timeout-s that launch.sh passes.
TODO(#9): delete once benchmarks/multinode_faults.py sets DIST_TIMEOUT_S in its launch env instead.
"""
from __future__ import annotations

import os
import sys


def main() -> int:
    from dstoolkit.train.trainer import main as trainer_main

    return trainer_main(sys.argv[1:] + ["--dist-timeout-s", os.environ.get("DSTK_PG_TIMEOUT_S", "60")])


if __name__ == "__main__":
    sys.exit(main())
