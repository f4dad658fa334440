"""What happens between the last backward and the optimizer: DP sync timing, the tied-embedding
all-reduce of the first and last stage, and the step-end gradient-norm all-reduce."""

from __future__ import annotations

import pytest

from schedules.data_parallel.registry import DATA_PARALLEL
from schedules.plan import load_plan
from sim.replay.simulate import simulate_plan
from tests.sim.replay.test_plan_sim import MODEL, plan_of


def test_megatron_ddp_without_overlap_reduces_after_the_whole_backward() -> None:
    spans = simulate_plan(
        plan_of({"data_parallel": "ddp", "overlap_grad_reduce": False}), fold=False
    ).spans
    dp = [s for s in spans if s.rank == 0 and s.stream == "dp"]
    backward = [
        s for s in spans if s.rank == 0 and s.stream == "compute" and s.name.startswith("B")
    ]
    assert len(dp) == 1  # one all-reduce of every gradient, not 25 MiB buckets
    assert dp[0].start_s >= max(s.end_s for s in backward)
    overlapped = simulate_plan(plan_of({"data_parallel": "ddp"}), fold=False).spans
    first_bucket = min(s.start_s for s in overlapped if s.rank == 0 and s.stream == "dp")
    last_backward = max(
        s.end_s
        for s in overlapped
        if s.rank == 0 and s.stream == "compute" and s.name.startswith("B")
    )
    assert first_bucket < last_backward  # torch DDP's buckets fire during the backward


def test_tied_embeddings_are_all_reduced_between_first_and_last_stage() -> None:
    tied = load_plan(
        {
            "model": {**MODEL, "tied_embeddings": True},
            "cluster": {"node": "dgx-h100", "num_nodes": 1},
            "parallel": {"pp": 4, "data_parallel": "ddp"},
            "training": {"micro_batch_size": 1, "global_batch_size": 16},
        }
    )
    spans = simulate_plan(tied, fold=False).spans
    ranks = {s.rank for s in spans if "tied embedding" in s.name}
    assert ranks == {0, 1, 6, 7}  # pp stages 0 and 3 (both dp ranks) of tp 1, dp 2, pp 4
    span = next(s for s in spans if "tied embedding" in s.name)
    expected = (
        MODEL["vocab_size"] * MODEL["hidden_size"] * DATA_PARALLEL["ddp"].grad_bytes_per_param
    )
    assert span.size_bytes == pytest.approx(expected)


def test_every_stage_waits_for_the_gradient_norm_before_its_optimizer() -> None:
    spans = simulate_plan(plan_of({"pp": 4, "data_parallel": "ddp"}), fold=False).spans
    norms = [s for s in spans if s.name.startswith("AR grad norm")]
    assert {s.rank for s in norms} == set(range(8))
    assert {s.stream for s in norms} == {"mp"}
    last_backward = max(s.end_s for s in spans if s.stream == "compute" and s.name[0] == "B")
    optimizers = [s for s in spans if s.kind == "optimizer" and s.name == "optimizer"]
    assert min(s.start_s for s in optimizers) >= last_backward


def test_no_norm_all_reduce_for_replicated_gradients_without_pp() -> None:
    spans = simulate_plan(plan_of({"data_parallel": "ddp"}), fold=False).spans
    assert not [s for s in spans if "grad norm" in s.name]
    sharded = simulate_plan(plan_of({"data_parallel": "zero1"}), fold=False).spans
    assert {s.stream for s in sharded if "grad norm" in s.name} == {"world"}
