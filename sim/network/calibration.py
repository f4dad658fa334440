"""Network-model parameters per (op, algorithm, scope): defaults, lookup with fallback, JSON.

A ``Calibration`` holds ``CommParams`` (base latency, per-step latencies, an efficiency curve
over size) fitted from measurements by least squares (``fit_calibration``). They are
PARAMETERS of the analytical and flow models, never a table of measured times. Scope is
``intra`` (the group sits on one node) or ``inter``. A missing (op, algo, scope) falls back, and
says so: the same algorithm's fit for another op in the scope, then the scope's machine
overhead (fitted base latency over the default) and efficiency curve with the algorithm's own
default latencies, then the uncalibrated defaults.

    cal = load_calibration("results/localhost/calibration.json"); params, how = cal.lookup(
        "all_gather", "ring", "intra")
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from comm_bench.collectives import OPS, time_from_busbw_s
from comm_bench.records import Record
from fileio.output import Target, write_text
from fileio.strict import load_json, read_input, shorten
from sim.network.algorithms import choose_algorithm, layout_of
from sim.network.analytical import ALGORITHMS, CommParams, CostTerms, Layout, cost_terms
from topologies.topology import Topology

SCHEMA = "commsim-calibration/1"
"""Schema tag of calibration files."""

SCOPES = ("intra", "inter")
"""Group scopes: all ranks on one node, or spread over several."""

# Uncalibrated defaults. Bandwidths come from the topology's *effective* link rates (NCCL's own
# budget, e.g. 370.8 GB/s for NVLink4, 47 GB/s for NDR) and the latencies, protocol factors,
# caps and start-up chunks from NCCL's tuning tables (``sim/network/protocols.py``; NVLS's 0.85
# efficiency is in its bandwidth term), so the fitted parameters are what the machine adds on
# top of NCCL's own model: nothing by default. gloo's per-message cost is the loopback hop.
_NEUTRAL = CommParams(
    base_latency_s=0.0, intra_step_latency_s=0.0, inter_step_latency_s=0.0,
    efficiency_max=1.0, half_size_bytes=0.0,
)  # fmt: skip
DEFAULT_PARAMS: dict[str, CommParams] = dict.fromkeys(ALGORITHMS, _NEUTRAL)
"""Uncalibrated parameters per algorithm (same for every op and scope)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FitQuality:
    """How well one fitted group matches the points it was fitted on."""

    num_points: int
    """Measurements used."""
    mape: float
    """Mean absolute percentage error of the predicted time, in percent."""
    min_size_bytes: int
    """Smallest size fitted."""
    max_size_bytes: int
    """Largest size fitted."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    """Fitted network-model parameters, keyed ``op/algo/scope``, with their provenance."""

    params: Mapping[str, CommParams] = field(default_factory=dict)
    """Fitted parameters per ``op/algo/scope`` key."""
    quality: Mapping[str, FitQuality] = field(default_factory=dict)
    """Fit quality per key."""
    topology: str = ""
    """Topology the fit was made on."""
    fitted_from: Mapping[str, Any] = field(default_factory=dict)
    """Provenance: source paths, ops, sizes, record count."""

    def lookup(self, op: str, algo: str, scope: str) -> tuple[CommParams, str]:
        """Parameters for (op, algo, scope) and how they were found (``fitted``, ``fallback..``)."""
        if algo not in ALGORITHMS or scope not in SCOPES:
            raise ValueError(
                f"unknown algo/scope {algo!r}/{scope!r}; valid: {ALGORITHMS}, {SCOPES}"
            )
        exact = self.params.get(key(op, algo, scope))
        if exact is not None:
            return exact, "fitted"
        for other in OPS:
            found = self.params.get(key(other, algo, scope))
            if found is not None:
                return found, f"fallback: {key(other, algo, scope)} (same algorithm, other op)"
        same_scope = sorted(k for k in self.params if k.endswith(f"/{scope}"))
        if same_scope:
            ranked = sorted(same_scope, key=lambda k: -self.quality[k].num_points)
            donor = self.params[ranked[0]]
            # The machine's overhead is what the donor's fit adds to its algorithm's default.
            overhead = donor.base_latency_s - DEFAULT_PARAMS[ranked[0].split("/")[1]].base_latency_s
            default = DEFAULT_PARAMS[algo]
            merged = replace(
                donor,
                base_latency_s=max(default.base_latency_s + overhead, 0.0),
                intra_step_latency_s=default.intra_step_latency_s,
                inter_step_latency_s=default.inter_step_latency_s,
            )
            return (
                merged,
                f"fallback: {ranked[0]} machine overhead and efficiency + {algo} latencies",
            )
        return DEFAULT_PARAMS[algo], "default (uncalibrated)"

    def to_json(self) -> dict[str, Any]:
        """The versioned JSON document."""
        return {
            "schema": SCHEMA,
            "topology": self.topology,
            "fitted_from": dict(self.fitted_from),
            "params": {
                k: {**asdict(p), "fit": asdict(self.quality[k])}
                for k, p in sorted(self.params.items())
            },
        }

    def save(self, target: Target | str | Path) -> None:
        """Write the JSON document to ``target`` (through ``fileio.output``)."""
        write_text(target, json.dumps(self.to_json(), indent=2, sort_keys=False) + "\n")


UNCALIBRATED = Calibration()
"""No fitted parameters: every lookup returns the defaults."""


def key(op: str, algo: str, scope: str) -> str:
    """The ``op/algo/scope`` key of a calibration entry."""
    return f"{op}/{algo}/{scope}"


def calibration_from_json(doc: Mapping[str, Any]) -> Calibration:
    """Parse a calibration document (ValueError naming what is wrong)."""
    if not isinstance(doc, Mapping) or doc.get("schema") != SCHEMA:
        found = doc.get("schema") if isinstance(doc, Mapping) else type(doc).__name__
        raise ValueError(f"calibration schema is {found!r}; expected {SCHEMA!r}")
    entries = doc.get("params", {})
    if not isinstance(entries, Mapping):
        raise ValueError(f"calibration 'params' must map op/algo/scope to values, got {entries!r}")
    params: dict[str, CommParams] = {}
    quality: dict[str, FitQuality] = {}
    for entry_key, entry in entries.items():
        parts = str(entry_key).split("/")
        if (
            len(parts) != 3
            or parts[0] not in OPS
            or parts[1] not in ALGORITHMS
            or parts[2] not in SCOPES
            or not isinstance(entry, Mapping)
        ):
            raise ValueError(f"bad calibration key {entry_key!r}; expected op/algo/scope: {{...}}")
        values = dict(entry)
        fit = values.pop("fit", None)
        try:
            _check_numbers(entry_key, values)
            params[entry_key] = CommParams(**values)
            quality[entry_key] = _fit_quality(entry_key, fit)
        except TypeError as exc:
            raise ValueError(f"bad calibration entry {entry_key!r}: {exc}") from None
    return Calibration(
        params=params,
        quality=quality,
        topology=str(doc.get("topology", "")),
        fitted_from=_mapping(doc.get("fitted_from", {}), "fitted_from"),
    )


PARAM_RANGES: dict[str, tuple[float, float]] = {
    "base_latency_s": (0.0, 60.0),
    "intra_step_latency_s": (0.0, 60.0),
    "inter_step_latency_s": (0.0, 60.0),
    "efficiency_max": (1e-6, 1.0),
    "half_size_bytes": (0.0, 2.0**50),
    "shape": (1e-3, 8.0),
    "protocol_latency_scale": (0.0, 1e6),
}
"""Accepted range of each fitted number: past anything a fit on a real machine gives (a minute
per call, a millionth of a link's rate, a ramp half-way at 1 PiB), so a typo is an error rather
than times of 10^300 s or a ramp that overflows (``(half / size) ** shape``)."""


def _check_numbers(entry_key: str, values: Mapping[str, Any]) -> None:
    """ValueError unless every numeric parameter is a finite number in its ``PARAM_RANGES``."""
    for name, value in values.items():
        if name not in PARAM_RANGES:
            continue  # the protocol, or a key CommParams refuses by name
        low, high = PARAM_RANGES[name]
        ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok or not low <= value <= high:
            raise ValueError(
                f"bad calibration entry {entry_key!r}: {name}={shorten(value)}; "
                f"must be a number from {low:g} to {high:g}"
            )


def _fit_quality(entry_key: str, fit: Any) -> FitQuality:
    """The ``fit`` object of an entry (absent: a fit of no points); ValueError naming a bad one."""
    if fit is None:
        return FitQuality(num_points=0, mape=0.0, min_size_bytes=0, max_size_bytes=0)
    names = [f.name for f in fields(FitQuality)]
    if not isinstance(fit, Mapping) or sorted(fit) != sorted(names):
        raise ValueError(
            f"bad calibration entry {entry_key!r}: 'fit' must be an object with "
            f"{', '.join(names)}, got {shorten(fit)}"
        )
    for name, value in fit.items():
        integer = name != "mape"
        ok = isinstance(value, int if integer else int | float) and not isinstance(value, bool)
        if not ok or not 0 <= value < math.inf:
            kind = "an integer" if integer else "a number"
            raise ValueError(
                f"bad calibration entry {entry_key!r}: fit.{name}={shorten(value)}; "
                f"must be {kind} >= 0"
            )
    return FitQuality(**fit)


def _mapping(value: Any, key: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise ValueError(f"'{key}' must be a JSON object, got {shorten(value)}")
    return dict(value)


def load_calibration(path: str | Path) -> Calibration:
    """Read a calibration JSON file written by ``commsim calibrate``."""
    try:
        doc = load_json(read_input(path, what="network calibration"), name=str(path))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    try:
        return calibration_from_json(doc)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


# --- fitting ------------------------------------------------------------------------------------

NCCL_ALGO_NAMES = {
    "ring": "ring",
    "tree": "tree",
    "nvls": "nvls",
    "nvlstree": "hierarchical",
    "nvls_tree": "hierarchical",
    "hierarchical": "hierarchical",
    "direct": "direct",
}
"""Algorithm names found in measurements (ours or NCCL's) to ours."""

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
    """The model's cost pieces for it."""
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


def attribute_algorithm(
    record: Record, layout: Layout, assumed: str = "auto", calibration: Calibration | None = None
) -> str:
    """Algorithm behind a measurement: its own ``algo``, else ``assumed``, else auto's pick.

    Auto's pick uses ``calibration`` (default: uncalibrated), as NCCL picks the fastest.
    """
    name = record.algo or (None if assumed == "auto" else assumed)
    if name is not None:
        algo = NCCL_ALGO_NAMES.get(name.strip().lower())
        if algo is None:
            raise ValueError(f"unknown algorithm {name!r}; valid: {', '.join(NCCL_ALGO_NAMES)}")
        return algo
    scope = "intra" if layout.num_nodes == 1 else "inter"
    cal = calibration or UNCALIBRATED
    return choose_algorithm(
        record.op, layout, record.size_bytes, lambda a: cal.lookup(record.op, a, scope)[0]
    )


def make_samples(
    records: Sequence[Record],
    topology_for: TopologyFactory,
    assumed_algo: str = "auto",
    calibration: Calibration | None = None,
) -> list[Sample]:
    """Price every record with the model (out-of-place records only when both are present)."""
    chosen = [r for r in records if not r.in_place] or list(records)
    samples = []
    for record in chosen:
        topology = topology_for(record.num_nodes, record.world_size // max(record.num_nodes, 1))
        layout = layout_of(topology, record_ranks(record, topology))
        algo = attribute_algorithm(record, layout, assumed_algo, calibration)
        terms = cost_terms(record.op, algo, layout, record.size_bytes)
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
        extra = [table[rows, choice]] if np.any(table[rows, choice] > 0) else [None]
        coef, err = _solve(times, fixed[rows, choice], x[rows, choice], steps, extra[0])
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
        if k < 2 or (k == 2 and table is not None) or (k == 3 and steps is not None)
    ]
    weight = 1.0 / times
    target = times - fixed
    pinned = 0.0  # 1/eff fixed at 1 once the free fit says the links run faster than their rate
    while True:
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

    Records that do not name their algorithm (and no ``assumed_algo``) are attributed to the
    model's fastest, as NCCL runs the fastest; the fit and the attribution alternate until the
    attribution settles.
    """
    calibration: Calibration | None = None
    attributed: list[str] = []
    notes: list[str] = []
    samples: list[Sample] = []
    for _ in range(_MAX_ROUNDS):
        samples = make_samples(records, topology_for, assumed_algo, calibration)
        if [s.algo for s in samples] == attributed:
            break
        attributed = [s.algo for s in samples]
        calibration, notes = _fit_groups(samples, topology_name, min_points)
    assert calibration is not None
    provenance = {
        "sources": list(sources),
        "num_records": len(samples),
        "ops": sorted({s.record.op for s in samples}),
        "sizes_bytes": sorted({s.record.size_bytes for s in samples}),
        "world_sizes": sorted({s.record.world_size for s in samples}),
        "num_nodes": sorted({s.record.num_nodes for s in samples}),
        "assumed_algo": assumed_algo,
        "attributed": {
            k: sorted({s.record.size_bytes for s in samples if _key(s) == k})
            for k in sorted({_key(s) for s in samples})
        },
    }
    return replace(calibration, fitted_from=provenance), notes


def _key(sample: Sample) -> str:
    return key(sample.record.op, sample.algo, sample.scope)


def _fit_groups(
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
        params[group_key], quality[group_key] = fit_params(members)
    return Calibration(params=params, quality=quality, topology=topology_name), notes
