"""Folding symmetric ranks: representatives, and the same answer as the unfolded replay."""

from __future__ import annotations

from typing import Any

import pytest

from schedules.layout import Layout
from schedules.plan import load_plan
from sim.replay.folding import folded_away, representative_of, representative_ranks, simulated_ranks
from sim.replay.simulate import simulate_plan


def test_one_representative_per_stage_and_cp_rank() -> None:
    layout = Layout(tp=8, cp=1, dp=128, pp=16)
    ranks = representative_ranks(layout)
    assert len(ranks) == 16
    assert ranks[:2] == (0, 8 * 128)
    assert folded_away(layout) == 16_384 - 16
    cp_layout = Layout(tp=2, cp=2, dp=2, pp=2)
    assert representative_ranks(cp_layout) == (0, 2, 8, 10)
    assert representative_of(cp_layout, 15) == 10  # tp 1, cp 1, dp 1, pp 1 -> pp 1, cp 1
    assert simulated_ranks(cp_layout, fold=False) == tuple(range(16))


PLANS: list[dict[str, Any]] = [
    {"tp": 2, "pp": 2, "data_parallel": "ddp"},
    {
        "tp": 2,
        "pp": 2,
        "schedule": "interleaved",
        "vpp": 2,
        "data_parallel": "distributed_optimizer",
    },
    {"tp": 2, "pp": 2, "schedule": "zb-h1", "sequence_parallel": True},
    {"tp": 2, "cp": 2, "pp": 2, "sequence_parallel": True},
    {"tp": 2, "data_parallel": "fsdp"},
    {"data_parallel": "hsdp", "hsdp_shard_size": 4},
    {"tp": 2, "data_parallel": "zero2"},
    {"tp": 2, "pp": 2, "sequence_parallel": True, "data_parallel": "fsdp"},
    {"pp": 2, "schedule": "interleaved", "vpp": 2, "data_parallel": "hsdp", "hsdp_shard_size": 2},
    {"tp": 2, "pp": 2, "schedule": "zb-h1", "data_parallel": "hsdp", "hsdp_shard_size": 2},
    {"tp": 2, "data_parallel": "zero3"},
    {"tp": 2, "pp": 2, "pipeline_layers": [1, 3]},
    {"tp": 2, "pp": 2, "first_stage_layers": 3, "data_parallel": "fsdp"},
    {"pp": 2, "schedule": "interleaved", "vpp": 2, "pipeline_layers": [1, 2, 0, 1]},
    {"tp": 2, "data_parallel": "fsdp", "fsdp_version": 2, "offload_param": "cpu"},
    {"data_parallel": "hsdp", "hsdp_shard_size": 4, "fsdp_version": 2, "offload_param": "cpu"},
]


@pytest.mark.parametrize("parallel", PLANS, ids=lambda p: "-".join(f"{k}{v}" for k, v in p.items()))
def test_folded_equals_unfolded(parallel: dict[str, Any]) -> None:
    plan = load_plan(
        {
            "model": {
                "name": "m", "num_layers": 4, "hidden_size": 512, "num_heads": 8,
                "num_kv_heads": 4, "ffn_hidden_size": 1408, "vocab_size": 8192, "seq_len": 1024,
            },
            "cluster": {"node": "dgx-h100", "num_nodes": 2},
            "parallel": parallel,
            "training": {"micro_batch_size": 1, "global_batch_size": 16},
        }
    )  # fmt: skip
    folded = simulate_plan(plan, fold=True)
    unfolded = simulate_plan(plan, fold=False)
    assert unfolded.num_simulated_ranks == 16
    assert folded.num_simulated_ranks < 16
    assert folded.step_time_s == pytest.approx(unfolded.step_time_s, rel=1e-9)
    assert folded.breakdown == unfolded.breakdown
