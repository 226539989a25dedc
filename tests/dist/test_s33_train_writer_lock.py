"""Two real runs into one --checkpoint-dir (s33 ckpt finding 2): the second is refused on its ranks (a launch.sh /
torchrun started by hand: no `dstoolkit train` pre-flight) with one line and exit 2, and the first one's tags are
its own. Before: both trained, both saved into the folder, both exited 0. One rank each, so the two runs together
use two CPU ranks."""
from __future__ import annotations

import json
import time

import pytest

from dstoolkit.runtime.train.launch import run_local, start_local
from dstoolkit.runtime.train.writer_lock import WRITER_LOCK

pytestmark = pytest.mark.dist


def test_a_second_writer_is_refused_while_the_first_runs(tmp_path, repo_root):
    cfg = json.loads((repo_root / "ds_configs" / "generated" / "tiny_cpu" / "zero0" / "ds_config.json").read_text())
    cfg["bf16"]["enabled"] = False
    cfg["gradient_accumulation_steps"] = 2  # one rank
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(cfg))
    ck = tmp_path / "ck"
    common = ["--deepspeed_config", str(ds), "--spec", str(repo_root / "ds_configs" / "tiny_cpu.yaml"),
              "--checkpoint-dir", str(ck), "--save-every", "1", "--no-progress"]
    a = start_local(common + ["--steps", "400", "--metrics-out", str(tmp_path / "a.jsonl")], nproc=1,
                    log_path=tmp_path / "a.log")
    try:
        deadline = time.monotonic() + 240
        while not (ck / "latest").is_file():
            assert a.poll() is None, (tmp_path / "a.log").read_text()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.2)
        b = run_local(common + ["--steps", "400", "--metrics-out", str(tmp_path / "b.jsonl"), "--resume"], nproc=1,
                      timeout_s=240)
        assert a.poll() is None, "run A ended before run B was checked"
    finally:
        a.kill()
        a.wait()
    assert b.returncode != 0 and "(exitcode: 2)" in b.stderr, b.stderr[-3000:]  # the rank's 2 (torchrun says 1)
    assert (f"dstoolkit.runtime.train.trainer: error: --checkpoint-dir {ck}: another run is writing checkpoints "
            f"there (pid ") in b.stderr
    assert not (tmp_path / "b.jsonl").exists() or "resume" not in (tmp_path / "b.jsonl").read_text()
    assert (ck / WRITER_LOCK).is_file()  # A's, left by its kill: stale for the next run to take over
