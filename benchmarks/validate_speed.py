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
import platform
import statistics
import subprocess
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
DEFAULT_CORPUS = REPO / "tests" / "corpus"
RESULTS = REPO / "benchmarks" / "results"

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


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=REPO).stdout.strip()
    except OSError:
        return "unknown"


def _versions() -> dict:
    code = ("import importlib.metadata as m\n"
            "print({p: m.version(p) for p in ('deepspeed', 'torch', 'pydantic')})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    return eval(out) if out.startswith("{") else {}  # noqa: S307 - our own child's repr of a str dict


def summarize(samples: list[float]) -> dict:
    return {"median_s": round(statistics.median(samples), 4), "min_s": round(min(samples), 4),
            "max_s": round(max(samples), 4), "samples_s": [round(s, 4) for s in samples]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--corpus", type=pathlib.Path, default=DEFAULT_CORPUS)
    args = ap.parse_args(argv)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "DS_ACCELERATOR": "cpu", "PYTHONDONTWRITEBYTECODE": "0"}
    sets = file_sets(args.corpus)
    load_before = os.getloadavg()
    record: dict = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                    "git_commit": _git_commit(), "python": platform.python_version(), "cpu_count": os.cpu_count(),
                    "machine": platform.machine(), "versions": _versions(), "reps": args.reps, "sets": {}}
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
    with open(stem.with_suffix(".jsonl"), "a", encoding="utf-8") as fh:
        fh.write(json.dumps(record) + "\n")
    render(stem)
    print(json.dumps(record, indent=2))
    return 0


def render(stem: pathlib.Path) -> None:
    """Rewrite the markdown table from every JSON line recorded so far."""
    lines = ["# Cold `dstoolkit validate` vs DeepSpeed `DeepSpeedConfig` (same corpus files, fresh processes)",
             "", "Generated by `benchmarks/validate_speed.py` from the .jsonl next to this file. Median of the "
             "interleaved repetitions; [min, max] in brackets. The machine was shared when the load average is "
             "high: both sides slow down, the ratio is the number to read.", "",
             "`dstoolkit validate` = the shipped CLI (its dispatcher imports every verb module); `verb only` = "
             "`python -m dstoolkit.cli.validate`, the same check without the other verbs' imports.", "",
             "| date (UTC) | commit | files | dstoolkit validate s | verb only s | DeepSpeed s | python+pydantic s | "
             "speed-up (CLI) | speed-up (verb only) | load avg before/after |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for raw in open(stem.with_suffix(".jsonl"), encoding="utf-8"):
        r = json.loads(raw)
        for name, s in r["sets"].items():
            f = lambda d: f"{d['median_s']:.2f} [{d['min_s']:.2f}, {d['max_s']:.2f}]"  # noqa: E731
            verb = f(s["dstoolkit_verb_only"]) if "dstoolkit_verb_only" in s else "-"
            lines.append(f"| {r['date']} | {r['git_commit']} | {s['files']} ({name}) | {f(s['dstoolkit'])} | "
                         f"{verb} | {f(s['deepspeed'])} | {f(s['python_pydantic_floor'])} | "
                         f"**{s['speedup_median']}x** | **{s.get('speedup_verb_only_median', '-')}x** | "
                         f"{r['loadavg_before'][0]} / {r['loadavg_after'][0]} |")
    lines += ["", f"Versions: {json.loads(raw)['versions']}, Python {json.loads(raw)['python']}, "
              f"{json.loads(raw)['cpu_count']} CPUs."]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
