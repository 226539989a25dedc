"""`dstoolkit validate` on a folder `dstoolkit generate` wrote: each file checked as what it is, at the layout it was
generated for. No torch import, no spec import (validate sits below spec): the layout comes from the folder.

A generated folder has `MARKER_FILE` at its top and, in each strategy folder, `LAYOUT_FILE`: the world size, GPUs
per node and, per config file, the tp / pp / ep it was generated for (and the MoE expert count when the experts are
DeepSpeed's own). Files by name:

- ``ds_config.json``: DeepSpeed JSON, strict mode (no "auto");
- ``ds_config_hf.json``: HF Trainer / Accelerate JSON, hf mode ("auto" where HF fills it);
- ``accelerate_config.yaml``: accelerate's config (`check_accelerate_yaml`);
- everything else (spec.yaml, model_config.json, training_args.json, launch scripts, argument files) is not a
  DeepSpeed config and is not checked as one.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Optional

import yaml

from dstoolkit.validate.findings import Finding

MARKER_FILE = ".dstoolkit-generated"
"""Written at the top of every generated folder (dstoolkit.generate.writer)."""
LAYOUT_FILE = "layout.json"
"""Per strategy folder: the layout each config file was generated for (dstoolkit.generate.core writes it)."""
DEEPSPEED_JSON = "ds_config.json"
HF_JSON = "ds_config_hf.json"
ACCELERATE_YAML = "accelerate_config.yaml"
CONFIG_KINDS = {DEEPSPEED_JSON: "strict", HF_JSON: "hf", ACCELERATE_YAML: "accelerate"}
"""File name -> how validate checks it inside a generated folder."""


@dataclass(frozen=True)
class FileLayout:
    """The layout one config file of a strategy folder was generated for."""

    world_size: int
    gpus_per_node: int
    nodes: int
    tp: int = 1
    pp: int = 1
    ep: int = 1
    num_experts: Optional[int] = None
    """MoE experts when they are DeepSpeed's own (the MoE rules apply); None for HF models' plain modules."""


@dataclass
class FolderCheck:
    """What validating a generated folder found: findings, the files checked (and how), the files left alone."""

    findings: list = field(default_factory=list)
    checked: dict = field(default_factory=dict)
    """path -> kind (strict, hf, accelerate)."""
    not_configs: list = field(default_factory=list)


def generated_root(path: str) -> Optional[str]:
    """The generated folder `path` is in (it, or a parent, holds MARKER_FILE), else None."""
    p = os.path.abspath(path)
    if not os.path.isdir(p):
        p = os.path.dirname(p)
    for _ in range(3):  # the top folder, a strategy folder, a file's folder
        if os.path.isfile(os.path.join(p, MARKER_FILE)):
            return p
        parent = os.path.dirname(p)
        if parent == p:
            break
        p = parent
    return None


def layout_fix(root: str) -> str:
    """What to do about a damaged LAYOUT_FILE in the generated folder `root` (without it, the configs are checked at
    the layout the command line's flags give: `validate_generated`)."""
    return (f"regenerate the folder (dstoolkit generate SPEC --out {root} --force), or remove {LAYOUT_FILE} and give "
            "the layout with --world-size / --gpus-per-node / --tp / --pp")


class LayoutFileError(ValueError):
    """LAYOUT_FILE is not what `dstoolkit generate` writes: `problem` says which key is missing or wrong."""

    def __init__(self, path: str, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


_LAYOUT_TOP = ("world_size", "gpus_per_node", "nodes")
_LAYOUT_PER_FILE = ("tp", "pp", "ep")


def _kind(value) -> str:
    """A JSON value's kind, for a message: 'a string', 'a list', 'null', ..."""
    if value is None:
        return "null"
    return {bool: "a boolean", int: "an integer", float: "a number", str: "a string", list: "a list",
            dict: "an object"}.get(type(value), type(value).__name__)


def _positive_int(value, where: str) -> int:
    """`value` as a positive int (an integral float counts); LayoutFileError's problem text otherwise."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{where} is {json.dumps(value)} ({_kind(value)}), not a positive integer")
    if value < 1:
        raise ValueError(f"{where} is {value}, not a positive integer")
    return value


def _parse_layout(doc) -> dict[str, FileLayout]:
    """file name -> FileLayout from the parsed LAYOUT_FILE; ValueError naming the key that is missing or wrong."""
    if not isinstance(doc, dict):
        raise ValueError(f"the file holds {_kind(doc)}, not a JSON object with world_size, gpus_per_node, nodes "
                         "and files")
    missing = [k for k in (*_LAYOUT_TOP, "files") if k not in doc]
    if missing:
        raise ValueError(f"missing key{'s' if len(missing) > 1 else ''} {', '.join(missing)} (a layout file has "
                         f"{', '.join(_LAYOUT_TOP)} and files)")
    top = {k: _positive_int(doc[k], k) for k in _LAYOUT_TOP}
    files = doc["files"]
    if not isinstance(files, dict):
        raise ValueError(f"files is {_kind(files)}, not an object of file name -> layout")
    out: dict[str, FileLayout] = {}
    for name, per in files.items():
        if not isinstance(per, dict):
            raise ValueError(f"files.{name} is {_kind(per)}, not an object with tp, pp, ep")
        dims = {k: _positive_int(per[k], f"files.{name}.{k}") for k in _LAYOUT_PER_FILE if k in per}
        experts = per.get("num_experts")
        if experts is not None:
            dims["num_experts"] = _positive_int(experts, f"files.{name}.num_experts")
        out[name] = FileLayout(**top, **dims)
    return out


def read_layouts(strategy_dir: str) -> dict[str, FileLayout]:
    """file name -> FileLayout from the strategy folder's LAYOUT_FILE ({} when it has none).

    Raises:
        LayoutFileError: LAYOUT_FILE cannot be read, is not JSON, or is not the document `dstoolkit generate`
            writes (its message names the missing key or the wrong value).
    """
    path = os.path.join(strategy_dir, LAYOUT_FILE)
    if not os.path.isfile(path):
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise LayoutFileError(path, f"cannot be read ({getattr(exc, 'strerror', None) or exc})") from None
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise LayoutFileError(path, f"is not valid JSON ({exc})") from None
    try:
        return _parse_layout(doc)
    except ValueError as exc:
        raise LayoutFileError(path, f"not the layout file dstoolkit generate writes: {exc}") from None


def config_layout(config_path: str) -> Optional[FileLayout]:
    """The layout the config at `config_path` was generated for: its entry in the LAYOUT_FILE beside it, or None
    (no such file or entry, or a file that cannot be read: `dstoolkit validate` on the folder names that)."""
    try:
        return read_layouts(os.path.dirname(os.path.abspath(config_path))).get(os.path.basename(config_path))
    except LayoutFileError:
        return None


def check_accelerate_yaml(text: str, path: str, layout: Optional[FileLayout], folder: str) -> list[Finding]:
    """accelerate's config: YAML mapping, DEEPSPEED with a config file that exists, machines and processes equal
    to the layout's, and on several machines a launcher that forms one job (``deepspeed_multinode_launcher``:
    without it accelerate 1.x hands DeepSpeed ``--hostfile None`` and every node trains alone)."""

    out: list[Finding] = []

    def add(code: str, pointer: str, message: str, suggestion: Optional[str] = None) -> None:
        out.append(Finding(file=path, pointer=pointer, severity="error", code=code, message=message,
                           suggestion=suggestion))

    try:
        cfg = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        add("DS001", "", f"invalid YAML: {' '.join(str(exc).split())}")
        return out
    if not isinstance(cfg, dict):
        add("DS007", "", "accelerate config must be a YAML mapping")
        return out
    if cfg.get("distributed_type") != "DEEPSPEED":
        add("DS120", "/distributed_type", f"distributed_type is {cfg.get('distributed_type')!r}, not DEEPSPEED",
            "set distributed_type: DEEPSPEED")
    ds = cfg.get("deepspeed_config") if isinstance(cfg.get("deepspeed_config"), dict) else {}
    ds_file = ds.get("deepspeed_config_file")
    if not ds_file:
        add("DS108", "/deepspeed_config/deepspeed_config_file", "no deepspeed_config_file",
            "point deepspeed_config_file at ds_config_hf.json")
    elif not os.path.isabs(str(ds_file)) and not os.path.isfile(os.path.join(folder, str(ds_file))):
        add("DS108", "/deepspeed_config/deepspeed_config_file", f"{ds_file} does not exist next to {path}")
    if layout is not None:
        for key, want in (("num_machines", layout.nodes), ("num_processes", layout.world_size)):
            if cfg.get(key) != want:
                add("DS120", f"/{key}", f"{key} is {cfg.get(key)!r}, the folder was generated for {want}",
                    f"set {key}: {want}")
    machines = cfg.get("num_machines")
    if isinstance(machines, int) and machines > 1 and not ds.get("deepspeed_multinode_launcher"):
        add("DS121", "/deepspeed_config/deepspeed_multinode_launcher",
            f"num_machines {machines} without deepspeed_multinode_launcher: accelerate hands DeepSpeed's launcher "
            "--hostfile None and each node trains alone",
            "set deepspeed_multinode_launcher: standard (torchrun on every node, machine rank from the command line)")
    return out


def validate_generated(files: list[str], validate_config, *, deepspeed_version=None, read_text=None,
                       flags: Optional[dict] = None) -> FolderCheck:
    """Check the files of generated folders as what they are (see the module docstring).

    Args:
        files: Paths inside generated folders (a directory walk's output, any file names).
        validate_config: `dstoolkit.validate.engine.validate_config` (passed in: this module imports no engine).
        deepspeed_version: As `validate --deepspeed-version`.
        read_text: path -> (text, problem Finding or None); default reads UTF-8.
        flags: the command line's layout (world_size, gpus_per_node, tp, pp, num_experts, ep_size) for a config
            LAYOUT_FILE does not list (a folder written before it, or with the file removed): it is checked at
            that layout instead of none (the CLI refuses a flag that contradicts LAYOUT_FILE).
    """
    res = FolderCheck()
    for path in files:
        name = os.path.basename(path)
        kind = CONFIG_KINDS.get(name)
        if kind is None:
            res.not_configs.append(path)
            continue
        folder = os.path.dirname(os.path.abspath(path))
        try:
            layout = read_layouts(folder).get(name)
        except LayoutFileError as exc:
            res.findings.append(Finding(file=path, pointer="", severity="error", code="DS008", message=str(exc),
                                        suggestion=layout_fix(generated_root(path) or folder)))
            continue
        text, problem = read_text(path) if read_text else (open(path, encoding="utf-8").read(), None)
        if problem is not None:
            res.findings.append(problem)
            continue
        res.checked[path] = kind
        if kind == "accelerate":
            res.findings += check_accelerate_yaml(text, path, layout, folder)
            continue
        ctx = dict(flags or {}) if layout is None else {
            "world_size": layout.world_size, "gpus_per_node": layout.gpus_per_node, "tp": layout.tp,
            "pp": layout.pp, "num_experts": layout.num_experts,
            "ep_size": layout.ep if layout.num_experts else None}
        if kind == "hf" and layout is not None:
            ctx["tp"] = 1  # HF's TP is AutoTP, written in the JSON itself (tensor_parallel.autotp_size), not Megatron's
        res.findings += validate_config(text, source=path, mode=kind, deepspeed_version=deepspeed_version, **ctx)
    return res
