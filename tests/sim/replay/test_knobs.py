"""Every framework knob a plan accepts changes the program, the replay or the memory, or is listed
as not yet honoured: a knob that is accepted and does nothing is a defect, and this list is where
it shows."""

from __future__ import annotations

from typing import Any

import pytest

from schedules.plan import ParallelConfig, load_plan
from schedules.resolve import resolve_plan
from schedules.step import describe_step
from sim.compute.compute_model import ComputeModel
from sim.replay.simulate import simulate_plan
from sim.replay.step_replay import build_programs
from topologies.hardware import GPUS

MODEL = {
    "name": "m", "num_layers": 8, "hidden_size": 1024, "num_heads": 16, "num_kv_heads": 4,
    "ffn_hidden_size": 2816, "vocab_size": 32000, "seq_len": 2048,
}  # fmt: skip

_AWARE = {"data_parallel": "distributed_optimizer", "tp": 2, "use_precision_aware_optimizer": True}
"""A plan whose optimizer state dtypes can be set (Megatron's precision-aware optimizer)."""

KNOBS: dict[str, tuple[dict[str, Any], Any]] = {
    "ddp_bucket_mb": ({"data_parallel": "ddp", "tp": 2}, 5.0),
    "ddp_first_bucket_mb": ({"data_parallel": "ddp", "tp": 2}, 10.0),
    "ddp_gradient_as_bucket_view": ({"data_parallel": "ddp", "tp": 2}, True),
    "fsdp_backward_prefetch": ({"data_parallel": "fsdp", "tp": 2}, "none"),
    "fsdp_forward_prefetch": ({"data_parallel": "fsdp", "tp": 2}, True),
    "fsdp_limit_all_gathers": ({"data_parallel": "fsdp", "tp": 2}, False),
    "fsdp_reshard_after_forward": ({"data_parallel": "fsdp", "tp": 2}, False),
    "fsdp_version": ({"data_parallel": "fsdp", "tp": 2}, 2),
    "fsdp_reduce_dtype": ({"data_parallel": "fsdp2", "tp": 2}, "bf16"),
    "fsdp_pp_reduce": ({"data_parallel": "fsdp2", "tp": 2, "pp": 2}, "before_send"),
    "hsdp_shard_size": ({"data_parallel": "hsdp", "tp": 2}, 2),
    "zero_bucket_elems": ({"data_parallel": "zero2", "tp": 2}, 1_000_000),
    "zero_overlap_comm": ({"data_parallel": "zero2", "tp": 2}, True),
    "zero_prefetch_bucket_elems": ({"data_parallel": "zero3", "tp": 2}, 1_000_000),
    "zero_max_live_parameters": ({"data_parallel": "zero3", "tp": 2}, 10_000_000),
    "zero_param_persistence_threshold": ({"data_parallel": "zero3", "tp": 2}, 0),
    "zero_fetch": ({"data_parallel": "zero3", "tp": 2}, "sync_per_weight"),
    "overlap_grad_reduce": ({"data_parallel": "distributed_optimizer", "tp": 2}, False),
    "overlap_param_gather": ({"data_parallel": "distributed_optimizer", "tp": 2}, True),
    "grad_reduce_in_fp32": ({"data_parallel": "distributed_optimizer", "tp": 2}, False),
    "use_precision_aware_optimizer": ({"data_parallel": "distributed_optimizer", "tp": 2}, True),
    "main_params_dtype": (_AWARE, "fp16"),
    "exp_avg_dtype": (_AWARE, "bf16"),
    "exp_avg_sq_dtype": (_AWARE, "fp8"),
    "tp_comm_overlap": ({"tp": 4, "sequence_parallel": True}, True),
    "pp_scatter_gather": ({"tp": 2, "pp": 2}, False),
    "cp_rotate_method": ({"cp": 2}, "alltoall"),
    "recompute_num_layers": ({"tp": 2, "recompute": "full"}, 2),
    "recompute_modules": ({"tp": 2, "recompute": "selective"}, ["core_attn", "mlp"]),
    "pipeline_layers": ({"tp": 2, "pp": 2}, [2, 6]),
    "first_stage_layers": ({"tp": 2, "pp": 2}, 2),
    "last_stage_layers": ({"tp": 2, "pp": 2}, 2),
    "moe_token_dispatcher": (
        {"tp": 2, "sequence_parallel": True, "ep": 4, "data_parallel": "distributed_optimizer"},
        "allgather",
    ),
    "moe_permute_fusion": (
        {"tp": 2, "sequence_parallel": True, "ep": 4, "data_parallel": "distributed_optimizer"},
        True,
    ),
    "moe_router_fusion": (
        {"tp": 2, "sequence_parallel": True, "ep": 4, "data_parallel": "distributed_optimizer"},
        True,
    ),
    "overlap_moe_expert_parallel_comm": (
        {"tp": 2, "sequence_parallel": True, "ep": 4, "data_parallel": "distributed_optimizer"},
        True,
    ),
    "delay_wgrad_compute": (
        {
            "tp": 2,
            "sequence_parallel": True,
            "ep": 4,
            "data_parallel": "distributed_optimizer",
            "overlap_moe_expert_parallel_comm": True,
        },
        True,
    ),
    "offload_optimizer": ({"data_parallel": "zero2", "tp": 2}, "cpu"),
    "offload_param": ({"data_parallel": "zero3", "tp": 2}, "cpu"),
    "offload_pin_memory": ({"data_parallel": "zero2", "tp": 2, "offload_optimizer": "cpu"}, True),
    "offload_pipeline_read": (
        {"data_parallel": "zero3", "tp": 2, "offload_optimizer": "nvme"},
        True,
    ),
    "offload_pipeline_write": (
        {"data_parallel": "zero3", "tp": 2, "offload_optimizer": "nvme"},
        True,
    ),
}
"""Per framework knob: a plan where it applies, and a value away from its default."""

NOT_YET_HONOURED: set[str] = set()
"""Knobs accepted and validated but without effect yet: none (keep the list for new ones)."""

FRAMEWORK_KNOBS = {
    "ddp_bucket_mb", "ddp_first_bucket_mb", "ddp_gradient_as_bucket_view",
    "fsdp_backward_prefetch", "fsdp_forward_prefetch", "fsdp_limit_all_gathers",
    "fsdp_reshard_after_forward", "fsdp_version", "fsdp_reduce_dtype", "fsdp_pp_reduce",
    "hsdp_shard_size",
    "zero_bucket_elems", "zero_overlap_comm", "zero_prefetch_bucket_elems",
    "zero_max_live_parameters", "zero_param_persistence_threshold", "zero_fetch",
    "overlap_grad_reduce", "overlap_param_gather", "grad_reduce_in_fp32",
    "use_precision_aware_optimizer", "main_params_dtype", "exp_avg_dtype", "exp_avg_sq_dtype",
    "tp_comm_overlap", "pp_scatter_gather",
    "pipeline_layers", "first_stage_layers", "last_stage_layers", "moe_token_dispatcher",
    "offload_optimizer", "offload_param", "offload_pin_memory", "offload_pipeline_read",
    "offload_pipeline_write", "cp_rotate_method", "recompute_num_layers", "moe_permute_fusion",
    "moe_router_fusion", "recompute_modules", "overlap_moe_expert_parallel_comm",
    "delay_wgrad_compute",
}  # fmt: skip
"""``embedding_as_layer`` and ``loss_as_layer`` cannot be toggled alone on a valid plan (they move
the layer count across a divisibility boundary); tests/schedules/test_stages.py checks the split
they give."""


MOE_KNOBS = {
    "moe_token_dispatcher", "moe_permute_fusion", "moe_router_fusion",
    "overlap_moe_expert_parallel_comm", "delay_wgrad_compute",
}  # fmt: skip
"""Knobs of expert parallelism: their plans run an MoE version of the model (8 experts)."""


def _fingerprint(parallel: dict[str, Any]) -> tuple[Any, ...]:
    moe = {"num_experts": 8} if MOE_KNOBS & set(parallel) or parallel.get("ep") else {}
    plan = load_plan(
        {
            "model": {**MODEL, **moe},
            "cluster": {"node": "dgx-h100", "num_nodes": 2},
            "parallel": parallel,
            "training": {"micro_batch_size": 1, "global_batch_size": 48},
        }
    )
    result = simulate_plan(plan)
    memory = tuple(sorted((k, round(v, 9)) for k, v in result.memory_gib.items()))
    resolved = resolve_plan(plan, 16)
    program = build_programs(
        describe_step(resolved, gpus_per_node=8), ComputeModel(GPUS["h100-sxm"])
    )[0]
    # what waits for what, and how long each compute takes (a host-bound plan hides the GPU)
    actions = tuple(
        (a.name, a.deps, round(getattr(a, "duration_s", 0.0), 12)) for a in program.actions
    )
    return round(result.step_time_s, 12), memory, len(result.spans), actions


LAYOUT_KEYS = {
    "tp", "pp", "cp", "dp", "vpp", "schedule", "sequence_parallel", "recompute",
    "data_parallel", "embedding_as_layer", "loss_as_layer", "ep", "etp",
}  # fmt: skip
"""Keys that say what the layout is rather than how a framework runs it."""


def test_every_framework_knob_is_covered() -> None:
    fields = {f for f in ParallelConfig.__dataclass_fields__}
    assert fields - LAYOUT_KEYS == FRAMEWORK_KNOBS
    assert set(KNOBS) == FRAMEWORK_KNOBS


@pytest.mark.parametrize("knob", sorted(KNOBS))
def test_a_knob_changes_the_step_or_the_memory(knob: str) -> None:
    base, value = KNOBS[knob]
    changed = _fingerprint(base) != _fingerprint({**base, knob: value})
    # A knob on the not-yet list that starts to matter must leave the list.
    assert changed == (knob not in NOT_YET_HONOURED)
