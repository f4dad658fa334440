"""Replay of one training step: a resolved plan turned into per-rank programs, run on the engine.

The step comes described (``schedules.step``: layout, stages, chunks and their gradient buckets);
``sim.replay.recipes`` prices the pass recipes of every model chunk (TP/SP and CP collectives in
place); this module adds the data-parallel sync of the plan's framework and the pipeline order,
hands FSDP plans without pipelining to ``sim.replay.fsdp_ranks``, and runs the programs of the
simulated ranks on ``sim.replay.engine`` with the network model.

With ``fold`` only one representative per (pipeline rank, cp rank) is simulated (tp rank 0,
dp rank 0): TP peers and DP replicas run identical programs, and their collectives are still
timed on the full groups' ranks. Under ``flow`` fidelity the replicas' concurrent traffic is not
injected (the representative's collectives see an otherwise idle fabric).

    timeline = replay_plan(describe_step(plan, gpus_per_node=8), env=env,
                           comm=CommModel(env, topology), compute=ComputeModel(gpu))
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

import simpy

from schedules.actions import ChunkWork, Program
from schedules.data_parallel.ddp import DDP
from schedules.grad_sync import GradSync
from schedules.moe import is_moe, with_hottest
from schedules.pipeline_program import PipelineRank, pipeline_program
from schedules.pipeline_schedules import pipeline_orders, pipeline_schedule
from schedules.pipeline_schedules.a2a_overlap import combined_1f1b
from schedules.step import ChunkDescription, StepDescription
from sim.compute.compute_model import ComputeModel
from sim.replay.combined import combined_recipe
from sim.replay.engine import CommRunner, Engine, Timeline
from sim.replay.folding import simulated_ranks
from sim.replay.fsdp_ranks import fsdp2_programs, fsdp_groups, fsdp_programs, fsdp_stages
from sim.replay.offload import HostCopyRunner, OffloadReplay
from sim.replay.recipes import (
    StepCosts,
    layer_recipes,
    mtp_recipes,
    optimizer_time_s,
    pass_extras,
    step_costs,
)
from sim.replay.whatif import slowed_programs
from sim.replay.zero3_ranks import zero3_programs


def _chunk_work(step: StepDescription, costs: StepCosts, chunk: ChunkDescription) -> ChunkWork:
    plan = step.plan
    recipes = layer_recipes(plan, costs, chunk.num_layers, chunk.num_moe_layers)
    x = pass_extras(plan, costs, first=chunk.first, last=chunk.last)
    # the multi-token-prediction depths follow the last layers, before the main LM head
    mtp = mtp_recipes(plan, costs) if chunk.last else {"F": (), "B": (), "Bi": (), "W": ()}
    return ChunkWork(
        forward=(*x["fwd_pre"], *recipes["F"], *mtp["F"], *x["fwd_post"]),
        backward=(*x["bwd_pre"], *mtp["B"], *recipes["B"], *x["bwd_post"]),
        backward_input=(*x["bwd_pre"], *mtp["Bi"], *recipes["Bi"], *x["bwd_post"]),
        backward_weight=(*mtp["W"], *recipes["W"]),
        grad_buckets_bytes=tuple(size for size, _ in chunk.grad_buckets),
        grad_bucket_groups=tuple(group for _, group in chunk.grad_buckets),
        param_bytes=chunk.gather_bytes,
        expert_param_bytes=chunk.expert_gather_bytes,
    )


def _grad_sync(step: StepDescription) -> GradSync:
    """The kind's gradient sync in a pipeline program (none for FSDP units, which reduce their
    own; a plain all-reduce when one rank has nothing to shard)."""
    par, kind = step.plan.parallel, step.kind
    if kind.gathers_units:
        return GradSync(op="")
    if par.dp * par.cp == 1 and step.offload is None:
        kind = DDP
    return GradSync(op="") if kind.grad_sync is None else kind.grad_sync(par)


def _groups(step: StepDescription, rank: int) -> dict[str, tuple[int, ...]]:
    """A pipeline rank's process groups by name."""
    layout = step.layout
    if step.kind.gathers_units:
        groups = fsdp_groups(step, rank)
    else:
        groups = {g: layout.group(k, rank) for g, k in (("tp", "tp"), ("cp", "cp"), ("dp", "dpcp"))}
    groups["embd"] = layout.group("embd", rank)
    if is_moe(step.plan.model):
        groups.update({g: layout.group(g, rank) for g in ("ep", "etp", "edp", "tpep")})
    if step.grad_norm_group:
        groups[step.grad_norm_group] = layout.group(step.grad_norm_group, rank)
    return groups


def pipeline_programs(
    step: StepDescription, costs: StepCosts, compute: ComputeModel, ranks: tuple[int, ...]
) -> list[Program]:
    """Programs of ``ranks`` for any pipeline schedule; FSDP kinds as FSDP2 units per chunk."""
    par, layout = step.plan.parallel, step.layout
    if par.overlap_moe_expert_parallel_comm:  # Megatron-Core's combined 1F1B
        orders = combined_1f1b(par.pp, step.num_microbatches, par.vpp)
    else:
        orders = pipeline_orders(par.schedule, par.pp, step.num_microbatches, par.vpp)
    sync = _grad_sync(step)
    priced: dict[float, StepCosts] = {}

    def chunk_costs(chunk: ChunkDescription) -> StepCosts:
        # MoE layers at a per-layer what-if's mean busiest-expert factor (schedules.moe)
        if chunk.moe_hottest is None:
            return costs
        if chunk.moe_hottest not in priced:
            variant = with_hottest(step.plan, chunk.moe_hottest)
            priced[chunk.moe_hottest] = step_costs(
                variant, compute, gpus_per_node=step.gpus_per_node
            )
        return priced[chunk.moe_hottest]

    works = {
        s.stage: tuple(_chunk_work(step, chunk_costs(c), c) for c in s.chunks) for s in step.stages
    }
    combined = {
        stage: {
            (p.chunk, p.paired.chunk): combined_recipe(
                step.plan,
                chunk_costs(step.stages[stage].chunks[p.chunk]),
                chunk_costs(step.stages[stage].chunks[p.paired.chunk]),
                step.stages[stage].chunks[p.chunk],
                step.stages[stage].chunks[p.paired.chunk],
            )
            for p in orders[stage]
            if p.paired is not None
        }
        for stage in range(par.pp)
    }
    fsdp = step.kind.gathers_units
    stages = {r: fsdp_stages(step, costs, r, chunk_costs) for r in range(par.pp)} if fsdp else {}
    programs = []
    for rank in ranks:
        coords = layout.coords(rank)
        stage = coords["pp"]
        spec = PipelineRank(
            rank=rank,
            order=orders[stage],
            chunks=works[stage],
            stage=stage,
            pp=par.pp,
            prev_rank=layout.rank(**{**coords, "pp": (stage - 1) % par.pp}),
            next_rank=layout.rank(**{**coords, "pp": (stage + 1) % par.pp}),
            p2p_bytes=costs.p2p_bytes,
            blocking_p2p=pipeline_schedule(par.schedule).blocking_p2p,
            scatter_gather_p2p=par.pp_scatter_gather and not par.sequence_parallel,
            groups=_groups(step, rank),
            sync=sync,
            optimizer_s=optimizer_time_s(step, compute, stage),
            fsdp=stages.get(stage),
            tied_embedding_grad_bytes=step.stages[stage].tied_embedding_grad_bytes,
            grad_norm_group=step.grad_norm_group,
            offload=step.stages[stage].offload,
            combined=combined[stage],
        )
        programs.append(pipeline_program(spec))
    return programs


def build_programs(
    step: StepDescription,
    compute: ComputeModel,
    *,
    fold: bool = True,
    ranks: tuple[int, ...] | None = None,
) -> list[Program]:
    """Programs of the simulated ranks of a described step (``ranks``: these instead)."""
    costs = step_costs(step.plan, compute, gpus_per_node=step.gpus_per_node)
    ranks = simulated_ranks(step.layout, fold=fold) if ranks is None else ranks
    par = step.plan.parallel
    program = step.kind.program if par.pp == 1 else "pipeline"
    if program == "zero3":
        return zero3_programs(step, costs, compute, ranks)
    if program == "fsdp":
        build = fsdp2_programs if par.fsdp2 else fsdp_programs
        return build(step, costs, compute, ranks)
    return pipeline_programs(step, costs, compute, ranks)


def replay_plan(
    step: StepDescription,
    *,
    env: simpy.Environment,
    comm: CommRunner,
    compute: ComputeModel,
    fold: bool = True,
    host: OffloadReplay | None = None,
    ranks: tuple[int, ...] | None = None,
    slowdowns: dict[int, float] | None = None,
    finished: simpy.Event | None = None,
) -> Timeline:
    """Simulate one steady-state step of a described plan; ``comm`` must be bound to ``env``.
    ``host`` times an offloading plan's CPU step and host copies (``sim.replay.offload``);
    ``ranks`` are simulated instead of the folding's, and ``slowdowns`` stretch the kernels of
    some ranks (``sim.replay.whatif``); ``finished`` succeeds when the step's last action ends."""
    with gc_paused():
        # the engine and its events are freed on return, before the collector is back on: it
        # then walks only what the timeline keeps
        return _run(step, env, comm, compute, fold, host, ranks, slowdowns, finished)


def _run(
    step: StepDescription,
    env: simpy.Environment,
    comm: CommRunner,
    compute: ComputeModel,
    fold: bool,
    host: OffloadReplay | None,
    ranks: tuple[int, ...] | None,
    slowdowns: dict[int, float] | None,
    finished: simpy.Event | None,
) -> Timeline:
    programs = build_programs(step, compute, fold=fold, ranks=ranks)
    if slowdowns:
        programs = slowed_programs(programs, slowdowns)
    if host is not None:
        programs, comm = host.apply(programs), HostCopyRunner(env, comm, host.rates)
    engine = Engine(
        env, comm, programs, overlap_slowdown=compute.overlap_slowdown, finished=finished
    )
    return engine.run()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off while a replay builds and runs its programs: they
    are millions of long-lived objects that each full collection would walk again (an
    unfolded 512-GPU replay took 17.3 s with it, 9.6 s without); what cycles the replay leaves
    are collected when it is back on. Reference counting still frees everything else."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
