"""Review s32 #8: the real-mode rank check is one check (`tune.options._check_ranks`, only the advice differs under
--shrink), and exit 143 is one constant (`cli.options.EXIT_TERMINATED`) used by tune and train."""
from __future__ import annotations

import pathlib
import re
import signal
from types import SimpleNamespace

import pytest

from dstoolkit.cli.options import EXIT_INTERRUPTED, EXIT_TERMINATED, exit_for_signal
from dstoolkit.tune import options as tune_options
from dstoolkit.tune.space import TuneInputError

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_one_constant_for_sigterm():
    assert EXIT_TERMINATED == 128 + signal.SIGTERM == exit_for_signal(signal.SIGTERM)
    assert exit_for_signal(signal.SIGINT) == EXIT_INTERRUPTED
    for name in ("tune.py", "train.py"):
        src = (ROOT / "dstoolkit" / "cli" / name).read_text()
        assert not re.search(r"\b143\b|128 \+", src), name


def _spec(nodes=2, gpus=8):
    return SimpleNamespace(cluster=SimpleNamespace(nodes=nodes, gpus_per_node=gpus, world_size=nodes * gpus, gpu="cpu"))


def test_one_rank_check_two_advices(monkeypatch):
    monkeypatch.setattr(tune_options, "_local_ranks", lambda: (False, 2))
    assert not hasattr(tune_options, "_check_shrink_cluster")
    with pytest.raises(TuneInputError) as shrink:
        tune_options._check_ranks(_spec(), shrink=True)
    with pytest.raises(TuneInputError) as real:
        tune_options._check_real_mode_possible(_spec())
    stem = ("cluster: 2 node(s) x 8 = 16 ranks, but real mode launches every rank on this machine (2 CPU cores); ")
    assert str(shrink.value) == ("--shrink: " + stem + "with --shrink, set cluster to nodes: 1, gpus_per_node: 2, "
                                 "gpu: cpu (and a training.global_batch that 2 divides)")
    assert str(real.value) == stem + "use --mode estimate for clusters you cannot reach"
    tune_options._check_ranks(_spec(1, 2), shrink=True)  # fits this machine: no refusal
