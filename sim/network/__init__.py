"""The network model: how long a collective takes on a topology.

``protocols`` (NCCL's LL/LL128/Simple), ``analytical`` (closed-form alpha-beta cost per
algorithm), ``algorithms`` (which algorithm NCCL picks; a collective as flows on paths),
``flow`` (max-min fair sharing of links among concurrent flows), ``model`` (``CommModel``: the
one entry the replay calls, at either fidelity), ``calibration`` (fitting the parameters to
measured results) and ``compare`` (simulated against measured). Imports ``topologies`` and the
torch-free ``comm_bench`` modules; nothing else from ``sim``.
"""
