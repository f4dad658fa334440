"""What the user gives the commands, loaded: plan files, calibrations, measured results, topology
choices.

``plans`` (a plan file, or one assembled from it, other projects' configs and cluster flags),
``calibrations`` (network and compute calibration files, and the policy that fits a compute
calibration to the plan's GPU), ``measured`` (measured collectives read, filtered and checked)
and ``topology`` (the topology flags and the topologies they build). Library code: the argparse
argument groups it defines print nothing, and whatever it has to tell the user goes through a
``warn`` or ``note`` callback the command supplies. Imports ``sim.network``, ``sim.compute`` and
``sim.replay``; only ``sim.cli`` imports it.

    from sim.inputs.plans import load_plan_file; plan = load_plan_file(Path("plan.yaml"))
"""
