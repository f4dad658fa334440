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
The working set of torch's context-parallel ring in a layer's backward is a transient buffer
too (``schedules.context_parallel.ring_buffer_bytes``). A layer on the eager stack keeps a few
tensors more than the fused count (``eager_saved_bytes``).
Not modelled: the CUDA context and NCCL buffers (a few GiB). The caching allocator's reserve
above the live peak is ``ALLOCATOR_RESERVE`` of it (``reserved_bytes``).
The worst pipeline stage (largest total) is reported.

    memory = memory_per_gpu(plan, hbm_bytes=80e9)
"""

from __future__ import annotations

import dataclasses

from schedules.activations import (
    ACTIVATION_BYTES,
    COMPILED_LOSS_LOGITS_BYTES_PER_ELEMENT,
    LOGITS_BYTES_PER_ELEMENT,
    LOSS_PARALLEL_LOGITS_BYTES_PER_ELEMENT,
    MEGATRON_LOGITS_BYTES_PER_ELEMENT,
    head_activation_bytes,
    layer_activation_bytes,
    logits_bytes,
    stored_layer_activations,
)
from schedules.context_parallel import ring_buffer_bytes
from schedules.data_parallel.registry import data_parallel_kind, offload_of, replica_group_size
from schedules.kernels import (
    autocast_weights,
    composite_qk_norm,
    kernel_stack,
    norm_output_readers,
    qk_norm_elements,
    repeats_kv,
    residual_stream_elements,
    torch_ddp_step,
)
from schedules.messages import PARAM_BYTES
from schedules.mla import latent_norm_elements, latent_split
from schedules.moe import expert_data_parallel, expert_tokens, expert_width, moe_activation_bytes
from schedules.mtp import MTP_SAVED_WIDTHS, mtp_depths, mtp_layer_is_moe, mtp_projection_params
from schedules.offload import gpu_offload_buffer_bytes, gpu_state_bytes_per_param
from schedules.optimizer_states import fp8_params, optimizer_bytes_per_param
from schedules.params import (
    layer_params_per_gpu,
    layers_per_stage,
    stage_expert_params_per_gpu,
    stage_layer_params_per_gpu,
    stage_moe_layers,
    stage_params_per_gpu,
)
from schedules.pipeline_schedules import pipeline_schedule
from schedules.pipeline_schedules.a2a_overlap import COMBINED_EXTRA_LAYERS
from schedules.plan import Plan, num_microbatches
from schedules.recompute_modules import module_saved_delta, selective_modules
from schedules.stacks import loss_compiled, megatron_cross_entropy
from schedules.stages import chunk_layers, recomputed_fraction
from schedules.transformer_engine import te_recipe

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
ALLOCATOR_RESERVE = 0.06
"""What PyTorch's caching allocator holds from the device beyond the live peak
(``max_memory_reserved`` over ``max_memory_allocated``): blocks rounded up (2 MiB granules for
large tensors), freed blocks cached for reuse and split blocks that cannot be merged. Measured
with ``commbench --step`` on one H200 (torch 2.11, default allocator settings;
results/mechanisms): +6.1%, +2.1%, +4.5%, +8.3% and +9.2% on five steps of 6 to 62 GiB (Llama
1B with 1 and 4 micro-batches, GPT 2.7B, Llama 8B and 13B slices); the mean is taken.
``expandable_segments:True`` did not lower it there (+4.5% against +2.1%). "Will it fit" is
judged on the reserved figure, the one an out-of-memory error reports."""


def reserved_bytes(live_bytes: float) -> float:
    """What the caching allocator holds at a live peak of ``live_bytes``."""
    return live_bytes * (1.0 + ALLOCATOR_RESERVE)


def state_bytes_per_param(
    plan: Plan, *, gpus_per_node: int | None = None, shards: int | None = None
) -> dict[str, float]:
    """Bytes per parameter of weights, gradients and optimizer state after sharding over
    ``shards`` GPUs (default: the data-parallel kind's replica group)."""
    kind = data_parallel_kind(plan.parallel)
    if shards is None:
        shards = replica_group_size(plan, gpus_per_node=gpus_per_node)
    full = {
        "weights": PARAM_BYTES,
        "gradients": kind.grad_bytes(plan.parallel),
        "optimizer": optimizer_bytes_per_param(plan),
    }
    if autocast_weights(plan):
        full = dict(AUTOCAST_STATE_BYTES)
    sharded = kind.sharded_states
    per_param = {k: v / shards if k in sharded else float(v) for k, v in full.items()}
    # less what is offloaded
    return gpu_state_bytes_per_param(offload_of(plan.parallel), per_param)


AUTOCAST_STATE_BYTES = {"weights": 4, "gradients": 4, "optimizer": 8}
"""Bytes per parameter of a loop under ``torch.autocast`` over fp32 weights (``autocast_weights``:
``commbench --step``, nanoGPT, the Hugging Face Trainer's bf16): the weights are fp32 (they are
the master copy), their gradients fp32, and Adam keeps two fp32 moments: 16 where mixed-precision
Adam with bf16 weights keeps 2 + 2 + 12."""
AUTOCAST_CAST_CACHE_BYTES = 2
"""Bytes per parameter of autocast's bf16 weight copies alive at the forward's peak: each cast
weight is saved for its input-gradient GEMM until the backward reaches it."""


FP32_RESIDUAL_EXTRA_BYTES = 2
"""Extra bytes per element of each residual-stream tensor a layer saves under autocast over fp32
weights, whose stream is fp32 (``schedules.kernels.FP32_RESIDUAL_BYTES``): the norms' inputs
(two, one in a parallel block; the layer's input alone under full recompute) are saved at 4 bytes
where the activation count of ``schedules.activations`` has 2."""


def accumulating_gradients(plan: Plan) -> bool:
    """Whether the gradients are alive through a forward: from the second micro-batch on in a
    torch DDP (or one-GPU) step; with one micro-batch they are created in the backward as the
    activations are freed (``zero_grad(set_to_none=True)``, torch's default since 2.0)."""
    return not torch_ddp_step(plan) or num_microbatches(plan) > 1


def transient_buffer_bytes(plan: Plan, stage: int) -> float:
    """Communication buffers alive at the peak, per the data-parallel kind's implementation
    (each kind's ``transient_buffer_bytes`` in ``schedules.data_parallel``)."""
    return data_parallel_kind(plan.parallel).transient_buffer_bytes(plan, stage)


def fsdp_unsharded_bytes(plan: Plan, stage: int) -> float:
    """Parameters and gradients FSDP / ZeRO-3 hold unsharded beyond the per-unit buffers (each
    kind's ``unsharded_bytes`` in ``schedules.data_parallel``; 0 for the others)."""
    return data_parallel_kind(plan.parallel).unsharded_bytes(plan, stage)


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


COMPOSITE_QK_NORM_SAVED_BYTES = 6
"""Bytes per query and key element the composite QK norm (``schedules.kernels.EAGER_QK_NORM``)
keeps beyond the fused count's bf16 input: its fp32 copy of the input (``pow`` and the product
with the row statistics save it) and its fp32 normed output (the product with the weight saves
it), 8 bytes in all, where the fused norm keeps the 2-byte input. Counted with saved-tensor hooks
on one layer of ``commbench --step``'s model under autocast, with the norm and without (8.06
bytes per element more: the row statistics are the rest). Selective recompute keeps them (the
norms run outside the checkpointed core)."""


def eager_saved_bytes(
    plan: Plan, *, recompute: str | None = None, moe_layer: bool = False
) -> float:
    """What a layer on the eager stack keeps beyond the fused count of
    ``schedules.activations``, per micro-batch on one GPU, under ``recompute`` (the plan's by
    default); ``moe_layer``: an MoE layer's (its experts' activations instead of the MLP's).

    Counted from the tensors autograd saves for one layer (on the CPU, with saved-tensor hooks),
    against the held-out steps' peaks. The fused count keeps Q, K and V (h + 2 kd per token);
    the eager stack keeps instead what SDPA (or, under selective recompute, the checkpointed
    core) is given:

    - grouped-query attention repeats K and V to every query head before SDPA (``repeat_kv``,
      ``repeat_interleave``), and SDPA saves its inputs: K and V h wide. The kd-wide ones are
      not kept (the repeat's backward is a sum that needs no input). Not where the attention
      call takes the grouped heads (``training.repeat_kv`` false: ``enable_gqa``).
    - ``commbench --step``'s model (the loop under autocast: ``autocast_weights``) computes Q, K
      and V in one projection and splits its output into views. A view that SDPA or the
      checkpoint keeps keeps that whole output (h + 2 kd): with learned positions Q is one, and
      without grouped-query attention V is one. Its rotary writes new Q and K, laid out
      (batch, heads, seq, dim), so SDPA's output follows that layout and the output projection
      is given a contiguous copy: the output is kept twice (h more). torchtitan's Llama
      (separate projections, the rotary before the transpose) keeps neither.
    - a gated MLP's unfused activation (``silu(gate) * up``) saves ``silu(gate)`` for the
      product's backward, beside the gate, the up projection and the product (f more; an MoE
      layer: its routed experts' width per expert token copy, and its shared experts').
    - the composite QK norm of that loop (``COMPOSITE_QK_NORM_SAVED_BYTES``).
    - with separate projections (or a parallel block) more linears read a norm's fp32 output
      than there are norms, and under autocast each casts and keeps its own bf16 copy
      (``schedules.kernels.norm_output_readers``); and each view SDPA keeps keeps only its own
      projection's output (Q with learned positions, K with learned positions and no repeat, V
      with no repeat), none under selective recompute. Counted with saved-tensor hooks against
      the fused model for rope and learned positions, 2 and 8 K/V heads, no and selective
      recompute: exact.

    Per token and layer, in elements, with recompute none: 2 (h - kd) with separate
    projections; in ``commbench --step``'s model with rope 3h - 2kd (K and V repeated) or
    2h + kd, and with learned or no positions 2h (repeated) or 0. Selective recompute runs the
    attention core again, so only what the checkpoint holds beyond Q, K and V stays: h + kd
    in that model with rope (the new Q and K; V's view keeps the projection's output), and
    ``silu(gate)``. Per-op and full recompute keep none (the layer being recomputed holds them
    all: ``recompute="none"``). All are inside the TP region. Left out: that model's rotary
    casts cos and sin to bf16 in each of its two calls and the products keep them (4 head_dim
    bytes per token, under 1 % of a layer). Checked against saved-tensor hooks on the CPU for
    rope and learned positions, 2 and 8 K/V heads, gated or not, under no, selective and full
    recompute: exact once the CPU's composite RMSNorm (one fp32 tensor more per norm) and those
    casts are taken out. Compiled, Inductor fuses the
    activation and keeps the kd-wide K and V: the compiled held-out steps' peaks show none of
    it. On results/h100_heldout4 the eager Llama steps without recompute were 7.6 % and 12.4 %
    low with the repeat alone; the remaining deficit was 13,480 and 5,950 bytes per layer and
    token, where the output copy and the activation give 13,312 and 5,632."""
    model, parallel = plan.model, plan.parallel
    recompute = parallel.recompute if recompute is None else recompute
    if kernel_stack(plan) != "eager" or recompute not in ("none", "selective"):
        return 0.0
    h, kd = model.q_size, min(model.kv_size, model.q_size)  # h: the query width, ad
    grouped, rope = repeats_kv(plan), model.position_embedding == "rope"  # K, V repeated
    step_loop = autocast_weights(plan)  # commbench --step's model
    separate = model.separate_projections
    counted = h + 2 * kd  # Q, K and V in the fused count
    if model.multi_latent:
        # latent attention (``comm_bench.step_model.LatentAttention``): the values SDPA keeps
        # are a view of the key/value up projection's output, which stays whole (its a d key
        # channels too); the queries and keys SDPA keeps are the concatenations the count has
        attention: float = model.num_heads * model.head_dim
    elif recompute == "selective":
        attention = h + kd if step_loop and rope and not separate else 0.0
    elif not step_loop:
        attention = 2 * (h - kd) if grouped else 0.0
    else:
        if separate:  # each view SDPA keeps keeps its own projection's output only
            kept = (0 if rope else h + (0 if grouped else kd)) + (0 if grouped else kd)
        else:  # Q's view (learned) or V's view (no repeat) keeps the whole QKV output
            kept = counted if not rope or not grouped else 0
        new_q = h if rope else 0
        new_k = h if grouped else (kd if rope else 0)
        new_v = h if grouped else 0
        output_copy = h if rope else 0
        attention = kept + new_q + new_k + new_v - counted + output_copy
    tokens = plan.training.micro_batch_size * model.seq_len / parallel.cp
    # under autocast each linear reading a norm's fp32 output casts and keeps its own bf16 copy
    extra_casts = (norm_output_readers(model) - model.norms_per_layer) if step_loop else 0
    total = attention * tokens / parallel.tp + extra_casts * residual_stream_elements(plan)
    qk_norm = (
        COMPOSITE_QK_NORM_SAVED_BYTES * qk_norm_elements(plan) if composite_qk_norm(plan) else 0
    )
    if not model.gated_mlp:
        return ACTIVATION_BYTES * total + qk_norm
    if not moe_layer:
        return ACTIVATION_BYTES * (total + model.ffn_hidden_size * tokens / parallel.tp) + qk_norm
    experts = expert_tokens(plan) * expert_width(model) / parallel.expert_tp
    shared = tokens * model.moe_shared_expert_ffn_hidden_size / parallel.tp
    return ACTIVATION_BYTES * (total + experts + shared) + qk_norm


def _per_layer_bytes(plan: Plan, stage: int) -> float:
    """What one layer of ``stage`` stores per micro-batch under the plan's recompute, its MoE
    layers averaged in."""
    per_layer = _layer_bytes(plan)
    layers = layers_per_stage(plan, stage)
    num_moe = stage_moe_layers(plan, stage)
    dense = per_layer + module_saved_delta(plan, moe_layer=False) - te_fp8_saved_bytes(plan)
    if num_moe:
        moe = _moe_layer_bytes(plan, per_layer) - te_fp8_saved_bytes(plan, moe_layer=True)
        return ((layers - num_moe) * dense + num_moe * moe) / layers
    return dense


FP8_SAVED_BYTES = 1
"""Bytes per element of an input Transformer Engine saves in FP8 for its weight gradient."""


def te_fp8_saved_bytes(plan: Plan, *, moe_layer: bool = False) -> float:
    """Bytes one layer's stored activations shrink by per micro-batch on one GPU where
    Transformer Engine runs its linears in FP8: each TE linear saves its input for the weight
    gradient as the FP8 tensor it cast, not the bf16 one (``linear.py``: ``saved_inputmat =
    inputmat`` after ``update_usage(rowwise_usage=False, columnwise_usage=True)``;
    ``layernorm_linear.py`` saves ``ln_out`` as the norm wrote it in FP8; ``grouped_linear.py``
    the experts' split FP8 inputs), 1 byte where the count (``schedules.activations``) has 2:

    - the fused norm's output into qkv and fc1 (split over TP under sequence parallelism) and the
      activation's output into fc2, in a dense layer; latent attention's latent-norm outputs
      into its up projections; not latent attention's hidden input, which its two down
      projections each cast and save (two FP8 copies, one bf16 copy's bytes);
    - an MoE layer's experts: the permuted tokens into fc1 and the activation's output into fc2;
      its shared experts' activation output into their fc2, while their fc1 saves an FP8 copy of
      the pre-MLP norm's output, which the router keeps in bf16 (+1 byte);
    - the attention output into proj: the fused attention keeps it in bf16 for its own backward
      (``FusedAttnFunc`` saves ``q, k, v, out``), so under delayed scaling proj's FP8 copy adds a
      byte, unless ``core_attn`` is recomputed and the FP8 copy is all that remains; under
      current scaling Megatron-Core has proj save the original tensor instead
      (``set_save_original_input(self.linear_proj)`` in ``attention.py``, from 781e765, August
      2025, with TE 2.6): no change.

    Not where the plan's recompute modules drop an input already (``mlp``, ``mla_up_proj``,
    ``moe_act``: Megatron has fc2 save the original input there, which the output-discarding
    checkpoint frees; ``shared_experts``; ``layernorm``, under which Megatron has the shared
    experts' fc1 save the original norm output). 0 without Transformer Engine FP8 or under full
    recompute (only the layer input is kept)."""
    parallel = plan.parallel
    recipe = te_recipe(plan)
    if recipe is None or parallel.recompute not in ("none", "selective"):
        return 0.0
    model, modules = plan.model, selective_modules(parallel)
    t, sp = parallel.tp, parallel.tp if parallel.sequence_parallel else 1
    tokens = plan.training.micro_batch_size * model.seq_len / parallel.cp
    h = model.hidden_size
    elements = 0.0
    if recipe == "delayed":
        attention_out = model.attention_out_size if model.multi_latent else model.q_size
        elements += tokens * attention_out / t * (1 if "core_attn" in modules else -1)
    if model.multi_latent and "mla_up_proj" not in modules:
        elements += latent_norm_elements(model, tokens, latent_split(parallel, kernel_stack(plan)))
    if not model.multi_latent:
        elements += tokens * h / sp
    if not moe_layer:
        if "mlp" not in modules:
            elements += tokens * (h / sp + model.ffn_hidden_size / t)
        return elements * (ACTIVATION_BYTES - FP8_SAVED_BYTES)
    copies = expert_tokens(plan)
    elements += copies * h
    if "moe_act" not in modules:
        elements += copies * expert_width(model) / parallel.expert_tp
    shared = model.moe_shared_expert_ffn_hidden_size
    if shared and "shared_experts" not in modules:
        elements += tokens * shared / t
        if "layernorm" not in modules:
            elements -= tokens * h / sp
    return elements * (ACTIVATION_BYTES - FP8_SAVED_BYTES)


def _layer_bytes(plan: Plan) -> float:
    """What a dense layer stores per micro-batch under the plan's recompute, before its
    recompute modules' delta."""
    model, parallel, training = plan.model, plan.parallel, plan.training
    per_layer = layer_activation_bytes(
        model,
        training.micro_batch_size,
        tp=parallel.tp,
        cp=parallel.cp,
        sequence_parallel=parallel.sequence_parallel,
        recompute=parallel.recompute,
        flash_attention=training.flash_attention,
        latent_split=latent_split(plan.parallel, kernel_stack(plan)),
    )
    per_layer += eager_saved_bytes(plan)
    if autocast_weights(plan):
        saved = 1 if parallel.recompute == "full" else model.norms_per_layer
        per_layer += saved * FP32_RESIDUAL_EXTRA_BYTES * residual_stream_elements(plan)
    return per_layer


def _moe_layer_bytes(plan: Plan, per_layer: float) -> float:
    """What one MoE layer stores per micro-batch, given a dense layer's ``per_layer`` bytes
    without its recompute modules' delta."""
    experts = eager_saved_bytes(plan, moe_layer=True) - eager_saved_bytes(plan)
    return (
        per_layer + moe_layer_extra_bytes(plan) + experts + module_saved_delta(plan, moe_layer=True)
    )


def mtp_activation_bytes(plan: Plan) -> float:
    """What the multi-token-prediction depths (``schedules.mtp``) keep per micro-batch on one GPU
    of the last stage: under full recompute (Megatron's uniform method) each depth's checkpoint
    inputs, the hidden state and the embedding; otherwise its layer's activations (of the last
    layer's kind; block recompute leaves the depths alone) and ``MTP_SAVED_WIDTHS`` hidden
    widths before its projection."""
    depths = mtp_depths(plan.model)
    if not depths:
        return 0.0
    stream = ACTIVATION_BYTES * residual_stream_elements(plan)
    parallel = plan.parallel
    if parallel.recompute == "full" and parallel.recompute_num_layers is None:
        return depths * 2 * stream
    kept = plan
    if parallel.recompute_num_layers is not None:
        unrecomputed = dataclasses.replace(parallel, recompute="none", recompute_num_layers=None)
        kept = dataclasses.replace(plan, parallel=unrecomputed)
    per_layer = _layer_bytes(kept)
    moe = mtp_layer_is_moe(plan.model)
    if moe:
        layer = _moe_layer_bytes(kept, per_layer)
    else:
        layer = per_layer + module_saved_delta(kept, moe_layer=False)
    layer -= te_fp8_saved_bytes(kept, moe_layer=moe)  # the depth's layer runs in FP8 too
    return depths * (layer + MTP_SAVED_WIDTHS * stream)


CUDA_GRAPH_ACTIVATION_EXTRA = 0.20
"""Extra activation memory of layers captured in CUDA graphs (``training.cuda_graphs``): a
captured layer keeps its forward's temporaries allocated for the graph's lifetime, "about 20%"
more activation memory, 15 GB on a GPT-3 20B run (NeMo docs, features/optimizations/
cudagraphs.md, Megatron-Core's ``CudaGraphManager``)."""


def activation_bytes(plan: Plan, stage: int) -> float:
    """Activations rank ``stage`` holds at its peak under the plan's schedule and recompute."""
    model, parallel, training = plan.model, plan.parallel, plan.training
    per_layer = _per_layer_bytes(plan, stage)
    recomputed = 1.0
    if parallel.recompute_num_layers is not None:  # block recompute: the rest keep everything
        chunks = chunk_layers(parallel, model.num_layers)
        recomputed = recomputed_fraction(
            parallel, tuple(chunks[c * parallel.pp + stage] for c in range(parallel.vpp))
        )
        kept = dataclasses.replace(
            plan,
            parallel=dataclasses.replace(parallel, recompute="none", recompute_num_layers=None),
        )
        per_layer = recomputed * per_layer + (1.0 - recomputed) * _per_layer_bytes(kept, stage)
    stored = stored_layer_activations(
        parallel.schedule,
        pp=parallel.pp,
        vpp=parallel.vpp,
        stage=stage,
        num_micro=num_microbatches(plan),
        stage_layers=layers_per_stage(plan, stage),
    )
    if parallel.overlap_moe_expert_parallel_comm:
        stored += COMBINED_EXTRA_LAYERS
    total = stored * per_layer
    if parallel.recompute in ("full", "op") and recomputed > 0:
        # The layer being recomputed holds all of its activations until its backward ends (an
        # MoE layer its expert, router and shared-expert terms too, as without recompute).
        unrecomputed = dataclasses.replace(parallel, recompute="none", recompute_num_layers=None)
        whole = dataclasses.replace(plan, parallel=unrecomputed)
        total += layer_activation_bytes(
            model,
            training.micro_batch_size,
            tp=parallel.tp,
            cp=parallel.cp,
            sequence_parallel=parallel.sequence_parallel,
            recompute="none",
            flash_attention=training.flash_attention,
            latent_split=latent_split(plan.parallel, kernel_stack(plan)),
        )
        moe = bool(stage_moe_layers(plan, stage))
        total += eager_saved_bytes(plan, recompute="none", moe_layer=moe)
        total += max(moe_layer_extra_bytes(whole), 0.0) if moe else 0.0
    if training.cuda_graphs:
        total *= 1.0 + CUDA_GRAPH_ACTIVATION_EXTRA
    return total + _head_bytes(plan, stage)


def _head_bytes(plan: Plan, stage: int) -> float:
    """The LM head's inputs on the last stage, and the multi-token-prediction depths' (their
    layers and heads): they live as long as their micro-batch, one at a time except under
    GPipe."""
    model, parallel, training = plan.model, plan.parallel, plan.training
    if stage != parallel.pp - 1:
        return 0.0
    head = head_activation_bytes(
        model,
        training.micro_batch_size,
        tp=parallel.tp,
        cp=parallel.cp,
        sequence_parallel=parallel.sequence_parallel,
    )
    head *= 1 + mtp_depths(model)  # each depth's head keeps its own inputs
    graphs = 1.0 + (CUDA_GRAPH_ACTIVATION_EXTRA if training.cuda_graphs else 0.0)
    head += mtp_activation_bytes(plan) * graphs
    return head * pipeline_schedule(parallel.schedule).head_microbatches(num_microbatches(plan))


FP8_CACHE_BYTES_PER_PARAM = 2
"""FP8 training (Transformer Engine): each linear weight is kept as an FP8 copy and its FP8
transpose between micro-batches (``is_first_microbatch`` caching), 1 byte each."""


def fp8_weight_bytes(plan: Plan, stage: int) -> float:
    """FP8 weight copies of the transformer layers' linear weights on one GPU (0 without FP8).

    The embedding and the LM head stay in bf16; norms have no GEMM. The layers' non-GEMM
    parameters are a few per million, so all layer parameters are counted.
    """
    if plan.training.precision != "fp8" or data_parallel_kind(plan.parallel).gathers_units:
        return 0.0  # FSDP / ZeRO-3 keep no FP8 copy of weights they free after use
    per_layer = layer_params_per_gpu(plan.model, plan.parallel.tp)
    layers = layers_per_stage(plan, stage) * per_layer
    if stage == plan.parallel.pp - 1:  # the multi-token-prediction depths' layers and projections
        depths = mtp_depths(plan.model)
        layers += depths * (per_layer + mtp_projection_params(plan.model) / plan.parallel.tp)
    return layers * FP8_CACHE_BYTES_PER_PARAM


def vocab_sharded_loss(plan: Plan) -> bool:
    """Whether each tensor-parallel rank computes the loss on its own slice of the vocabulary
    (Megatron's vocab-parallel cross-entropy, torch's ``loss_parallel``); without it the logits
    are gathered whole on every rank first."""
    return kernel_stack(plan) == "megatron" or plan.training.loss_parallel


def logits_bytes_per_element(plan: Plan) -> float:
    """Peak bytes per logit of the plan's loss: Inductor's fused loss
    (``COMPILED_LOSS_LOGITS_BYTES_PER_ELEMENT``), torch's ``loss_parallel`` on the PyTorch
    stacks with tensor parallelism unless ``training.loss_parallel`` is off
    (``LOSS_PARALLEL_LOGITS_BYTES_PER_ELEMENT``), Megatron-Core's cross-entropy's
    (``MEGATRON_LOGITS_BYTES_PER_ELEMENT``), else the stack's (``LOGITS_BYTES_PER_ELEMENT``).
    Without ``loss_parallel`` every rank holds the whole vocabulary's logits
    (``vocab_sharded_loss``)."""
    stack = kernel_stack(plan)
    if loss_compiled(plan):
        return COMPILED_LOSS_LOGITS_BYTES_PER_ELEMENT
    if stack == "megatron":
        return MEGATRON_LOGITS_BYTES_PER_ELEMENT[megatron_cross_entropy(plan)]
    if plan.parallel.tp > 1 and plan.training.loss_parallel:
        return LOSS_PARALLEL_LOGITS_BYTES_PER_ELEMENT
    return LOGITS_BYTES_PER_ELEMENT[stack]


MTP_KEPT_LOGITS_BYTES_PER_ELEMENT = {"te_inplace": 2}
"""Bytes per logit each multi-token-prediction depth's cross-entropy keeps for its backward while
the next depth's and the main loss run (they come first, ``process_mtp_loss``): the fp32
upcast the shift and exponential overwrite (``none``, ``native``) or the fp32 gradient written
in the forward (``te``), 4; Transformer Engine's in-place variant writes it into the bf16
logits, 2."""


def mtp_logits_bytes_per_element(plan: Plan) -> float:
    """Bytes per logit the multi-token-prediction depths' losses keep beside the main loss's
    peak (``MTP_KEPT_LOGITS_BYTES_PER_ELEMENT``; 4 unless named there)."""
    depths = mtp_depths(plan.model)
    if not depths:
        return 0.0
    return depths * MTP_KEPT_LOGITS_BYTES_PER_ELEMENT.get(megatron_cross_entropy(plan), 4)


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

    # FP8 weights (fp8_param_gather) keep no bf16 copy: only the fp8_weights component
    bf16_free = stage_layer_params_per_gpu(plan, stage) * PARAM_BYTES if fp8_params(plan) else 0.0
    memory = {
        "weights": states("weights") - bf16_free,
        "gradients": states("gradients"),
        "optimizer": states("optimizer"),
        "activations": activation_bytes(plan, stage),
        "buffers": transient_buffer_bytes(plan, stage)
        + gpu_offload_buffer_bytes(offload_of(plan.parallel), plan)
        + ring_buffer_bytes(plan, kernel_stack(plan)),
        "fsdp_unsharded": fsdp_unsharded_bytes(plan, stage),
        "logits": logits_bytes(
            plan.model,
            plan.training.micro_batch_size,
            tp=parallel.tp if vocab_sharded_loss(plan) else 1,
            cp=parallel.cp,
            per_element=logits_bytes_per_element(plan) + mtp_logits_bytes_per_element(plan),
        )
        if is_last
        else 0.0,
        "fp8_weights": fp8_weight_bytes(plan, stage),
    }
    casts = params * AUTOCAST_CAST_CACHE_BYTES if autocast_weights(plan) else 0.0
    memory["buffers"] += casts
    if not accumulating_gradients(plan):
        # one micro-batch: the peak is the forward's end (no gradients yet) or the backward's
        # (every gradient, the activations, logits and casts freed), whichever is larger
        freed = memory["activations"] + memory["logits"] + casts
        memory["gradients"] = max(0.0, memory["gradients"] - freed)
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
