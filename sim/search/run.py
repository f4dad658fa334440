"""Simulate the screened layouts in worker processes or on Ray and rank them; the Pareto front.

Each layout is one ``simulate_plan`` (analytical network, folded), run in a process pool of
``jobs`` workers or as tasks on a Ray cluster (``run_calls``: the same top-level functions
either way), results in completion order to a progress callback and returned in the screened
order. ``pareto_front`` keeps the layouts no other beats on both throughput and memory.

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
    ray_address: str | None = None,
) -> list[Row]:
    """Every plan simulated (in ``jobs`` processes when > 1, or as tasks on a Ray cluster when
    ``ray_address`` is given), rows in the plans' order."""
    calls = [(simulate_one, (plan, comm, compute)) for plan in plans]
    return run_calls(calls, jobs=jobs, on_done=on_done, ray_address=ray_address)


def run_calls(
    calls: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]],
    *,
    jobs: int = 1,
    on_done: Callable[[Any], None] | None = None,
    ray_address: str | None = None,
) -> list[Any]:
    """``function(*args)`` of every call, in order: in this process, in ``jobs`` worker
    processes, or as Ray tasks (``ray_address``: ``local`` starts a Ray instance on this
    machine, ``auto`` joins the one running here, ``ray://HOST:PORT`` a remote cluster); each
    result goes to ``on_done`` as it completes."""
    if ray_address is not None:
        return _ray_calls(calls, ray_address, on_done)
    if jobs <= 1:
        results = []
        for function, args in calls:
            results.append(function(*args))
            if on_done is not None:
                on_done(results[-1])
        return results
    out: list[Any] = [None] * len(calls)
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(f, *args): i for i, (f, args) in enumerate(calls)}
        try:
            for future in as_completed(futures):
                out[futures[future]] = result = future.result()
                if on_done is not None:
                    on_done(result)
        except BaseException:  # the first failure ends the run: the rest are not started
            pool.shutdown(cancel_futures=True)
            raise
    return out


RAY_HINT = "pip install 'commbench[ray]' on this machine and on every node of the Ray cluster"
"""What to do when Ray is missing."""


def _ray_calls(
    calls: Sequence[tuple[Callable[..., Any], tuple[Any, ...]]],
    address: str,
    on_done: Callable[[Any], None] | None,
) -> list[Any]:
    """The calls as Ray tasks (the same top-level functions the process pool runs)."""
    try:
        import ray
    except ImportError:
        raise ValueError(f"--ray needs Ray, which is not installed: {RAY_HINT}") from None
    if not ray.is_initialized():
        ray.init(
            address=None if address == "local" else address,
            include_dashboard=False,
            log_to_driver=False,
            configure_logging=False,
        )
    tasks: dict[Any, int] = {}
    remotes: dict[Callable[..., Any], Any] = {}
    for index, (function, args) in enumerate(calls):
        remote = remotes.setdefault(function, ray.remote(function))
        tasks[remote.remote(*args)] = index
    out: list[Any] = [None] * len(calls)
    pending = list(tasks)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        try:
            result = ray.get(done[0])
        except ray.exceptions.RayTaskError as error:  # the task's own error, not Ray's wrapper
            for ref in pending:
                ray.cancel(ref)
            cause = error.cause if isinstance(error.cause, Exception) else error
            raise cause from None
        out[tasks[done[0]]] = result
        if on_done is not None:
            on_done(result)
    return out


def pareto_front(rows: Sequence[Row]) -> list[Row]:
    """Rows no other row beats on both throughput (higher) and memory (lower), by memory."""
    front: list[Row] = []
    for row in sorted(rows, key=lambda r: (r.memory_gib, -r.tokens_per_s)):
        if not front or row.tokens_per_s > front[-1].tokens_per_s:
            front.append(row)
    return front
