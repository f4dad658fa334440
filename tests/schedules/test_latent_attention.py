"""Multi-head latent attention (``model.kv_lora_rank``, ``schedules.mla``): parameters, FLOPs
against Megatron-LM's own formula, GEMM shapes per GPU under TP and sequence parallelism,
activations and the attention kernel by hand, the DeepSeek and Kimi presets against their
published sizes, and the checks that refuse what is not modelled."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from schedules.activations import layer_activation_bytes
from schedules.flops import attention_core_flops, attention_linear_flops, layer_flops
from schedules.importers import from_megatron_args, model_from_hf_config
from schedules.kernels import (
    FUSED_ATTENTION_BACKWARD_AUX_BYTES,
    attention_core_kernels,
    linear_gemm_shapes,
    weight_gemm_kernels,
    weight_gemm_shapes,
)
from schedules.model_presets import resolve_model_preset
from schedules.params import attention_params, layer_params, layer_params_per_gpu, total_params
from schedules.plan import ModelConfig, load_plan, plan_to_dict
from schedules.resolve import resolve_plan
from schedules.zero3_units import zero3_modules

LATENT = {
    "name": "latent", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "head_dim": 16,
    "kv_lora_rank": 8, "q_lora_rank": 24, "qk_rope_head_dim": 4, "v_head_dim": 12,
    "ffn_hidden_size": 128, "vocab_size": 1000, "seq_len": 32,
}  # fmt: skip
"""h = 64, 4 heads: queries and keys 16 + 4 = 20 wide per head, values 12; latents 24 and 8."""


def plan_of(model: dict[str, Any], **parallel: Any) -> Any:
    return load_plan(
        {
            "model": model,
            "cluster": {"node": "dgx-h100"},
            "parallel": parallel,
            "training": {"micro_batch_size": 2, "global_batch_size": 16, "stack": "megatron"},
        }
    )


def test_the_linears_and_their_parameters_by_hand() -> None:
    model = plan_of(LATENT).model
    assert (model.qk_head_dim, model.value_head_dim, model.q_size, model.kv_size) == (
        20,
        12,
        80,
        80,
    )
    assert (model.value_size, model.attention_out_size) == (48, 48)
    # q_down 64x24, q_up 24x(4x20), kv_down 64x(8+4), kv_up 8x(4x(16+12)), output 48x64
    weights = 64 * 24 + 24 * 80 + 64 * 12 + 8 * 112 + 48 * 64
    assert attention_params(model) == weights
    # two RMSNorms of the hidden state, one per latent (24 and 8), and a gated MLP
    assert layer_params(model) == weights + 2 * 64 + 24 + 8 + 3 * 64 * 128
    # TP 2: the down projections and every norm stay whole on each rank
    whole = 64 * 24 + 64 * 12 + 2 * 64 + 24 + 8
    assert layer_params_per_gpu(model, 2) == whole + (layer_params(model) - whole) / 2


def test_flops_match_megatrons_formula_less_its_norm_terms() -> None:
    """megatron/training/training.py ``num_floating_point_operations``: per token and layer the
    attention's linears are q_lora (h + a (d + d_r) + 1) + kv_lora (h + a (d + d_v) + 1) + h d_r
    + a d_v h multiply-adds (the + 1s count the latent norms, no GEMM), and its core
    s (a (d + d_r) / 2 + a d_v / 2) for causal attention."""
    model = ModelConfig(**resolve_model_preset("deepseek-v3"))
    h, a, ql, kvl = 7168, 128, 1536, 512
    d, dr, dv, s = 128, 64, 128, 4096
    megatron_linear = ql * (h + a * (d + dr) + 1) + kvl * (h + a * (d + dv) + 1) + h * dr
    megatron_linear += a * dv * h
    assert attention_linear_flops(model, 1) == 2 * (megatron_linear - ql - kvl)
    megatron_core = s * (a * (d + dr) / 2 + a * dv / 2)
    assert attention_core_flops(model, 1, causal=True) == pytest.approx(2 * s * megatron_core)


def test_deepseek_v3_attention_is_187m_parameters_and_the_model_671b() -> None:
    model = ModelConfig(**resolve_model_preset("deepseek-v3"))
    # q_down 11.0M, q_up 37.7M, kv_down 4.13M, kv_up 16.8M, output 117.4M (config.json widths)
    assert (
        attention_params(model)
        == 7168 * 1536 + 1536 * 128 * 192 + 7168 * 576 + (512 * 128 * 256) + 128 * 128 * 7168
    )
    assert attention_params(model) == 187_105_280
    assert total_params(model) / 1e9 == pytest.approx(671, rel=0.005)
    lite = ModelConfig(**resolve_model_preset("deepseek-v2-lite"))
    assert total_params(lite) / 1e9 == pytest.approx(15.7, rel=0.01)  # DeepSeek-V2 Appendix B
    assert lite.q_lora_rank == 0  # no query compression: one h x a (d + d_r) query projection
    assert attention_params(lite) == 2048 * 16 * 192 + 2048 * 576 + 512 * 16 * 256 + 16 * 128 * 2048


def test_gemms_per_gpu_down_projections_whole_and_on_own_tokens_under_sp() -> None:
    tokens = 2 * 32
    plain = linear_gemm_shapes(plan_of(LATENT, tp=2))[0]
    assert plain == (
        (tokens, 24, 64),  # q_down: whole on each rank
        (tokens, 80 / 2, 24),  # q_up: column-parallel
        (tokens, 12, 64),  # kv_down: whole
        (tokens, 112 / 2, 8),  # kv_up: column-parallel
    )
    sp = linear_gemm_shapes(plan_of(LATENT, tp=2, sequence_parallel=True))[0]
    assert [m for m, _, _ in sp] == [tokens / 2, tokens, tokens / 2, tokens]
    # the projection reads a d_v = 48 columns, split over TP
    assert weight_gemm_shapes(plan_of(LATENT, tp=2))[1] == (tokens, 64, 48 / 2)
    # the QKV entry stands for the four: h deep, as wide as gives their FLOPs
    m, n, k = weight_gemm_shapes(plan_of(LATENT, tp=2))[0]
    assert m * n * k == pytest.approx(sum(a * b * c for a, b, c in plain))


def test_forward_gemm_kernels_add_up_to_the_per_gpu_flops() -> None:
    for parallel in ({"tp": 1}, {"tp": 2}, {"tp": 2, "sequence_parallel": True}):
        plan = plan_of(LATENT, **parallel)
        forward, dgrad, wgrad = weight_gemm_kernels(plan)
        flops = sum(k.flops for k in forward)
        expected = layer_flops(
            plan.model,
            2,
            tp=plan.parallel.tp,
            sequence_parallel=plan.parallel.sequence_parallel,
        ).backward_weight
        assert flops == pytest.approx(expected)
        assert sum(k.flops for k in wgrad) == pytest.approx(expected)
        # both down projections' input gradients are partial sums over the input: one sum more
        assert sum(k.flops for k in dgrad if k.kind == "gemm") == pytest.approx(expected)
        sums = [k for k in dgrad if k.name == "projection_grad_sum"]
        own = 1 / 2 if plan.parallel.sequence_parallel else 1
        assert [k.bytes for k in sums] == [pytest.approx(2 * 64 * 64 * own)]


def test_the_fused_attention_kernel_reads_wider_keys_than_values() -> None:
    forward, backward = attention_core_kernels(plan_of(LATENT, tp=2))
    kernel = next(k for k in forward if k.kind == "attention_forward")
    # QK^T over 20 channels and AV over 12, 2 heads per GPU, causal: half of 2 b a s^2 (20 + 12)
    assert kernel.flops == 0.5 * 2 * 2 * 2 * 32 * 32 * (20 + 12)
    assert kernel.head_dim == 20
    aux = next(k for k in backward if k.name == "attention_backward_aux")
    # the dO . O pass reads the output and its gradient: 12 wide per head, not 20
    assert aux.bytes == FUSED_ATTENTION_BACKWARD_AUX_BYTES * 2 * 2 * 32 * 12


def test_activations_keep_the_latents_and_the_heads_by_hand() -> None:
    model = plan_of(LATENT).model
    tokens = 2 * 32
    kept = layer_activation_bytes(model, 2, tp=2, recompute="selective")
    # outside TP: 2 norm inputs and the QKV and MLP inputs (4 h); each latent norm's input and
    # output (2 x (24 + 8)), whole on each rank; inside: Q 80, K 80, V 48, projection input 48
    # and the gated MLP's 3f, split over 2
    assert kept == tokens * 2 * (4 * 64 + 2 * 32 + (80 + 80 + 48 + 48 + 3 * 128) / 2)
    sp = layer_activation_bytes(model, 2, tp=2, sequence_parallel=True, recompute="selective")
    assert sp == tokens * 2 * (4 * 64 + 2 * 32 + (80 + 80 + 48 + 48 + 3 * 128)) / 2


def test_zero3_modules_sum_to_the_parameters_on_each_rank() -> None:
    for tp in (1, 2):
        plan = plan_of(LATENT, tp=tp)
        layer0 = [m for m in zero3_modules(plan) if m.layer == 0]
        names = [m.name.rsplit(".", 1)[-1] for m in layer0 if m.tensors]
        assert "q_a_proj" in names and "kv_a_layernorm" in names
        assert sum(sum(m.tensors) for m in layer0) == layer_params_per_gpu(plan.model, tp)


def test_a_latent_plan_reads_back_equal() -> None:
    plan = plan_of({**LATENT, "head_dim": 16, "num_heads": 4})  # 4 x 16 = h: still written
    assert plan_to_dict(plan)["model"]["head_dim"] == 16
    assert load_plan(plan_to_dict(plan)) == plan


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"head_dim": 0}, r"model.kv_lora_rank=8 needs model.head_dim"),
        ({"kv_lora_rank": 0}, r"model.q_lora_rank=24 is a key of multi-head latent attention"),
        ({"num_kv_heads": 2}, r"model.num_kv_heads=2 with model.kv_lora_rank"),
        ({"qk_norm": True}, r"model.qk_norm with model.kv_lora_rank"),
        ({"v_head_dim": -1}, r"model.v_head_dim must be >= 0, got -1"),
        ({"kv_lora_rank": 1 << 20}, r"model.kv_lora_rank=1,048,576 is larger than any model"),
    ],
)
def test_bad_latent_keys_are_one_clear_error(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig(**{**LATENT, **change})


@pytest.mark.parametrize(
    ("parallel", "message"),
    [
        ({"cp": 2}, r"parallel.cp=2 with model.kv_lora_rank"),
        ({"recompute": "op"}, r"parallel.recompute=op with model.kv_lora_rank"),
    ],
)
def test_what_is_not_modelled_is_refused(parallel: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_plan(plan_of(LATENT, **parallel), 8)


DEEPSEEK_V3 = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
    "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
    "ep_size": 1, "first_k_dense_replace": 3, "hidden_act": "silu", "hidden_size": 7168,
    "initializer_range": 0.02, "intermediate_size": 18432, "kv_lora_rank": 512,
    "max_position_embeddings": 163840, "moe_intermediate_size": 2048, "moe_layer_freq": 1,
    "n_group": 8, "n_routed_experts": 256, "n_shared_experts": 1, "norm_topk_prob": True,
    "num_attention_heads": 128, "num_experts_per_tok": 8, "num_hidden_layers": 61,
    "num_key_value_heads": 128, "num_nextn_predict_layers": 1, "q_lora_rank": 1536,
    "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "rms_norm_eps": 1e-06,
    "rope_scaling": {"factor": 40, "type": "yarn"}, "rope_theta": 10000,
    "routed_scaling_factor": 2.5, "scoring_func": "sigmoid", "tie_word_embeddings": False,
    "topk_group": 4, "topk_method": "noaux_tc", "torch_dtype": "bfloat16",
    "transformers_version": "4.33.1", "use_cache": True, "v_head_dim": 128, "vocab_size": 129280,
}  # fmt: skip
"""deepseek-ai/DeepSeek-V3 config.json (as Megatron-Bridge's bridge tests copy it)."""


def _write(tmp_path: Path, name: str, content: Any) -> Path:
    path = tmp_path / name
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def _shape(model: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in model.items() if k not in ("name", "seq_len")}


def test_hf_deepseek_v3_config_is_the_preset(tmp_path: Path) -> None:
    imported = model_from_hf_config(_write(tmp_path, "config.json", DEEPSEEK_V3))
    read = ModelConfig(**{**imported.sections["model"], "seq_len": 4096})
    preset = ModelConfig(**resolve_model_preset("deepseek-v3"))
    assert dataclasses.replace(read, name=preset.name) == preset
    assert any("num_nextn_predict_layers=1" in line for line in imported.warnings)
    assert "routed_scaling_factor" in imported.ignored  # the router's scale costs nothing
    lite = {**DEEPSEEK_V3, "architectures": ["DeepseekV2ForCausalLM"], "q_lora_rank": None}
    assert (
        model_from_hf_config(_write(tmp_path, "v2.json", lite)).sections["model"]["q_lora_rank"]
        == 0
    )


def test_hf_deepseek_moe_pattern_counted_from_layer_zero_is_refused(tmp_path: Path) -> None:
    odd = {**DEEPSEEK_V3, "moe_layer_freq": 2}  # MoE where i >= 3 and i % 2 == 0
    with pytest.raises(ValueError, match=r"moe_layer_freq=2 with first_k_dense_replace=3"):
        model_from_hf_config(_write(tmp_path, "config.json", odd))


def test_megatron_flags_of_the_model_zoo_are_the_preset(tmp_path: Path) -> None:
    """Megatron-MoE-ModelZoo ``model_configs/benchmarking/DeepSeek-V3.yaml``'s model flags."""
    args = (
        "pretrain_gpt.py --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 "
        "--num-attention-heads 128 --kv-channels 128 --seq-length 4096 "
        "--max-position-embeddings 4096 --swiglu --normalization RMSNorm "
        "--untie-embeddings-and-output-weights --disable-bias-linear --position-embedding-type "
        "rope --attention-dropout 0.0 --hidden-dropout 0.0 --vocab-size 129280 "
        "--multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 "
        "--qk-pos-emb-head-dim 64 --v-head-dim 128 --qk-layernorm --rotary-scaling-factor 40 "
        "--mscale 1.0 --mscale-all-dim 1.0 --num-experts 256 --moe-ffn-hidden-size 2048 "
        "--moe-shared-expert-intermediate-size 2048 --moe-layer-freq ([0]*3+[1]*58) "
        "--moe-router-topk 8 --moe-router-num-groups 8 --moe-router-group-topk 4 "
        "--moe-grouped-gemm\n"
    )
    imported = from_megatron_args(_write(tmp_path, "dsv3.sh", args))
    read = ModelConfig(**imported.sections["model"])
    preset = ModelConfig(**resolve_model_preset("deepseek-v3"))
    assert dataclasses.replace(read, name=preset.name) == preset
    assert any("--kv-channels with --multi-latent-attention" in line for line in imported.warnings)
    # without the switch the widths are not a latent attention
    plain = from_megatron_args(
        _write(tmp_path, "plain.sh", args.replace("--multi-latent-attention ", ""))
    )
    assert "kv_lora_rank" not in plain.sections["model"]
    assert any("--q-lora-rank without --multi-latent-attention" in w for w in plain.warnings)


def test_moe_layers_run_separate_and_latent_projections_one_by_one() -> None:
    """An MoE layer's attention is a dense layer's: its separate linears (torchtitan's MoE
    models' wq, wk, wv) and latent attention's pieces are GEMMs of their own there too."""
    from schedules.moe_kernels import moe_layer_kernels

    moe = {"num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 32}
    plain = {k: v for k, v in LATENT.items() if k not in ("kv_lora_rank", "q_lora_rank")}
    plain = {**plain, "qk_rope_head_dim": 0, "v_head_dim": 0, "head_dim": 0}
    separate = plan_of({**plain, **moe, "separate_projections": True})
    qkv = [k for k in moe_layer_kernels(separate).forward if k.name == "qkv"]
    assert [k.dims[1] for k in qkv] == [64, 64, 64]  # q, k and v, 4 heads of 16 each
    latent = plan_of({**LATENT, **moe})
    pieces = [k for k in moe_layer_kernels(latent).forward if k.name == "qkv"]
    assert [k.dims for k in pieces] == [(64, 24, 64), (64, 80, 24), (64, 12, 64), (64, 112, 8)]


def test_only_the_output_projection_has_a_bias() -> None:
    """Megatron-Core builds the latent linears with ``bias=False`` whatever
    ``--add-bias-linear`` says; the output projection takes it."""
    biased = plan_of({**LATENT, "linear_bias": True}).model
    assert attention_params(biased) == attention_params(plan_of(LATENT).model) + 64


def test_the_pytorch_stacks_run_the_down_projections_on_every_token() -> None:
    """torchtitan's DeepSeek-V3 gathers the attention's input before its down projections;
    Megatron-Core runs them on each rank's sequence shard."""
    for stack, tokens in (("megatron", 32.0), ("compile", 64.0)):
        plan = load_plan(
            {
                "model": LATENT,
                "cluster": {"node": "dgx-h100"},
                "parallel": {"tp": 2, "sequence_parallel": True},
                "training": {"micro_batch_size": 2, "global_batch_size": 16, "stack": stack},
            }
        )
        q_down = linear_gemm_shapes(plan)[0][0]
        assert q_down == (tokens, 24, 64), stack


def test_tp_communication_overlap_is_refused() -> None:
    """Megatron-Core's ``TELinear`` turns ``tp_comm_overlap`` off for the latent linears'
    buffers, and with it the shared config's: no latent-attention run overlaps."""
    plan = plan_of(LATENT, tp=2, sequence_parallel=True, tp_comm_overlap=True)
    with pytest.raises(ValueError, match=r"tp_comm_overlap with model.kv_lora_rank"):
        resolve_plan(plan, 8)


def test_the_pytorch_stacks_concatenate_the_split_gradients_in_moe_layers_too() -> None:
    """An MoE layer's attention splits its up projections' outputs as a dense layer's does: on
    the eager and compile stacks the backward concatenates their gradients."""
    from schedules.kernels import EAGER_SPLIT_GRAD_BYTES
    from schedules.moe_kernels import moe_layer_kernels

    moe = {"num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 32}
    plan = load_plan(
        {
            "model": {**LATENT, **moe},
            "cluster": {"node": "dgx-h100"},
            "parallel": {},
            "training": {"micro_batch_size": 2, "global_batch_size": 16, "stack": "compile"},
        }
    )
    cat = [k for k in moe_layer_kernels(plan).backward_input if k.name == "split_grad_cat"]
    # Q 80 and the key/value up projection's 4 x (16 + 12), and the 8 + 4 latent, 64 tokens
    assert [k.bytes for k in cat] == [EAGER_SPLIT_GRAD_BYTES * 64 * (80 + 112 + 12)]


def test_kimi_k2_is_within_two_percent_of_its_reported_size() -> None:
    """Kimi K2's report gives 1.04T parameters, 32.6B active; its released shape (the model
    zoo's Kimi-K2.yaml) counts 1.026T and 32.9B here: the report rounds or counts otherwise."""
    from schedules.params import active_params

    model = ModelConfig(**resolve_model_preset("kimi-k2"))
    assert total_params(model) / 1e12 == pytest.approx(1.04, rel=0.02)
    assert active_params(model) / 1e9 == pytest.approx(32.6, rel=0.02)
    assert (model.num_heads, model.num_experts, model.moe_first_dense_layers) == (64, 384, 1)
