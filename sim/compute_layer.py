"""The kernels of one transformer layer, the embedding and the LM head, timed on a ComputeModel.

Per micro-batch of b sequences on one GPU, with T = b s / cp tokens, t = tp, kd the key/value
width, f the MLP width: weight GEMMs QKV (T x (h + 2kd)/t x h), attention projection
(T x h x h/t), MLP up (T x f/t x h, 2f/t when gated) and down (T x h x f/t); the attention core
(fused, or eager batched GEMMs plus a softmax when ``flash_attention`` is off); memory-bound
kernels: 2 norms and 2 residual adds (on T/t tokens with sequence parallelism, else T), rotary
embeddings on Q and K, the MLP activation. The backward of a weight GEMM (m, n, k) is an
input-gradient GEMM (m, k, n) and a weight-gradient GEMM (k, n, m); elementwise backward moves
twice the forward bytes.

    layer_times(ComputeModel(GPUS["h100-sxm"]), plan).forward_s
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from schedules.activations import ACTIVATION_BYTES
from schedules.plan import Plan

if TYPE_CHECKING:
    from sim.compute import ComputeModel

CROSS_ENTROPY_FORWARD_PASSES = 4
"""fp32 passes over the logits in the forward of vocab-parallel cross-entropy (cast, max, exp-sum,
loss); approximate, from Megatron's ``vocab_parallel_cross_entropy``."""
CROSS_ENTROPY_BACKWARD_PASSES = 2
"""fp32 passes over the logits in its backward (softmax minus one-hot, scaled)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerTimes:
    """Seconds of one piece of the model on one GPU for one micro-batch."""

    forward_s: float
    """Forward pass."""
    backward_input_s: float
    """Input-gradient half of the backward (with the attention and elementwise backward)."""
    backward_weight_s: float
    """Weight-gradient GEMMs (the deferrable 'W' of zero-bubble schedules)."""
    recompute_s: float = 0.0
    """Recomputation before the backward (none: 0; selective: attention core; full: forward)."""

    @property
    def backward_s(self) -> float:
        """The whole backward, input plus weight gradients (without recomputation)."""
        return self.backward_input_s + self.backward_weight_s


def _dtypes(plan: Plan) -> tuple[str, str]:
    """(GEMM dtype, dtype of everything else): FP8 plans run only the layer GEMMs in FP8."""
    precision = plan.training.precision
    other = "fp16" if precision == "fp16" else "bf16"
    return ("fp8" if precision == "fp8" else other), other


def _tokens(plan: Plan) -> float:
    return plan.training.micro_batch_size * plan.model.seq_len / plan.parallel.cp


def weight_gemm_shapes(plan: Plan) -> tuple[tuple[float, float, float], ...]:
    """Forward (m, n, k) of the QKV, projection, MLP up and MLP down GEMMs on one GPU."""
    model, t = plan.model, plan.parallel.tp
    tokens, h, f = _tokens(plan), model.hidden_size, model.ffn_hidden_size
    up_width = 2 * f if model.gated_mlp else f
    return (
        (tokens, (h + 2 * model.kv_size) / t, h),
        (tokens, h, h / t),
        (tokens, up_width / t, h),
        (tokens, h, f / t),
    )


def elementwise_forward_bytes(plan: Plan) -> float:
    """Bytes the memory-bound kernels of one layer's forward move on one GPU."""
    model, parallel = plan.model, plan.parallel
    tokens, t, h = _tokens(plan), parallel.tp, model.hidden_size
    norm_tokens = tokens / t if parallel.sequence_parallel else tokens
    norms = 2 * 2 * ACTIVATION_BYTES * norm_tokens * h  # read + write, 2 norms
    residuals = 2 * 3 * ACTIVATION_BYTES * norm_tokens * h  # 2 reads + 1 write, 2 adds
    rotary = 0.0
    if model.position_embedding == "rope":
        rotary = 2 * ACTIVATION_BYTES * tokens * (h + model.kv_size) / t
    mlp_in = 2 * model.ffn_hidden_size if model.gated_mlp else model.ffn_hidden_size
    activation = ACTIVATION_BYTES * tokens * (mlp_in + model.ffn_hidden_size) / t
    return norms + residuals + rotary + activation


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionShape:
    """The attention core's dimensions on one GPU."""

    batch: float
    """Sequences in the micro-batch."""
    num_heads: float
    """Query heads on this GPU, a / t."""
    seq_q: float
    """Query tokens on this GPU, s / cp."""
    seq_kv: float
    """Key/value tokens attended to, s (context parallelism passes all of them around)."""
    head_dim: float
    """h / a."""


def attention_shape(plan: Plan) -> AttentionShape:
    """The attention core's dimensions on one GPU of the plan."""
    model, parallel = plan.model, plan.parallel
    return AttentionShape(
        batch=plan.training.micro_batch_size,
        num_heads=model.num_heads / parallel.tp,
        seq_q=model.seq_len / parallel.cp,
        seq_kv=model.seq_len,
        head_dim=model.head_dim,
    )


def attention_core_times(compute: ComputeModel, plan: Plan) -> tuple[float, float]:
    """(forward, backward) seconds of the attention core on one GPU.

    Fused: one kernel, causal. Eager: QK^T and AV as batched GEMMs over the full s x s scores
    (the causal mask is applied after the product) plus a softmax reading and writing them.
    """
    _, dtype = _dtypes(plan)
    shape = attention_shape(plan)
    seq_q, seq_kv, d = shape.seq_q, shape.seq_kv, shape.head_dim
    if plan.training.flash_attention:
        times = [
            compute.attention_time_s(
                batch=shape.batch,
                num_heads=shape.num_heads,
                seq_q=seq_q,
                seq_kv=seq_kv,
                head_dim=d,
                causal=True,
                dtype=dtype,
                backward=backward,
            )
            for backward in (False, True)
        ]
        return times[0], times[1]
    fit = compute.kernel_fit("gemm", dtype)
    scores = shape.batch * shape.num_heads * seq_q * seq_kv
    gemm_flops = 2.0 * scores * d
    products = fit.time_s(gemm_flops, (seq_q, seq_kv, d)) + fit.time_s(
        gemm_flops, (seq_q, d, seq_kv)
    )
    softmax = compute.memory_time_s(2 * ACTIVATION_BYTES * scores)
    return products + softmax, 2 * (products + softmax)


def layer_times(compute: ComputeModel, plan: Plan) -> LayerTimes:
    """One transformer layer, one micro-batch, one GPU: forward, backward split, recompute."""
    gemm_dtype, _ = _dtypes(plan)
    shapes = weight_gemm_shapes(plan)
    gemm_forward = sum(compute.gemm_time_s(m, n, k, gemm_dtype) for m, n, k in shapes)
    gemm_input = sum(compute.gemm_time_s(m, k, n, gemm_dtype) for m, n, k in shapes)
    gemm_weight = sum(compute.gemm_time_s(k, n, m, gemm_dtype) for m, n, k in shapes)
    core_forward, core_backward = attention_core_times(compute, plan)
    elementwise = compute.memory_time_s(elementwise_forward_bytes(plan))
    forward = gemm_forward + core_forward + elementwise
    recompute = {"none": 0.0, "selective": core_forward, "full": forward}[plan.parallel.recompute]
    return LayerTimes(
        forward_s=forward,
        backward_input_s=gemm_input + core_backward + 2 * elementwise,
        backward_weight_s=gemm_weight,
        recompute_s=recompute,
    )


def embedding_times(compute: ComputeModel, plan: Plan) -> LayerTimes:
    """Word (and learned position) embedding: a row gather forward, a scatter-add backward."""
    tokens, h = _tokens(plan), plan.model.hidden_size
    passes = 2 + (3 if plan.model.position_embedding == "learned" else 0)
    forward = compute.memory_time_s(passes * ACTIVATION_BYTES * tokens * h)
    backward = compute.memory_time_s(3 * ACTIVATION_BYTES * tokens * h)
    return LayerTimes(forward_s=forward, backward_input_s=0.0, backward_weight_s=backward)


def head_times(compute: ComputeModel, plan: Plan) -> LayerTimes:
    """Final norm, LM head (T x V/t x h, kept in 16-bit as Megatron does) and cross-entropy."""
    model, parallel = plan.model, plan.parallel
    _, dtype = _dtypes(plan)
    tokens, h = _tokens(plan), model.hidden_size
    vocab = model.vocab_size / parallel.tp
    norm_tokens = tokens / parallel.tp if parallel.sequence_parallel else tokens
    norm = compute.memory_time_s(2 * 2 * ACTIVATION_BYTES * norm_tokens * h)
    logits_bytes = 4.0 * tokens * vocab
    forward = (
        norm
        + compute.gemm_time_s(tokens, vocab, h, dtype)
        + compute.memory_time_s(CROSS_ENTROPY_FORWARD_PASSES * logits_bytes)
    )
    backward_input = (
        2 * norm
        + compute.gemm_time_s(tokens, h, vocab, dtype)
        + compute.memory_time_s(CROSS_ENTROPY_BACKWARD_PASSES * logits_bytes)
    )
    return LayerTimes(
        forward_s=forward,
        backward_input_s=backward_input,
        backward_weight_s=compute.gemm_time_s(h, vocab, tokens, dtype),
    )
