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

from schedules.activations import ACTIVATION_BYTES
from schedules.kernels import (
    ELEMENTWISE_BYTES,
    WEIGHT_GEMMS,
    Kernel,
    PieceKernels,
    attention_core_kernels,
    dtypes,
    elementwise_forward_bytes,
    gemm,
    kernel_stack,
    memory,
    recompute_kernels,
    weight_cast_bytes,
    weight_gemm_shapes,
)
from schedules.moe import expert_tokens, expert_width, routed_tokens
from schedules.params import moe_layer_params_per_gpu
from schedules.plan import Plan

PERMUTE_PASSES = 2
"""Copies of the routed tokens per direction: the permutation into expert order (read + write)
and, on the way back, the un-permutation with the weighted sum of the k outputs."""


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
    permute = PERMUTE_PASSES * 2 * ACTIVATION_BYTES * copies
    return elementwise_forward_bytes(plan) - dense_activation + experts + shared + permute


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
    forward = (
        *casts,
        *(_grouped(name, (m, n, k), (rows, n, k), gemm_dtype) for name, m, n, k, rows in named),
        *core_forward,
        memory("elementwise", elementwise_bytes),
    )
    recompute = recompute_kernels(plan, forward, core_forward, elementwise_bytes)
    return PieceKernels(
        forward=forward,
        backward_input=(
            *(
                _grouped(f"{name}_dgrad", (m, k, n), (rows, k, n), gemm_dtype)
                for name, m, n, k, rows in named
            ),
            *core_backward,
            memory("elementwise_backward", 2 * elementwise_bytes),
            *((memory("grad_cast", cast_bytes),) if cast_bytes else ()),
        ),
        backward_weight=tuple(
            _grouped(f"{name}_wgrad", (k, n, m), (k, n, rows), gemm_dtype)
            for name, m, n, k, rows in named
        ),
        recompute=recompute,
    )
