"""Where kinds are decided: only the data-parallel registry compares ``data_parallel``.

Every data-parallel framework keeps its knobs, checks, memory, buckets and program choice in its
own module under ``schedules/data_parallel/``; the rest of the simulator asks the kind
(``data_parallel_kind(parallel).gathers_units``) instead of comparing names. The plan parser
may expand the ``fsdp2`` alias, nothing else.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("schedules", "sim", "comm_bench", "topologies", "fileio")
REGISTRY = ROOT / "schedules" / "data_parallel"
COMPARISONS = (ast.Eq, ast.NotEq, ast.In, ast.NotIn)


def _names_data_parallel(node: ast.expr) -> bool:
    if isinstance(node, ast.Attribute):
        return node.attr == "data_parallel"
    return isinstance(node, ast.Name) and node.id == "data_parallel"


def _is_alias_expansion(node: ast.Compare) -> bool:
    return any(isinstance(c, ast.Name) and c.id == "FSDP2_ALIAS" for c in node.comparators)


def data_parallel_comparisons(source: str, filename: str) -> list[int]:
    """Lines comparing ``data_parallel`` (an attribute or a name) with anything."""
    lines = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if not isinstance(node, ast.Compare) or _is_alias_expansion(node):
            continue
        operands = [node.left, *node.comparators]
        if any(isinstance(op, COMPARISONS) for op in node.ops) and any(
            _names_data_parallel(operand) for operand in operands
        ):
            lines.append(node.lineno)
    return lines


def test_the_scan_finds_comparisons() -> None:
    code = (
        "a = plan.parallel.data_parallel == 'ddp'\n"
        "b = data_parallel in KINDS\n"
        "c = par.data_parallel != x\n"
        "d = parallel.data_parallel == FSDP2_ALIAS\n"
        "e = kind.grad_bytes_per_param == 4\n"
    )
    assert data_parallel_comparisons(code, "<test>") == [1, 2, 3]


def test_only_the_registry_compares_data_parallel() -> None:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if REGISTRY in path.parents:
                continue
            for line in data_parallel_comparisons(path.read_text(), str(path)):
                found.append(f"{path.relative_to(ROOT)}:{line}")
    assert not found, "compare data_parallel in schedules/data_parallel only: " + ", ".join(found)
