"""Cold-start speed: `dstoolkit validate` vs DeepSpeed's own `DeepSpeedConfig` on the same corpus files.

Both sides run as fresh processes (that is what CI and pre-commit pay), interleaved, REPS times each:
- ours:      python -m dstoolkit validate FILE...            (no torch / deepspeed import; the dispatcher in
             dstoolkit/cli/__init__.py builds every verb's parser, importing other verbs' modules)
- ours_verb: python -m dstoolkit.cli.validate FILE...        (the validate verb alone: what `dstoolkit validate`
             costs once the dispatcher imports only the requested verb)
- deepspeed: python -c "from deepspeed.runtime.config import DeepSpeedConfig; DeepSpeedConfig(f) for f"
- floor:     python -c "import pydantic"                      (interpreter + pydantic start)
on two file sets: every DeepSpeed-format corpus file (SOURCES.tsv has a DeepSpeed verdict), and the files
DeepSpeed 0.19.8 accepts. Reports median and min/max per side, the ratio of medians, the load average
before/after (the machine may be shared), versions and the git commit. Appends one JSON line to
benchmarks/results/validate_speed_cpu_<yyyymm>.jsonl and rewrites the .md table from all lines.

Usage: python benchmarks/validate_speed.py [--reps 5] [--corpus DIR]
"""
from __future__ import annotations

import argparse
import csv
import datetime as _dt
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = REPO / "tests" / "corpus"
RESULTS = REPO / "benchmarks" / "results"
sys.path.insert(0, str(REPO))

_DS_SNIPPET = (
    "import sys, logging\n"
    "from deepspeed.runtime.config import DeepSpeedConfig\n"
    "from deepspeed.utils import logger\n"
    "logger.setLevel(logging.ERROR)\n"
    "ok = 0\n"
    "for f in sys.argv[1:]:\n"
    "    try:\n"
    "        DeepSpeedConfig(f); ok += 1\n"
    "    except BaseException:\n"
    "        pass\n"
    "print('accepted', ok)\n"
)


def file_sets(corpus: pathlib.Path) -> dict[str, list[str]]:
    rows = list(csv.DictReader(open(corpus / "SOURCES.tsv", encoding="utf-8"), delimiter="\t"))
    ds_format = [r for r in rows if "DS 0.19.8:" in r["notes"]]
    accepted = [r for r in ds_format if r["notes"].split("DS 0.19.8: ", 1)[1].startswith("ACCEPT")]
    return {"deepspeed_format": [str(corpus / r["file"]) for r in ds_format],
            "deepspeed_accepts": [str(corpus / r["file"]) for r in accepted]}


def timed(cmd: list[str], env: dict) -> tuple[float, str]:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    return time.perf_counter() - t0, (proc.stdout + proc.stderr)[-300:]


def summarize(samples: list[float]) -> dict:
    return {"median_s": round(statistics.median(samples), 4), "min_s": round(min(samples), 4),
            "max_s": round(max(samples), 4), "samples_s": [round(s, 4) for s in samples]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--corpus", type=pathlib.Path, default=DEFAULT_CORPUS)
    ap.add_argument("--render-from", metavar="JSONL", type=pathlib.Path,
                    help="print the markdown of an existing results file and exit (nothing is run or written)")
    args = ap.parse_args(argv)
    if args.render_from:
        sys.stdout.write(render_md(args.render_from))
        return 0
    from dstoolkit.runtime.bench import harness, results_jsonl

    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONDONTWRITEBYTECODE": "0"}
    sets = file_sets(args.corpus)
    load_before = os.getloadavg()
    record: dict = {"env": harness.capture_env(1, None, {"reps": args.reps, "corpus": str(args.corpus)},
                                               packages=("pydantic",)),
                    "reps": args.reps, "sets": {}}
    # warm the file cache and .pyc files once per side (not timed): we measure process start, not disk
    timed([sys.executable, "-m", "dstoolkit", "validate", *sets["deepspeed_accepts"]], env)
    timed([sys.executable, "-c", _DS_SNIPPET, *sets["deepspeed_accepts"]], env)
    for name, files in sets.items():
        ours, verb, ds, floor = [], [], [], []
        for _ in range(args.reps):  # interleaved so load changes hit both sides alike
            t, _o = timed([sys.executable, "-m", "dstoolkit", "validate", *files], env)
            ours.append(t)
            t, _o = timed([sys.executable, "-m", "dstoolkit.cli.validate", *files], env)
            verb.append(t)
            t, out = timed([sys.executable, "-c", _DS_SNIPPET, *files], env)
            ds.append(t)
            t, _o = timed([sys.executable, "-c", "import pydantic"], env)
            floor.append(t)
        accepted = out.strip().splitlines()[-1] if out.strip() else ""
        record["sets"][name] = {"files": len(files), "deepspeed_out": accepted, "dstoolkit": summarize(ours),
                                "dstoolkit_verb_only": summarize(verb),
                                "deepspeed": summarize(ds), "python_pydantic_floor": summarize(floor),
                                "speedup_median": round(statistics.median(ds) / statistics.median(ours), 2),
                                "speedup_verb_only_median": round(statistics.median(ds) / statistics.median(verb), 2)}
    record["loadavg_before"] = [round(x, 2) for x in load_before]
    record["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"validate_speed_cpu_{_dt.date.today():%Y%m}"
    results_jsonl.append_records(stem.with_suffix(".jsonl"), [record])
    render(stem)
    print(json.dumps(record, indent=2))
    return 0


def _meta(r: dict) -> dict:
    """date, short commit, versions, Python and CPUs of one line: from its `env` (harness.capture_env), or from
    the top-level fields the lines before it carried."""
    e = r.get("env")
    if e is None:
        return {"date": r["date"], "commit": r["git_commit"], "versions": r["versions"], "python": r["python"],
                "cpus": r["cpu_count"]}
    sha = str(e.get("git_commit") or "unknown")
    return {"date": e["timestamp_utc"], "commit": sha[:7] + ("-dirty" if sha.endswith("-dirty") else ""),
            "versions": {"deepspeed": e.get("deepspeed"), "torch": e.get("torch"), **(e.get("packages") or {})},
            "python": e.get("python"), "cpus": e.get("cpu_count")}


def render_md(jsonl: pathlib.Path) -> str:
    """The markdown table of every JSON line recorded so far."""
    from dstoolkit.runtime.bench.report import render_markdown_table

    lines = ["# Cold `dstoolkit validate` vs DeepSpeed `DeepSpeedConfig` (same corpus files, fresh processes)",
             "", "Generated by `benchmarks/validate_speed.py` from the .jsonl next to this file. Median of the "
             "interleaved repetitions; [min, max] in brackets. The machine was shared when the load average is "
             "high: both sides slow down, the ratio is the number to read.", "",
             "`dstoolkit validate` = the shipped CLI (its dispatcher imports every verb module); `verb only` = "
             "`python -m dstoolkit.cli.validate`, the same check without the other verbs' imports.", ""]

    def f(d: dict) -> str:
        return f"{d['median_s']:.2f} [{d['min_s']:.2f}, {d['max_s']:.2f}]"

    rows, meta = [], {}
    for raw in open(jsonl, encoding="utf-8"):
        if not raw.strip():
            continue
        r = json.loads(raw)
        meta = _meta(r)
        # file sets in the order file_sets() makes them (append_records sorts a line's keys)
        order = ["deepspeed_format", "deepspeed_accepts"]
        for name, s in sorted(r["sets"].items(), key=lambda kv: (order.index(kv[0]) if kv[0] in order else len(order))):
            verb = f(s["dstoolkit_verb_only"]) if "dstoolkit_verb_only" in s else "-"
            rows.append([meta["date"], meta["commit"], f"{s['files']} ({name})", f(s["dstoolkit"]), verb,
                         f(s["deepspeed"]), f(s["python_pydantic_floor"]), f"**{s['speedup_median']}x**",
                         f"**{s.get('speedup_verb_only_median', '-')}x**",
                         f"{r['loadavg_before'][0]} / {r['loadavg_after'][0]}"])
    lines += render_markdown_table(rows, ("date (UTC)", "commit", "files", "dstoolkit validate s", "verb only s",
                                          "DeepSpeed s", "python+pydantic s", "speed-up (CLI)",
                                          "speed-up (verb only)", "load avg before/after"))
    lines += ["", f"Versions: {meta.get('versions')}, Python {meta.get('python')}, {meta.get('cpus')} CPUs."]
    return "\n".join(lines) + "\n"


def render(stem: pathlib.Path) -> None:
    """Rewrite the markdown table from every JSON line recorded so far."""
    from dstoolkit.runtime.bench.report import write_report

    write_report(stem.with_suffix(".md"), render_md(stem.with_suffix(".jsonl")))


if __name__ == "__main__":
    sys.exit(main())
