"""Where the commands get their plan: a plan file (``load_plan_file``), or one assembled from
the file, configs people already have (Hugging Face ``config.json``, DeepSpeed
``ds_config.json``, Megatron arguments, torchtitan TOML, through ``schedules.importers``; named
by flags or by the plan's ``import:`` section, paths relative to the plan) and cluster flags
(``--cluster dgx-h100:8``), merged in that order, later winning.

Every key an importer does not carry over is one line passed to ``warn``; ``--export-plan``
writes the plan as understood, for the user to read and edit.

    plan = assemble_plan(args, warn=print)  # args of commsim plan
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fileio.strict import load_yaml, read_input

if TYPE_CHECKING:
    from schedules.plan import Plan

IMPORT_FLAGS = ("model", "deepspeed", "megatron", "torchtitan")
"""Flags that read another project's config (``--model`` also takes a preset name)."""


def add_import_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that build or complete a plan from other configs and cluster options."""
    group = parser.add_argument_group("plan from other configs (merged over PLAN.yaml)")
    group.add_argument("--model", metavar="PRESET|config.json", help="model preset or HF config")
    group.add_argument("--deepspeed", type=Path, metavar="ds_config.json", help="DeepSpeed config")
    group.add_argument("--megatron", type=Path, metavar="ARGS", help="Megatron-LM arguments/script")
    group.add_argument("--torchtitan", type=Path, metavar="JOB.toml", help="torchtitan job config")
    group.add_argument("--cluster", metavar="NODE[:N]", help="node preset, e.g. dgx-h100:8")
    group.add_argument("--nodes", type=int, help="number of nodes")
    group.add_argument("--fabric", help="inter-node fabric preset, e.g. ib-ndr")
    group.add_argument("--export-plan", type=Path, metavar="OUT.yaml", help="write the plan used")


def wants_assembly(args: argparse.Namespace) -> bool:
    """Whether the plan comes (partly) from flags or an ``import:`` section, not the file alone."""
    names = (*IMPORT_FLAGS, "cluster", "nodes", "fabric", "export_plan")
    if any(getattr(args, n, None) is not None for n in names):
        return True
    if args.plan is None or not args.plan.is_file():
        return False
    try:
        raw = load_yaml(read_input(args.plan, what="plan"), name=str(args.plan))
    except (ValueError, yaml.YAMLError):
        return False  # the plan loader reports it
    return isinstance(raw, dict) and "import" in raw


def load_plan_file(path: Path) -> Plan:
    """``schedules.plan.load_plan`` on a file, with YAML syntax errors turned into one line."""
    from schedules.plan import load_plan

    if not path.is_file():
        raise FileNotFoundError(f"plan file not found: {path}")
    try:
        return load_plan(path)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: malformed YAML: {yaml_error_line(exc)}") from exc


def yaml_error_line(exc: yaml.YAMLError) -> str:
    """One line naming the problem and where it is (line and column, 1-based)."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


def assemble_plan(args: argparse.Namespace, *, warn: Callable[[str], None]) -> Any:
    """The plan of the file and flags; each importer warning goes to ``warn`` before the plan
    is checked."""
    from schedules.importers import (
        from_deepspeed_config,
        from_megatron_args,
        from_torchtitan_toml,
        merge_sections,
        model_from_hf_config,
    )
    from schedules.plan import load_plan

    base, base_dir = _base(args.plan)
    sources = _referenced(base.pop("import", None), base_dir)
    sources.update({k: getattr(args, k) for k in IMPORT_FLAGS if getattr(args, k, None)})
    base = _cluster_flags(base, args)
    imported = []
    model = sources.get("model")
    if model is not None:
        if Path(model).suffix == ".json":
            imported.append(model_from_hf_config(_existing(Path(model), "model")))
        else:
            base = {**base, "model": str(model)}
    if sources.get("megatron") is not None:
        imported.append(from_megatron_args(_existing(Path(sources["megatron"]), "megatron")))
    if sources.get("torchtitan") is not None:
        imported.append(from_torchtitan_toml(_existing(Path(sources["torchtitan"]), "torchtitan")))
    if sources.get("deepspeed") is not None:
        world = _world_size(base)
        ds_config = _existing(Path(sources["deepspeed"]), "deepspeed")
        imported.append(from_deepspeed_config(ds_config, world_size=world))
    raw, warnings = merge_sections(base, *imported)
    for line in warnings:
        warn(line)
    if base_dir:
        cluster = raw.get("cluster")
        if isinstance(cluster, dict) and isinstance(cluster.get("file"), str):
            cluster["file"] = str(Path(base_dir) / cluster["file"])
    return load_plan(raw)


def imported_files(args: argparse.Namespace) -> list[Path]:
    """Every config file the plan will read (flags and the plan's ``import:`` section): inputs
    that no output may replace."""
    sources: dict[str, Any] = {}
    if args.plan is not None and args.plan.is_file():
        try:
            raw = load_yaml(read_input(args.plan, what="plan"), name=str(args.plan))
            if isinstance(raw, dict):
                sources = _referenced(raw.get("import"), str(args.plan.resolve().parent))
        except (ValueError, yaml.YAMLError):
            sources = {}  # reported when the plan is read
    sources.update({k: getattr(args, k) for k in IMPORT_FLAGS if getattr(args, k, None)})
    files = [Path(v) for k, v in sources.items() if k != "model" or str(v).endswith(".json")]
    return files


def export_plan_bytes(plan: Any) -> bytes:
    """The plan as a YAML file ``commsim plan`` reads back to the same plan."""
    from schedules.plan import plan_to_dict

    document = plan_to_dict(plan)
    header = "# the plan commsim understood (edit and pass it back to commsim plan)\n"
    return (header + yaml.safe_dump(document, sort_keys=False)).encode()


def _base(path: Path | None) -> tuple[dict[str, Any], str]:
    if path is None:
        return {}, ""
    text = read_input(_existing(path, "plan"), what="plan")
    raw = load_yaml(text, name=str(path))
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: a plan must be a mapping with sections model, cluster, ...")
    return raw, str(path.resolve().parent)


def _referenced(section: Any, base_dir: str) -> dict[str, Any]:
    """The plan file's ``import:`` section: other configs to read, paths relative to the plan."""
    if section is None:
        return {}
    if not isinstance(section, dict) or set(section) - set(IMPORT_FLAGS):
        keys = sorted(set(section) - set(IMPORT_FLAGS)) if isinstance(section, dict) else section
        raise ValueError(
            f"plan key 'import' must map {', '.join(IMPORT_FLAGS)} to files, got {str(keys)[:80]}"
        )
    out = {}
    for key, value in section.items():
        if not isinstance(value, str):
            raise ValueError(f"import.{key} must be a file name, got {str(value)[:80]}")
        is_preset = key == "model" and not value.endswith(".json")
        out[key] = value if is_preset else str(Path(base_dir) / value)
    return out


def _cluster_flags(base: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    node, nodes = args.cluster, args.nodes
    if isinstance(node, str) and ":" in node:  # NODE:N, as in dgx-h100:8
        node, count = node.split(":", 1)
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"--cluster {args.cluster}: expected NODE or NODE:N with N >= 1")
        nodes = int(count) if nodes is None else nodes
    flags = {"node": node, "num_nodes": nodes, "fabric": args.fabric}
    given = {k: v for k, v in flags.items() if v is not None}
    if not given:
        return base
    cluster = dict(base.get("cluster") or {})
    if "node" in given:
        cluster.pop("file", None)
    return {**base, "cluster": {**cluster, **given}}


def _world_size(base: dict[str, Any]) -> int | None:
    """GPUs of the cluster given so far (DeepSpeed's batch arithmetic needs it), if known."""
    from topologies.config import load_cluster

    cluster = base.get("cluster")
    if not isinstance(cluster, dict) or "node" not in cluster:
        return None
    return load_cluster(cluster).num_gpus


def _existing(path: Path, flag: str) -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"{flag} {path}: file not found")
    return path
