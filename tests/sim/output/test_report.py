"""The text report of ``commsim plan`` shows the figures of a hand-made PlanResult."""

from __future__ import annotations

from dataclasses import replace

import pytest

from schedules.plan import Plan, load_plan
from sim.output.report import (
    GIB_BYTES,
    breakdown_lines,
    cluster_line,
    format_duration,
    format_report,
    memory_lines,
    rank_title,
)
from sim.replay.result import Breakdown, PlanResult
from topologies.hardware import GPUSpec


def _gpu() -> GPUSpec:
    """An H100-like spec with round figures, so the expected text is easy to check by hand."""
    return GPUSpec(
        name="H100 SXM",
        hbm_bytes=80e9,
        hbm_bandwidth_bytes_per_s=3.35e12,
        peak_flops_per_s={"bf16": 989e12},
        source="test figures",
    )


PLAN_MAPPING = {
    "model": {
        "name": "toy-7b",
        "num_layers": 32,
        "hidden_size": 4096,
        "num_heads": 32,
        "ffn_hidden_size": 11008,
        "vocab_size": 32000,
        "seq_len": 4096,
    },
    "cluster": {"node": "dgx-h100", "num_nodes": 2, "fabric": "ib-ndr"},
    "parallel": {"tp": 2, "pp": 2, "dp": 4, "schedule": "1f1b", "data_parallel": "fsdp"},
    "training": {"micro_batch_size": 1, "global_batch_size": 32, "precision": "bf16"},
}


def _plan() -> Plan:
    return load_plan(PLAN_MAPPING)


def _result(**overrides: object) -> PlanResult:
    values: dict[str, object] = {
        "step_time_s": 2.0,
        "tokens_per_s": 32 * 4096 / 2.0,
        "tflops_per_gpu": 395.6,
        "mfu": 0.4,
        "flops_definition": "6N + attention, causal",
        "memory_gib": {"parameters": 3.5, "gradients": 1.75, "optimizer": 7.0, "total": 12.25},
        "fits_in_memory": True,
        "breakdown": Breakdown(
            compute_s=1.5, exposed_comm_s={"tp": 0.2, "dp": 0.1}, bubble_s=0.15, optimizer_s=0.05
        ),
        "num_gpus": 16,
        "num_simulated_ranks": 2,
        "extra": {"num_microbatches": 8, "critical_rank": 9},
    }
    values.update(overrides)
    return PlanResult(**values)  # type: ignore[arg-type]


def test_report_headline_figures() -> None:
    text = format_report(_result(), _plan(), gpu=_gpu(), fidelity="analytical")
    assert "Step time                   2.000 s" in text
    # 32 sequences x 4096 tokens / 2 s = 65,536 tokens/s; over 16 GPUs = 4,096 per GPU.
    assert "65,536 tokens/s (4,096 per GPU)" in text
    assert "395.6 TFLOP/s, MFU 40.0% of 989 TFLOP/s dense bf16" in text
    assert "FLOP definition             6N + attention, causal" in text
    assert "Memory per GPU              fits (62.26 GiB free)" in text  # 80e9 B = 74.51 GiB


def test_report_headline_says_when_the_plan_does_not_fit() -> None:
    result = replace(_result(memory_gib={"total": 90.5}), fits_in_memory=False)
    text = format_report(result, _plan(), gpu=_gpu(), fidelity="analytical")
    assert "Memory per GPU              DOES NOT FIT: needs 90.50 GiB of 74.51 GiB HBM" in text


def test_report_echoes_the_plan() -> None:
    text = format_report(_result(), _plan(), gpu=_gpu(), fidelity="flow")
    assert "Plan: toy-7b (32 layers, hidden 4096, seq 4096) on 16 x H100 SXM" in text
    assert "2 x dgx-h100, ib-ndr" in text
    assert "tp=2 pp=2 cp=1 dp=4 vpp=1, data_parallel fsdp" in text
    assert "1f1b, sequence_parallel off, recompute none" in text
    assert "8 micro-batches of 1 per step, global batch 32 (131,072 tokens), bf16" in text
    assert "2 of 16 ranks (folded), flow network" in text


def test_report_says_what_megatrons_optimizer_keeps() -> None:
    """bf16 gradients and the precision-aware optimizer's state (2-byte remainder master of a
    bf16 weight + bf16 moments = 6 bytes) on the parallel line; FP8 weights on the batch line."""
    sections = {
        **PLAN_MAPPING,
        "parallel": {
            **PLAN_MAPPING["parallel"], "data_parallel": "distributed_optimizer",
            "grad_reduce_in_fp32": False, "use_precision_aware_optimizer": True,
            "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16",
        },
    }  # fmt: skip
    text = format_report(_result(), load_plan(sections), gpu=_gpu(), fidelity="analytical")
    assert (
        "data_parallel distributed_optimizer (bf16 gradients; Adam state 6 B per parameter: "
        "moments bf16/bf16, master 2 B)"
    ) in text
    fp8 = {
        **sections,
        "training": {
            **PLAN_MAPPING["training"], "precision": "fp8", "te_fp8_recipe": "current",
            "fp8_param_gather": True,
        },
    }  # fmt: skip
    text = format_report(_result(), load_plan(fp8), gpu=_gpu(), fidelity="analytical")
    assert "Adam state 8 B per parameter: moments bf16/bf16, master 4 B" in text
    assert "(131,072 tokens), fp8, FP8 weights" in text


def test_cluster_line_forms() -> None:
    assert cluster_line(_plan().cluster) == "2 x dgx-h100, ib-ndr"
    sections = {
        **PLAN_MAPPING,
        "cluster": {"node": "dgx-a100", "num_nodes": 4, "fabric": "ib-hdr", "oversubscription": 2},
    }
    assert cluster_line(load_plan(sections).cluster) == "4 x dgx-a100, ib-hdr (2:1 oversubscribed)"
    from_file = load_plan({**PLAN_MAPPING, "cluster": {"file": "my_cluster.yaml"}}).cluster
    assert cluster_line(from_file) == "from my_cluster.yaml"


def test_memory_section_lists_components_and_fit() -> None:
    lines = memory_lines(_result(), hbm_bytes=80 * GIB_BYTES)
    assert lines[1].split() == ["parameters", "3.50"]
    assert lines[3].split() == ["optimizer", "7.00"]
    assert lines[4].split() == ["total", "(live)", "12.25"]
    assert "12.25 of 80.00 GiB HBM" in lines[5]  # a result without a reserve: the live peak
    assert "fits (67.75 GiB free)" in lines[6]
    reserved = _result(memory_gib={"parameters": 10.0, "total": 10.0, "reserved": 10.6})
    text = "\n".join(memory_lines(reserved, hbm_bytes=80 * GIB_BYTES))
    assert "10.60 of 80.00 GiB HBM (caching allocator +6%, measured)" in text
    assert "fits (69.40 GiB free)" in text


def test_plan_that_does_not_fit_is_reported_clearly() -> None:
    result = _result(memory_gib={"parameters": 70.0, "activations": 20.5, "total": 90.5})
    result = replace(result, fits_in_memory=False)
    text = "\n".join(memory_lines(result, hbm_bytes=80 * GIB_BYTES))
    assert "DOES NOT FIT: needs 90.50 GiB of 80.00 GiB HBM, 10.50 GiB over" in text


def _breakdown_rows(result: PlanResult) -> dict[str, list[str]]:
    """Row label -> [ms, percent] of the breakdown table."""
    return {" ".join(ln.split()[:-2]): ln.split()[-2:] for ln in breakdown_lines(result)[2:]}


def test_breakdown_rows_in_ms_and_percent_of_step() -> None:
    rows = _breakdown_rows(_result())
    assert rows["compute"] == ["1500.000", "75.0%"]
    assert rows["exposed comm dp"] == ["100.000", "5.0%"]
    assert rows["exposed comm tp"] == ["200.000", "10.0%"]
    assert rows["pipeline bubble"] == ["150.000", "7.5%"]
    assert rows["optimizer"] == ["50.000", "2.5%"]
    assert rows["step"] == ["2000.000", "100.0%"]
    assert "other / unaccounted" not in rows


def test_breakdown_names_the_critical_rank_and_its_stage() -> None:
    text = format_report(_result(), _plan(), gpu=_gpu(), fidelity="analytical")
    # tp=2, cp=1, dp=4: rank 9 = tp 1 + 2 * (dp 0 + 4 * pp 1).
    assert "Step breakdown on rank 9 (pp stage 1), the critical rank (last to finish)" in text


def test_rank_title_shows_cp_rank_when_context_parallel() -> None:
    plan = load_plan({**PLAN_MAPPING, "parallel": {"tp": 2, "cp": 2, "pp": 2, "dp": 2}})
    # Rank order tp-cp-dp-pp: 13 = tp 1 + 2 * (cp 0 + 2 * (dp 1 + 2 * pp 1)).
    assert rank_title(13, plan) == "rank 13 (pp stage 1, cp rank 0)"
    assert rank_title(3, plan) == "rank 3 (pp stage 0, cp rank 1)"
    assert rank_title(3, _plan()) == "rank 3 (pp stage 0)"


def test_durations_switch_to_ms_below_one_second() -> None:
    assert format_duration(12.3456) == "12.346 s"
    assert format_duration(0.0236908) == "23.691 ms"


def test_breakdown_shows_the_unaccounted_remainder() -> None:
    result = _result(step_time_s=2.5)
    rows = _breakdown_rows(result)
    assert rows["other / unaccounted"] == ["500.000", "20.0%"]


@pytest.mark.parametrize("fits", [True, False])
def test_report_is_deterministic(fits: bool) -> None:
    result = replace(_result(), fits_in_memory=fits)
    first = format_report(result, _plan(), gpu=_gpu(), fidelity="analytical")
    assert first == format_report(result, _plan(), gpu=_gpu(), fidelity="analytical")


def test_a_plan_without_pipeline_has_no_schedule_and_no_bubble() -> None:
    plan = load_plan({**PLAN_MAPPING, "parallel": {"tp": 2, "pp": 1, "dp": 8}})
    text = format_report(_result(), plan, gpu=_gpu(), fidelity="analytical")
    assert (
        "  schedule                  no pipeline (pp=1), sequence_parallel off, recompute none\n"
        in (text)
    )
    assert "1f1b" not in text and "bubble" not in text
    rows = {" ".join(ln.split()[:-2]): ln.split()[-2:] for ln in text.splitlines()[-7:]}
    assert rows["idle / waiting"] == ["150.000", "7.5%"]
    # With a pipeline the same time is the bubble, and the schedule is echoed.
    text = format_report(_result(), _plan(), gpu=_gpu(), fidelity="analytical")
    assert "  schedule                  1f1b, sequence_parallel off" in text
    assert "idle / waiting" not in text


def test_breakdown_idle_row_is_named_by_whether_there_is_a_pipeline() -> None:
    labels = [" ".join(ln.split()[:-2]) for ln in breakdown_lines(_result(), pipeline=False)[2:]]
    assert labels == [
        "compute",
        "exposed comm dp",
        "exposed comm tp",
        "idle / waiting",
        "optimizer",
        "step",
    ]


def test_time_waiting_on_the_host_thread_gets_its_own_row() -> None:
    breakdown = Breakdown(
        compute_s=1.0, exposed_comm_s={"dp": 0.2}, bubble_s=0.0, optimizer_s=0.05, host_s=0.75
    )
    rows = _breakdown_rows(_result(breakdown=breakdown))
    assert rows["host (launches, framework loops)"] == ["750.000", "37.5%"]
    # no row without host time
    assert "host (launches, framework loops)" not in _breakdown_rows(_result())
