"""fp16 on CPU ranks (cluster.gpu: cpu) gets a warning at training.precision from `validate SPEC.yaml` and from
`generate`, naming the field and the fix: DeepSpeed's CPU accelerator allows fp16 only where mkldnn fp16 is supported
(machine-dependent, so not an error).

Before: no word from either; on a CPU without mkldnn fp16 every rank of the generated launch.sh stopped with
"ValueError: Type fp16 is not supported on your device".
"""
from __future__ import annotations

from dstoolkit.cli import main

SPEC = """\
name: x
model: {{preset: tiny}}
cluster: {{nodes: 1, gpus_per_node: 2, gpu: {gpu}}}
training:
  seq_len: 128
  global_batch: 8
  precision: {precision}
"""
MESSAGE = ("training.precision: fp16 with cluster.gpu: cpu runs only on a CPU with mkldnn fp16 support: DeepSpeed's "
           "CPU accelerator allows fp16 where torch.ops.mkldnn._is_mkldnn_fp16_supported() is true (AVX512-FP16 / "
           "AMX-FP16), and elsewhere every rank stops at start-up with 'Type fp16 is not supported on your device'")
FIX = "set training.precision: bf16 or fp32"


def _spec(tmp_path, gpu="cpu", precision="fp16"):
    p = tmp_path / "spec.yaml"
    p.write_text(SPEC.format(gpu=gpu, precision=precision))
    return p


def test_validate_warns_at_the_field(tmp_path, capsys):
    p = _spec(tmp_path)
    assert main(["validate", str(p)]) == 0
    cap = capsys.readouterr()
    assert cap.out == f"{p}:7:14: warning[SP004]: {MESSAGE} ({FIX})\n"
    assert cap.err == "1 file(s) checked: 0 error(s), 1 warning(s)\n"


def test_generate_warns_and_summary_lists_it(tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["generate", str(_spec(tmp_path)), "-o", str(out), "--strategy", "zero1"]) == 0
    text = capsys.readouterr().out
    assert f"warning[SP004] (zero1) /training/precision: {MESSAGE} ({FIX})\n" in text
    assert MESSAGE in (out / "zero1" / "summary.md").read_text()


def test_no_warning_for_bf16_on_cpu_or_fp16_on_gpu(tmp_path, capsys):
    for gpu, precision in (("cpu", "bf16"), ("H100-SXM", "fp16")):
        assert main(["validate", str(_spec(tmp_path, gpu, precision))]) == 0
        cap = capsys.readouterr()
        assert (cap.out, cap.err) == ("", "1 file(s) checked: 0 error(s), 0 warning(s)\n")
