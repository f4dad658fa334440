"""Floating-point operations of a transformer layer (forward, backward split, recompute) and a step.

A matmul of (m x k) by (k x n) costs 2mnk FLOPs (one multiply-add = 2 FLOPs). Per layer and
micro-batch of b sequences of s tokens (T = b s): QKV 2Th(h + 2kd), attention scores QK^T and
attention over values AV 2bs^2h each, output projection 2Th^2, MLP 2Thf per matrix (3 gated, 2 not).
Causal attention only needs half of the s x s products; ``causal=True`` halves QK^T and AV (what
fused causal kernels actually compute); ``causal=False`` counts them whole, as Narayanan et al.
(2021) and Korthikanti et al. (2022) do. Elementwise work (norms, softmax, activations) is not
counted: it is memory-bound and sub-percent of the FLOPs.

Backward = 2x forward: the input gradient (dX = dY W^T) and the weight gradient (dW = X^T dY) of
every weight GEMM each cost one forward GEMM; the attention core has no weights, so its 2x lands
entirely in the input-gradient part (dQ, dK from dS; dS, dV from dO). The split is what ZB-H1
schedules need.

    layer_flops(plan.model, micro_batch_size=1, recompute="selective").forward
"""

from __future__ import annotations

from dataclasses import dataclass

from schedules.mla import latent_linears
from schedules.moe import count_moe_layers, moe_mlp_forward_flops
from schedules.mtp import mtp_depths, mtp_layer_is_moe, mtp_projection_params
from schedules.plan import ModelConfig, Plan
from schedules.recompute_modules import selective_modules
from schedules.stages import chunk_layers, recomputed_fraction

FLOPS_DEFINITION = (
    "model FLOPs = 3 x forward matmul FLOPs (QKV, attention QK^T and AV {causal}, projection, "
    "MLP, LM head; 2 FLOPs per multiply-add), no recomputation"
)
"""The definition used for MFU, formatted with the causal wording."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerFlops:
    """FLOPs of one transformer layer for one micro-batch (on one GPU when sharded)."""

    forward: float
    """Forward pass."""
    backward_input: float
    """Backward input-gradient GEMMs plus the whole attention-core backward."""
    backward_weight: float
    """Backward weight-gradient GEMMs (deferred as 'W' in zero-bubble schedules)."""
    recompute: float
    """Extra forward before the backward: 0 (none), attention core (selective), forward (full)."""

    @property
    def backward(self) -> float:
        """Whole backward, input plus weight gradients (2x forward)."""
        return self.backward_input + self.backward_weight


def gemm_flops(m: float, n: float, k: float) -> float:
    """An (m x k) @ (k x n) matmul: 2mnk."""
    return 2.0 * m * n * k


def attention_linear_flops(model: ModelConfig, num_tokens: float) -> float:
    """QKV projection 2Th(ad + 2kd) plus output projection 2Th*ad, for T tokens (ad = h unless
    ``head_dim`` is set apart); under multi-head latent attention its down and up projections
    (``schedules.mla``) and the output projection 2Th*a*d_v."""
    h, q = model.hidden_size, model.q_size
    if model.multi_latent:
        inputs = sum(gemm_flops(num_tokens, x.out_width, x.in_width) for x in latent_linears(model))
        return inputs + gemm_flops(num_tokens, h, model.attention_out_size)
    return gemm_flops(num_tokens, q + 2 * model.kv_size, h) + gemm_flops(num_tokens, h, q)


def duplicated_linear_flops(model: ModelConfig, num_tokens: float) -> float:
    """FLOPs of the linears every tensor-parallel rank runs whole: multi-head latent
    attention's down projections (``schedules.mla``); 0 for other models."""
    if not model.multi_latent:
        return 0.0
    duplicated = (x for x in latent_linears(model) if x.duplicated)
    return sum(gemm_flops(num_tokens, x.out_width, x.in_width) for x in duplicated)


def mlp_flops(model: ModelConfig, num_tokens: float) -> float:
    """MLP matmuls: 2Thf per matrix, 3 matrices gated (6Thf), 2 otherwise (4Thf)."""
    num_matrices = 3 if model.gated_mlp else 2
    return num_matrices * gemm_flops(num_tokens, model.ffn_hidden_size, model.hidden_size)


def window_pairs_fraction(seq_len: float, window: float) -> float:
    """Fraction of the s x s query-key products a causal attention computes when each query
    sees only its ``window`` latest keys (itself included; 0: no window): 1/2 without a window
    (the lower triangle, the convention of ``attention_core_flops``), W/s - W^2/(2s^2) with one
    (the s - W later queries see W keys, the first W a triangle; the diagonal's s/2 dropped as
    in the unwindowed count), continuous at W = s."""
    if not 0 < window < seq_len:
        return 0.5
    return window / seq_len - window * window / (2.0 * seq_len * seq_len)


def attention_core_flops(model: ModelConfig, micro_batch_size: float, *, causal: bool) -> float:
    """QK^T and AV: 2 * 2bs^2 ad (4bs^2h where ad = h, unless ``head_dim`` is set apart; QK^T
    over the query heads' width, AV over the value heads'), halved when ``causal`` (only the
    lower triangle); with a sliding window (``model.attention_window``) only the products inside
    it (``window_pairs_fraction``), or, counted ``causal=False``, s x W."""
    s = model.seq_len
    full = gemm_flops(micro_batch_size * s, s, model.q_size)
    full += gemm_flops(micro_batch_size * s, s, model.attention_out_size)
    window = model.attention_window
    if causal:
        return full * window_pairs_fraction(s, window)
    return full * min(window, s) / s if window else full


def layer_forward_flops(model: ModelConfig, micro_batch_size: float, *, causal: bool) -> float:
    """One layer's forward: attention linears + attention core + MLP.

    GPT with f = 4h and MHA: 24bsh^2 + 4bs^2h (non-causal), Narayanan et al. 2021, Sec. 5.1.
    """
    tokens = micro_batch_size * model.seq_len
    return (
        attention_linear_flops(model, tokens)
        + attention_core_flops(model, micro_batch_size, causal=causal)
        + mlp_flops(model, tokens)
    )


def moe_layer_forward_flops(model: ModelConfig, micro_batch_size: float, *, causal: bool) -> float:
    """One MoE layer's forward: attention as in a dense layer, then the router, k routed experts
    and the shared experts per token (balanced routing: model FLOPs, not the busiest GPU's)."""
    tokens = micro_batch_size * model.seq_len
    return (
        attention_linear_flops(model, tokens)
        + attention_core_flops(model, micro_batch_size, causal=causal)
        + moe_mlp_forward_flops(model, tokens)
    )


def layers_forward_flops(model: ModelConfig, micro_batch_size: float, *, causal: bool) -> float:
    """Forward FLOPs of all L layers, dense and MoE."""
    num_moe = count_moe_layers(model, start=0, count=model.num_layers)
    dense = (model.num_layers - num_moe) * layer_forward_flops(
        model, micro_batch_size, causal=causal
    )
    if not num_moe:
        return dense
    return dense + num_moe * moe_layer_forward_flops(model, micro_batch_size, causal=causal)


def mtp_forward_flops(model: ModelConfig, micro_batch_size: float, *, causal: bool) -> float:
    """Forward FLOPs of the multi-token-prediction depths (``schedules.mtp``), as Megatron-LM's
    count adds them: per depth a layer of the last layer's kind, the 2h x h projection and one
    more LM-head GEMM (norms uncounted, as everywhere here)."""
    depths = mtp_depths(model)
    if not depths:
        return 0.0
    tokens = micro_batch_size * model.seq_len
    if mtp_layer_is_moe(model):
        layer = moe_layer_forward_flops(model, micro_batch_size, causal=causal)
    else:
        layer = layer_forward_flops(model, micro_batch_size, causal=causal)
    projection = 2.0 * tokens * mtp_projection_params(model)
    return depths * (layer + projection + logits_flops(model, micro_batch_size))


def recompute_flops(
    model: ModelConfig, micro_batch_size: float, *, recompute: str, causal: bool
) -> float:
    """Extra forward FLOPs of activation recomputation for one layer.

    full: the whole forward again; selective: only the attention core (QK^T, softmax, AV), the
    part Korthikanti et al. 2022 (Sec. 5) recompute because its activations are O(s^2) while its
    FLOPs are small; op: the matmuls torchtitan's per-op policy does not save (``op_recomputed_
    gemms``); none: 0.
    """
    if recompute == "full":
        return layer_forward_flops(model, micro_batch_size, causal=causal)
    if recompute == "selective":
        return attention_core_flops(model, micro_batch_size, causal=causal)
    if recompute == "op":
        tokens = micro_batch_size * model.seq_len
        return sum(gemm_flops(tokens, n, k) for n, k in op_recomputed_gemms(model))
    if recompute == "none":
        return 0.0
    raise ValueError(f"recompute={recompute!r} is not one of none, selective, full, op")


def op_recomputed_gemms(model: ModelConfig) -> tuple[tuple[float, float], ...]:
    """(n, k) of the weight matmuls torchtitan's per-op selective checkpointing recomputes.

    Its policy (``_save_list`` in torchtitan's activation checkpointing) saves the outputs of
    every odd-numbered ``aten.mm`` of a block and of the attention kernel and recomputes the
    rest. The block calls wq, wk, wv, wo, then w1, w3, w2 (gated) or w1, w2: the even ones are
    wk, wo and w3 (gated) or w2 (plain). The recompute stops once what the backward needs is
    back (non-reentrant ``torch.utils.checkpoint``), and w2's output only feeds the residual add,
    so a plain MLP reruns none of its matmuls: wk, wo (and w3), widths kd, h (and f).
    """
    h, f = model.hidden_size, model.ffn_hidden_size
    attention = ((model.kv_size, h), (h, model.q_size))
    return (*attention, (f, h)) if model.gated_mlp else attention


def layer_flops(
    model: ModelConfig,
    micro_batch_size: float,
    *,
    recompute: str = "none",
    causal: bool = True,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
) -> LayerFlops:
    """Forward, backward (input/weight split) and recompute FLOPs of one layer on one GPU.

    Every GEMM and the attention core are split evenly over the tp * cp GPUs of a layer (TP splits
    heads and the MLP width, CP splits the query tokens with load-balanced causal chunks), but
    multi-head latent attention's down projections, which every TP rank runs whole (on its own
    tokens under ``sequence_parallel``).
    """
    tokens = micro_batch_size * model.seq_len
    duplicated = duplicated_linear_flops(model, tokens)
    split = attention_linear_flops(model, tokens) + mlp_flops(model, tokens) - duplicated
    core = attention_core_flops(model, micro_batch_size, causal=causal)
    shards = tp * cp
    weight_gemms = split / shards + duplicated / (shards if sequence_parallel else cp)
    return LayerFlops(
        forward=weight_gemms + core / shards,
        backward_input=weight_gemms + 2 * core / shards,
        backward_weight=weight_gemms,
        recompute=recompute_flops(model, micro_batch_size, recompute=recompute, causal=causal)
        / shards,
    )


def logits_flops(model: ModelConfig, micro_batch_size: float) -> float:
    """LM-head forward: 2bshV (backward is twice that)."""
    return gemm_flops(micro_batch_size * model.seq_len, model.vocab_size, model.hidden_size)


def model_flops_per_step(plan: Plan, *, causal: bool = True) -> tuple[float, str]:
    """Model FLOPs of one optimizer step (whole cluster) and the definition string for MFU.

    3 x forward (forward + 2x backward) of all layers and the LM head over the global batch,
    without recomputation (recompute is hardware work, not model work: PaLM's MFU convention).
    """
    batch = plan.training.global_batch_size
    model = plan.model
    forward = layers_forward_flops(model, batch, causal=causal)
    forward += logits_flops(model, batch) + mtp_forward_flops(model, batch, causal=causal)
    wording = "halved for causal masking" if causal else "counted whole (non-causal)"
    definition = FLOPS_DEFINITION.format(causal=wording)
    if model.num_experts:
        definition += "; MoE layers: router, top-k routed and shared experts (active parameters)"
    if model.mtp_num_layers:
        definition += "; multi-token-prediction depths: their layers, projections and LM heads"
    return 3.0 * forward, definition


def hardware_flops_per_step(plan: Plan, *, causal: bool = True) -> float:
    """FLOPs the GPUs execute per step: model FLOPs plus recomputation."""
    model, parallel = plan.model, plan.parallel
    batch = plan.training.global_batch_size
    flops, _ = model_flops_per_step(plan, causal=causal)
    depths = mtp_depths(model)
    if parallel.recompute == "full":
        rerun = layers_forward_flops(model, batch, causal=causal)
        if parallel.recompute_num_layers is not None:  # block recompute: part of the layers
            rerun *= recomputed_fraction(parallel, chunk_layers(parallel, model.num_layers))
        elif depths:  # uniform recompute checkpoints each depth whole (block leaves them)
            layer = mtp_forward_flops(model, batch, causal=causal) / depths
            rerun += depths * (layer - logits_flops(model, batch))
        return flops + rerun
    extra = recompute_flops(model, batch, recompute=parallel.recompute, causal=causal)
    layers = model.num_layers + depths  # each depth's layer is checkpointed as the others
    return flops + layers * extra + module_recompute_flops(plan, batch, causal=causal)


def module_recompute_flops(plan: Plan, batch: float, *, causal: bool = True) -> float:
    """Matmul FLOPs over the whole model that Megatron-Core's recompute modules add beyond the
    attention core (``schedules.recompute_modules``), for ``batch`` sequences: latent
    attention's up projections (``mla_up_proj``), the dense layers' MLPs (``mlp``) and the MoE
    layers' shared experts (``shared_experts``), less the core where ``core_attn`` is not
    listed; 0 unless ``recompute: selective``."""
    if plan.parallel.recompute != "selective":
        return 0.0
    modules = selective_modules(plan.parallel)
    model = plan.model
    tokens = batch * model.seq_len
    depths = mtp_depths(model)  # each depth's layer is built from the same spec
    layers = model.num_layers + depths
    num_moe = count_moe_layers(model, start=0, count=model.num_layers)
    num_moe += depths if mtp_layer_is_moe(model) else 0
    matrices = 3 if model.gated_mlp else 2
    total = 0.0
    if "core_attn" not in modules:
        total -= layers * attention_core_flops(model, batch, causal=causal)
    if "mla_up_proj" in modules and model.multi_latent:
        up = (x for x in latent_linears(model) if not x.duplicated)  # a direct q projection too
        total += layers * sum(gemm_flops(tokens, x.out_width, x.in_width) for x in up)
    if "mlp" in modules:
        total += (layers - num_moe) * mlp_flops(model, tokens)
    if "shared_experts" in modules:
        shared = model.moe_shared_expert_ffn_hidden_size
        total += num_moe * matrices * gemm_flops(tokens, shared, model.hidden_size)
    return total


def narayanan_flops_per_iteration(
    batch_size: float, seq_len: int, num_layers: int, hidden_size: int, vocab_size: int
) -> float:
    """Narayanan et al. 2021 eq. (3): F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)).

    GPT with f = 4h, non-causal attention, full recomputation (4 forward passes per layer, 3 for
    the LM head); what their Table 1 TFLOP/s figures count.
    """
    b, s, layers, h = batch_size, seq_len, num_layers, hidden_size
    return 96 * b * s * layers * h**2 * (1 + s / (6 * h) + vocab_size / (16 * layers * h))
