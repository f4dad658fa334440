"""DeepSpeed ZeRO-3 ranks without pipelining: the model as hooked modules, their recipes.

Each module of ``schedules.zero3_units.zero3_modules`` gets a share of its part's work: a
layer's forward and backward recipes (TP and CP collectives in place) are cut across the layer's
modules in proportion to their parameters (the GEMM FLOPs; the attention core rides with the
projections, norms take none), the embedding and head recipes go to the embedding and the last
head module. Full recompute replays each layer's forward, fetches included, right before its
backward (``recompute_blocks``). The step-end norm all-reduces run on dp, then on the
model-parallel group when tp > 1 (DeepSpeed's ``get_grad_norm_direct`` with an ``mpu``).

    programs = zero3_programs(describe_step(plan, gpus_per_node=8), costs, compute, ranks=(0,))
"""

from __future__ import annotations

import dataclasses

from schedules.actions import Program, Step
from schedules.plan import Plan
from schedules.step import StepDescription
from schedules.zero3_program import zero3_program
from schedules.zero3_spec import Submodule, Zero3Rank, split_recipe
from schedules.zero3_units import ModuleShape, zero3_modules
from sim.compute.compute_model import ComputeModel
from sim.replay.fsdp_ranks import sharded_groups
from sim.replay.offload import COPY_LATENCY_S
from sim.replay.recipes import StepCosts, layer_recipes, optimizer_time_s, pass_extras

V03_LOOP_S = 3.5e-6
"""One iteration of DeepSpeed v0.3.13's per-rank Python loops: ``_allgather_param`` (``narrow``,
``get_rank(group)``, append) and ``_reduce_scatter_gradient`` (``view``, ``narrow``, append).
Measured: 3.5 to 3.8 us per iteration at 1,536 ranks in two runs (torch 2.13, CPython 3.11, a
2-core AMD EPYC VM; ``results/host/``)."""
V03_COPY_S = COPY_LATENCY_S
"""One ``copy_`` of a rank's part out of or into torch's flat buffer in the list-based
all_gather / reduce_scatter (``ProcessGroupNCCL``, with ``recordStream``): one device copy's
launch, as ``sim.replay.offload.COPY_LATENCY_S``."""


def _layer_recipes(plan: Plan, costs: StepCosts) -> tuple[tuple[Step, ...], tuple[Step, ...]]:
    """One layer's forward and backward; under full recompute the backward without it (the
    recompute runs as a replayed forward, hooks and fetches included)."""
    recipes = layer_recipes(plan, costs, 1)
    if plan.parallel.recompute != "full":
        return recipes["F"], recipes["B"]
    plain = dataclasses.replace(plan, parallel=dataclasses.replace(plan.parallel, recompute="none"))
    no_recompute = dataclasses.replace(
        costs, layer=dataclasses.replace(costs.layer, recompute_s=0.0)
    )
    return recipes["F"], layer_recipes(plain, no_recompute, 1)["B"]


def zero3_submodules(plan: Plan, costs: StepCosts) -> tuple[Submodule, ...]:
    """The hooked modules in forward order, each with its share of the work."""
    modules = zero3_modules(plan)
    forward, backward = _layer_recipes(plan, costs)
    extras = pass_extras(plan, costs, first=True, last=True)
    layer_modules = [m for m in modules if m.part == "layer" and m.layer == 0]
    weights = [sum(m.tensors) for m in layer_modules]
    fractions = tuple(w / sum(weights) for w in weights)
    fwd_parts = split_recipe(forward, fractions)
    bwd_parts = split_recipe(backward, fractions[::-1])[::-1]
    position = {_suffix(m.name): i for i, m in enumerate(layer_modules)}
    last_head = max(i for i, m in enumerate(modules) if m.part == "head")

    def work(index: int, module: ModuleShape) -> tuple[tuple[Step, ...], tuple[Step, ...]]:
        if module.part == "layer":
            i = position[_suffix(module.name)]
            return fwd_parts[i], bwd_parts[i]
        if module.name == "embed":
            return tuple(extras["fwd_pre"]), tuple(extras["bwd_post"])
        if index == last_head:
            return tuple(extras["fwd_post"]), tuple(extras["bwd_pre"])
        return (), ()

    submodules = []
    for index, module in enumerate(modules):
        fwd, bwd = work(index, module)
        submodules.append(
            Submodule(
                name=module.name,
                num_params=sum(module.tensors),
                forward=fwd,
                backward=bwd,
                tensors=module.tensors,
            )
        )
    return tuple(submodules)


def _suffix(name: str) -> str:
    """``L3.q_proj`` -> ``q_proj``; the layer container ``L3`` -> ``""``."""
    return name.split(".", 1)[1] if "." in name else ""


def _recompute_blocks(plan: Plan, submodules: tuple[Submodule, ...]) -> tuple[tuple[int, int], ...]:
    if plan.parallel.recompute != "full":
        return ()
    blocks: dict[str, list[int]] = {}
    for index, sub in enumerate(submodules):
        if sub.name[:1] == "L" and sub.name[1:2].isdigit():
            blocks.setdefault(sub.name.split(".", 1)[0], []).append(index)
    return tuple((ids[0], ids[-1] + 1) for ids in blocks.values())


def zero3_programs(
    step: StepDescription, costs: StepCosts, compute: ComputeModel, ranks: tuple[int, ...]
) -> list[Program]:
    """Programs of ``ranks`` for a ZeRO-3 plan without pipelining."""
    plan = step.plan
    par = plan.parallel
    submodules = zero3_submodules(plan, costs)
    norm_groups = ("dp", "mp") if par.tp > 1 else ("dp",)
    overlap = True if par.zero_overlap_comm is None else par.zero_overlap_comm
    programs = []
    for rank in ranks:
        groups = sharded_groups(step, rank, "mp")
        spec = Zero3Rank(
            rank=rank,
            num_microbatches=step.num_microbatches,
            submodules=submodules,
            groups=groups,
            grad_bytes=float(step.kind.grad_bytes(step.plan.parallel)),
            prefetch_bucket_elems=par.zero_prefetch_bucket_elems,
            max_live_parameters=par.zero_max_live_parameters,
            persistence_threshold=par.zero_param_persistence_threshold,
            reduce_bucket_elems=par.zero_bucket_elems,
            overlap_comm=overlap,
            fetch=par.zero_fetch,
            host_loop_s=V03_LOOP_S if par.zero_fetch == "sync_per_weight" else 0.0,
            host_copy_s=V03_COPY_S if par.zero_fetch == "sync_per_weight" else 0.0,
            grad_norm_groups=norm_groups,
            recompute_blocks=_recompute_blocks(plan, submodules),
            optimizer_s=optimizer_time_s(step, compute, 0),
            offload=step.stages[0].offload,
        )
        programs.append(zero3_program(spec))
    return programs
