"""`dstoolkit train --config DIR/<strategy>-ep/ds_config.json` builds the model at the ep the folder's layout.json
records (s37): before, without --ep-size the run used the spec's `ep: auto` -> 1, so the zero0-ep strategy of
ds_configs/tiny_moe_cpu.yaml trained and saved at ep 1 (DeepSpeed's group ep_size_1, one expp_rank_0 optimizer file
of 123.6 MB) while its layout.json, launch.sh (--ep-size 2) and estimate said ep 2."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dstoolkit.models.presets import PRESETS
from dstoolkit.runtime.train.trainer_inputs import build_parser, ep_size_of
from dstoolkit.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "ds_configs" / "tiny_moe_cpu.yaml"
GEN = REPO / "ds_configs" / "generated" / "tiny_moe_cpu"


def _ep(config: Path, *extra: str) -> int:
    args = build_parser().parse_args(["--deepspeed_config", str(config), "--spec", str(SPEC), "--steps", "1", "--metrics-out", "m.jsonl",
                                      *extra])
    return ep_size_of(args, load_spec(str(SPEC)), PRESETS["tiny-moe"])


@pytest.mark.parametrize("strategy,ep", [("zero0-ep", 2), ("zero1-ep", 2), ("zero1", 1), ("zero0", 1)])
def test_ep_is_the_layout_files(strategy, ep):
    assert json.loads((GEN / strategy / "layout.json").read_text())["files"]["ds_config.json"]["ep"] == ep
    assert _ep(GEN / strategy / "ds_config.json") == ep


def test_the_flag_wins_and_a_config_without_a_layout_takes_the_spec(tmp_path):
    assert _ep(GEN / "zero0-ep" / "ds_config.json", "--ep-size", "1") == 1
    alone = tmp_path / "ds_config.json"  # copied out of its folder: no layout.json, the spec's ep auto -> 1
    shutil.copy(GEN / "zero0-ep" / "ds_config.json", alone)
    assert _ep(alone) == 1
    (tmp_path / "layout.json").write_text("{not json")  # unreadable: validate names it; the run takes the spec
    assert _ep(alone) == 1


@pytest.mark.parametrize("typed", ["--world-size", "--nproc"])
def test_the_refusal_names_the_rank_flag_as_typed(typed, capsys):
    # before, `--world-size 3` was answered "--nproc 3 does not fit ... or run with --nproc 2"
    from dstoolkit.cli import main

    config = REPO / "ds_configs" / "generated" / "tiny_cpu" / "zero2" / "ds_config.json"
    rc = main(["train", "--spec", str(REPO / "ds_configs" / "tiny_cpu.yaml"), "--config", str(config), "--steps", "2",
               typed, "3", "--dry-run"])
    err = capsys.readouterr().err
    other = "--nproc" if typed == "--world-size" else "--world-size"
    assert rc == 2 and f"error: {typed} 3 does not fit --config" in err and f"or run with {typed} 2 " in err
    assert f"{other} 3" not in err and f"{other} 2" not in err
