"""The ``commsim`` command line: ``main`` dispatches to one thin module per sub-command.

Each module (``topo``, ``collective``, ``calibrate``, ``compare``, ``plan``, ``validate``) parses
its flags, calls the library and prints; no model decision lives here. May import every other
``sim`` sub-package.
"""
