"""Mixture-of-experts arithmetic: layers, parameters, FLOPs, routing loads, groups, plan checks."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from schedules.flops import layer_forward_flops, model_flops_per_step, moe_layer_forward_flops
from schedules.layout import Layout
from schedules.memory import stage_memory_bytes
from schedules.moe import (
    chance_load,
    dispatch_bytes,
    expected_max_normal,
    expert_data_parallel,
    expert_tokens,
    is_moe_layer,
    load_factor,
    routed_tokens,
)
from schedules.params import (
    active_params,
    layer_params,
    layer_params_per_gpu,
    moe_layer_params_per_gpu,
    stage_expert_params_per_gpu,
    stage_params_per_gpu,
    total_params,
)
from schedules.plan import load_plan
from schedules.resolve import resolve_plan

TINY = {
    "name": "tiny-moe", "num_layers": 4, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 4,
    "ffn_hidden_size": 256, "vocab_size": 1000, "seq_len": 32, "num_experts": 8, "moe_top_k": 2,
    "moe_ffn_hidden_size": 128,
}  # fmt: skip


def plan_of(model: dict[str, Any] | str, parallel: dict[str, Any], gpus: int = 8) -> Any:
    raw = {
        "model": model,
        "cluster": {"node": "dgx-h100", "num_nodes": max(gpus // 8, 1)},
        "parallel": parallel,
        "training": {"micro_batch_size": 2, "global_batch_size": 64},
    }
    return resolve_plan(load_plan(raw), gpus)


def test_mixtral_counts_match_the_published_ones() -> None:
    # Mixtral of Experts (arXiv:2401.04088): 46.7B parameters, 12.9B active per token.
    model = plan_of("mixtral-8x7b", {"ep": 8}).model
    assert total_params(model) / 1e9 == pytest.approx(46.7, abs=0.05)
    assert active_params(model) / 1e9 == pytest.approx(12.9, abs=0.05)


def test_moe_layer_pattern_follows_first_dense_and_frequency() -> None:
    model = load_plan(
        {
            "model": {**TINY, "num_layers": 7, "moe_first_dense_layers": 1, "moe_layer_freq": 2},
            "cluster": {"node": "dgx-h100"},
            "training": {"micro_batch_size": 1, "global_batch_size": 8},
        }
    ).model
    assert [is_moe_layer(model, i) for i in range(7)] == [0, 1, 0, 1, 0, 1, 0]


def test_parameters_by_hand() -> None:
    model = plan_of(TINY, {"ep": 8}).model
    h, f_e = 64, 128
    expert = 3 * h * f_e  # gated: gate, up, down
    moe_layer = layer_params(model) - 3 * h * 256 + h * 8 + 8 * expert
    assert total_params(model) == 4 * moe_layer + 2 * 1000 * h + h
    assert active_params(model) == total_params(model) - 4 * 6 * expert


def test_moe_forward_flops_by_hand() -> None:
    model = plan_of(TINY, {"ep": 8}).model
    tokens, h = 2 * 32, 64
    dense = layer_forward_flops(model, 2, causal=True)
    dense_mlp = 3 * 2 * tokens * h * 256
    router, routed = 2 * tokens * h * 8, 2 * 3 * 2 * tokens * h * 128
    assert moe_layer_forward_flops(model, 2, causal=True) == dense - dense_mlp + router + routed


def test_model_flops_count_active_experts() -> None:
    plan = plan_of(TINY, {"ep": 8})
    flops, definition = model_flops_per_step(plan)
    layers = 4 * moe_layer_forward_flops(plan.model, 64, causal=True)
    assert flops == pytest.approx(3 * (layers + 2 * 64 * 32 * 1000 * 64))
    assert "active parameters" in definition


# Chance alone on TINY (64 tokens per GPU, top 2 of 8): with EP 8 the 512 tokens of the group
# put 128 copies on each GPU's one expert, variance 512 x 2 x 1/8 x 7/8 x 6/7 = 96; the busiest of
# 8 GPUs is 1.4236 standard deviations above the mean: 1 + 1.4236 sqrt(96) / 128.
CHANCE_EP8 = 1 + 1.4236 * 96**0.5 / 128


@pytest.mark.parametrize(
    ("ep", "imbalance", "capacity", "expected"),
    [
        (8, 1.0, None, CHANCE_EP8),  # balanced on average: chance sets the busiest GPU
        (8, 3.0, None, 3.0),
        (2, 2.0, None, 1.25),  # 4 experts per GPU: (2 + 3) / 4, above chance's 1.03
        (8, 3.0, 1.5, 1.5),  # tokens past the capacity are dropped
        (2, 2.0, 1.5, 1.125),  # the busiest expert capped first: (1.5 + 3) / 4
        (8, 1.0, 1.05, 1.05),  # and the capacity caps chance's excess too
    ],
)
def test_load_factor(ep: int, imbalance: float, capacity: float | None, expected: float) -> None:
    model = {**TINY, "moe_imbalance": imbalance, "moe_capacity_factor": capacity}
    plan = plan_of(model, {"ep": ep})
    assert load_factor(plan) == pytest.approx(expected, rel=1e-4)


def test_expected_max_normal_matches_the_order_statistics() -> None:
    # E[max of n standard normals]: 1/sqrt(pi) for two (closed form); 1.0294, 1.4236 (tables)
    assert expected_max_normal(1) == 0.0
    assert expected_max_normal(2) == pytest.approx(1 / math.pi**0.5, abs=1e-4)
    assert expected_max_normal(4) == pytest.approx(1.0294, abs=1e-4)
    assert expected_max_normal(8) == pytest.approx(1.4236, abs=1e-4)


def test_chance_load_by_hand() -> None:
    # EP 2 on TINY: each GPU holds 4 of 8 experts; 128 tokens route 2 copies each, a GPU gets
    # 128 on average with variance 128 x 2 x 1/2 x 1/2 x 6/7; the busier of two is 1/sqrt(pi)
    # standard deviations above.
    plan = plan_of(TINY, {"ep": 2})
    sigma = (128 * 2 * 0.25 * 6 / 7) ** 0.5
    assert chance_load(plan) == pytest.approx(1 + sigma / math.pi**0.5 / 128, rel=1e-4)
    # no expert parallelism: one GPU holds every expert, nothing to wait for
    assert chance_load(plan_of(TINY, {"ep": 1})) == 1.0
    # more tokens per GPU: the excess shrinks as one over their square root
    bigger = plan_of({**TINY, "seq_len": 128}, {"ep": 8})
    assert chance_load(bigger) - 1 == pytest.approx((CHANCE_EP8 - 1) / 2, rel=1e-3)


def test_tokens_and_dispatch_messages() -> None:
    plan = plan_of({**TINY, "moe_imbalance": 2.0}, {"ep": 4, "tp": 2, "sequence_parallel": True})
    assert routed_tokens(plan) == 2 * 32 / 2  # b s / tp under sequence parallelism
    # 2 experts per GPU, the busiest at 2x the mean: the GPU carries (2 + 1) / 2 = 1.5x
    assert expert_tokens(plan) == 32 * 2 * 2 * 1.5  # T_r k etp x load
    assert dispatch_bytes(plan) == 32 * 2 * 64 * 2 * 1.5  # T_r k h bf16 x load
    gather = resolve_plan(
        load_plan(
            {
                "model": TINY,
                "cluster": {"node": "dgx-h100"},
                "parallel": {
                    "ep": 4,
                    "tp": 2,
                    "etp": 1,
                    "sequence_parallel": True,
                    "moe_token_dispatcher": "allgather",
                },
                "training": {"micro_batch_size": 2, "global_batch_size": 64},
            }
        ),
        8,
    )
    assert dispatch_bytes(gather) == 32 * 64 * 2 * 4 * 1


def test_expert_groups_follow_megatron_core_order() -> None:
    # 16 GPUs per stage, tp 2 and etp 1: expert rank order etp-ep-edp inside each stage.
    layout = Layout(tp=2, dp=8, ep=4, etp=1)
    assert layout.group("ep", 5) == (4, 5, 6, 7)
    assert layout.group("edp", 5) == (1, 5, 9, 13)
    assert layout.group("etp", 5) == (5,)
    # etp = tp = 2, ep 4 over 8 GPUs per stage, second stage
    layout = Layout(tp=2, dp=4, pp=2, ep=4)
    assert layout.group("ep", 11) == (9, 11, 13, 15)
    assert layout.group("etp", 11) == (10, 11)
    assert layout.group("tpep", 11) == tuple(range(8, 16))
    assert layout.group("edp", 11) == (11,)


def test_expert_states_shard_over_expert_data_parallel() -> None:
    plan = plan_of(TINY, {"ep": 2, "data_parallel": "distributed_optimizer"})
    assert expert_data_parallel(plan.parallel) == 4
    params = stage_params_per_gpu(plan, 0)
    experts = stage_expert_params_per_gpu(plan, 0)
    assert experts == 4 * 8 / 2 * 3 * 64 * 128
    memory = stage_memory_bytes(plan, 0)
    assert memory["optimizer"] == pytest.approx((params - experts) * 12 / 8 + experts * 12 / 4)
    assert memory["weights"] == pytest.approx(params * 2)


@pytest.mark.parametrize(
    ("model", "parallel", "message"),
    [
        (TINY, {"ep": 3}, "is not divisible by parallel.ep=3"),
        (TINY, {"ep": 8, "tp": 2, "sequence_parallel": True}, "must divide tp * cp * dp"),
        (TINY, {"ep": 2, "tp": 2}, "needs sequence_parallel"),
        (TINY, {"ep": 2, "data_parallel": "hsdp"}, "MoE plans are simulated with"),
        (TINY, {"ep": 2, "data_parallel": "fsdp"}, "set data_parallel: fsdp2"),
        (
            TINY,
            {"ep": 2, "data_parallel": "fsdp2", "offload_param": "cpu"},
            "without CPU offload, got offload_param='cpu'",
        ),
        (
            TINY,
            {"data_parallel": "fsdp2", "tp": 2, "sequence_parallel": True, "etp": 1},
            "etp=1 must equal tp=2",
        ),
        (
            TINY,
            {"data_parallel": "fsdp2", "tp": 4, "sequence_parallel": True, "etp": 2, "ep": 2},
            "etp=2 must be 1 or tp=4",
        ),
        ({**TINY, "num_experts": 0}, {"ep": 2}, "need an MoE model"),
        ({**TINY, "moe_top_k": 9}, {}, "moe_top_k=9"),
        ({**TINY, "moe_imbalance": 0.5}, {}, "moe_imbalance=0.5"),
    ],
)
def test_bad_moe_plans_name_the_problem(
    model: dict[str, Any], parallel: dict[str, Any], message: str
) -> None:
    with pytest.raises(ValueError, match=message.replace("*", r"\*").replace(".", r"\.")):
        plan_of(model, parallel)


def test_fsdp2_shards_the_experts_over_their_own_group_and_sizes_its_buffers_by_the_moe_layer() -> (
    None
):
    """torchtitan's FSDP2 with EP 2 on 8 GPUs: the routed experts' states are sharded over the 4
    GPUs of edp, the rest over all 8; the two units in flight and one unit's gradients (bf16 and
    the fp32 reduce-scatter input) are MoE layers', the largest."""
    plan = plan_of(TINY, {"ep": 2, "data_parallel": "fsdp2"})
    params = stage_params_per_gpu(plan, 0)
    experts = stage_expert_params_per_gpu(plan, 0)
    assert experts == 4 * 8 / 2 * 3 * 64 * 128
    memory = stage_memory_bytes(plan, 0)
    assert memory["weights"] == pytest.approx((params - experts) * 2 / 8 + experts * 2 / 4)
    assert memory["optimizer"] == pytest.approx((params - experts) * 12 / 8 + experts * 12 / 4)
    unit = moe_layer_params_per_gpu(plan.model, plan.parallel)
    assert unit > layer_params_per_gpu(plan.model, 1)
    assert memory["buffers"] == pytest.approx(2 * unit * 2 + unit * (2 + 4))
    # the head unit ([norm, output]): what is left of the stage's parameters past its layers
    embedding = 1000 * 64
    head = params - embedding - 4 * unit
    assert memory["fsdp_unsharded"] == pytest.approx(head * (2 + 4))


def test_the_moe_layer_being_recomputed_holds_its_expert_activations() -> None:
    """Under full recompute every layer keeps only its input, and the one being recomputed holds
    everything until its backward ends: for an MoE stage that includes its expert, router and
    shared-expert terms (moe_layer_extra_bytes without recompute), so the busiest expert's
    tokens (moe_imbalance) show in the peak."""
    import dataclasses

    from schedules.memory import activation_bytes, eager_saved_bytes, moe_layer_extra_bytes

    def peak(imbalance: float) -> float:
        plan = plan_of({**TINY, "moe_imbalance": imbalance}, {"ep": 8, "recompute": "full"})
        return activation_bytes(plan, 0)

    full = plan_of(TINY, {"ep": 8, "recompute": "full"})
    whole = dataclasses.replace(full, parallel=dataclasses.replace(full.parallel, recompute="none"))
    assert moe_layer_extra_bytes(full) == 0.0  # stored layers keep only their input
    hot = plan_of({**TINY, "moe_imbalance": 2.0}, {"ep": 8, "recompute": "full"})
    hot_whole = dataclasses.replace(
        hot, parallel=dataclasses.replace(hot.parallel, recompute="none")
    )
    extra = moe_layer_extra_bytes(hot_whole) - moe_layer_extra_bytes(whole)
    # and, on the eager stack, the hotter experts' silu(gate) in the layer being recomputed
    extra += eager_saved_bytes(hot, recompute="none", moe_layer=True)
    extra -= eager_saved_bytes(full, recompute="none", moe_layer=True)
    assert extra > 0
    assert peak(2.0) - peak(1.0) == pytest.approx(extra, rel=1e-12)


def test_a_run_of_layers_is_priced_at_its_mean_load() -> None:
    """Layers 0 and 1 of TINY at EP 8 with the busiest expert at 1.0 and 3.0: their loads are
    chance's 1.109 and 3.0, and the share the run is priced at gives their mean load (not the
    load of the mean share, 2.0, which would miss chance's excess on layer 0)."""
    from schedules.moe import mean_hottest, with_hottest

    raw = {
        "model": TINY,
        "cluster": {"node": "dgx-h100", "num_nodes": 1},
        "parallel": {"ep": 8},
        "training": {"micro_batch_size": 2, "global_batch_size": 64},
        "whatif": {"moe_imbalance": {0: 1.0, 1: 3.0}},
    }
    plan = resolve_plan(load_plan(raw), 8)
    share = mean_hottest(plan, [0, 1])
    assert share is not None
    assert load_factor(with_hottest(plan, share)) == pytest.approx((CHANCE_EP8 + 3.0) / 2, rel=1e-6)
    # every layer at or below chance: the lowest share, priced at chance
    calm = dataclasses.replace(plan.whatif, moe_layer_imbalance=((0, 1.0), (1, 1.05)))
    assert mean_hottest(dataclasses.replace(plan, whatif=calm), [0, 1]) == 1.0


def test_fsdp2_experts_are_whole_unless_told_and_float8_gathers_are_refused() -> None:
    """torchtitan's expert_tensor_parallel_degree defaults to 1: unset, etp is 1 under FSDP2
    with EP (Megatron's default, tp, elsewhere), so each of the 16 GPUs of a TP-2 stage holds
    whole experts, its edp spanning tp x dp / ep = 4 GPUs."""
    tp2 = {"tp": 2, "sequence_parallel": True, "ep": 4}
    titan = plan_of(TINY, {**tp2, "data_parallel": "fsdp2"}, gpus=16)
    megatron = plan_of(TINY, {**tp2, "data_parallel": "distributed_optimizer"}, gpus=16)
    assert (titan.parallel.expert_tp, megatron.parallel.expert_tp) == (1, 2)
    assert expert_data_parallel(titan.parallel) == 4
    raw = {
        "model": TINY,
        "cluster": {"node": "dgx-h100", "num_nodes": 1},
        "parallel": {"ep": 2, "data_parallel": "fsdp2"},
        "training": {"micro_batch_size": 2, "global_batch_size": 64, "precision": "fp8",
                     "stack": "compile", "float8_all_gather": True},
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"set training\.float8_all_gather false"):
        resolve_plan(load_plan(raw), 8)
