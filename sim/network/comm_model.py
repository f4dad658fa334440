"""The network model the simulator calls: collectives on a topology, at two fidelities.

``analytical``: each collective takes its closed-form time (``sim/network/analytical.py``),
independent of anything else running. ``flow``: each collective becomes flow groups on topology
paths (``sim/network/algorithms.py``) sharing link capacity max-min fairly with every other
transfer in flight (``sim/network/flow.py``), so concurrent collectives contend. Both use the
same parameters (latencies and the efficiency curve, calibrated or default) and run the
(algorithm, protocol) NCCL's tuner picks (``sim/network/nccl_tuner.py``): the flow model moves
each flow's bytes times the closed form's bandwidth seconds over its link-rate seconds, so the
protocol's factor, caps, start-up and efficiency apply to contended links too.

    model = CommModel(env, build_cluster("dgx-h100"), fidelity="flow"); done = model.run(
        "all_reduce", range(8), 1 << 30)
"""

from __future__ import annotations

from collections.abc import Sequence

import simpy

from sim.network.algorithms import choose, decompose, placement_of
from sim.network.analytical import ALGORITHMS, CommParams, CostTerms, GroupPlacement, cost_terms
from sim.network.calibration import UNCALIBRATED, Calibration
from sim.network.flow import FlowNetwork, Path
from topologies.topology import Topology
from vocab.collectives import canonical_op

FIDELITIES = ("analytical", "flow")
"""Network model fidelities."""


class CommModel:
    """Times collectives on ``topology``; under ``flow`` concurrent ones share the links."""

    def __init__(
        self,
        env: simpy.Environment,
        topology: Topology,
        *,
        fidelity: str = "analytical",
        calibration: Calibration | None = None,
        algo: str = "auto",
    ) -> None:
        """Bind the model to a SimPy environment and a topology."""
        if fidelity not in FIDELITIES:
            raise ValueError(f"unknown fidelity {fidelity!r}; valid: {', '.join(FIDELITIES)}")
        check_algo_name(algo)
        self.env = env
        self.topology = topology
        self.fidelity = fidelity
        self.calibration = calibration or UNCALIBRATED
        self.algo = algo
        self._layouts: dict[tuple[int, ...], GroupPlacement] = {}
        self.network: FlowNetwork | None = None
        if fidelity == "flow":
            graph = topology.graph
            capacities = {
                (u, v): float(d["effective_bandwidth_bytes_per_s"])
                for u, v, d in graph.edges(data=True)
            }
            self.network = FlowNetwork(env, capacities)

    def layout(self, ranks: Sequence[int]) -> GroupPlacement:
        """The group's layout, read off the topology once per rank tuple."""
        group = tuple(ranks)
        found = self._layouts.get(group)
        if found is None:
            found = placement_of(self.topology, group)
            self._layouts[group] = found
        return found

    def params(self, op: str, algo: str, layout: GroupPlacement) -> CommParams:
        """Calibrated (or fallback/default) parameters of (op, algo) for this group's scope."""
        return self.calibration.lookup(op, algo, scope_of(layout))[0]

    def choice(
        self, op: str, ranks: Sequence[int], size_bytes: float, algo: str | None = None
    ) -> tuple[str, str | None]:
        """(algorithm, protocol) that will run: the forced algorithm (checked) with the protocol
        NCCL's tuner gives it, or the tuner's pick."""
        op = canonical_op(op)
        chosen = self.algo if algo is None else algo
        check_algo_name(chosen)
        return choose(op, self.layout(ranks), size_bytes, chosen)

    def algorithm(
        self, op: str, ranks: Sequence[int], size_bytes: float, algo: str | None = None
    ) -> str:
        """The algorithm that will run: the forced one (checked), or auto's pick."""
        return self.choice(op, ranks, size_bytes, algo)[0]

    def _priced(
        self, op: str, ranks: Sequence[int], size_bytes: float, algo: str | None
    ) -> tuple[str, CommParams, CostTerms]:
        """(algorithm, parameters, cost terms) of one collective: the tuner's protocol applies
        unless the parameters force one."""
        layout = self.layout(ranks)
        chosen, protocol = self.choice(op, ranks, size_bytes, algo)
        params = self.params(op, chosen, layout)
        keep = protocol if params.protocol == "auto" else None
        return chosen, params, cost_terms(op, chosen, layout, size_bytes, keep)

    def estimate_s(
        self, op: str, ranks: Sequence[int], size_bytes: float, *, algo: str | None = None
    ) -> float:
        """Closed-form seconds of one collective alone on the network."""
        op = canonical_op(op)
        _check_op_ranks(op, ranks)
        _, params, terms = self._priced(op, ranks, size_bytes, algo)
        return terms.time_s(params, size_bytes)

    def run(
        self,
        op: str,
        ranks: Sequence[int],
        size_bytes: float,
        *,
        algo: str | None = None,
        root: int = 0,
    ) -> simpy.Event:
        """Start ``op`` on global ``ranks`` now; the event succeeds when it completes.

        ``root`` is the root's position in ``ranks`` (broadcast, reduce). ``send_recv`` on
        (src, dst) is one transfer; on more ranks it is nccl-tests' sendrecv: every rank sends
        to the next and receives from the previous, all at once.
        """
        op = canonical_op(op)
        _check_op_ranks(op, ranks)
        if not 0 <= root < len(ranks):
            raise ValueError(f"root {root} out of range for a group of {len(ranks)} ranks")
        if self.network is None:
            return self.env.timeout(self.estimate_s(op, ranks, size_bytes, algo=algo))
        latency_s, transfers = self.transfers(op, ranks, size_bytes, algo=algo, root=root)
        if not transfers:
            return self.env.timeout(latency_s)
        events = [
            self.network.transfer(paths, size, latency_s=latency_s) for paths, size in transfers
        ]
        return self.env.all_of(events)

    def transfers(
        self,
        op: str,
        ranks: Sequence[int],
        size_bytes: float,
        *,
        algo: str | None = None,
        root: int = 0,
    ) -> tuple[float, list[tuple[tuple[Path, ...], float]]]:
        """What the flow model moves for one collective: its latency, and per flow group its
        paths and bytes (the algorithm's bytes times the protocol's factor, cap, start-up and
        the efficiency curve, as a byte multiplier); no groups when nothing moves."""
        op = canonical_op(op)
        _check_op_ranks(op, ranks)
        layout = self.layout(ranks)
        chosen, params, terms = self._priced(op, ranks, size_bytes, algo)
        _, latency_s, bandwidth_s = terms.split_s(params, size_bytes)
        groups = decompose(op, chosen, self.topology, ranks, size_bytes, root=root, layout=layout)
        if not groups or terms.bandwidth_time_s == 0:
            return latency_s, []
        scale = bandwidth_s / terms.bandwidth_time_s
        return latency_s, [(tuple(g.paths), g.size_bytes * scale) for g in groups]


def scope_of(layout: GroupPlacement) -> str:
    """``intra`` when the group sits on one node, else ``inter``."""
    return "intra" if layout.num_nodes == 1 else "inter"


def check_algo_name(algo: str) -> None:
    """ValueError unless ``algo`` is ``auto`` or a known algorithm."""
    if algo != "auto" and algo not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algo!r}; valid: auto, {', '.join(ALGORITHMS)}")


def _check_op_ranks(op: str, ranks: Sequence[int]) -> None:
    if op == "send_recv" and len(ranks) < 2:
        raise ValueError(f"send_recv takes ranks=(src, dst) or a ring of >= 2, got {list(ranks)}")
