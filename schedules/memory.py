"""Peak memory per GPU of a plan: weights, gradients, optimizer state, activations, buffers.

Mixed-precision Adam (Rajbhandari et al. 2020, ZeRO, Sec. 3.1): 2 bytes of bf16/fp16 weights,
2 bytes of gradients (4 for Megatron's fp32 main grads under ``distributed_optimizer``) and 12
bytes of optimizer state (fp32 master weights, momentum, variance) per parameter: 16 bytes in all.
Each data-parallel kind shards some of it over the D GPUs that hold replicas of the same weights
(D = dp * cp: context-parallel ranks hold the same weights and join the gradient reduction):

    ddp                     nothing sharded                         2 + 2 + 12       = 16
    zero1                   optimizer state                         2 + 2 + 12/D
    zero2                   optimizer state and gradients           2 + (2 + 12)/D
    zero3, fsdp             everything                              (2 + 2 + 12)/D
    hsdp                    everything, over the shard group S      (2 + 2 + 12)/S
    distributed_optimizer   optimizer state (Megatron docs: 6+12/D) 2 + 4 + 12/D

Activations: the per-layer bytes of ``schedules.activations`` times the layer-micro-batches the
stage holds at its peak under its schedule, plus the last stage's head inputs. Transient buffers:
FSDP/ZeRO-3 unsharded units in flight (2 layers' parameters and 1 layer's gradient), torch DDP's
bucket copy of the gradients (``gradient_as_bucket_view=False``), DeepSpeed ZeRO-1/2 gradient
buckets (``reduce_bucket_size`` elements, two when ``overlap_comm``) and the last stage's fp32
logits. ``fsdp_unsharded``: FSDP/HSDP/ZeRO-3 under pipelining (torch.distributed.pipelining,
torch 2.13) keeps the whole stage unsharded through the step: its parameters stay gathered from
the first forward (``reshard_after_forward`` False; with True they are still all resident after
each backward, since backward never reshards before the stage's ``REDUCE_GRAD``) and its
gradients accumulate unsharded (gradient sync off) until that final reduce-scatter.
Not modelled: the CUDA context, NCCL buffers and allocator fragmentation (a few GiB).
The worst pipeline stage (largest total) is reported.

    memory = memory_per_gpu(plan, hbm_bytes=80e9)
"""

from __future__ import annotations

from schedules.activations import (
    ACTIVATION_BYTES,
    LOGITS_BYTES_PER_ELEMENT,
    head_activation_bytes,
    layer_activation_bytes,
    logits_bytes,
    stored_layer_activations,
)
from schedules.kernels import kernel_stack
from schedules.messages import PARAM_BYTES, grad_bytes_per_param
from schedules.moe import expert_data_parallel, moe_activation_bytes
from schedules.offload import gpu_offload_buffer_bytes, gpu_state_bytes_per_param
from schedules.params import (
    embedding_params_per_gpu,
    layer_params_per_gpu,
    layers_per_stage,
    stage_expert_params_per_gpu,
    stage_moe_layers,
    stage_params_per_gpu,
)
from schedules.plan import Plan, num_microbatches
from schedules.zero3_units import zero3_runtime_bytes

FSDP_KINDS = ("fsdp", "hsdp", "zero3")
"""Data-parallel kinds that shard parameters and gather them unit by unit."""
OPTIMIZER_BYTES_PER_PARAM = 12
"""Adam: fp32 master weights, momentum and variance (ZeRO paper, Sec. 3.1: K = 12)."""
COMPONENTS = (
    "weights",
    "gradients",
    "optimizer",
    "activations",
    "buffers",
    "fsdp_unsharded",
    "logits",
    "fp8_weights",
)
"""Keys of ``memory_per_gpu`` besides ``total``."""


def replica_group_size(plan: Plan, *, gpus_per_node: int | None = None) -> int:
    """GPUs a data-parallel kind shards its state over: dp * cp, or the HSDP shard group.

    HSDP shards inside ``hsdp_shard_size`` GPUs (0: the GPUs of a node; ``gpus_per_node`` must be
    given then, since schedules knows nothing about the hardware) and replicates across groups.
    """
    parallel = plan.parallel
    group = parallel.dp * parallel.cp
    if parallel.data_parallel != "hsdp":
        return group
    shard = parallel.hsdp_shard_size
    if shard == 0:
        if gpus_per_node is None:
            raise ValueError("hsdp with hsdp_shard_size=0 needs gpus_per_node to size its groups")
        shard = max(1, gpus_per_node // (parallel.tp * parallel.cp))
    return min(shard * parallel.cp, group)


def state_bytes_per_param(
    plan: Plan, *, gpus_per_node: int | None = None, shards: int | None = None
) -> dict[str, float]:
    """Bytes per parameter of weights, gradients and optimizer state after sharding over
    ``shards`` GPUs (default: the data-parallel kind's replica group)."""
    kind = plan.parallel.data_parallel
    if shards is None:
        shards = replica_group_size(plan, gpus_per_node=gpus_per_node)
    grad = grad_bytes_per_param(kind)
    sharded = {
        "ddp": (),
        "zero1": ("optimizer",),
        "zero2": ("optimizer", "gradients"),
        "zero3": ("optimizer", "gradients", "weights"),
        "fsdp": ("optimizer", "gradients", "weights"),
        "hsdp": ("optimizer", "gradients", "weights"),
        "distributed_optimizer": ("optimizer",),
    }[kind]
    full = {"weights": PARAM_BYTES, "gradients": grad, "optimizer": OPTIMIZER_BYTES_PER_PARAM}
    per_param = {k: v / shards if k in sharded else float(v) for k, v in full.items()}
    return gpu_state_bytes_per_param(plan.parallel, per_param)  # less what is offloaded


ZERO3_PEAK_BUFFERS = ("ipg_bucket", "reduce_scatter_copy", "live_params", "persistent_params")
"""ZeRO-3's buffers alive with the activations (its gradient partition is ``gradients``; the
fp32 copy of a sub-group's gradients exists only during the optimizer step)."""


def transient_buffer_bytes(plan: Plan, stage: int) -> float:
    """Communication buffers alive at the peak, per the data-parallel kind's implementation.

    DeepSpeed ZeRO-3: its gradient bucket, the reduce-scatter's copy of the largest bucket, the
    most parameters its prefetcher keeps gathered and the persistent (small) parameters
    (``schedules.zero3_fetch.zero3_buffer_bytes``). FSDP1: two layers' gathered parameters
    (the rate limiter's two in flight; every layer without it: the CPU runs ahead and issues
    them all) and one layer's gradients, plus their ``reduce_dtype`` copy when it differs.
    FSDP2: two all-gather outputs in flight (the current unit's copy-out and the next one's
    prefetch) and one unit's unsharded gradients with their reduce-scatter input in
    ``reduce_dtype``. Under pipelining one unit's reduce-scatter input (the rest is
    ``fsdp_unsharded``).
    """
    parallel = plan.parallel
    kind = parallel.data_parallel
    grad = grad_bytes_per_param(kind)
    if kind == "zero3" and parallel.pp == 1:
        runtime = zero3_runtime_bytes(plan, dp=replica_group_size(plan))
        return sum(runtime[k] for k in ZERO3_PEAK_BUFFERS)
    if kind in FSDP_KINDS:
        layer = layer_params_per_gpu(plan.model, parallel.tp)
        reduce = parallel.reduce_dtype_bytes if kind != "zero3" else grad
        if parallel.pp > 1:
            return layer * reduce
        grads = layer * (grad + (reduce if reduce != grad else 0))
        if kind != "zero3" and parallel.fsdp_reshard_after_forward is False:
            # SHARD_GRAD_OP keeps the whole stage unsharded between forward and backward.
            return stage_params_per_gpu(plan, stage) * PARAM_BYTES + grads
        limited = parallel.fsdp2 or parallel.fsdp_limit_all_gathers or kind == "zero3"
        gathered = 2 if limited else plan.model.num_layers
        return gathered * layer * PARAM_BYTES + grads
    if kind == "ddp":
        if parallel.ddp_gradient_as_bucket_view:
            return 0.0
        return stage_params_per_gpu(plan, stage) * grad
    if kind in ("zero1", "zero2"):
        overlap = bool(parallel.zero_overlap_comm)  # DeepSpeed default: False for stages 1, 2
        return (2 if overlap else 1) * parallel.zero_bucket_elems * grad
    return 0.0


def root_params_per_gpu(plan: Plan, stage: int) -> float:
    """Parameters of a stage outside its transformer layers: embedding, final norm, LM head."""
    layers = layers_per_stage(plan, stage) * layer_params_per_gpu(plan.model, plan.parallel.tp)
    return stage_params_per_gpu(plan, stage) - layers


def fsdp_unsharded_bytes(plan: Plan, stage: int) -> float:
    """Parameters and gradients FSDP holds unsharded beyond the per-unit buffers.

    Under pipelining (torch.distributed.pipelining, torch 2.13) the whole stage: its parameters
    stay gathered from the first forward and its gradients accumulate unsharded until the
    stage's ``REDUCE_GRAD``, in ``reduce_dtype`` (FSDP2 upcasts them while gradient sync is off:
    ``FSDPParam.to_accumulated_grad_if_needed``). Without pipelining: FSDP1's root unit
    (embedding, final norm, head) is not resharded after forward, so its parameters and their
    gradients are unsharded through the backward (+4 GiB on Llama 3 8B); FSDP2's ``[norm,
    output]`` unit likewise keeps its parameters until its backward, whose gradients then live
    with their ``reduce_dtype`` copy once ``post_backward`` has resharded the parameters.
    """
    parallel = plan.parallel
    kind = parallel.data_parallel
    if kind not in FSDP_KINDS:
        return 0.0
    if parallel.pp > 1:
        reduce = parallel.reduce_dtype_bytes if kind != "zero3" else grad_bytes_per_param(kind)
        return stage_params_per_gpu(plan, stage) * (PARAM_BYTES + reduce)
    if kind == "zero3":
        return 0.0
    root = root_params_per_gpu(plan, stage)
    if not parallel.fsdp2:
        return root * (PARAM_BYTES + grad_bytes_per_param(kind))
    head = root - min(root, embedding_params_per_gpu(plan.model, parallel.tp))
    # Parameters and bf16 gradients until post_backward reshards the parameters, then the
    # gradients and their reduce-dtype copy: never all three at once.
    grad = grad_bytes_per_param(kind)
    return head * max(PARAM_BYTES + grad, grad + parallel.reduce_dtype_bytes)


def moe_layer_extra_bytes(plan: Plan) -> float:
    """What an MoE layer stores beyond a dense layer (recompute none or selective): the expert,
    router and shared-expert terms (``schedules.moe``) instead of the dense MLP hidden; 0 under
    full recompute (only the layer input is kept)."""
    model, parallel = plan.model, plan.parallel
    if parallel.recompute == "full":
        return 0.0
    tokens = plan.training.micro_batch_size * model.seq_len / parallel.cp
    dense_hidden = (3 if model.gated_mlp else 2) * model.ffn_hidden_size / parallel.tp
    return moe_activation_bytes(plan) - ACTIVATION_BYTES * tokens * dense_hidden


def activation_bytes(plan: Plan, stage: int) -> float:
    """Activations rank ``stage`` holds at its peak under the plan's schedule and recompute."""
    model, parallel, training = plan.model, plan.parallel, plan.training
    per_layer = layer_activation_bytes(
        model,
        training.micro_batch_size,
        tp=parallel.tp,
        cp=parallel.cp,
        sequence_parallel=parallel.sequence_parallel,
        recompute=parallel.recompute,
        flash_attention=training.flash_attention,
    )
    layers = layers_per_stage(plan, stage)
    num_moe = stage_moe_layers(plan, stage)
    if num_moe:
        moe_layer = per_layer + moe_layer_extra_bytes(plan)
        per_layer = ((layers - num_moe) * per_layer + num_moe * moe_layer) / layers
    num_micro = num_microbatches(plan)
    stored = stored_layer_activations(
        parallel.schedule,
        pp=parallel.pp,
        vpp=parallel.vpp,
        stage=stage,
        num_micro=num_micro,
        stage_layers=layers_per_stage(plan, stage),
    )
    total = stored * per_layer
    if parallel.recompute in ("full", "op"):
        # The layer being recomputed holds all of its activations until its backward ends.
        total += layer_activation_bytes(
            model,
            training.micro_batch_size,
            tp=parallel.tp,
            cp=parallel.cp,
            sequence_parallel=parallel.sequence_parallel,
            recompute="none",
            flash_attention=training.flash_attention,
        ) + (max(moe_layer_extra_bytes(plan), 0.0) if num_moe else 0.0)
    if stage == parallel.pp - 1:
        head = head_activation_bytes(
            model,
            training.micro_batch_size,
            tp=parallel.tp,
            cp=parallel.cp,
            sequence_parallel=parallel.sequence_parallel,
        )
        # The head's inputs live as long as their micro-batch: one at a time except under GPipe.
        total += head * (num_micro if parallel.schedule == "gpipe" else 1)
    return total


FP8_CACHE_BYTES_PER_PARAM = 2
"""FP8 training (Transformer Engine): each linear weight is kept as an FP8 copy and its FP8
transpose between micro-batches (``is_first_microbatch`` caching), 1 byte each."""


def fp8_weight_bytes(plan: Plan, stage: int) -> float:
    """FP8 weight copies of the transformer layers' linear weights on one GPU (0 without FP8).

    The embedding and the LM head stay in bf16; norms have no GEMM. The layers' non-GEMM
    parameters are a few per million, so all layer parameters are counted.
    """
    if plan.training.precision != "fp8" or plan.parallel.data_parallel in FSDP_KINDS:
        return 0.0  # FSDP / ZeRO-3 keep no FP8 copy of weights they free after use
    layers = layers_per_stage(plan, stage) * layer_params_per_gpu(plan.model, plan.parallel.tp)
    return layers * FP8_CACHE_BYTES_PER_PARAM


def stage_memory_bytes(
    plan: Plan, stage: int, *, gpus_per_node: int | None = None
) -> dict[str, float]:
    """Bytes per component (and ``total``) on one GPU of pipeline rank ``stage``."""
    params = stage_params_per_gpu(plan, stage)
    per_param = state_bytes_per_param(plan, gpus_per_node=gpus_per_node)
    is_last = stage == plan.parallel.pp - 1
    parallel = plan.parallel
    experts = stage_expert_params_per_gpu(plan, stage)  # sharded over edp, not dp
    per_expert = state_bytes_per_param(plan, shards=expert_data_parallel(parallel))

    def states(key: str) -> float:
        return (params - experts) * per_param[key] + experts * per_expert[key]

    memory = {
        "weights": states("weights"),
        "gradients": states("gradients"),
        "optimizer": states("optimizer"),
        "activations": activation_bytes(plan, stage),
        "buffers": transient_buffer_bytes(plan, stage) + gpu_offload_buffer_bytes(plan),
        "fsdp_unsharded": fsdp_unsharded_bytes(plan, stage),
        "logits": logits_bytes(
            plan.model,
            plan.training.micro_batch_size,
            tp=parallel.tp,
            cp=parallel.cp,
            per_element=LOGITS_BYTES_PER_ELEMENT[kernel_stack(plan)],
        )
        if is_last
        else 0.0,
        "fp8_weights": fp8_weight_bytes(plan, stage),
    }
    memory["total"] = sum(memory.values())
    return memory


def memory_per_gpu(
    plan: Plan, *, hbm_bytes: float, gpus_per_node: int | None = None
) -> dict[str, float]:
    """Peak bytes per component (and ``total``) on the GPU of the worst pipeline stage.

    ``plan`` must be resolved (``resolve_plan``). ``hbm_bytes`` is the GPU's memory; it does not
    change the figures (a plan that does not fit is a result, see ``fits_in_memory``) and is
    checked here so that a missing GPU spec fails early. ``gpus_per_node`` sizes HSDP groups.
    """
    if hbm_bytes <= 0:
        raise ValueError(f"hbm_bytes must be > 0, got {hbm_bytes}")
    stages = [
        stage_memory_bytes(plan, stage, gpus_per_node=gpus_per_node)
        for stage in range(plan.parallel.pp)
    ]
    worst = max(stages, key=lambda memory: memory["total"])
    return dict(worst)


def fits_in_memory(plan: Plan, *, hbm_bytes: float, gpus_per_node: int | None = None) -> bool:
    """Whether the worst stage's peak fits in ``hbm_bytes`` of GPU memory."""
    total = memory_per_gpu(plan, hbm_bytes=hbm_bytes, gpus_per_node=gpus_per_node)["total"]
    return total <= hbm_bytes
