"""Max-min fair sharing of link bandwidth among concurrent transfers, on SimPy.

A *transfer* moves ``size_bytes`` along one or more paths (tuples of directed edges) at one
common rate: a point-to-point send has one path; a ring channel in steady state is n paths that
advance in lockstep (the ring moves at its slowest link). After its start latency a transfer
competes for bandwidth: every link's capacity is split max-min fairly (progressive filling)
among the transfers that use it, each counted as many times as its paths cross the link.

Rates are recomputed only when a transfer starts or ends, only for the connected component of
transfers that share links (transitively) with the ones that changed, and once per simulated
instant (all changes at one time are batched). Each transfer's completion is a timeout that is
rescheduled whenever its rate changes; stale timeouts are ignored.

    net = FlowNetwork(env, {("a", "b"): 1e9}); done = net.transfer([(("a", "b"),)], 1e6)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence

import simpy

Edge = tuple[Hashable, Hashable]
"""A directed link, as (tail node, head node)."""

Path = tuple[Edge, ...]
"""Directed edges from source to destination."""

_TIE = 1e-12
"""Relative tolerance under which two fair shares count as the same bottleneck level."""


class _Transfer:
    """Mutable state of one transfer in flight (internal)."""

    __slots__ = ("done", "id", "rate", "remaining", "updated_s", "usage", "version")

    def __init__(
        self, transfer_id: int, usage: dict[Hashable, int], size: float, done: simpy.Event
    ):
        self.id = transfer_id
        self.usage = usage
        self.remaining = size
        self.rate = 0.0
        self.updated_s = 0.0
        self.version = 0
        self.done = done


class FlowNetwork:
    """Links with capacities shared max-min fairly by the transfers crossing them."""

    def __init__(self, env: simpy.Environment, capacities: Mapping[Edge, float]) -> None:
        """Build a network over ``capacities`` (bytes/s per directed edge)."""
        for edge, capacity in capacities.items():
            if not capacity > 0:
                raise ValueError(f"link {edge} must have a capacity > 0 bytes/s, got {capacity}")
        self.env = env
        self._capacity: dict[Hashable, float] = {e: float(c) for e, c in capacities.items()}
        self._on_link: dict[Hashable, dict[int, None]] = {}
        self._active: dict[int, _Transfer] = {}
        self._dirty: dict[int, None] = {}
        self._pending = False
        self._next_id = 0
        self.num_recomputes = 0
        """How many times rates were recomputed (a cost counter for benchmarks)."""

    def transfer(
        self,
        paths: Sequence[Path],
        size_bytes: float,
        *,
        latency_s: float = 0.0,
        max_rate_bytes_per_s: float = math.inf,
    ) -> simpy.Event:
        """Move ``size_bytes`` along each path in lockstep after ``latency_s``; event when done.

        ``max_rate_bytes_per_s`` caps the rate (a private link of that capacity).
        """
        if size_bytes < 0 or latency_s < 0:
            raise ValueError(f"size and latency must be >= 0, got {size_bytes} B, {latency_s} s")
        done = self.env.event()
        usage: dict[Hashable, int] = {}
        for path in paths:
            for edge in path:
                if edge not in self._capacity:
                    raise ValueError(f"link {edge} is not in the network")
                usage[edge] = usage.get(edge, 0) + 1
        transfer_id = self._next_id
        self._next_id += 1
        if math.isfinite(max_rate_bytes_per_s):
            private = ("rate cap", transfer_id)
            self._capacity[private] = max_rate_bytes_per_s
            usage[private] = 1
        flow = _Transfer(transfer_id, usage, float(size_bytes), done)
        if size_bytes == 0 or not usage:
            self.env.timeout(latency_s).callbacks.append(lambda _event: _succeed(done))
        elif latency_s > 0:
            self.env.timeout(latency_s).callbacks.append(lambda _event: self._admit(flow))
        else:
            self._admit(flow)
        return done

    def set_capacities(self, capacities: Mapping[Edge, float]) -> None:
        """Change links' capacities from now on (another job's traffic coming or going): the
        transfers crossing them are re-rated, their bytes so far moved at the old rates."""
        affected: list[int] = []
        for edge, capacity in capacities.items():
            if edge not in self._capacity:
                raise ValueError(f"link {edge} is not in the network")
            if not capacity > 0:
                raise ValueError(f"link {edge} must have a capacity > 0 bytes/s, got {capacity}")
            if self._capacity[edge] != capacity:
                self._capacity[edge] = float(capacity)
                affected.extend(self._on_link.get(edge, {}))
        if affected:
            self._mark_dirty(affected)

    def rate_of_active(self) -> list[float]:
        """Current rates (bytes/s) of the transfers moving bytes, in start order."""
        return [flow.rate for flow in self._active.values()]

    def _admit(self, flow: _Transfer) -> None:
        flow.updated_s = self.env.now
        self._active[flow.id] = flow
        for link in flow.usage:
            self._on_link.setdefault(link, {})[flow.id] = None
        self._mark_dirty([flow.id])

    def _mark_dirty(self, flow_ids: Sequence[int]) -> None:
        for flow_id in flow_ids:
            self._dirty[flow_id] = None
        if not self._pending:
            self._pending = True
            self.env.timeout(0).callbacks.append(self._recompute)

    def _component(self, seeds: Sequence[int]) -> list[_Transfer]:
        """Active transfers linked to ``seeds`` through shared links, in id order."""
        seen: dict[int, None] = {}
        stack = [s for s in seeds if s in self._active]
        seen_links: set[Hashable] = set()
        while stack:
            flow_id = stack.pop()
            if flow_id in seen:
                continue
            seen[flow_id] = None
            for link in self._active[flow_id].usage:
                if link in seen_links:
                    continue
                seen_links.add(link)
                stack.extend(other for other in self._on_link[link] if other not in seen)
        return [self._active[flow_id] for flow_id in sorted(seen)]

    def _recompute(self, _event: simpy.Event | None = None) -> None:
        self._pending = False
        seeds = list(self._dirty)
        self._dirty.clear()
        flows = self._component(seeds)
        if not flows:
            return
        self.num_recomputes += 1
        now = self.env.now
        for flow in flows:
            flow.remaining = max(flow.remaining - flow.rate * (now - flow.updated_s), 0.0)
            flow.updated_s = now
        rates = max_min_rates({f.id: f.usage for f in flows}, self._capacity)
        for flow in flows:
            if rates[flow.id] == flow.rate and flow.version > 0:
                continue
            flow.rate = rates[flow.id]
            flow.version += 1
            timer = self.env.timeout(flow.remaining / flow.rate)
            timer.callbacks.append(self._finisher(flow, flow.version))

    def _finisher(self, flow: _Transfer, version: int) -> Callable[[simpy.Event], None]:
        def finish(_event: simpy.Event) -> None:
            if flow.version != version or flow.id not in self._active:
                return
            del self._active[flow.id]
            flow.remaining = 0.0
            neighbours: list[int] = []
            for link in flow.usage:
                users = self._on_link[link]
                del users[flow.id]
                neighbours.extend(users)
                if not users:
                    del self._on_link[link]
            self._capacity.pop(("rate cap", flow.id), None)
            if neighbours:
                self._mark_dirty(neighbours)
            flow.done.succeed()

        return finish


def _succeed(event: simpy.Event) -> None:
    event.succeed()


def max_min_rates(
    usage: Mapping[int, Mapping[Hashable, int]], capacity: Mapping[Hashable, float]
) -> dict[int, float]:
    """Max-min fair rates by progressive filling.

    ``usage[t][link]`` is how many of transfer ``t``'s paths cross ``link``; a transfer at rate
    r consumes ``usage * r`` of the link. Repeatedly, the link with the smallest fair share
    (remaining capacity / unfrozen usage) fixes the rate of every unfrozen transfer on it.

        >>> max_min_rates({0: {"l": 1}, 1: {"l": 1, "m": 1}}, {"l": 2.0, "m": 0.5})
        {0: 1.5, 1: 0.5}
    """
    remaining = {}
    load: dict[Hashable, int] = {}
    users: dict[Hashable, list[int]] = {}
    for flow_id, links in usage.items():
        for link, count in links.items():
            if link not in load:
                remaining[link] = capacity[link]
                load[link] = 0
                users[link] = []
            load[link] += count
            users[link].append(flow_id)
    rates: dict[int, float] = {}
    while len(rates) < len(usage):
        share = min(remaining[link] / load[link] for link in load if load[link] > 0)
        limit = share * (1.0 + _TIE)
        bottlenecks = [
            link for link in load if load[link] > 0 and remaining[link] / load[link] <= limit
        ]
        for link in bottlenecks:
            for flow_id in users[link]:
                if flow_id in rates:
                    continue
                rates[flow_id] = share
                for other, count in usage[flow_id].items():
                    remaining[other] = max(remaining[other] - count * share, 0.0)
                    load[other] -= count
    return {flow_id: rates[flow_id] for flow_id in usage}
