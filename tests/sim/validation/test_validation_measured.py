"""Measured step times: the sources' own FLOP formulas, checked by hand and against the data."""

from __future__ import annotations

from typing import Any

import pytest

import refdata
from sim.validation.cases import load_cases
from sim.validation.measured import (
    as_integer,
    as_number,
    korthikanti_model_flops_per_step,
    measured_step_time,
    megatron_core_flops_per_step,
)

CASES_PATH = refdata.CASES_PATH
needs_cases = pytest.mark.skipif(not CASES_PATH.exists(), reason="refdata is not installed")


def _cases() -> dict[str, dict[str, Any]]:
    return {case["id"]: case for case in load_cases(CASES_PATH)}


# --- the sources' formulas on tiny hand-computed shapes ---


def test_narayanan_eq3_hand_computed() -> None:
    # 96 * B s l h^2 * (1 + s/(6h) + V/(16 l h)) with B=l=h=1, s=6, V=16: 96*6*(1+1+1)
    case = {
        "id": "x",
        "model": {"seq_len": 6, "num_layers": 1, "hidden_size": 1, "vocab_size": 16},
        "parallel": {"global_batch_size": 1},
        "hardware": {"num_gpus": 2},
        "measured": {"tflops_per_gpu": 1e-9},
        "flops_definition": "Narayanan eq.(3): F = 96*B*s*l*h^2*(...)",
    }
    measurement = measured_step_time(case)
    # 1728 FLOPs / (1e-9 TFLOP/s * 1e12 * 2 GPUs) = 0.864 s
    assert measurement is not None and measurement.step_time_s == pytest.approx(0.864)
    assert "Narayanan eq.(3)" in measurement.how


def test_korthikanti_eq7_hand_computed() -> None:
    # 72 * B L s h^2 * (1 + s/(6h) + v/(12 h L)) with B=L=h=1, s=6, v=12: 72*6*3
    flops = korthikanti_model_flops_per_step(
        global_batch_size=1, seq_len=6, num_layers=1, hidden_size=1, vocab_size=12
    )
    assert flops == 1296.0


def test_megatron_core_formula_hand_computed() -> None:
    shape = dict(global_batch_size=1, seq_len=1, num_layers=1, hidden_size=1, vocab_size=2)
    dense = megatron_core_flops_per_step(
        **shape, num_heads=1, num_kv_heads=1, ffn_hidden_size=1, gated_mlp=False
    )
    gated = megatron_core_flops_per_step(
        **shape, num_heads=1, num_kv_heads=1, ffn_hidden_size=1, gated_mlp=True
    )
    assert dense == 12.0 * (3.0 + 1.0 + 1.0)
    assert gated == 12.0 * (3.0 + 1.5 + 1.0)


def test_numbers_are_read_only_from_numeric_fields() -> None:
    assert as_number(3) == 3.0 and as_number(2.5) == 2.5
    assert as_number("not stated") is None and as_number(True) is None and as_number(None) is None
    assert as_number(0) is None and as_number(-1.0) is None
    assert as_number(float("nan")) is None and as_number(float("inf")) is None
    assert as_integer(512) == 512 and as_integer(512.0) == 512 and as_integer(2.5) is None
    assert as_integer(0) is None and as_integer(float("inf")) is None


def test_reported_iteration_time_wins_over_conversions() -> None:
    case = {
        "id": "x",
        "hardware": {"num_gpus": 8},
        "measured": {"iteration_time_s": 2.0, "tokens_per_s_per_gpu": 1.0},
    }
    measurement = measured_step_time(case)
    assert measurement is not None and measurement.step_time_s == 2.0


def test_tokens_per_second_gives_global_batch_tokens_over_throughput() -> None:
    case = {
        "id": "x",
        "model": {"seq_len": 4, "num_layers": 1, "hidden_size": 1, "vocab_size": 1},
        "parallel": {"global_batch_size": 8},
        "hardware": {"num_gpus": 2},
        "measured": {"tokens_per_s_per_gpu": 4.0},
    }
    measurement = measured_step_time(case)
    assert measurement is not None and measurement.step_time_s == 8 * 4 / (4.0 * 2)


def test_unknown_flop_definition_gives_no_measurement() -> None:
    case = {
        "id": "x",
        "model": {"seq_len": 4, "num_layers": 1, "hidden_size": 1, "vocab_size": 1},
        "parallel": {"global_batch_size": 8},
        "hardware": {"num_gpus": 2},
        "measured": {"tflops_per_gpu_lower_bound": 173},
        "flops_definition": "not specified (likely includes recompute)",
    }
    assert measured_step_time(case) is None


@needs_cases
def test_measured_step_time_matches_the_derived_iteration_times() -> None:
    checked = 0
    for case in load_cases(CASES_PATH):
        derived = (case.get("derived") or {}).get("iteration_time_s")
        measurement = measured_step_time(case)
        if derived is None or measurement is None:
            continue
        assert measurement.step_time_s == pytest.approx(derived, rel=2e-3), case["id"]
        checked += 1
    assert checked >= 40


@needs_cases
def test_measured_step_time_from_mfu_uses_korthikanti_eq7() -> None:
    case = _cases()["korthikanti22_530B_dp8_2240gpu_full_recompute"]
    measurement = measured_step_time(case)
    assert measurement is not None and "eq.(7)" in measurement.how
    flops = (
        72 * 2240 * 105 * 2048 * 20480**2 * (1 + 2048 / (6 * 20480) + 51200 / (12 * 20480 * 105))
    )
    assert measurement.step_time_s == pytest.approx(flops / (0.421 * 312e12 * 2240))
    assert measurement.step_time_s == pytest.approx(50.36, rel=1e-3)


def test_moe_runs_count_the_routed_experts_as_megatron_core_does() -> None:
    from sim.validation.cases import DEFAULT_CASES_PATH, load_cases, map_case

    case = next(
        c for c in load_cases(DEFAULT_CASES_PATH) if c["id"] == "mcoremoe_h100_mixtral-8x7b_64gpu"
    )
    # 12 B s l h^2 [(1 + g/a + s/h) + (k f_e / h) 1.5 + V / (2 l h)], no router term
    b, s, layers, h, v = 256, 4096, 32, 4096, 32000
    bracket = (1 + 8 / 32 + s / h) + (2 * 14336 / h) * 1.5 + v / (2 * layers * h)
    flops = 12 * b * s * layers * h**2 * bracket
    mapping = map_case(case)
    assert mapping.measured is not None
    assert mapping.measured.step_time_s == pytest.approx(flops / (468e12 * 64))
    assert mapping.plan is not None
    assert mapping.plan["model"]["num_experts"] == 8
    assert mapping.plan["parallel"]["ep"] == 8 and mapping.plan["parallel"]["etp"] == 1


def test_recent_megatron_core_formula_halves_the_causal_score_term() -> None:
    from sim.validation.cases import DEFAULT_CASES_PATH, load_cases, map_case

    case = next(
        c for c in load_cases(DEFAULT_CASES_PATH) if c["id"] == "mcoremoe_h100_mixtral-8x22b_128gpu"
    )
    b, s, layers, h, v = 256, 4096, 56, 6144, 32000
    bracket = (1 + 8 / 48 + s / (2 * h)) + (2 * 16384 / h) * 1.5 + v / (2 * layers * h)
    mapping = map_case(case)
    assert mapping.measured is not None
    flops = 12 * b * s * layers * h**2 * bracket
    assert mapping.measured.step_time_s == pytest.approx(flops / (445e12 * 128))
