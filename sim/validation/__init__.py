"""Published training runs as plans, and how far the simulator is from them.

``measured`` (the published measurements and their FLOP conventions), ``cases`` (each run
mapped to a plan, or the reason it cannot be), ``fit`` (compute calibration fitted on a few
runs) and ``runner`` (simulate every case, error per source). Imports ``sim.replay``,
``sim.compute`` and ``sim.network``.
"""
