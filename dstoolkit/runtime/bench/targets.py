"""Turn bench targets (DeepSpeed JSON configs, spec YAMLs, `dstoolkit generate` output folders) into runnable configs.

Shared by the overlap and train benches. A spec is expanded by running `dstoolkit generate` in a
subprocess (the bench package must not import the CLI); every config is validated before anything
is launched, and a config that fails validation is a `BenchInputError` (exit 2).
"""
from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import subprocess
import sys
import tempfile
from typing import Any, Optional

from dstoolkit.common.paths import input_file_problem
from dstoolkit.layout import LayoutError, resolve_batch
from dstoolkit.runtime.bench.harness import BenchInputError

#: Folder names `dstoolkit generate` writes per strategy contain this file.
DS_CONFIG_FILE = "ds_config.json"


@dataclasses.dataclass
class BenchTarget:
    """One DeepSpeed config to bench, with the model and spec it belongs to."""

    name: str
    """Display name: the strategy folder or the JSON file stem."""
    ds_config: dict
    ds_config_path: Optional[pathlib.Path]
    spec_path: Optional[pathlib.Path]
    """Spec YAML (model, seq_len, cluster) the config was generated from, if known."""
    ep_size: int = 1
    """Expert-parallel degree (from launch.sh / the spec / the config's name)."""
    strategy: str = ""
    """Strategy folder name (zero2, zero1-ep, ...) or the JSON file stem; `name` may add the spec's name."""
    shrunk_changes: dict = dataclasses.field(default_factory=dict)
    """With --shrink: what `fit_batch` changed in the config ({key: [old, new]}) and the strategy's ep (run as 1)."""


def validate_ds_config(ds: dict, name: str, world_size: int, source: Optional[str] = None, ep_size: int = 1) -> None:
    """Refuse a config that `dstoolkit validate` rejects (errors only; warnings pass).

    Falls back to DeepSpeed's own `DeepSpeedConfig` when the schema validator is unavailable.
    """
    try:
        from dstoolkit.validate.engine import validate_config  # type: ignore
    except ImportError:  # TODO(#5): the schemas helper's validator; DeepSpeed's own check until it lands
        validate_config = None
    if validate_config is not None:
        from dstoolkit.dsconfig.auto import find_auto

        # a config with HF "auto" values (what an HF Trainer / Accelerate user has) is checked the way HF runs it
        mode = "hf" if find_auto(ds) else "strict"
        kwargs: dict[str, Any] = {"source": source or name, "world_size": world_size, "mode": mode}
        if ep_size > 1:
            kwargs["ep_size"] = ep_size
        try:
            findings = validate_config(ds, **kwargs)
        except TypeError:
            findings = validate_config(ds)
        errors = [f for f in findings if str(getattr(f, "severity", "")).lower().endswith("error")]
        if errors:
            first = errors[0]
            where = getattr(first, "pointer", None) or getattr(first, "path", "")
            raise BenchInputError(
                f"config {name!r} fails validation ({len(errors)} error(s)); first: {where} {getattr(first, 'message', first)}"
                f" -- fix it (see `dstoolkit validate {'--mode hf ' if mode == 'hf' else ''}{source or name}`) before "
                "benchmarking")
        return
    _deepspeed_accepts(ds, name, world_size)


def _deepspeed_accepts(ds: dict, name: str, world_size: int) -> None:
    """Minimal checks mirroring DeepSpeedConfig's batch assertion, without starting DeepSpeed."""
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        v = ds.get(key)
        if v is not None and (not isinstance(v, int) or v <= 0):
            raise BenchInputError(f"config {name!r}: {key}={v!r} must be a positive integer (resolve 'auto' first)")
    stage = (ds.get("zero_optimization") or {}).get("stage", 0)
    if stage not in (0, 1, 2, 3):
        raise BenchInputError(f"config {name!r}: zero_optimization.stage={stage!r} must be 0, 1, 2 or 3")
    try:  # DeepSpeed's batch rule, from the layout core (the bench runs pure data parallelism: dp = world)
        resolve_batch(ds.get("train_batch_size"), ds.get("train_micro_batch_size_per_gpu"),
                      ds.get("gradient_accumulation_steps"), world_size)
    except LayoutError as exc:
        raise BenchInputError(f"config {name!r}: {exc.message} at world size {world_size}; {exc.fix}") from None


def _ep_from_launch(folder: pathlib.Path) -> Optional[int]:
    """The --ep-size a generated launch.sh passes to the trainer, if any."""
    launch = folder / "launch.sh"
    if not launch.is_file():
        return None
    m = re.search(r"--ep[-_]size[=\s]+[\"']?(\d+)", launch.read_text(errors="replace"))
    return int(m.group(1)) if m else None


def _find_spec_near(folder: pathlib.Path) -> Optional[pathlib.Path]:
    """A spec YAML referenced by, or lying next to, a generated strategy folder."""
    for cand in (folder / "spec.yaml", folder.parent / "spec.yaml"):
        if cand.is_file():
            return cand
    launch = folder / "launch.sh"
    if launch.is_file():
        text = launch.read_text(errors="replace")
        if "--spec" in text:
            tok = text.split("--spec", 1)[1].strip().lstrip("=").split()[0].strip("'\"")
            p = pathlib.Path(tok)
            for base in (pathlib.Path.cwd(), folder, folder.parent):
                q = p if p.is_absolute() else base / p
                if q.is_file():
                    return q.resolve()
    return None


def load_json_config(path: pathlib.Path) -> dict:
    """Read a DeepSpeed JSON (or hjson) config; unreadable input is a BenchInputError."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise BenchInputError(f"config {str(path)!r}: cannot read ({exc.strerror}); pass an existing DeepSpeed JSON") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise BenchInputError(f"config {str(path)!r}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None


def generate_from_spec(spec_path: pathlib.Path, out_dir: pathlib.Path, strategies: Optional[list[str]] = None) -> None:
    """Run `dstoolkit generate SPEC --out DIR [--strategy ...]` in a subprocess."""
    cmd = [sys.executable, "-m", "dstoolkit", "generate", str(spec_path), "--out", str(out_dir), "--force"]
    for s in strategies or []:
        cmd += ["--strategy", s]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        msg = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["(no output)"]
        raise BenchInputError(f"spec {str(spec_path)!r}: `dstoolkit generate` failed (exit {proc.returncode}): {msg[0]}")


def targets_from_folder(folder: pathlib.Path, spec_path: Optional[pathlib.Path], prefix: str = "") -> list[BenchTarget]:
    """Every strategy folder (holding ds_config.json) under a `dstoolkit generate` output folder, or the folder
    itself when it is one. Paths are absolute (the ranks run in their own working folder)."""
    folder = folder.resolve()
    found = sorted(p.parent for p in folder.glob(f"*/{DS_CONFIG_FILE}"))
    if (folder / DS_CONFIG_FILE).is_file():
        found.insert(0, folder)
    out = []
    for sub in found:
        ds = load_json_config(sub / DS_CONFIG_FILE)
        name = sub.name
        ep = _ep_from_launch(sub) or (2 if name.endswith("-ep") or "-ep" in name else 1)
        out.append(BenchTarget(name=f"{prefix}{name}", ds_config=ds, ds_config_path=sub / DS_CONFIG_FILE,
                               spec_path=spec_path or _find_spec_near(sub), ep_size=ep, strategy=name))
    return out


def resolve_targets(items: list[str], spec: Optional[str], strategies: Optional[list[str]], work_dir: pathlib.Path,
                    world_size: int, shrink: Any = None) -> list[BenchTarget]:
    """Expand CLI targets into validated `BenchTarget`s.

    Args:
        items: DeepSpeed JSON files, spec YAMLs or generate output folders.
        spec: spec YAML for JSON configs (model, seq_len), if given.
        strategies: only these strategy names (for specs and folders).
        work_dir: where generated configs are written.
        world_size: ranks the configs will run on (for batch validation).
        shrink: `dstoolkit.runtime.shrink_sizes.ShrinkSizes` of a shrunk run: each config's batch is fitted to
            `world_size` ranks at the shrink's micro-batch / accumulation caps (`fit_batch`), and expert
            parallelism runs as 1 (the transformers experts are plain modules), before validation.
    """
    spec_path = pathlib.Path(spec).resolve() if spec else None
    problem = input_file_problem(spec_path) if spec_path is not None else None
    if problem:
        raise BenchInputError(f"--spec {spec!r}: {problem}")
    targets: list[BenchTarget] = []
    # With several specs/folders, strategy names repeat (zero2 of each): prefix them with their source.
    multi = len(items) > 1
    for item in items:
        p = pathlib.Path(item)
        if not p.exists():
            raise BenchInputError(f"target {item!r}: no such file or folder; pass a DeepSpeed JSON, a spec YAML or a generate output folder")
        if p.is_dir():
            # a strategy folder itself (holding ds_config.json) is named after its generate folder: spec/strategy
            source = p.resolve().parent.name if (p / DS_CONFIG_FILE).is_file() else p.resolve().name
            targets += targets_from_folder(p, spec_path, f"{source}/" if multi else "")
        elif p.suffix.lower() in (".yaml", ".yml"):
            gen = work_dir / f"generated-{p.stem}"
            generate_from_spec(p.resolve(), gen)  # every strategy; --strategy filters below (names may be spec/strategy)
            targets += targets_from_folder(gen, p.resolve(), f"{p.stem}/" if multi else "")
        else:
            targets.append(BenchTarget(name=p.stem, ds_config=load_json_config(p), ds_config_path=p.resolve(),
                                       spec_path=spec_path, ep_size=1, strategy=p.stem))
    if strategies:
        picked = [t for t in targets if t.strategy in strategies or t.name in strategies]
        if not picked:
            known = ", ".join(dict.fromkeys(t.name for t in targets))  # the full list, before the filter
            raise BenchInputError(f"--strategy {', '.join(strategies)}: no such strategy among the targets (known: {known})")
        targets = picked
    if not targets:
        raise BenchInputError("no DeepSpeed configs found in the targets")
    if shrink is not None:
        from dstoolkit.runtime.shrink_run import fit_batch

        for t in targets:
            t.ds_config, changed = fit_batch(t.ds_config, world_size, shrink)
            t.shrunk_changes = {k: list(v) for k, v in changed.items()}
            if t.ep_size > 1:
                t.shrunk_changes["ep_size"] = [t.ep_size, 1]
                t.ep_size = 1
    for t in targets:
        validate_ds_config(t.ds_config, t.name, world_size,
                           source=str(t.ds_config_path) if t.ds_config_path else None, ep_size=t.ep_size)
    return targets


def shape_for(target: BenchTarget, model: Optional[str]) -> tuple[Any, Optional[Any]]:
    """(ModelShape, Spec or None) for a target: from its spec, else from --model (preset or HF config.json)."""
    from dstoolkit.models import get_preset, load_hf_config

    if target.spec_path is not None:
        from dstoolkit.models import resolve_model
        from dstoolkit.spec import load_spec

        try:
            spec = load_spec(target.spec_path)
        except Exception as exc:  # SpecError carries the YAML line
            raise BenchInputError(f"spec {str(target.spec_path)!r}: {exc}") from None
        return resolve_model(spec.model, target.spec_path.parent), spec
    name = model or "tiny"
    try:
        if name.endswith(".json"):
            return load_hf_config(name), None
        return get_preset(name), None
    except Exception as exc:
        raise BenchInputError(f"--model {name!r}: {exc}") from None


def temp_work_dir() -> tempfile.TemporaryDirectory:
    """A scratch folder for generated configs and metrics (removed afterwards)."""
    return tempfile.TemporaryDirectory(prefix="dstoolkit-bench-")


def env_for_ranks() -> dict[str, str]:
    """Environment for launched ranks: `dstoolkit.common.cpu_env.cpu_rank_env` (one thread per rank, which the
    deepspeed launcher does not set; glibc malloc reusing memory)."""
    from dstoolkit.common.cpu_env import cpu_rank_env

    return cpu_rank_env()
