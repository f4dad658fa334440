"""What an MoE layer runs on one GPU: the attention of a dense layer, then router, permutation,
grouped expert GEMMs and shared experts, as a list of kernels (``schedules.kernels`` style).

Per micro-batch on the busiest GPU (``schedules.moe``): the router GEMM (T_r x E x h), the
permutation and un-permutation copies of the T_r k token copies (read and write, plus the
weighted sum of the k outputs), the grouped GEMMs of the E / ep local experts over the C token
copies the GPU receives (``expert_tokens``: fc1 C x 2f_e/etp x h gated, fc2 C x h x f_e/etp;
their efficiency is set by the tokens per expert, C ep / E), the shared experts as a TP-split
dense MLP over the gathered tokens, and the activation functions. The attention, norms, residuals
and rotary embeddings are those of a dense layer.

    kernels = moe_layer_kernels(plan); [k.name for k in kernels.forward]
"""

from __future__ import annotations

from dataclasses import replace

from schedules.activations import ACTIVATION_BYTES
from schedules.kernels import (
    ELEMENTWISE_BYTES,
    WEIGHT_GEMMS,
    Kernel,
    PieceKernels,
    attention_core_kernels,
    attention_split_grad_bytes,
    dtypes,
    elementwise_backward_bytes,
    elementwise_forward_bytes,
    gemm,
    kernel_stack,
    memory,
    recompute_kernels,
    separate_projection_kernels,
    weight_cast_bytes,
    weight_gemm_shapes,
)
from schedules.moe import expert_tokens, expert_width, routed_tokens
from schedules.params import moe_layer_params_per_gpu
from schedules.plan import Plan

PERMUTE_PASSES = 2
"""Copies of the routed tokens per direction: the permutation into expert order (read + write)
and, on the way back, the un-permutation with the weighted sum of the k outputs (PyTorch
stacks; Megatron-Core's are ``MEGATRON_PERMUTE_BYTES``)."""
MEGATRON_PERMUTE_BYTES = {False: ((18.0, 2.0), (18.0, 12.0)), True: ((4.0, 4.0), (4.0, 4.0))}
"""Bytes Megatron-Core's alltoall dispatcher moves permuting and un-permuting one layer's
tokens, forward and backward, as (per T k h, per T h) with T the GPU's tokens, k the top-k and
h the hidden size, by ``parallel.moe_permute_fusion``; read in the source, not measured.
Unfused (core v0.9 ``moe_utils.permute`` / ``unpermute`` and ``sort_chunks_by_idxs``: the
gathers into expert order on both sides of the all-to-all, the weighted scatter-add back with
bf16 atomics, their index bookkeeping): 18Tkh + 2Th forward, 18Tkh + 12Th backward. Fused
(Transformer Engine's ``moe_permute`` / ``moe_unpermute``, ``--moe-permute-fusion``): a read
and a write of the tokens and of their k copies, 4Tkh + 4Th each way. ``PERMUTE_PASSES``
prices 8Tkh forward and 16Tkh backward."""
MEGATRON_ROUTER_KERNELS = {False: (34.0, 14.0), True: (16.0, 7.0)}
"""Small kernels of Megatron-Core's router, aux loss and dispatch bookkeeping per layer and
micro-batch, forward and backward, by ``parallel.moe_router_fusion`` (counted in the source,
not measured): 34 and 14 unfused (core v0.9: softmax, top-k, the routing map's scatter, the
aux loss's sums and means, the token counts, the probabilities' masks); about 23 in all with
Transformer Engine's fused router (the December 2025 development branch), split as the unfused
ones are. Each costs ``SMALL_KERNEL_S`` of GPU time and a launch (``Kernel.small_kernels``)."""


def _grouped(
    name: str, shape: tuple[float, float, float], dims: tuple[float, ...], dtype: str
) -> Kernel:
    """A grouped GEMM of ``shape`` (m, n, k) in all, whose single GEMMs have ``dims`` (the rows
    of one expert in place of the token count)."""
    whole = gemm(name, *shape, dtype)
    return Kernel(
        name=name,
        kind="gemm",
        dtype=dtype,
        flops=whole.flops,
        dims=tuple(max(d, 1.0) for d in dims),
        bytes=whole.bytes,
    )


def _expert_gemms(plan: Plan) -> list[tuple[str, float, float, float, float]]:
    """(name, m, n, k, rows per GEMM) of the router, grouped expert and shared-expert GEMMs."""
    model, parallel = plan.model, plan.parallel
    h, etp, t = model.hidden_size, parallel.expert_tp, parallel.tp
    copies, width = expert_tokens(plan), expert_width(model)
    per_expert = copies * parallel.ep / model.num_experts
    up = 2 * width if model.gated_mlp else width
    shapes = [
        ("router", routed_tokens(plan), float(model.num_experts), float(h), routed_tokens(plan)),
        ("experts_fc1", copies, up / etp, float(h), per_expert),
        ("experts_fc2", copies, float(h), width / etp, per_expert),
    ]
    shared = model.moe_shared_expert_ffn_hidden_size
    if shared:
        tokens = plan.training.micro_batch_size * model.seq_len / parallel.cp
        shared_up = 2 * shared if model.gated_mlp else shared
        shapes += [
            ("shared_fc1", tokens, shared_up / t, float(h), tokens),
            ("shared_fc2", tokens, float(h), shared / t, tokens),
        ]
    return shapes


def moe_elementwise_forward_bytes(plan: Plan) -> float:
    """A dense layer's memory-bound bytes with the MLP activation over the expert and shared
    widths instead of the dense one, plus the permutation copies."""
    model, parallel = plan.model, plan.parallel
    per = ELEMENTWISE_BYTES[kernel_stack(plan)]["gated" if model.gated_mlp else "plain"]
    dense_tokens = plan.training.micro_batch_size * model.seq_len / parallel.cp
    dense_activation = per * dense_tokens * model.ffn_hidden_size / parallel.tp
    experts = per * expert_tokens(plan) * expert_width(model) / parallel.expert_tp
    shared = per * dense_tokens * model.moe_shared_expert_ffn_hidden_size / parallel.tp
    copies = routed_tokens(plan) * model.moe_top_k * model.hidden_size
    permute = 0.0 if megatron_alltoall(plan) else PERMUTE_PASSES * 2 * ACTIVATION_BYTES * copies
    return elementwise_forward_bytes(plan) - dense_activation + experts + shared + permute


def megatron_moe(plan: Plan) -> bool:
    """Whether the plan's MoE layer is Megatron-Core's (the megatron stack): its router's small
    kernels (``MEGATRON_ROUTER_KERNELS``), its dispatchers' host synchronisation and, with the
    alltoall dispatcher, its permutation (``megatron_alltoall``)."""
    return kernel_stack(plan) == "megatron"


def megatron_alltoall(plan: Plan) -> bool:
    """Whether the plan runs Megatron-Core's alltoall dispatcher, or its flex dispatcher, which
    permutes the tokens DeepEP delivers the same way (``MEGATRON_PERMUTE_BYTES``; its allgather
    dispatcher permutes the gathered tokens, priced with ``PERMUTE_PASSES``)."""
    return megatron_moe(plan) and plan.parallel.moe_token_dispatcher in ("alltoall", "flex")


def megatron_permute_kernels(plan: Plan) -> tuple[Kernel, Kernel]:
    """Megatron-Core's permutation and un-permutation of one layer's tokens, forward and
    backward (``MEGATRON_PERMUTE_BYTES``)."""
    tokens, h = routed_tokens(plan), plan.model.hidden_size
    per_copy, per_token = tokens * plan.model.moe_top_k * h, tokens * h
    forward, backward = MEGATRON_PERMUTE_BYTES[plan.parallel.moe_permute_fusion]
    return (
        memory("permute", forward[0] * per_copy + forward[1] * per_token, "copy", converts=False),
        memory(
            "permute_backward",
            backward[0] * per_copy + backward[1] * per_token,
            "copy",
            converts=False,
        ),
    )


def moe_layer_kernels(plan: Plan) -> PieceKernels:
    """One MoE layer, one micro-batch, the busiest GPU: forward, backward split, recompute."""
    gemm_dtype, _ = dtypes(plan)
    attention_shapes = weight_gemm_shapes(plan)[:2]
    named = [
        (n, m, nn, k, m) for n, (m, nn, k) in zip(WEIGHT_GEMMS[:2], attention_shapes, strict=True)
    ]
    named += _expert_gemms(plan)
    core_forward, core_backward = attention_core_kernels(plan)
    elementwise_bytes = moe_elementwise_forward_bytes(plan)
    cast_bytes = weight_cast_bytes(plan, moe_layer_params_per_gpu(plan.model, plan.parallel)) / 2
    casts = (memory("weight_cast", cast_bytes),) if cast_bytes else ()
    permute: tuple[Kernel, ...] = ()
    permute_backward: tuple[Kernel, ...] = ()
    small = {"forward": 0.0, "backward": 0.0}
    if megatron_alltoall(plan):
        permute_forward_kernel, permute_backward_kernel = megatron_permute_kernels(plan)
        permute, permute_backward = (permute_forward_kernel,), (permute_backward_kernel,)
    if megatron_moe(plan):
        count = MEGATRON_ROUTER_KERNELS[plan.parallel.moe_router_fusion]
        small = {"forward": count[0], "backward": count[1]}

    def with_small(kernel: Kernel, phase: str) -> Kernel:
        if kernel.name not in ("router", "router_dgrad") or not small[phase]:
            return kernel
        return replace(
            kernel,
            small_kernels=small[phase],
            extra_launches=kernel.extra_launches + small[phase],
        )

    forward = (
        *casts,
        *(
            with_small(_grouped(name, (m, n, k), (rows, n, k), gemm_dtype), "forward")
            for name, m, n, k, rows in named
        ),
        *core_forward,
        memory("elementwise", elementwise_bytes),
        *permute,
    )
    backward_input = (
        *(
            with_small(_grouped(f"{name}_dgrad", (m, k, n), (rows, k, n), gemm_dtype), "backward")
            for name, m, n, k, rows in named
        ),
        *core_backward,
        *(
            (memory("split_grad_cat", split, "copy", converts=False),)
            if (split := attention_split_grad_bytes(plan))
            else ()
        ),
        memory("elementwise_backward", elementwise_backward_bytes(plan, elementwise_bytes)),
        *permute_backward,
        *((memory("grad_cast", cast_bytes),) if cast_bytes else ()),
    )
    backward_weight = tuple(
        _grouped(f"{name}_wgrad", (k, n, m), (k, n, rows), gemm_dtype)
        for name, m, n, k, rows in named
    )
    # the attention's separate linears (latent attention's, torchtitan's wq, wk, wv) one by one
    forward, backward_input, backward_weight = separate_projection_kernels(
        plan, (forward, backward_input, backward_weight)
    )
    recompute = recompute_kernels(plan, forward, core_forward, elementwise_bytes, moe_layer=True)
    return PieceKernels(
        forward=forward,
        backward_input=backward_input,
        backward_weight=backward_weight,
        recompute=recompute,
    )
