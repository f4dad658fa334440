"""The import direction of DESIGN.md, enforced.

``fileio`` (safe outputs, strict inputs) imports nothing from the project and everything may import
it; ``topologies`` and ``schedules`` import nothing else from the project; ``vocab`` (the shared
vocabulary of commbench and commsim) imports nothing from the project but ``fileio``; no part of
``comm_bench`` imports ``sim`` and no part of ``sim`` imports ``comm_bench``; ``sim`` and
``vocab`` never import torch, directly or through anything they import; ``sim``'s sub-packages
import each other in one direction only; a ``sim.cli`` command module imports no other
``sim.cli`` module (the dispatcher ``main`` loads them); no module imports itself back through
any chain of imports (type-only and function-level imports included).
"""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from pathlib import Path

import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
PROJECT_PACKAGES = {"comm_bench", "sim", "topologies", "schedules", "fileio", "refdata", "vocab"}
SIM_LAYERS = {
    "network": set(),
    "compute": set(),
    "replay": {"network", "compute"},
    "output": {"replay", "network", "compute"},
    "validation": {"replay", "network", "compute"},
    "search": {"replay", "network", "compute"},
    "inputs": {"network", "compute", "replay"},
    "cli": {"network", "compute", "replay", "output", "validation", "search", "inputs"},
}
"""Which ``sim`` sub-packages each one may import (besides itself)."""


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


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, known: set[str]) -> set[str]:
    """Project modules ``path`` imports anywhere (``from a import b``: ``a.b`` if a module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in known else node.module)
    return found & known


def _import_graph() -> nx.DiGraph:
    paths = [path for package in sorted(PROJECT_PACKAGES) for path in _modules(package)]
    known = {_module_name(path) for path in paths}
    graph = nx.DiGraph()
    graph.add_nodes_from(known)
    for path in paths:
        name = _module_name(path)
        graph.add_edges_from((name, other) for other in _imported_modules(path, known) - {name})
    return graph


def test_no_import_circles() -> None:
    graph = _import_graph()
    assert graph.number_of_nodes() > 60  # every module of the four packages is in it
    cycles = list(itertools.islice(nx.simple_cycles(graph), 5))
    assert not cycles, "import circles: " + "; ".join(" -> ".join([*c, c[0]]) for c in cycles)


def test_comm_bench_never_imports_sim() -> None:
    for path in _modules("comm_bench"):
        assert "sim" not in _imported_roots(path), path.relative_to(ROOT)


def test_sim_never_imports_comm_bench() -> None:
    for path in _modules("sim"):
        assert "comm_bench" not in _imported_roots(path), path.relative_to(ROOT)


def test_sim_sub_packages_import_in_one_direction() -> None:
    graph = _import_graph()
    assert set(SIM_LAYERS) == {
        p.name for p in (ROOT / "sim").iterdir() if (p / "__init__.py").exists()
    }
    for module, other in graph.edges:
        if not (module.startswith("sim.") and other.startswith("sim.")):
            continue
        layer, other_layer = module.split(".")[1], other.split(".")[1]
        if layer == "__main__":  # ``python -m sim`` is the command line's entry
            continue
        if other_layer != layer:
            assert other_layer in SIM_LAYERS[layer], f"{module} imports {other}"


def test_topologies_and_schedules_import_nothing_else_from_the_project() -> None:
    for package in ("topologies", "schedules", "fileio", "refdata"):
        for path in _modules(package):
            others = (_imported_roots(path) & PROJECT_PACKAGES) - {package, "fileio"}
            assert package not in ("fileio", "refdata") or not others, path
            assert not others, f"{path.relative_to(ROOT)} imports {sorted(others)}"
            assert "torch" not in _imported_roots(path), path


def test_vocab_imports_only_fileio_and_never_torch() -> None:
    paths = _modules("vocab")
    assert len(paths) > 5  # the package is where this test looks
    for path in paths:
        roots = _imported_roots(path)
        others = (roots & PROJECT_PACKAGES) - {"vocab", "fileio"}
        assert not others, f"{path.relative_to(ROOT)} imports {sorted(others)}"
        assert "torch" not in roots, path.relative_to(ROOT)


def test_cli_commands_do_not_import_each_other() -> None:
    graph = _import_graph()
    for module, other in graph.edges:
        if module.startswith("sim.cli.") and other.startswith("sim.cli"):
            assert module == "sim.cli.main", (
                f"{module} imports {other}: share it through sim.inputs"
            )


def test_sim_never_imports_torch_directly() -> None:
    for path in _modules("sim"):
        assert "torch" not in _imported_roots(path), path.relative_to(ROOT)


def test_importing_every_sim_module_does_not_load_torch() -> None:
    modules = [
        ".".join(path.relative_to(ROOT).with_suffix("").parts)
        for package in ("sim", "topologies", "schedules", "fileio", "vocab")
        for path in _modules(package)
        if path.name != "__main__.py"
    ]
    assert "vocab.readers" in modules
    code = (
        "import importlib, sys\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"
