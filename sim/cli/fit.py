"""``commsim fit``: fit the compute speed to one measured step of your own job.

A user who measured one step of a plan (say on 32 GPUs) fits a single factor on every kernel
time (``time_scale`` in the compute calibration) so that the simulated step equals the measured
one, then predicts other layouts and scales with ``commsim plan --compute-calibration``. The
step time rises monotonically with the factor, so it is found by bracketing and the Illinois
variant of regula falsi in log space (a handful of simulations). A fit that would put the GEMMs
above the GPU's dense peak, or below ``MIN_GEMM_EFFICIENCY`` of it, is refused: the plan (layout,
batch, recompute) or the measurement is wrong, not the GPU.

    commsim fit plan.yaml --step-time 12.3 --compute-calibration fitted.json

With ``--trace`` the fit reads the user's own torch.profiler trace of the traced job's step
instead (``sim.replay.trace_fit``): per-class efficiencies, launches and host cost, as a
``commbench --step`` file gives them, and prints predicted against traced time per class and
phase (``--plot`` draws them; a multi-rank trace also gets its NCCL kernels against the
simulated collectives).

    commsim fit plan.yaml --trace trace.json.gz --step-time 0.058 --compute-calibration fitted.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

from fileio.output import check_outputs, write_bytes
from sim.inputs.calibrations import compute_calibration_for, load_calibrations
from sim.inputs.plans import add_set_argument, load_plan_file
from sim.network.comm_model import FIDELITIES

MIN_GEMM_EFFICIENCY = 0.15
"""Below this fraction of the dense peak for large GEMMs a fit describes a broken setup (a
training step of a transformer on a modern GPU runs its GEMMs at 40-80% of peak)."""
RELATIVE_TOLERANCE = 1e-4
"""The fit stops when the simulated step is this close to the measured one."""
MAX_SIMULATIONS = 40
"""Bracketing plus regula falsi never needs more on a monotone step time."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Define the ``commsim fit`` flags."""
    parser.add_argument("plan", type=Path, metavar="PLAN.yaml", help="the plan that was measured")
    add_set_argument(parser)
    parser.add_argument(
        "--step-time",
        type=float,
        default=None,
        metavar="SECONDS",
        help="measured seconds per optimizer step (steady state, not the first steps; unprofiled "
        "with --trace, where it defaults to the profiled step's wall time)",
    )
    parser.add_argument(
        "--trace",
        type=Path,
        metavar="TRACE.json[.gz]",
        help="fit to this torch.profiler trace of the plan's step (one rank's file)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="PLOT.png",
        help="with --trace: plot predicted vs traced time per class and phase (png, svg, pdf)",
    )
    parser.add_argument(
        "--compute-calibration",
        type=Path,
        metavar="OUT.json",
        help="write the fitted compute calibration here",
    )
    parser.add_argument(
        "--from-compute-calibration",
        type=Path,
        metavar="FILE",
        help="start from this compute calibration (commbench --compute) instead of defaults",
    )
    parser.add_argument("--calibration", type=Path, metavar="FILE", help="network calibration JSON")
    parser.add_argument("--fidelity", choices=FIDELITIES, default="analytical")
    parser.add_argument("--json", action="store_true", help="print the fit as JSON")


def fit_time_scale(
    step_time_s: float, simulate: Callable[[float], float], *, low: float, high: float
) -> tuple[float, float, int]:
    """(scale, simulated step, simulations) with ``simulate(scale)`` = ``step_time_s``.

    ``simulate`` must be non-decreasing in the scale. Raises ValueError when the measured step
    lies outside [simulate(low), simulate(high)], naming the bound it crosses.
    """
    calls = 0

    def f(log_scale: float) -> float:
        nonlocal calls
        calls += 1
        return math.log(simulate(math.exp(log_scale)) / step_time_s)

    a, b = math.log(low), math.log(high)
    fa, fb = f(a), f(b)
    if fa > 0:
        raise ValueError(f"below:{math.exp(fa) * step_time_s}")
    if fb < 0:
        raise ValueError(f"above:{math.exp(fb) * step_time_s}")
    side = 0
    while calls < MAX_SIMULATIONS:
        c = (a * fb - b * fa) / (fb - fa) if fb != fa else (a + b) / 2
        fc = f(c)
        if abs(fc) <= RELATIVE_TOLERANCE:
            return math.exp(c), math.exp(fc) * step_time_s, calls
        if fc < 0:
            a, fa = c, fc
            fb = fb / 2 if side == -1 else fb  # Illinois: halve the stale end
            side = -1
        else:
            b, fb = c, fc
            fa = fa / 2 if side == 1 else fa
            side = 1
    return math.exp(c), math.exp(fc) * step_time_s, calls


def run(args: argparse.Namespace) -> int:
    """Fit the factor, print it, write the calibration; returns 0."""
    from schedules.resolve import resolve_plan
    from sim.compute.compute_model import default_efficiency, default_in_step_slowdown
    from sim.replay.simulate import plan_topology, simulate_plan
    from vocab.compute_calibration import ComputeCalibration, save_compute_calibration

    measured = args.step_time
    if measured is not None and (not math.isfinite(measured) or measured <= 0):
        raise ValueError(f"--step-time must be a positive number of seconds, got {measured}")
    if args.trace is not None:
        return run_trace(args)
    if measured is None or args.plot is not None:
        raise ValueError(
            "--step-time is required without --trace"
            if measured is None
            else "--plot needs --trace (it compares the trace with the prediction)"
        )
    targets = check_outputs(
        {"--compute-calibration": (args.compute_calibration, (".json",))},
        inputs=(args.plan, args.calibration, args.from_compute_calibration),
    )
    plan = load_plan_file(args.plan, args.set)
    topology = plan_topology(plan)
    plan = resolve_plan(plan, topology.num_gpus)
    comm, source = load_calibrations(args.calibration, args.from_compute_calibration)
    gpu = topology.gpu_spec(0)
    base = compute_calibration_for(source, gpu, warn=_warn) or ComputeCalibration()
    if base.in_step_slowdown is None:  # the fit is relative to the default in effect: keep it
        default = default_in_step_slowdown(gpu.family) if topology.num_gpus > 1 else 0.0
        base = dataclasses.replace(base, in_step_slowdown=default)
    dtype = "fp8" if plan.training.precision == "fp8" else "bf16"
    gemm = base.efficiency.get("gemm", default_efficiency(gpu, "gemm", dtype))
    fitted = base.kernel("gemm", dtype)
    if fitted is not None:
        gemm = fitted.max_flops_per_s / gpu.peak_flops_per_s[dtype]
    # time_scale multiplies the base's own factors (its scale, the in-step slowdown): a large
    # GEMM then runs at gemm / (factor x scale) of peak.
    factor = base.time_scale * (1.0 + (base.in_step_slowdown or 0.0))
    low, high = gemm / factor, gemm / MIN_GEMM_EFFICIENCY / factor

    def simulate(scale: float) -> float:
        calibration = dataclasses.replace(base, time_scale=base.time_scale * scale)
        result = simulate_plan(
            plan,
            topology=topology,
            comm_calibration=comm,
            compute_calibration=calibration,
            fidelity=args.fidelity,
        )
        return result.step_time_s

    try:
        scale, simulated, calls = fit_time_scale(measured, simulate, low=low, high=high)
    except ValueError as exc:
        raise ValueError(_refusal(str(exc), measured)) from None
    total = base.time_scale * scale
    note = (
        f"{args.plan.name} on {topology.num_gpus} GPUs ({gpu.name}), measured step {measured:g} s"
    )
    calibration = dataclasses.replace(base, time_scale=total, fitted_on=note)
    summary = {
        "time_scale": total,
        "gemm_efficiency": gemm / (total * (1.0 + (base.in_step_slowdown or 0.0))),
        "in_step_slowdown": base.in_step_slowdown,
        "simulated_step_s": simulated,
        "measured_step_s": measured,
        "simulations": calls,
        "fitted_on": note,
    }
    if (target := targets.get("--compute-calibration")) is not None:
        save_compute_calibration(calibration, target)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(_text(summary, args.compute_calibration))
    return 0


def run_trace(args: argparse.Namespace) -> int:
    """``commsim fit --trace``: fit to the trace, compare, print, write; returns 0."""
    from sim.output.trace_fit_report import comparison_figure_bytes, fit_json, fit_text
    from sim.replay.simulate import plan_topology, simulate_plan
    from sim.replay.trace_compare import class_rows, collective_rows, phase_rows
    from sim.replay.trace_fit import compute_slice, fit_trace, repeat_mismatch
    from vocab.compute_calibration import save_compute_calibration
    from vocab.trace_summary import read_step

    if args.from_compute_calibration is not None:
        raise ValueError(
            "--from-compute-calibration does not combine with --trace: the trace sets every "
            "fitted compute parameter"
        )
    targets = check_outputs(
        {
            "--compute-calibration": (args.compute_calibration, (".json",)),
            "--plot": (args.plot, (".png", ".svg", ".pdf")),
        },
        inputs=(args.plan, args.trace, args.calibration),
    )
    plan = load_plan_file(args.plan, args.set)
    topology = plan_topology(plan)
    gpu = topology.gpu_spec(0)
    step = read_step(args.trace, device="cpu" if gpu.name == "cpu" else "gpu")
    fit = fit_trace(step, plan, gpu, world_size=topology.num_gpus, step_time_s=args.step_time,
                    source_plan=args.plan.name)  # fmt: skip
    if not fit.gemms.matches:
        _warn(
            f"only {fit.gemms.num_matched} of {fit.gemms.num_shaped} traced GEMMs have one of "
            f"the plan's GEMM shapes: the trace is of another model or batch than {args.plan.name}"
        )
    if (mismatch := repeat_mismatch(step, compute_slice(plan, topology.num_gpus))) is not None:
        _warn(mismatch)
    comm, _ = load_calibrations(args.calibration, None)
    result = simulate_plan(plan, topology=topology, comm_calibration=comm,
                           compute_calibration=fit.calibration, fidelity=args.fidelity)  # fmt: skip
    rows = {
        "classes": class_rows(step, compute_slice(plan, topology.num_gpus), gpu, fit.calibration),
        "phases": phase_rows(step, result, fit.step_time_s),
        "collectives": collective_rows(step, result)
        if topology.num_gpus > 1 or step.collectives
        else [],
    }
    if (target := targets.get("--compute-calibration")) is not None:
        save_compute_calibration(fit.calibration, target)
    if (plot := targets.get("--plot")) is not None:
        title = f"{Path(step.source).name} vs {args.plan.name}"
        data = comparison_figure_bytes(rows["classes"], rows["phases"], title=title,
                                       image_format=plot.format)  # fmt: skip
        write_bytes(plot, data)
    if args.json:
        print(json.dumps(fit_json(fit, **rows), indent=2))
    else:
        written = str(args.compute_calibration) if args.compute_calibration else None
        print(fit_text(fit, **rows, written=written))
    return 0


def _warn(line: str) -> None:
    print(f"commsim: warning: {line}", file=sys.stderr)


def _refusal(bound: str, measured: float) -> str:
    side, value = bound.split(":")
    if side == "below":
        return (
            f"--step-time {measured:g} s is shorter than this plan can run with its GEMMs at the "
            f"GPU's dense peak ({float(value):.4g} s): the measured job had a smaller layout or "
            "batch, or the plan's communication is slower than the real cluster's"
        )
    return (
        f"--step-time {measured:g} s is longer than this plan takes with its GEMMs at "
        f"{MIN_GEMM_EFFICIENCY:.0%} of peak ({float(value):.4g} s): check the plan (layout, "
        "batch, recompute) and that the measurement excludes start-up and evaluation"
    )


def _number(value: object) -> float:
    return float(value) if isinstance(value, int | float) else 0.0


def _text(summary: dict[str, object], out: Path | None) -> str:
    lines = [
        f"fitted time_scale {summary['time_scale']:.4f}: every kernel takes "
        f"{summary['time_scale']:.3f}x its modelled in-step time (the kernel curves x "
        f"{1 + _number(summary['in_step_slowdown']):.2f}); large GEMMs at "
        f"{summary['gemm_efficiency']:.1%} of dense peak",
        f"simulated step {summary['simulated_step_s']:.4f} s vs measured "
        f"{summary['measured_step_s']:.4f} s ({summary['simulations']} simulations)",
    ]
    if out is not None:
        lines.append(f"wrote {out}: pass it to commsim plan --compute-calibration")
    return "\n".join(lines)
