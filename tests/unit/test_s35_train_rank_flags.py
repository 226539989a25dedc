"""One word for the rank count on every verb (s35 finding 3): `dstoolkit train` said --nproc only, `bench train`
--world-size / --num-gpus only, validate / estimate / resolve --world-size; `dstoolkit bench train CFG --nproc 3` ended
with the top-level usage line. Now `train` takes --world-size beside --nproc and `bench train` --nproc beside
--world-size / --num-gpus (one dest each), and each help names the words."""
import pytest

from dstoolkit.cli import build_parser, main


@pytest.mark.parametrize("flag", ["--nproc", "--world-size"])
def test_train_takes_both_words(flag):
    args = build_parser().parse_args(["train", "--spec", "s.yaml", "--config", "c.json", "--steps", "2", flag, "3"])
    assert args.world_size == 3


@pytest.mark.parametrize("flag", ["--world-size", "--num-gpus", "--nproc"])
def test_bench_train_takes_every_word(flag):
    args = build_parser().parse_args(["bench", "train", "c.json", flag, "3"])
    assert args.world_size == 3


def test_the_verb_runs_with_world_size(train_files, capsys):
    spec, ds = train_files
    assert main(["train", "--spec", str(spec), "--config", str(ds), "--steps", "2", "--world-size", "2",
                 "--dry-run"]) == 0
    assert " --nproc_per_node 2 " in capsys.readouterr().out


@pytest.mark.parametrize("argv", [["train", "--help"], ["bench", "train", "--help"]])
def test_the_help_names_both(argv, capsys):
    with pytest.raises(SystemExit):
        main(argv)
    out = " ".join(capsys.readouterr().out.split())
    assert "--nproc" in out and "--world-size" in out
