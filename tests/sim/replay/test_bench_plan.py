"""Speed of simulate_plan on the two scale targets (pytest-benchmark; skipped by default).

Run with ``python -m pytest tests/sim/replay/test_bench_plan.py --benchmark-enable``.
"""

from __future__ import annotations

from typing import Any

import pytest

from schedules.plan import load_plan
from sim.replay.simulate import simulate_plan

GPT3_175B: dict[str, Any] = {
    "model": {
        "name": "GPT-3 175B", "num_layers": 96, "hidden_size": 12288, "num_heads": 96,
        "ffn_hidden_size": 49152, "vocab_size": 51200, "seq_len": 2048, "gated_mlp": False,
        "position_embedding": "learned", "norm": "layernorm", "linear_bias": True,
    },
    "cluster": {"node": "dgx-a100", "num_nodes": 128, "fabric": "ib-hdr"},
    "parallel": {"tp": 8, "pp": 8, "schedule": "1f1b", "data_parallel": "distributed_optimizer"},
    "training": {"micro_batch_size": 1, "global_batch_size": 1536},
}  # fmt: skip
"""1,024 A100s, TP8 PP8 DP16, 96 micro-batches per step."""

LLAMA3_405B: dict[str, Any] = {
    "model": {
        # 128 layers: the plan format splits layers evenly (Llama 3 trims the first/last stage
        # to reach 126).
        "name": "Llama-3 405B (128 layers)", "num_layers": 128, "hidden_size": 16384,
        "num_heads": 128, "num_kv_heads": 8, "ffn_hidden_size": 53248, "vocab_size": 128256,
        "seq_len": 8192,
    },
    "cluster": {"node": "dgx-h100", "num_nodes": 2048, "fabric": "ib-ndr"},
    "parallel": {
        "tp": 8, "pp": 16, "schedule": "1f1b", "data_parallel": "distributed_optimizer",
        "sequence_parallel": True,
    },
    "training": {"micro_batch_size": 1, "global_batch_size": 2048},
}  # fmt: skip
"""16,384 H100s, TP8 PP16 DP128, 16 micro-batches per step."""


@pytest.mark.parametrize("raw", [GPT3_175B, LLAMA3_405B], ids=["gpt3-175b-1k", "llama3-405b-16k"])
def test_bench_simulate_plan(benchmark: Any, raw: dict[str, Any]) -> None:
    plan = load_plan(raw)
    result = benchmark.pedantic(simulate_plan, args=(plan,), rounds=1, iterations=1)
    assert result.num_simulated_ranks == raw["parallel"]["pp"]
    assert result.step_time_s > 0


@pytest.mark.parametrize(
    "flag",
    ["slow_gpu=77:0.2", "nic=77:down", "second_job=0-63:0.3"],
    ids=["straggler", "nic-down", "second-job-half"],
)
def test_bench_whatif_on_1024_gpus(benchmark: Any, flag: str) -> None:
    """A what-if on the 1,024-GPU plan: the classes it folds to, not every rank."""
    from schedules.whatif import parse_flags

    plan = load_plan({**GPT3_175B, "whatif": parse_flags([flag]).to_dict()})
    result = benchmark.pedantic(simulate_plan, args=(plan,), rounds=1, iterations=1)
    assert result.num_simulated_ranks < 64
    assert result.step_time_s > 0
