"""``commsim search``: which layout should I run? Every valid one, pruned by memory, simulated.

Reads a plan for the model, the cluster and the training batch (its ``parallel`` section is
ignored), enumerates the layouts (``sim.search.space``), drops those the frameworks refuse and
those that do not fit ``--headroom`` x HBM, simulates the rest in ``-j`` worker processes with a
progress bar, and prints the top ``--top`` by throughput with step time, tokens/s, MFU, memory,
exposed communication and bottleneck. ``--json`` / ``--csv`` write every row, ``--best-plan``
the best layout as a plan YAML, ``--plot`` throughput against memory with the Pareto front of
the simulated layouts (a layout that fits without recompute is not simulated with more of it,
so its lighter-memory twins are not on the front). Every layout runs one kernel stack:
``--stack``, else the base plan's (``training.stack`` or its default for the base plan's
``data_parallel``).

    commsim search examples/llama3-8b-ddp-8xh100.yaml --top 5 --best-plan best.yaml -j 2
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import io
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from fileio.output import check_outputs, write_bytes
from fileio.strict import did_you_mean, shorten
from sim.inputs.calibrations import compute_calibration_for, load_calibrations
from sim.inputs.plans import add_set_argument, apply_sets, load_plan_file
from sim.inputs.workers import add_ray_argument

if TYPE_CHECKING:
    from schedules.plan import Plan
    from sim.search.space import SearchSpace

MAX_LAYOUTS = 5000
"""Most layouts simulated by default (a few seconds each at 1,000+ GPUs): narrow the space or
raise ``--max-layouts``."""


def _items(text: str, what: str) -> list[str]:
    """The comma-separated items of a flag's value; an empty value or item is refused (a
    ``2,,4`` is a typo, not the list 2, 4)."""
    items = [v.strip() for v in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated {what}, got {shorten(text)}"
            + (" (an empty item)" if text.strip() else "")
        )
    return items


def _ints(text: str) -> tuple[int, ...]:
    try:
        values = tuple(dict.fromkeys(int(v) for v in _items(text, "integers >= 1")))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers >= 1, got {shorten(text)}"
        ) from None
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {shorten(text)}")
    return values


def _words(text: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(_items(text, "names")))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Define the ``commsim search`` flags."""
    parser.add_argument(
        "plan", type=Path, nargs="?", metavar="PLAN.yaml", help="model, cluster, batch (or flags)"
    )
    parser.add_argument("--model", help="model preset (e.g. llama3-70b) when there is no plan")
    parser.add_argument("--cluster", help="node preset (e.g. dgx-h100) when there is no plan")
    parser.add_argument("--nodes", type=int, default=1, help="number of nodes")
    parser.add_argument("--fabric", help="inter-node fabric preset (e.g. ib-ndr)")
    parser.add_argument("--global-batch", type=int, help="sequences per optimizer step")
    parser.add_argument("--seq-len", type=int, help="sequence length (default: the preset's)")
    parser.add_argument("--precision", default="bf16", help="bf16, fp16 or fp8")
    parser.add_argument("--tokens", type=float, help="training tokens: report the days it takes")
    parser.add_argument("--price", type=float, help="price per GPU-hour: report the cost")
    parser.add_argument("--tp", type=_ints, default=(), help="tensor-parallel degrees")
    parser.add_argument("--pp", type=_ints, default=(), help="pipeline degrees")
    parser.add_argument("--max-pp", type=int, default=16, help="largest pipeline degree")
    parser.add_argument("--cp", type=_ints, default=(1,), help="context-parallel degrees")
    parser.add_argument("--ep", type=_ints, default=(), help="expert-parallel degrees (MoE)")
    parser.add_argument("--data-parallel", type=_words, default=None, help="kinds to try")
    parser.add_argument("--micro-batch", type=_ints, default=(1, 2, 4), help="micro-batch sizes")
    parser.add_argument("--recompute", type=_words, default=None, help="none,selective,op,full")
    parser.add_argument("--no-interleaved", action="store_true", help="skip interleaved 1F1B")
    parser.add_argument("--headroom", type=float, default=0.9, help="fraction of HBM usable")
    parser.add_argument(
        "--stack", choices=("eager", "compile", "megatron"), default="",
        help="kernel stack of every layout (default: the plan's)",
    )  # fmt: skip
    parser.add_argument("--top", type=int, default=10, help="rows printed")
    parser.add_argument("-j", "--jobs", type=int, default=1, help="worker processes")
    add_ray_argument(parser)
    parser.add_argument("--max-layouts", type=int, default=MAX_LAYOUTS)
    parser.add_argument("--calibration", type=Path, help="network calibration JSON")
    parser.add_argument("--compute-calibration", type=Path, help="compute calibration JSON")
    parser.add_argument("--json", type=Path, metavar="OUT.json", help="write every row")
    parser.add_argument("--csv", type=Path, metavar="OUT.csv", help="write every row")
    parser.add_argument("--best-plan", type=Path, metavar="BEST.yaml", help="write the best plan")
    parser.add_argument("--plot", type=Path, metavar="PLOT.png", help="throughput vs memory")
    add_set_argument(parser)


def _space(args: argparse.Namespace) -> SearchSpace:
    from schedules.plan import DATA_PARALLEL_KINDS, FSDP2_ALIAS, RECOMPUTE_MODES
    from sim.search.space import DEFAULT_KINDS, SearchSpace

    if not 0 < args.headroom <= 1:
        raise ValueError(f"--headroom must be in (0, 1], got {args.headroom}")
    _check_choices("--recompute", args.recompute or (), RECOMPUTE_MODES)
    _check_choices("--data-parallel", args.data_parallel or (), (*DATA_PARALLEL_KINDS, FSDP2_ALIAS))
    for flag, value in (("--tokens", args.tokens), ("--price", args.price)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ValueError(f"{flag} must be a positive number, got {value}")
    if args.price is not None and args.tokens is None:
        raise ValueError("--price needs --tokens (the tokens to train on)")
    counts = (("--top", args.top), ("--jobs", args.jobs), ("--max-pp", args.max_pp),
              ("--max-layouts", args.max_layouts))  # fmt: skip
    for flag, count in counts:
        if count < 1:
            raise ValueError(f"{flag} must be >= 1, got {count}")
    return SearchSpace(
        tp=args.tp,
        pp=args.pp,
        max_pp=args.max_pp,
        cp=args.cp,
        ep=args.ep,
        data_parallel=args.data_parallel or DEFAULT_KINDS,
        micro_batch_size=args.micro_batch,
        recompute=args.recompute or ("none", "selective", "full"),
        interleaved=not args.no_interleaved,
        headroom=args.headroom,
        stack=args.stack,
    )


def _check_choices(flag: str, given: tuple[str, ...], choices: tuple[str, ...]) -> None:
    """Every name given to ``flag`` is one of ``choices``; else one line with the nearest."""
    for name in given:
        if name not in choices:
            raise ValueError(
                f"{flag} {shorten(name)} is not one of {', '.join(choices)}"
                f"{did_you_mean(name, choices)}"
            )


def run(args: argparse.Namespace) -> int:
    """Enumerate, screen, simulate, report; returns 0 (2 when no layout is left)."""
    from schedules.plan import plan_to_dict
    from sim.output.progress import LOG_EVERY, progress_bar
    from sim.replay.simulate import plan_topology
    from sim.replay.whatif import check_whatif, degraded_topology
    from sim.search.run import pareto_front, simulate_layouts
    from sim.search.space import candidate_layouts, layout_degrees, screen, why_no_layout

    targets = check_outputs(
        {
            "--json": (args.json, (".json",)),
            "--csv": (args.csv, (".csv",)),
            "--best-plan": (args.best_plan, (".yaml", ".yml")),
            "--plot": (args.plot, (".png", ".svg", ".pdf")),
        },
        inputs=tuple(p for p in (args.plan, args.calibration, args.compute_calibration) if p),
    )
    space = _space(args)
    plan = _base_plan(args)
    if space.ep and not plan.model.num_experts:
        raise ValueError(
            f"--ep {','.join(map(str, space.ep))}: the model has no experts "
            f"({plan.model.name or 'the plan'} is dense; --ep is for MoE models)"
        )
    topology = plan_topology(plan)
    check_whatif(plan.whatif, topology)  # a bad rank, server or switch fails before any layout
    if plan.whatif.links:  # a link down needs another way up
        degraded_topology(topology, dataclasses.replace(plan.whatif, second_job=()))
    gpu = topology.gpu_spec(0)
    comm, source = load_calibrations(args.calibration, args.compute_calibration)
    compute = compute_calibration_for(source, gpu, warn=_warn)
    layouts = candidate_layouts(
        plan,
        gpus_per_node=topology.gpus_per_node,
        world_size=topology.num_gpus,
        space=space,
    )
    if not layouts:
        degrees = layout_degrees(plan, space, topology.gpus_per_node)
        raise ValueError(why_no_layout(degrees, topology.num_gpus))
    screened = screen(
        plan, layouts, world_size=topology.num_gpus, hbm_bytes=gpu.hbm_bytes,
        gpus_per_node=topology.gpus_per_node, headroom=space.headroom, stack=space.stack,
    )  # fmt: skip
    if not screened.plans:
        reasons = ", ".join(f"{n} {why}" for why, n in screened.rejected.most_common(3))
        raise ValueError(f"no layout of the {len(layouts)} tried is valid and fits ({reasons})")
    if len(screened.plans) > args.max_layouts:
        raise ValueError(
            f"{len(screened.plans)} layouts to simulate exceed --max-layouts {args.max_layouts}: "
            "narrow the space (--tp, --pp, --data-parallel, --micro-batch) or raise the limit"
        )
    bar = progress_bar(len(screened.plans), "simulating", unit="layout", log_every=LOG_EVERY)
    rows = simulate_layouts(
        screened.plans, jobs=args.jobs, comm=comm, compute=compute,
        on_done=lambda _: bar.update(1), ray_address=args.ray,
    )  # fmt: skip
    bar.close()
    ranked = sorted(rows, key=lambda r: -r.tokens_per_s)
    print(_table(ranked[: args.top], len(layouts), screened.rejected, len(rows)), end="")
    if args.tokens is not None:
        print(_cost_line(ranked[0], args.tokens, args.price, topology.num_gpus))
    best = next(p for p in screened.plans if p.name == ranked[0].name)
    title = f"{plan.model.name} on {topology.num_gpus:,} x {gpu.name} ({_cluster_name(plan)})"
    plot = (title, gpu.hbm_bytes / 2**30, space.headroom)
    files = _files(targets, ranked, pareto_front(rows), plan_to_dict(best), plot)
    for target, data in files:
        write_bytes(target, data)
    return 0


def _warn(line: str) -> None:
    print(f"commsim: warning: {line}", file=sys.stderr)


def _base_plan(args: argparse.Namespace) -> Plan:
    """The plan file, or one built from --model, --cluster, --nodes and --global-batch."""
    from schedules.plan import load_plan

    plan_flags = ("model", "cluster", "global_batch", "seq_len", "fabric")
    if args.plan is not None:
        given = [f for f in plan_flags if getattr(args, f) is not None] + (
            ["nodes"] if args.nodes != 1 else []
        )
        if given:
            named = ", ".join("--" + f.replace("_", "-") for f in given)
            raise ValueError(f"{named}: give either a PLAN.yaml or these flags, not both")
        return load_plan_file(args.plan, args.set)
    missing = [f for f in ("model", "cluster", "global_batch") if getattr(args, f) is None]
    if missing:
        flags = ", ".join("--" + m.replace("_", "-") for m in missing)
        raise ValueError(f"give a PLAN.yaml, or {flags} (and optionally --nodes, --fabric)")
    model: dict[str, Any] = {"preset": args.model}
    if args.seq_len is not None:
        model["seq_len"] = args.seq_len
    node, nodes = args.cluster, args.nodes
    if ":" in node:  # NODE:N, as commsim plan takes it
        node, count = node.split(":", 1)
        if not count.isdigit() or int(count) < 1:
            raise ValueError(f"--cluster {args.cluster}: expected NODE or NODE:N with N >= 1")
        nodes = int(count)
    cluster: dict[str, Any] = {"node": node, "num_nodes": nodes}
    if args.fabric:
        cluster["fabric"] = args.fabric
    training = {"micro_batch_size": 1, "global_batch_size": args.global_batch,
                "precision": args.precision}  # fmt: skip
    return load_plan(
        apply_sets({"model": model, "cluster": cluster, "training": training}, args.set)
    )


def _cost_line(best: Any, tokens: float, price: float | None, num_gpus: int) -> str:
    """Days to train on ``tokens`` with the best layout, and the cost at ``price`` per GPU-hour."""
    hours = tokens / best.tokens_per_s / 3600.0
    cost = f", {hours * num_gpus * price:,.0f} at {price:g} per GPU-hour" if price else ""
    return (
        f"# {tokens:.3g} tokens with the best layout: {hours / 24:,.1f} days on {num_gpus:,} GPUs "
        f"({hours * num_gpus:,.0f} GPU-hours{cost})"
    )


def _table(rows: list[Any], tried: int, rejected: Any, simulated: int) -> str:
    width = max([len("layout"), *(len(r.name) for r in rows)])
    header = (
        f"{'layout':<{width}} {'step s':>9} {'tokens/s':>12} {'MFU':>6} {'GiB':>7} "
        f"{'exp.comm s':>10}  bottleneck"
    )
    lines = [
        f"# {tried} layouts tried, {simulated} simulated; not simulated: "
        + (", ".join(f"{n} {why}" for why, n in rejected.most_common()) or "none"),
        header,
    ]
    for r in rows:
        lines.append(
            f"{r.name:<{width}} {r.step_time_s:>9.3f} {r.tokens_per_s:>12,.0f} {r.mfu:>6.1%} "
            f"{r.memory_gib:>7.2f} {r.exposed_comm_s:>10.3f}  {r.bottleneck}"
        )
    return "\n".join(lines) + "\n"


def _cluster_name(plan: Plan) -> str:
    """``4 x dgx-h100, ib-ndr`` (or the cluster file's name) for the plot's title."""
    cluster = plan.cluster
    if cluster.file is not None:
        return Path(cluster.file).name
    node = cluster.node if isinstance(cluster.node, str) else "custom node"
    return f"{cluster.num_nodes} x {node}" + (f", {cluster.fabric}" if cluster.fabric else "")


def _files(
    targets: dict[str, Any], ranked: list[Any], front: list[Any], best: dict[str, Any],
    plot: tuple[str, float, float],
) -> list[tuple[Any, bytes]]:  # fmt: skip
    files = []
    if (target := targets.get("--json")) is not None:
        document = {"schema": "commsim-search/1", "rows": [r.to_json() for r in ranked],
                    "pareto": [r.name for r in front]}  # fmt: skip
        files.append((target, (json.dumps(document, indent=2) + "\n").encode()))
    if (target := targets.get("--csv")) is not None:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(ranked[0].to_json()))
        writer.writeheader()
        writer.writerows(r.to_json() for r in ranked)
        files.append((target, buffer.getvalue().encode()))
    if (target := targets.get("--best-plan")) is not None:
        files.append((target, yaml.safe_dump(best, sort_keys=False).encode()))
    if (target := targets.get("--plot")) is not None:
        from sim.output.pareto import pareto_figure_bytes

        title, hbm_gib, headroom = plot
        figure = pareto_figure_bytes(
            ranked, front, target.format, title=title, hbm_gib=hbm_gib, headroom=headroom
        )
        files.append((target, figure))
    return files
