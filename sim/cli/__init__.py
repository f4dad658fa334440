"""The ``commsim`` command line: ``main`` dispatches to one thin module per sub-command.

Each module (``topo``, ``collective``, ``calibrate``, ``compare``, ``plan``, ``fit``, ``search``,
``validate``) parses its flags, calls the library and prints; no model decision lives here. What
several commands share (flags, loading plans, calibrations and measured results) is in
``sim.inputs``: a command module imports no other ``sim.cli`` module, and only ``main`` (the
dispatcher) loads the commands. May import every other ``sim`` sub-package.
"""
