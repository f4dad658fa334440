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

from fileio.strict import (
    MAX_CONFIG_BYTES,
    did_you_mean,
    load_yaml,
    read_input,
    require_file,
    shorten,
)

if TYPE_CHECKING:
    from schedules.plan import Plan

IMPORT_FLAGS = ("model", "deepspeed", "megatron", "torchtitan")
"""Flags that read another project's config (``--model`` also takes a preset name)."""


def add_import_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags that build or complete a plan from other configs and cluster options."""
    group = parser.add_argument_group("plan from other configs (merged over PLAN.yaml)")
    group.add_argument("--model", metavar="PRESET|config.json", help="model preset or HF config")
    group.add_argument("--deepspeed", type=Path, metavar="ds_config.json", help="DeepSpeed config")
    group.add_argument(
        "--megatron", type=Path, metavar="ARGS.txt|launch.sh",
        help="a file of Megatron-LM arguments (--flag value ...) or its launch script",
    )  # fmt: skip
    group.add_argument("--torchtitan", type=Path, metavar="JOB.toml", help="torchtitan job config")
    group.add_argument("--cluster", metavar="NODE[:N]", help="node preset, e.g. dgx-h100:8")
    group.add_argument("--nodes", type=int, help="number of nodes")
    group.add_argument("--fabric", help="inter-node fabric preset, e.g. ib-ndr")
    group.add_argument("--export-plan", type=Path, metavar="OUT.yaml", help="write the plan used")
    batch = parser.add_argument_group("training batch (over the plan and the imports)")
    batch.add_argument("--global-batch", type=int, metavar="B", help="training.global_batch_size")
    batch.add_argument("--micro-batch", type=int, metavar="b", help="training.micro_batch_size")
    batch.add_argument("--seq-len", type=int, metavar="S", help="model.seq_len")
    add_set_argument(parser)


def add_set_argument(parser: argparse.ArgumentParser) -> None:
    """``--set SECTION.KEY=VALUE`` (repeatable): a plan key over everything else."""
    parser.add_argument(
        "--set",
        action="append",
        default=None,
        metavar="SECTION.KEY=VALUE",
        help="set a plan key, e.g. --set parallel.tp=4 (repeatable; values are YAML scalars)",
    )


def parse_sets(sets: list[str] | None) -> dict[str, Any]:
    """``--set`` arguments as plan sections: ``parallel.tp=4`` is ``{"parallel": {"tp": 4}}``,
    the value read as a YAML scalar (``4``, ``true``, ``null``, ``fp8``, ``[4, 4]``); ``name=x``
    and ``description=x`` set the plan's top-level strings. Unknown sections and keys are
    ValueErrors with the nearest valid name."""
    from schedules.plan import plan_key_names

    out: dict[str, Any] = {}
    keys = plan_key_names()
    for item in sets or ():
        target, sep, text = item.partition("=")
        target = target.strip()
        if not sep or not target:
            raise ValueError(
                f"--set {shorten(item)}: expected SECTION.KEY=VALUE, e.g. parallel.tp=4"
            )
        if target not in keys:
            section = target.rpartition(".")[0]
            near = [k for k in keys if k.startswith(f"{section}.")] if section else []
            raise ValueError(
                f"--set {shorten(target)}: not a plan key{did_you_mean(target, near or keys)}"
            )
        try:
            value = load_yaml(text, name=f"--set {target}") if text.strip() else ""
        except yaml.YAMLError as exc:
            raise ValueError(f"--set {target}: {yaml_error_line(exc)}") from None
        if isinstance(value, dict):
            raise ValueError(f"--set {target}: expected a scalar or a list, got {shorten(text)}")
        section, _, key = target.rpartition(".")
        if section:
            out.setdefault(section, {})[key] = value
        else:
            out[key] = value  # name, description
    return out


def apply_sets(raw: dict[str, Any], sets: list[str] | None) -> dict[str, Any]:
    """The plan mapping ``raw`` with the ``--set`` keys laid over it."""
    return _lay(raw, parse_sets(sets))


def wants_assembly(args: argparse.Namespace) -> bool:
    """Whether the plan comes (partly) from flags or an ``import:`` section, not the file alone."""
    names = (*IMPORT_FLAGS, "cluster", "nodes", "fabric", "export_plan", *OVERRIDE_FLAGS)
    if any(getattr(args, n, None) is not None for n in names):
        return True
    if args.plan is None or not args.plan.is_file():
        return False
    try:
        raw = load_yaml(
            read_input(args.plan, what="plan", max_bytes=MAX_CONFIG_BYTES), name=str(args.plan)
        )
    except (ValueError, yaml.YAMLError):
        return False  # the plan loader reports it
    return isinstance(raw, dict) and "import" in raw


def load_plan_file(path: Path, sets: list[str] | None = None) -> Plan:
    """``schedules.plan.load_plan`` on a file, with YAML syntax errors turned into one line;
    ``sets`` (``--set SECTION.KEY=VALUE``) are laid over the file's keys."""
    from schedules.plan import load_plan

    require_file(path, "plan file")
    try:
        if not sets:
            return load_plan(path)
        raw, base_dir = _base(path)
        raw = apply_sets(raw, sets)
        _anchor_cluster_file(raw, base_dir)
        return load_plan(raw)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: malformed YAML: {yaml_error_line(exc)}") from exc


def yaml_error_line(exc: yaml.YAMLError) -> str:
    """One line naming the problem and where it is (line and column, 1-based)."""
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{problem}{where}"


def assemble_plan(args: argparse.Namespace, *, warn: Callable[[str], None]) -> Any:
    """``_assemble_plan``, its warnings given to ``warn`` once the plan loads: a plan that
    fails is its one error line, not warnings and then the error."""
    lines: list[str] = []
    plan = _assemble_plan(args, warn=lines.append)
    for line in lines:
        warn(line)
    return plan


def _assemble_plan(args: argparse.Namespace, *, warn: Callable[[str], None]) -> Any:
    """The plan of the imports, the file and the flags, later winning key by key: the configs
    the plan imports (in the order model, Megatron, torchtitan, DeepSpeed), then the plan file's
    own keys, then the flags (cluster, batch, ``--set``). Each import's warnings go to ``warn``
    as one line, leaving out what the plan or the flags give themselves."""
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
    flags = _flag_sections(args, warn)
    model = sources.get("model")
    if model is not None and Path(model).suffix != ".json":  # a preset replaces the model
        base = {**base, "model": {"preset": str(model)}}
    top = _lay(base, flags)
    world = _world_size(top)
    imported = []
    if model is not None and Path(model).suffix == ".json":
        imported.append(model_from_hf_config(_existing(Path(model), "model")))
    if sources.get("megatron") is not None:
        imported.append(from_megatron_args(_existing(Path(sources["megatron"]), "megatron")))
    if sources.get("torchtitan") is not None:
        toml = _existing(Path(sources["torchtitan"]), "torchtitan")
        imported.append(from_torchtitan_toml(toml, world_size=world))
    if sources.get("deepspeed") is not None:
        ds_config = _existing(Path(sources["deepspeed"]), "deepspeed")
        imported.append(from_deepspeed_config(ds_config, world_size=world))
    merged, warnings = merge_sections({}, *imported)
    given = _given_keys(top)
    for item in imported:
        if (line := item.summary(given)) is not None:
            warn(line)
    for line in warnings[sum(len(item.warnings) for item in imported) :]:
        warn(line)  # a later import replacing an earlier one's value
    raw = _lay(merged, top)
    _anchor_cluster_file(raw, base_dir)
    return load_plan(_complete_training(raw, warn))


OVERRIDE_FLAGS = ("global_batch", "micro_batch", "seq_len", "set")
"""Flags of ``add_import_arguments`` that set plan keys over the file and the imports."""


def _flag_sections(args: argparse.Namespace, warn: Callable[[str], None]) -> dict[str, Any]:
    """The plan keys the flags set: the cluster flags, ``--global-batch``, ``--micro-batch``,
    ``--seq-len``, then ``--set`` over them."""
    out: dict[str, Any] = {}
    cluster = _cluster_flags({}, args).get("cluster")
    if cluster:
        out["cluster"] = cluster
    batch = {"global_batch_size": getattr(args, "global_batch", None),
             "micro_batch_size": getattr(args, "micro_batch", None)}  # fmt: skip
    training = {k: v for k, v in batch.items() if v is not None}
    if training:
        out["training"] = training
    if getattr(args, "seq_len", None) is not None:
        out["model"] = {"seq_len": args.seq_len}
    return _lay(out, parse_sets(getattr(args, "set", None)))


def _complete_training(raw: dict[str, Any], warn: Callable[[str], None]) -> dict[str, Any]:
    """A batch the flags can give: the missing section names them, a global batch without a
    micro-batch size runs micro-batches of 1 (said in a warning)."""
    training = raw.get("training")
    if training is None:
        raise ValueError(
            "missing section 'training' in plan: give --global-batch B (and --micro-batch b), "
            "or a training: section"
        )
    needs_micro = isinstance(training, dict) and "micro_batch_size" not in training
    if needs_micro and "global_batch_size" in training:
        warn("training.micro_batch_size not given: micro-batches of 1 (--micro-batch b)")
        return {**raw, "training": {**training, "micro_batch_size": 1}}
    return raw


def _lay(lower: dict[str, Any], upper: dict[str, Any]) -> dict[str, Any]:
    """``upper`` over ``lower``, section by section and key by key (a ``model: <preset>``
    string is the mapping ``{"preset": ...}``); a ``cluster.node`` drops the lower ``file``."""
    from schedules.plan import flatten_parallel

    out = dict(lower)
    for name, value in upper.items():
        below = out.get(name)
        if name == "parallel" and isinstance(value, dict) and isinstance(below, dict):
            below, value = flatten_parallel(below), flatten_parallel(value)
        if isinstance(below, str) and name == "model":
            below = {"preset": below}
        if isinstance(value, str) and name == "model":
            value = {"preset": value}
        if isinstance(below, dict) and isinstance(value, dict):
            below = dict(below)
            if name == "cluster" and "node" in value:
                below.pop("file", None)
            out[name] = {**below, **value}
        else:
            out[name] = value
    return out


def _given_keys(raw: dict[str, Any]) -> set[str]:
    """``section.key`` of every key the plan file and the flags give (a model preset gives
    every key of its shape)."""
    from schedules.model_presets import MODEL_PRESETS

    given: set[str] = set()
    for section, keys in raw.items():
        if not isinstance(keys, dict):
            continue
        given.update(f"{section}.{key}" for key in keys)
        preset = keys.get("preset") if section == "model" else None
        if isinstance(preset, str) and preset in MODEL_PRESETS:
            given.update(f"model.{key}" for key in MODEL_PRESETS[preset][0])
    return given


def _anchor_cluster_file(raw: dict[str, Any], base_dir: str) -> None:
    """A cluster file named in the plan is relative to the plan's folder."""
    cluster = raw.get("cluster")
    if base_dir and isinstance(cluster, dict) and isinstance(cluster.get("file"), str):
        cluster["file"] = str(Path(base_dir) / cluster["file"])


def imported_files(args: argparse.Namespace) -> list[Path]:
    """Every config file the plan will read (flags and the plan's ``import:`` section): inputs
    that no output may replace."""
    sources: dict[str, Any] = {}
    if args.plan is not None and args.plan.is_file():
        try:
            raw = load_yaml(
                read_input(args.plan, what="plan", max_bytes=MAX_CONFIG_BYTES), name=str(args.plan)
            )
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
    require_file(path, "plan file")
    text = read_input(path, what="plan", max_bytes=MAX_CONFIG_BYTES)
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
    if str(path).startswith("-") and not path.exists():
        raise ValueError(
            f"--{flag} takes a file, not the arguments themselves ({shorten(str(path))}): write "
            "them into a file, or give the launch script"
        )
    require_file(path, f"--{flag} file")
    return path
