"""Model shapes the tests share: Megatron's GPT family and Llama 3 70B, as published."""

from __future__ import annotations

from typing import Any

from schedules.plan import ModelConfig


def gpt(num_layers: int, hidden_size: int, num_heads: int, *, seq_len: int = 2048) -> ModelConfig:
    """A Megatron GPT: GeLU MLP 4h, LayerNorm, biases, learned positions, tied embeddings."""
    return ModelConfig(
        name="gpt",
        num_layers=num_layers,
        hidden_size=hidden_size,
        num_heads=num_heads,
        ffn_hidden_size=4 * hidden_size,
        vocab_size=51200,
        seq_len=seq_len,
        mlp_activation="gelu",
        tied_embeddings=True,
        position_embedding="learned",
        norm="layernorm",
        linear_bias=True,
        dropout=True,
    )


LLAMA3_70B = ModelConfig(
    name="llama3-70b",
    num_layers=80,
    hidden_size=8192,
    num_heads=64,
    num_kv_heads=8,
    ffn_hidden_size=28672,
    vocab_size=128256,
    seq_len=8192,
)
"""Llama 3 70B (GQA with 8 KV heads, SwiGLU 28672, vocabulary 128256)."""


TINY_FP8_LAYER = {
    "name": "tiny",
    "num_layers": 2,
    "hidden_size": 64,
    "num_heads": 4,
    "ffn_hidden_size": 128,
    "vocab_size": 256,
    "seq_len": 32,
}
"""The tiny layer whose FP8 cast bytes the float8 and Transformer Engine tests count by hand."""


def fp8_cast_bytes_per_phase(plan: Any) -> tuple[float, float, float]:
    """Bytes of a layer's ``*_fp8_cast`` kernels in forward, input backward, weight backward."""
    from schedules.kernels import layer_kernels

    layer = layer_kernels(plan)
    phases = (layer.forward, layer.backward_input, layer.backward_weight)
    fwd, bwd_in, bwd_w = (
        sum(k.bytes for k in kernels if k.name.endswith("_fp8_cast")) for kernels in phases
    )
    return fwd, bwd_in, bwd_w
