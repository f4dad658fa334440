"""Published model shapes, usable as ``model: llama3-70b`` or ``model: {preset: llama3-70b, ...}``.

Each preset is the ``model:`` mapping of a plan with the source of its numbers (the paper's table
or the released ``config.json``); keys given next to ``preset`` override it (``seq_len`` is the
usual one: the presets carry the pre-training sequence length). Known simplifications: Qwen2.5
puts biases on the QKV projection only (``linear_bias`` here is all-or-none: off, 0.01% of the
parameters). Mistral 7B carries its 4096-token sliding window (``attention_window``).

    model = resolve_model_preset({"preset": "llama3-70b", "seq_len": 4096})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fileio.strict import did_you_mean

_LLAMA = {"mlp_activation": "swiglu", "norm": "rmsnorm", "position_embedding": "rope"}
_GPT = {
    "mlp_activation": "gelu",
    "norm": "layernorm",
    "position_embedding": "learned",
    "linear_bias": True,
    "tied_embeddings": True,
}


def _llama(layers: int, hidden: int, heads: int, kv: int, ffn: int, vocab: int, seq: int) -> dict:
    return {
        "num_layers": layers,
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": kv,
        "ffn_hidden_size": ffn,
        "vocab_size": vocab,
        "seq_len": seq,
        **_LLAMA,
    }


def _mla(*, q_lora_rank: int) -> dict:
    """DeepSeek's multi-head latent attention (``schedules.mla``): a 512-wide key/value latent,
    heads of 128 + 64 rotary channels for queries and keys and 128 for values."""
    return {
        "kv_lora_rank": 512,
        "q_lora_rank": q_lora_rank,
        "head_dim": 128,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
    }


def _megatron_gpt(layers: int, hidden: int, heads: int) -> dict:
    """Narayanan et al. 2021 Table 1 GPT: f = 4h, V = 51,200, s = 2,048."""
    return {
        "num_layers": layers,
        "hidden_size": hidden,
        "num_heads": heads,
        "ffn_hidden_size": 4 * hidden,
        "vocab_size": 51200,
        "seq_len": 2048,
        **_GPT,
    }


def _moe(base: dict, experts: int, top_k: int, width: int, **extra: int) -> dict:
    """A Llama-style shape whose MLPs are routed experts (``schedules.moe``)."""
    return {
        **base,
        "num_experts": experts,
        "moe_top_k": top_k,
        "moe_ffn_hidden_size": width,
        **extra,
    }


_NARAYANAN = "Narayanan et al., SC21, arXiv:2104.04473, Table 1"
_LLAMA2 = "Llama 2 paper, arXiv:2307.09288, and the released config.json"
_LLAMA3 = "Llama 3 paper, arXiv:2407.21783, Table 3 (3.1 has the same shapes)"
_MISTRAL = "Mistral 7B, arXiv:2310.06825, Table 1 (window_size 4096: sliding-window attention)"
_QWEN = "Qwen2.5 technical report, arXiv:2412.15115, and the released config.json"
_QWEN3 = (
    "Qwen3 technical report, arXiv:2505.09388, Tables 1 and 2, and the released config.json "
    "(head_dim 128 whatever h / a is, per-head QK RMSNorm)"
)
_DEEPSEEK_V2 = "DeepSeek-V2 technical report, arXiv:2405.04434,"
_GPT3 = "Brown et al. 2020, arXiv:2005.14165, Table 2.1 (d_ff = 4 d_model, GPT-2 BPE vocabulary)"
MODEL_PRESETS: dict[str, tuple[dict[str, Any], str]] = {
    "llama2-7b": (_llama(32, 4096, 32, 32, 11008, 32000, 4096), _LLAMA2),
    "llama2-13b": (_llama(40, 5120, 40, 40, 13824, 32000, 4096), _LLAMA2),
    "llama2-70b": (_llama(80, 8192, 64, 8, 28672, 32000, 4096), _LLAMA2),
    "llama3-8b": (_llama(32, 4096, 32, 8, 14336, 128256, 8192), _LLAMA3),
    "llama3-70b": (_llama(80, 8192, 64, 8, 28672, 128256, 8192), _LLAMA3),
    "llama3-405b": (_llama(126, 16384, 128, 8, 53248, 128256, 8192), _LLAMA3),
    "llama3.1-8b": (_llama(32, 4096, 32, 8, 14336, 128256, 8192), _LLAMA3),
    "llama3.1-70b": (_llama(80, 8192, 64, 8, 28672, 128256, 8192), _LLAMA3),
    "llama3.1-405b": (_llama(126, 16384, 128, 8, 53248, 128256, 8192), _LLAMA3),
    "mistral-7b": (
        {**_llama(32, 4096, 32, 8, 14336, 32000, 8192), "attention_window": 4096},
        _MISTRAL,
    ),
    "qwen2.5-7b": (_llama(28, 3584, 28, 4, 18944, 152064, 4096), _QWEN),
    "qwen2.5-72b": (_llama(80, 8192, 64, 8, 29568, 152064, 4096), _QWEN),
    "mixtral-8x7b": (
        _moe(_llama(32, 4096, 32, 8, 14336, 32000, 32768), 8, 2, 14336),
        "Mixtral of Experts, arXiv:2401.04088, Table 1 (46.7B total, 12.9B active), and the "
        "released config.json",
    ),
    "mixtral-8x22b": (
        _moe(_llama(56, 6144, 48, 8, 16384, 32000, 65536), 8, 2, 16384),
        "mistralai/Mixtral-8x22B-v0.1 config.json (141B total, 39B active per its model card)",
    ),
    "qwen2-57b-a14b": (
        _moe(
            _llama(28, 3584, 28, 4, 18944, 151936, 32768),
            64,
            8,
            2560,
            moe_shared_expert_ffn_hidden_size=20480,
        ),
        "Qwen2 technical report, arXiv:2407.10671, Table 1, and Qwen/Qwen2-57B-A14B config.json "
        "(57B total, 14B active; its QKV biases and shared-expert gate, 0.01%, are left out)",
    ),
    "qwen3-8b": (
        {**_llama(36, 4096, 32, 8, 12288, 151936, 4096), "qk_norm": True},
        f"{_QWEN3} (8.2B parameters)",
    ),
    "qwen3-32b": (
        {**_llama(64, 5120, 64, 8, 25600, 151936, 4096), "head_dim": 128, "qk_norm": True},
        f"{_QWEN3} (32.8B parameters; 64 heads of 128 on a 5,120-wide model)",
    ),
    "qwen3-30b-a3b": (
        {
            **_moe(_llama(48, 2048, 32, 4, 6144, 151936, 4096), 128, 8, 768),
            "head_dim": 128,
            "qk_norm": True,
        },
        f"{_QWEN3} (30.5B total, 3.3B active; 128 routed experts, top-8, no shared expert)",
    ),
    "qwen3-235b-a22b": (
        {
            **_moe(_llama(94, 4096, 64, 4, 12288, 151936, 4096), 128, 8, 1536),
            "head_dim": 128,
            "qk_norm": True,
        },
        f"{_QWEN3} (235B total, 22B active; 128 routed experts, top-8, no shared expert)",
    ),
    "deepseek-v2-lite": (
        {
            **_moe(
                _llama(27, 2048, 16, 16, 10944, 102400, 4096),
                64,
                6,
                1408,
                moe_shared_expert_ffn_hidden_size=2816,
                moe_first_dense_layers=1,
            ),
            **_mla(q_lora_rank=0),
        },
        f"{_DEEPSEEK_V2} Appendix B (15.7B total, 2.4B active; first layer dense, 2 shared + 64 "
        "routed experts, top-6; latent attention without query compression)",
    ),
    "deepseek-v3": (
        {
            **_moe(
                _llama(61, 7168, 128, 128, 18432, 129280, 4096),
                256,
                8,
                2048,
                moe_shared_expert_ffn_hidden_size=2048,
                moe_first_dense_layers=3,
                moe_router_num_groups=8,
                moe_router_group_topk=4,
            ),
            **_mla(q_lora_rank=1536),
        },
        "DeepSeek-V3 technical report, arXiv:2412.19437, Sec. 4.2, and its config.json (671B "
        "total, 37B active, first 3 layers dense, 1 shared + 256 routed experts, top-8 within 4 "
        "of 8 groups, multi-head latent attention); its multi-token-prediction module is left "
        "out",
    ),
    "kimi-k2": (
        {
            **_moe(
                _llama(61, 7168, 64, 64, 18432, 163840, 4096),
                384,
                8,
                2048,
                moe_shared_expert_ffn_hidden_size=2048,
                moe_first_dense_layers=1,
            ),
            **_mla(q_lora_rank=1536),
        },
        "Kimi K2 technical report, arXiv:2507.20534, Table 2, and Megatron-MoE-ModelZoo's "
        "model_configs/benchmarking/Kimi-K2.yaml (the report's 1.04T total and 32.6B active; this "
        "shape counts 1.026T and 32.9B; first layer dense, 1 shared + 384 routed experts, "
        "top-8, 64 heads of multi-head latent attention)",
    ),
    "gpt3-175b": ({**_megatron_gpt(96, 12288, 96), "vocab_size": 50257}, _GPT3),
    "megatron-gpt-1.7b": (_megatron_gpt(24, 2304, 24), _NARAYANAN),
    "megatron-gpt-3.6b": (_megatron_gpt(30, 3072, 32), _NARAYANAN),
    "megatron-gpt-7.5b": (_megatron_gpt(36, 4096, 32), _NARAYANAN),
    "megatron-gpt-18b": (_megatron_gpt(40, 6144, 48), _NARAYANAN),
    "megatron-gpt-39b": (_megatron_gpt(48, 8192, 64), _NARAYANAN),
    "megatron-gpt-76b": (_megatron_gpt(60, 10240, 80), _NARAYANAN),
    "megatron-gpt-145b": (_megatron_gpt(80, 12288, 96), _NARAYANAN),
    "megatron-gpt-310b": (_megatron_gpt(96, 16384, 128), _NARAYANAN),
    "megatron-gpt-530b": (_megatron_gpt(105, 20480, 128), _NARAYANAN),
    "megatron-gpt-1t": (_megatron_gpt(128, 25600, 160), _NARAYANAN),
}
"""Preset name -> (the ``model:`` mapping without its name, where the numbers come from)."""


def resolve_model_preset(raw: Any) -> Any:
    """The ``model:`` mapping with a preset expanded (other values are returned unchanged).

    ``"llama3-8b"`` or ``{"preset": "llama3-8b", "seq_len": 4096}``: the preset's keys, then the
    given ones over them; ``name`` defaults to the preset's name.
    """
    if isinstance(raw, str):
        raw = {"preset": raw}
    if not isinstance(raw, Mapping) or "preset" not in raw:
        return raw
    name = raw["preset"]
    if not isinstance(name, str) or name not in MODEL_PRESETS:
        shown = name if isinstance(name, str) else type(name).__name__
        hint = did_you_mean(name, MODEL_PRESETS) if isinstance(name, str) else ""
        raise ValueError(
            f"model preset {shown[:60]!r} is unknown{hint}; presets: {', '.join(MODEL_PRESETS)} "
            "(commsim presets)"
        )
    shape, _ = MODEL_PRESETS[name]
    overrides = {k: v for k, v in raw.items() if k != "preset"}
    return {"name": name, **shape, **overrides}
