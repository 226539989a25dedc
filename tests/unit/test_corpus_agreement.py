"""Every corpus file gets a verdict, pinned against DeepSpeed 0.19.8's verdict recorded in SOURCES.tsv.

- Where DeepSpeed rejects, we reject, with a finding at the place DeepSpeed's reason names.
- Where DeepSpeed accepts, we accept, or report only the extra errors listed in EXTRA_ERRORS, each with the
  reason it is a true finding DeepSpeed's config check misses.
- Files that are not DeepSpeed configs (gpt-neox YAML, accelerate YAML; verdict N/A) are rejected or refused.
"""
from __future__ import annotations

import csv
import re

import pytest

from dstoolkit.validate import validate_config

# file -> {(code, pointer): reason}: errors we report on configs DeepSpeed 0.19.8's DeepSpeedConfig accepts.
EXTRA_ERRORS: dict[str, dict[tuple[str, str], str]] = {
    "THUDM__GLM__scripts__ds_onebit_config.json": {
        ("DS209", "/optimizer/type"): "OneBitAdam removed in 0.19: engine fails on getattr(torch.optim, 'OneBitAdam')",
    },
    "microsoft__DeepSpeedExamples__cifar__ds_config_onebitlamb.json": {
        ("DS209", "/optimizer/type"): "OneBitLamb removed in 0.19 (engine start fails)",
    },
    "microsoft__DeepSpeedExamples__training__BingBertSquad__1-bit_adam__nccl__deepspeed_onebitadam_bsz96_config.json": {
        ("DS209", "/optimizer/type"): "OnebitAdam removed in 0.19 (engine start fails)",
    },
    "microsoft__DeepSpeedExamples__training__bing_bert__01_adam__nccl__deepspeed_bsz4k_01adam_config_seq128_nccl.json": {
        ("DS209", "/optimizer/type"): "ZeroOneAdam removed in 0.19 (engine start fails)",
    },
    "microsoft__DeepSpeedExamples__training__bing_bert__1-bit_lamb__nccl__deepspeed_bsz64k_onebitlamb_config_seq128_nccl.json": {
        ("DS209", "/optimizer/type"): "OneBitLamb removed in 0.19 (engine start fails)",
    },
    "huggingface__accelerate__tests__deepspeed__ds_config_zero3_model_only.json": {
        ("DS110", "/fp16/enabled"): 'strict mode: "auto" is dropped by DeepSpeed, so fp16 is silently off',
        ("DS110", "/bf16/enabled"): 'strict mode: "auto" is dropped by DeepSpeed, so bf16 is silently off',
    },
    "microsoft__Megatron-DeepSpeed__examples_deepspeed__curriculum_learning__ds_zero_stage_1_config_baseline.json": {
        ("DS210", "/optimizer/params/max_grad_norm"): "engine raises ValueError on max_grad_norm (SOURCES.tsv notes it)",
    },
}

# DeepSpeed's rejection reason (SOURCES.tsv) -> predicate on our error findings: "a finding at the right place".
def _expected(reason: str):
    r = reason
    if r.startswith("string where number expected"):
        return lambda fs, data: any(f.code in ("DS110", "DS102") for f in fs)
    m = re.match(r"(compression_training|legacy curriculum_learning|quantize_training|sparse_attention|"
                 r"progressive_layer_drop)", r)
    if m:
        key = {"legacy curriculum_learning": "curriculum_learning"}.get(m.group(1), m.group(1))
        return lambda fs, data: any(f.code == "DS107" and f.pointer == f"/{key}" for f in fs)
    m = re.match(r"unknown zero_optimization key\(s\) (\S+)", r)
    if m:
        keys = m.group(1).split(",")
        return lambda fs, data: all(any(f.code == "DS101" and f.pointer == f"/zero_optimization/{k}" for f in fs)
                                    for k in keys)
    m = re.match(r"compile section unknown keys (\S+)", r)
    if m:
        keys = m.group(1).split(",")
        return lambda fs, data: all(any(f.code == "DS101" and f.pointer == f"/compile/{k}" for f in fs) for k in keys)
    m = re.match(r"bf16 section has non-bf16 keys (\S+)", r)
    if m:
        keys = m.group(1).split(",")
        return lambda fs, data: all(any(f.code == "DS104" and f.pointer == f"/bf16/{k}" for f in fs) for k in keys)
    if r.startswith("no batch size"):
        return lambda fs, data: any(f.code == "DS202" for f in fs)
    if r.startswith("reduce_bucket_size=0"):
        return lambda fs, data: any(f.code == "DS103" and f.pointer == "/zero_optimization/reduce_bucket_size"
                                    for f in fs)
    if r.startswith("zero stage placeholder"):
        return lambda fs, data: any(f.pointer == "/zero_optimization/stage" for f in fs)
    if r.startswith("fp16.enabled not a bool"):
        return lambda fs, data: any(f.code == "DS102" and f.pointer == "/fp16/enabled" for f in fs)
    if r.startswith("placeholder parsed as string"):
        return lambda fs, data: any(f.code == "DS102" for f in fs)
    raise AssertionError(f"no expectation for DeepSpeed reason {reason!r}")


_VERDICT = re.compile(r"DS 0\.19\.8: (ACCEPT-CONFIG|ACCEPT|REJECT)(?: \((.*?)\)(?:, after|, deprecation|$| \|))?")


def _rows(corpus_dir):
    with open(corpus_dir / "SOURCES.tsv", encoding="utf-8") as fh:
        return list(csv.DictReader(fh, delimiter="\t"))


def _verdict(notes: str) -> tuple[str, str]:
    if "DeepSpeed verdict: N/A" in notes:
        return "N/A", ""
    m = _VERDICT.search(notes)
    assert m, notes
    return m.group(1), (m.group(2) or "")


def _run_all(corpus_dir):
    table = []
    for row in _rows(corpus_dir):
        text = (corpus_dir / row["file"]).read_text(encoding="utf-8", errors="replace")
        findings = validate_config(text, source=row["file"])
        table.append((row["file"], *_verdict(row["notes"]), findings))
    return table


@pytest.fixture(scope="module")
def table(corpus_dir):
    return _run_all(corpus_dir)


def test_every_corpus_file_gets_a_verdict(table, corpus_dir):
    files = {p.name for p in corpus_dir.iterdir() if p.name != "SOURCES.tsv"}
    assert {t[0] for t in table} == files
    assert len(table) == 108


def test_deepspeed_rejects_we_reject_at_the_right_place(table):
    checked = 0
    for name, ds, reason, findings in table:
        if ds != "REJECT":
            continue
        errors = [f for f in findings if f.severity == "error"]
        assert errors, f"{name}: DeepSpeed rejects ({reason}) but we accept"
        assert _expected(reason)(errors, None), (name, reason, [(f.code, f.pointer) for f in errors])
        checked += 1
    assert checked == 66  # DeepSpeed 0.19.8 rejects 66 of the 98 DeepSpeed-format files (SOURCES.tsv)


def test_deepspeed_accepts_we_accept_or_list_the_extra_errors(table):
    accepted = 0
    for name, ds, reason, findings in table:
        if ds not in ("ACCEPT", "ACCEPT-CONFIG"):
            continue
        accepted += 1
        got = {(f.code, f.pointer) for f in findings if f.severity == "error"}
        assert got == set(EXTRA_ERRORS.get(name, {})), (name, got)
    assert accepted == 32
    clean = sum(1 for n, ds, _, _ in table if ds.startswith("ACCEPT") and n not in EXTRA_ERRORS)
    assert clean == 25  # agree exactly (MS-AMP's msamp and cuda_visible_devices: DS101 warnings); the other 7 carry
    # the listed extra errors


def test_non_deepspeed_files_are_not_accepted(table):
    na = [(n, fs) for n, ds, _, fs in table if ds == "N/A"]
    assert len(na) == 10
    for name, findings in na:
        assert any(f.severity == "error" for f in findings), name
    yaml = [fs for n, fs in na if n.endswith(".yaml")]
    assert yaml and all(any(f.code == "DS006" for f in fs) for fs in yaml)


def test_hf_mode_accepts_what_hf_fills(corpus_dir):
    # In hf mode the HF-template configs lose every DS110; what remains must be other, true findings.
    name = "huggingface__accelerate__examples__deepspeed_config_templates__zero_stage3_config.json"
    text = (corpus_dir / name).read_text()
    strict = validate_config(text, source=name)
    hf = validate_config(text, source=name, mode="hf")
    assert sum(f.code == "DS110" for f in strict) >= 8
    assert [f for f in hf if f.severity == "error"] == []


def test_0_16_verdicts_differ_where_sources_say(corpus_dir):
    # SOURCES.tsv: 0.16.5 accepts these, 0.19.8 rejects them (removed sections, bf16 with fp16 keys).
    for name in ("microsoft__DeepSpeedExamples__compression__cifar__config__ds_config_channel_prune.json",
                 "microsoft__DeepSpeed__tests__torch_compile__ds_config_z3.json",
                 "bigscience-workshop__Megatron-DeepSpeed__tests__ds_config_cl.json",
                 "microsoft__DeepSpeedExamples__training__bing_bert__deepspeed_bsz4k_progressive_layer_drop_config_seq128.json"):
        text = (corpus_dir / name).read_text()
        assert [f for f in validate_config(text, deepspeed_version="0.16") if f.severity == "error"] == [], name
        assert [f for f in validate_config(text, deepspeed_version="0.19") if f.severity == "error"], name
    # 0.16 rejects fp16+bf16 both "auto" (read raw, both truthy); 0.19 drops "auto".
    name = "huggingface__accelerate__tests__deepspeed__ds_config_zero3_model_only.json"
    text = (corpus_dir / name).read_text()
    assert any(f.code == "DS203" for f in validate_config(text, deepspeed_version="0.16"))
    assert not any(f.code == "DS203" for f in validate_config(text, deepspeed_version="0.19"))


# HF-launched configs rejected by DeepSpeed only because of "auto" (SOURCES.tsv: "string where number expected
# ... after auto-fill ACCEPT/REJECT"): in --mode hf we accept them, except these, each for a true reason.
HF_MODE_STILL_REJECTED = {
    "hiyouga__LLaMA-Factory__examples__deepspeed__ds_z3_fp8_config.json":
        "comms_config / monitor_config are not DeepSpeed keys (DeepSpeed reads comms_logger, tensorboard, ...)",
    "microsoft__DeepSpeedExamples__autotuning__ds_config.json":
        "list-valued train_micro_batch_size_per_gpu; DeepSpeed rejects it after auto-fill too",
}


def test_hf_mode_on_configs_rejected_only_for_auto(corpus_dir):
    auto_rows = [r for r in _rows(corpus_dir) if "DS 0.19.8: REJECT (string where number expected" in r["notes"]]
    assert len(auto_rows) == 38
    still = set()
    for row in auto_rows:
        text = (corpus_dir / row["file"]).read_text(encoding="utf-8")
        if [f for f in validate_config(text, source=row["file"], mode="hf") if f.severity == "error"]:
            still.add(row["file"])
    assert still == set(HF_MODE_STILL_REJECTED)


# DeepSpeed 0.16.5 verdicts (SOURCES.tsv) against ours with --deepspeed-version 0.16.
EXTRA_ERRORS_016 = {
    # SOURCES.tsv: "ACCEPT-CONFIG but optimizer.params.max_grad_norm -> engine ValueError"
    "microsoft__Megatron-DeepSpeed__examples_deepspeed__curriculum_learning__ds_zero_stage_1_config_baseline.json":
        {("DS210", "/optimizer/params/max_grad_norm")},
    "microsoft__Megatron-DeepSpeed__examples_deepspeed__curriculum_learning__ds_zero_stage_1_config_curriculum_fixed_linear.json":
        {("DS210", "/optimizer/params/max_grad_norm")},
}
_VERDICT_016 = re.compile(r"DS 0\.16\.5: (ACCEPT-CONFIG|ACCEPT|REJECT)(?: \((.*?)\)(?:, after|, deprecation|$| \|))?")


def _expected_016(reason: str):
    if "fp16 and bf16 both truthy" in reason:
        return lambda fs, data: any(f.pointer in ("/fp16/enabled", "/bf16/enabled") for f in fs)
    return _expected(reason)


def test_deepspeed_0_16_agreement(corpus_dir):
    rejected = accepted = 0
    for row in _rows(corpus_dir):
        m = _VERDICT_016.search(row["notes"])
        if not m:
            continue
        text = (corpus_dir / row["file"]).read_text(encoding="utf-8", errors="replace")
        errors = [f for f in validate_config(text, source=row["file"], deepspeed_version="0.16")
                  if f.severity == "error"]
        if m.group(1) == "REJECT":
            rejected += 1
            assert errors and _expected_016(m.group(2) or "")(errors, None), (row["file"], m.group(2))
        else:
            accepted += 1
            assert {(f.code, f.pointer) for f in errors} == EXTRA_ERRORS_016.get(row["file"], set()), row["file"]
    assert (rejected, accepted) == (57, 41)
