"""A plan's transformer in plain PyTorch, for timing real training steps (``commbench --step``).

Built from the plan's ``model:`` section as the eager reference implementations are written
(Llama / Qwen3 / GPT in torchtitan and nanoGPT): token embedding (plus learned positions), per
layer a norm, a fused QKV projection (or separate Q, K and V ones: ``separate_projections``) with
grouped-query heads of width ``head_dim``, each query and key head normed (``qk_norm``), rotary
embeddings, causal ``scaled_dot_product_attention``, the output projection, a residual add, a
norm, a gated (SwiGLU / GeGLU) or plain (GeLU / ReLU) MLP and a residual add (a
``parallel_block`` adds attention and MLP of one normed input together); then the final norm,
the LM head (tied or not) and an fp32 cross-entropy. Recompute follows the plan: ``full``
checkpoints every layer, ``selective`` the attention core (``torch.utils.checkpoint``,
non-reentrant), ``op`` every layer under torchtitan's per-op policy (``_apply_op_sac``: the
attention outputs and every other matmul output of the layer are saved, the rest recomputed; on
fused QKV and up projections that saves QKV and up and reruns only the output projection, on
separate ones, as torchtitan's, it reruns wk, wo and w3). Multi-head latent
attention is built as DeepSeek writes it (``LatentAttention``). Mixture-of-experts layers,
sliding-window attention, dropout and multi-token prediction are not built: ``check_buildable``
refuses them.

    model = build_model(plan.model, num_layers=4, recompute="none").to(device)
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import (
    CheckpointPolicy,
    checkpoint,
    create_selective_checkpoint_contexts,
)

from schedules.plan import ModelConfig

ROPE_THETA = 10_000.0
"""Rotary base (Llama 2; Llama 3 uses 500,000: the kernels are the same)."""


_MATMULS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default})
_ATTENTION_OPS = frozenset(
    getattr(torch.ops.aten, name).default
    for name in (
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_for_cpu",
    )
    if hasattr(torch.ops.aten, name)
)


def op_policy_contexts() -> Any:
    """torchtitan's per-op policy for one layer's forward: save the attention outputs and the
    odd-numbered matmul outputs (counted separately in the forward and in the recompute), let
    the rest be recomputed."""
    counts = {False: 0, True: 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
        if func in _MATMULS:
            counts[ctx.is_recompute] += 1
            odd = counts[ctx.is_recompute] % 2 == 1
            return CheckpointPolicy.MUST_SAVE if odd else CheckpointPolicy.PREFER_RECOMPUTE
        if func in _ATTENTION_OPS:
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return create_selective_checkpoint_contexts(policy)


def _norm(model: ModelConfig) -> nn.Module:
    if model.norm == "layernorm":
        return nn.LayerNorm(model.hidden_size)
    return nn.RMSNorm(model.hidden_size)


def rotary_tables(seq_len: int, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (seq_len, head_dim / 2)."""
    inverse = 1.0 / ROPE_THETA ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float32), inverse)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (batch, heads, seq, head_dim) pairs of channels by the position's angle."""
    first, second = x[..., 0::2], x[..., 1::2]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    rotated = torch.stack((first * cos - second * sin, first * sin + second * cos), dim=-1)
    return rotated.flatten(-2)


class Attention(nn.Module):
    """QKV (fused or separate), grouped-query causal attention, output projection."""

    def __init__(self, model: ModelConfig, *, checkpoint_core: bool, repeat_kv: bool) -> None:
        super().__init__()
        self.repeat_kv = repeat_kv
        self.heads, self.kv_heads, self.head_dim = (
            model.num_heads,
            model.num_kv_heads,
            model.head_dim,
        )
        self.rope = model.position_embedding == "rope"
        self.checkpoint_core = checkpoint_core
        h, bias = model.hidden_size, model.linear_bias
        self.widths = (model.q_size, model.kv_size, model.kv_size)
        self.qkv: nn.Module | None = None
        self.separate: nn.ModuleList | None = None
        if model.separate_projections:
            self.separate = nn.ModuleList(nn.Linear(h, width, bias=bias) for width in self.widths)
        else:
            self.qkv = nn.Linear(h, sum(self.widths), bias=bias)
        # RMSNorms whatever the model's norm (Qwen3's; d weights each, as the plan counts)
        self.q_norm = nn.RMSNorm(model.head_dim) if model.qk_norm else None
        self.k_norm = nn.RMSNorm(model.head_dim) if model.qk_norm else None
        self.out = nn.Linear(model.q_size, h, bias=bias)

    def _core(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.kv_heads == self.heads:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        if not self.repeat_kv:  # the kernel reads the grouped heads (training.repeat_kv false)
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def _project(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.separate is not None:
            return tuple(projection(x) for projection in self.separate)
        assert self.qkv is not None
        return self.qkv(x).split(self.widths, dim=-1)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self._project(x)
        q = q.view(batch, seq, self.heads, self.head_dim)
        k = k.view(batch, seq, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:  # per head, before rotary
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = v.view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        if self.rope:
            q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        if self.checkpoint_core and torch.is_grad_enabled():
            y = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            y = self._core(q, k, v)
        return self.out(y.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))


def _latent_norm(model: ModelConfig, width: int) -> nn.Module:
    """A latent's norm, of the model's kind (as the plan counts its parameters)."""
    return nn.LayerNorm(width) if model.norm == "layernorm" else nn.RMSNorm(width)


class LatentAttention(nn.Module):
    """Multi-head latent attention as DeepSeek-V2/V3 write it (``modeling_deepseek.py``'s
    ``DeepseekV3Attention``, the plan's ``schedules.mla``): the query projected down, normed and
    up (or directly when ``q_lora_rank`` is 0), the keys and values from one normed latent
    projected up to every head, rotary on each head's ``qk_rope_head_dim`` channels and on the one
    rotary key all heads share, causal attention over queries and keys of ``head_dim +
    qk_rope_head_dim`` and values of ``value_head_dim``, the output projection (the only one
    with a bias under ``linear_bias``, as Megatron-Core builds it)."""

    def __init__(self, model: ModelConfig, *, checkpoint_core: bool) -> None:
        super().__init__()
        h, bias, a = model.hidden_size, model.linear_bias, model.num_heads
        self.heads, self.nope, self.rope_dim = a, model.head_dim, model.qk_rope_head_dim
        self.value_dim, self.kv_rank = model.value_head_dim, model.kv_lora_rank
        self.rope = model.position_embedding == "rope"
        self.checkpoint_core = checkpoint_core
        query = a * model.qk_head_dim
        self.q_down: nn.Linear | None = None
        self.q_norm: nn.Module | None = None
        if model.q_lora_rank:
            self.q_down = nn.Linear(h, model.q_lora_rank, bias=False)
            self.q_norm = _latent_norm(model, model.q_lora_rank)
            self.q_up = nn.Linear(model.q_lora_rank, query, bias=False)
        else:
            self.q_up = nn.Linear(h, query, bias=False)
        self.kv_down = nn.Linear(h, model.kv_lora_rank + self.rope_dim, bias=False)
        self.kv_norm = _latent_norm(model, model.kv_lora_rank)
        self.kv_up = nn.Linear(model.kv_lora_rank, a * (self.nope + self.value_dim), bias=False)
        self.out = nn.Linear(a * self.value_dim, h, bias=bias)

    @staticmethod
    def _core(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        latent = x if self.q_down is None or self.q_norm is None else self.q_norm(self.q_down(x))
        q = self.q_up(latent).view(batch, seq, self.heads, -1).transpose(1, 2)
        q_nope, q_rope = q.split((self.nope, self.rope_dim), dim=-1)
        kv_latent, k_rope = self.kv_down(x).split((self.kv_rank, self.rope_dim), dim=-1)
        kv = self.kv_up(self.kv_norm(kv_latent)).view(batch, seq, self.heads, -1).transpose(1, 2)
        k_nope, v = kv.split((self.nope, self.value_dim), dim=-1)
        k_rope = k_rope.view(batch, 1, seq, self.rope_dim)  # one rotary key for every head
        if self.rope:
            q_rope, k_rope = apply_rotary(q_rope, cos, sin), apply_rotary(k_rope, cos, sin)
        q = torch.cat((q_nope, q_rope), dim=-1)
        k = torch.cat((k_nope, k_rope.expand(-1, self.heads, -1, -1)), dim=-1)
        if self.checkpoint_core and torch.is_grad_enabled():
            y = checkpoint(self._core, q, k, v, use_reentrant=False)
        else:
            y = self._core(q, k, v)
        return self.out(y.transpose(1, 2).reshape(batch, seq, self.heads * self.value_dim))


class Mlp(nn.Module):
    """Gated (one 2f-wide up projection split, or separate gate and up ones) or plain MLP."""

    def __init__(self, model: ModelConfig) -> None:
        super().__init__()
        self.gated = model.gated_mlp
        self.activation = model.activation
        h, f, bias = model.hidden_size, model.ffn_hidden_size, model.linear_bias
        self.gate: nn.Linear | None = None
        if self.gated and model.separate_projections:
            self.gate, self.up = nn.Linear(h, f, bias=bias), nn.Linear(h, f, bias=bias)
        else:
            self.up = nn.Linear(h, f * (2 if self.gated else 1), bias=bias)
        self.down = nn.Linear(f, h, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            gate, value = self.gate(x), self.up(x)
        elif self.gated:
            gate, value = self.up(x).chunk(2, dim=-1)
        else:
            hidden = self.up(x)
            return self.down(F.relu(hidden) if self.activation == "relu" else F.gelu(hidden))
        act = F.silu(gate) if self.activation == "swiglu" else F.gelu(gate)
        return self.down(act * value)


class Block(nn.Module):
    """One pre-norm transformer layer (attention then MLP, or both on one normed input)."""

    def __init__(self, model: ModelConfig, *, checkpoint_core: bool, repeat_kv: bool) -> None:
        super().__init__()
        self.parallel = model.parallel_block
        self.norm1 = _norm(model)
        self.norm2 = None if self.parallel else _norm(model)
        self.attention: nn.Module = (
            LatentAttention(model, checkpoint_core=checkpoint_core)
            if model.multi_latent
            else Attention(model, checkpoint_core=checkpoint_core, repeat_kv=repeat_kv)
        )
        self.mlp = Mlp(model)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        if self.norm2 is None:  # parallel block: both branches read one norm, added together
            normed = self.norm1(x)
            return x + self.attention(normed, cos, sin) + self.mlp(normed)
        x = x + self.attention(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class Decoder(nn.Module):
    """Embedding, layers, final norm, LM head; ``forward`` returns the fp32 mean loss."""

    def __init__(
        self, model: ModelConfig, *, num_layers: int, recompute: str, repeat_kv: bool = True
    ) -> None:
        super().__init__()
        self.recompute = recompute
        self.embed = nn.Embedding(model.vocab_size, model.hidden_size)
        self.positions = (
            nn.Embedding(model.seq_len, model.hidden_size)
            if model.position_embedding == "learned"
            else None
        )
        self.layers = nn.ModuleList(
            Block(model, checkpoint_core=recompute == "selective", repeat_kv=repeat_kv)
            for _ in range(num_layers)
        )
        self.norm = _norm(model)
        self.head = nn.Linear(model.hidden_size, model.vocab_size, bias=False)
        if model.tied_embeddings:
            self.head.weight = self.embed.weight
        rotary = model.qk_rope_head_dim if model.multi_latent else model.head_dim
        cos, sin = rotary_tables(model.seq_len, rotary)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        for parameter in self.parameters():
            if parameter.dim() > 1:
                nn.init.normal_(parameter, std=1.0 / math.sqrt(parameter.shape[-1]))

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        seq = tokens.shape[1]
        x = self.embed(tokens)
        if self.positions is not None:
            x = x + self.positions(torch.arange(seq, device=tokens.device))
        cos, sin = self.get_buffer("cos")[:seq], self.get_buffer("sin")[:seq]
        for layer in self.layers:
            if self.recompute == "full" and torch.is_grad_enabled():
                x = checkpoint(layer, x, cos, sin, use_reentrant=False)
            elif self.recompute == "op" and torch.is_grad_enabled():
                x = checkpoint(
                    layer, x, cos, sin, use_reentrant=False, context_fn=op_policy_contexts
                )
            else:
                x = layer(x, cos, sin)
        logits = self.head(self.norm(x))
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())


def check_buildable(model: ModelConfig) -> None:
    """Refuse, with one line naming the key, a model this loop does not build (so nothing is
    measured as something it is not)."""
    unbuilt = (
        ("num_experts", model.num_experts, "mixture-of-experts layers"),
        ("attention_window", model.attention_window, "sliding-window attention"),
        ("dropout", model.dropout, "dropout"),
        ("mtp_num_layers", model.mtp_num_layers, "multi-token prediction"),
    )
    for key, value, what in unbuilt:
        if value:
            raise ValueError(
                f"model.{key}={value}: commbench --step does not build {what}; measure the "
                f"model without it"
            )


def build_model(
    model: ModelConfig, *, num_layers: int, recompute: str, repeat_kv: bool = True
) -> Decoder:
    """The plan's model with ``num_layers`` layers (a slice when fewer than the model has);
    ``repeat_kv``: grouped K/V heads repeated before attention (``training.repeat_kv``), else
    handed to SDPA as they are (``enable_gqa``)."""
    if num_layers < 1:
        raise ValueError(f"--layers must be >= 1, got {num_layers}")
    check_buildable(model)
    return Decoder(model, num_layers=num_layers, recompute=recompute, repeat_kv=repeat_kv)


def batch_of(model: ModelConfig, micro_batch_size: int, device: Any) -> tuple[torch.Tensor, ...]:
    """Random token ids and labels of one micro-batch."""
    generator = torch.Generator(device="cpu").manual_seed(0)
    shape = (micro_batch_size, model.seq_len)
    tokens = torch.randint(0, model.vocab_size, shape, generator=generator)
    labels = torch.randint(0, model.vocab_size, shape, generator=generator)
    return tokens.to(device), labels.to(device)
