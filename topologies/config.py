"""Cluster YAML files: strict loading into a ``Topology`` and dumping back for a round trip.

The keys are those of a plan file's ``cluster:`` section::

    node: dgx-h100            # a node preset, or a mapping (below)
    num_nodes: 128
    fabric: ib-ndr            # a fabric preset, or a mapping (below); optional for one node
    oversubscription: 2.0     # leaf down:up capacity (1.0 = non-blocking)
    nccl_version: 2.26.2      # the NCCL release its jobs run (optional: the model's own)

A node mapping holds ``NodeSpec`` fields (``base: <preset>`` starts from a preset)::

    node: {base: dgx-h100, num_gpus: 4, nic: ib-xdr}
    node: {gpu: h100-pcie, num_gpus: 8, intra: nvlink-bridge, nvlink: nvlink4-bridge,
           nic: roce-400g, nics_per_node: 4}

A fabric mapping: ``kind: fat-tree``, ``link``, ``radix``, ``tiers``, ``rail_optimized``,
``name`` (``base: <preset>`` starts from a preset). Unknown or missing keys, impossible counts
and unknown catalogue names raise ``ValueError`` with one line naming the key.

    >>> load_cluster({"node": "dgx-h100", "num_nodes": 4, "fabric": "ib-ndr"}).num_gpus
    32
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from fileio.output import Target, write_text
from fileio.strict import did_you_mean, load_yaml, read_input, shorten
from topologies.fabrics import FABRIC_PRESETS, FabricSpec
from topologies.hardware import lookup
from topologies.nodes import NODE_PRESETS, NodeSpec, with_gpus
from topologies.presets import MAX_OVERSUBSCRIPTION, cluster_topology
from topologies.topology import Topology

CLUSTER_KEYS = ("node", "num_nodes", "fabric", "oversubscription", "nccl_version")
"""Keys of a cluster mapping."""
NODE_KEYS = ("base", *(f.name for f in dataclasses.fields(NodeSpec)))
"""Keys of a node mapping."""
FABRIC_KEYS = ("base", "kind", *(f.name for f in dataclasses.fields(FabricSpec)))
"""Keys of a fabric mapping."""
FABRIC_KINDS = ("fat-tree",)
"""Values of a fabric mapping's ``kind``."""
MAX_CLUSTER_BYTES = 1 << 20
"""Largest cluster file read (one is a few hundred bytes)."""
_REQUIRED_NODE = ("gpu", "num_gpus", "intra")
_REQUIRED_FABRIC = ("link", "radix")


def load_cluster(source: str | Path | Mapping[str, Any]) -> Topology:
    """A ``Topology`` from a preset name, a cluster YAML file, or a cluster mapping."""
    if isinstance(source, Mapping):
        return cluster_from_mapping(source, where="cluster")
    return cluster_from_mapping(cluster_mapping(source), where=str(source))


def cluster_mapping(source: str | Path) -> Mapping[str, Any]:
    """The cluster mapping of a node preset name or of a cluster YAML file (not yet checked)."""
    text = str(source)
    if isinstance(source, str) and text in NODE_PRESETS:
        return {"node": text}
    looks_like_file = Path(text).suffix in (".yaml", ".yml") or "/" in text
    if not looks_like_file and not os.path.lexists(text):  # lexists: False for a bad name too
        raise ValueError(
            f"unknown cluster {shorten(text)}{did_you_mean(text, NODE_PRESETS)}; give a node "
            f"preset ({', '.join(NODE_PRESETS)}; commsim presets) or a YAML file"
        )
    data = load_yaml(read_input(text, what="cluster file", max_bytes=MAX_CLUSTER_BYTES), name=text)
    if not isinstance(data, Mapping):
        raise ValueError(f"{text}: expected a mapping with keys {', '.join(CLUSTER_KEYS)}")
    return data


def _check_keys(data: Mapping[str, Any], valid: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in valid:
            raise ValueError(f"{where}: unknown key {shorten(key)}; valid keys: {', '.join(valid)}")


def _set(data: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` that hold a value (YAML ``null`` counts as absent)."""
    return {key: value for key, value in data.items() if value is not None}


def cluster_from_mapping(data: Mapping[str, Any], *, where: str = "cluster") -> Topology:
    """Build the cluster a ``cluster:`` mapping describes (strict)."""
    _check_keys(data, CLUSTER_KEYS, where)
    values = _set(data)
    if "node" not in values:
        raise ValueError(f"{where}: missing key 'node' (a preset: {', '.join(NODE_PRESETS)})")
    node = node_from_yaml(values["node"], where=f"{where}.node")
    fabric = None
    if "fabric" in values:
        fabric = fabric_from_yaml(values["fabric"], where=f"{where}.fabric")
    num_nodes = values.get("num_nodes", 1)
    if not isinstance(num_nodes, int) or isinstance(num_nodes, bool) or num_nodes < 1:
        raise ValueError(f"{where}.num_nodes={shorten(num_nodes)}; must be an integer >= 1")
    ratio = values.get("oversubscription", 1.0)
    number = isinstance(ratio, int | float) and not isinstance(ratio, bool)
    if not number or not 1.0 <= ratio <= MAX_OVERSUBSCRIPTION:
        raise ValueError(
            f"{where}.oversubscription={shorten(ratio)}; must be a number >= 1 "
            f"(at most {MAX_OVERSUBSCRIPTION:g})"
        )
    try:
        return cluster_topology(
            node, num_nodes, fabric, oversubscription=float(ratio),
            nccl_version=values.get("nccl_version", ""),
        )  # fmt: skip
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def node_from_yaml(value: Any, *, where: str = "node") -> NodeSpec:
    """A ``NodeSpec`` from a preset name or a mapping of its fields."""
    if isinstance(value, str):
        return lookup(NODE_PRESETS, value, f"{where} preset")
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}={shorten(value)}; give a preset name or a mapping")
    _check_keys(value, NODE_KEYS, where)
    fields = _set(value)
    base = fields.pop("base", None)
    if base is not None:
        spec = lookup(NODE_PRESETS, base, f"{where}.base preset")
        gpus = fields.get("num_gpus")
        if isinstance(gpus, int) and gpus >= 1:
            spec = with_gpus(spec, gpus)
        fields = {**dataclasses.asdict(spec), **fields}
    missing = [key for key in _REQUIRED_NODE if key not in fields]
    if missing:
        raise ValueError(f"{where}: missing key(s) {', '.join(missing)} (or give 'base')")
    fields.setdefault("name", "custom")
    if fields["intra"] == "loopback":
        fields.setdefault("num_cpus", 1)
    try:
        return NodeSpec(**fields)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def fabric_from_yaml(value: Any, *, where: str = "fabric") -> FabricSpec:
    """A ``FabricSpec`` from a preset name or a mapping of its fields."""
    if isinstance(value, str):
        return lookup(FABRIC_PRESETS, value, f"{where} preset")
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}={shorten(value)}; give a preset name or a mapping")
    _check_keys(value, FABRIC_KEYS, where)
    fields = _set(value)
    kind = fields.pop("kind", "fat-tree")
    if kind not in FABRIC_KINDS:
        raise ValueError(f"{where}.kind={shorten(kind)}; valid: {', '.join(FABRIC_KINDS)}")
    base = fields.pop("base", None)
    if base is not None:
        spec = lookup(FABRIC_PRESETS, base, f"{where}.base preset")
        fields = {**dataclasses.asdict(spec), **fields}
    missing = [key for key in _REQUIRED_FABRIC if key not in fields]
    if missing:
        raise ValueError(f"{where}: missing key(s) {', '.join(missing)} (or give 'base')")
    fields.setdefault("name", "custom")
    if not isinstance(fields.get("rail_optimized", True), bool):
        raise ValueError(
            f"{where}.rail_optimized={shorten(fields['rail_optimized'])}; give true/false"
        )
    try:
        return FabricSpec(**fields)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


def _spec_yaml(spec: Any, presets: Mapping[str, Any]) -> str | dict[str, Any]:
    """A preset's name when ``spec`` is one, else its fields."""
    if presets.get(spec.name) == spec:
        return str(spec.name)
    return {
        key: list(value) if isinstance(value, tuple) else value
        for key, value in dataclasses.asdict(spec).items()
        if value is not None
    }


def dump_cluster(topology: Topology) -> dict[str, Any]:
    """The cluster mapping ``load_cluster`` turns back into an identical ``topology``."""
    if topology.node is None:
        raise ValueError(f"{topology.name}: built without a NodeSpec, so it cannot be dumped")
    data: dict[str, Any] = {
        "node": _spec_yaml(topology.node, NODE_PRESETS),
        "num_nodes": topology.num_nodes,
    }
    if topology.fabric is not None:
        data["fabric"] = _spec_yaml(topology.fabric.spec, FABRIC_PRESETS)
        data["oversubscription"] = topology.fabric.requested_oversubscription
    if topology.nccl_version:
        data["nccl_version"] = topology.nccl_version
    return data


def write_cluster(topology: Topology, target: Target | str | Path) -> None:
    """Write ``dump_cluster(topology)`` as a YAML cluster file (through ``fileio.output``)."""
    write_text(target, yaml.safe_dump(dump_cluster(topology), sort_keys=False))
