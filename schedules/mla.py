"""Multi-head latent attention (DeepSeek-V2 and V3, Kimi K2): the linears that replace the QKV
projection, as Megatron-Core's ``MLASelfAttention`` builds them
(``megatron/core/transformer/multi_latent_attention.py``).

The query is projected down to ``q_lora_rank``, normed and projected up to every head's
``qk_head_dim`` (``head_dim`` plus the rotary ``qk_rope_head_dim``), or projected directly when
``q_lora_rank`` is 0. The keys and values share one latent: the hidden state projected down to
``kv_lora_rank`` plus one rotary key of ``qk_rope_head_dim`` shared by the heads; the latent is
normed and projected up to every head's non-rotary key and value. The down projections are
whole on every tensor-parallel rank (``parallel_mode="duplicated"``); the up projections are
column-parallel; the output projection (a * v_head_dim to h) is row-parallel as in any layer.

    [(x.name, x.in_width, x.out_width) for x in latent_linears(model)]
"""

from __future__ import annotations

from dataclasses import dataclass

from schedules.plan import ModelConfig, ParallelConfig


@dataclass(frozen=True, slots=True)
class LatentLinear:
    """One linear of multi-head latent attention's input side."""

    name: str
    """Megatron-Core's module name less ``linear_`` and ``_proj`` (``q_down``, ``kv_up``)."""
    in_width: int
    """Input features."""
    out_width: int
    """Output features (whole: the up projections are split over TP ranks)."""
    duplicated: bool
    """Whole on every tensor-parallel rank (the down projections), else column-parallel."""

    @property
    def params(self) -> int:
        """Weight elements."""
        return self.in_width * self.out_width

    def out_width_per_gpu(self, tp: int) -> float:
        """Output features on one tensor-parallel rank."""
        return float(self.out_width) if self.duplicated else self.out_width / tp


def latent_linears(model: ModelConfig) -> tuple[LatentLinear, ...]:
    """The query and key/value linears of one latent-attention layer, in the order the forward
    runs them (query, then key/value)."""
    h, a = model.hidden_size, model.num_heads
    query = a * model.qk_head_dim
    if model.q_lora_rank:
        q: tuple[LatentLinear, ...] = (
            LatentLinear("q_down", h, model.q_lora_rank, duplicated=True),
            LatentLinear("q_up", model.q_lora_rank, query, duplicated=False),
        )
    else:
        q = (LatentLinear("q", h, query, duplicated=False),)
    key_value = a * (model.head_dim + model.value_head_dim)
    kv = (
        LatentLinear("kv_down", h, model.kv_lora_rank + model.qk_rope_head_dim, duplicated=True),
        LatentLinear("kv_up", model.kv_lora_rank, key_value, duplicated=False),
    )
    return q + kv


def latent_norm_widths(model: ModelConfig) -> tuple[int, ...]:
    """Widths of the latent norms (the query latent's when ``q_lora_rank`` is set, the key/value
    latent's): Megatron fuses each into the up projection that reads it
    (``TELayerNormColumnParallelLinear``)."""
    return (*((model.q_lora_rank,) if model.q_lora_rank else ()), model.kv_lora_rank)


def latent_input_params(model: ModelConfig) -> int:
    """Weights of the query and key/value linears (the output projection aside)."""
    return sum(linear.params for linear in latent_linears(model))


def latent_duplicated_params(model: ModelConfig) -> int:
    """Weights whole on every tensor-parallel rank: the down projections."""
    return sum(linear.params for linear in latent_linears(model) if linear.duplicated)


def latent_output_widths(model: ModelConfig, tp: int) -> float:
    """Outputs of the query and key/value linears per token on one TP rank."""
    return sum(linear.out_width_per_gpu(tp) for linear in latent_linears(model))


def latent_split(parallel: ParallelConfig, stack: str) -> int:
    """Ranks one latent is split over: the TP ranks under sequence parallelism on the megatron
    ``stack`` (its down projections run on each rank's own tokens and the latents are gathered
    in the up projections), else 1 (whole on each rank: torchtitan's DeepSeek-V3 gathers the
    attention's input before its down projections)."""
    if parallel.sequence_parallel and stack == "megatron":
        return parallel.tp
    return 1


def latent_norm_elements(model: ModelConfig, tokens: float, split: int) -> float:
    """Elements the latent norms read per micro-batch on one GPU: ``tokens`` times both
    latents' widths, over the ranks they are ``split`` over (``latent_split``)."""
    return tokens * sum(latent_norm_widths(model)) / split
