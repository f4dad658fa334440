"""Multi-token prediction (``model.mtp_num_layers``) as Megatron-Core builds it: parameters,
FLOPs, memory, the replay's recipes, refusals and the Megatron importer, against hand counts and
DeepSeek-V3's published size."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from schedules.actions import CommStep, ComputeStep
from schedules.activations import ACTIVATION_BYTES
from schedules.flops import gemm_flops, hardware_flops_per_step, model_flops_per_step
from schedules.importers import from_megatron_args
from schedules.kernels import kernel_stack
from schedules.memory import activation_bytes, mtp_activation_bytes, stage_memory_bytes
from schedules.model_presets import resolve_model_preset
from schedules.params import (
    layer_params,
    layer_params_per_gpu,
    mtp_params,
    mtp_params_per_gpu,
    stage_expert_params_per_gpu,
    stage_params_per_gpu,
    total_params,
)
from schedules.plan import ModelConfig, load_plan
from schedules.resolve import resolve_plan
from schedules.step import chunk_expert_params, describe_step, tied_embedding_grad_bytes
from sim.compute.compute_model import ComputeModel
from sim.replay.recipes import step_costs
from sim.replay.simulate import simulate_plan
from sim.replay.step_replay import _chunk_work
from topologies.hardware import GPUS

SMALL = {
    "name": "small", "num_layers": 4, "hidden_size": 64, "num_heads": 4, "ffn_hidden_size": 256,
    "vocab_size": 1024, "seq_len": 128,
}  # fmt: skip
"""Gated MLP, RMSNorm, no biases, untied embeddings."""
SMALL_MOE = {**SMALL, "num_experts": 4, "moe_top_k": 2, "moe_ffn_hidden_size": 64}


def plan_of(model: dict[str, Any], world: int = 8, **parallel: Any) -> Any:
    training = {"micro_batch_size": 1, "global_batch_size": 32, "stack": "megatron"}
    training.update(parallel.pop("training", {}))
    plan = load_plan(
        {
            "model": model,
            "cluster": {"node": "dgx-h100"},
            "parallel": {"data_parallel": "distributed_optimizer", **parallel},
            "training": training,
        }
    )
    return resolve_plan(plan, world)


def test_params_by_hand() -> None:
    h = 64
    plain = ModelConfig(**SMALL)
    mtp = ModelConfig(**SMALL, mtp_num_layers=2)
    # per depth: a layer (4h^2 attention + 3 h f MLP + 2 norms), eh_proj 2h^2, three norms
    layer = 4 * h * h + 3 * h * 256 + 2 * h
    assert layer_params(plain) == layer
    assert mtp_params(mtp) == 2 * (layer + 2 * h * h + 3 * h)
    assert total_params(mtp) - total_params(plain) == 2 * (layer + 2 * h * h + 3 * h)


def test_deepseek_v3_with_its_prediction_module_is_685b() -> None:
    """DeepSeek-V3's checkpoint: 671B of main model and 14B of MTP module, which stores its own
    embedding and head (V h each, shared in training): 685B (the model card)."""
    v3 = ModelConfig(**resolve_model_preset("deepseek-v3"))
    with_mtp = dataclasses.replace(v3, mtp_num_layers=1)
    stored = total_params(with_mtp) + 2 * v3.vocab_size * v3.hidden_size
    assert stored == pytest.approx(685e9, rel=0.005)
    assert total_params(v3) == pytest.approx(671e9, rel=0.005)


def test_last_stage_holds_the_depths_and_an_embedding_copy() -> None:
    h, t, v = 64, 2, 1024
    plan = plan_of({**SMALL, "mtp_num_layers": 1}, tp=2, pp=2)
    plain = plan_of(SMALL, tp=2, pp=2)
    per_depth = layer_params_per_gpu(plan.model, t) + 2 * h * h / t + 3 * h
    assert mtp_params_per_gpu(plan) == per_depth + v * h / t  # the word embedding's copy
    diff = stage_params_per_gpu(plan, 1) - stage_params_per_gpu(plain, 1)
    assert diff == pytest.approx(per_depth + v * h / t)
    assert stage_params_per_gpu(plan, 0) == stage_params_per_gpu(plain, 0)
    # the two copies' gradients are summed over the first and last stage
    assert tied_embedding_grad_bytes(plan, 0) == tied_embedding_grad_bytes(plan, 1) > 0
    assert tied_embedding_grad_bytes(plain, 1) == 0
    # one stage: the embedding is there already
    single = plan_of({**SMALL, "mtp_num_layers": 1}, tp=2)
    assert mtp_params_per_gpu(single) == per_depth
    # tied: the last stage still allocates its output layer beside the embedding it builds
    tied = plan_of({**SMALL, "mtp_num_layers": 1, "tied_embeddings": True}, tp=2, pp=2)
    assert mtp_params_per_gpu(tied) == per_depth + v * h / t


def test_moe_depth_experts_reduce_over_expert_data_parallel() -> None:
    plan = plan_of({**SMALL_MOE, "mtp_num_layers": 1}, pp=2, ep=2)
    plain = plan_of(SMALL_MOE, pp=2, ep=2)
    experts = 4 / 2 * 3 * 64 * 64  # E/ep experts of 3 h x f_moe
    assert stage_expert_params_per_gpu(plan, 1) - stage_expert_params_per_gpu(plain, 1) == experts
    assert chunk_expert_params(plan, 1, 0) - chunk_expert_params(plain, 1, 0) == experts
    assert chunk_expert_params(plan, 0, 0) == chunk_expert_params(plain, 0, 0)


def test_flops_as_megatron_counts_them() -> None:
    h, f, v, s, batch = 64, 256, 1024, 128, 32
    plan = plan_of({**SMALL, "mtp_num_layers": 1})
    plain = plan_of(SMALL)
    tokens = batch * s
    layer = gemm_flops(tokens, 4 * h, h) + 3 * gemm_flops(tokens, f, h)
    layer += 2 * gemm_flops(batch * s, s, h) / 2  # QK^T and AV, causal
    depth = layer + gemm_flops(tokens, h, 2 * h) + gemm_flops(tokens, v, h)
    with_mtp, definition = model_flops_per_step(plan)
    assert with_mtp - model_flops_per_step(plain)[0] == pytest.approx(3 * depth)
    assert "multi-token-prediction" in definition
    # full (uniform) recompute reruns the projection and the layer, not the head
    full = plan_of({**SMALL, "mtp_num_layers": 1}, recompute="full")
    full_plain = plan_of(SMALL, recompute="full")
    rerun = hardware_flops_per_step(full) - hardware_flops_per_step(full_plain)
    assert rerun == pytest.approx(3 * depth + depth - gemm_flops(tokens, v, h))


def test_memory_of_the_depths_on_the_last_stage() -> None:
    plan = plan_of({**SMALL, "mtp_num_layers": 1}, tp=2, pp=2, sequence_parallel=True)
    plain = plan_of(SMALL, tp=2, pp=2, sequence_parallel=True)
    stream = ACTIVATION_BYTES * 128 * 64 / 2  # SP-sharded residual stream
    depth = mtp_activation_bytes(plan)
    head = ACTIVATION_BYTES * 128 * 64 * (1 / 2 + 1)  # final-norm input (SP) + head input
    assert activation_bytes(plan, 1) - activation_bytes(plain, 1) == pytest.approx(depth + head)
    assert activation_bytes(plan, 0) == activation_bytes(plain, 0)
    sharded = {"tp": 2, "pp": 2, "sequence_parallel": True}
    full = plan_of({**SMALL, "mtp_num_layers": 1}, recompute="full", **sharded)
    assert mtp_activation_bytes(full) == 2 * stream  # the checkpoint's two inputs
    block = plan_of(
        {**SMALL, "mtp_num_layers": 1}, recompute="full", recompute_num_layers=1, **sharded
    )
    assert mtp_activation_bytes(block) == mtp_activation_bytes(plan) > 2 * stream
    # each depth's loss keeps 4 bytes a logit (Megatron's default, unfused cross-entropy)
    logits = stage_memory_bytes(plan, 1)["logits"] - stage_memory_bytes(plain, 1)["logits"]
    assert logits == 4 * 128 * 1024 / 2


def _compute_s(steps: tuple[Any, ...]) -> float:
    return sum(s.duration_s for s in steps if isinstance(s, ComputeStep))


def test_the_last_chunk_runs_each_depth_by_hand() -> None:
    """With TP 2 and SP: per depth its projection, layer and head, and the projection's six TP
    collectives (embedding reduce-scatter, input and output gathers; the backward's gathers and
    the input gradient's reduce-scatter)."""
    plan = plan_of({**SMALL, "mtp_num_layers": 2}, tp=2, pp=2, sequence_parallel=True)
    plain = plan_of(SMALL, tp=2, pp=2, sequence_parallel=True)
    compute = ComputeModel(GPUS["h100-sxm"])
    costs = step_costs(plan, compute)
    step = describe_step(plan, gpus_per_node=8)
    last, first = step.stages[1].chunks[0], step.stages[0].chunks[0]
    with_mtp = _chunk_work(step, costs, last)
    plain_step, plain_costs = describe_step(plain, gpus_per_node=8), step_costs(plain, compute)
    without = _chunk_work(plain_step, plain_costs, plain_step.stages[1].chunks[0])
    assert costs.mtp is not None
    layer, head, mtp = costs.layer, costs.head, costs.mtp
    forward = _compute_s(with_mtp.forward) - _compute_s(without.forward)
    assert forward == pytest.approx(2 * (layer.forward_s + head.forward_s + mtp.forward_s))
    backward = _compute_s(with_mtp.backward) - _compute_s(without.backward)
    whole = layer.backward_s + layer.recompute_s + head.backward_s + mtp.backward_s
    assert backward == pytest.approx(2 * whole)
    mtp_comms = [s for s in with_mtp.forward if isinstance(s, CommStep) and "mtp" in s.name]
    assert [s.op for s in mtp_comms] == ["reduce_scatter", "all_gather", "all_gather"] * 2
    size = 2 * 128 * 64  # bf16, the whole sequence
    assert [s.size_bytes for s in mtp_comms[:3]] == [size, 2 * size, size]
    backward_comms = [
        s
        for s in with_mtp.backward
        if isinstance(s, CommStep) and ("eh_proj" in s.name or "sp split" in s.name)
    ]
    assert [s.op for s in backward_comms] == ["all_gather", "all_gather", "reduce_scatter"] * 2
    # the first chunk is untouched
    plain_first = _chunk_work(plain_step, plain_costs, plain_step.stages[0].chunks[0])
    assert _chunk_work(step, costs, first).forward == plain_first.forward


def test_a_depth_slows_the_last_stage() -> None:
    plain = simulate_plan(load_plan(_plan_dict(SMALL)))
    mtp = simulate_plan(load_plan(_plan_dict({**SMALL, "mtp_num_layers": 1})))
    assert mtp.step_time_s > plain.step_time_s
    assert mtp.memory_gib["total"] > plain.memory_gib["total"]


def _plan_dict(model: dict[str, Any]) -> dict[str, Any]:
    return {
        "model": model,
        "cluster": {"node": "dgx-h100"},
        "parallel": {"tp": 2, "pp": 2, "sequence_parallel": True},
        "training": {"micro_batch_size": 1, "global_batch_size": 16, "stack": "megatron"},
    }


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"training": {"stack": "eager"}}, "stack eager"),
        ({"data_parallel": "fsdp", "training": {"stack": "megatron"}}, "data_parallel fsdp"),
        ({"tp": 2, "sequence_parallel": True, "tp_comm_overlap": True}, "tp_comm_overlap"),
    ],
)
def test_refusals(over: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        plan_of({**SMALL, "mtp_num_layers": 1}, **over)


def test_negative_depths_refused() -> None:
    with pytest.raises(ValueError, match="mtp_num_layers must be >= 0"):
        ModelConfig(**SMALL, mtp_num_layers=-1)


def test_a_plan_with_depths_runs_megatron() -> None:
    plan = load_plan(
        {
            "model": {**SMALL, "mtp_num_layers": 1},
            "cluster": {"node": "dgx-h100"},
            "parallel": {"tp": 2},
            "training": {"micro_batch_size": 1, "global_batch_size": 32},
        }
    )
    assert kernel_stack(plan) == "megatron"


def test_megatron_importer_reads_the_depths(tmp_path: Path) -> None:
    args = tmp_path / "args.txt"
    args.write_text(
        "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
        "--max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 8 "
        "--mtp-num-layers 1\n"
    )
    assert from_megatron_args(args).sections["model"]["mtp_num_layers"] == 1
