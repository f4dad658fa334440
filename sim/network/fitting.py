"""Fitting the network model's parameters to measured collectives (least squares).

Each measurement is attributed to the (algorithm, protocol) that ran: its own ``algo`` (an
nccl-tests file name, commbench's field) or ``--algo``, else what NCCL's tuner picks at its size
(``sim/network/algorithms.py`` ``choose``); the protocol is the one NCCL's tuner gives that
algorithm. Records are grouped by (op, algorithm, scope) and each group's parameters are fitted
on relative error (``fit_params``).

    calibration, notes = fit_calibration(records, factory, topology_name="dgx-h100")
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from sim.network.algorithms import choose, placement_of
from sim.network.analytical import CommParams, CostTerms, GroupPlacement, cost_terms
from sim.network.calibration import DEFAULT_PARAMS, Calibration, FitQuality, key
from sim.network.nccl_tables import DEFAULT_NCCL_VERSION
from topologies.topology import Topology
from vocab.collectives import time_from_busbw_s
from vocab.records import NCCL_ALGO_NAMES, Record

TopologyFactory = Callable[[int, int], Topology]
"""(num_nodes, ranks_per_node) -> the topology a measurement of that shape ran on."""

_MAX_ROUNDS = 8
_SHAPES = (0.25, 0.5, 0.75, 1.0)
"""Ramp steepness grid; at most 1 so the curve never explodes below the fitted sizes."""
_HALF_SIZES = (0.0, *(2.0 ** (k / 2) for k in range(16, 67)))  # 0, 256 B ... 8 GiB


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """One measurement priced by the model: its cost terms and its measured time."""

    record: Record
    """The measurement."""
    algo: str
    """Algorithm it is attributed to."""
    scope: str
    """``intra`` or ``inter``."""
    terms: CostTerms
    """The model's cost pieces for it (only the protocol NCCL's tuner gives it, where one)."""
    time_s: float
    """Measured seconds."""


def record_time_s(record: Record) -> float:
    """Measured seconds of a record (from busbw when the time column is missing)."""
    if record.time_us and record.time_us > 0:
        return record.time_us * 1e-6
    return time_from_busbw_s(record.op, record.size_bytes, record.busbw_gbps, record.world_size)


def record_ranks(record: Record, topology: Topology) -> list[int]:
    """Global ranks of a record's group: the first ``num_nodes`` nodes, world/nodes GPUs each."""
    per_node, extra = divmod(record.world_size, max(record.num_nodes, 1))
    g = topology.gpus_per_node
    if extra or per_node > g or record.num_nodes > topology.num_nodes:
        raise ValueError(
            f"{record.world_size} ranks on {record.num_nodes} node(s) do not fit topology "
            f"{topology.name} ({topology.num_nodes} node(s) x {g} GPUs)"
        )
    return [node * g + local for node in range(record.num_nodes) for local in range(per_node)]


def attribute(
    record: Record, layout: GroupPlacement, assumed: str = "auto"
) -> tuple[str, str | None]:
    """(algorithm, protocol) behind a measurement: its own ``algo``, else ``assumed``, else what
    NCCL's tuner runs at its size; the protocol NCCL's tuner gives that algorithm."""
    name = record.algo or (None if assumed == "auto" else assumed)
    if name is not None and name.strip().lower() == "auto":  # none forced
        name = None if assumed == "auto" else assumed
    if name is None:
        return choose(record.op, layout, record.size_bytes)
    algo = NCCL_ALGO_NAMES.get(name.strip().lower())
    if algo is None:
        raise ValueError(f"unknown algorithm {name!r}; valid: {', '.join(NCCL_ALGO_NAMES)}")
    return choose(record.op, layout, record.size_bytes, algo)


def gap_bound(terms: CostTerms, size_bytes: float) -> bool:
    """Whether a transport's message gap sets the time even at the full rate
    (``Protocol.gap_s``): such a point says nothing of the latencies and efficiency fitted."""
    return any(
        p.gap_s(terms.bus_bytes, size_bytes)
        > p.bandwidth_s(terms.bandwidth_time_s, terms.bus_bytes, size_bytes)
        for p in terms.protocols
    )


def make_samples(
    records: Sequence[Record], topology_for: TopologyFactory, assumed_algo: str = "auto"
) -> list[Sample]:
    """Price every record with the model (out-of-place records only when both are present);
    points a transport's message gap sets (``gap_bound``) are left out of the fit."""
    chosen = [r for r in records if not r.in_place] or list(records)
    samples = []
    for record in chosen:
        topology = topology_for(record.num_nodes, record.world_size // max(record.num_nodes, 1))
        layout = placement_of(topology, record_ranks(record, topology))
        algo, protocol = attribute(record, layout, assumed_algo)
        terms = cost_terms(record.op, algo, layout, record.size_bytes, protocol)
        if gap_bound(terms, record.size_bytes):
            continue
        scope = "intra" if layout.num_nodes == 1 else "inter"
        samples.append(
            Sample(record=record, algo=algo, scope=scope, terms=terms, time_s=record_time_s(record))
        )
    return samples


def fit_params(samples: Sequence[Sample]) -> tuple[CommParams, FitQuality]:
    """Least-squares fit of one group's latencies and efficiency curve (relative error ~ log time).

    For each (shape, half size) on a grid, and each sample's protocol (the fastest under the
    current coefficients, re-chosen until it settles), the model is linear in (base latency,
    1/eff_max and, when the group has several step counts, the per-step latency): solve it with
    numpy and keep the grid point with the smallest sum of squared relative errors.
    """
    algo, scope = samples[0].algo, samples[0].scope
    default = DEFAULT_PARAMS[algo]
    sizes = np.array([s.record.size_bytes for s in samples], dtype=float)
    times = np.array([s.time_s for s in samples])
    tier = "intra_steps" if scope == "intra" else "inter_steps"
    steps = np.array([getattr(s.terms, tier) for s in samples], dtype=float)
    free_step = len(set(steps.tolist())) >= 2
    fixed, table, base_x = _protocol_table(samples, default, scope if free_step else "")
    best: tuple[float, float, float, np.ndarray] | None = None
    # With NCCL's protocols the ramp over size is their latencies, caps and start-up chunks: a
    # free efficiency ramp would stand in for latency and extrapolate badly to other sizes.
    halves = (0.0,) if np.isfinite(table).any() else _HALF_SIZES
    for shape in _SHAPES if halves != (0.0,) else (1.0,):
        for half in (h for h in halves if h <= sizes.max()):
            x = base_x * (1.0 + (half / sizes) ** shape)[:, None]
            coef, err = _fit_protocols(
                times, fixed, table, x, steps if free_step else None, default
            )
            if coef is not None and (best is None or err < best[0]):
                best = (err, shape, half, coef)
    if best is None:
        raise ValueError(f"cannot fit {samples[0].record.op}/{algo}/{scope}: no positive bandwidth")
    _, shape, half, coef = best
    step_field = f"{scope}_step_latency_s"
    params = replace(
        default,
        base_latency_s=float(coef[0]),
        efficiency_max=float(1.0 / coef[1]),
        half_size_bytes=float(half),
        shape=float(shape),
        protocol_latency_scale=float(coef[2]),
        **{step_field: float(coef[3]) if free_step else getattr(default, step_field)},  # type: ignore[arg-type]
    )
    predicted = np.array([s.terms.time_s(params, s.record.size_bytes) for s in samples])
    mape = float(np.mean(np.abs(predicted - times) / times) * 100.0)
    quality = FitQuality(
        num_points=len(samples), mape=mape,
        min_size_bytes=int(sizes.min()), max_size_bytes=int(sizes.max()),
    )  # fmt: skip
    return params, quality


def _protocol_table(
    samples: Sequence[Sample], default: CommParams, free_scope: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per sample and protocol: fixed latency, protocol-table latency, bandwidth s at eff 1.

    The protocol-table latency is fitted with a scale; missing protocols (a sample with
    fewer) are +inf, so they are never the fastest.
    """
    bare = replace(default, base_latency_s=0.0, efficiency_max=1.0, half_size_bytes=0.0)
    if free_scope:
        bare = replace(bare, **{f"{free_scope}_step_latency_s": 0.0})  # type: ignore[arg-type]
    width = max(len(s.terms.protocols) for s in samples) or 1
    fixed = np.full((len(samples), width), np.inf)
    table = np.full((len(samples), width), np.inf)
    base_x = np.full((len(samples), width), np.inf)
    for i, sample in enumerate(samples):
        size = sample.record.size_bytes
        protocols = sample.terms.protocols or (None,)
        for j, proto in enumerate(protocols):
            one = replace(bare, protocol=proto.name if proto else "none")
            _, latency, bandwidth = sample.terms.split_s(one, size)
            own = (
                proto.latency_s(sample.terms.intra_steps, sample.terms.inter_steps) if proto else 0
            )
            fixed[i, j], table[i, j], base_x[i, j] = latency - own, own, bandwidth
    return fixed, table, base_x


def _fit_protocols(
    times: np.ndarray, fixed: np.ndarray, table: np.ndarray, x: np.ndarray,
    steps: np.ndarray | None, default: CommParams,
) -> tuple[np.ndarray | None, float]:  # fmt: skip
    """Fit with each sample's protocol the fastest under the coefficients, until it settles.

    Coefficients: base latency, 1/eff_max, protocol-latency scale, [per-step latency].
    """
    rows = np.arange(len(times))
    choice = np.argmin(fixed + table + x / default.efficiency_max, axis=1)
    coef: np.ndarray | None = None
    err = math.inf
    for _ in range(_MAX_ROUNDS):
        chosen_table = table[rows, choice]
        table_or_none = chosen_table if np.any(chosen_table > 0) else None
        # One protocol latency for every sample: its scale and a base latency cannot be told
        # apart, so NCCL's table stands as it is and the machine's extra is the base latency
        # (a split that carries over to the algorithm's other step counts and protocols, and
        # to other algorithms through ``Calibration.lookup``'s fallback).
        if table_or_none is not None and np.ptp(chosen_table) <= 1e-6 * chosen_table.max():
            coef, err = _solve(times, fixed[rows, choice] + chosen_table, x[rows, choice], steps)
        else:
            coef, err = _solve(times, fixed[rows, choice], x[rows, choice], steps, table_or_none)
        if coef is None:
            return None, math.inf
        again = np.argmin(fixed + coef[2] * table + coef[1] * x, axis=1)
        if np.array_equal(again, choice):
            break
        choice = again
    return coef, err


MIN_INVERSE_EFFICIENCY = 1.0
"""A fit never puts a link above its rate: ``1 / efficiency_max >= 1`` (a free fit that wants
more, e.g. broadcast at 1.9 x the bus rate, is refitted with the efficiency pinned at 1 and the
latencies free)."""


def _solve(
    times: np.ndarray, fixed: np.ndarray, x: np.ndarray, steps: np.ndarray | None,
    table: np.ndarray | None = None,
) -> tuple[np.ndarray | None, float]:  # fmt: skip
    """Nonnegative weighted least squares of ``times - fixed ~ base + c x + k table (+ s steps)``.

    Returns (base, c, k, s) (k = 1 when there is no protocol table, s = 0 without steps).
    """
    columns = [np.ones_like(x), x, table if table is not None else np.zeros_like(x)]
    columns.append(steps if steps is not None else np.zeros_like(x))
    keep = [
        k
        for k in range(4)
        if k < 2 or (k == 2 and table is not None)
        or (k == 3 and steps is not None)
    ]  # fmt: skip
    weight = 1.0 / times
    target = times - fixed
    pinned = 0.0  # 1/eff fixed at 1 once the free fit says the links run faster than their rate
    while True:
        if not keep:  # every free coefficient dropped: only the pinned efficiency is left
            sol = np.zeros(0)
            break
        a = np.stack([columns[k] for k in keep], axis=1) * weight[:, None]
        sol, *_ = np.linalg.lstsq(a, (target - pinned * x) * weight, rcond=None)
        values = dict(zip(keep, sol, strict=True))
        if 1 in values and 0 < values[1] < MIN_INVERSE_EFFICIENCY:
            keep.remove(1)
            pinned = MIN_INVERSE_EFFICIENCY
            continue
        negative = [k for k, v in values.items() if v < 0 and k != 1]
        if not negative:
            break
        keep.remove(negative[0])
    coef = np.zeros(4)
    coef[keep] = sol
    if pinned:
        coef[1] = pinned
    if coef[1] <= 0:
        return None, math.inf
    residual = (fixed + np.stack(columns, axis=1) @ coef - times) * weight
    if table is None:
        coef[2] = 1.0
    return coef, float(residual @ residual)


def fit_calibration(
    records: Sequence[Record],
    topology_for: TopologyFactory,
    *,
    topology_name: str,
    sources: Sequence[str] = (),
    assumed_algo: str = "auto",
    min_points: int = 3,
) -> tuple[Calibration, list[str]]:
    """Fit every (op, algo, scope) group with >= ``min_points`` sizes; also return notes.

    Records that do not name their algorithm (and no ``assumed_algo``) are attributed to what
    NCCL's tuner (or the fabric's tuner plugin) runs at their size; every record is priced with
    the protocol NCCL's tuner gives its algorithm.
    """
    samples = make_samples(records, topology_for, assumed_algo)
    calibration, notes = fit_groups(samples, topology_name, min_points)
    provenance = {
        "sources": list(sources),
        "num_records": len(samples),
        "ops": sorted({s.record.op for s in samples}),
        "sizes_bytes": sorted({s.record.size_bytes for s in samples}),
        "world_sizes": sorted({s.record.world_size for s in samples}),
        "num_nodes": sorted({s.record.num_nodes for s in samples}),
        "assumed_algo": assumed_algo,
        "nccl_versions": sorted({_release(topology_for, s.record) for s in samples}),
        "attributed": {
            k: sorted({s.record.size_bytes for s in samples if _key(s) == k})
            for k in sorted({_key(s) for s in samples})
        },
    }
    return replace(calibration, fitted_from=provenance), notes


def _release(topology_for: TopologyFactory, record: Record) -> str:
    """The NCCL release the record was simulated under (its topology's)."""
    per_node = -(-record.world_size // record.num_nodes)
    return topology_for(record.num_nodes, per_node).nccl_version or DEFAULT_NCCL_VERSION


def _key(sample: Sample) -> str:
    return key(sample.record.op, sample.algo, sample.scope)


def fit_groups(
    samples: Sequence[Sample], topology_name: str, min_points: int
) -> tuple[Calibration, list[str]]:
    """Fit each (op, algo, scope) group of ``samples`` that has enough distinct sizes."""
    groups: dict[str, list[Sample]] = {}
    for sample in samples:
        groups.setdefault(_key(sample), []).append(sample)
    params: dict[str, CommParams] = {}
    quality: dict[str, FitQuality] = {}
    notes = []
    for group_key in sorted(groups):
        members = groups[group_key]
        if len({s.record.size_bytes for s in members}) < min_points:
            notes.append(f"{group_key}: only {len(members)} point(s), not fitted")
            continue
        try:
            params[group_key], quality[group_key] = fit_params(members)
        except ValueError as error:  # e.g. times that fall with size: nothing to fit
            notes.append(f"{group_key}: not fitted ({error})")
    return Calibration(params=params, quality=quality, topology=topology_name), notes
