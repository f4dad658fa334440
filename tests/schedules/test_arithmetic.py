"""Model arithmetic against the papers: parameters, FLOPs, activation bytes, message sizes."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedules import arithmetic
from schedules.plan import (
    ClusterConfig,
    ModelConfig,
    ParallelConfig,
    Plan,
    TrainingConfig,
)
from schedules.resolve import resolve_plan
from tests.model_configs import LLAMA3_70B, gpt

GPT3 = gpt(96, 12288, 96)


def make_plan(model: ModelConfig, world_size: int, **parallel: object) -> Plan:
    """A resolved plan of ``model`` with the given parallel keys."""
    batch = parallel.pop("global_batch_size", 64)
    plan = Plan(
        model=model,
        cluster=ClusterConfig(node="dgx-h100"),
        parallel=ParallelConfig(**parallel),  # type: ignore[arg-type]
        training=TrainingConfig(micro_batch_size=1, global_batch_size=batch),  # type: ignore[arg-type]
    )
    return resolve_plan(plan, world_size)


def test_gpt3_parameters_match_megatron_formula() -> None:
    h = 12288
    formula = arithmetic.megatron_gpt_params(96, h, 51200, 2048)
    # Megatron's formula leaves out the final LayerNorm (2h).
    assert arithmetic.total_params(GPT3) - 2 * h == pytest.approx(formula, rel=1e-12)
    assert arithmetic.total_params(GPT3) == pytest.approx(174.6e9, rel=1e-3)
    assert arithmetic.layer_params(GPT3) == 12 * h**2 + 13 * h


def test_llama3_70b_parameters_by_hand() -> None:
    h, kv, f, v = 8192, 1024, 28672, 128256
    layer = (h * (h + 2 * kv) + h * h) + 3 * h * f + 2 * h
    assert arithmetic.layer_params(LLAMA3_70B) == layer == 855_654_400
    assert arithmetic.total_params(LLAMA3_70B) == 80 * layer + 2 * v * h + h == 70_553_706_496


def test_stage_params_sum_to_the_model() -> None:
    untied = dataclasses.replace(LLAMA3_70B, num_layers=8)
    one = make_plan(untied, 1)
    assert arithmetic.stage_params_per_gpu(one, 0) == arithmetic.total_params(untied)
    two = make_plan(untied, 2, pp=2)
    stages = [arithmetic.stage_params_per_gpu(two, s) for s in range(2)]
    assert sum(stages) == arithmetic.total_params(untied)
    tied = make_plan(gpt(8, 1024, 16), 2, pp=2)
    # Megatron keeps a copy of the tied word embedding on the last stage.
    tied_stages = [arithmetic.stage_params_per_gpu(tied, s) for s in range(2)]
    assert sum(tied_stages) == arithmetic.total_params(tied.model) + 51200 * 1024


def test_tp_shards_matrices_but_not_norms() -> None:
    model = gpt(2, 1024, 16)
    h = 1024
    replicated = 2 * 2 * h + 2 * h  # 2 LayerNorms + row-parallel biases
    per_gpu = arithmetic.layer_params_per_gpu(model, 4)
    assert per_gpu == (12 * h**2 + 13 * h - replicated) / 4 + replicated


def test_layer_forward_flops_megatron_gpt() -> None:
    b, s, h = 2, 2048, 12288
    expected = 24 * b * s * h**2 + 4 * b * s**2 * h
    assert arithmetic.layer_forward_flops(GPT3, b, causal=False) == expected
    causal = arithmetic.layer_forward_flops(GPT3, b, causal=True)
    assert causal == 24 * b * s * h**2 + 2 * b * s**2 * h


def test_narayanan_eq3_full_recompute() -> None:
    model = gpt(24, 2304, 24)
    plan = make_plan(model, 32, recompute="full", global_batch_size=512)
    flops = arithmetic.hardware_flops_per_step(plan, causal=False)
    expected = arithmetic.narayanan_flops_per_iteration(512, 2048, 24, 2304, 51200)
    assert flops == pytest.approx(expected, rel=1e-12)


def test_model_flops_without_recompute_closed_form() -> None:
    model = gpt(24, 2304, 24)
    plan = make_plan(model, 32, recompute="full", global_batch_size=512)
    flops, definition = arithmetic.model_flops_per_step(plan, causal=False)
    b, s, layers, h, v = 512, 2048, 24, 2304, 51200
    closed_form = 72 * b * s * layers * h**2 * (1 + s / (6 * h) + v / (12 * layers * h))
    assert flops == pytest.approx(closed_form)
    assert "no recomputation" in definition and "non-causal" in definition
    _, causal_definition = arithmetic.model_flops_per_step(plan)
    assert "halved for causal" in causal_definition


def test_layer_flops_backward_split_and_recompute() -> None:
    b = 1
    tokens = b * LLAMA3_70B.seq_len
    weight = arithmetic.attention_linear_flops(LLAMA3_70B, tokens) + arithmetic.mlp_flops(
        LLAMA3_70B, tokens
    )
    core = arithmetic.attention_core_flops(LLAMA3_70B, b, causal=True)
    flops = arithmetic.layer_flops(LLAMA3_70B, b, recompute="selective")
    assert flops.forward == weight + core
    assert flops.backward == 2 * flops.forward
    assert flops.backward_weight == weight and flops.backward_input == weight + 2 * core
    assert flops.recompute == core
    full = arithmetic.layer_flops(LLAMA3_70B, b, recompute="full", tp=4, cp=2)
    assert full.recompute == full.forward == (weight + core) / 8
    assert arithmetic.layer_flops(LLAMA3_70B, b).recompute == 0.0


def test_gqa_and_gated_mlp_flops_by_hand() -> None:
    tokens = 8192
    h, kv, f = 8192, 1024, 28672
    assert (
        arithmetic.attention_linear_flops(LLAMA3_70B, tokens)
        == 2 * tokens * h * (h + 2 * kv) + 2 * tokens * h * h
    )
    assert arithmetic.mlp_flops(LLAMA3_70B, tokens) == 6 * tokens * h * f
    assert arithmetic.logits_flops(LLAMA3_70B, 1) == 2 * tokens * h * 128256


# Korthikanti et al. 2022, Table 3 models (t = 8) and Table 2 formulas per layer.
KORTHIKANTI_MODELS = [
    # (name, heads a, hidden h, layers, micro-batch b)
    ("22B", 64, 6144, 48, 4),
    ("175B", 96, 12288, 96, 1),
    ("530B", 128, 20480, 105, 1),
    ("1T", 160, 25600, 128, 1),
]


@pytest.mark.parametrize(("name", "a", "h", "layers", "b"), KORTHIKANTI_MODELS)
def test_korthikanti_table2_activation_formulas(
    name: str, a: int, h: int, layers: int, b: int
) -> None:
    s, t = 2048, 8
    model = gpt(layers, h, a, seq_len=s)
    sbh = s * b * h

    def per_layer(**kwargs: object) -> float:
        return arithmetic.layer_activation_bytes(model, b, **kwargs)  # type: ignore[arg-type]

    assert per_layer() == pytest.approx(sbh * (34 + 5 * a * s / h))
    assert per_layer(tp=t) == pytest.approx(sbh * (10 + 24 / t + 5 * a * s / (h * t)))
    assert per_layer(tp=t, sequence_parallel=True) == pytest.approx(sbh / t * (34 + 5 * a * s / h))
    assert per_layer(tp=t, recompute="selective") == pytest.approx(sbh * (10 + 24 / t))
    selective_sp = per_layer(tp=t, sequence_parallel=True, recompute="selective")
    assert selective_sp == pytest.approx(34 * sbh / t)
    assert per_layer(recompute="full") == 2 * sbh


def test_gpt3_selective_sp_bytes_by_hand() -> None:
    # 34 s b h / t = 34 * 2048 * 1 * 12288 / 8 bytes per layer.
    value = arithmetic.layer_activation_bytes(
        GPT3, 1, tp=8, sequence_parallel=True, recompute="selective"
    )
    assert value == 106_954_752


def test_activations_of_llama_with_flash_attention_by_hand() -> None:
    s, h, kv, f, a, t = 8192, 8192, 1024, 28672, 64, 4
    outside = s * 2 * h * 4  # 2 norm inputs, QKV and MLP inputs, no dropout masks
    inside = s * (2 * (h + 2 * kv) + 2 * h + 2 * 3 * f)
    lse = 4 * a * s
    value = arithmetic.layer_activation_bytes(
        LLAMA3_70B, 1, tp=t, sequence_parallel=True, flash_attention=True
    )
    assert value == pytest.approx(outside / t + inside / t + lse / t)
    full_cp = arithmetic.layer_activation_bytes(
        LLAMA3_70B, 1, tp=t, cp=2, sequence_parallel=True, recompute="full"
    )
    assert full_cp == 2 * (s / 2) * h / t


def test_in_flight_microbatches_per_schedule() -> None:
    assert arithmetic.in_flight_microbatches("1f1b", pp=4, stage=0, num_micro=8) == 4
    assert arithmetic.in_flight_microbatches("1f1b", pp=4, stage=3, num_micro=8) == 1
    assert arithmetic.in_flight_microbatches("1f1b", pp=4, stage=0, num_micro=2) == 2
    assert arithmetic.in_flight_microbatches("zb-h1", pp=4, stage=1, num_micro=8) == 3
    assert arithmetic.in_flight_microbatches("gpipe", pp=4, stage=3, num_micro=8) == 8


def test_interleaved_first_stage_holds_korthikanti_layers() -> None:
    p, v, layers = 4, 3, 48
    stored = arithmetic.stored_layer_activations(
        "interleaved", pp=p, vpp=v, stage=0, num_micro=16, stage_layers=layers / p
    )
    assert stored == pytest.approx(layers * (1 + (p - 1) / (p * v)))
    one_f_one_b = arithmetic.stored_layer_activations(
        "1f1b", pp=p, vpp=1, stage=0, num_micro=16, stage_layers=layers / p
    )
    assert one_f_one_b == layers


def test_message_sizes() -> None:
    b, s, h = 2, 8192, 8192
    assert arithmetic.tp_message_bytes(LLAMA3_70B, b) == 2 * b * s * h
    assert arithmetic.tp_message_bytes(LLAMA3_70B, b, cp=2) == b * s * h
    assert arithmetic.pp_message_bytes(LLAMA3_70B, b, tp=4) == 2 * b * s * h
    sp = arithmetic.pp_message_bytes(LLAMA3_70B, b, tp=4, cp=2, sequence_parallel=True)
    assert sp == 2 * b * s * h / 8
    assert arithmetic.cp_kv_message_bytes(LLAMA3_70B, 1, tp=4, cp=2) == 2 * 2 * (s / 2) * 1024 / 4
    counts = arithmetic.tp_collectives_per_layer(sequence_parallel=True)
    assert counts["backward"] == {"all_gather": 4, "reduce_scatter": 2}
    assert arithmetic.tp_collectives_per_layer(False)["forward"] == {"all_reduce": 2}


def test_dp_message_sizes_follow_grad_dtype() -> None:
    model = dataclasses.replace(LLAMA3_70B, num_layers=8)
    ddp = make_plan(model, 8)
    params = arithmetic.stage_params_per_gpu(ddp, 0)
    assert arithmetic.dp_grad_bytes(ddp) == 2 * params
    assert arithmetic.dp_param_bytes(ddp) == 2 * params
    megatron = make_plan(model, 8, data_parallel="distributed_optimizer")
    assert arithmetic.dp_grad_bytes(megatron) == 4 * params
    fsdp = make_plan(model, 8, tp=2, data_parallel="fsdp")
    layer = arithmetic.layer_params_per_gpu(model, 2)
    assert arithmetic.fsdp_unit_param_bytes(fsdp) == 2 * layer
    assert arithmetic.fsdp_unit_grad_bytes(fsdp) == 2 * layer


@settings(max_examples=50, deadline=None)
@given(
    layers=st.integers(1, 8),
    heads=st.sampled_from([4, 8, 16]),
    groups=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([16, 64, 128]),
    ffn=st.integers(1, 4096),
    b=st.integers(1, 4),
    tp=st.sampled_from([1, 2, 4]),
    causal=st.booleans(),
)
def test_flops_invariants(
    layers: int, heads: int, groups: int, head_dim: int, ffn: int, b: int, tp: int, causal: bool
) -> None:
    model = ModelConfig(
        name="random",
        num_layers=layers,
        hidden_size=heads * head_dim,
        num_heads=heads,
        num_kv_heads=heads // groups,
        ffn_hidden_size=ffn,
        vocab_size=1000,
        seq_len=256,
    )
    whole = arithmetic.layer_flops(model, b, causal=causal, recompute="full")
    sharded = arithmetic.layer_flops(model, b, causal=causal, recompute="full", tp=tp)
    assert whole.backward == pytest.approx(2 * whole.forward)
    assert whole.recompute == whole.forward
    assert sharded.forward == pytest.approx(whole.forward / tp)
    assert whole.backward_input >= whole.backward_weight
    assert arithmetic.total_params(model) > layers * arithmetic.layer_params(model)
