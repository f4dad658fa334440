"""A compute calibration fitted to a measured step reproduces that step."""

from __future__ import annotations

import pytest

from schedules.plan import load_plan
from schedules.resolve import resolve_plan
from sim.compute.compute_model import ComputeModel, default_efficiency
from sim.compute.step_fit import calibration_from_step, modelled_classes_s
from sim.replay.simulate import simulate_plan
from topologies.hardware import GPUS
from vocab.compute_calibration import STEP_SCHEMA, ComputeCalibration

H100 = GPUS["h100-sxm"]
PLAN = {
    "model": {
        "name": "m", "num_layers": 2, "hidden_size": 2048, "num_heads": 16, "num_kv_heads": 4,
        "ffn_hidden_size": 5632, "vocab_size": 32000, "seq_len": 2048,
    },
    "cluster": {"node": {"base": "dgx-h100", "num_gpus": 1}, "num_nodes": 1},
    "parallel": {"recompute": "none"},
    "training": {"micro_batch_size": 1, "global_batch_size": 2},
}  # fmt: skip


def _measurement(gemm: float, attention: float, memory: float, idle: float) -> dict:
    """A synthetic step: each class ``factor`` times slower than the default kernel curves."""
    plan = resolve_plan(load_plan(PLAN), 1)
    isolated = ComputeModel(H100, ComputeCalibration(in_step_slowdown=0.0))
    modelled = modelled_classes_s(plan, isolated, 2)
    classes = {
        "gemm": modelled["gemm"] * gemm,
        "attention": modelled["attention"] * attention,
        "elementwise": modelled["memory"] * memory * 0.75,
        "copy": modelled["memory"] * memory * 0.25,
    }
    step = sum(classes.values()) + idle
    return {
        "schema": STEP_SCHEMA, "gpu": "h100-sxm", "device": "NVIDIA H100 80GB HBM3",
        "plan": PLAN, "microbatches": 2, "measured_layers": 2, "dtype": "bf16",
        "timings_s": {"step": step}, "profile": {"classes_s": classes},
    }  # fmt: skip


def test_each_class_is_rescaled_and_the_idle_time_becomes_a_time_scale() -> None:
    measurement = _measurement(gemm=1.25, attention=2.0, memory=1.6, idle=0.004)
    calibration = calibration_from_step(measurement, H100)
    eff = calibration.efficiency
    assert eff["gemm"] == pytest.approx(default_efficiency(H100, "gemm", "bf16") / 1.25, rel=1e-3)
    assert eff["attention_forward"] == pytest.approx(
        default_efficiency(H100, "attention_forward", "bf16") / 2.0, rel=1e-3
    )
    assert eff["memory"] == pytest.approx(
        default_efficiency(H100, "memory", "bf16") / 1.6, rel=1e-3
    )
    assert calibration.in_step_slowdown == 0.0  # a step already runs in-step
    busy = sum(measurement["profile"]["classes_s"].values())
    assert calibration.time_scale == pytest.approx((busy + 0.004) / busy, rel=1e-3)
    result = simulate_plan(load_plan(PLAN), compute_calibration=calibration)
    assert result.step_time_s == pytest.approx(measurement["timings_s"]["step"], rel=1e-3)


def test_efficiency_never_exceeds_the_peak_and_other_gpus_are_refused() -> None:
    fast = calibration_from_step(_measurement(gemm=0.5, attention=1, memory=1, idle=0), H100)
    assert fast.efficiency["gemm"] == 1.0  # twice the default would be above the dense peak
    with pytest.raises(ValueError, match=r"measured on 'h100-sxm'.*not on this plan's 'a100"):
        calibration_from_step(_measurement(1, 1, 1, 0), GPUS["a100-sxm-80gb"])
    with pytest.raises(ValueError, match="schema 'x' is not 'commbench-step/1'"):
        calibration_from_step({"schema": "x"}, H100)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"timings_s": {"step": -1.0}}, "malformed step measurement"),
        ({"microbatches": 0}, "malformed step measurement"),
        ({"profile": {"classes_s": [1]}}, "malformed step measurement"),
        ({"timings_s": {"step": 1e6}}, "outside"),
        ({"dtype": "fp32"}, "measured in fp32"),
    ],
)
def test_malformed_or_foreign_measurements_are_refused(change: dict, message: str) -> None:
    measurement = {**_measurement(1, 1, 1, 0), **change}
    with pytest.raises(ValueError, match=message):
        calibration_from_step(measurement, H100)
