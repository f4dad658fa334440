"""Leave-one-cluster-out for collectives: which other clusters calibrate a cluster, and how.

Each cluster is fitted on its own records (``cluster_fit``). A held-out cluster is calibrated
only by the clusters that resemble it (``resembles``: the same GPU generation and NVLink kind
within a server, the same fabric preset across servers), each point at the median of the times
those clusters' fits give it, over the ones that fitted its algorithm in its scope
(``predict_from_others``); where none did, the presets stand.

    donors = donor_calibrations(clusters, cluster); points, fitted, used = predict_from_others(
        cluster, donors, uncalibrated_points)
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence
from typing import Protocol

from sim.network.calibration import Calibration
from sim.network.compare import Point, compare_records
from sim.network.fitting import TopologyFactory, fit_groups, make_samples
from topologies.hardware import GPUS
from topologies.presets import NODE_PRESETS
from vocab.collectives import busbw_gbps
from vocab.records import Record


class Cluster(Protocol):
    """What this module reads of a cluster (``sim.validation.collectives.Cluster``)."""

    @property
    def name(self) -> str: ...
    @property
    def server(self) -> str: ...
    @property
    def fabric(self) -> str | None: ...
    def groups(self) -> list[tuple[list[Record], TopologyFactory]]: ...


def server_kind(cluster: Cluster) -> tuple[str, str]:
    """What sets a collective's time inside one server: the GPU generation (SM clocks, NVLink
    generation, NCCL's per-generation tables) and how the GPUs are joined (NVSwitch, bridge)."""
    node = NODE_PRESETS[cluster.server]
    return GPUS[node.gpu].family, node.intra


def cluster_fit(cluster: Cluster) -> Calibration:
    """The network model's parameters fitted on one cluster's own records (each group of >= 3
    sizes; ``sim.network.fitting.fit_groups``)."""
    samples = [s for records, factory in cluster.groups() for s in make_samples(records, factory)]
    calibration, _notes = fit_groups(samples, cluster.name, min_points=3)
    return calibration


def resembles(donor: Cluster, like: Cluster, scope: str) -> bool:
    """Whether ``donor``'s fit of ``scope`` may calibrate ``like``, as a user would calibrate
    from measurements of the same kind of machine: within a server, the same GPU generation
    and NVLink kind (an A100 node from A100 nodes); across servers, the same fabric preset."""
    if scope == "inter":
        return like.fabric is not None and donor.fabric == like.fabric
    return server_kind(donor) == server_kind(like)


def donor_calibrations(
    clusters: Sequence[Cluster], like: Cluster, fits: dict[str, Calibration] | None = None
) -> dict[str, Calibration]:
    """Per cluster of ``clusters`` that resembles ``like`` in some scope, its own fit
    (``cluster_fit``) kept to the scopes it resembles ``like`` in; clusters that resemble it in
    none are left out. ``fits`` caches ``cluster_fit`` by cluster name."""
    fits = {} if fits is None else fits
    out: dict[str, Calibration] = {}
    for cluster in clusters:
        if cluster.name == like.name:
            continue
        if cluster.name not in fits:
            fits[cluster.name] = cluster_fit(cluster)
        fitted = fits[cluster.name]
        keys = [k for k in fitted.params if resembles(cluster, like, k.rsplit("/", 1)[-1])]
        if keys:
            out[cluster.name] = dataclasses.replace(
                fitted,
                params={k: fitted.params[k] for k in keys},
                quality={k: fitted.quality[k] for k in keys if k in fitted.quality},
            )
    return out


def predict_from_others(
    cluster: Cluster, donors: dict[str, Calibration], plain: Sequence[Point]
) -> tuple[list[Point], list[bool], list[str]]:
    """``cluster``'s points predicted from its resembling clusters' fits (``donors``): each
    point at the median of the times the donors' calibrations give it, over the donors that
    fitted its algorithm in its scope; a point no donor calibrates keeps its uncalibrated time
    (``plain``, in the same order). Also whether each point was calibrated, and the donors that
    calibrated some point.

    The median is of predictions, not of parameters: each donor's latencies, efficiency and
    protocol scale were fitted together, and one odd cluster among three moves the result by
    one rank, not by its share of the points."""
    predicted = {
        name: [
            p
            for records, factory in cluster.groups()
            for p in compare_records(records, factory, cal)
        ]
        for name, cal in donors.items()
    }
    # (algorithm, scope) pairs each donor fitted: a donor calibrates a point of an algorithm
    # it fitted, for that op or another (``Calibration.lookup``'s first fallback), never through
    # another algorithm's machine overhead (a send/recv fit says nothing of a ring's latencies)
    fitted = {name: {tuple(k.split("/")[1:]) for k in cal.params} for name, cal in donors.items()}
    points, calibrated = [], []
    used: set[str] = set()
    for i, base in enumerate(plain):
        scope = "intra" if base.num_nodes == 1 else "inter"
        names = [name for name in donors if (base.algo, scope) in fitted[name]]
        used.update(names)
        times = [predicted[name][i].simulated_time_us for name in names]
        if not times:
            points.append(base)
            calibrated.append(False)
            continue
        points.append(_with_time(base, statistics.median(times)))
        calibrated.append(True)
    return points, calibrated, sorted(used)


def _with_time(point: Point, simulated_us: float) -> Point:
    """``point`` simulated in ``simulated_us`` instead."""
    busbw = busbw_gbps(point.op, point.size_bytes, simulated_us * 1e-6, point.world_size)
    return dataclasses.replace(
        point,
        simulated_time_us=simulated_us,
        simulated_busbw_gbps=busbw,
        error_pct=(simulated_us / point.measured_time_us - 1.0) * 100.0,
        busbw_error_pct=(busbw / point.measured_busbw_gbps - 1.0) * 100.0,
    )
