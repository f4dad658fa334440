"""Attention heads of another width than h / a (``model.head_dim``) and the per-head QK norm
(``model.qk_norm``): parameters, FLOPs, activations and GEMM shapes by hand, the Qwen3 presets
against their published sizes, and the importers that read them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from schedules.activations import layer_activation_bytes
from schedules.flops import attention_core_flops, attention_linear_flops
from schedules.importers import from_megatron_args, model_from_hf_config
from schedules.kernels import weight_gemm_shapes
from schedules.params import active_params, attention_params, layer_params, total_params
from schedules.plan import ModelConfig, load_plan

WIDE = {
    "name": "wide-heads", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2,
    "head_dim": 32, "ffn_hidden_size": 256, "vocab_size": 1000, "seq_len": 128,
}  # fmt: skip
"""h = 64 with 4 heads of 32: the query is a d = 128 wide, each of K and V k d = 64."""


def plan_of(model: dict[str, Any], **parallel: Any) -> Any:
    return load_plan(
        {
            "model": model,
            "cluster": {"node": "dgx-h100"},
            "parallel": parallel,
            "training": {"micro_batch_size": 2, "global_batch_size": 16},
        }
    )


def test_wide_heads_widen_the_query_and_output_projections() -> None:
    model = plan_of(WIDE).model
    assert (model.head_dim, model.q_size, model.kv_size) == (32, 128, 64)
    # Q, K, V: 64 x (128 + 2 x 64); output: 128 x 64
    assert attention_params(model) == 64 * 256 + 128 * 64
    tokens = 2 * 128
    assert attention_linear_flops(model, tokens) == 2 * tokens * (256 * 64 + 64 * 128)
    # QK^T and AV over the 128-wide query, causal: half of 2 x 2 b s^2 (a d)
    assert attention_core_flops(model, 2, causal=True) == 0.5 * 2 * 2 * 2 * 128 * 128 * 128
    assert layer_params(model) == attention_params(model) + 3 * 64 * 256 + 2 * 64
    m, n, k = weight_gemm_shapes(plan_of(WIDE, tp=2))[0]
    assert (m, n, k) == (256, 256 / 2, 64)
    assert weight_gemm_shapes(plan_of(WIDE, tp=2))[1] == (256, 64, 128 / 2)
    # selective recompute keeps, per token, the norm and block inputs (4 h) outside TP and Q, K,
    # V (a d + 2 k d), the projection input (a d) and the gated MLP's 3f inside it, 2 bytes each
    kept = layer_activation_bytes(model, 2, tp=2, recompute="selective")
    assert kept == tokens * 2 * (4 * 64 + (128 + 2 * 64 + 128 + 3 * 256) / 2)


def test_the_default_head_width_is_hidden_over_heads_and_changes_nothing() -> None:
    default = plan_of({**WIDE, "head_dim": 0}).model
    explicit = plan_of({**WIDE, "head_dim": 16}).model
    assert default.head_dim == 16 and default == explicit
    assert attention_params(default) == 64 * (64 + 2 * 32) + 64 * 64


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"head_dim": -1}, "model.head_dim must be >= 0, got -1"),
        ({"head_dim": 0, "hidden_size": 66}, "set model.head_dim for heads of another width"),
        ({"head_dim": 1 << 20}, "model.head_dim=1,048,576 is larger than any model"),
    ],
)
def test_bad_head_widths_name_the_problem(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_of({**WIDE, **change})


def test_qk_norm_adds_one_head_width_of_weights_for_queries_and_keys() -> None:
    plain, normed = plan_of(WIDE).model, plan_of({**WIDE, "qk_norm": True}).model
    assert layer_params(normed) - layer_params(plain) == 2 * 32


@pytest.mark.parametrize(
    ("preset", "total", "active"),
    [
        ("qwen3-8b", 8.2e9, 8.2e9),
        ("qwen3-32b", 32.8e9, 32.8e9),
        ("qwen3-30b-a3b", 30.5e9, 3.3e9),
        ("qwen3-235b-a22b", 235e9, 22e9),
    ],
)
def test_qwen3_presets_have_their_published_sizes(preset: str, total: float, active: float) -> None:
    """Qwen3 technical report (arXiv:2505.09388) and the model cards: total and activated
    parameters, to the published rounding (2 %: 3.35B is published as 3.3B)."""
    model: ModelConfig = plan_of({"preset": preset}).model
    assert total_params(model) == pytest.approx(total, rel=0.02)
    assert active_params(model) == pytest.approx(active, rel=0.02)


QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
    "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
    "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
    "num_experts": 128, "num_experts_per_tok": 8, "decoder_sparse_step": 1,
    "mlp_only_layers": [], "norm_topk_prob": True, "vocab_size": 151936,
    "max_position_embeddings": 40960, "hidden_act": "silu", "tie_word_embeddings": False,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "attention_bias": False,
    "attention_dropout": 0.0, "use_sliding_window": False, "sliding_window": None,
    "max_window_layers": 48, "router_aux_loss_coef": 0.001, "output_router_logits": False,
}  # fmt: skip
"""Qwen/Qwen3-30B-A3B config.json (its shape and MoE keys)."""


def _write(tmp_path: Path, name: str, content: Any) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_hf_qwen3_moe_config_reads_the_heads_the_norm_and_the_experts(tmp_path: Path) -> None:
    imported = model_from_hf_config(_write(tmp_path, "config.json", QWEN3_30B_A3B))
    model = imported.sections["model"]
    assert {k: model[k] for k in ("head_dim", "qk_norm", "num_experts", "moe_top_k")} == {
        "head_dim": 128, "qk_norm": True, "num_experts": 128, "moe_top_k": 8,
    }  # fmt: skip
    assert model["moe_ffn_hidden_size"] == 768
    preset = plan_of({"preset": "qwen3-30b-a3b"}).model
    read = plan_of({**model, "seq_len": 4096, "name": preset.name}).model
    assert total_params(read) == total_params(preset)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"decoder_sparse_step": 2}, "decoder_sparse_step=2 with mlp_only_layers=[]"),
        ({"mlp_only_layers": [0]}, "only every layer sparse (1 and []) is read"),
        ({"head_dim": 0}, "config.json: head_dim must be >= 1, got 0"),
    ],
)
def test_hf_qwen3_moe_patterns_it_cannot_read_are_one_line(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        model_from_hf_config(_write(tmp_path, "config.json", {**QWEN3_30B_A3B, **change}))


def test_megatron_kv_channels_and_qk_layernorm(tmp_path: Path) -> None:
    """Qwen3-235B-A22B's model-zoo flags: 64 heads of --kv-channels 128 on a 4,096-wide model."""
    args = (
        "pretrain_gpt.py --num-layers 94 --hidden-size 4096 --num-attention-heads 64 "
        "--kv-channels 128 --group-query-attention --num-query-groups 4 --qk-layernorm "
        "--seq-length 4096 --ffn-hidden-size 12288 --swiglu --normalization RMSNorm\n"
    )
    model = from_megatron_args(_write(tmp_path, "qwen3.sh", args)).sections["model"]
    assert (model["head_dim"], model["qk_norm"], model["num_kv_heads"]) == (128, True, 4)
    same = args.replace("--kv-channels 128", "--kv-channels 64").replace(" --qk-layernorm", "")
    plain = from_megatron_args(_write(tmp_path, "plain.sh", same)).sections["model"]
    assert "head_dim" not in plain and "qk_norm" not in plain


def test_zero3_modules_hold_every_parameter_of_a_wide_headed_layer() -> None:
    from schedules.params import layer_params_per_gpu
    from schedules.zero3_spec import layer_submodules

    model = plan_of({**WIDE, "qk_norm": True}).model
    for fused in (False, True):
        modules = layer_submodules(
            hidden=64, ffn=256, kv_size=model.kv_size, gated=True, bias=False, norm_params=64,
            tp=2, fused=fused, q_size=model.q_size, qk_norm_params=2 * 32,
        )  # fmt: skip
        total = sum(sum(tensors) for _, tensors in modules)
        assert total == layer_params_per_gpu(model, 2)


def test_hf_head_width_defaults_follow_each_config_class(tmp_path: Path) -> None:
    """Qwen3Config defaults head_dim to 128; Qwen3MoeConfig has none and its attention takes
    hidden / heads; a head width that does not divide the hidden size is kept as given."""
    moe = {k: v for k, v in QWEN3_30B_A3B.items() if k != "head_dim"}
    read = model_from_hf_config(_write(tmp_path, "config.json", moe)).sections["model"]
    assert "head_dim" not in read and read["hidden_size"] // read["num_heads"] == 64
    dense = {**moe, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}
    dense = {k: v for k, v in dense.items() if not k.startswith(("moe_", "num_experts"))}
    assert (
        model_from_hf_config(_write(tmp_path, "d.json", dense)).sections["model"]["head_dim"] == 128
    )
    odd = {**QWEN3_30B_A3B, "hidden_size": 2050, "mlp_only_layers": None}
    assert (
        model_from_hf_config(_write(tmp_path, "o.json", odd)).sections["model"]["head_dim"] == 128
    )


def test_an_exported_plan_keeps_the_default_head_width_tied_to_the_heads() -> None:
    from schedules.plan import plan_to_dict

    dense = plan_of({**WIDE, "head_dim": 0})
    assert plan_to_dict(dense)["model"]["head_dim"] == 0
    wide = plan_of(WIDE)
    assert plan_to_dict(wide)["model"]["head_dim"] == 32
    assert load_plan(plan_to_dict(wide)) == wide


def test_qk_norm_keeps_its_input_for_the_backward() -> None:
    plain, normed = plan_of(WIDE).model, plan_of({**WIDE, "qk_norm": True}).model
    tokens = 2 * 128
    extra = layer_activation_bytes(normed, 2, tp=2, recompute="selective") - (
        layer_activation_bytes(plain, 2, tp=2, recompute="selective")
    )
    assert extra == tokens * 2 * (128 + 64) / 2  # Q and K before the norm, split over TP


def test_megatron_core_flops_count_the_query_width() -> None:
    """The model zoo's Qwen3-235B-A22B row: 24.2 s and 200 TFLOP/s per GPU on 256 GPUs agree
    only with the 8,192-wide query (Megatron-Core ``num_floating_point_operations``)."""
    from sim.validation.measured import megatron_core_flops_per_step

    shape = dict(
        global_batch_size=2048, seq_len=4096, num_layers=94, hidden_size=4096,
        vocab_size=151936, num_heads=64, num_kv_heads=4, ffn_hidden_size=8 * 1536,
        gated_mlp=True, causal=True,
    )  # fmt: skip
    wide = megatron_core_flops_per_step(**shape, query_size=64 * 128)
    assert wide / 256 / 24.2 / 1e12 == pytest.approx(200, rel=0.005)
    narrow = megatron_core_flops_per_step(**shape)
    tokens = 2048 * 4096
    # the attention linears and scores scale with the query: (1 + g/a + s/2h) x 12 B s l h^2
    assert wide - narrow == pytest.approx(
        12 * tokens * 94 * 4096**2 * (1 + 4 / 64 + 4096 / 8192) * (8192 / 4096 - 1)
    )
