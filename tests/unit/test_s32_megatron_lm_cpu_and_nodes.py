"""Megatron-LM on CPU ranks is refused by every verb that loads a spec whose only target it is (it cannot start
there: megatron_lm.CPU_REASON), generate's engine note names only targets that got files, and the Megatron
launchers stop a multi-node launch without NODE_RANK with the one wording the other launchers use."""
import pathlib
import subprocess

import pytest

from dstoolkit.cli import main
from dstoolkit.generate.io import SpecLoadError, load_spec_and_shape, spec_file_findings
from dstoolkit.generate.megatron_lm import CPU_REASON

REPO = pathlib.Path(__file__).resolve().parents[2]
TINY = (REPO / "ds_configs" / "tiny_cpu.yaml").read_text(encoding="utf-8")


@pytest.fixture
def cpu_spec(tmp_path):
    text = "\n".join(line for line in TINY.splitlines() if not line.startswith("targets:"))
    p = tmp_path / "cpu.yaml"
    p.write_text(text + "\n", encoding="utf-8")
    return p


def test_spec_with_only_megatron_lm_on_cpu_is_refused_at_cluster_gpu(cpu_spec, tmp_path):
    with pytest.raises(SpecLoadError) as exc:
        load_spec_and_shape(cpu_spec, ["megatron-lm"])
    text = str(exc.value)
    assert "cluster.gpu: --target megatron-lm on this cluster: Megatron-LM does not run on CPU ranks" in text
    assert "(use --target megatron-deepspeed or deepspeed on CPU, or a GPU in cluster.gpu)" in text
    own = tmp_path / "own.yaml"
    own.write_text(cpu_spec.read_text() + "targets: [megatron-lm]\n", encoding="utf-8")
    [f] = [f for f in spec_file_findings(own) if f.severity == "error"]
    assert (f.path, f.message) == ("cluster.gpu", "targets: [megatron-lm] on this cluster: " + CPU_REASON.split("; use ")[0])
    assert f.suggestion == "set targets: [megatron-deepspeed] or [deepspeed] on CPU, or a GPU in cluster.gpu"
    load_spec_and_shape(cpu_spec, ["megatron-lm", "megatron-deepspeed"])  # another target gets files: no refusal


def test_sweep_estimate_and_generate_refuse_it(cpu_spec, tmp_path, capsys):
    assert main(["sweep", str(cpu_spec), "--target", "megatron-lm"]) == 2
    assert "Megatron-LM does not run on CPU ranks" in capsys.readouterr().err
    assert main(["estimate", str(cpu_spec), "--target", "megatron-lm"]) == 2
    assert "Megatron-LM does not run on CPU ranks" in capsys.readouterr().err
    assert main(["generate", str(cpu_spec), "--target", "megatron-lm", "-o", str(tmp_path / "g")]) == 2
    assert not (tmp_path / "g").exists()


def test_engine_note_only_for_targets_with_files(cpu_spec, tmp_path, capsys):
    assert main(["generate", str(cpu_spec), "--target", "megatron-lm", "--target", "megatron-deepspeed",
                 "--strategy", "zero1", "-o", str(tmp_path / "g")]) == 0
    out = capsys.readouterr().out
    assert "no megatron-lm files: " + CPU_REASON in out
    assert "megatron-lm runs Megatron-Core" not in out


def test_megatron_launcher_multi_node_needs_node_rank(tmp_path):
    out = tmp_path / "g"
    assert main(["generate", str(REPO / "ds_configs" / "mixtral_8x7b_2x8_h100.yaml"), "--target", "megatron-lm",
                 "-o", str(out)]) == 0
    script = next(out.glob("*/launch_megatron_lm.sh"))
    pretrain = tmp_path / "pretrain_gpt.py"
    pretrain.write_text("", encoding="utf-8")
    r = subprocess.run(["bash", str(script)], capture_output=True, text=True, cwd=tmp_path,
                       env={"PATH": "/usr/bin:/bin", "PRETRAIN": str(pretrain), "MOCK_DATA": "1"})
    assert r.returncode == 2
    assert r.stderr.strip() == ("launch_megatron_lm.sh: NODE_RANK is not set: a 2-node launch runs this script on "
                                "every node with NODE_RANK=<this node's rank, 0..1>")
