"""Simulate the screened layouts in worker processes and rank them; the Pareto front.

Each layout is one ``simulate_plan`` (analytical network, folded), run in a process pool of
``jobs`` workers, results in completion order to a progress callback and returned in the
screened order. ``pareto_front`` keeps the layouts no other beats on both throughput and memory.

    rows = simulate_layouts(screened.plans, jobs=2)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from typing import Any

from schedules.plan import Plan
from sim.network.calibration import Calibration
from sim.replay.simulate import simulate_plan
from vocab.compute_calibration import ComputeCalibration


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One simulated layout."""

    name: str
    """``layout_name``."""
    step_time_s: float
    """Seconds per optimizer step."""
    tokens_per_s: float
    """Global tokens per second."""
    mfu: float
    """Model FLOP utilisation."""
    memory_gib: float
    """Peak memory per GPU (worst stage)."""
    exposed_comm_s: float
    """Exposed communication on the critical rank, all groups."""
    bottleneck: str
    """The largest share of the step."""

    def to_json(self) -> dict[str, Any]:
        """A flat JSON object (also the CSV row)."""
        return {
            "layout": self.name,
            "step_time_s": self.step_time_s,
            "tokens_per_s": self.tokens_per_s,
            "mfu": self.mfu,
            "memory_gib": self.memory_gib,
            "exposed_comm_s": self.exposed_comm_s,
            "bottleneck": self.bottleneck,
        }


def simulate_one(
    plan: Plan, comm: Calibration | None = None, compute: ComputeCalibration | None = None
) -> Row:
    """Simulate one layout (a top-level function: worker processes pickle it)."""
    result = simulate_plan(plan, comm_calibration=comm, compute_calibration=compute)
    return Row(
        name=plan.name,
        step_time_s=result.step_time_s,
        tokens_per_s=result.tokens_per_s,
        mfu=result.mfu,
        memory_gib=result.memory_gib["total"],
        exposed_comm_s=sum(result.breakdown.exposed_comm_s.values()),
        bottleneck=result.bottleneck,
    )


def simulate_layouts(
    plans: Sequence[Plan],
    *,
    jobs: int = 1,
    comm: Calibration | None = None,
    compute: ComputeCalibration | None = None,
    on_done: Callable[[Row], None] | None = None,
) -> list[Row]:
    """Every plan simulated (in ``jobs`` processes when > 1), rows in the plans' order."""
    if jobs <= 1:
        rows = []
        for plan in plans:
            rows.append(simulate_one(plan, comm, compute))
            if on_done is not None:
                on_done(rows[-1])
        return rows
    out: list[Row | None] = [None] * len(plans)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(simulate_one, p, comm, compute): i for i, p in enumerate(plans)}
        for future in as_completed(futures):
            out[futures[future]] = row = future.result()
            if on_done is not None:
                on_done(row)
    return [row for row in out if row is not None]


def pareto_front(rows: Sequence[Row]) -> list[Row]:
    """Rows no other row beats on both throughput (higher) and memory (lower), by memory."""
    front: list[Row] = []
    for row in sorted(rows, key=lambda r: (r.memory_gib, -r.tokens_per_s)):
        if not front or row.tokens_per_s > front[-1].tokens_per_s:
            front.append(row)
    return front
