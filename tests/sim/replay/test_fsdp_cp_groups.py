"""FSDP's shard group under context parallelism: every rank of DP x CP (torchtitan's
``dp_shard_cp`` mesh), hand-listed on a small layout."""

from __future__ import annotations

from schedules.plan import load_plan
from schedules.resolve import resolve_plan
from schedules.step import describe_step
from sim.replay.fsdp_ranks import fsdp_groups

MODEL = {
    "name": "tiny", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 4,
    "ffn_hidden_size": 128, "vocab_size": 128, "seq_len": 64,
}  # fmt: skip


def groups(num_gpus: int, **parallel: object) -> dict[str, tuple[int, ...]]:
    mapping = {
        "model": MODEL,
        "cluster": {"node": "dgx-h100", "num_nodes": max(1, num_gpus // 8)},
        "parallel": parallel,
        "training": {"micro_batch_size": 1, "global_batch_size": 8},
    }
    plan = resolve_plan(load_plan(mapping), num_gpus)
    return fsdp_groups(describe_step(plan, gpus_per_node=8), 0)


def test_fsdp_gathers_and_reduces_over_dp_times_cp() -> None:
    # 8 GPUs, CP 2: rank = cp + 2 dp; rank 0's shard group is every rank, its CP group {0, 1}
    got = groups(8, cp=2, data_parallel="fsdp2")
    assert got["dp"] == (0, 1, 2, 3, 4, 5, 6, 7)
    assert got["cp"] == (0, 1)


def test_fsdp_at_full_cp_still_reduces_its_gradients() -> None:
    # CP 8 on 8 GPUs leaves dp = 1: the gradients still meet across the 8 CP ranks
    assert groups(8, cp=8, data_parallel="fsdp2")["dp"] == tuple(range(8))


def test_hsdp_under_cp_shards_over_its_dp_block_and_every_cp_rank() -> None:
    got = groups(16, cp=2, data_parallel="hsdp", hsdp_shard_size=2)  # dp 8 in blocks of 2
    assert got["dp"] == (0, 1, 2, 3)  # dp {0, 1} x cp {0, 1}
    assert got["hsdp"] == (0, 4, 8, 12)  # same cp, one dp per block


def test_torchtitan_pipeline_runs_before_reduce_grad_reduce_before_the_send() -> None:
    """The published 405B pipeline rows ran torch 1963fc8 (2024-12-23), before
    pytorch/pytorch#166449: their cases map to ``fsdp_pp_reduce: before_send``; a run dated
    after it, or undated, keeps the plan default."""
    from sim.validation.cases import CASES_PATH, load_cases, map_case, parse_fsdp_pp_reduce

    assert parse_fsdp_pp_reduce({"source": {"versions": "torch 1963fc8 (2024-12-23)"}}) == (
        "before_send"
    )
    assert parse_fsdp_pp_reduce({"source": {"versions": "torch 2.10.0 (2026-01-21)"}}) is None
    assert parse_fsdp_pp_reduce({"source": {"versions": "torchtitan 9dec370 (2024-12-26)"}}) is None
    cases = {c["id"]: c for c in load_cases(CASES_PATH)}
    plan = map_case(cases["torchtitan_t5_405B_512gpu_3d_1f1b_compile_float8"]).plan
    assert plan is not None and plan["parallel"]["fsdp_pp_reduce"] == "before_send"
    flat = map_case(cases["torchtitan_t1_8B_8gpu_fsdp"]).plan  # no pipeline: no key
    assert flat is not None and "fsdp_pp_reduce" not in flat["parallel"]
