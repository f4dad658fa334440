"""The network model: how long a collective takes on a topology.

``nccl_tables`` (NCCL's tuning constants, read once from its source), ``nccl_graph`` (NCCL's
channel graphs estimated from the hardware), ``nccl_tuner`` (NCCL's own predicted times and the
(algorithm, protocol) it picks), ``plugin_tuner`` (aws-ofi-nccl's region tuner on AWS p5),
``protocols`` (LL/LL128/Simple as time-model data), ``terms`` (the values passed around),
``analytical`` and ``hierarchy`` (closed-form alpha-beta cost per algorithm, in-network reduction
included), ``algorithms`` and ``tiered_flows`` (a collective as flows on paths), ``flow`` (max-min
fair sharing of links among concurrent flows), ``model`` (``CommModel``: the one entry the replay
calls, at either fidelity), ``calibration`` and ``fitting`` (the fitted parameters and fitting them
to measured results) and ``compare`` (simulated against measured). Imports ``topologies`` and
``vocab``; nothing else from ``sim``.
"""
