"""The topology a user chooses by flags: a node preset (with nodes, fabric, oversubscription) or
a cluster YAML file, as a factory of topologies sized to the records being simulated.

    factory = topology_factory(parser.parse_args(["--topology", "dgx-h100", "--nodes", "2"]))
"""

from __future__ import annotations

import argparse

from sim.network.fitting import TopologyFactory
from topologies.config import load_cluster
from topologies.fabrics import FABRIC_PRESETS
from topologies.presets import NODE_PRESETS, build_cluster
from topologies.topology import Topology


def add_topology_arguments(parser: argparse.ArgumentParser) -> None:
    """``--topology``, ``--nodes``, ``--fabric``, ``--oversubscription``, ``--nccl-version``
    (shared by commands)."""
    parser.add_argument(
        "--topology", required=True,
        help=f"node preset ({', '.join(NODE_PRESETS)}) or a cluster YAML file",
    )  # fmt: skip
    parser.add_argument("--nodes", type=int, default=None, help="servers (presets only)")
    parser.add_argument(
        "--fabric", default=None,
        help=f"fabric preset for several servers ({', '.join(FABRIC_PRESETS)})",
    )  # fmt: skip
    parser.add_argument(
        "--oversubscription", type=float, default=1.0, help="leaf down:up capacity ratio"
    )
    parser.add_argument(
        "--nccl-version", default="",
        help="the NCCL release the cluster runs, as NCCL prints it (e.g. 2.26.2): its tuning "
        "tables pick the algorithm and protocol (default: the model's own, 2.30.7)",
    )  # fmt: skip


def topology_factory(args: argparse.Namespace) -> TopologyFactory:
    """(num_nodes, ranks_per_node) -> Topology, from the topology flags."""
    name = args.topology
    release = getattr(args, "nccl_version", "") or ""
    if args.nodes is not None and args.nodes < 1:
        raise ValueError(f"--nodes {args.nodes}: must be an integer >= 1")
    if name not in NODE_PRESETS:
        if args.nodes is not None or args.fabric is not None or release:
            raise ValueError(
                f"--nodes/--fabric/--nccl-version apply to node presets, not to the file {name!r} "
                "(a cluster file names its nccl_version)"
            )
        fixed = load_cluster(name)
        return lambda _nodes, _per_node: fixed
    cache: dict[tuple[int, int], Topology] = {}

    def build(num_nodes: int, ranks_per_node: int) -> Topology:
        count = max(num_nodes, args.nodes or 1)
        per_node = ranks_per_node if name == "localhost" else None
        found = cache.get((count, ranks_per_node))
        if found is None:
            fabric = args.fabric if count > 1 else None
            found = build_cluster(name, count, fabric, args.oversubscription, per_node, release)
            cache[(count, ranks_per_node)] = found
        return found

    return build
