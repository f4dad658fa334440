"""The pipeline-schedule registry: Megatron's in-flight counts, the plan's names, one home each."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from schedules.pipeline import max_in_flight
from schedules.pipeline_schedules import SCHEDULES, pipeline_orders, pipeline_schedule
from schedules.plan import SCHEDULES as PLAN_SCHEDULES
from schedules.plan import ParallelConfig

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = ROOT / "schedules" / "pipeline_schedules"
IMPORTERS = ROOT / "schedules" / "importers"


def in_flight(name: str, *, pp: int, vpp: int = 1, num_micro: int) -> list[int]:
    spec = pipeline_schedule(name)
    return [
        spec.in_flight_microbatches(pp=pp, vpp=vpp, stage=r, num_micro=num_micro) for r in range(pp)
    ]


def test_registry_names_are_the_plans_choices_in_order() -> None:
    assert tuple(SCHEDULES) == PLAN_SCHEDULES == ("1f1b", "interleaved", "gpipe", "zb-h1")
    assert all(spec.name == name for name, spec in SCHEDULES.items())


def test_unknown_name_lists_the_valid_ones() -> None:
    with pytest.raises(ValueError) as error:
        pipeline_schedule("dualpipe")
    assert str(error.value) == (
        "unknown pipeline schedule 'dualpipe'; valid: 1f1b, interleaved, gpipe, zb-h1"
    )
    with pytest.raises(ValueError) as error:
        ParallelConfig(schedule="dualpipe")
    assert str(error.value) == (
        "parallel.schedule='dualpipe' is not one of 1f1b, interleaved, gpipe, zb-h1 (did you "
        "mean 'gpipe'?)"
    )


def test_1f1b_holds_megatrons_warmup_plus_one() -> None:
    # Megatron warmup min(p - r - 1, m) forwards, plus the first steady forward, at most m.
    assert in_flight("1f1b", pp=4, num_micro=8) == [4, 3, 2, 1]
    assert in_flight("1f1b", pp=4, num_micro=2) == [2, 2, 2, 1]
    assert in_flight("zb-h1", pp=4, num_micro=8) == [4, 3, 2, 1]


def test_interleaved_holds_megatrons_warmup_plus_one_chunk() -> None:
    # 2(p - r - 1) + (v - 1) p warmup chunks + 1, at most m v: p=4, v=2 -> 11, 9, 7, 5.
    assert in_flight("interleaved", pp=4, vpp=2, num_micro=8) == [11, 9, 7, 5]
    assert in_flight("interleaved", pp=4, vpp=3, num_micro=4) == [12, 12, 11, 9]


def test_gpipe_holds_every_microbatch() -> None:
    assert in_flight("gpipe", pp=4, num_micro=8) == [8, 8, 8, 8]


@pytest.mark.parametrize(
    ("name", "p", "m", "v"),
    [
        ("1f1b", 4, 8, 1),
        ("1f1b", 4, 2, 1),
        ("zb-h1", 3, 5, 1),
        ("gpipe", 2, 3, 1),
        ("interleaved", 4, 8, 2),
        ("interleaved", 2, 4, 3),
        ("interleaved", 4, 4, 3),
    ],
)
def test_in_flight_count_is_the_orders_peak(name: str, p: int, m: int, v: int) -> None:
    orders = pipeline_orders(name, p, m, v)
    assert [max_in_flight(order) for order in orders] == in_flight(name, pp=p, vpp=v, num_micro=m)


def test_only_interleaved_has_chunks_and_async_p2p() -> None:
    assert {n for n, s in SCHEDULES.items() if s.virtual_stages} == {"interleaved"}
    assert {n for n, s in SCHEDULES.items() if not s.blocking_p2p} == {"interleaved"}


def test_only_gpipe_holds_every_head_input() -> None:
    counts = {name: spec.head_microbatches(8) for name, spec in SCHEDULES.items()}
    assert counts == {"1f1b": 1, "interleaved": 1, "gpipe": 8, "zb-h1": 1}


def test_checks_keep_their_messages() -> None:
    with pytest.raises(ValueError) as error:
        pipeline_schedule("zb-h1").check(pp=4, vpp=2, num_micro=8)
    assert str(error.value) == "vpp=2 > 1 needs schedule 'interleaved', got schedule='zb-h1'"
    with pytest.raises(ValueError) as error:
        pipeline_schedule("interleaved").check(pp=1, vpp=2, num_micro=8)
    assert str(error.value) == "schedule 'interleaved' needs pp > 1 and vpp > 1, got pp=1, vpp=2"
    with pytest.raises(ValueError) as error:
        pipeline_schedule("interleaved").check(pp=4, vpp=2, num_micro=6)
    assert str(error.value) == (
        "schedule 'interleaved' needs the micro-batch count to be a multiple of pp (Megatron), "
        "got micro-batches=6, pp=4, vpp=2"
    )
    pipeline_schedule("interleaved").check(pp=4, vpp=2, num_micro=8)
    pipeline_schedule("gpipe").check(pp=4, vpp=1, num_micro=3)
    with pytest.raises(ValueError) as error:
        pipeline_orders("gpipe", 2, 4, 2)
    assert str(error.value) == "schedule 'gpipe' takes vpp=1, got vpp=2; use 'interleaved'"


def test_specs_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        SCHEDULES["1f1b"].blocking_p2p = False  # type: ignore[misc]


def _is_schedule(node: ast.expr) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "schedule") or (
        isinstance(node, ast.Name) and node.id == "schedule"
    )


def _is_text(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, str)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return any(_is_text(element) for element in node.elts)
    return False


def schedule_name_comparisons(source: str) -> list[int]:
    """Lines where a ``schedule`` (name or attribute) is compared with a string or strings."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            if any(map(_is_schedule, operands)) and any(map(_is_text, operands)):
                lines.append(node.lineno)
    return lines


def test_the_scan_finds_name_comparisons() -> None:
    source = 'a = par.schedule == "gpipe"\nb = schedule in ("1f1b",)\nc = par.schedule == x\n'
    assert schedule_name_comparisons(source) == [1, 2]


def test_no_schedule_name_comparisons_outside_the_registry() -> None:
    found = []
    for package in ("schedules", "sim"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path.is_relative_to(REGISTRY) or path.is_relative_to(IMPORTERS):
                continue
            lines = schedule_name_comparisons(path.read_text())
            found += [f"{path.relative_to(ROOT)}:{line}" for line in lines]
    assert not found, "compare the schedule's attributes instead: " + ", ".join(found)
