"""Activation memory a transformer layer keeps for its backward, and how many micro-batches stay.

Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
arXiv:2205.05198, Sec. 4) count, per layer and 2-byte activations, sbh(34 + 5as/h) bytes:
attention 11sbh + 5as^2b (QKV input 2, Q and K 4, V 2, projection input 2, dropout mask 1; softmax
output 2as^2b, its dropout mask as^2b and output 2as^2b), MLP 19sbh (input 2, GeLU input 8,
down-projection input 8, dropout mask 1) and two LayerNorm inputs 4sbh.
Generalised here, term by term, to GQA (K and V are kd wide, not h), any ffn width f and gated
MLPs (the 2f-wide up projection output 4sbf is stored for the activation backward, plus the 2sbf
down-projection input), models without dropout (no masks, and the softmax output is reused by AV)
and fused attention (FlashAttention keeps no s x s tensor, only fp32 row statistics, 4abs).
Tensor parallelism splits the terms inside the column/row-parallel region (Q, K, V, the core, the
projection input, the MLP hidden); sequence parallelism also splits the rest (norm inputs, QKV and
MLP inputs, masks) by t. Context parallelism divides every token count by cp.

    layer_activation_bytes(plan.model, 1, tp=8, sequence_parallel=True, recompute="selective")
"""

from __future__ import annotations

from schedules.mla import latent_norm_widths
from schedules.pipeline_schedules import SCHEDULES
from schedules.plan import ModelConfig

ACTIVATION_BYTES = 2
"""Bytes per stored activation element (bf16/fp16; FP8 training keeps bf16 activations too)."""


def attention_core_bytes(
    model: ModelConfig, micro_batch_size: float, *, cp: int, flash_attention: bool
) -> float:
    """Stored outputs of QK^T/softmax/dropout for all heads (before TP sharding)."""
    a, s, b = model.num_heads, model.seq_len, micro_batch_size
    if flash_attention:
        return 4.0 * a * (s / cp) * b  # fp32 log-sum-exp per query row
    scores = a * (s / cp) * s * b  # each CP rank holds its s/cp queries against all s keys
    return (5.0 if model.dropout else 2.0) * scores


def _tp_split_bytes(model: ModelConfig, num_tokens: float) -> float:
    """Terms inside the TP region: Q, K, V, projection input, MLP hidden (sharded by t); Q and
    the projection input are ad wide (h unless ``head_dim`` is set apart); with ``qk_norm`` the
    norm keeps its input too, Q and K before it."""
    q, f, kv = model.q_size, model.ffn_hidden_size, model.kv_size
    q_k_v = ACTIVATION_BYTES * (q + 2 * kv + (q + kv if model.qk_norm else 0))
    projection_in = ACTIVATION_BYTES * q
    if model.multi_latent:  # keys a*d_qk wide, values and the projection input a*d_v
        q_k_v = ACTIVATION_BYTES * (q + kv + model.value_size)
        projection_in = ACTIVATION_BYTES * model.attention_out_size
    mlp_hidden = ACTIVATION_BYTES * (3 * f if model.gated_mlp else 2 * f)
    return num_tokens * (q_k_v + projection_in + mlp_hidden)


def _sequence_split_bytes(model: ModelConfig, num_tokens: float) -> float:
    """Terms outside the TP region: 2 norm inputs, QKV and MLP inputs, 2 dropout masks; a
    parallel block has one norm, whose output is both the QKV and the MLP input."""
    h = model.hidden_size
    inputs = ACTIVATION_BYTES * h * 2 * model.norms_per_layer  # norm inputs + QKV, MLP inputs
    masks = 2 * h if model.dropout else 0  # 1-byte masks after the projection and the MLP
    return num_tokens * (inputs + masks)


def _latent_bytes(model: ModelConfig, num_tokens: float) -> float:
    """What multi-head latent attention keeps of its latents: each latent norm's input and
    output (the up projection's input; Transformer Engine's fused ``LayerNormLinear`` saves
    both), 2 * (q_lora_rank + kv_lora_rank) per token, whole on every TP rank (split over them
    under Megatron's sequence parallelism, which gathers the latents inside the up projections:
    ``latent_split`` in ``layer_activation_bytes``); 0 for other attention."""
    if not model.multi_latent:
        return 0.0
    return num_tokens * ACTIVATION_BYTES * 2 * sum(latent_norm_widths(model))


def layer_activation_bytes(
    model: ModelConfig,
    micro_batch_size: float,
    *,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
    recompute: str = "none",
    flash_attention: bool = False,
    latent_split: int = 0,
) -> float:
    """Bytes one layer stores for one micro-batch on one GPU (``latent_split``: the ranks
    multi-head latent attention's latents are split over, 0: as the sequence-parallel terms).

    recompute none: everything (Korthikanti Table 2: sbh(10 + 24/t + 5as/(ht)) with TP,
    sbh/t (34 + 5as/h) with TP+SP); selective: without the attention core (sbh(10 + 24/t), and
    34sbh/t with SP); full: only the layer input, 2sbh (2sbh/t with SP, which keeps it sharded).
    """
    num_tokens = micro_batch_size * model.seq_len / cp
    sp_divisor = tp if sequence_parallel else 1
    if recompute == "full":
        return ACTIVATION_BYTES * num_tokens * model.hidden_size / sp_divisor
    if recompute == "op":
        return _op_saved_bytes(model, num_tokens, tp=tp, sp_divisor=sp_divisor)
    outside = _sequence_split_bytes(model, num_tokens) / sp_divisor
    outside += _latent_bytes(model, num_tokens) / (latent_split or sp_divisor)
    inside = _tp_split_bytes(model, num_tokens) / tp
    if recompute == "selective":
        return outside + inside
    if recompute == "none":
        core = attention_core_bytes(model, micro_batch_size, cp=cp, flash_attention=flash_attention)
        return outside + inside + core / tp
    raise ValueError(f"recompute={recompute!r} is not one of none, selective, full, op")


def _op_saved_bytes(model: ModelConfig, num_tokens: float, *, tp: int, sp_divisor: int) -> float:
    """What torchtitan's per-op selective checkpointing keeps of one layer: the block's input,
    the outputs of the odd-numbered matmuls (wq, wv, w1, and w2 when gated, whose row-parallel
    output is whole before its reduction; see ``schedules.flops.op_recomputed_gemms``) and of the
    attention kernel (its output and fp32 log-sum-exp)."""
    h, f, kv, q = model.hidden_size, model.ffn_hidden_size, model.kv_size, model.q_size
    block_input = h / sp_divisor
    saved_mm = (q + kv + f) / tp + (h if model.gated_mlp else 0.0)
    attention_out = q / tp
    lse = 4.0 * model.num_heads / tp / ACTIVATION_BYTES
    return ACTIVATION_BYTES * num_tokens * (block_input + saved_mm + attention_out + lse)


def in_flight_microbatches(schedule: str, *, pp: int, stage: int, num_micro: int) -> int:
    """Micro-batches whose activations pipeline rank ``stage`` holds at its peak (non-interleaved).

    1F1B and ZB-H1 (same warm-up, Megatron): min(p - r, m), worst on rank 0; GPipe: all m.
    """
    spec = SCHEDULES.get(schedule)
    if spec is None or spec.virtual_stages:
        raise ValueError(
            f"schedule={schedule!r} has no micro-batch count; use interleaved_in_flight"
        )
    return spec.in_flight_microbatches(pp=pp, vpp=1, stage=stage, num_micro=num_micro)


def stored_layer_activations(
    schedule: str, *, pp: int, vpp: int, stage: int, num_micro: int, stage_layers: float
) -> float:
    """Layer-micro-batches of activations rank ``stage`` holds at its peak (x per-layer bytes);
    ``stage_layers`` is the number of transformer layers on that rank (all of its chunks)."""
    spec = SCHEDULES.get(schedule)
    if spec is not None and spec.virtual_stages:
        chunks = spec.in_flight_microbatches(pp=pp, vpp=vpp, stage=stage, num_micro=num_micro)
        return chunks * stage_layers / vpp
    micro = in_flight_microbatches(schedule, pp=pp, stage=stage, num_micro=num_micro)
    return micro * stage_layers


def head_activation_bytes(
    model: ModelConfig, micro_batch_size: float, *, tp: int, cp: int, sequence_parallel: bool
) -> float:
    """Last stage, per micro-batch: final-norm input (2sbh/t with SP) and LM-head input (2sbh).

    Korthikanti et al. Sec. 4.3 count 4sbh/t for these with SP; Megatron gathers the LM-head
    input over TP, so it is 2sbh unsharded here. The fp32 logits are counted as a transient.
    """
    tokens = micro_batch_size * model.seq_len / cp
    norm_in = ACTIVATION_BYTES * tokens * model.hidden_size / (tp if sequence_parallel else 1)
    return norm_in + ACTIVATION_BYTES * tokens * model.hidden_size


LOGITS_BYTES_PER_ELEMENT = {"compile": 10, "eager": 12}
"""Cross-entropy's peak over the logits, bytes per element, on the PyTorch stacks. Forward: the
bf16 logits (2), their fp32 upcast (4) and the fp32 log-softmax written beside it (4) = 10
(torchtitan's ``cross_entropy(pred.float())`` keeps ``pred`` while ``log_softmax`` writes). Eager
backward is higher: the saved log-softmax output, the dense fp32 gradient from
``nll_loss_backward`` and the fp32 output of ``log_softmax_backward`` live together = 12."""
MEGATRON_LOGITS_BYTES_PER_ELEMENT = {"none": 6, "native": 10, "te": 6, "te_inplace": 2}
"""The same peak for each of Megatron-Core's cross-entropies (``training.cross_entropy_fusion``;
``schedules.kernels.MEGATRON_CROSS_ENTROPY``). ``none``: the bf16 logits (2) and their fp32
upcast (4), which the shift, exponential and division then overwrite in place and the backward
scales in place before its cast to bf16 (4 + 2) = 6. ``native``: the same, but the backward's
functionalised scatter copies the saved softmax (4 + 4 + 2) = 10. ``te``: the bf16 logits and
the fp32 gradient written in the forward (2 + 4), then that gradient and its bf16 cast = 6.
``te_inplace``: the gradient written over the bf16 logits = 2."""
LOSS_PARALLEL_LOGITS_BYTES_PER_ELEMENT = 16
"""The same peak under torch's ``loss_parallel`` (torchtitan's default with tensor parallelism:
vocabulary-sharded logits, an uncompiled loss), whose DTensor handlers spell the loss out in
separate fp32 tensors (``torch/distributed/tensor/parallel/loss.py``). Forward,
``_log_softmax``: the bf16 logits (2), their fp32 upcast (4), ``shifted = x - max`` (4) and
``exp(shifted)`` or the result (4) together = 14. Backward, ``_nll_loss_and_log_softmax_backward``
on the saved fp32 log-probabilities (4): ``grad_input = zeros_like(x)`` (4), ``exp(x)`` (4) and
``grad_input + exp(x)`` (4) before the product replaces the exponential = 16."""
COMPILED_LOSS_LOGITS_BYTES_PER_ELEMENT = 4
"""The same peak when ``torch.compile`` fuses the loss (``schedules.stacks.loss_compiled``): the
bf16 logits kept for the backward (2) and their bf16 gradient (2); the fp32 upcast and softmax
live only in registers of the fused reductions
(``schedules.kernels.COMPILED_CROSS_ENTROPY_BYTES``)."""


def logits_bytes(
    model: ModelConfig, micro_batch_size: float, *, tp: int, cp: int, per_element: float = 10
) -> float:
    """Cross-entropy's logits buffers, one micro-batch on one GPU: ``per_element`` b s V/(t cp)."""
    tokens = micro_batch_size * model.seq_len / cp
    return per_element * tokens * model.vocab_size / tp
