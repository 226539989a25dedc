"""A bad-input refusal of the example trainer is said once per launch (s35 finding 4). Every rank refuses the same input
(a --resume of another model's checkpoint: each rank compares its engine with the saved parameters) and each printed
the same line: N copies under torchrun, whose own exit is 1 whatever its ranks' codes (torch/distributed/run.py
`main` lets launcher/api.py's ChildFailedError end the process). Now global rank 0 says it at once; another rank
waits `OTHER_RANKS_WAIT_S` (the launcher stops it meanwhile once rank 0 has exited) and says it only if still running."""
import pytest

from dstoolkit.runtime.train import trainer


@pytest.fixture
def waits(monkeypatch):
    got = []
    monkeypatch.setattr(trainer.time, "sleep", got.append)
    return got


def _refused(train_files, tmp_path):
    spec, ds = train_files
    return trainer.main(["--deepspeed_config", str(ds), "--spec", str(spec), "--steps", "0", "--metrics-out",
                         str(tmp_path / "m.jsonl")])


@pytest.mark.parametrize("rank, waited", [(None, []), ("0", []), ("1", [5.0]), ("3", [5.0])])
def test_rank_0_says_it_at_once_the_others_after_the_wait(train_files, tmp_path, monkeypatch, capsys, waits, rank,
                                                          waited):
    if rank is None:
        monkeypatch.delenv("RANK", raising=False)
    else:
        monkeypatch.setenv("RANK", rank)
    assert _refused(train_files, tmp_path) == 2
    assert waits == waited  # was: [] on every rank, each printing at once
    assert capsys.readouterr().err == "dstoolkit.runtime.train.trainer: error: --steps=0 must be > 0\n"
