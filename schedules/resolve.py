"""Resolving a plan on its world: cross-field checks, then ``dp`` filled in (``resolve_plan``).

Each check raises a ``ValueError`` that prints every value involved, so a user sees at once which
degree, batch or model dimension to change.

    plan = resolve_plan(load_plan("plan.yaml"), world_size=256)
"""

from __future__ import annotations

import dataclasses

from schedules.context_parallel import check_context_parallel
from schedules.data_parallel.registry import (
    check_data_parallel,
    check_offload,
    data_parallel_kind,
    kinds_where,
)
from schedules.float8 import check_float8
from schedules.kernels import kernel_stack, torch_async_tp, torch_ddp_step
from schedules.pipeline_schedules import pipeline_schedule
from schedules.pipeline_schedules.a2a_overlap import check_combined
from schedules.plan import FSDP2_ALIAS, ModelConfig, ParallelConfig, Plan
from schedules.recompute_modules import check_recompute_modules
from schedules.stages import check_stage_split


def _degrees(parallel: ParallelConfig, dp: int | None = None) -> str:
    dp_text = "" if dp is None else f", dp={dp}"
    return f"tp={parallel.tp}, cp={parallel.cp}, pp={parallel.pp}{dp_text}"


def resolve_dp(parallel: ParallelConfig, world_size: int) -> int:
    """The data-parallel degree: given and checked, or derived as world / (tp*cp*pp)."""
    model_parallel = parallel.model_parallel_size
    if parallel.dp == 0:
        if world_size % model_parallel:
            raise ValueError(
                f"world size {world_size} is not divisible by tp*cp*pp = {model_parallel} "
                f"({_degrees(parallel)})"
            )
        return world_size // model_parallel
    if model_parallel * parallel.dp != world_size:
        raise ValueError(
            f"world size {world_size} != tp*cp*pp*dp = {model_parallel * parallel.dp} "
            f"({_degrees(parallel, parallel.dp)})"
        )
    return parallel.dp


def check_model_split(model: ModelConfig, parallel: ParallelConfig) -> None:
    """Heads, kv heads and ffn split over tp; layers over pp*vpp; the sequence over cp (and tp)."""
    t = parallel.tp
    checks = (
        ("model.num_heads", model.num_heads, "tp", t),
        ("model.num_kv_heads", model.num_kv_heads, "tp", t),
        ("model.ffn_hidden_size", model.ffn_hidden_size, "tp", t),
    )
    check_stage_split(parallel, model.num_layers)
    for key, value, divisor_name, divisor in checks:
        if value % divisor:
            raise ValueError(
                f"{key}={value} is not divisible by {divisor_name}={divisor} "
                f"(tp={t}, pp={parallel.pp}, vpp={parallel.vpp})"
            )
    # Megatron's load-balanced causal CP splits the sequence into 2*cp chunks.
    cp_chunks = 2 * parallel.cp if parallel.cp > 1 else 1
    if model.seq_len % cp_chunks:
        raise ValueError(
            f"model.seq_len={model.seq_len} is not divisible by 2*cp={cp_chunks} (cp={parallel.cp})"
        )
    if parallel.sequence_parallel and (model.seq_len // parallel.cp) % t:
        raise ValueError(
            f"with sequence_parallel, seq_len/cp = {model.seq_len}/{parallel.cp} must be "
            f"divisible by tp={t}"
        )


def check_experts(model: ModelConfig, parallel: ParallelConfig, dp: int) -> None:
    """Expert parallelism fits the experts and the GPUs: ep divides E, etp x ep divides
    tp cp dp (Megatron-Core's expert grid), etp divides the expert width; sequence parallelism
    with TP (Megatron asserts it); no ep, etp or dispatcher on a dense model."""
    etp = parallel.expert_tp
    if not model.num_experts:
        if parallel.ep > 1 or parallel.etp or parallel.moe_token_dispatcher != "alltoall":
            raise ValueError(
                f"parallel.ep={parallel.ep}, etp={parallel.etp} and moe_token_dispatcher need an "
                "MoE model (model.num_experts > 0)"
            )
        return
    if parallel.recompute == "op":
        raise ValueError(
            "parallel.recompute='op' (torchtitan's per-op policy) is modelled for dense layers; "
            f"an MoE model (num_experts={model.num_experts}) needs none, selective or full"
        )
    if not data_parallel_kind(parallel).moe:
        raise ValueError(
            f"MoE plans are simulated with data_parallel {' | '.join(moe_kinds())}, got "
            f"data_parallel={parallel.data_parallel!r}"
        )
    if model.num_experts % parallel.ep:
        raise ValueError(
            f"model.num_experts={model.num_experts} is not divisible by parallel.ep={parallel.ep}"
        )
    stage_gpus = parallel.tp * parallel.cp * dp
    if stage_gpus % (parallel.ep * etp):
        raise ValueError(
            f"ep * etp = {parallel.ep} * {etp} must divide tp * cp * dp = {stage_gpus} "
            f"({_degrees(parallel, dp)})"
        )
    width = model.moe_ffn_hidden_size or model.ffn_hidden_size
    if width % etp or model.moe_shared_expert_ffn_hidden_size % parallel.tp:
        raise ValueError(
            f"the expert width {width} must be divisible by etp={etp} and the shared-expert "
            f"width {model.moe_shared_expert_ffn_hidden_size} by tp={parallel.tp}"
        )
    if parallel.tp > 1 and not parallel.sequence_parallel:
        raise ValueError(
            f"MoE with tp={parallel.tp} needs sequence_parallel (Megatron-Core asserts it: the "
            "dispatcher routes each TP rank's sequence shard)"
        )


def moe_kinds() -> tuple[str, ...]:
    """The ``data_parallel`` values MoE plans run with, FSDP as the FSDP2 it runs as."""
    return tuple(FSDP2_ALIAS if kind == "fsdp" else kind for kind in kinds_where("moe"))


def torchtitan_experts(plan: Plan) -> Plan:
    """An MoE plan under torch FSDP with expert parallelism and no ``etp``: torchtitan's experts
    are not tensor-parallel unless told so (its ``expert_tensor_parallel_degree`` defaults to 1),
    where Megatron's default is etp = tp."""
    parallel = plan.parallel
    fsdp = data_parallel_kind(parallel).torch_fsdp
    if plan.model.num_experts and parallel.ep > 1 and not parallel.etp and fsdp:
        return dataclasses.replace(plan, parallel=dataclasses.replace(parallel, etp=1))
    return plan


def check_fsdp_experts(plan: Plan) -> None:
    """MoE under torch FSDP is simulated as torchtitan shards it (``apply_fsdp``): FSDP2 units
    (under pipelining too), without CPU offload or float8 all-gathers; the experts either whole
    (etp 1, its default under expert parallelism) or split like the rest of the layer (etp = tp,
    which ep = 1 needs, so that one shard group gathers the whole layer)."""
    parallel = plan.parallel
    if not plan.model.num_experts or not data_parallel_kind(parallel).torch_fsdp:
        return
    what = f"an MoE model (num_experts={plan.model.num_experts}) with data_parallel fsdp"
    if not parallel.fsdp2:
        raise ValueError(
            f"{what} is simulated as torchtitan's FSDP2 (fully_shard) units: set "
            f"data_parallel: fsdp2 (got fsdp_version={parallel.fsdp_version or 'unset'}, FSDP1 "
            "without pipelining)"
        )
    if parallel.offload_param != "none":
        raise ValueError(
            f"{what} is simulated without CPU offload, got offload_param={parallel.offload_param!r}"
        )
    if plan.training.float8_all_gather:
        raise ValueError(
            f"{what} is simulated with bf16 all-gathers: set training.float8_all_gather false"
        )
    if parallel.expert_tp not in (1, parallel.tp):
        raise ValueError(
            f"{what} runs its experts whole or split like the rest of the layer (torchtitan's "
            f"expert_tensor_parallel_degree 1 or tp): etp={parallel.expert_tp} must be 1 or "
            f"tp={parallel.tp}"
        )
    if parallel.ep == 1 and parallel.expert_tp != parallel.tp:
        raise ValueError(
            f"{what} and ep=1 needs the experts split like the rest of the layer: "
            f"etp={parallel.expert_tp} must equal tp={parallel.tp}"
        )


MAX_MICROBATCHES = 65_536
"""Most micro-batches one step may have (published runs use up to a few thousand)."""


def check_schedule(parallel: ParallelConfig, num_micro: int) -> None:
    """At most ``MAX_MICROBATCHES`` micro-batches per step, then the schedule's own checks
    (``schedules.pipeline_schedules``: vpp > 1 only with the interleaved schedule, which needs
    pp > 1 and m % pp == 0)."""
    p, v = parallel.pp, parallel.vpp
    if num_micro > MAX_MICROBATCHES:
        raise ValueError(
            f"{num_micro:,} micro-batches per step (global_batch_size / (micro_batch_size * dp)); "
            f"at most {MAX_MICROBATCHES:,} are simulated: raise micro_batch_size or check the "
            "global batch"
        )
    pipeline_schedule(parallel.schedule).check(pp=p, vpp=v, num_micro=num_micro)


MAX_LAYER_PASSES = 1 << 17
"""Most micro-batch x layer passes one step may have (each a forward and a backward of one
layer on its pipeline stage): 2x the largest published run (Megatron's 1T model: 512
micro-batches x 128 layers = 65,536). Past it the step's description alone takes gigabytes."""


def check_step_size(model: ModelConfig, num_micro: int) -> None:
    """A step small enough to describe: at most ``MAX_LAYER_PASSES`` micro-batch x layer
    passes, refused before anything is built."""
    passes = num_micro * model.num_layers
    if passes > MAX_LAYER_PASSES:
        raise ValueError(
            f"{num_micro:,} micro-batches x {model.num_layers:,} layers = {passes:,} layer passes "
            f"per step; at most {MAX_LAYER_PASSES:,} are simulated (the largest published run "
            "has 65,536): raise micro_batch_size or check the model"
        )


def check_knobs(parallel: ParallelConfig, dp: int) -> None:
    """The data-parallel kind's knobs and checks (``schedules.data_parallel``), tensor-parallel
    overlap and sequence parallelism, offload."""
    check_data_parallel(parallel, dp)
    if parallel.tp_comm_overlap and not (parallel.sequence_parallel and parallel.tp > 1):
        raise ValueError(
            f"parallel.tp_comm_overlap needs sequence_parallel and tp > 1, got "
            f"sequence_parallel={parallel.sequence_parallel}, tp={parallel.tp}"
        )
    if parallel.sequence_parallel and parallel.tp == 1:
        raise ValueError("parallel.sequence_parallel needs tp > 1, got tp=1")
    kind = data_parallel_kind(parallel)
    if parallel.recompute_num_layers is not None and kind.gathers_units:
        raise ValueError(
            f"parallel.recompute_num_layers={parallel.recompute_num_layers} is Megatron's block "
            f"recompute, modelled for pipelined layer chunks, not data_parallel {kind.name} "
            "(it recomputes every layer or none)"
        )
    check_offload(parallel)


def check_async_tp(plan: Plan) -> None:
    """``tp_comm_overlap`` off the Megatron stack is PyTorch's asynchronous TP, an Inductor
    pass: it needs ``torch.compile`` (torchtitan refuses it otherwise), and its fusion of a
    parallel block's summed outputs is not modelled."""
    stack = kernel_stack(plan)
    if not torch_async_tp(plan):
        return
    if stack != "compile":
        raise ValueError(
            f"parallel.tp_comm_overlap on stack {stack} is PyTorch's asynchronous TP, which "
            "needs torch.compile (training.stack: compile; Megatron's overlap: megatron)"
        )
    if plan.model.parallel_block:
        raise ValueError(
            "model.parallel_block with parallel.tp_comm_overlap on stack compile: asynchronous "
            "TP over a parallel block (its reduce-scatter takes a sum, not one matmul) is not "
            "modelled"
        )


def check_latent_attention(plan: Plan) -> None:
    """Multi-head latent attention is modelled as Megatron-Core runs it (and, on the PyTorch
    stacks, as torchtitan's DeepSeek-V3 places it): not under context parallelism, torchtitan's
    per-op recompute policy (its order of saved matmuls is the Llama block's) or TP
    communication overlap (Megatron-Core's ``TELinear`` turns it off for the latent linears'
    buffers, ``extensions/transformer_engine.py``; PyTorch's asynchronous TP is not modelled)."""
    model, parallel = plan.model, plan.parallel
    if not model.multi_latent:
        return
    if parallel.cp > 1:
        raise ValueError(
            f"parallel.cp={parallel.cp} with model.kv_lora_rank: context parallelism over "
            "multi-head latent attention is not modelled"
        )
    if parallel.recompute == "op":
        raise ValueError(
            "parallel.recompute=op with model.kv_lora_rank: torchtitan's per-op policy over "
            "multi-head latent attention is not modelled (use selective or full)"
        )
    if parallel.tp_comm_overlap:
        raise ValueError(
            "parallel.tp_comm_overlap with model.kv_lora_rank: Megatron-Core turns TP "
            "communication overlap off for latent attention's linears (and, the config being "
            "shared, for the whole model); PyTorch's asynchronous TP over it is not modelled"
        )


def check_mtp(plan: Plan) -> None:
    """Multi-token prediction (``model.mtp_num_layers``) is Megatron-Core's: the megatron stack,
    over a data-parallel kind that keeps whole layers (DDP, the distributed optimizer, ZeRO 1
    and 2), not the kinds that gather units of parameters."""
    depths = plan.model.mtp_num_layers
    if not depths:
        return
    stack = kernel_stack(plan)
    if stack != "megatron":
        raise ValueError(
            f"model.mtp_num_layers={depths} on stack {stack}: multi-token prediction is "
            "modelled as Megatron-Core trains it (training.stack: megatron)"
        )
    kind = data_parallel_kind(plan.parallel)
    if kind.gathers_units:
        raise ValueError(
            f"model.mtp_num_layers={depths} with data_parallel {kind.name}: multi-token "
            "prediction under parameter-gathering data parallelism is not modelled"
        )
    if plan.parallel.tp_comm_overlap:
        raise ValueError(
            f"parallel.tp_comm_overlap with model.mtp_num_layers={depths}: Megatron-Core's "
            "TELinear turns TP communication overlap off for eh_proj's buffer and, the config "
            "being shared, for every layer built after it"
        )


def check_flex_dispatcher(plan: Plan) -> None:
    """The flex dispatcher (DeepEP) is Megatron-Core's, over expert parallelism (ep > 1)."""
    parallel = plan.parallel
    if parallel.moe_token_dispatcher != "flex":
        return
    stack = kernel_stack(plan)
    if stack != "megatron" or parallel.ep < 2:
        raise ValueError(
            f"parallel.moe_token_dispatcher flex (DeepEP) is Megatron-Core's over expert "
            f"parallelism: it needs stack megatron and ep > 1, got stack {stack}, ep={parallel.ep}"
        )
    kind = data_parallel_kind(parallel)
    refused = (
        (parallel.expert_tp > 1, f"etp={parallel.expert_tp} (its dispatch spans TP x EP)"),
        (plan.model.moe_capacity_factor is not None, "a capacity factor (Megatron refuses it)"),
        (kind.gathers_units, f"data_parallel {kind.name}"),
    )
    for hit, what in refused:
        if hit:
            raise ValueError(f"parallel.moe_token_dispatcher flex with {what} is not modelled")


def check_a2a_overlap(plan: Plan) -> None:
    """``overlap_moe_expert_parallel_comm`` where Megatron-Core runs it (``transformer_config.py``
    asserts the same): an MoE model with ep > 1 and the alltoall dispatcher, no full recompute
    (nor recompute by layer count), at most one multi-token-prediction depth, no pipelining or
    the interleaved schedule with virtual stages, the megatron stack over a data-parallel kind
    that keeps whole layers, no CUDA graphs over the MoE layers."""
    parallel, model = plan.parallel, plan.model
    if parallel.delay_wgrad_compute and not parallel.overlap_moe_expert_parallel_comm:
        raise ValueError(
            "parallel.delay_wgrad_compute needs overlap_moe_expert_parallel_comm (Megatron-Core "
            "asserts it: the weight gradients are delayed inside its combined passes)"
        )
    if not parallel.overlap_moe_expert_parallel_comm:
        return
    name = "parallel.overlap_moe_expert_parallel_comm"
    if not model.num_experts or parallel.ep < 2:
        raise ValueError(
            f"{name} hides expert-parallel all-to-alls: it needs an MoE model with ep > 1, got "
            f"num_experts={model.num_experts}, ep={parallel.ep}"
        )
    if parallel.moe_token_dispatcher not in ("alltoall", "flex"):
        raise ValueError(
            f"{name} with moe_token_dispatcher {parallel.moe_token_dispatcher}: Megatron-Core "
            "overlaps the alltoall and flex dispatchers' all-to-alls only"
        )
    if parallel.recompute == "full" or parallel.recompute_num_layers is not None:
        raise ValueError(
            f"{name} with recompute {parallel.recompute}: Megatron-Core refuses full "
            "recomputation (and recompute by layer count) with it"
        )
    if model.mtp_num_layers > 1:
        raise ValueError(
            f"{name} with model.mtp_num_layers={model.mtp_num_layers}: Megatron-Core supports "
            "at most one multi-token-prediction depth with it"
        )
    check_combined(schedule=parallel.schedule, pp=parallel.pp, vpp=parallel.vpp)
    stack = kernel_stack(plan)
    if stack != "megatron":
        raise ValueError(f"{name} is Megatron-Core's; stack {stack} has no such schedule")
    kind = data_parallel_kind(parallel)
    if kind.gathers_units:
        raise ValueError(f"{name} with data_parallel {kind.name} is not modelled")
    if plan.training.cuda_graphs:
        raise ValueError(
            f"{name} with training.cuda_graphs: Megatron-Core does not capture the MoE layers "
            "it splits (graph whole layers without it)"
        )


def check_mixed_precision(plan: Plan) -> None:
    """``training.mixed_precision`` describes a torch DDP (or one-GPU) loop's weights only."""
    choice = plan.training.mixed_precision
    if choice is not None and not torch_ddp_step(plan):
        raise ValueError(
            f"training.mixed_precision={choice} describes a torch DDP loop's weights; "
            f"data_parallel {plan.parallel.data_parallel} on stack {kernel_stack(plan)} keeps "
            "its own"
        )


def check_fp8_param_gather(plan: Plan) -> None:
    """``training.fp8_param_gather`` is Megatron's FP8 weights, which its distributed optimizer
    gathers and updates (``--fp8-param-gather only supported with distributed optimizer``, of
    the kinds modelled here), on the megatron stack."""
    if not plan.training.fp8_param_gather:
        return
    stack, kind = kernel_stack(plan), data_parallel_kind(plan.parallel)
    if stack != "megatron" or kind.name != "distributed_optimizer":
        raise ValueError(
            f"training.fp8_param_gather needs data_parallel distributed_optimizer on stack "
            f"megatron (Megatron's FP8 weights), got data_parallel {kind.name} on stack {stack}"
        )
    parallel = plan.parallel
    if not parallel.use_precision_aware_optimizer:
        return
    delayed = (plan.training.te_fp8_recipe or "delayed") == "delayed"
    fused = parallel.exp_avg_dtype == parallel.exp_avg_sq_dtype == "bf16"
    if delayed and (parallel.main_params_dtype == "fp32" or fused):
        raise ValueError(
            "training.fp8_param_gather under delayed scaling with "
            "parallel.use_precision_aware_optimizer and fp32 masters or a bf16 pair of moments: "
            "Transformer Engine's Adam over FP8 weights (multi_tensor_adam_fp8) takes fp32 "
            "moments and masters, where these keep a 16-bit remainder or bf16 moments unscaled"
        )
    if not delayed and parallel.main_params_dtype != "fp32":
        raise ValueError(
            "training.fp8_param_gather under current scaling with "
            f"parallel.main_params_dtype={parallel.main_params_dtype}: Megatron's distributed "
            "optimizer makes no shards of such FP8 weights for Transformer Engine's Adam "
            "(shard_model_param is None), only fp32 masters of its own"
        )


def resolve_plan(plan: Plan, world_size: int) -> Plan:
    """The plan with ``dp`` filled in, after checking every constraint against ``world_size``."""
    if world_size <= 0:
        raise ValueError(f"world size must be > 0, got {world_size}")
    plan = torchtitan_experts(plan)
    parallel = plan.parallel
    dp = resolve_dp(parallel, world_size)
    check_model_split(plan.model, parallel)
    training = plan.training
    per_step = training.micro_batch_size * dp
    if training.global_batch_size % per_step:
        raise ValueError(
            f"training.global_batch_size={training.global_batch_size} is not divisible by "
            f"micro_batch_size*dp = {training.micro_batch_size}*{dp} = {per_step}"
        )
    check_schedule(parallel, training.global_batch_size // per_step)
    check_step_size(plan.model, training.global_batch_size // per_step)
    check_knobs(parallel, dp)
    check_experts(plan.model, parallel, dp)
    check_fsdp_experts(plan)
    check_context_parallel(plan)
    check_async_tp(plan)
    check_latent_attention(plan)
    check_recompute_modules(plan)
    check_mtp(plan)
    check_flex_dispatcher(plan)
    check_a2a_overlap(plan)
    check_float8(plan)
    check_fp8_param_gather(plan)
    check_mixed_precision(plan)
    return dataclasses.replace(plan, parallel=dataclasses.replace(parallel, dp=dp))
