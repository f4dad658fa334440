"""What a prediction rests on, said in the result: calibrations or defaults, the kernel stack,
how far such predictions were from published runs, and the step's bottleneck.

A user buys GPUs on these numbers, so every ``commsim plan`` report and JSON names the compute
and network basis (default figures, or which calibration and what it was fitted on), and when
the compute runs on defaults it quotes the error ``commsim validate --calibrate-on none``
measured for that stack (``VALIDATED_ERROR``; ``tests/test_docs.py`` checks it against
``results/validation/uncalibrated.json``).

    basis = prediction_basis(plan, compute=compute, comm_calibration=None, stack="eager")
"""

from __future__ import annotations

from typing import Any

from sim.compute.compute_model import IN_STEP_SLOWDOWN, ComputeModel
from sim.replay.result import Breakdown

VALIDATED_ERROR = {"megatron": (0.069, 44), "compile": (0.049, 26), "eager": (0.016, 2)}
"""Per kernel stack: (MAPE, published runs) of uncalibrated predictions (``commsim validate
--calibrate-on none``, ``summary_by_stack``). The Megatron figure includes the ten runs the
default in-step slowdown of their GPU generation was fitted on, as every other published run
(``sim.compute.compute_model.IN_STEP_SLOWDOWN``; ``commsim validate --leave-one-source-out``
scores each source without them)."""


def compute_basis(
    compute: ComputeModel, stack: str, source: str = "", *, cuda_graphs: bool = False
) -> str:
    """The compute figures' basis, in one line; ``source`` says why the plan runs ``stack``
    when the plan does not say it (``schedules.stacks.stack_source``); ``cuda_graphs``: the
    layers launch as captured graphs."""
    calibration = compute.calibration
    overlap = f"overlap slowdown {compute.overlap_slowdown:.1%}"
    named = f"{stack} kernel stack ({source})" if source else f"{stack} kernel stack"
    if cuda_graphs:
        named += ", layers in CUDA graphs"
    fitted = calibration.time_scale != 1.0 or calibration.in_step_slowdown is not None
    if calibration.kernels or calibration.efficiency or fitted:
        origin = calibration.fitted_on or calibration.device or "a calibration file"
        return f"calibrated ({origin}); {named}, {overlap}"
    measured = VALIDATED_ERROR.get(stack)
    error = (
        f"uncalibrated predictions of this stack were off by {measured[0]:.1%} (MAPE) on "
        f"{measured[1]} published runs"
        if measured
        else "no published runs of this stack validate these defaults: calibrate with "
        "commbench --step or commsim fit"
    )
    family = compute.gpu.family
    scope = (
        f"fitted on the published {family} runs"
        if family in IN_STEP_SLOWDOWN
        else f"fitted on every published run: none on {family} GPUs"
    )
    slowdown = (
        f"in-step slowdown {compute.in_step_slowdown:.1%} (a factor for multi-GPU plans, {scope})"
        if compute.in_step_slowdown
        else "no in-step slowdown (one GPU)"
    )
    spec = f"{compute.gpu.name} peak x default efficiencies, {slowdown}"
    return f"defaults ({spec}, {named}, {overlap}); {error}"


HOST_BASIS_SHARE = 0.05
"""Share of the step spent waiting on the host from which the report says what the host's
launch cost rests on: below it the launches hide behind the kernels and their cost does not
matter."""


def host_basis(
    compute: ComputeModel, loop: str, host_share: float, *, cuda_graphs: bool = False
) -> str:
    """What the host's launch cost rests on, in one line, when the step waits on it for
    ``HOST_BASIS_SHARE`` or more of its time (else empty): each of the two figures, the host
    time per launch and the launches per modelled kernel, with where it comes from (a host
    launches at its machine's pace, which the default, one machine's, does not know)."""
    if host_share < HOST_BASIS_SHARE:
        return ""
    calibration = compute.calibration
    origin = calibration.fitted_on or calibration.device or "a calibration"
    cost = f"{compute.host_s_per_launch * 1e6:.1f} us per kernel launch " + (
        f"(calibrated: {origin})"
        if calibration.host_s_per_launch is not None
        else "(default: one sandboxed H100 machine's; another host launches at its own pace, "
        "16-23 us measured on an H200 machine's: calibrate with a launch-bound commbench "
        "--step of this machine)"
    )
    launches = f"{compute.launches_per_kernel(loop):.2f} launches per modelled kernel " + (
        "(calibrated)"
        if calibration.launches_per_kernel is not None
        else f"(the {loop} loop's default)"
    )
    graphs = "; the layers launch as CUDA graphs, one launch per pass" if cuda_graphs else ""
    return f"{cost}, {launches}{graphs}; the step waits on the host {host_share:.0%} of its time"


def network_basis(comm_calibration: Any) -> str:
    """The network figures' basis, in one line."""
    if comm_calibration is None:
        return "defaults (link catalogue and NCCL-like algorithm model, uncalibrated)"
    return f"calibrated on {getattr(comm_calibration, 'topology', '') or 'measurements'}"


def bottleneck(breakdown: Breakdown, step_s: float, *, fits: bool, pipeline: bool) -> str:
    """The largest share of the critical rank's step, or memory when the plan does not fit."""
    shares = {"compute": breakdown.compute_s, "optimizer": breakdown.optimizer_s}
    shares.update({f"exposed {g} communication": t for g, t in breakdown.exposed_comm_s.items()})
    shares["host (launches, framework loops)"] = breakdown.host_s
    shares["pipeline bubble" if pipeline else "waiting (idle)"] = breakdown.bubble_s
    name, time_s = max(shares.items(), key=lambda item: item[1])
    share = f"{name} ({time_s / step_s:.0%} of the step)" if step_s > 0 else name
    return share if fits else f"memory: the plan does not fit; then {share}"
