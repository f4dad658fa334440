"""Collectives on clusters the model was not fitted on: public nccl-tests results, leave one out.

``refdata/collectives/<cluster>/cluster.json`` describes one cluster (its server and fabric
presets, the source of every file) and lists its measurement files (nccl-tests logs or busbw
tables, each with its node count). Each cluster is predicted twice:

- **uncalibrated**: the presets and NCCL's own tuning tables, nothing fitted;
- **leave-one-cluster-out**: the network model's parameters (latencies, efficiency, protocol
  scale per op, algorithm and scope; ``sim.network.fitting``) fitted on each OTHER cluster's
  measurements, priced on its own topology; each point takes the median of the times the
  clusters like it give (within a server: the same GPU generation and NVLink kind; across
  servers: the same fabric preset; ``sim.validation.collective_donors``).

Errors are on bus bandwidth (simulated / measured - 1), scored on sizes >= 1 MiB, per cluster,
op, node count and size band. The fabric presets' checks (``commsim topo``) come from the
uncalibrated rows of the clusters that use them.

    clusters = load_clusters(COLLECTIVES_DIR); report = validate_collectives(clusters)
"""

from __future__ import annotations

import dataclasses
import json
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fileio.strict import did_you_mean, load_json, read_input, shorten
from refdata import COLLECTIVES_DIR
from sim.network.calibration import Calibration
from sim.network.compare import SIZE_BANDS, Point, compare_records, size_band
from sim.network.fitting import TopologyFactory
from sim.validation.collective_donors import donor_calibrations, predict_from_others
from topologies.fabrics import NCCL_ALGORITHM_NAMES, NCCL_PROTOCOLS, FabricSpec
from topologies.nccl_release import check_nccl_version
from topologies.presets import FABRIC_PRESETS, NODE_PRESETS, build_cluster, cluster_topology
from topologies.topology import Topology
from vocab.collectives import canonical_op
from vocab.readers import read_results
from vocab.records import NCCL_ALGO_NAMES, Record

MIN_SCORED_BYTES = 1 << 20
"""Sizes scored: 1 MiB and up (below, launch and protocol latencies that nccl-tests' loop hides
or not depending on its flags)."""

MODES = ("uncalibrated", "leave-one-cluster-out")
"""How each cluster is predicted."""
MAX_CHANNELS = 64
"""Most channels a file may pin (NCCL's ``MAXCHANNELS``)."""

_FILE_KEYS = {
    "file", "op", "nodes", "gpus_per_node", "algo", "channels", "protocols", "algorithms",
    "nccl_version", "dtype", "source", "notes",
}  # fmt: skip


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEnv:
    """What a run's NCCL environment set across nodes, where it differs from its fabric
    preset: ``NCCL_MIN_NCHANNELS`` = ``NCCL_MAX_NCHANNELS``, ``NCCL_PROTO``, ``NCCL_ALGO``
    (0 and empty: the preset's); and the NCCL release it ran (empty: not stated, the model's
    own)."""

    channels: int = 0
    protocols: tuple[str, ...] = ()
    algorithms: tuple[str, ...] = ()
    nccl_version: str = ""

    def applied(self, fabric: FabricSpec) -> FabricSpec:
        """``fabric`` with this environment's settings."""
        changes: dict[str, Any] = {}
        if self.channels:
            changes["channels"] = self.channels
        if self.protocols:
            changes["protocols"] = self.protocols
        if self.algorithms:
            changes["algorithms"] = self.algorithms
        return dataclasses.replace(fabric, **changes) if changes else fabric


_CLUSTER_KEYS = {"cluster", "description", "gpu", "server", "fabric", "files", "notes"}


@dataclass(frozen=True, slots=True, kw_only=True)
class MeasuredFile:
    """One measurement file of a cluster and what its source says about the run."""

    path: Path
    """The file (nccl-tests log or busbw CSV)."""
    op: str
    """Collective."""
    nodes: int | None
    """Servers the run spanned (None: a busbw table that states it per row)."""
    gpus_per_node: int
    """GPUs per server that took part."""
    algo: str
    """``auto`` or the algorithm the run forced (``NCCL_ALGO``)."""
    source: str
    """Where the numbers were published."""
    env: RunEnv = RunEnv()
    """What the run's NCCL environment set across nodes beyond the fabric preset (a
    ``cluster.json`` entry's ``channels``, ``protocols``, ``algorithms``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """One cluster's published measurements."""

    name: str
    """Folder name."""
    description: str
    """The machine, as its source describes it."""
    server: str
    """Node preset it is simulated with."""
    fabric: str | None
    """Fabric preset between its servers (None: single-node only)."""
    files: tuple[MeasuredFile, ...]
    """Its measurement files."""

    def topology_for(self, env: RunEnv | None = None) -> TopologyFactory:
        """(num_nodes, ranks_per_node) -> this cluster's topology of that many servers (with
        ``env``, its fabric under that run's NCCL environment)."""
        cache: dict[tuple[int, int], Topology] = {}

        def build(num_nodes: int, ranks_per_node: int) -> Topology:
            found = cache.get((num_nodes, ranks_per_node))
            if found is None:
                release = "" if env is None else env.nccl_version
                if num_nodes > 1 and self.fabric is not None:
                    fabric = FABRIC_PRESETS[self.fabric]
                    if env is not None:
                        fabric = env.applied(fabric)
                    found = cluster_topology(
                        NODE_PRESETS[self.server], num_nodes, fabric, nccl_version=release
                    )
                else:
                    found = build_cluster(self.server, num_nodes, nccl_version=release)
                cache[(num_nodes, ranks_per_node)] = found
            return found

        return build

    def groups(self) -> list[tuple[list[Record], TopologyFactory]]:
        """The records (``records``) by the NCCL environment of their runs, each with its
        topology factory, in a stable order."""
        settings = sorted({entry.env for entry in self.files}, key=repr)
        return [(self.records(env=e), self.topology_for(e)) for e in settings]

    def records(self, *, env: RunEnv | None = None) -> list[Record]:
        """Every out-of-place record of every file (of the files run under ``env``), with the
        node count its source states."""
        found: list[Record] = []
        for entry in self.files:
            if env is not None and entry.env != env:
                continue
            with warnings.catch_warnings():
                # The logs' extra blocks (another op appended, a 1-rank run) are skipped or
                # relabelled by the reader, which says so; the shipped files are curated.
                warnings.simplefilter("ignore")
                # Only the op the file is listed for: a block of another op appended to a log
                # (the reader relabels it) is another file's data.
                records = [r for r in _read(entry) if r.op == entry.op]
            for record in records:
                nodes = entry.nodes or record.num_nodes
                if nodes > 1 and self.fabric is None:
                    raise ValueError(f"{entry.path}: {nodes} nodes but the cluster has no fabric")
                if record.world_size != nodes * entry.gpus_per_node:
                    raise ValueError(
                        f"{entry.path}: {record.world_size} ranks in the file, but cluster.json "
                        f"says {nodes} node(s) x {entry.gpus_per_node} GPUs"
                    )
            algo = None if entry.algo == "auto" else entry.algo
            chosen = [r for r in records if not r.in_place] or records
            found += [
                dataclasses.replace(r, num_nodes=entry.nodes or r.num_nodes, algo=algo or r.algo)
                for r in chosen
            ]
        return found


def _read(entry: MeasuredFile) -> list[Record]:
    """The file's records: read as it is (its Rank lines, nranks or bus factor give the ranks),
    else with the ranks cluster.json gives (a pasted table); ValueError when neither reads, or
    when the file has no row of the listed op."""
    try:
        records = read_results(entry.path, op=entry.op)
    except ValueError:
        records = []
    if not [r for r in records if r.op == entry.op] and entry.nodes:
        try:
            records = read_results(entry.path, op=entry.op, world=entry.nodes * entry.gpus_per_node)
        except ValueError:
            records = []
    if not [r for r in records if r.op == entry.op]:
        found = ", ".join(sorted({r.op for r in records})) or "none read"
        raise ValueError(
            f"{entry.path}: no {entry.op} rows for {entry.nodes or 'the'} node(s) x "
            f"{entry.gpus_per_node} GPUs (ops found: {found}); check op, nodes and gpus_per_node "
            "in cluster.json"
        )
    return records


def load_clusters(root: Path = COLLECTIVES_DIR) -> list[Cluster]:
    """Every ``<root>/*/cluster.json``, checked (presets, keys, files present), by name."""
    clusters = [_cluster(path) for path in sorted(root.glob("*/cluster.json"))]
    if not clusters:
        raise ValueError(f"{root}: no <cluster>/cluster.json found")
    return clusters


def _cluster(path: Path) -> Cluster:
    where = str(path)
    try:
        doc = load_json(read_input(path, what="cluster description"), name=where)
    except ValueError as error:
        message = str(error)
        raise ValueError(message if where in message else f"{where}: {message}") from None
    if not isinstance(doc, dict):
        raise ValueError(
            f"{where}: must be a JSON object with keys {', '.join(sorted(_CLUSTER_KEYS))}"
        )
    if extra := set(doc) - _CLUSTER_KEYS:
        raise ValueError(f"{where}: unknown key(s) {sorted(extra)}")
    server, fabric = doc.get("server"), doc.get("fabric")
    if server not in NODE_PRESETS:
        raise ValueError(f"{where}: server {server!r}{did_you_mean(str(server), NODE_PRESETS)}")
    if fabric is not None and fabric not in FABRIC_PRESETS:
        raise ValueError(f"{where}: fabric {fabric!r}{did_you_mean(str(fabric), FABRIC_PRESETS)}")
    entries = doc.get("files")
    if not isinstance(entries, list):
        raise ValueError(f"{where}: files must be a list of mappings, got {shorten(entries)}")
    files = []
    for index, entry in enumerate(entries):
        at = f"{where}: files[{index}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{at} must be a mapping with keys {', '.join(sorted(_FILE_KEYS))}")
        if extra := set(entry) - _FILE_KEYS:
            raise ValueError(f"{at}: unknown key(s) {sorted(extra)}")
        nodes, per_node = entry.get("nodes"), entry.get("gpus_per_node")
        if nodes is not None and (not _count(nodes)):
            raise ValueError(f"{at}: nodes must be an integer >= 1 (or absent), got {nodes!r}")
        if not isinstance(per_node, int) or not _count(per_node):
            raise ValueError(f"{at}: gpus_per_node must be an integer >= 1, got {per_node!r}")
        algo = str(entry.get("algo", "auto")).lower()
        if algo != "auto" and algo not in NCCL_ALGO_NAMES:
            raise ValueError(
                f"{at}: algo {shorten(algo)}; valid: auto, {', '.join(sorted(NCCL_ALGO_NAMES))}"
            )
        if nodes is not None and nodes > 1 and fabric is None:
            raise ValueError(f"{at}: {nodes} nodes but the cluster has no fabric")
        env = _run_env(at, entry)
        file_path = (path.parent / str(entry.get("file"))).resolve()
        if not file_path.is_file():
            raise ValueError(f"{at}: file {entry.get('file')!r} not found")
        if not str(entry.get("source", "")).strip():
            raise ValueError(f"{at}: no source")
        files.append(
            MeasuredFile(
                path=file_path, op=canonical_op(str(entry.get("op"))), nodes=nodes,
                gpus_per_node=per_node, algo=algo, source=str(entry["source"]),
                env=env,
            )
        )  # fmt: skip
    if not files:
        raise ValueError(f"{where}: no files")
    return Cluster(
        name=path.parent.name,
        description=str(doc.get("description", "")),
        server=str(server),
        fabric=fabric,
        files=tuple(files),
    )


def _run_env(at: str, entry: dict[str, Any]) -> RunEnv:
    """A file entry's ``channels``, ``protocols`` and ``algorithms``, checked."""
    channels = entry.get("channels")
    if channels is not None and not (_count(channels) and channels <= MAX_CHANNELS):
        raise ValueError(
            f"{at}: channels must be an integer in 1..{MAX_CHANNELS} (or absent), "
            f"got {shorten(channels)}"
        )
    lists = {}
    for key, valid in (("protocols", NCCL_PROTOCOLS), ("algorithms", NCCL_ALGORITHM_NAMES)):
        names = entry.get(key, [])
        if not isinstance(names, list) or any(n not in valid for n in names):
            raise ValueError(
                f"{at}: {key} must be a list of {', '.join(valid)} (the run's NCCL "
                f"{'PROTO' if key == 'protocols' else 'ALGO'}), got {shorten(names)}"
            )
        lists[key] = tuple(names)
    try:
        release = check_nccl_version(entry.get("nccl_version", ""))
    except ValueError as exc:
        raise ValueError(f"{at}: {exc}") from None
    return RunEnv(channels=channels or 0, nccl_version=release, **lists)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


@dataclass(frozen=True, slots=True, kw_only=True)
class ClusterPoints:
    """One cluster predicted one way."""

    cluster: str
    """Cluster name."""
    mode: str
    """One of ``MODES``."""
    points: tuple[Point, ...]
    """Every record next to its simulation."""
    calibrated: tuple[bool, ...] = ()
    """Leave-one-cluster-out: whether each point was calibrated from other clusters (False:
    none like it calibrates its scope, the presets stand); empty uncalibrated."""
    donors: tuple[str, ...] = ()
    """Leave-one-cluster-out: the clusters whose fits calibrated some of its points."""

    def scored(self) -> list[Point]:
        """Points of sizes >= ``MIN_SCORED_BYTES``."""
        return [p for p in self.points if p.size_bytes >= MIN_SCORED_BYTES]

    def scored_calibrated(self) -> list[Point]:
        """Scored points calibrated from other clusters (none uncalibrated)."""
        if not self.calibrated:
            return []
        return [
            p
            for p, fitted in zip(self.points, self.calibrated, strict=True)
            if fitted and p.size_bytes >= MIN_SCORED_BYTES
        ]


def busbw_mape(points: Sequence[Point]) -> float | None:
    """Mean |simulated / measured busbw - 1| in percent (None: no points)."""
    if not points:
        return None
    return sum(abs(p.busbw_error_pct) for p in points) / len(points)


def validate_collectives(clusters: Sequence[Cluster]) -> list[ClusterPoints]:
    """Each cluster uncalibrated and predicted from the clusters like it
    (``predict_from_others``)."""
    results = []
    fits: dict[str, Calibration] = {}
    for cluster in clusters:
        plain = [
            p
            for records, factory in cluster.groups()
            for p in compare_records(records, factory, None)
        ]
        donors = donor_calibrations(clusters, cluster, fits)
        held_out, calibrated, used = predict_from_others(cluster, donors, plain)
        results.append(ClusterPoints(cluster=cluster.name, mode=MODES[0], points=tuple(plain)))
        results.append(
            ClusterPoints(
                cluster=cluster.name, mode=MODES[1], points=tuple(held_out),
                calibrated=tuple(calibrated), donors=tuple(used),
            )
        )  # fmt: skip
    return results


def breakdown(points: Sequence[Point]) -> list[dict[str, Any]]:
    """busbw MAPE and mean signed error per (op, nodes, size band), in a stable order."""
    groups: dict[tuple[str, int, str], list[Point]] = {}
    for p in points:
        groups.setdefault((p.op, p.num_nodes, size_band(p.size_bytes)), []).append(p)
    order = [name for name, _ in SIZE_BANDS]
    return [
        {
            "op": op,
            "num_nodes": nodes,
            "band": band,
            "num_points": len(ps),
            "busbw_mape_pct": busbw_mape(ps),
            "mean_busbw_error_pct": sum(p.busbw_error_pct for p in ps) / len(ps),
        }
        for (op, nodes, band), ps in sorted(
            groups.items(), key=lambda kv: (kv[0][0], kv[0][1], order.index(kv[0][2]))
        )
    ]


def summary(results: Sequence[ClusterPoints], clusters: Sequence[Cluster]) -> dict[str, Any]:
    """Per mode: busbw MAPE over every scored point, per cluster, and per fabric preset."""
    described = {c.name: c for c in clusters}
    out: dict[str, Any] = {"min_size_bytes": MIN_SCORED_BYTES, "modes": {}}
    for mode in MODES:
        rows = [r for r in results if r.mode == mode]
        every = [p for r in rows for p in r.scored()]
        per_cluster: dict[str, dict[str, Any]] = {
            r.cluster: {
                "server": described[r.cluster].server,
                "fabric": described[r.cluster].fabric,
                "num_points": len(r.scored()),
                "busbw_mape_pct": busbw_mape(r.scored()),
                "mean_busbw_error_pct": (
                    sum(p.busbw_error_pct for p in r.scored()) / len(r.scored())
                    if r.scored()
                    else None
                ),
                "bands": breakdown(r.scored()),
                **_calibration_share(r),
            }
            for r in rows
        }
        worst = max(
            (c for c in per_cluster.items() if c[1]["busbw_mape_pct"] is not None),
            key=lambda c: c[1]["busbw_mape_pct"],
            default=None,
        )
        fitted = [p for r in rows for p in r.scored_calibrated()]
        out["modes"][mode] = {
            "num_points": len(every),
            "busbw_mape_pct": busbw_mape(every),
            "worst_cluster": worst[0] if worst else None,
            **(
                {
                    "num_calibrated_points": len(fitted),
                    "calibrated_busbw_mape_pct": busbw_mape(fitted),
                }
                if mode == MODES[1]
                else {}
            ),
            "clusters": per_cluster,
        }
    return out


def _calibration_share(row: ClusterPoints) -> dict[str, Any]:
    """Leave-one-cluster-out: the donors, and how many scored points they calibrated."""
    if row.mode != MODES[1]:
        return {}
    return {"donors": list(row.donors), "num_calibrated_points": len(row.scored_calibrated())}


def fabric_checks(results: Sequence[ClusterPoints], clusters: Sequence[Cluster]) -> dict[str, Any]:
    """Per fabric preset: the clusters on it and the uncalibrated busbw MAPE across servers
    (>= 1 MiB, multi-node points only)."""
    checks: dict[str, Any] = {}
    for cluster in clusters:
        row = next(r for r in results if r.cluster == cluster.name and r.mode == MODES[0])
        across = [p for p in row.scored() if p.num_nodes > 1]
        if cluster.fabric is not None and across:
            checks.setdefault(cluster.fabric, []).append(_check(cluster, across, across=True))
    return checks


def report_json(results: Sequence[ClusterPoints], clusters: Sequence[Cluster]) -> dict[str, Any]:
    """The whole validation as JSON: summary, fabric checks and every point."""
    return {
        "schema": "commsim-collective-validation/1",
        "summary": summary(results, clusters),
        "fabric_checks": fabric_checks(results, clusters),
        "clusters": {
            c.name: {
                "description": c.description,
                "server": c.server,
                "fabric": c.fabric,
                "nodes": sorted(
                    {p.num_nodes for r in results if r.cluster == c.name for p in r.points}
                ),
                "files": [
                    {
                        "file": f.path.name,
                        "op": f.op,
                        "nodes": f.nodes,
                        "gpus_per_node": f.gpus_per_node,
                        "algo": f.algo,
                        "source": f.source,
                    }
                    for f in c.files
                ],
            }
            for c in clusters
        },
        "points": [
            {"cluster": r.cluster, "mode": r.mode, **dataclasses.asdict(p)}
            for r in results
            for p in r.points
        ],
    }


def dumps(document: dict[str, Any]) -> str:
    """The JSON text written by ``commsim validate --collectives --json``."""
    return json.dumps(document, indent=1) + "\n"


def _check(cluster: Cluster, points: Sequence[Point], *, across: bool) -> dict[str, Any]:
    """One cluster's uncalibrated busbw error on the points within (or across) servers;
    ``in_sample`` when the cluster's tables set some of its fabric preset's figures."""
    sources = sorted({f.source for f in cluster.files if (f.nodes != 1) == across})
    fabric = FABRIC_PRESETS[cluster.fabric] if across and cluster.fabric else None
    return {
        "cluster": cluster.name,
        "in_sample": fabric is not None and cluster.name in fabric.fitted_on,
        "description": cluster.description,
        "nodes": sorted({p.num_nodes for p in points}),
        "num_points": len(points),
        "busbw_mape_pct": busbw_mape(points),
        "mean_busbw_error_pct": sum(p.busbw_error_pct for p in points) / len(points),
        "sources": sources,
    }


def preset_checks(server: str, fabric: str | None, root: Path = COLLECTIVES_DIR) -> dict[str, Any]:
    """How the uncalibrated presets compare with the shipped public measurements: ``node`` from
    single-server points of clusters on ``server``, ``fabric_checks`` from multi-server points of
    clusters on ``fabric`` (sizes >= 1 MiB). Empty lists: nothing public to check against."""
    out: dict[str, Any] = {"node": [], "fabric_checks": []}
    if not root.is_dir():
        return out
    for cluster in load_clusters(root):
        on_node, on_fabric = (
            cluster.server == server,
            fabric is not None and cluster.fabric == fabric,
        )
        if not (on_node or on_fabric):
            continue
        points = [
            p
            for records, factory in cluster.groups()
            for p in compare_records(records, factory, None)
            if p.size_bytes >= MIN_SCORED_BYTES
        ]
        inside = [p for p in points if p.num_nodes == 1]
        across = [p for p in points if p.num_nodes > 1]
        if on_node and inside:
            out["node"].append(_check(cluster, inside, across=False))
        if on_fabric and across:
            out["fabric_checks"].append(_check(cluster, across, across=True))
    return out
