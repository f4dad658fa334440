"""Replay of one training step: a resolved plan turned into per-rank programs, run on the engine.

``sim.replay.recipes`` gives the pass recipes of every model chunk (TP/SP and CP collectives in
place); this module adds the data-parallel buckets of the plan's framework and the pipeline order,
hands FSDP plans without pipelining to ``sim.replay.fsdp_programs``, and runs the programs of the
simulated ranks on ``sim.replay.engine`` with the network model.

With ``fold`` only one representative per (pipeline rank, cp rank) is simulated (tp rank 0,
dp rank 0): TP peers and DP replicas run identical programs, and their collectives are still
timed on the full groups' ranks. Under ``flow`` fidelity the replicas' concurrent traffic is not
injected (the representative's collectives see an otherwise idle fabric).

    timeline = replay_plan(plan, comm=CommModel(env, topology), compute=ComputeModel(gpu))
"""

from __future__ import annotations

import math

import simpy

from schedules.model import grad_bytes_per_param
from schedules.moe import expert_params_per_gpu, is_moe
from schedules.offload import offload_of
from schedules.params import vstage_moe_layers
from schedules.pipeline import pipeline_orders
from schedules.plan import Plan, num_microbatches
from schedules.program import ChunkWork, Program
from schedules.stages import chunk_layers
from schedules.step_program import GradSync, PipelineRank, grad_sync_for, pipeline_program
from sim.compute.model import ComputeModel
from sim.replay.engine import CommRunner, Engine, Timeline
from sim.replay.folding import simulated_ranks
from sim.replay.fsdp_programs import fsdp2_programs, fsdp_groups, fsdp_programs, fsdp_stages
from sim.replay.offload import HostCopyRunner, OffloadReplay, stage_offload
from sim.replay.recipes import (
    FSDP_KINDS,
    StepCosts,
    chunk_params,
    grad_norm_group,
    layer_recipes,
    layout_of,
    optimizer_time_s,
    pass_extras,
    step_costs,
)
from sim.replay.zero3_programs import zero3_programs

MIB = 2**20
"""Bytes per MiB (torch DDP's bucket_cap_mb)."""
MEGATRON_MIN_BUCKET_ELEMS = 40_000_000
"""Megatron's bucket size: max(40M, 1M * dp) elements (distributed_data_parallel_config.py)."""
MAX_BUCKETS = 250_000
"""Most gradient buckets one model chunk may have; more is a bucket size typed in the wrong unit."""


def _buckets(
    total: float, cap: float, first_cap: float | None = None, *, knob: str
) -> tuple[float, ...]:
    """Split ``total`` bytes into buckets of ``cap`` (the first of ``first_cap``)."""
    count = math.ceil(max(total - (first_cap or 0.0), 0.0) / cap)
    if count > MAX_BUCKETS:
        raise ValueError(
            f"{knob} splits {total:.3g} gradient bytes of one model chunk into {count:,} "
            f"buckets; at most {MAX_BUCKETS:,} are simulated: use larger buckets"
        )
    sizes: list[float] = []
    remaining = total
    for limit in [first_cap] if first_cap else []:
        sizes.append(min(limit, remaining))
        remaining -= sizes[-1]
    while remaining > 0:
        sizes.append(min(cap, remaining))
        remaining -= sizes[-1]
    return tuple(sizes) or (0.0,)


def grad_buckets(plan: Plan, stage: int, chunk: int) -> tuple[float, ...]:
    """DP gradient buckets of a chunk in ready order, as the plan's framework forms them."""
    return tuple(size for size, _ in grouped_grad_buckets(plan, stage, chunk))


def grouped_grad_buckets(plan: Plan, stage: int, chunk: int) -> tuple[tuple[float, str], ...]:
    """(bytes, group) of a chunk's gradient buckets in ready order: the dense parameters' on
    ``dp`` and, for MoE models, the routed experts' on ``edp`` (Megatron keeps them in separate
    buffers, each bucketed, both filling as the backward runs: merged by their fill fraction)."""
    per_param = grad_bytes_per_param(plan.parallel.data_parallel)
    expert = chunk_expert_params(plan, stage, chunk) * per_param
    dense = chunk_params(plan, stage, chunk) * per_param - expert
    parts = [(_framework_buckets(plan, stage, chunk, dense), "dp")]
    if expert > 0:
        parts.append((_framework_buckets(plan, stage, chunk, expert), "edp"))
    tagged = [
        (sum(sizes[: i + 1]) / (sum(sizes) or 1.0), size, group)
        for sizes, group in parts
        for i, size in enumerate(sizes)
    ]
    return tuple((size, group) for _, size, group in sorted(tagged, key=lambda t: t[0]))


def chunk_expert_params(plan: Plan, stage: int, chunk: int) -> float:
    """Routed-expert parameters of one model chunk on one GPU."""
    vstage = chunk * plan.parallel.pp + stage
    return vstage_moe_layers(plan, vstage) * expert_params_per_gpu(plan.model, plan.parallel)


def _framework_buckets(plan: Plan, stage: int, chunk: int, total: float) -> tuple[float, ...]:
    """``total`` gradient bytes of a chunk split as the plan's framework buckets them."""
    parallel = plan.parallel
    kind = parallel.data_parallel
    per_param = grad_bytes_per_param(kind)
    if kind == "ddp":
        knob = f"parallel.ddp_bucket_mb={parallel.ddp_bucket_mb}"
        cap, first = parallel.ddp_bucket_mb * MIB, parallel.ddp_first_bucket_mb * MIB
        return _buckets(total, cap, first, knob=knob)
    if kind == "distributed_optimizer":
        if stage > 0 or chunk > 0 or not parallel.overlap_grad_reduce:
            return (total,)
        elems = max(MEGATRON_MIN_BUCKET_ELEMS, 1_000_000 * parallel.dp)
        return _buckets(total, elems * per_param, knob=f"Megatron's bucket of {elems} elements")
    knob = f"parallel.zero_bucket_elems={parallel.zero_bucket_elems}"
    return _buckets(total, parallel.zero_bucket_elems * per_param, knob=knob)


def _chunk_work(plan: Plan, costs: StepCosts, stage: int, chunk: int) -> ChunkWork:
    p, v = plan.parallel.pp, plan.parallel.vpp
    vstage = chunk * p + stage
    num_layers = chunk_layers(plan.parallel, plan.model.num_layers)[vstage]
    recipes = layer_recipes(plan, costs, num_layers, vstage_moe_layers(plan, vstage))
    x = pass_extras(plan, costs, first=vstage == 0, last=vstage == p * v - 1)
    buckets = grouped_grad_buckets(plan, stage, chunk)
    return ChunkWork(
        forward=(*x["fwd_pre"], *recipes["F"], *x["fwd_post"]),
        backward=(*x["bwd_pre"], *recipes["B"], *x["bwd_post"]),
        backward_input=(*x["bwd_pre"], *recipes["Bi"], *x["bwd_post"]),
        backward_weight=recipes["W"],
        grad_buckets_bytes=tuple(size for size, _ in buckets),
        grad_bucket_groups=tuple(group for _, group in buckets),
        param_bytes=chunk_params(plan, stage, chunk) * 2.0,
        expert_param_bytes=chunk_expert_params(plan, stage, chunk) * 2.0,
    )


def tied_embedding_grad_bytes(plan: Plan, stage: int) -> float:
    """Word-embedding gradient bytes the first and last stage all-reduce (tied embeddings under
    PP: Megatron keeps a copy on the last stage and sums the two gradients before the step)."""
    model, parallel = plan.model, plan.parallel
    if not model.tied_embeddings or parallel.pp == 1 or stage not in (0, parallel.pp - 1):
        return 0.0
    params = model.vocab_size * model.hidden_size / parallel.tp
    return params * grad_bytes_per_param(parallel.data_parallel)


def pipeline_programs(
    plan: Plan,
    costs: StepCosts,
    compute: ComputeModel,
    ranks: tuple[int, ...],
    gpus_per_node: int,
) -> list[Program]:
    """Programs of ``ranks`` for any pipeline schedule; FSDP kinds as FSDP2 units per chunk."""
    par, layout = plan.parallel, layout_of(plan)
    orders = pipeline_orders(par.schedule, par.pp, num_microbatches(plan), par.vpp)
    fsdp = par.data_parallel in FSDP_KINDS
    sync = (
        GradSync(op="")
        if fsdp
        else grad_sync_for(
            par.data_parallel if par.dp * par.cp > 1 or offload_of(par) else "ddp",
            overlap_grad_reduce=par.overlap_grad_reduce,
            overlap_param_gather=par.overlap_param_gather,
            zero_overlap_comm=par.zero_overlap_comm,
        )
    )
    works = {
        r: tuple(_chunk_work(plan, costs, r, c) for c in range(par.vpp)) for r in range(par.pp)
    }
    stages = {r: fsdp_stages(plan, costs, r, gpus_per_node) for r in range(par.pp)} if fsdp else {}
    norm_group = grad_norm_group(plan)
    programs = []
    for rank in ranks:
        coords = layout.coords(rank)
        stage = coords["pp"]
        groups = (
            fsdp_groups(plan, rank, gpus_per_node)
            if fsdp
            else {g: layout.group(k, rank) for g, k in (("tp", "tp"), ("cp", "cp"), ("dp", "dpcp"))}
        )
        groups["embd"] = layout.group("embd", rank)
        if is_moe(plan.model):
            groups.update({g: layout.group(g, rank) for g in ("ep", "etp", "edp", "tpep")})
        if norm_group:
            groups[norm_group] = layout.group(norm_group, rank)
        spec = PipelineRank(
            rank=rank,
            order=orders[stage],
            chunks=works[stage],
            stage=stage,
            pp=par.pp,
            prev_rank=layout.rank(**{**coords, "pp": (stage - 1) % par.pp}),
            next_rank=layout.rank(**{**coords, "pp": (stage + 1) % par.pp}),
            p2p_bytes=costs.p2p_bytes,
            blocking_p2p=par.schedule != "interleaved",
            scatter_gather_p2p=par.pp_scatter_gather and not par.sequence_parallel,
            groups=groups,
            sync=sync,
            optimizer_s=optimizer_time_s(plan, compute, stage, gpus_per_node),
            fsdp=stages.get(stage),
            tied_embedding_grad_bytes=tied_embedding_grad_bytes(plan, stage),
            grad_norm_group=norm_group,
            offload=stage_offload(plan, stage, gpus_per_node),
        )
        programs.append(pipeline_program(spec))
    return programs


def build_programs(
    plan: Plan, compute: ComputeModel, *, fold: bool = True, gpus_per_node: int = 8
) -> list[Program]:
    """Programs of the simulated ranks of a resolved plan."""
    costs = step_costs(plan, compute)
    ranks = simulated_ranks(layout_of(plan), fold=fold)
    par = plan.parallel
    if par.data_parallel == "zero3" and par.pp == 1:
        return zero3_programs(plan, costs, compute, ranks, gpus_per_node)
    if par.data_parallel in FSDP_KINDS and par.pp == 1:
        build = fsdp2_programs if par.fsdp2 else fsdp_programs
        return build(plan, costs, compute, ranks, gpus_per_node)
    return pipeline_programs(plan, costs, compute, ranks, gpus_per_node)


def replay_plan(
    plan: Plan,
    *,
    env: simpy.Environment,
    comm: CommRunner,
    compute: ComputeModel,
    fold: bool = True,
    gpus_per_node: int = 8,
    host: OffloadReplay | None = None,
) -> Timeline:
    """Simulate one steady-state step of a resolved plan; ``comm`` must be bound to ``env``.
    ``host`` times an offloading plan's CPU step and host copies (``sim.replay.offload``)."""
    programs = build_programs(plan, compute, fold=fold, gpus_per_node=gpus_per_node)
    if host is not None:
        programs, comm = host.apply(programs), HostCopyRunner(env, comm, host.rates)
    return Engine(env, comm, programs, overlap_slowdown=compute.overlap_slowdown).run()
