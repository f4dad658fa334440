"""The layouts worth simulating: every parallel split of a model on a cluster, valid and fitting.

``candidate_layouts`` enumerates tensor parallelism inside a node (divisors of the GPUs per node),
pipeline parallelism over what remains, context parallelism when asked, the data-parallel kinds,
micro-batch sizes, recompute modes and pipeline schedules (1F1B, and interleaved with 2 chunks
when the layers split evenly), with sequence parallelism on whenever tp > 1 (Megatron's
practice). ``screen`` keeps the ones ``resolve_plan`` accepts and whose memory fits
``headroom`` x HBM, counting why the others fall: nothing is simulated here. Recompute modes come
in order none, selective, full: once a layout fits with less recomputation the heavier modes of
the same layout are dominated (the same step plus more compute) and are not simulated.

    layouts = candidate_layouts(plan, gpus_per_node=8, world_size=64, space=SearchSpace())
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from schedules.data_parallel.registry import data_parallel_kind
from schedules.kernels import kernel_stack
from schedules.memory import memory_per_gpu
from schedules.plan import RECOMPUTE_MODES, Plan, load_plan, plan_to_dict
from schedules.resolve import moe_kinds, resolve_plan

DEFAULT_KINDS = ("ddp", "zero1", "distributed_optimizer", "fsdp2", "zero3")
"""Data-parallel kinds searched by default (``hsdp``, ``zero2`` and FSDP1 on request)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSpace:
    """What may vary; empty tuples mean the defaults."""

    tp: tuple[int, ...] = ()
    """Tensor-parallel degrees (default: the divisors of the GPUs per node)."""
    pp: tuple[int, ...] = ()
    """Pipeline degrees (default: powers of two up to ``max_pp``)."""
    max_pp: int = 16
    """Largest pipeline degree tried by default."""
    cp: tuple[int, ...] = (1,)
    """Context-parallel degrees."""
    ep: tuple[int, ...] = ()
    """Expert-parallel degrees of an MoE model (default: the powers of two that divide its
    experts, up to the GPUs of a node times 8); ignored for a dense model (``commsim search``
    refuses ``--ep`` there)."""
    data_parallel: tuple[str, ...] = DEFAULT_KINDS
    """Data-parallel kinds (plan names; ``fsdp2`` is FSDP2)."""
    micro_batch_size: tuple[int, ...] = (1, 2, 4)
    """Micro-batch sizes."""
    recompute: tuple[str, ...] = ("none", "selective", "full")
    """Recompute modes."""
    interleaved: bool = True
    """Also try the interleaved schedule with 2 chunks per rank."""
    headroom: float = 0.9
    """Fraction of HBM a layout may use (the rest: CUDA context, NCCL, fragmentation)."""
    stack: str = ""
    """Kernel stack every layout runs (one code base is compared with itself); empty: the base
    plan's (``schedules.kernels.kernel_stack``)."""


@dataclass(slots=True)
class Screened:
    """The layouts that passed, and how many fell at each check."""

    plans: list[Plan] = field(default_factory=list)
    """Resolved plans that fit, in enumeration order."""
    rejected: Counter[str] = field(default_factory=Counter)
    """Why the others fell: ``refused (<the error's first words> ...)`` or the memory."""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _expert_degrees(plan: Plan, space: SearchSpace, gpus_per_node: int) -> tuple[int, ...]:
    """The ep values to try: none but 1 for a dense model; the given ones, or the powers of two
    dividing the experts up to 8 nodes' GPUs."""
    experts = plan.model.num_experts
    if not experts:
        return (1,)
    if space.ep:
        return space.ep
    powers = (2**i for i in range(13))
    return tuple(e for e in powers if experts % e == 0 and e <= 8 * gpus_per_node)


def layout_degrees(
    plan: Plan, space: SearchSpace, gpus_per_node: int
) -> dict[str, tuple[int, ...]]:
    """The tp, pp, cp and ep values tried: the space's, or their defaults."""
    return {
        "tp": space.tp or tuple(_divisors(gpus_per_node)),
        "pp": space.pp or tuple(p for p in (1, 2, 4, 8, 16, 32, 64) if p <= space.max_pp),
        "cp": space.cp,
        "ep": _expert_degrees(plan, space, gpus_per_node),
    }


def _fits(world_size: int, tp: int, pp: int, cp: int, ep: int) -> bool:
    """Whether tp x pp x cp divides the GPUs and tp x ep the GPUs of a pipeline stage."""
    return world_size % (tp * pp * cp) == 0 and (world_size // pp) % (tp * ep) == 0


def why_no_layout(degrees: dict[str, tuple[int, ...]], world_size: int) -> str:
    """One line on why no combination of ``degrees`` (``layout_degrees``) splits
    ``world_size`` GPUs: the first degree none of whose values divides them, else the
    products."""
    gpus = f"the {world_size:,} GPUs of the cluster"
    for name, values in degrees.items():
        if any(world_size % v == 0 for v in values):
            continue
        flag = f"--{name} {','.join(map(str, values))}"
        if min(values) > world_size:
            return f"no layout to try: {flag} exceeds {gpus}"
        verb = "does not divide" if len(values) == 1 else "has no value that divides"
        return f"no layout to try: {flag} {verb} {gpus}"
    moe = degrees.get("ep", (1,)) != (1,)
    shown = ", ".join(
        f"{k} {','.join(map(str, v))}" for k, v in degrees.items() if k != "ep" or moe
    )
    stage = " (and tp x ep the GPUs of a pipeline stage)" if moe else ""
    return f"no layout to try: no tp x pp x cp of {shown} divides {gpus}{stage}"


def candidate_layouts(
    plan: Plan, *, gpus_per_node: int, world_size: int, space: SearchSpace
) -> list[dict[str, Any]]:
    """The ``parallel`` and ``training`` sections of every layout to check, in a fixed order."""
    degrees = layout_degrees(plan, space, gpus_per_node)
    tps, pps, eps = degrees["tp"], degrees["pp"], degrees["ep"]
    layouts = []
    recomputes = sorted(space.recompute, key=RECOMPUTE_MODES.index)  # lightest first
    kinds = space.data_parallel
    if plan.model.num_experts:  # the kinds MoE layers are simulated with (FSDP as FSDP2)
        moe = moe_kinds()
        kinds = tuple(k for k in kinds if k in moe) or kinds
    for tp, pp, cp, ep, kind, mbs, recompute in itertools.product(
        tps, pps, space.cp, eps, kinds, space.micro_batch_size, recomputes
    ):
        if not _fits(world_size, tp, pp, cp, ep):
            continue
        schedules = [("1f1b", 1)]
        if pp > 1 and space.interleaved:
            schedules.append(("interleaved", 2))
        for schedule, vpp in schedules:
            parallel = {
                "tp": tp,
                "pp": pp,
                "cp": cp,
                "vpp": vpp,
                "schedule": schedule,
                "sequence_parallel": tp > 1,
                "recompute": recompute,
                "data_parallel": kind,
                **({"ep": ep} if plan.model.num_experts else {}),
            }
            layouts.append({"parallel": parallel, "micro_batch_size": mbs})
    return layouts


def screen(
    plan: Plan, layouts: list[dict[str, Any]], *, world_size: int, hbm_bytes: float,
    gpus_per_node: int, headroom: float, stack: str = "",
) -> Screened:  # fmt: skip
    """Resolve each layout on the cluster and keep those that fit ``headroom`` x HBM."""
    base = plan_to_dict(plan)
    training = {**base["training"], "stack": stack or kernel_stack(plan)}
    out = Screened()
    fitted: set[tuple[Any, ...]] = set()
    seen: set[str] = set()
    for layout in layouts:
        key = _without_recompute(layout)
        if key in fitted:
            # Recomputation only adds compute to a layout that fits without it: not simulated.
            out.rejected["dominated (fits with less recompute)"] += 1
            continue
        document = {
            **base,
            "parallel": layout["parallel"],
            "training": {**training, "micro_batch_size": layout["micro_batch_size"]},
        }
        try:
            # a cluster file named relative to the plan stays so (base_dir)
            loaded = dataclasses.replace(load_plan(document), base_dir=plan.base_dir)
            candidate = resolve_plan(loaded, world_size)
        except ValueError as exc:
            out.rejected["refused (" + " ".join(str(exc).split()[:6]) + " ...)"] += 1
            continue
        memory = memory_per_gpu(candidate, hbm_bytes=hbm_bytes, gpus_per_node=gpus_per_node)
        if memory["total"] > headroom * hbm_bytes:
            out.rejected["over the memory headroom"] += 1
            continue
        name = layout_name(candidate)
        if name in seen:  # e.g. fsdp and fsdp2 under PP: the same FSDP2 layout
            out.rejected["the same layout as another"] += 1
            continue
        seen.add(name)
        out.plans.append(dataclasses.replace(candidate, name=name))
        fitted.add(key)
    return out


def _without_recompute(layout: dict[str, Any]) -> tuple[Any, ...]:
    parallel = {k: v for k, v in layout["parallel"].items() if k != "recompute"}
    return (tuple(sorted(parallel.items())), layout["micro_batch_size"])


def layout_name(plan: Plan) -> str:
    """A short label: ``tp4 pp2 dp8 fsdp2 mbs1 selective 1f1b``."""
    par = plan.parallel
    kind = data_parallel_kind(par).short_name(par)
    schedule = f" {par.schedule}" + (f" vpp{par.vpp}" if par.vpp > 1 else "") if par.pp > 1 else ""
    cp = f" cp{par.cp}" if par.cp > 1 else ""
    cp += f" ep{par.ep}" if plan.model.num_experts else ""
    return (
        f"tp{par.tp} pp{par.pp}{cp} dp{par.dp} {kind} mbs{plan.training.micro_batch_size} "
        f"{par.recompute}{schedule}"
    )
