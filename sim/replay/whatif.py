"""What-ifs on the replay: slower GPUs, a degraded or failed NIC, a second job on the NICs.

``schedules.whatif`` says what changes; here it is applied:

- **slow GPU / server**: the rank's compute-stream kernels take ``1 + slowdown`` times as long
  (host launches unchanged); a GPU on a slow server that is also slow itself takes both factors;
- **NIC at a fraction**: every network link of that NIC, both directions, keeps ``fraction`` of
  its bandwidth; the collectives of every group with a GPU behind it run at that GPU's rate
  (ring and tree channels move at their slowest member's network rate: ``placement_of`` takes
  the minimum over the group);
- **NIC down**: NCCL leaves the NIC out when it builds its graphs and the GPUs behind it send
  through the NIC of the next GPU of the same server (PXN over NVLink, ``NCCL_PXN_DISABLE=0``
  is NCCL's default on NVSwitch servers), which then carries two GPUs' traffic;
- **second job**: another job's traffic holds ``share`` of every NIC link of those servers, both
  directions, for the whole step (its own collectives at a steady rate) or in bursts; given as
  its own collectives (an op of a size every period), ``collective_jobs`` turns it into a
  share and bursts: while it runs it holds ``COLLECTIVE_JOB_SHARE`` of the NICs (two jobs'
  flows share a NIC fairly), so its collective takes ``1 / COLLECTIVE_JOB_SHARE`` times its
  time alone, and that is its busy part of each period.

Ranks stay identical unless a what-if singles some out; ``whatif_ranks`` then simulates one
rank per class of ranks the what-if cannot tell apart (``sim.replay.folding``).

    topology = degraded_topology(topology, whatif); factors = slowdowns(whatif, topology)
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Generator, Hashable, Mapping, Sequence
from typing import Any

import networkx as nx
import simpy

from schedules.actions import Compute, Program
from schedules.layout import Layout
from schedules.whatif import SecondJob, WhatIf
from sim.network.algorithms import fabric_factor, group_nodes
from sim.network.flow import Edge, FlowNetwork
from sim.replay.engine import ClosedFormRunner
from sim.replay.folding import class_ranks, simulated_ranks
from topologies.topology import FABRIC_KINDS, Topology

_BANDWIDTHS = ("bandwidth_bytes_per_s", "effective_bandwidth_bytes_per_s")


def check_whatif(whatif: WhatIf, topology: Topology) -> None:
    """ValueError naming the first rank or server the cluster does not have, or a NIC what-if
    on GPUs without a NIC."""
    for rank in [g.rank for g in whatif.slow_gpus] + [n.rank for n in whatif.nics]:
        if not 0 <= rank < topology.num_gpus:
            raise ValueError(
                f"whatif rank {rank}: the cluster has ranks 0..{topology.num_gpus - 1}"
            )
    nodes = [n.node for n in whatif.slow_nodes] + [n for j in whatif.second_job for n in j.nodes]
    for node in nodes:
        if not 0 <= node < topology.num_nodes:
            raise ValueError(
                f"whatif server {node}: the cluster has servers 0..{topology.num_nodes - 1}"
            )
    if (whatif.nics or whatif.second_job) and topology.num_nodes == 1:
        raise ValueError(
            "whatif nics / second_job: this plan runs on one server, whose collectives never "
            "cross a NIC"
        )
    for nic in whatif.nics:
        if topology.graph.nodes[topology.gpus[nic.rank]].get("nic") is None:
            raise ValueError(f"whatif nic of rank {nic.rank}: that GPU has no NIC")
    graph = topology.graph
    for link in whatif.links:
        a, b = link.between
        for end in (a, b):
            if end not in graph or graph.nodes[end]["kind"] not in FABRIC_KINDS:
                raise ValueError(
                    f"whatif link {a}-{b}: {end!r} is not a switch of this cluster's fabric "
                    f"({_switch_names(graph)})"
                )
        if not graph.has_edge(a, b):
            raise ValueError(f"whatif link {a}-{b}: those switches are not linked")


def collective_jobs(whatif: WhatIf, topology: Topology, estimate_s: Callable[..., float]) -> WhatIf:
    """The what-if with each second job given as its collectives turned into a share and
    bursts: one of its collectives over every GPU of its servers alone on ``topology``
    (``estimate_s``, the closed form) takes ``collective_s``; at its ``share`` of the NICs it
    takes ``collective_s / share``, which is its ``busy`` part of each period (1: it never
    stops, and holds its share steadily)."""
    jobs = []
    for job in whatif.second_job:
        if job.op is not None:
            assert job.period_s is not None
            ranks = [r for r in range(topology.num_gpus) if topology.node_index(r) in job.nodes]
            alone = estimate_s(job.op, ranks, job.size_bytes)
            busy = min(1.0, alone / job.share / job.period_s)
            job = dataclasses.replace(job, busy=busy, collective_s=alone)
        jobs.append(job)
    return dataclasses.replace(whatif, second_job=tuple(jobs))


def slowdowns(whatif: WhatIf, topology: Topology) -> dict[int, float]:
    """Kernel-time multiplier per slowed rank."""
    factors: dict[int, float] = {}
    for node in whatif.slow_nodes:
        for rank in range(topology.num_gpus):
            if topology.node_index(rank) == node.node:
                factors[rank] = factors.get(rank, 1.0) * (1.0 + node.slowdown)
    for gpu in whatif.slow_gpus:
        factors[gpu.rank] = factors.get(gpu.rank, 1.0) * (1.0 + gpu.slowdown)
    return factors


def slowed_programs(programs: Sequence[Program], factors: dict[int, float]) -> list[Program]:
    """``programs`` with each slowed rank's compute-stream kernels stretched."""
    out = []
    for program in programs:
        factor = factors.get(program.rank)
        if factor is None:
            out.append(program)
            continue
        actions = tuple(
            dataclasses.replace(a, duration_s=a.duration_s * factor)
            if isinstance(a, Compute) and a.stream == "compute"
            else a
            for a in program.actions
        )
        out.append(dataclasses.replace(program, actions=actions))
    return out


def _switch_names(graph: nx.DiGraph) -> str:
    """The fabric's switches as name ranges, first to last in numeric order, per naming pattern:
    "leaf0..leaf7 (8), spine0..spine31 (32)"."""
    groups: dict[str, list[str]] = {}
    for n, kind in graph.nodes(data="kind"):
        if kind in FABRIC_KINDS:
            groups.setdefault(re.sub(r"\d+", "#", n), []).append(n)
    if not groups:
        return "it has none: one switch or none between its servers"

    def number(name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in re.findall(r"\d+", name))

    parts = []
    for names in groups.values():
        names.sort(key=number)
        parts.append(f"{names[0]}..{names[-1]} ({len(names)})" if len(names) > 1 else names[0])
    return ", ".join(parts)


def _nic(topology: Topology, rank: int) -> str:
    nic: str = topology.graph.nodes[topology.gpus[rank]]["nic"]
    return nic


def _scale_nic(graph: nx.DiGraph, nic: str, keep: float) -> None:
    """Every network link into and out of ``nic`` keeps ``keep`` of its bandwidth."""
    for u, v, data in (*graph.out_edges(nic, data=True), *graph.in_edges(nic, data=True)):
        if data["kind"] == "network":
            for attr in _BANDWIDTHS:
                graph.edges[u, v][attr] = data[attr] * keep


def degraded_topology(topology: Topology, whatif: WhatIf) -> Topology:
    """A copy of ``topology`` with the NIC and link what-ifs applied (``topology`` itself when
    none). A link down is taken out of the graph: the fabric's up/down routing then goes
    through the switch's other links (ValueError when it has none left up)."""
    if not whatif.nics and not whatif.second_job and not whatif.links:
        return topology
    graph = topology.graph.copy()
    for link in whatif.links:
        a, b = link.between
        for u, v in ((a, b), (b, a)):
            if link.fraction == 0:  # kept, marked: routing goes around it (topology.py)
                graph.edges[u, v]["down"] = True
            else:
                for attr in _BANDWIDTHS:
                    graph.edges[u, v][attr] *= link.fraction
        if link.fraction == 0:
            lower = a if graph.nodes[a]["tier"] < graph.nodes[b]["tier"] else b
            if not any(
                graph.nodes[m].get("tier", 0) > graph.nodes[lower]["tier"] and not data.get("down")
                for m, data in graph[lower].items()
            ):
                raise ValueError(
                    f"whatif link {a}-{b} down: {lower} has no other link up the fabric"
                )
    for job in whatif.second_job:
        if job.op is not None and job.collective_s is None:
            raise RuntimeError("a second job given as collectives needs collective_jobs first")
        nics = {
            _nic(topology, r)
            for r in range(topology.num_gpus)
            if topology.node_index(r) in job.nodes
        }
        for nic in nics:
            _scale_nic(graph, nic, 1.0 - job.share)
    failed = {_nic(topology, n.rank) for n in whatif.nics if n.fraction == 0}
    for entry in whatif.nics:
        if entry.fraction > 0:
            _scale_nic(graph, _nic(topology, entry.rank), entry.fraction)
    for rank in range(topology.num_gpus):  # down: its GPUs move to the next GPU's live NIC
        if _nic(topology, rank) in failed:
            graph.nodes[topology.gpus[rank]]["nic"] = _peer_nic(topology, rank, failed)
    degraded = Topology(
        graph,
        name=f"{topology.name} (what-if)",
        num_nodes=topology.num_nodes,
        node=topology.node,
        fabric=topology.fabric,
        nccl_version=topology.nccl_version,
    )
    everywhere = all(len(j.nodes) == topology.num_nodes for j in whatif.second_job)
    degraded.uniform = topology.uniform and everywhere and not whatif.nics and not whatif.links
    if whatif.links:  # the same cluster with every what-if but the links
        degraded.intact = degraded_topology(topology, dataclasses.replace(whatif, links=()))
    return degraded


def _peer_nic(topology: Topology, rank: int, failed: set[str]) -> str:
    """The NIC of the next GPU of ``rank``'s server whose NIC has not ``failed``."""
    per_node = topology.gpus_per_node
    first = topology.node_index(rank) * per_node
    local = topology.local_index(rank)
    for step in range(1, per_node):
        peer = first + (local + step) % per_node
        nic = topology.graph.nodes[topology.gpus[peer]].get("nic")
        if nic is not None and nic not in failed:
            return str(nic)
    raise ValueError(f"whatif nic of rank {rank} down: its server has no working NIC left")


def signatures(whatif: WhatIf, topology: Topology, degraded: Topology) -> dict[int, Hashable]:
    """How the what-if treats each rank it changes: (kernel-time factor, the rank's network
    rate relative to the plain cluster's). Ranks it leaves alone are not listed."""
    factors = slowdowns(whatif, topology)
    out: dict[int, Hashable] = {}
    changed_network = degraded is not topology
    jobs = bursty_jobs(whatif)
    for rank in range(topology.num_gpus):
        ratio = 1.0
        if changed_network:
            plain = topology.injection_bandwidth_bytes_per_s(rank, "network")
            now = degraded.injection_bandwidth_bytes_per_s(rank, "network")
            ratio = round(now / plain, 9) if plain > 0 else 1.0
        factor = factors.get(rank, 1.0)
        node = topology.node_index(rank)
        # the bursts its NICs see (steady and bursty jobs of one share are not alike)
        bursts = tuple(
            (job.period_s, job.busy, job.offset_s, job.share) for job in jobs if node in job.nodes
        )
        if factor != 1.0 or ratio != 1.0 or bursts:
            out[rank] = (factor, ratio, bursts)
    return out


LINK_GROUP_KINDS = ("tp", "cp", "dp", "dpcp", "embd", "mp", "world")
"""The groups a rank's collectives run on in the replay (``step_replay``: tp, cp, the gradient
sync over dp or dp x cp, the tied embeddings' first and last stage, the gradient norm's
model-parallel or world group), besides its pipeline neighbours."""


def link_signatures(
    layout: Layout, degraded: Topology, signed: Mapping[int, Hashable]
) -> dict[int, Hashable]:
    """How a switch link what-if treats each rank under the analytical model: the share of its
    rate each group the rank communicates in keeps (``algorithms.fabric_factor``): its
    ``LINK_GROUP_KINDS`` groups and the pairs with its previous and next pipeline stage, merged
    with what ``signed`` already says of the rank. Ranks whose groups all keep their rate are
    left out. Ranks of one class (``folding.class_ranks``) then time every collective alike."""
    factors: dict[tuple[int, ...], float] = {}

    def factor(group: tuple[int, ...]) -> float:
        found = factors.get(group)
        if found is None:
            found = factors[group] = round(fabric_factor(degraded, group_nodes(degraded, group)), 9)
        return found

    out: dict[int, Hashable] = {}
    for rank in range(layout.world_size):
        coords = layout.coords(rank)
        groups = [layout.group(kind, rank) for kind in LINK_GROUP_KINDS]
        if layout.pp > 1:
            for step in (-1, 1):
                peer = layout.rank(**{**coords, "pp": (coords["pp"] + step) % layout.pp})
                groups.append((rank, peer))
        shares = tuple(factor(group) for group in groups)
        if any(share != 1.0 for share in shares):
            out[rank] = (signed.get(rank), shares)
    return out


def special_ranks(signed: Mapping[int, Hashable], topology: Topology) -> set[int]:
    """The ranks a what-if singles out: those it changes, unless it changes every rank alike
    (a second job on every server)."""
    if len(signed) == topology.num_gpus and len(set(signed.values())) == 1:
        return set()
    return set(signed)


def whatif_ranks(
    layout: Layout, signed: Mapping[int, Hashable], *, fold: bool, by_classes: bool
) -> tuple[int, ...]:
    """The ranks to simulate: the folding's when the what-if singles no rank out (or ``fold``
    is off), one per class of ranks it cannot tell apart (``folding.class_ranks``) when
    ``by_classes``, else every rank."""
    if not signed or not fold:
        return simulated_ranks(layout, fold=fold)
    return class_ranks(layout, signed) if by_classes else tuple(range(layout.world_size))


def culprits(whatif: WhatIf, topology: Topology) -> list[int]:
    """The ranks a what-if acts on directly, in its order: slowed GPUs (a slow server's first
    GPU), then the GPUs behind a changed NIC."""
    found = [g.rank for g in whatif.slow_gpus]
    found += [n.node * topology.gpus_per_node for n in whatif.slow_nodes]
    found += [n.rank for n in whatif.nics]
    return list(dict.fromkeys(found))


class BurstyRunner(ClosedFormRunner):
    """Closed-form collectives while second jobs' traffic comes and goes (``SecondJob.bursty``):
    a collective advances at the pace of the network of each moment, ``1 / T(state)`` of its
    work per second where ``T(state)`` is its closed-form time with the jobs that hold the NICs
    then, from one burst edge to the next, until its work is done. A job whose bursts are much
    shorter than the collective gives the harmonic mean of the two paces, weighted by its busy
    fraction; one burst longer than the step is the steady share while it lasts. The latency
    part of the closed form is paced the same way (a simplification: it does not depend on the
    NICs' rate)."""

    def __init__(
        self,
        env: simpy.Environment,
        jobs: Sequence[SecondJob],
        estimate_for: Callable[[frozenset[int]], Callable[..., float]],
    ) -> None:
        super().__init__(env, estimate_for(frozenset()))
        self.jobs = tuple(jobs)
        self._estimate_for = estimate_for
        self._estimates: dict[frozenset[int], Callable[..., float]] = {}
        self._times: dict[tuple[frozenset[int], str, tuple[int, ...], float], float] = {}

    def _seconds_in(
        self, state: frozenset[int], op: str, ranks: tuple[int, ...], size_bytes: float
    ) -> float:
        key = (state, op, ranks, size_bytes)
        found = self._times.get(key)
        if found is None:
            estimate = self._estimates.get(state)
            if estimate is None:
                estimate = self._estimates[state] = self._estimate_for(state)
            found = self._times[key] = estimate(op, ranks, size_bytes)
        return found

    def duration_s(
        self, op: str, ranks: Sequence[int], size_bytes: float, repeat: int = 1
    ) -> float:
        """How long ``repeat`` calls started now take, through the bursts they meet."""
        group = tuple(ranks)
        now = self.env.now
        jobs = self.jobs
        work, elapsed = float(repeat), 0.0
        while True:
            edge = min(job.next_change_s(now) for job in jobs)
            state = state_between(jobs, now, edge)
            pace = self._seconds_in(state, op, group, size_bytes)
            if pace <= 0:
                return elapsed
            if edge == math.inf or (edge - now) / pace >= work:
                return elapsed + work * pace
            if len(jobs) == 1:  # whole periods at once: on and off paces alternate
                job = jobs[0]
                assert job.period_s is not None
                on = self._seconds_in(frozenset({0}), op, group, size_bytes)
                off = self._seconds_in(frozenset(), op, group, size_bytes)
                if on == off:
                    return elapsed + work * pace
                per_period = job.busy * job.period_s / on + (1 - job.busy) * job.period_s / off
                periods = math.floor(work / per_period) - 1
                if periods > 0:
                    work -= periods * per_period
                    elapsed += periods * job.period_s
                    now += periods * job.period_s
                    continue
            work -= (edge - now) / pace
            elapsed += edge - now
            now = edge


def state_between(jobs: Sequence[SecondJob], start_s: float, edge_s: float) -> frozenset[int]:
    """The jobs that hold the NICs from ``start_s`` to the next edge ``edge_s``, read in the
    middle of the stretch (an edge computed in floating point may fall a hair before or after
    the phase it opens)."""
    middle = start_s + 1.0 if edge_s == math.inf else (start_s + edge_s) / 2
    return frozenset(i for i, job in enumerate(jobs) if job.on_at(middle))


def bursty_jobs(whatif: WhatIf) -> tuple[SecondJob, ...]:
    """The second jobs whose traffic comes and goes within the step."""
    return tuple(job for job in whatif.second_job if job.bursty)


def _holding(whatif: WhatIf, state: frozenset[int]) -> WhatIf:
    """The what-if with its bursty jobs in ``state`` holding the NICs steadily, the others
    gone (steady jobs and every other change kept)."""
    jobs = bursty_jobs(whatif)
    steady = tuple(job for job in whatif.second_job if not job.bursty)
    held = tuple(dataclasses.replace(jobs[i], period_s=None, busy=1.0) for i in sorted(state))
    return dataclasses.replace(whatif, second_job=steady + held)


def calm_topology(plain: Topology, whatif: WhatIf) -> Topology:
    """``plain`` with the what-if applied while no bursty job holds the NICs."""
    return degraded_topology(plain, _holding(whatif, frozenset()))


MIN_SHARED_BURST_PERIOD_S = 1e-3
"""Shortest burst period of each job when several are in bursts (the analytical pace walks
from edge to edge; one job's whole periods are skipped at once)."""
MIN_FLOW_BURST_PERIOD_S = 1e-3
"""Shortest burst period the flow model re-rates through (two re-ratings per period)."""


def check_flow_period(job: SecondJob, why: str) -> None:
    """ValueError unless ``job`` repeats every ``MIN_FLOW_BURST_PERIOD_S`` or less often, as
    the flow model needs (``why``: the reason, ending where the bound's words begin)."""
    assert job.period_s is not None
    if job.period_s < MIN_FLOW_BURST_PERIOD_S:
        raise ValueError(
            f"whatif second_job period_ms {job.period_s * 1e3:g}: {why} period_ms >= "
            f"{MIN_FLOW_BURST_PERIOD_S * 1e3:g} there; finer ones: the analytical model"
        )


def toggle_bursts(
    env: simpy.Environment,
    network: FlowNetwork,
    whatif: WhatIf,
    plain: Topology,
    *,
    stop: simpy.Event | None = None,
) -> None:
    """Under the flow model: at every edge of the bursty jobs' bursts, set the NIC links to
    the capacities of the jobs that hold them from then on (the links that differ between
    states only); stops once nothing else is left to happen, or at ``stop``."""
    jobs = bursty_jobs(whatif)
    for job in jobs:
        why = "the flow model re-rates the links at every burst edge, so bursts need"
        check_flow_period(job, why)
    attr = "effective_bandwidth_bytes_per_s"
    calm = degraded_topology(plain, _holding(whatif, frozenset())).graph
    busy = degraded_topology(plain, _holding(whatif, frozenset(range(len(jobs))))).graph
    varying = [(u, v) for u, v, d in calm.edges(data=True) if busy.edges[u, v][attr] != d[attr]]
    capacities: dict[frozenset[int], dict[Edge, float]] = {}

    def capacities_in(state: frozenset[int]) -> dict[Edge, float]:
        found = capacities.get(state)
        if found is None:
            graph = degraded_topology(plain, _holding(whatif, state)).graph
            found = capacities[state] = {e: float(graph.edges[e][attr]) for e in varying}
        return found

    def run() -> Generator[simpy.Event, Any, None]:
        while True:
            edge = min(job.next_change_s(env.now) for job in jobs)
            network.set_capacities(capacities_in(state_between(jobs, env.now, edge)))
            yield env.timeout(edge - env.now)
            # nothing but this left, or the step over: stop
            if env.peek() == math.inf or (stop is not None and stop.triggered):
                return

    env.process(run())


def bursty_runner(
    env: simpy.Environment,
    whatif: WhatIf,
    plain: Topology,
    estimate_on: Callable[[Topology], Callable[..., float]],
) -> BurstyRunner:
    """A ``BurstyRunner`` over ``plain`` with the what-if's other changes applied throughout
    and each bursty job's share while it holds the NICs (``estimate_on`` prices a topology)."""
    jobs = bursty_jobs(whatif)
    if len(jobs) > 1 and any((job.period_s or 0) < MIN_SHARED_BURST_PERIOD_S for job in jobs):
        raise ValueError(
            f"whatif second_job: with {len(jobs)} jobs in bursts each needs period_ms >= "
            f"{MIN_SHARED_BURST_PERIOD_S * 1e3:g} (their collectives are paced from edge to "
            "edge); one job alone may burst faster"
        )

    def estimate_for(state: frozenset[int]) -> Callable[..., float]:
        return estimate_on(degraded_topology(plain, _holding(whatif, state)))

    return BurstyRunner(env, jobs, estimate_for)
