"""The calibrations a user names, loaded, and the policy that fits them to the plan at hand.

A network calibration (``commsim calibrate``) is read by ``sim.network.calibration``; a compute
calibration is a ``commsim-compute`` file or a ``commbench --step`` measurement, told apart and
read once by ``vocab.compute_calibration.load_compute_source``. ``compute_calibration_for``
decides what a plan's GPU gets from it: the file as it is, only its CPU Adam rate when it was
measured on the CPU, or a calibration fitted to the step measurement. ``calibration_mismatch``
says when a network calibration was fitted on another node than the plan's.

    comm, compute = load_calibrations(Path("cal.json"), Path("step.json"))
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fileio.strict import require_file
from sim.network.calibration import Calibration, load_calibration
from vocab.compute_calibration import ComputeCalibration, load_compute_source

if TYPE_CHECKING:
    from schedules.plan import Plan
    from topologies.hardware import GPUSpec


def load_calibrations(
    network: Path | None, compute: Path | None
) -> tuple[Calibration | None, ComputeCalibration | dict[str, Any] | None]:
    """The network and compute calibrations at these paths (None where no path is given).

    The compute one is a ``commsim-compute`` calibration, or a ``commbench --step`` measurement
    (returned as its JSON object: ``compute_calibration_for`` fits it once the GPU is known).
    """
    return (
        _load_file("--calibration", network, load_calibration),
        _load_file("--compute-calibration", compute, load_compute_source),
    )


def _load_file(flag: str, path: Path | None, loader: Callable[[Path], Any]) -> Any:
    if path is None:
        return None
    require_file(path, f"{flag} file")
    return loader(path)


def compute_calibration_for(
    source: ComputeCalibration | dict[str, Any] | None,
    gpu: GPUSpec,
    *,
    warn: Callable[[str], None],
) -> ComputeCalibration | None:
    """A compute calibration for ``gpu``: as loaded, or fitted to a step measurement; a
    CPU-measured calibration keeps only its CPU Adam rate, which ``warn`` is told."""
    if not isinstance(source, dict):
        from sim.replay.offload import host_part

        host = host_part(source, gpu)
        if host is not source:
            warn(
                "--compute-calibration was measured on the CPU: only its CPU Adam rate is used "
                "(the step of an offloaded optimizer)"
            )
        return host
    from sim.replay.step_fit import calibration_from_step

    try:
        return calibration_from_step(source, gpu)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"--compute-calibration: malformed step measurement ({exc})") from None


def calibration_mismatch(calibration: Calibration, plan: Plan) -> str | None:
    """A note when a network calibration was fitted on another node preset than the plan's."""
    return node_mismatch(calibration, plan.cluster.node)


def node_mismatch(calibration: Calibration, node: Any) -> str | None:
    """A note when a network calibration was fitted on another node preset than ``node``
    (a preset name; anything else, such as a cluster file or a mapping, is not compared)."""
    from topologies.presets import NODE_PRESETS

    fitted_on = calibration.topology
    if fitted_on not in NODE_PRESETS or not isinstance(node, str) or node == fitted_on:
        return None
    if node in NODE_PRESETS and NODE_PRESETS[node].intra != NODE_PRESETS[fitted_on].intra:
        return (
            f"fitted on another intra-node fabric ({fitted_on!r}: "
            f"{NODE_PRESETS[fitted_on].intra}) than {node!r} "
            f"({NODE_PRESETS[node].intra}): its efficiencies would move data faster than the "
            "links allow"
        )
    return (
        f"fitted on {fitted_on!r}, not on {node!r}; its latencies and "
        "efficiencies are applied as they are"
    )
