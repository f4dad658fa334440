"""Predicted against traced: a traced step beside the replay of its plan, row by row.

Three views of one step, each a list of ``Row`` (what, traced seconds, predicted seconds):

- **classes**: kernel time per class as the compute model prices the plan with a calibration
  (``sim.replay.step_fit.modelled_classes_s``: GEMMs, attention, memory-bound work split into
  the profile's elementwise, loss and copy classes, the optimizer) against the trace's sums;
- **phases**: the replayed timeline's compute spans per phase (forward ``F*``, backward ``B*`` /
  ``W*``, the optimizer span), the GPU's waits (host, bubble) and the step, against the trace's
  busy time per phase, the step time less the traced busy time, and the step time;
- **collectives**: per torch.distributed op, the simulated collectives of the traced rank
  (count, seconds, bytes) against its NCCL kernels; empty for a one-GPU step.

    rows = phase_rows(step, simulate_plan(plan, compute_calibration=fit.calibration), 0.058)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from schedules.plan import Plan, num_microbatches
from sim.compute.compute_model import ComputeModel
from sim.replay.result import PlanResult
from sim.replay.step_fit import PASS_CLASSES, modelled_classes_s
from topologies.hardware import GPUSpec
from vocab.compute_calibration import ComputeCalibration
from vocab.trace_summary import TraceStep


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One line of a comparison."""

    what: str
    """The class, phase or collective."""
    traced_s: float
    """Seconds in the trace (or the measured step)."""
    predicted_s: float
    """Seconds the model gives."""
    traced_count: int | None = None
    """Kernels in the trace (collectives only)."""
    predicted_count: int | None = None
    """Simulated calls (collectives only)."""
    traced_bytes: float = 0.0
    """Message bytes in the trace (collectives; 0 where not recorded)."""
    predicted_bytes: float = 0.0
    """Simulated message bytes (collectives)."""

    @property
    def error(self) -> float | None:
        """predicted / traced - 1 (None when nothing was traced)."""
        return self.predicted_s / self.traced_s - 1.0 if self.traced_s > 0 else None

    def to_json(self) -> dict[str, object]:
        """The row as a JSON object."""
        out: dict[str, object] = {
            "what": self.what,
            "traced_s": self.traced_s,
            "predicted_s": self.predicted_s,
            "error": self.error,
        }
        if self.traced_count is not None:
            out.update(
                traced_count=self.traced_count,
                predicted_count=self.predicted_count,
                traced_bytes=self.traced_bytes,
                predicted_bytes=self.predicted_bytes,
            )
        return out


def class_rows(
    step: TraceStep, plan: Plan, gpu: GPUSpec, calibration: ComputeCalibration | None
) -> list[Row]:
    """Kernel seconds per class: the model's pricing of the one-GPU ``plan`` against the trace."""
    compute = ComputeModel(gpu, calibration)
    modelled = modelled_classes_s(plan, compute, num_microbatches(plan))
    traced = step.classes_s
    rows = [Row(what="gemm", traced_s=traced["gemm"], predicted_s=modelled["gemm"])]
    rows.append(Row(what="attention", traced_s=traced["attention"],
                    predicted_s=modelled["attention"]))  # fmt: skip
    rows += [
        Row(what=name, traced_s=traced[name], predicted_s=modelled[f"memory_{name}"])
        for name in PASS_CLASSES
    ]
    rows.append(Row(what="optimizer", traced_s=traced["optimizer"],
                    predicted_s=modelled["optimizer"]))  # fmt: skip
    rows.append(Row(what="other (unclassified)", traced_s=traced["other"], predicted_s=0.0))
    return rows


def _phase_of(name: str, kind: str) -> str:
    if kind == "optimizer":
        return "optimizer"
    return "forward" if name.startswith("F") else "backward"


def phase_rows(step: TraceStep, result: PlanResult, step_time_s: float) -> list[Row]:
    """GPU seconds per phase, the GPU's wait on the host, and the step: replay against trace."""
    rank = int(result.extra.get("critical_rank", 0))
    simulated = {"forward": 0.0, "backward": 0.0, "optimizer": 0.0}
    for span in result.spans:
        if span.rank == rank and span.kind in ("compute", "optimizer"):
            simulated[_phase_of(span.name, span.kind)] += span.duration_s
    # the passes' kernels with the GPU's gap before each, as the replay prices them (the
    # optimizer step is priced by its bytes alone)
    gaps = {
        phase: step.phase_kernels.get(phase, 0) * step.kernel_gap_s if phase != "optimizer" else 0.0
        for phase in simulated
    }
    rows = [
        Row(what=phase, traced_s=step.phases_s.get(phase, 0.0) + gaps[phase], predicted_s=seconds)
        for phase, seconds in simulated.items()
    ]
    # the unprofiled step's idle: its time less the traced kernels' and their gaps (the profiler
    # slows the host)
    idle_s = max(0.0, step_time_s - step.busy_s - sum(gaps.values()))
    rows.append(Row(what="idle (host, waits)", traced_s=idle_s,
                    predicted_s=result.breakdown.host_s + result.breakdown.bubble_s))  # fmt: skip
    rows.append(Row(what="step", traced_s=step_time_s, predicted_s=result.step_time_s))
    return rows


def collective_rows(step: TraceStep, result: PlanResult) -> list[Row]:
    """Per op: the simulated collectives of the traced rank against its NCCL kernels."""
    rank = step.rank if any(s.rank == step.rank for s in result.spans) else 0
    simulated: dict[str, list[float]] = {}
    for span in result.spans:
        if span.rank == rank and span.kind == "collective":
            entry = simulated.setdefault(span.op or "unknown", [0, 0.0, 0.0])
            entry[0] += 1
            entry[1] += span.duration_s
            entry[2] += span.size_bytes
    rows = []
    for op in sorted(set(simulated) | set(step.collectives)):
        count, seconds, size = simulated.get(op, [0, 0.0, 0.0])
        traced = step.collectives.get(op)
        rows.append(
            Row(
                what=op,
                traced_s=traced.time_s if traced else 0.0,
                predicted_s=seconds,
                traced_count=traced.count if traced else 0,
                predicted_count=int(count),
                traced_bytes=traced.size_bytes if traced else 0.0,
                predicted_bytes=size,
            )
        )
    return rows


def rows_json(rows: list[Row]) -> list[Mapping[str, object]]:
    """The rows as JSON objects."""
    return [row.to_json() for row in rows]
