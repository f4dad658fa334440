"""The ``model`` section of a Hugging Face ``config.json``: Llama, Mistral, Qwen2, Qwen3,
DeepSeek-V2/V3 (and Kimi K2), GPT-2 and GPT-NeoX shapes, activations, norms, positions, biases,
tying, sliding windows (Mistral, Qwen2), multi-head latent attention and experts (DeepSeek) and
parallel residuals (GPT-NeoX), with a warning for every key not carried over (the checkpoint
dtype, partial biases).

Sources: transformers main (``LlamaConfig``, ``MistralConfig``, ``Qwen2Config``,
``GPT2Config``, ``GPTNeoXConfig``, ``DeepseekV3Config``) and DeepSeek-V2's
``modeling_deepseek.py`` for the keys and their defaults.

    model = model_from_hf_config(Path("Meta-Llama-3-8B/config.json"))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fileio.strict import load_json, shorten
from schedules.importers.common import Imported, _Fields, _read

_HF_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "GPT2LMHeadModel": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
}
"""Supported ``architectures`` entries and their ``model_type``."""
_HF_KV_HEADS_DEFAULT = {
    "llama": None,
    "mistral": 8,
    "qwen2": 32,
    "qwen3": 32,
    "qwen3_moe": 4,
    "deepseek_v2": None,
    "deepseek_v3": None,
}
"""``num_key_value_heads`` when absent (None: the query heads), from each config class."""


_HF_NOISE = frozenset({
    "bos_token_id", "eos_token_id", "pad_token_id", "sep_token_id", "decoder_start_token_id",
    "initializer_range", "initializer_factor", "rms_norm_eps", "layer_norm_eps",
    "layer_norm_epsilon", "rope_theta", "rope_scaling", "rotary_emb_base", "rope_parameters",
    "transformers_version", "use_cache", "torch_dtype", "dtype", "pretraining_tp",
    "tokenizer_class", "max_window_layers", "id2label", "label2id", "task_specific_params",
    "summary_type", "summary_use_proj", "summary_activation", "summary_proj_to_labels",
    "summary_first_dropout", "scale_attn_weights", "scale_attn_by_inverse_layer_idx",
    "reorder_and_upcast_attn", "classifier_dropout", "output_attentions",
    "output_hidden_states", "return_dict", "is_decoder", "bad_words_ids", "rotary_pct",
    "norm_topk_prob", "router_aux_loss_coef", "output_router_logits",
    "routed_scaling_factor", "topk_method", "scoring_func",
    "aux_loss_alpha", "seq_aux", "ep_size", "quantization_config", "auto_map",
})  # fmt: skip
"""Keys that change nothing a training step costs: token ids, initialisation, norm epsilons,
the rotary base and scaling (the same kernels), inference caching (``use_cache``,
``pretraining_tp``), the checkpoint's dtype (not the training precision), labels and
bookkeeping. Counted in the warning, not listed."""


def model_from_hf_config(path: Path) -> Imported:
    """The ``model`` section of a Hugging Face ``config.json`` (Llama, Mistral, Qwen2, Qwen3,
    Qwen3-MoE, DeepSeek-V2/V3, GPT-2 or GPT-NeoX); ``seq_len`` is ``max_position_embeddings``
    (a warning says to override it). The model is named by ``_name_or_path``, else by the folder
    holding ``config.json`` (a Hub download's folder is the model's name), else by the file's
    stem."""
    fields = _read(path, "Hugging Face config", _load_json, noise=_HF_NOISE)
    family, _ = _hf_family(fields)
    notes: list[str] = []
    name = fields.get("_name_or_path", str, "") or _hf_name(Path(path))
    if family == "gpt2":
        shape = _hf_gpt2(fields, notes)
    elif family == "gpt_neox":
        shape = _hf_neox(fields, notes)
    elif family.startswith("deepseek"):
        shape = _hf_deepseek(fields, notes)
    else:
        shape = _hf_llama(fields, family, notes)
    return fields.imported({"model": {"name": name, **shape}}, notes)


def _load_json(text: str, name: str) -> Any:
    return load_json(text, name=name)


def _hf_name(path: Path) -> str:
    """The model's name from where its config is: ``Meta-Llama-3-8B/config.json`` names
    ``Meta-Llama-3-8B``; a config named otherwise (``llama.json``) names itself."""
    folder = path.resolve().parent.name
    return folder if path.name == "config.json" and folder else path.stem


def _hf_family(fields: _Fields) -> tuple[str, str]:
    supported = ", ".join(_HF_ARCHITECTURES)
    architectures = fields.get("architectures", list, [])
    if not all(isinstance(a, str) for a in architectures):
        raise ValueError(
            f"{fields.file}: architectures must list names, got {shorten(architectures)}"
        )
    model_type = fields.get("model_type", str, "")
    for architecture in architectures:
        if architecture in _HF_ARCHITECTURES:
            return _HF_ARCHITECTURES[architecture], architecture
    if architectures:
        raise ValueError(
            f"{fields.file}: architectures {shorten(architectures)} is not supported; "
            f"supported: {supported}"
        )
    for architecture, family in _HF_ARCHITECTURES.items():
        if model_type == family:
            return family, architecture
    raise ValueError(
        f"{fields.file}: model_type {shorten(model_type)} is not supported (and no "
        f"architectures are given); supported: {supported}"
    )


def _hf_seq_len(fields: _Fields, key: str, notes: list[str]) -> int:
    seq_len = fields.count(key)
    line = (
        f"{fields.file}: model.seq_len={seq_len} is {key}, the longest context the model "
        "supports; training usually runs shorter sequences: override model.seq_len"
    )
    notes.append(fields.ask(line, "model.seq_len"))
    return seq_len


def _hf_llama(fields: _Fields, family: str, notes: list[str]) -> dict[str, Any]:
    """Llama, Mistral, Qwen2 and Qwen3 (with its per-head QK norm, ``head_dim`` and, for
    Qwen3-MoE, its experts): gated SiLU MLP, RMSNorm, rotary positions."""
    hidden, heads = fields.count("hidden_size"), fields.count("num_attention_heads")
    kv_default = _HF_KV_HEADS_DEFAULT[family]
    if not fields.has("num_key_value_heads") and kv_default is not None:
        notes.append(f"{fields.file}: num_key_value_heads absent: the config class's {kv_default}")
    kv_heads = fields.count("num_key_value_heads", kv_default, nullable=True) or heads
    head_dim = fields.get("head_dim", (int, type(None)), None)
    if head_dim is not None and head_dim < 1:
        raise ValueError(f"{fields.file}: head_dim must be >= 1, got {head_dim}")
    if head_dim is None and family == "qwen3":
        head_dim = 128  # Qwen3Config's default, whatever hidden_size / num_attention_heads is
    window = _hf_sliding_window(fields, family)
    if window and family in ("qwen2", "qwen3"):  # Qwen2Config.layer_types: i >= max_window_layers
        first = fields.get("max_window_layers", int, 28)
        if first >= fields.count("num_hidden_layers"):
            window = 0
            notes.append(
                f"{fields.file}: use_sliding_window, but max_window_layers={first} leaves no "
                "layer sliding: full causal attention"
            )
        else:
            notes.append(
                f"{fields.file}: Qwen slides its window on the layers from "
                f"max_window_layers={first} on only; model.attention_window={window} applies it "
                "to every layer"
            )
    return {
        "num_layers": fields.count("num_hidden_layers"),
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": kv_heads,
        "ffn_hidden_size": fields.count("intermediate_size"),
        "vocab_size": fields.count("vocab_size"),
        "seq_len": _hf_seq_len(fields, "max_position_embeddings", notes),
        "mlp_activation": _hf_activation(fields, "hidden_act", "silu", notes, gated=True),
        "norm": "rmsnorm",
        "position_embedding": "rope",
        "tied_embeddings": fields.get("tie_word_embeddings", bool, False),
        "linear_bias": _hf_llama_bias(fields, family, notes),
        "dropout": fields.get("attention_dropout", float, 0.0) > 0,
        **({"attention_window": window} if window else {}),
        **({"head_dim": head_dim} if head_dim is not None and head_dim * heads != hidden else {}),
        **({"qk_norm": True} if family.startswith("qwen3") else {}),
        **(_hf_qwen3_moe(fields) if family == "qwen3_moe" else {}),
    }


_HF_DEEPSEEK_DEFAULTS = {
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
}
"""The latent-attention keys' defaults of ``DeepseekV2Config`` and ``DeepseekV3Config``
(both classes: a config that leaves ``q_lora_rank`` out compresses its query to 1,536)."""
_HF_DEEPSEEK_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "deepseek_v2": {
        "n_routed_experts": None,
        "first_k_dense_replace": 0,
        "n_shared_experts": None,
        "moe_intermediate_size": None,
        "num_experts_per_tok": None,
        "n_group": None,
        "topk_group": None,
    },
    "deepseek_v3": {
        "n_routed_experts": 256,
        "first_k_dense_replace": 3,
        "n_shared_experts": 1,
        "moe_intermediate_size": 2048,
        "num_experts_per_tok": 8,
        "n_group": 8,
        "topk_group": 4,
    },
}
"""The experts' defaults of each config class: DeepSeek-V2's remote ``configuration_deepseek.py``
(no routed experts by default, a dense model; a config with experts must give their width and
top-k) and transformers' ``DeepseekV3Config`` (256 routed experts of 2,048, top-8, one shared,
after 3 dense layers, routed within 4 of 8 groups)."""


def _hf_deepseek(fields: _Fields, notes: list[str]) -> dict[str, Any]:
    """DeepSeek-V2 and V3 (and Kimi K2, a DeepseekV3ForCausalLM): multi-head latent attention
    (``q_lora_rank``, null: no query compression; ``kv_lora_rank``, ``qk_nope_head_dim``,
    ``qk_rope_head_dim``, ``v_head_dim``), ``first_k_dense_replace`` dense layers of
    ``intermediate_size`` and then MoE layers every ``moe_layer_freq`` of ``n_routed_experts``
    routed experts of ``moe_intermediate_size`` and ``n_shared_experts`` shared ones of the same
    width; its group-limited routing (``n_group``, ``topk_group``) as the model's (where DeepEP
    sends each token), its scaling changes no cost. ``num_nextn_predict_layers``
    (V3's multi-token prediction) is not modelled: a note says it is left out. Keys a config
    leaves out take its class's defaults (``_HF_DEEPSEEK_DEFAULTS``)."""
    family = _hf_family(fields)[0]
    shape = _hf_llama(fields, family, notes)
    shape.pop("head_dim", None)
    if fields.get("attention_bias", bool, False):  # DeepseekV3Attention: q, kv and o only
        notes.append(
            f"{fields.file}: attention_bias puts biases on the attention's linears only; "
            "linear_bias is all-or-none: left off"
        )
    shape["num_kv_heads"] = shape["num_heads"]  # latent attention projects every head
    defaults = _HF_DEEPSEEK_DEFAULTS
    q_lora = fields.get("q_lora_rank", (int, type(None)), defaults["q_lora_rank"])
    latent = {
        "kv_lora_rank": fields.count("kv_lora_rank", defaults["kv_lora_rank"]),
        "q_lora_rank": 0 if q_lora is None else q_lora,
        "head_dim": fields.count("qk_nope_head_dim", defaults["qk_nope_head_dim"]),
        "qk_rope_head_dim": fields.get("qk_rope_head_dim", int, defaults["qk_rope_head_dim"]),
        "v_head_dim": fields.count("v_head_dim", defaults["v_head_dim"]),
    }
    if latent["q_lora_rank"] < 0 or latent["qk_rope_head_dim"] < 0:
        raise ValueError(f"{fields.file}: q_lora_rank and qk_rope_head_dim must be >= 0")
    family_defaults = _HF_DEEPSEEK_FAMILY_DEFAULTS[family]
    experts = fields.get("n_routed_experts", (int, type(None)), family_defaults["n_routed_experts"])
    moe: dict[str, Any] = {}
    if experts:

        def count(key: str) -> int:  # a class without a default for it: the key is required
            default = family_defaults[key]
            return fields.count(key) if default is None else fields.count(key, default)

        width = count("moe_intermediate_size")
        first = fields.get("first_k_dense_replace", int, family_defaults["first_k_dense_replace"])
        freq = fields.count("moe_layer_freq", 1)
        if first % freq:  # DeepseekV2DecoderLayer: MoE where i >= first and i % freq == 0
            raise ValueError(
                f"{fields.file}: moe_layer_freq={freq} with first_k_dense_replace={first}: "
                "MoE layers counted from layer 0 are not a plan's pattern (every n-th layer "
                "after the dense ones)"
            )
        moe = {
            "num_experts": experts,
            "moe_top_k": count("num_experts_per_tok"),
            "moe_ffn_hidden_size": width,
            "moe_shared_expert_ffn_hidden_size": width
            * (
                fields.get(
                    "n_shared_experts", (int, type(None)), family_defaults["n_shared_experts"]
                )
                or 0
            ),
            "moe_first_dense_layers": first,
            "moe_layer_freq": freq,
        }
        groups = fields.get("n_group", (int, type(None)), family_defaults["n_group"]) or 1
        chosen = fields.get("topk_group", (int, type(None)), family_defaults["topk_group"]) or 1
        if groups > 1:  # group-limited routing: where DeepEP sends each token
            moe.update(moe_router_num_groups=groups, moe_router_group_topk=chosen)
    mtp = fields.get("num_nextn_predict_layers", int, 0)
    if mtp:
        notes.append(
            f"{fields.file}: num_nextn_predict_layers={mtp}: the multi-token-prediction "
            "module is left out (it trains only where the recipe turns it on)"
        )
    return {**shape, **latent, **moe}


def _hf_qwen3_moe(fields: _Fields) -> dict[str, Any]:
    """Qwen3-MoE's experts (``Qwen3MoeSparseMoeBlock``): ``num_experts`` routed experts of width
    ``moe_intermediate_size``, ``num_experts_per_tok`` per token, no shared expert; every layer
    sparse when ``decoder_sparse_step`` is 1 and ``mlp_only_layers`` is empty (the other patterns,
    layer i sparse when (i + 1) % step == 0, are not a plan's ``moe_layer_freq``)."""
    step = fields.get("decoder_sparse_step", int, 1)
    dense = fields.get("mlp_only_layers", (list, type(None)), []) or []
    if step != 1 or dense:
        raise ValueError(
            f"{fields.file}: decoder_sparse_step={step} with mlp_only_layers={shorten(dense)}: "
            "only every layer sparse (1 and []) is read"
        )
    return {
        "num_experts": fields.count("num_experts"),
        "moe_top_k": fields.count("num_experts_per_tok"),
        "moe_ffn_hidden_size": fields.count("moe_intermediate_size"),
    }


def _hf_activation(
    fields: _Fields, key: str, default: str, notes: list[str], *, gated: bool
) -> str:
    """The plan's activation for ``hidden_act`` / ``activation_function``; gated for Llama."""
    act = fields.get(key, str, default)
    if act in ("silu", "swish") and gated:
        return "swiglu"
    if act.startswith("gelu"):  # gelu, gelu_new, gelu_fast, gelu_pytorch_tanh: same cost
        return "geglu" if gated else "gelu"
    if act == "relu" and not gated:
        return "relu"
    priced = "swiglu" if gated else "gelu"
    notes.append(f"{fields.file}: {key}={shorten(act)} is not modelled: priced as {priced}")
    return priced


def _hf_llama_bias(fields: _Fields, family: str, notes: list[str]) -> bool:
    partial = "linear_bias is all-or-none: left off (a negligible share of the parameters)"
    if family == "qwen2":  # Qwen2Attention: q, k and v projections with bias=True, o without
        notes.append(f"{fields.file}: Qwen2 has biases on q, k and v only; {partial}")
        return False
    if family != "llama":
        return False
    attention = fields.get("attention_bias", bool, False)
    mlp = fields.get("mlp_bias", bool, False)
    if attention != mlp:
        which = "attention_bias" if attention else "mlp_bias"
        notes.append(f"{fields.file}: {which} puts biases on part of the layers only; {partial}")
    return attention and mlp


def _hf_sliding_window(fields: _Fields, family: str) -> int:
    """``model.attention_window``: Mistral's ``sliding_window`` (default 4096; null: none), or
    Qwen2's and Qwen3's where ``use_sliding_window`` is true (its config keeps the key unused
    otherwise); 0: none."""
    window = None
    qwen = family in ("qwen2", "qwen3", "qwen3_moe")
    if family == "mistral" or (qwen and fields.get("use_sliding_window", bool, False)):
        window = fields.get("sliding_window", (int, type(None)), 4096)
    if window is not None and window < 0:
        raise ValueError(f"{fields.file}: sliding_window must be >= 0, got {window}")
    return window or 0


def _hf_gpt2(fields: _Fields, notes: list[str]) -> dict[str, Any]:
    """GPT-2: GeLU MLP of n_inner (default 4h), LayerNorm, learned positions, biases, tied."""
    hidden, heads = fields.count("n_embd"), fields.count("n_head")
    inner = fields.count("n_inner", None, nullable=True)
    seq_len = _hf_seq_len(fields, "n_positions", notes)
    if fields.has("n_ctx") and fields.get("n_ctx", int) != seq_len:
        notes.append(f"{fields.file}: n_ctx differs from n_positions, which is used")
    dropouts = [fields.get(k, float, 0.1) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")]
    return {
        "num_layers": fields.count("n_layer"),
        "hidden_size": hidden,
        "num_heads": heads,
        "num_kv_heads": heads,
        "ffn_hidden_size": inner or 4 * hidden,
        "vocab_size": fields.count("vocab_size"),
        "seq_len": seq_len,
        "mlp_activation": _hf_activation(
            fields, "activation_function", "gelu_new", notes, gated=False
        ),
        "norm": "layernorm",
        "position_embedding": "learned",
        "tied_embeddings": fields.get("tie_word_embeddings", bool, True),
        "linear_bias": True,
        "dropout": max(dropouts) > 0,
    }


def _hf_neox(fields: _Fields, notes: list[str]) -> dict[str, Any]:
    """GPT-NeoX: GeLU MLP, LayerNorm, rotary positions, biases, parallel residual."""
    heads = fields.count("num_attention_heads")
    parallel = fields.get("use_parallel_residual", bool, True)
    if parallel:
        notes.append(
            f"{fields.file}: use_parallel_residual (the GPTNeoXConfig default): "
            "model.parallel_block; GPT-NeoX normalises the layer input twice, one norm per "
            "branch, where the block prices one"
        )
    if not fields.get("attention_bias", bool, True):
        notes.append(
            f"{fields.file}: attention_bias=false leaves the MLP biases; linear_bias is "
            "all-or-none: left on"
        )
    dropouts = [fields.get(k, float, 0.0) for k in ("attention_dropout", "hidden_dropout")]
    return {
        "num_layers": fields.count("num_hidden_layers"),
        "hidden_size": fields.count("hidden_size"),
        "num_heads": heads,
        "num_kv_heads": heads,
        "ffn_hidden_size": fields.count("intermediate_size"),
        "vocab_size": fields.count("vocab_size"),
        "seq_len": _hf_seq_len(fields, "max_position_embeddings", notes),
        "mlp_activation": _hf_activation(fields, "hidden_act", "gelu", notes, gated=False),
        "norm": "layernorm",
        "position_embedding": "rope",
        "tied_embeddings": fields.get("tie_word_embeddings", bool, False),
        "linear_bias": True,
        "dropout": max(dropouts) > 0,
        **({"parallel_block": True} if parallel else {}),
    }
