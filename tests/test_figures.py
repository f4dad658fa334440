"""The figures in results/ are what the code computes today.

``results/validation/uncalibrated.json`` (``commsim validate``) holds every published run's
predicted step time and peak memory on the project's defaults. The quick cases (under about a
second each on a 2-core machine; every data-parallel kind, pipeline, MoE and stack the set has)
are simulated again here and must equal the stored figures: a refactoring that moves code must
not move a number, and a change that moves one regenerates results/ with it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from sim.validation.cases import load_cases
from sim.validation.runner import map_cases, simulate_case

ROOT = Path(__file__).resolve().parents[1]
STORED = ROOT / "results" / "validation" / "uncalibrated.json"
CASES = ROOT / "refdata" / "validation" / "cases.json"
QUICK_WALL_S = 1.2
"""Cases that took at most this long in the stored run are simulated again."""


def _stored() -> list[dict[str, Any]]:
    cases = json.loads(STORED.read_text())["cases"]
    return [case for case in cases if case["wall_s"] <= QUICK_WALL_S]


def test_the_quick_set_spans_the_kinds_of_plan() -> None:
    stored = _stored()
    assert len(stored) >= 30
    assert {case["stack"] for case in stored} == {"megatron", "compile", "eager"}
    ids = " ".join(case["id"] for case in stored)
    for word in ("zero3", "fsdp", "mixtral", "asynctp", "float8", "76.1B"):
        assert word in ids, word


@pytest.mark.parametrize("stored", _stored(), ids=lambda case: case["id"])
def test_a_stored_prediction_is_reproduced(stored: dict[str, Any]) -> None:
    (mapping,) = map_cases(load_cases(CASES), [stored["id"]])
    prediction = simulate_case(mapping)
    assert math.isclose(prediction.step_time_s, stored["predicted_step_time_s"], rel_tol=1e-9)
    assert prediction.simulated_ranks == stored["simulated_ranks"]
    if stored["predicted_memory_gib"] is not None:
        assert prediction.memory_gib is not None
        assert math.isclose(prediction.memory_gib, stored["predicted_memory_gib"], rel_tol=1e-9)
    for key, seconds in stored["breakdown"].items():
        assert math.isclose(prediction.breakdown[key], seconds, rel_tol=1e-9, abs_tol=1e-12), key
