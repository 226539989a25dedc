"""The fidelity table in README.md: how close each estimate comes to measurement, every figure read from the
committed result file its row names (`dstoolkit.runtime.bench.result_files`), drawn with the one markdown reporter
(`dstoolkit.runtime.bench.report`). No torch is imported here.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Sequence

from dstoolkit.runtime.bench.report import render_markdown_table
from dstoolkit.runtime.bench.result_files import PageError, Results, files_cell, pct


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of the fidelity table."""

    what: str
    against: str
    result: str
    files: tuple[str, ...]
    """Result files (relative to benchmarks/results/) the figures were read from."""


def _latest_by_key(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Newest record per `key` among bench records (events skipped), in first-seen order (as the reporter does)."""
    out: dict[str, dict[str, Any]] = {}
    for r in records:
        if r.get("event") is None and "key" in r:
            out.pop(r["key"], None)
            out[r["key"]] = r
    return list(out.values())


def _last_summary(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    done = [r for r in records if r.get("event") == "run_done" and r.get("summary")]
    if not done:
        raise PageError("no run_done record with a summary")
    return done[-1]["summary"]


def _when(env: dict[str, Any]) -> str:
    return str(env.get("timestamp_utc") or env.get("date") or "date not recorded")[:10]


def _load(xs: Sequence[float]) -> str:
    return f"{min(xs):.1f}-{max(xs):.1f}" if len(xs) > 1 and min(xs) != max(xs) else f"{xs[0]:.1f}"


def _memory_rows(res: Results) -> list[Row]:
    f = "memory_fidelity_cpu_202611.json"
    d = res.json(f)
    ranks = len({r["rank"] for r in d["rows"]})
    ms, act = d["worst_model_state_error"], d["worst_activation_error"]
    act_cells = len({r["cell"] for r in d["rows"] if "err_activations" in r})
    ds = d["env"]["deepspeed"]
    return [
        Row("model states per rank", f"real DeepSpeed {ds} engines, {ranks} ranks: ZeRO 0-3 × fp32/bf16 × offload × "
            "MoE ep 1/2",
            f"worst error {pct(ms[0], 4)} ({ms[1]}, rank {ms[2]}) over {d['cells']} cells × {ranks} ranks; "
            f"{len(d['cells_over_model_state_goal'])} over the goal of {pct(d['model_state_goal'], 0, False)}", (f,)),
        Row("activations", "`saved_tensors_hooks`, none / full / every-k / selective recompute",
            f"worst error {pct(act[0], 4)} ({act[1]}, rank {act[2]}) over {act_cells} cells × {ranks} ranks; "
            f"{len(d['cells_over_activation_goal'])} over the goal of {pct(d['activation_goal'], 0, False)}", (f,)),
    ]


def _peak_memory_row(res: Results) -> Row:
    # The JSONL holds the measurements only; the benchmark scores them against the estimator when it renders, so
    # the scored figures are read from its markdown summary. The same grid measured on two CPU models.
    parts, files = [], []
    for stem in ("peak_memory_cpu_202612_continuous", "peak_memory_cpu_202612_continuous_xeon"):
        f = f"{stem}.md"
        cells = res.match(f, r"\*\*Cells:\*\* (\d+), failed: (\d+)\. \*\*Worst peak error:\*\* ([-+0-9.]+%) "
                             r"\(([^)]*)\)\. Goal ±([0-9.]+%); cells over it: ([^.]+)\.")
        phase = res.match(f, r"Estimated peak phase = a measured peak phase in (\d+) of (\d+) rows")
        census = res.match(f, r"Largest shortfall of the sampled census against the continuous peak: ([-+0-9.]+%)")
        cpu = res.jsonl(f"{stem}.jsonl")[0]["env"].get("cpu_model") or "CPU model not recorded"
        parts.append(f"{cpu}: {cells[1]} cells ({cells[2]} failed), worst error {cells[3]} ({cells[4]}), cells "
                     f"over the goal of ±{cells[5]}: {cells[6]}; peak phase as measured in {phase[1]}/{phase[2]} "
                     f"rows; the older phase-point census reads down to {census[1]} against the continuous peak")
        files += [f, f"{stem}.jsonl"]
    return Row("peak memory per rank", "the CPU allocator's running count of live bytes over every allocation and "
               "free, all threads (`dstoolkit/runtime/alloc_tracker.py`), iterations 2-3 of real DeepSpeed engines, "
               "2 ranks: ZeRO 0-3 × fp32/bf16 × offload × recompute, project model + transformers Llama and Mistral",
               "; ".join(parts), tuple(files))


def _step_time_row(res: Results) -> Row:
    parts, files = [], []
    for f in ("step_time_fidelity_cpu_202612.json", "step_time_fidelity_cpu_202612_run2.json",
              "step_time_fidelity_cpu_202611.json"):
        d = res.json(f)
        m, env = d["metrics"], d["env"]
        cpu = env.get("cpu_model") or "CPU model not recorded"
        parts.append(f"{_when(env)} ({cpu}, load {d['loadavg_before'][0]:.1f}): wall MAPE "
                     f"{pct(m['wall']['mape'], sign=False)}, Spearman {m['wall']['spearman']:.3f}; CPU clock "
                     f"{pct(m['cpu']['mape'], sign=False)} / {m['cpu']['spearman']:.3f} ({m['wall']['n']} configs)")
        files.append(f)
    return Row("step time", "configs run on 2 CPU ranks, calibrated by the same probe the estimator caches (op-level "
               "CPU model since 2026-12: each GEMM at its shape, the attention core by seq and head dim, elementwise "
               "per saved byte, DeepSpeed's gradient path from a probed ZeRO-2 step; 2026-11: block-rate model)",
               "; ".join(parts) + " (goals 10%, 0.95)", tuple(files))


def _cpu_block_row(res: Results) -> Row:
    f = "cpu_block_shapes_202612.json"
    rows = res.json(f)["rows"]
    op, one = [], []
    for prec in sorted({r["precision"] for r in rows}):
        e_op = [r["op_model_error"] for r in rows if r["precision"] == prec]
        e_one = [r["error"] for r in rows if r["precision"] == prec]
        worst = max((r for r in rows if r["precision"] == prec), key=lambda r: abs(r["error"]))
        op.append(f"{prec} {pct(min(e_op), 0)} to {pct(max(e_op), 0)}")
        one.append(f"{prec} {pct(min(e_one), 0)} to {pct(max(e_one), 0)} (worst: hidden {worst['hidden']}, head "
                   f"dim {worst['head_dim']})")
    return Row("CPU blocks by shape", "one block fwd+bwd per width and head dim, against the op-level model and the "
               "older one-rate interpolation",
               f"op-level: {', '.join(op)}; one interpolated rate: {', '.join(one)} ({len(rows)} shapes)", (f,))


def _malloc_row(res: Results) -> Row:
    f = "cpu_malloc_202612.json"
    rows = res.json(f)["rows"]
    parts = []

    def mean(prec: str, variant: str, key: str) -> float:
        xs = [r[key] for r in rows if r["precision"] == prec and r["variant"] == variant]
        return sum(xs) / len(xs)

    for prec in sorted({r["precision"] for r in rows}):
        d_f, t_f = mean(prec, "default", "minor_faults_per_step"), mean(prec, "tuned", "minor_faults_per_step")
        cpu = mean(prec, "tuned", "cpu_s") / mean(prec, "default", "cpu_s") - 1
        parts.append(f"{prec}: minor page faults per step {d_f:,.0f} -> {t_f:,.0f}, CPU seconds per step {pct(cpu, 0)}")
    sh = res.json(f)["shape"]
    return Row("CPU ranks' allocator", f"a ZeRO-2 step on 2 ranks ({sh['model_type']}, hidden {sh['hidden_size']}, "
               f"{sh['num_hidden_layers']} layers, vocab {sh['vocab_size']}), glibc malloc defaults vs the settings "
               "dstoolkit gives CPU ranks (`dstoolkit/common/cpu_env.py`)", "; ".join(parts) + " (mean of the repeats)",
               (f,))


def _bench_train_row(res: Results) -> Row:
    parts, files = [], []
    for f in ("train_tiny_cpu2_202612.jsonl", "train_tiny_cpu2_202611.jsonl"):
        recs = [r for r in _latest_by_key(res.jsonl(f)) if (r.get("error") or {}).get("step_time_s") is not None]
        errs = [(r["config_name"].split("/")[-1], r["error"]["step_time_s"]) for r in recs]
        mae = sum(abs(e) for _, e in errs) / len(errs)
        parts.append(f"{_when(recs[-1].get('env') or {})}: " + ", ".join(f"{n} {pct(e, 0)}" for n, e in errs)
                     + f"; mean absolute {pct(mae, sign=False)}")
        files.append(f)
    return Row("`bench train`, generated tiny configs", "real steps through the deepspeed launcher vs the calibrated "
               "estimate (2026-12: op-level CPU model and allocator settings; 2026-11: block-rate model)",
               "; ".join(parts), tuple(files))


def _throttle_row(res: Results) -> Row:
    f = "multinode_throttle_cpu_202611.json"
    d = res.json(f)
    runs = ", ".join(f"{r['strategy']} {pct(r['error_estimator_as_is'], 0)}" for r in d["runs"])
    return Row("step time across hosts", f"{d['layout']}, link throttled to {d['rate']}", runs, (f,))


def _megatron_ds_row(res: Results) -> Row:
    f = "megatron_deepspeed_runs_202612.jsonl"
    recs = res.jsonl(f)
    meta = next(r["meta"] for r in recs if "meta" in r)
    runs = [r for r in recs if "strategy" in r and not r.get("superseded")]
    loads = [x for r in runs for x in (r["load_before"][0], r["load_after"][0])]
    parts = []
    for r in runs:
        trained = (f"loss {r['loss_start']:.2f} -> {r['loss_end']:.2f}, step {r['median_step_s']:.2f} s vs "
                   f"{r['est_step_s']:.2f} s estimated" if r.get("loss_end") is not None else "")
        if r.get("ok"):
            ramp = r.get("ramp_check")
            if ramp:
                plan = ramp["plan"]
                trained += (f"; batch ramp {plan['start']} -> {plan['final']} over {plan['ramp_samples']} samples: "
                            f"{len(ramp['expected_batches']) - len(ramp['mismatches'])}/{len(ramp['expected_batches'])} "
                            "steps at the spec's batch")
            parts.append(f"{r['strategy']}: {trained}")
        else:
            err = r.get("error", "").replace("[rank0]: ", "").replace("|", "/")
            parts.append(f"{r['strategy']}: " + (f"{trained}, then stops: {err}" if trained else f"stops: {err}"))
    return Row("Megatron-DeepSpeed runs of generated files", "`generate --target megatron-deepspeed` folders run by "
               f"their own `launch_megatron_deepspeed.sh` through Megatron-DeepSpeed {meta['commit'][:8]} on "
               f"{meta['cpu']} (gloo), synthetic indexed data; the patches to their tree are listed in the results",
               f"1-min load {_load(loads)}: " + "; ".join(parts), (f,))


def _megatron_two_host_row(res: Results) -> Row:
    f = "megatron_two_host_cpu_202612.jsonl"
    parts = []
    for r in res.jsonl(f):
        how = " ".join(r.get("extra_args") or []) or "as generated"
        head = f"{r['target']} {r['tree_commit'][:8]} ({how}), world size {r['world_size']}"
        if r.get("ok"):
            shards = sum(1 for c in r.get("checkpoint_files") or [] if "optim_states" in str(c))
            parts.append(f"{head}: {r['last_step']} steps, loss {r['first_loss']:.2f} -> {r['last_loss']:.2f}, "
                         f"{shards} ZeRO optimizer shards saved, exit codes {r['returncodes']}")
        else:
            err = str(r.get("error", "")).split(" (File ")[0].replace("|", "/")
            parts.append(f"{head}: stops: {err}")
    return Row("Megatron files across two hosts", "each target's generated launch script run unchanged once per "
               "host (2 network-namespace hosts × 2 CPU ranks, gloo, `NODE_RANK=k MASTER_ADDR=<host 0>`)",
               "; ".join(parts), (f,))


def _validate_speed_row(res: Results) -> Row:
    f = "validate_speed_cpu_202611.jsonl"
    last = res.jsonl(f)[-1]
    s = last["sets"]["deepspeed_format"]
    return Row("validate speed", f"cold `dstoolkit validate` vs DeepSpeed's `DeepSpeedConfig`, {s['files']} corpus "
               "configs", f"{s['speedup_median']:.1f}× faster (median {s['dstoolkit']['median_s']:.2f} s vs "
               f"{s['deepspeed']['median_s']:.2f} s, {last['reps']} repeats, {_when(last)})", (f,))


def _cautioned(s: dict[str, Any]) -> str:
    """How many of the sweeps' OOM layouts predicted to fit still carry the sum-of-parts caution."""
    n = s.get("missed_oom_cautioned")
    return "the sum-of-parts caution not counted" if n is None else f"{n} of them with the sum-of-parts caution"


def _published_row(res: Results) -> Row:
    f = "published_runs_202612.jsonl"
    s = _last_summary(res.jsonl(f))
    lo, g, sp = s["loso"]["overall"], s["goals"], s["split"]
    ok = (lo["mape_out_of_source"] <= g["mape"] and s["spearman_efficiency"] >= g["spearman_efficiency"]
          and len(s["not_fitting"]) <= g["false_ooms"])
    met = "met" if ok else "not met"
    return Row("throughput on GPU clusters", f"{s['runs']} published training runs, {s['sources']} source tables "
               "(Megatron-LM, Korthikanti, Llama 3, torchtitan, MPT, NeMo, Megatron-Bridge, Megatron MoE zoo, "
               "DeepSeek-V3, BLOOM, MT-NLG, flash-attention's training code), A100/H100/H800/B200/GB200/GB300",
               f"MAPE {pct(lo['mape_in_sample'], sign=False)} in sample and "
               f"{pct(lo['mape_out_of_source'], sign=False)} with every fitted constant refitted without the "
               f"held-out source, median {pct(s['median_abs_error'], sign=False)}, {s['within_15pct']}/{s['runs']} "
               f"within ±15%, Spearman tokens/s {s['spearman_tokens_per_s']:.3f}, efficiency Spearman "
               f"{s['spearman_efficiency']:.3f}; training rows {pct(sp['train']['mape'], sign=False)} / eff "
               f"{sp['train']['spearman_efficiency']:.3f}, held-out third {pct(sp['held_out']['mape'], sign=False)} / "
               f"{sp['held_out']['spearman_efficiency']:.3f}, {len(s['not_fitting'])} false OOMs (goals MAPE "
               f"{pct(g['mape'], 0, False)}, efficiency Spearman {g['spearman_efficiency']}, false OOMs "
               f"{g['false_ooms']}: {met})", (f,))


def _held_out_row(res: Results) -> Row:
    f = "published_runs_held_out_202612.jsonl"
    s = _last_summary(res.jsonl(f))
    g, nl = s["goals"], s["new_layouts"]
    met = lambda ok: "met" if ok else "not met"  # noqa: E731
    return Row("throughput on GPU clusters; held out", f"{s['runs']} published runs no constant was ever fitted on "
               "(`benchmarks/data/held_out_runs.yaml`: NeMo 24.12's FP8 pretraining table on H100, NeMo 25.02's on "
               "B200), scored with the shipped constants",
               f"MAPE {pct(s['mape'], sign=False)} (goal {pct(g['mape'], 0, False)}: {met(s['mape'] <= g['mape'])}), "
               f"median {pct(s['median_abs_error'], sign=False)}, {s['within_15pct']}/{s['runs']} within ±15%, "
               f"Spearman tokens/s {s['spearman_tokens_per_s']:.3f}, efficiency Spearman "
               f"{s['spearman_efficiency']:.3f} (goal {g['spearman_efficiency']}: "
               f"{met(s['spearman_efficiency'] >= g['spearman_efficiency'])}), {len(s['not_fitting'])} false OOMs; "
               f"the {nl['runs']} rows whose layout no fitted row has: MAPE {pct(nl['mape'], sign=False)}, efficiency "
               f"Spearman {nl['spearman_efficiency']:.3f} (the other {len(s['repeats'])} repeat a fitted row's layout "
               "from another container)", (f,))


def _time_mape_text(s: dict, lo: dict) -> str:
    """The step time's own MAPE beside the throughput's (summaries written before it was recorded have none)."""
    if s.get("time_mape_rows") is None or lo.get("time_mape_rows") is None:
        return ""
    return (f" (step time {pct(s['time_mape_rows'], sign=False)} / {pct(lo['time_mape_rows'], sign=False)}, the "
            "metric simulators publish)")


def _sweeps_row(res: Results) -> Row:
    f = "layout_sweeps_202612.jsonl"
    s = _last_summary(res.jsonl(f))
    lo = s["loso"]
    return Row("layout order on one cluster; out of source", f"{s['groups']} measured layout sweeps (BigScience BLOOM "
               "topology search on 48 A100 nodes, vTrain's Megatron-DeepSpeed GPT 3.6-175B on 64-512 A100s, Narayanan "
               "Table 2, torchtitan 405B, Megatron MoE zoo); every fitted constant refitted without the held-out source",
               f"{s['ran_rows']} layouts that ran: throughput MAPE {pct(s['mape_rows'], sign=False)} in sample and "
               f"{pct(lo['mape_rows'], sign=False)} leave-one-source-out{_time_mape_text(s, lo)}, mean within-group "
               "Spearman "
               f"{s['mean_spearman_groups_ge3']:.3f} (out of source {lo['mean_spearman_groups_ge3']:.3f}), top-1 "
               f"regret mean {pct(s['mean_top1_regret'], sign=False)} / worst {pct(s['max_top1_regret'], sign=False)}, "
               f"{s['refused']} refused, {s['false_oom']} false OOM, {s['missed_oom']} OOM layouts predicted to fit "
               f"({_cautioned(s)}); the "
               f"measured best is among the layouts `sweep` marks undecided (within "
               f"{pct(s['undecided_error'], sign=False)} of the fastest estimate) in {s['undecided_best_marked']} of "
               f"{s['undecided_groups']} groups (out of source {lo['undecided_best_marked']} of "
               f"{lo['undecided_groups']}), and measuring those leaves a regret of "
               f"{pct(s['mean_regret_after_measuring'], sign=False)} mean / "
               f"{pct(s['max_regret_after_measuring'], sign=False)} worst" + _sweep_pick_text(s.get("sweep_pick")), (f,))


def _small_models_row(res: Results) -> Row:
    # benchmarks/small_model_sweeps.py: its summary table in the markdown is the record
    f = "small_model_sweeps_202612.md"
    rows = res.match(f, r"(\d+) measured iterations in (\d+) groups")
    mape = res.match(f, r"throughput MAPE \(all rows\) \| ([\d.]+%)")
    sp = res.match(f, r"Spearman \((\d+) groups of ≥ 3\) \| ([\d.]+)")
    reg = res.match(f, r"top-1 regret \| ([\d.]+%) / ([\d.]+%)")
    marked = res.match(f, r"marked undecided \(within ([\d.]+%) of the fastest estimate; [^)]*\) \| (\d+) of (\d+)")
    after = res.match(f, r"measures the marked ones \| ([\d.]+%) / ([\d.]+%)")
    return Row("small models on one node; out of sample",
               "vTrain's single-node set: Megatron-DeepSpeed GPT 0.2-1.3B (hidden 1024/2048, 12-24 layers, sequence 1024) on "
               "2-8 A100s at every tp x pp x dp x micro batch they ran; no row enters a fitted constant",
               f"{rows[1]} runs in {rows[2]} groups: MAPE {mape[1]}, mean within-group Spearman {sp[2]} ({sp[1]} groups), "
               f"top-1 regret mean {reg[1]} / worst {reg[2]}; the measured best is among the layouts marked undecided "
               f"(within {marked[1]}) in {marked[2]} of {marked[3]} groups, and measuring those leaves a regret of "
               f"{after[1]} mean / {after[2]} worst", (f,))


def _sweep_pick_text(sp: Optional[dict]) -> str:
    """`sweep`'s own pick (benchmarks/layout_sweeps.py sweep_pick_summary), where the summary has it."""
    if not sp:
        return ""
    text = (f"; `sweep`'s own pick over the full grid: the group lies in its space in {sp['applicable']} of "
            f"{sp['groups']}, its pick was measured in {sp['measured']}")
    if sp["measured"]:
        text += (f" (regret {pct(sp['mean_regret'], sign=False)} mean / {pct(sp['max_regret'], sign=False)} "
                 "worst)")
    return text


def _megatron_parsers_row(res: Results) -> Row:
    # the benchmark writes markdown only: its summary line is the record
    parts, files = [], []
    for f in res.newest_runs("megatron_parsers_202612", 4):
        n = res.match(f, r"Generated files: (\d+) accepted, (\d+) rejected, (\d+) not generated\.")
        when = res.match(f, r"on (\d{4}-\d\d-\d\d)")
        parts.append(f"{when[1]}: {n[1]} generated files accepted, {n[2]} rejected, {n[3]} not generated")
        files.append(f)
    lm = res.match(files[0], r"megatron-lm: commit `(\w{8})")
    mds = res.match(files[0], r"megatron-deepspeed: commit `(\w{8})")
    return Row("Megatron argument files", f"the real `parse_args` + `validate_args` of Megatron-LM {lm[1]} and "
               f"Megatron-DeepSpeed {mds[1]} (+ TransformerConfig / DeepSpeed runtime preconditions)",
               "; ".join(parts) + " (each file not generated is listed with its reason)", tuple(files))


FIDELITY_ROWS: tuple[Callable[[Results], Row | list[Row]], ...] = (
    _memory_rows, _peak_memory_row, _step_time_row, _cpu_block_row, _malloc_row, _bench_train_row, _throttle_row,
    _megatron_ds_row, _megatron_two_host_row, _validate_speed_row, _published_row, _held_out_row, _sweeps_row,
    _small_models_row,
    _megatron_parsers_row)


def fidelity_table(res: Results, prefix: str) -> list[str]:
    rows: list[Row] = []
    for make in FIDELITY_ROWS:
        r = make(res)
        rows += r if isinstance(r, list) else [r]
    return render_markdown_table([(r.what, r.against, r.result, files_cell(r.files, prefix)) for r in rows],
                                 ["what", "measured against", "result (read from the file)", "file"])
