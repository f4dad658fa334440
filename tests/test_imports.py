"""The import direction of DESIGN.md, enforced.

``topologies`` and ``schedules`` import nothing else from the project; the torch-free parts of
``comm_bench`` import nothing else either; ``sim`` and those parts never import torch, directly or
through anything they import.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = {"comm_bench", "sim", "topologies", "schedules"}
TORCH_FREE_COMM_BENCH = {"collectives.py", "records.py", "readers.py"}


def _imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def test_topologies_and_schedules_import_nothing_else_from_the_project() -> None:
    for package in ("topologies", "schedules"):
        for path in _modules(package):
            others = (_imported_roots(path) & PROJECT_PACKAGES) - {package}
            assert not others, f"{path.relative_to(ROOT)} imports {sorted(others)}"
            assert "torch" not in _imported_roots(path), path


def test_torch_free_comm_bench_modules_stay_torch_free() -> None:
    for name in TORCH_FREE_COMM_BENCH:
        path = ROOT / "comm_bench" / name
        if not path.exists():
            continue
        roots = _imported_roots(path)
        assert "torch" not in roots, path
        assert not (roots & {"sim", "topologies", "schedules"}), path


def test_sim_never_imports_torch_directly() -> None:
    for path in _modules("sim"):
        assert "torch" not in _imported_roots(path), path.relative_to(ROOT)


def test_importing_every_sim_module_does_not_load_torch() -> None:
    modules = [
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for package in ("sim", "topologies", "schedules")
        for path in _modules(package)
        if path.name != "__main__.py"
    ]
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "import comm_bench.collectives, comm_bench.records\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
