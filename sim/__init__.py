"""commsim: a SimPy discrete-event simulator of GPU clusters, calibrated from measured collectives.

Torch-free: ``import sim`` and the ``commsim`` command never import torch.

The sub-packages, each owning one concern, listed in import order (a package imports only the
ones above it, plus ``topologies``, ``schedules``, ``vocab`` and ``fileio``; never ``comm_bench``):

- ``sim.network``: collectives on a topology: algorithms, NCCL protocols, the analytical and
  flow models, network calibration, simulated-vs-measured comparison.
- ``sim.compute``: prices the kernels ``schedules.kernels`` describes: roofline, fitted curves.
- ``sim.replay``: the SimPy engine, programs on per-GPU streams, folding, ``simulate_plan``.
- ``sim.output``: the plan report, the Chrome trace and the timeline plot.
- ``sim.validation``: published training runs as plans, and the error per source.
- ``sim.inputs``: what the user gives, loaded: plan files, calibrations, measured results,
  topology flags.
- ``sim.cli``: one thin module per ``commsim`` sub-command; none imports another.

    from sim import simulate_plan      # the library entry point (sim.replay.simulate)
"""

from __future__ import annotations

from typing import Any

__all__ = ["simulate_plan"]


def __getattr__(name: str) -> Any:
    # Loaded on first use so ``import sim`` stays cheap and free of circles.
    if name == "simulate_plan":
        from sim.replay.simulate import simulate_plan

        return simulate_plan
    raise AttributeError(f"module 'sim' has no attribute {name!r}")
