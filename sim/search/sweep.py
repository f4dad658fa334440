"""A sweep: every plan under every what-if scenario, each one simulation (a worker's task).

A scenario is a list of ``--whatif`` flags (``schedules.whatif.parse_flags``) applied on top of
the plan's own section; the empty scenario is the plan as written. ``simulate_scenario`` is the
top-level function the local process pool and Ray run alike (``sim.search.run.run_calls``).

    row = simulate_scenario(plan, ("slow_gpu=3:0.2",))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from schedules.plan import Plan
from schedules.whatif import parse_flags
from sim.replay.simulate import simulate_plan


def simulate_scenario(plan: Plan, flags: Sequence[str], label: str = "") -> dict[str, Any]:
    """One row of a sweep: the plan with ``flags`` applied, simulated (analytical, folded);
    ``label`` names the plan in the row (default: its name)."""
    scenario = dataclasses.replace(plan, whatif=parse_flags(flags, plan.whatif))
    result = simulate_plan(scenario)
    return {
        "plan": label or plan.name,
        "scenario": "; ".join(flags) or "as planned",
        "step_time_s": result.step_time_s,
        "tokens_per_s": result.tokens_per_s,
        "mfu": result.mfu,
        "simulated_ranks": result.num_simulated_ranks,
        "num_gpus": result.num_gpus,
    }


def with_deltas(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with the change of step time against the same plan as planned (``delta_pct``)."""
    planned = {r["plan"]: r["step_time_s"] for r in rows if r["scenario"] == "as planned"}
    return [{**r, "delta_pct": (r["step_time_s"] / planned[r["plan"]] - 1.0) * 100.0} for r in rows]
