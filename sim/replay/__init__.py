"""The replay: a training step as programs on per-GPU streams, run by a SimPy engine.

``engine`` (streams, collectives that start when every member issued them, one queue per
group), ``programs`` (builds each rank's program from ``schedules`` and prices it with
``sim.compute``), ``folding`` (which ranks stand for their symmetric peers), ``simulate``
(``simulate_plan``: plan + topology + calibrations -> ``PlanResult``) and ``result`` (spans and
results). Imports ``sim.network`` and ``sim.compute``.
"""
