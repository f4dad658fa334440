"""One training step of a resolved plan, described once: ``describe_step``.

The description holds what every later stage needs and would otherwise recompute from the plan:
the rank layout, the data-parallel kind and its replica group, the micro-batch count, per
pipeline stage its parameters, the parameters its optimizer updates, its memory items and its
offload, and per model chunk its layers, parameters and gradient buckets in ready order.
``sim.replay`` prices and replays this description; it reads the layout, buckets and sizes here
instead of deriving them again.

    step = describe_step(resolve_plan(plan, 64), gpus_per_node=8)
    step.stages[0].chunks[0].grad_buckets
"""

from __future__ import annotations

from dataclasses import dataclass

from schedules.data_parallel.registry import data_parallel_kind, offload_of
from schedules.data_parallel.spec import DataParallelKind
from schedules.layout import Layout, layout_of
from schedules.memory import stage_memory_bytes
from schedules.moe import expert_data_parallel, expert_params_per_gpu, mean_hottest, with_hottest
from schedules.offload import Offload, RankOffload, rank_offload
from schedules.optimizer_states import gather_bytes
from schedules.params import (
    layer_params_per_gpu,
    moe_layer_params_per_gpu,
    mtp_moe_layers,
    stage_expert_params_per_gpu,
    stage_layer_params_per_gpu,
    stage_params_per_gpu,
    vstage_moe_layers,
)
from schedules.plan import Plan, num_microbatches
from schedules.stages import chunk_first_layer, chunk_layers


@dataclass(frozen=True, kw_only=True, slots=True)
class ChunkDescription:
    """One model chunk (virtual pipeline stage) on one GPU of its pipeline stage."""

    chunk: int
    """Index among the stage's ``vpp`` chunks."""
    vstage: int
    """Position in the whole model: ``chunk * pp + stage``."""
    num_layers: int
    """Transformer layers in the chunk."""
    num_moe_layers: int
    """Of which mixture-of-experts layers."""
    moe_hottest: float | None = None
    """The mean busiest-expert factor of its MoE layers where the what-if sets it per layer
    (``schedules.moe.mean_hottest``); None: the model's."""
    first: bool
    """Holds the embedding (the model's first chunk)."""
    last: bool
    """Holds the final norm, LM head and loss (the model's last chunk)."""
    params: float
    """Parameters on one GPU (embedding on the first, head on the last)."""
    expert_params: float
    """Of which routed-expert parameters."""
    gather_bytes: float
    """Bytes of its parameter all-gather (``schedules.optimizer_states.gather_bytes``: bf16,
    the layers' weights FP8 with ``fp8_param_gather``)."""
    expert_gather_bytes: float
    """Of which routed experts' (gathered over ``edp``)."""
    grad_buckets: tuple[tuple[float, str], ...]
    """(bytes, group) of its gradient buckets in ready order: dense ones reduce over ``dp``,
    routed experts' over ``edp``."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StageDescription:
    """One pipeline stage: what each of its GPUs holds and updates."""

    stage: int
    """Pipeline rank."""
    params: float
    """Parameters on one GPU of the stage."""
    optimizer_params: float
    """Parameters its optimizer updates: all of them when states are replicated, else its
    shard (routed experts over the expert-data-parallel group, the rest over the replica
    group)."""
    tied_embedding_grad_bytes: float
    """Word-embedding gradient bytes the first and last stage all-reduce (tied embeddings
    under PP: Megatron keeps a copy on the last stage and sums the two gradients)."""
    memory: dict[str, float]
    """Peak bytes per memory component on one GPU (``schedules.memory``), and ``total``."""
    offload: RankOffload | None
    """Its ranks' host copies and CPU step (None: nothing offloaded)."""
    chunks: tuple[ChunkDescription, ...]
    """Its model chunks, ``vpp`` of them."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StepDescription:
    """A resolved plan's step: layout, data-parallel kind, stages and chunks."""

    plan: Plan
    """The resolved plan it describes."""
    kind: DataParallelKind
    """The plan's data-parallel kind."""
    layout: Layout
    """Rank layout (tp-cp-dp-pp order) and its process groups."""
    gpus_per_node: int
    """GPUs per server (sizes HSDP's node-wide shard group)."""
    num_microbatches: int
    """Micro-batches per step and data-parallel rank."""
    replica_group_size: int
    """GPUs the kind shards its states over."""
    reduce_bytes_per_param: float
    """Bytes per element of the data-parallel gradient reduction."""
    grad_norm_group: str
    """Group of the step-end gradient-norm all-reduce: ``world`` when gradients or optimizer
    are sharded, ``mp`` for replicated ones under PP, "" for none."""
    offload: Offload | None
    """The plan's offload settings (None: nothing offloaded)."""
    stages: tuple[StageDescription, ...]
    """Every pipeline stage, in order."""

    @property
    def memory(self) -> dict[str, float]:
        """Peak bytes per component on the GPU of the worst stage."""
        return dict(max((s.memory for s in self.stages), key=lambda memory: memory["total"]))


def chunk_layer_params(plan: Plan, stage: int, chunk: int) -> float:
    """Parameters of one model chunk's transformer layers on one GPU."""
    p = plan.parallel.pp
    per_layer = layer_params_per_gpu(plan.model, plan.parallel.tp)
    moe_extra = moe_layer_params_per_gpu(plan.model, plan.parallel) - per_layer
    layers = chunk_layers(plan.parallel, plan.model.num_layers)[chunk * p + stage]
    moe = moe_extra * vstage_moe_layers(plan, chunk * p + stage) if plan.model.num_experts else 0.0
    return layers * per_layer + moe


def chunk_params(plan: Plan, stage: int, chunk: int) -> float:
    """Parameters of one model chunk on one GPU (embedding on the first, head on the last)."""
    p, v = plan.parallel.pp, plan.parallel.vpp
    extra = stage_params_per_gpu(plan, stage) - stage_layer_params_per_gpu(plan, stage)
    owns_extra = (stage == 0 and chunk == 0) or (stage == p - 1 and chunk == v - 1)
    return chunk_layer_params(plan, stage, chunk) + (extra if owns_extra else 0.0)


def chunk_expert_params(plan: Plan, stage: int, chunk: int) -> float:
    """Routed-expert parameters of one model chunk on one GPU (the last chunk's with its
    multi-token-prediction depths')."""
    p, v = plan.parallel.pp, plan.parallel.vpp
    layers = vstage_moe_layers(plan, chunk * p + stage)
    if stage == p - 1 and chunk == v - 1:
        layers += mtp_moe_layers(plan.model)
    return layers * expert_params_per_gpu(plan.model, plan.parallel)


def grouped_grad_buckets(plan: Plan, stage: int, chunk: int) -> tuple[tuple[float, str], ...]:
    """(bytes, group) of a chunk's gradient buckets in ready order: the dense parameters' on
    ``dp`` and, for MoE models, the routed experts' on ``edp`` (Megatron keeps them in separate
    buffers, each bucketed, both filling as the backward runs: merged by their fill fraction)."""
    kind = data_parallel_kind(plan.parallel)
    per_param = kind.grad_bytes(plan.parallel)
    expert = chunk_expert_params(plan, stage, chunk) * per_param
    dense = chunk_params(plan, stage, chunk) * per_param - expert
    parts = [(_kind_buckets(plan, stage, chunk, dense), "dp")]
    if expert > 0:
        parts.append((_kind_buckets(plan, stage, chunk, expert), "edp"))
    tagged = [
        (sum(sizes[: i + 1]) / (sum(sizes) or 1.0), size, group)
        for sizes, group in parts
        for i, size in enumerate(sizes)
    ]
    return tuple((size, group) for _, size, group in sorted(tagged, key=lambda t: t[0]))


def _kind_buckets(plan: Plan, stage: int, chunk: int, total: float) -> tuple[float, ...]:
    """``total`` gradient bytes of a chunk split as the plan's framework buckets them."""
    buckets = data_parallel_kind(plan.parallel).buckets
    return (total,) if buckets is None else buckets(plan.parallel, stage, chunk, total)


def tied_embedding_grad_bytes(plan: Plan, stage: int) -> float:
    """Word-embedding gradient bytes the first and last stage all-reduce (tied embeddings or
    multi-token prediction under PP: Megatron keeps a copy on the last stage and sums the two
    gradients before the step)."""
    model, parallel = plan.model, plan.parallel
    shared = model.tied_embeddings or model.mtp_num_layers > 0
    if not shared or parallel.pp == 1 or stage not in (0, parallel.pp - 1):
        return 0.0
    params = model.vocab_size * model.hidden_size / parallel.tp
    return params * data_parallel_kind(parallel).grad_bytes(parallel)


def optimizer_params(plan: Plan, stage: int, replica_group_size: int) -> float:
    """Parameters one GPU of ``stage`` updates: all of its stage's when the kind replicates
    the optimizer, else its shard (routed experts sharded over the expert-data-parallel group,
    the rest over the replica group)."""
    params = stage_params_per_gpu(plan, stage)
    if not data_parallel_kind(plan.parallel).sharded_states:
        return params
    experts = stage_expert_params_per_gpu(plan, stage)
    dense = (params - experts) / replica_group_size
    return dense + (experts / expert_data_parallel(plan.parallel) if experts else 0.0)


def grad_norm_group(plan: Plan) -> str:
    """Group of the step-end gradient-norm all-reduce: none for replicated gradients without PP;
    Megatron's model-parallel group (TP x PP) for replicated ones under PP; everyone when the
    gradients are sharded over data parallelism (distributed optimizer, ZeRO, FSDP)."""
    sharded = data_parallel_kind(plan.parallel).shards_gradients_or_optimizer
    if sharded and plan.parallel.dp * plan.parallel.cp > 1:
        return "world"
    return "mp" if plan.parallel.pp > 1 else ""


def _chunk(plan: Plan, stage: int, chunk: int) -> ChunkDescription:
    p, v = plan.parallel.pp, plan.parallel.vpp
    vstage = chunk * p + stage
    params, experts = chunk_params(plan, stage, chunk), chunk_expert_params(plan, stage, chunk)
    return ChunkDescription(
        chunk=chunk,
        vstage=vstage,
        num_layers=chunk_layers(plan.parallel, plan.model.num_layers)[vstage],
        num_moe_layers=vstage_moe_layers(plan, vstage),
        moe_hottest=mean_hottest(plan, _chunk_layer_indices(plan, vstage)),
        first=vstage == 0,
        last=vstage == p * v - 1,
        params=params,
        expert_params=experts,
        gather_bytes=gather_bytes(plan, params, chunk_layer_params(plan, stage, chunk)),
        expert_gather_bytes=gather_bytes(plan, experts, experts),
        grad_buckets=grouped_grad_buckets(plan, stage, chunk),
    )


def _chunk_layer_indices(plan: Plan, vstage: int) -> range:
    first = chunk_first_layer(plan.parallel, plan.model.num_layers, vstage)
    return range(first, first + chunk_layers(plan.parallel, plan.model.num_layers)[vstage])


def _stage_plan(plan: Plan, stage: int) -> Plan:
    """The plan as pipeline rank ``stage`` holds it: its MoE layers at their mean busiest-expert
    factor where the what-if sets it per layer (its memory)."""
    p = plan.parallel.pp
    layers = [
        i for c in range(plan.parallel.vpp) for i in _chunk_layer_indices(plan, c * p + stage)
    ]
    return with_hottest(plan, mean_hottest(plan, layers))


def describe_step(plan: Plan, *, gpus_per_node: int) -> StepDescription:
    """The step of a resolved plan on servers of ``gpus_per_node`` GPUs."""
    kind = data_parallel_kind(plan.parallel)
    replicas = kind.replica_group_size(plan, gpus_per_node)
    num_micro = num_microbatches(plan)
    reduce_bytes = kind.reduce_bytes_per_param(plan.parallel)
    offload = offload_of(plan.parallel)
    stages = []
    for stage in range(plan.parallel.pp):
        params = stage_params_per_gpu(plan, stage)
        stages.append(
            StageDescription(
                stage=stage,
                params=params,
                optimizer_params=optimizer_params(plan, stage, replicas),
                tied_embedding_grad_bytes=tied_embedding_grad_bytes(plan, stage),
                memory=stage_memory_bytes(
                    _stage_plan(plan, stage), stage, gpus_per_node=gpus_per_node
                ),
                offload=rank_offload(
                    offload,
                    params=params,
                    shards=replicas,
                    num_micro=num_micro,
                    grad_bytes=reduce_bytes,
                ),
                chunks=tuple(_chunk(plan, stage, c) for c in range(plan.parallel.vpp)),
            )
        )
    return StepDescription(
        plan=plan,
        kind=kind,
        layout=layout_of(plan),
        gpus_per_node=gpus_per_node,
        num_microbatches=num_micro,
        replica_group_size=replicas,
        reduce_bytes_per_param=reduce_bytes,
        grad_norm_group=grad_norm_group(plan),
        offload=offload,
        stages=tuple(stages),
    )
