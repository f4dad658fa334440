"""Figures the documentation quotes are the code's: recomputed here, so a drift fails."""

from __future__ import annotations

import json
from pathlib import Path

from schedules.memory import COMPONENTS, memory_per_gpu
from schedules.plan import load_plan
from schedules.resolve import resolve_plan
from sim.replay.simulate import plan_topology

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30


def memory_sentence(example: str) -> str:
    """The per-component memory line docs/plan.md gives for an example plan."""
    plan = load_plan(ROOT / "examples" / example)
    topology = plan_topology(plan)
    plan = resolve_plan(plan, topology.num_gpus)
    hbm = topology.gpu_spec(0).hbm_bytes
    memory = memory_per_gpu(plan, hbm_bytes=hbm, gpus_per_node=topology.gpus_per_node)
    parts = [f"{k} {memory[k] / GIB:.2f}" for k in COMPONENTS if memory[k] > 0]
    return ", ".join(parts) + f", total {memory['total'] / GIB:.2f} GiB"


def test_plan_doc_quotes_the_70b_memory_the_code_gives() -> None:
    text = " ".join((ROOT / "docs" / "plan.md").read_text(encoding="utf-8").split())
    assert memory_sentence("llama3-70b-256xh100.yaml") in text


def test_reports_quote_the_uncalibrated_error_the_validation_measured() -> None:
    from sim.replay.basis import VALIDATED_ERROR

    path = ROOT / "results/validation/uncalibrated.json"
    summary = json.loads(path.read_text())["summary_by_stack"]
    assert set(VALIDATED_ERROR) == set(summary) - {"all"}
    for stack, (mape, runs) in VALIDATED_ERROR.items():
        assert (round(summary[stack]["mape"], 3), summary[stack]["num_cases"]) == (mape, runs)


def test_the_plan_doc_shows_the_report_the_code_prints(capsys) -> None:
    from sim.cli.main import main

    assert main(["plan", str(ROOT / "examples" / "small-zb.yaml")]) == 0
    report = capsys.readouterr().out
    doc = (ROOT / "docs" / "commsim-plan.md").read_text(encoding="utf-8")
    assert report in doc


def test_the_readme_python_example_runs() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = text.split("## From Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict[str, object] = {}
    exec(compile(block, "README.md", "exec"), scope)
    assert scope["best"] is not None and scope["front"]


def test_the_readme_says_how_to_get_the_cpu_and_the_cuda_build_of_torch() -> None:
    """The two install commands stay as they were; beside them, the CPU wheel index for a CPU
    box and the CUDA build for a GPU box (on main: 'with the CPU build' for a command that
    installs PyPI's CUDA build)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "pip install torch==2.13.0 && pip install -e . && commbench --ops all_gather" in text
    assert "pip install torch==2.13.0 && pip install -e '.[test]' && python -m pytest" in text
    assert "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu" in text
    assert "**GPU box**: use the CUDA build" in text
    assert "with the CPU build of PyTorch" not in text
