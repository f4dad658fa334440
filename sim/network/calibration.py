"""Network-model parameters per (op, algorithm, scope): defaults, lookup with fallback, JSON.

A ``Calibration`` holds ``CommParams`` (base latency, per-step latencies, an efficiency curve
over size) fitted from measurements by least squares (``sim/network/fitting.py``). They are
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
from collections.abc import Mapping
from dataclasses import MISSING, asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from fileio.output import Target, write_text
from fileio.strict import did_you_mean, load_json, read_input, shorten
from sim.network.analytical import ALGORITHMS, CommParams
from vocab.collectives import OPS

SCHEMA = "commsim-calibration/1"
"""Schema tag of calibration files."""

SCOPES = ("intra", "inter")
"""Group scopes: all ranks on one node, or spread over several."""

# Uncalibrated defaults. Bandwidths come from the topology's *effective* link rates (NCCL's own
# budget, e.g. 370.8 GB/s for NVLink4, 47 GB/s for NDR) and the latencies, protocol factors,
# caps and start-up chunks from NCCL's tuning tables (``sim/network/protocols.py``; NVLS's per-op
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


DOCUMENT_KEYS = ("schema", "topology", "fitted_from", "params")
"""The keys of a calibration document (``Calibration.to_json``)."""


def calibration_from_json(doc: Mapping[str, Any]) -> Calibration:
    """Parse a calibration document (ValueError naming what is wrong)."""
    if not isinstance(doc, Mapping) or doc.get("schema") != SCHEMA:
        found = doc.get("schema") if isinstance(doc, Mapping) else type(doc).__name__
        raise ValueError(f"calibration schema is {found!r}; expected {SCHEMA!r}")
    unknown = sorted(str(k) for k in set(doc) - set(DOCUMENT_KEYS))
    if unknown:
        hint = did_you_mean(unknown[0], DOCUMENT_KEYS)
        valid = ", ".join(DOCUMENT_KEYS)
        raise ValueError(f"unknown calibration key {shorten(unknown[0])}{hint}; valid: {valid}")
    if not isinstance(doc.get("topology", ""), str):
        raise ValueError(f"calibration 'topology' must be a name, got {shorten(doc['topology'])}")
    entries = doc.get("params", {})
    if not isinstance(entries, Mapping):
        raise ValueError(f"calibration 'params' must map op/algo/scope to values, got {entries!r}")
    if not entries:
        raise ValueError(
            "calibration has no fitted entries ('params' missing or empty): nothing to apply"
        )
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
        _check_entry_keys(entry_key, values)
        _check_numbers(entry_key, values)
        params[entry_key] = CommParams(**values)
        quality[entry_key] = _fit_quality(entry_key, fit)
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


def _check_entry_keys(entry_key: str, values: Mapping[str, Any]) -> None:
    """ValueError naming an entry's unknown key (with the nearest names) or a missing one."""
    names = [f.name for f in fields(CommParams)]
    unknown = sorted(str(k) for k in set(values) - set(names))
    if unknown:
        raise ValueError(
            f"bad calibration entry {entry_key!r}: unknown key {shorten(unknown[0])}"
            f"{did_you_mean(unknown[0], names)}; valid: {', '.join(names)}, fit"
        )
    required = [f.name for f in fields(CommParams) if f.default is MISSING]
    missing = [name for name in required if name not in values]
    if missing:
        raise ValueError(
            f"bad calibration entry {entry_key!r}: missing {missing[0]} "
            f"(required: {', '.join(required)})"
        )


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
