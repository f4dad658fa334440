"""A compute calibration fitted to the user's own torch.profiler trace of one training step.

A user who already runs a job has the one measurement that matters: a profiler trace of their
own step (``vocab.trace_summary`` reads it). With the plan that describes the traced job (model
shape, micro-batch, micro-batches per step; one GPU, or a data-parallel job whose rank's compute
is its one-GPU slice) the trace becomes a ``commbench --step`` measurement: its kernels by class,
busy and idle time, kernel count; the unprofiled step time is the user's ``step_time_s`` when
given, else the profiled step's wall time (the profiler's own cost included, so launch-bound
steps read slower, and no host cost is read off it). ``sim.replay.step_fit.calibration_from_step``
fits it (per-class efficiencies, optimizer bytes, launches per modelled kernel, host time per
launch when the GPU sat idle in the unprofiled step), and the calibration names the trace in
``fitted_on``.

Where the operators recorded their input shapes, each traced GEMM is matched to the plan's
layer GEMMs: its sorted (m, n, k) against those of the plan's forward, input-gradient and
weight-gradient GEMMs (orientation differs between loops; the set of sizes does not). A trace of
another model matches few, which is warned about; without shapes only the counts per class are
compared.

    fit = fit_trace(read_step("trace.json.gz"), load_plan("plan.yaml"), step_time_s=0.058)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from schedules.kernels import embedding_kernels, head_kernels, kernel_stack, layer_kernels
from schedules.plan import Plan, num_microbatches, plan_to_dict
from schedules.resolve import resolve_plan
from sim.replay.step_fit import calibration_from_step
from topologies.hardware import GPUSpec
from vocab.compute_calibration import STEP_SCHEMA, ComputeCalibration
from vocab.trace_summary import TraceStep

PLACED_CLASSES = ("gemm", "attention", "elementwise", "loss", "copy", "optimizer")
"""Kernel classes the step fit prices (communication is the network model's; ``other`` is
unclassified)."""
MIN_GEMM_MATCH = 0.5
"""Below this share of traced GEMMs matching the plan's GEMM shapes the trace is taken to be
of another model (or batch), and said so."""


@dataclass(frozen=True, slots=True, kw_only=True)
class GemmMatch:
    """How the traced GEMMs match the plan's."""

    num_calls: int
    """GEMM operator calls in the traced step."""
    num_modelled: int
    """GEMMs the plan runs in the same step (micro-batches x per micro-batch)."""
    num_shaped: int
    """Traced calls with recorded input shapes."""
    num_matched: int
    """Shaped calls whose sorted (m, n, k) is one of the plan's."""

    @property
    def rate(self) -> float | None:
        """Matched / shaped (None without recorded shapes)."""
        return self.num_matched / self.num_shaped if self.num_shaped else None

    @property
    def matches(self) -> bool:
        """Whether the shapes say this is the plan's model (True without shapes: unknown)."""
        return self.rate is None or self.rate >= MIN_GEMM_MATCH


@dataclass(frozen=True, slots=True, kw_only=True)
class TraceFit:
    """A calibration fitted to a trace, and what it rests on."""

    calibration: ComputeCalibration
    """The fitted compute calibration (``fitted_on`` names the trace)."""
    measurement: dict[str, Any]
    """The ``commbench --step`` measurement built from the trace."""
    step: TraceStep
    """The traced step."""
    step_time_s: float
    """The step time fitted to."""
    step_time_from: str
    """Where it came from (``--step-time``, or the profiled step's wall time)."""
    gemms: GemmMatch
    """The GEMM match."""

    @property
    def placed_share(self) -> float:
        """Share of the traced kernel time in classes the fit prices."""
        total = sum(self.step.classes_s.values())
        placed = sum(self.step.classes_s.get(k, 0.0) for k in PLACED_CLASSES)
        return placed / total if total > 0 else 0.0


def repeat_mismatch(step: TraceStep, plan: Plan) -> str | None:
    """A line where the plan's grouped-query attention disagrees with the trace's: the plan
    repeats K and V to every query head (``training.repeat_kv``) but the traced attention call
    was given fewer K/V heads, or the other way round; None where they agree or the trace does
    not say (``TraceStep.attention_heads``)."""
    model = plan.model
    if step.attention_heads is None or kernel_stack(plan) != "eager":
        return None
    if model.num_kv_heads >= model.num_heads:
        return None
    queries, keys = step.attention_heads
    if keys < queries and plan.training.repeat_kv:
        return (
            f"the traced attention takes {queries} query and {keys} K/V heads as they are "
            "(enable_gqa), but the plan repeats K and V first: set training.repeat_kv: false"
        )
    if keys == queries and not plan.training.repeat_kv:
        return (
            f"the traced attention is given K and V repeated to all {queries} heads, but the "
            "plan has training.repeat_kv: false: set it true"
        )
    return None


def compute_slice(plan: Plan, world_size: int) -> Plan:
    """The one-GPU plan of one rank's compute: the plan itself on one GPU, else (data parallel
    only) its model with the rank's micro-batches on one GPU of the same node."""
    plan = resolve_plan(plan, world_size)
    if world_size == 1:
        return plan
    par = plan.parallel
    if (par.tp, par.pp, par.cp, par.ep) != (1, 1, 1, 1):
        raise ValueError(
            f"a trace fits a one-GPU or data-parallel plan; this one has tp={par.tp} pp={par.pp} "
            f"cp={par.cp} ep={par.ep}"
        )
    training = dataclasses.replace(
        plan.training,
        global_batch_size=plan.training.micro_batch_size * num_microbatches(plan),
    )
    node = plan.cluster.node
    one = {**node, "num_gpus": 1} if isinstance(node, dict) else {"base": node, "num_gpus": 1}
    raw = plan_to_dict(dataclasses.replace(plan, training=training))
    raw["cluster"] = {"node": one, "num_nodes": 1}
    raw["parallel"] = {"recompute": par.recompute, "recompute_num_layers": par.recompute_num_layers}
    from schedules.plan import load_plan

    return resolve_plan(load_plan(raw), 1)


def plan_gemm_shapes(plan: Plan) -> set[tuple[float, ...]]:
    """Sorted (m, n, k) of every GEMM one micro-batch of ``plan`` runs on one GPU."""
    shapes = set()
    for piece in (layer_kernels(plan), embedding_kernels(plan), head_kernels(plan)):
        phases = (piece.forward, piece.recompute, piece.backward_input, piece.backward_weight)
        shapes |= {tuple(sorted(k.dims)) for phase in phases for k in phase if k.kind == "gemm"}
    return shapes


def match_gemms(step: TraceStep, plan: Plan) -> GemmMatch:
    """Traced GEMM calls against the plan's (one-GPU, resolved) GEMMs."""
    shapes = plan_gemm_shapes(plan)
    per_microbatch = sum(
        1
        for piece, count in (
            (layer_kernels(plan), plan.model.num_layers),
            (head_kernels(plan), 1),
        )
        for phase in (piece.forward, piece.recompute, piece.backward_input, piece.backward_weight)
        for kernel in phase * count
        if kernel.kind == "gemm"
    )
    matched = sum(1 for shape in step.gemm_shapes if tuple(sorted(shape)) in shapes)
    return GemmMatch(
        num_calls=step.num_gemm_calls,
        num_modelled=per_microbatch * num_microbatches(plan),
        num_shaped=len(step.gemm_shapes),
        num_matched=matched,
    )


def trace_measurement(
    step: TraceStep, plan: Plan, gpu: GPUSpec, *, step_time_s: float, source_plan: str = ""
) -> dict[str, Any]:
    """The ``commbench --step`` measurement of a traced step of the one-GPU ``plan``."""
    microbatches = num_microbatches(plan)
    return {
        "schema": STEP_SCHEMA,
        "device": step.device,
        "gpu": gpu.name,
        "dtype": "bf16" if plan.training.precision in ("bf16", "fp8") else "fp32",
        "compiled": kernel_stack(plan) == "compile",
        "source_plan": source_plan,
        "model_layers": plan.model.num_layers,
        "measured_layers": plan.model.num_layers,
        "microbatches": microbatches,
        "plan": plan_to_dict(plan),
        "timings_s": {"step": step_time_s},
        # the rank's own kernels: the step is the traced one less its communication alone
        "profile": {**step.profile(), "busy_s": step.busy_s - step.communication_only_s},
        "trace": {"source": Path(step.source).name, "marker": step.marker, "rank": step.rank},
    }


def check_device(step: TraceStep, gpu: GPUSpec) -> None:
    """A ValueError when the trace names a device that is not the plan's GPU (H100 vs A100)."""
    family = gpu.name.split("-")[0].upper()
    if step.device and gpu.name != "cpu" and family not in step.device.upper():
        raise ValueError(
            f"the trace was taken on {step.device!r}, not on the plan's {gpu.name!r}: describe the "
            "traced GPU in the plan"
        )


def fit_trace(
    step: TraceStep,
    plan: Plan,
    gpu: GPUSpec,
    *,
    world_size: int = 1,
    step_time_s: float | None = None,
    source_plan: str = "",
) -> TraceFit:
    """Fit a compute calibration to the traced ``step`` of ``plan`` (on ``world_size`` GPUs)."""
    check_device(step, gpu)
    one_gpu = compute_slice(plan, world_size)
    if step_time_s is None:
        measured, origin = step.wall_s, "the profiled step's wall time (profiler cost included)"
    else:
        measured, origin = step_time_s, "--step-time"
    # the rank's own compute: GPU time in which only NCCL kernels ran is the network's
    measured_compute = measured - step.communication_only_s
    if measured_compute <= 0:
        raise ValueError(f"the step time {measured:.4g} s is not longer than its communication")
    measurement = trace_measurement(
        step, one_gpu, gpu, step_time_s=measured_compute, source_plan=source_plan
    )
    gemms = match_gemms(step, one_gpu)
    try:
        # the profiled wall holds the profiler's own host time: no launch cost read off it
        calibration = calibration_from_step(measurement, gpu, fit_host=step_time_s is not None)
    except ValueError as exc:
        if gemms.matches:
            raise
        raise ValueError(
            f"only {gemms.num_matched} of {gemms.num_shaped} traced GEMMs have one of the plan's "
            f"GEMM shapes: a trace of another model or batch ({exc})"
        ) from None
    host = calibration.host_s_per_launch
    note = (
        f"trace {Path(step.source).name} ({step.marker}, rank {step.rank}): {source_plan or 'plan'}"
        f", {num_microbatches(one_gpu)} micro-batch(es), step {measured:.6g} s ({origin}), "
        f"{kernel_stack(one_gpu)}, {step.num_kernels} kernels"
        + ("" if host is None else f", host {host * 1e6:.3g} us per launch (launch-bound)")
    )
    return TraceFit(
        calibration=dataclasses.replace(calibration, fitted_on=note),
        measurement=measurement,
        step=step,
        step_time_s=measured,
        step_time_from=origin,
        gemms=gemms,
    )
