"""Replay of one training step: a resolved plan turned into per-rank programs, run on the engine.

The compute model gives per-layer, embedding and head times; ``schedules`` gives message sizes
and parameter counts; this module assembles the pass recipes of every model chunk (TP/SP and CP
collectives in place), the data-parallel buckets of the plan's framework, the pipeline order,
and runs the programs of the simulated ranks on ``sim.replay.engine`` with the network model.

With ``fold`` only one representative per (pipeline rank, cp rank) is simulated (tp rank 0,
dp rank 0): TP peers and DP replicas run identical programs, and their collectives are still
timed on the full groups' ranks. Under ``flow`` fidelity the replicas' concurrent traffic is not
injected (the representative's collectives see an otherwise idle fabric).

    timeline = replay_plan(plan, comm=CommModel(env, topology), compute=ComputeModel(gpu))
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import simpy

from schedules.fsdp_program import FsdpRank, FsdpStages, FsdpUnits, fsdp_program
from schedules.kernels import weight_gemm_shapes
from schedules.memory import replica_group_size
from schedules.model import (
    cp_kv_message_bytes,
    grad_bytes_per_param,
    layer_params_per_gpu,
    layers_per_stage,
    pp_message_bytes,
    stage_params_per_gpu,
    tp_message_bytes,
)
from schedules.pipeline import pipeline_orders
from schedules.plan import Plan, num_microbatches
from schedules.program import (
    ChunkWork,
    CommStep,
    ComputeStep,
    Layout,
    LinearShares,
    Program,
    Step,
    tp_backward_steps,
    tp_forward_steps,
)
from schedules.stages import chunk_layers
from schedules.step_program import GradSync, PipelineRank, grad_sync_for, pipeline_program
from sim.compute.model import ComputeModel, LayerTimes
from sim.replay.engine import CommRunner, Engine, Timeline
from sim.replay.folding import simulated_ranks

FSDP_KINDS = ("fsdp", "hsdp", "zero3")
"""Data-parallel kinds replayed unit by unit (parameters sharded and gathered per layer)."""
MIB = 2**20
"""Bytes per MiB (torch DDP's bucket_cap_mb)."""
MEGATRON_MIN_BUCKET_ELEMS = 40_000_000
"""Megatron's bucket size: max(40M, 1M * dp) elements (distributed_data_parallel_config.py)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCosts:
    """The per-micro-batch times and message sizes every rank's recipes are built from."""

    layer: LayerTimes
    """One transformer layer."""
    embed: LayerTimes
    """Input embedding (first stage)."""
    head: LayerTimes
    """Final norm, LM head and loss (last stage)."""
    shares: LinearShares
    """Column-parallel wgrad shares of a layer (TP overlap windows)."""
    tp_bytes: float
    """One TP collective message."""
    cp_bytes: float
    """One CP ring step's K and V."""
    p2p_bytes: float
    """One pipeline send."""


def step_costs(plan: Plan, compute: ComputeModel) -> StepCosts:
    """Times from the compute model and sizes from ``schedules`` for one micro-batch."""
    model, parallel, b = plan.model, plan.parallel, plan.training.micro_batch_size
    dtype = "fp8" if plan.training.precision == "fp8" else "bf16"
    wgrad = [compute.gemm_time_s(k, n, m, dtype) for m, n, k in weight_gemm_shapes(plan)]
    total = sum(wgrad) or 1.0
    return StepCosts(
        layer=compute.layer_times(plan),
        embed=compute.embedding_times(plan),
        head=compute.head_times(plan),
        shares=LinearShares(qkv=wgrad[0] / total, fc1=wgrad[2] / total),
        tp_bytes=tp_message_bytes(model, b, cp=parallel.cp),
        cp_bytes=cp_kv_message_bytes(model, b, tp=parallel.tp, cp=parallel.cp),
        p2p_bytes=pp_message_bytes(
            model, b, tp=parallel.tp, cp=parallel.cp, sequence_parallel=parallel.sequence_parallel
        ),
    )


def _cp_steps(plan: Plan, costs: StepCosts, num_layers: int, op: str) -> list[Step]:
    """Ring attention's K/V exchange per layer, overlapped with the attention compute."""
    cp = plan.parallel.cp
    if cp == 1:
        return []
    size = costs.cp_bytes * cp
    return [
        CommStep(
            name=f"{op} kv", group="cp", op=op, size_bytes=size, repeat=num_layers, overlap=True
        )
    ]


def _extras(plan: Plan, costs: StepCosts, *, first: bool, last: bool) -> dict[str, list[Step]]:
    """Embedding and head work (with their TP collectives) of the first and last virtual stage."""
    tp, sp, size = plan.parallel.tp, plan.parallel.sequence_parallel, costs.tp_bytes
    out: dict[str, list[Step]] = {"fwd_pre": [], "fwd_post": [], "bwd_pre": [], "bwd_post": []}
    if first:
        out["fwd_pre"].append(ComputeStep(name="embed", duration_s=costs.embed.forward_s))
        if tp > 1:
            op = "reduce_scatter" if sp else "all_reduce"
            out["fwd_pre"].append(CommStep(name=f"embed {op}", group="tp", op=op, size_bytes=size))
        out["bwd_post"].append(ComputeStep(name="embed bwd", duration_s=costs.embed.backward_s))
    if last:
        if tp > 1 and sp:
            out["fwd_post"].append(
                CommStep(name="head all_gather", group="tp", op="all_gather", size_bytes=size)
            )
        head = costs.head
        out["fwd_post"].append(ComputeStep(name="head", duration_s=head.forward_s))
        out["bwd_pre"].append(ComputeStep(name="head bwd", duration_s=head.backward_s))
        if tp > 1:
            op = "reduce_scatter" if sp else "all_reduce"
            out["bwd_pre"].append(CommStep(name=f"head {op}", group="tp", op=op, size_bytes=size))
    return out


def layer_recipes(plan: Plan, costs: StepCosts, num_layers: int) -> dict[str, tuple[Step, ...]]:
    """Forward, backward, Bi and W recipes of ``num_layers`` consecutive layers."""
    parallel, layer = plan.parallel, costs.layer

    def backward(split: str) -> tuple[Step, ...]:
        return tp_backward_steps(
            backward_input_s=layer.backward_input_s,
            backward_weight_s=layer.backward_weight_s,
            recompute_s=layer.recompute_s,
            num_layers=num_layers,
            tp_bytes=costs.tp_bytes,
            shares=costs.shares,
            tp=parallel.tp,
            sequence_parallel=parallel.sequence_parallel,
            full_recompute=parallel.recompute == "full",
            split=split,
        )

    forward = tp_forward_steps(
        forward_s=layer.forward_s,
        num_layers=num_layers,
        tp_bytes=costs.tp_bytes,
        tp=parallel.tp,
        sequence_parallel=parallel.sequence_parallel,
        tp_comm_overlap=parallel.tp_comm_overlap,
    )
    cp_fwd = tuple(_cp_steps(plan, costs, num_layers, "all_gather"))
    cp_bwd = tuple(_cp_steps(plan, costs, num_layers, "reduce_scatter"))
    return {
        "F": cp_fwd + forward,
        "B": cp_bwd + backward(""),
        "Bi": cp_bwd + backward("input"),
        "W": backward("weight"),
    }


def chunk_params(plan: Plan, stage: int, chunk: int) -> float:
    """Parameters of one model chunk on one GPU (embedding on the first, head on the last)."""
    p, v = plan.parallel.pp, plan.parallel.vpp
    per_layer = layer_params_per_gpu(plan.model, plan.parallel.tp)
    layers = chunk_layers(plan.parallel, plan.model.num_layers)[chunk * p + stage]
    extra = stage_params_per_gpu(plan, stage) - per_layer * layers_per_stage(plan, stage)
    owns_extra = (stage == 0 and chunk == 0) or (stage == p - 1 and chunk == v - 1)
    return layers * per_layer + (extra if owns_extra else 0.0)


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
    parallel = plan.parallel
    kind = parallel.data_parallel
    per_param = grad_bytes_per_param(kind)
    total = chunk_params(plan, stage, chunk) * per_param
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
    recipes = layer_recipes(plan, costs, chunk_layers(plan.parallel, plan.model.num_layers)[vstage])
    x = _extras(plan, costs, first=vstage == 0, last=vstage == p * v - 1)
    return ChunkWork(
        forward=(*x["fwd_pre"], *recipes["F"], *x["fwd_post"]),
        backward=(*x["bwd_pre"], *recipes["B"], *x["bwd_post"]),
        backward_input=(*x["bwd_pre"], *recipes["Bi"], *x["bwd_post"]),
        backward_weight=recipes["W"],
        grad_buckets_bytes=grad_buckets(plan, stage, chunk),
        param_bytes=chunk_params(plan, stage, chunk) * 2.0,
    )


def layout_of(plan: Plan) -> Layout:
    """Rank layout of a resolved plan."""
    par = plan.parallel
    return Layout(tp=par.tp, cp=par.cp, dp=par.dp, pp=par.pp)


def _optimizer_s(plan: Plan, compute: ComputeModel, stage: int, gpus_per_node: int) -> float:
    kind = plan.parallel.data_parallel
    params = stage_params_per_gpu(plan, stage)
    if kind != "ddp":
        params /= replica_group_size(plan, gpus_per_node=gpus_per_node)
    return compute.optimizer_step_s(params, grad_bytes_per_param=grad_bytes_per_param(kind))


def reshard_after_forward(plan: Plan) -> bool:
    """The FSDP knob; unset (None) means the framework default: True alone, False under PP
    (torchtitan: the pipeline reuses the parameters for every micro-batch)."""
    value = plan.parallel.fsdp_reshard_after_forward
    return plan.parallel.pp == 1 if value is None else bool(value)


def fsdp_groups(plan: Plan, rank: int, gpus_per_node: int) -> dict[str, tuple[int, ...]]:
    """``tp``, ``cp``, ``dp`` (the FSDP shard group) and, for HSDP, ``hsdp`` (replicate)."""
    par, layout = plan.parallel, layout_of(plan)
    groups = {"tp": layout.group("tp", rank), "cp": layout.group("cp", rank)}
    shard = replica_group_size(plan, gpus_per_node=gpus_per_node) // par.cp
    if par.data_parallel == "hsdp" and shard < par.dp:
        groups["dp"] = layout.group("dp_shard", rank, shard_size=shard)
        groups["hsdp"] = layout.group("dp_replicate", rank, shard_size=shard)
    else:
        groups["dp"] = layout.group("dp", rank)
    return groups


def fsdp_stages(plan: Plan, costs: StepCosts, stage: int, gpus_per_node: int) -> FsdpStages:
    """The FSDP2 units of every chunk of pipeline rank ``stage`` (one unit per layer + root)."""
    par = plan.parallel
    units_per_chunk = chunk_layers(par, plan.model.num_layers)
    recipes = layer_recipes(plan, costs, 1)
    layer = ChunkWork(
        forward=recipes["F"],
        backward=recipes["B"],
        backward_input=recipes["Bi"],
        backward_weight=recipes["W"],
    )
    per_param = grad_bytes_per_param(par.data_parallel)
    unit_params = layer_params_per_gpu(plan.model, par.tp)
    chunks = []
    for chunk in range(par.vpp):
        vstage = chunk * par.pp + stage
        num_units = units_per_chunk[vstage]
        x = _extras(plan, costs, first=vstage == 0, last=vstage == par.pp * par.vpp - 1)
        root_params = chunk_params(plan, stage, chunk) - unit_params * num_units
        chunks.append(
            FsdpUnits(
                num_units=num_units,
                layer=layer,
                unit_param_bytes=unit_params * 2.0,
                unit_grad_bytes=unit_params * per_param,
                root_param_bytes=root_params * 2.0,
                root_grad_bytes=root_params * per_param,
                embed=_extra_work(x["fwd_pre"], x["bwd_post"]),
                head=_extra_work(x["fwd_post"], x["bwd_pre"]),
            )
        )
    return FsdpStages(chunks=tuple(chunks), reshard_after_forward=reshard_after_forward(plan))


def _extra_work(forward: list[Step], backward: list[Step]) -> ChunkWork:
    return ChunkWork(
        forward=tuple(forward), backward=tuple(backward), backward_input=tuple(backward)
    )


SHARDED_GRADIENTS = ("distributed_optimizer", "zero1", "zero2", *FSDP_KINDS)
"""Kinds whose ranks hold different gradient shards: the gradient norm needs every rank."""


def grad_norm_group(plan: Plan) -> str:
    """Group of the step-end gradient-norm all-reduce: none for replicated gradients without PP;
    Megatron's model-parallel group (TP x PP) for replicated ones under PP; everyone when the
    gradients are sharded over data parallelism (distributed optimizer, ZeRO, FSDP)."""
    kind = plan.parallel.data_parallel
    if kind in SHARDED_GRADIENTS and plan.parallel.dp * plan.parallel.cp > 1:
        return "world"
    return "mp" if plan.parallel.pp > 1 else ""


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
            par.data_parallel if par.dp * par.cp > 1 else "ddp",
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
            optimizer_s=_optimizer_s(plan, compute, stage, gpus_per_node),
            fsdp=stages.get(stage),
            tied_embedding_grad_bytes=tied_embedding_grad_bytes(plan, stage),
            grad_norm_group=norm_group,
        )
        programs.append(pipeline_program(spec))
    return programs


def fsdp_programs(
    plan: Plan,
    costs: StepCosts,
    compute: ComputeModel,
    ranks: tuple[int, ...],
    gpus_per_node: int,
) -> list[Program]:
    """Programs of ``ranks`` for an FSDP / HSDP / ZeRO-3 plan without pipelining (FSDP1)."""
    par = plan.parallel
    recipes = layer_recipes(plan, costs, 1)
    x = _extras(plan, costs, first=True, last=True)
    per_param = grad_bytes_per_param(par.data_parallel)
    unit_params = layer_params_per_gpu(plan.model, par.tp)
    root_params = stage_params_per_gpu(plan, 0) - unit_params * plan.model.num_layers
    prefetch = par.fsdp_backward_prefetch if par.data_parallel != "zero3" else "backward_pre"
    units = FsdpUnits(
        num_units=plan.model.num_layers,
        layer=ChunkWork(forward=recipes["F"], backward=recipes["B"]),
        unit_param_bytes=unit_params * 2.0,
        unit_grad_bytes=unit_params * per_param,
        root_param_bytes=root_params * 2.0,
        root_grad_bytes=root_params * per_param,
        embed=ChunkWork(forward=tuple(x["fwd_pre"]), backward=tuple(x["bwd_post"])),
        head=ChunkWork(forward=tuple(x["fwd_post"]), backward=tuple(x["bwd_pre"])),
    )
    programs = []
    for rank in ranks:
        groups = fsdp_groups(plan, rank, gpus_per_node)
        spec = FsdpRank(
            rank=rank,
            num_microbatches=num_microbatches(plan),
            units=units,
            groups=groups,
            backward_prefetch=prefetch,
            limit_all_gathers=par.fsdp_limit_all_gathers,
            reshard_after_forward=reshard_after_forward(plan),
            optimizer_s=_optimizer_s(plan, compute, 0, gpus_per_node),
        )
        programs.append(fsdp_program(spec))
    return programs


def build_programs(
    plan: Plan, compute: ComputeModel, *, fold: bool = True, gpus_per_node: int = 8
) -> list[Program]:
    """Programs of the simulated ranks of a resolved plan."""
    costs = step_costs(plan, compute)
    ranks = simulated_ranks(layout_of(plan), fold=fold)
    if plan.parallel.data_parallel in FSDP_KINDS and plan.parallel.pp == 1:
        return fsdp_programs(plan, costs, compute, ranks, gpus_per_node)
    return pipeline_programs(plan, costs, compute, ranks, gpus_per_node)


def replay_plan(
    plan: Plan,
    *,
    env: simpy.Environment,
    comm: CommRunner,
    compute: ComputeModel,
    fold: bool = True,
    gpus_per_node: int = 8,
) -> Timeline:
    """Simulate one steady-state step of a resolved plan; ``comm`` must be bound to ``env``."""
    programs = build_programs(plan, compute, fold=fold, gpus_per_node=gpus_per_node)
    return Engine(env, comm, programs).run()
