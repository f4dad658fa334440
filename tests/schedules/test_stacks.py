"""The kernel stack a plan runs when ``training.stack`` does not say, and why."""

from __future__ import annotations

from typing import Any

import pytest

from schedules.plan import load_plan
from schedules.stacks import kernel_stack, stack_source, stack_warning
from sim.cli.main import main

BASE: dict[str, Any] = {
    "model": "megatron-gpt-18b",
    "cluster": {"node": "dgx-a100", "num_nodes": 4},
    "training": {"micro_batch_size": 1, "global_batch_size": 32},
}


def _plan(training: dict[str, Any] | None = None, **parallel: Any) -> Any:
    return load_plan({**BASE, "parallel": parallel,
                      "training": {**BASE["training"], **(training or {})}})  # fmt: skip


@pytest.mark.parametrize(
    ("parallel", "stack", "source"),
    [
        ({"tp": 8, "tp_comm_overlap": True, "sequence_parallel": True}, "megatron",
         "inferred from tp_comm_overlap"),
        ({"tp": 8, "pp": 2, "pp_scatter_gather": False}, "megatron",
         "inferred from pp_scatter_gather"),
        ({"pp": 2, "first_stage_layers": 19, "embedding_as_layer": True}, "megatron",
         "inferred from first_stage_layers, embedding_as_layer"),
        ({"data_parallel": "distributed_optimizer"}, "megatron",
         "the default of data_parallel distributed_optimizer"),
        ({"pp_scatter_gather": True}, "eager", "assumed: training.stack unset"),  # the default
        ({"tp": 8, "sequence_parallel": True}, "eager", "assumed: training.stack unset"),
    ],
)  # fmt: skip
def test_megatron_only_knobs_make_a_megatron_plan(
    parallel: dict[str, Any], stack: str, source: str
) -> None:
    plan = _plan(**parallel)
    assert (kernel_stack(plan), stack_source(plan)) == (stack, source)
    explicit = _plan({"stack": "compile"}, **{k: v for k, v in parallel.items()
                                               if k != "data_parallel"})  # fmt: skip
    assert (kernel_stack(explicit), stack_source(explicit)) == ("compile", "")


def test_a_megatron_looking_plan_on_the_assumed_stack_is_warned_about() -> None:
    assert "Megatron-LM's layout" in str(stack_warning(_plan(tp=8, sequence_parallel=True)))
    assert stack_warning(_plan({"stack": "eager"}, tp=8, sequence_parallel=True)) is None
    assert stack_warning(_plan(tp=8, sequence_parallel=True, tp_comm_overlap=True)) is None
    assert stack_warning(_plan(tp=8, sequence_parallel=True, data_parallel="fsdp")) is None


def test_the_report_names_the_assumed_stack(tmp_path: Any, capsys: Any) -> None:
    """Korthikanti et al.'s layout (TP8 + SP over DDP) without a stack: on main it ran eager
    without a word; the report's basis line says why each stack was taken."""
    import yaml

    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({**BASE, "parallel": {"tp": 8, "sequence_parallel": True}}))
    assert main(["plan", str(path)]) == 0
    captured = capsys.readouterr()
    assert "eager kernel stack (assumed: training.stack unset)" in captured.out
    assert "commsim: warning: training.stack unset: priced as PyTorch eager" in captured.err
    assert main(["plan", str(path), "--set", "parallel.tp_comm_overlap=true"]) == 0
    captured = capsys.readouterr()
    assert "megatron kernel stack (inferred from tp_comm_overlap)" in captured.out
    assert "warning" not in captured.err
