"""Parameter counts of a dense decoder-only transformer, whole and per GPU under TP and PP.

Counted exactly from the weight shapes (h hidden, a heads, k kv heads, d = h/a, f ffn, V vocab,
s sequence, L layers): attention Q and O are h x h, K and V are h x kd (GQA); the MLP has 2 (GeLU)
or 3 (SwiGLU) h x f matrices; each layer has 2 norms (h for RMSNorm, 2h for LayerNorm; one in a
parallel block); biases
when ``linear_bias``; a V x h word embedding, an s x h learned position embedding when asked,
a final norm and an untied V x h LM head.

    total_params(plan.model)
"""

from __future__ import annotations

from schedules.mla import latent_duplicated_params, latent_input_params, latent_norm_widths
from schedules.moe import (
    active_expert_params,
    count_moe_layers,
    expert_params,
    expert_params_per_gpu,
    moe_dense_params_per_gpu,
    router_params,
    shared_expert_params,
)
from schedules.mtp import MTP_NORMS, mtp_depths, mtp_layer_is_moe, mtp_projection_params
from schedules.plan import ModelConfig, ParallelConfig, Plan
from schedules.stages import chunk_first_layer, chunk_layers, rank_layers

PARAM_BYTES = 2
"""Bytes per parameter in the training dtype (bf16/fp16; FP8 runs keep bf16 master weights)."""
FP8_PARAM_BYTES = 1
"""Bytes per parameter of a weight gathered in FP8 (torchao's float8 all-gather, Megatron's
``fp8_param_gather``)."""


def mixed_gather_bytes(params: float, fp8_params: float) -> float:
    """Bytes of an all-gather of ``params`` parameters of which ``fp8_params`` go in FP8 and the
    rest in the training dtype."""
    return fp8_params * FP8_PARAM_BYTES + (params - fp8_params) * PARAM_BYTES


def attention_params(model: ModelConfig) -> int:
    """Q, K, V and output projections: h*(ad + 2kd) + ad*h (ad = h unless ``head_dim`` is set
    apart), plus biases (ad + 2kd + h); under multi-head latent attention its down and up
    projections (``schedules.mla``; Megatron-Core builds them without biases) and the
    a*d_v-wide output projection (its bias h with ``linear_bias``)."""
    h, q, kv = model.hidden_size, model.q_size, model.kv_size
    if model.multi_latent:
        weights = latent_input_params(model) + model.attention_out_size * h
        return weights + (h if model.linear_bias else 0)
    weights = h * (q + 2 * kv) + q * h
    biases = (q + 2 * kv) + h if model.linear_bias else 0
    return weights + biases


def mlp_params(model: ModelConfig) -> int:
    """MLP matrices: 3hf gated (gate, up, down) or 2hf, plus biases (2f + h gated, f + h not)."""
    h, f = model.hidden_size, model.ffn_hidden_size
    num_in = 2 if model.gated_mlp else 1
    weights = (num_in + 1) * h * f
    biases = num_in * f + h if model.linear_bias else 0
    return weights + biases


def norm_params(model: ModelConfig) -> int:
    """One normalisation layer: h (RMSNorm weight) or 2h (LayerNorm weight and bias)."""
    return (2 if model.norm == "layernorm" else 1) * model.hidden_size


def layer_params(model: ModelConfig) -> int:
    """One transformer layer: attention + MLP + its norms (2; 1 in a parallel block).

    For GPT (MHA, f = 4h, biases, LayerNorm) this is 12h^2 + 13h, the per-layer term of
    Megatron's formula (Narayanan et al. 2021, Sec. 5.1).
    """
    norms = model.norms_per_layer * norm_params(model) + qk_norm_params(model)
    return attention_params(model) + mlp_params(model) + norms


def qk_norm_params(model: ModelConfig) -> int:
    """The attention's inner norms: the query and key norms' weights (``model.qk_norm``), d each,
    shared by the heads; under multi-head latent attention the latents' norms
    (``schedules.mla.latent_norm_widths``, weight and bias each for a LayerNorm)."""
    if model.multi_latent:
        return (2 if model.norm == "layernorm" else 1) * sum(latent_norm_widths(model))
    return 2 * model.head_dim if model.qk_norm else 0


def embedding_params(model: ModelConfig) -> int:
    """Input embeddings: V*h word embedding, plus s*h if position embeddings are learned."""
    position = model.seq_len * model.hidden_size if model.position_embedding == "learned" else 0
    return model.vocab_size * model.hidden_size + position


def lm_head_params(model: ModelConfig) -> int:
    """Output projection V*h, or 0 when tied to the word embedding."""
    return 0 if model.tied_embeddings else model.vocab_size * model.hidden_size


def moe_layer_params(model: ModelConfig) -> int:
    """One MoE layer: a dense layer whose MLP is replaced by the router, the routed experts and
    the shared experts (``schedules.moe``)."""
    moe_mlp = router_params(model) + expert_params(model) + shared_expert_params(model)
    return layer_params(model) - mlp_params(model) + moe_mlp


def total_params(model: ModelConfig) -> int:
    """All parameters: L layers + embeddings + final norm + LM head (counted once when tied)
    + the multi-token-prediction depths (``mtp_params``)."""
    num_moe = count_moe_layers(model, start=0, count=model.num_layers)
    return (
        (model.num_layers - num_moe) * layer_params(model)
        + num_moe * moe_layer_params(model)
        + embedding_params(model)
        + norm_params(model)
        + lm_head_params(model)
        + mtp_params(model)
    )


def mtp_params(model: ModelConfig) -> int:
    """The multi-token-prediction depths (``schedules.mtp``): per depth one layer of the last
    layer's kind, its 2h x h projection and three norms (the embedding and head are shared)."""
    depths = mtp_depths(model)
    if not depths:
        return 0
    layer = moe_layer_params(model) if mtp_layer_is_moe(model) else layer_params(model)
    return depths * (layer + mtp_projection_params(model) + MTP_NORMS * norm_params(model))


def active_params(model: ModelConfig) -> float:
    """Parameters one token goes through (MFU of MoE models counts these): every dense weight,
    the router, k routed experts and the shared experts of each MoE layer (the multi-token-
    prediction depths' MoE layers included)."""
    num_moe = count_moe_layers(model, start=0, count=model.num_layers)
    num_moe += mtp_depths(model) if mtp_layer_is_moe(model) else 0
    routed_all = router_params(model) + expert_params(model) + shared_expert_params(model)
    return total_params(model) - num_moe * (routed_all - active_expert_params(model))


def megatron_gpt_params(num_layers: int, hidden_size: int, vocab_size: int, seq_len: int) -> float:
    """Megatron's GPT count P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)).

    Narayanan et al. 2021 (arXiv:2104.04473), Sec. 5.1; it leaves out the final LayerNorm (2h),
    so ``total_params`` of the same GPT is exactly this plus 2h.
    """
    layers, h = num_layers, hidden_size
    return 12 * layers * h**2 * (1 + 13 / (12 * h) + (vocab_size + seq_len) / (12 * layers * h))


def layer_params_per_gpu(model: ModelConfig, tp: int) -> float:
    """One layer's parameters on one TP rank.

    Column- and row-parallel weights and column-parallel biases are split t ways; the norms and
    the row-parallel output biases (h each for the attention projection and the MLP down
    projection) are replicated on every TP rank, as in Megatron, and so are multi-head latent
    attention's down projections (``schedules.mla``).
    """
    norms = model.norms_per_layer * norm_params(model) + qk_norm_params(model)
    replicated = norms + (2 * model.hidden_size if model.linear_bias else 0)
    if model.multi_latent:
        replicated += latent_duplicated_params(model)
    return (layer_params(model) - replicated) / tp + replicated


def moe_layer_params_per_gpu(model: ModelConfig, parallel: ParallelConfig) -> float:
    """One MoE layer on one GPU: the dense layer without its MLP, plus the router and shared
    experts (dense layout) and E / ep routed experts split etp ways."""
    h, bias = model.hidden_size, model.linear_bias
    dense_mlp = (mlp_params(model) - (h if bias else 0)) / parallel.tp + (h if bias else 0)
    dense = layer_params_per_gpu(model, parallel.tp) - dense_mlp
    return (
        dense + moe_dense_params_per_gpu(model, parallel) + expert_params_per_gpu(model, parallel)
    )


def vstage_moe_layers(plan: Plan, vstage: int) -> int:
    """MoE layers of virtual stage ``vstage`` (index ``chunk * pp + rank``)."""
    model, parallel = plan.model, plan.parallel
    count = chunk_layers(parallel, model.num_layers)[vstage]
    first = chunk_first_layer(parallel, model.num_layers, vstage)
    return count_moe_layers(model, start=first, count=count)


def stage_moe_layers(plan: Plan, stage: int) -> int:
    """MoE layers held by pipeline rank ``stage`` (all of its chunks)."""
    p = plan.parallel.pp
    return sum(vstage_moe_layers(plan, c * p + stage) for c in range(plan.parallel.vpp))


def stage_expert_params_per_gpu(plan: Plan, stage: int) -> float:
    """Routed-expert parameters on one GPU of pipeline rank ``stage`` (reduced over the
    expert-data-parallel group instead of dp), the last stage's multi-token-prediction
    depths' included."""
    layers = stage_moe_layers(plan, stage)
    if stage == plan.parallel.pp - 1:
        layers += mtp_moe_layers(plan.model)
    return layers * expert_params_per_gpu(plan.model, plan.parallel)


def mtp_moe_layers(model: ModelConfig) -> int:
    """MoE layers of the multi-token-prediction depths (all on the last virtual stage)."""
    return mtp_depths(model) if mtp_layer_is_moe(model) else 0


def mtp_params_per_gpu(plan: Plan) -> float:
    """The multi-token-prediction depths on one GPU of the last pipeline stage: their layers,
    projections (column-parallel) and norms, plus the input embedding they look ahead with
    where the first stage is another rank (Megatron builds one there, its gradient summed with
    the first stage's; with tied embeddings beside the output layer's own weight, which it
    still allocates)."""
    model, parallel = plan.model, plan.parallel
    depths = mtp_depths(model)
    if not depths:
        return 0.0
    t = parallel.tp
    if mtp_layer_is_moe(model):
        layer = moe_layer_params_per_gpu(model, parallel)
    else:
        layer = layer_params_per_gpu(model, t)
    per_depth = layer + mtp_projection_params(model) / t + MTP_NORMS * norm_params(model)
    # with tied embeddings the last stage still allocates its output layer's weight and holds
    # the embedding beside it (GPTModel builds the embedding wherever the depths run)
    embedding = embedding_params_per_gpu(model, t) if parallel.pp > 1 else 0.0
    return depths * per_depth + embedding


def layers_per_stage(plan: Plan, stage: int) -> int:
    """Transformer layers on pipeline rank ``stage`` (all of its virtual chunks together): L / p,
    or the plan's uneven split (``schedules.stages``)."""
    return rank_layers(plan.parallel, plan.model.num_layers)[stage]


def embedding_params_per_gpu(model: ModelConfig, tp: int) -> float:
    """The input embedding on one GPU: the vocab-parallel word embedding (V h / t) and the
    replicated learned position embedding, if any."""
    vocab = model.vocab_size * model.hidden_size
    return vocab / tp + embedding_params(model) - vocab


def stage_layer_params_per_gpu(plan: Plan, stage: int) -> float:
    """Parameters of the transformer layers one GPU of pipeline rank ``stage`` holds (its
    MoE layers with their routed experts): ``stage_params_per_gpu`` less the embedding, the
    final norm, the head and the multi-token-prediction depths."""
    model, parallel = plan.model, plan.parallel
    per_layer = layer_params_per_gpu(model, parallel.tp)
    moe_extra = moe_layer_params_per_gpu(model, parallel) - per_layer
    return layers_per_stage(plan, stage) * per_layer + stage_moe_layers(plan, stage) * moe_extra


def stage_params_per_gpu(plan: Plan, stage: int) -> float:
    """Parameters held by one GPU of pipeline rank ``stage`` (TP-sharded, before DP sharding).

    The first stage adds the vocab-parallel word embedding (V h / t) and the replicated learned
    position embedding; the last adds the final norm and the LM head. With p > 1 and tied
    embeddings Megatron keeps a copy of the word embedding on the last stage (its gradient is
    all-reduced between the two), so the last stage holds V h / t either way.
    """
    model, parallel = plan.model, plan.parallel
    p, t = parallel.pp, parallel.tp
    if not 0 <= stage < p:
        raise ValueError(f"pipeline stage {stage} is outside 0..{p - 1} (pp={p})")
    vocab_shard = model.vocab_size * model.hidden_size / t
    count = stage_layer_params_per_gpu(plan, stage)
    if stage == 0:
        count += embedding_params_per_gpu(model, t)
    if stage == p - 1:
        count += norm_params(model)
        if not model.tied_embeddings or p > 1:
            count += vocab_shard
        count += mtp_params_per_gpu(plan)
    return count
