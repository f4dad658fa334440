"""``commsim topo``: describe (and draw) a cluster so it can be checked against a datasheet.

Prints GPU and switch counts, per-GPU bandwidth into NVLink, the network and PCIe (nominal and
effective, GB/s per direction), the bisection, the oversubscription at each fabric tier, whether
the NVSwitches (NVLS) and the fabric's switches (SHARP) reduce, the transport's latencies and who
picks NCCL's algorithm, and the hop counts between GPU pairs; ``--draw`` writes a matplotlib
drawing; ``--json`` prints the same figures as JSON.

    commsim topo dgx-h100 --nodes 128 --fabric ib-ndr --oversubscription 2 --draw cluster.png
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from fileio.output import check_outputs
from topologies.config import cluster_from_mapping, cluster_mapping
from topologies.draw import FORMATS as DRAWING_FORMATS
from topologies.fabrics import FABRIC_PRESETS
from topologies.hardware import GBPS, GIB, LINKS
from topologies.nodes import NODE_PRESETS
from topologies.topology import NODE_KINDS, Topology, count_by_kind

_HOP_CLASSES = ("intra-node", "same leaf", "via spine", "via core")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``commsim topo``."""
    parser.add_argument("cluster", help="node preset (dgx-h100, ...) or cluster YAML file")
    parser.add_argument("--nodes", type=int, default=None, help="number of servers")
    parser.add_argument(
        "--fabric", default=None, help=f"fabric preset ({', '.join(FABRIC_PRESETS)})"
    )
    parser.add_argument(
        "--oversubscription", type=float, default=None, help="leaf down:up ratio (default 1)"
    )
    parser.add_argument(
        "--gpus-per-node", type=int, default=None, help="override GPUs (processes) per server"
    )
    parser.add_argument("--draw", metavar="PNG", default=None, help="write a drawing here")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def _mapping(args: argparse.Namespace) -> dict[str, Any]:
    """The cluster mapping of the positional argument with the command-line overrides."""
    data = dict(cluster_mapping(args.cluster))
    for key, value in (
        ("num_nodes", args.nodes),
        ("fabric", args.fabric),
        ("oversubscription", args.oversubscription),
    ):
        if value is not None:
            data[key] = value
    if args.gpus_per_node is not None:
        node = data.get("node")
        data["node"] = (
            {"base": node, "num_gpus": args.gpus_per_node}
            if isinstance(node, str)
            else {**(node or {}), "num_gpus": args.gpus_per_node}
        )
    return data


def _hops(topology: Topology) -> dict[str, dict[str, Any]]:
    """One representative GPU pair per hop class, from a handful of candidate pairs."""
    per_node = topology.gpus_per_node
    last = topology.num_gpus - 1
    candidates = [1, per_node, per_node + 1, last - per_node + 1, last]
    if topology.fabric is not None:
        unit = topology.fabric.leaf_down_ports * per_node  # first GPU of the next leaf group
        candidates += [unit, unit + 1]
    found: dict[str, dict[str, Any]] = {}
    for dst in candidates:
        if not 0 < dst < topology.num_gpus:
            continue
        path = topology.path(0, dst)
        kinds = {topology.graph.nodes[v]["kind"] for _, v in path}
        label = next(
            (name for name, kind in (("via core", "core"), ("via spine", "spine"),
                                     ("same leaf", "leaf")) if kind in kinds),
            "intra-node",
        )  # fmt: skip
        if label not in found:
            found[label] = {
                "pair": [0, dst],
                "hops": len(path),
                "links": [topology.graph.edges[e]["kind"] for e in path],
                "latency_us": topology.path_latency_s(path) * 1e6,
            }
    return {label: found[label] for label in _HOP_CLASSES if label in found}


def _bandwidth(topology: Topology, tier: str) -> dict[str, float]:
    return {
        "nominal_gbps": topology.injection_bandwidth_bytes_per_s(0, tier) / GBPS,
        "effective_gbps": topology.injection_bandwidth_bytes_per_s(0, tier, effective=True) / GBPS,
    }


def _per_gpu(topology: Topology) -> dict[str, dict[str, float]]:
    bandwidth = {tier: _bandwidth(topology, tier) for tier in ("nvlink", "network", "pcie")}
    loopback = [d for _, _, d in topology.graph.out_edges(topology.gpus[0], data=True)
                if d["kind"] == "loopback"]  # fmt: skip
    if loopback:
        bandwidth["loopback"] = {
            "nominal_gbps": sum(d["bandwidth_bytes_per_s"] for d in loopback) / GBPS,
            "effective_gbps": sum(d["effective_bandwidth_bytes_per_s"] for d in loopback) / GBPS,
        }
    return bandwidth


def summarize(topology: Topology) -> dict[str, Any]:
    """The figures ``commsim topo`` prints, as a JSON-ready mapping."""
    gpu = topology.gpu_spec(0)
    counts = count_by_kind(topology.graph, NODE_KINDS)
    node = topology.node
    summary: dict[str, Any] = {
        "name": topology.name,
        "servers": topology.num_nodes,
        "gpus": topology.num_gpus,
        "gpus_per_server": topology.gpus_per_node,
        "gpu": {
            "model": gpu.name,
            "hbm_gib": gpu.hbm_bytes / GIB,
            "hbm_tbps": gpu.hbm_bandwidth_bytes_per_s / 1e12,
            "bf16_tflops": gpu.peak_flops_per_s.get("bf16", 0.0) / 1e12,
        },
        "counts": {kind: counts[kind] for kind in NODE_KINDS if kind != "gpu"},
        "nvls": topology.nvls_capable(),
        "per_gpu_gbps": _per_gpu(topology),
        "bisection_gbps": {
            "nominal": topology.bisection_bandwidth_bytes_per_s() / GBPS,
            "effective": topology.bisection_bandwidth_bytes_per_s(effective=True) / GBPS,
        },
        "hops": _hops(topology),
    }
    if node is not None:
        summary["links"] = {"nvlink": node.nvlink, "pcie": node.pcie, "nic": node.nic}
        summary["nics_per_server"] = node.nics_per_node
        if node.nic is not None:
            nic = LINKS[node.nic]
            summary["nic"] = {
                "line_rate_gbps": nic.nominal_bandwidth_bytes_per_s / GBPS,
                "lanes": nic.num_lanes,
                "source": nic.source,
            }
    if topology.fabric is not None:
        fabric = topology.fabric
        spec = fabric.spec
        step = spec.step_latency_s
        summary["fabric"] = {
            "name": spec.name,
            "link": fabric.link.name,
            "radix": spec.radix,
            "tiers": fabric.num_tiers,
            "rail_optimized": spec.rail_optimized,
            "leaf_ports_down_up": [fabric.leaf_down_ports, fabric.leaf_up_ports],
            "oversubscription": fabric.tier_oversubscription(),
            "sharp": spec.sharp,
            "collnet": spec.collnet,
            "transport": spec.transport,
            "plugin_latency_us": spec.plugin_latency_s * 1e6,
            "step_latency_us": None if step is None else step * 1e6,
            "simple_extra_latency_us": spec.simple_extra_latency_s * 1e6,
            "message_gap_us": spec.message_gap_s * 1e6,
            "channels": spec.channels,
            "tuner": spec.tuner,
            "source": spec.source,
        }
    return summary


def _row(label: str, figures: dict[str, float], note: str = "") -> str:
    nominal, effective = figures["nominal_gbps"], figures["effective_gbps"]
    return f"  {label:<12}{nominal:>12,.1f}{effective:>12,.1f}   {note}".rstrip()


def _network_note(summary: dict[str, Any]) -> str:
    nic = summary.get("links", {}).get("nic")
    if nic is None:
        return "no NICs"
    per_gpu = summary["nics_per_server"] / summary["gpus_per_server"]
    share = "1 NIC per GPU" if per_gpu == 1 else f"{per_gpu:g} NICs per GPU"
    if "fabric" not in summary:
        link = LINKS[nic]
        return (
            f"{share} ({nic}, {link.nominal_bandwidth_bytes_per_s / GBPS:g} GB/s), "
            "not attached: single server, no fabric"
        )
    lanes = summary["nic"]["lanes"]
    ports = f"{nic}, {lanes} lanes of {summary['nic']['line_rate_gbps'] / lanes:g} GB/s"
    return f"{share} ({ports if lanes > 1 else nic})"


_TRANSPORTS = {
    "ib": "NCCL's IB verbs (InfiniBand or RoCE)",
    "ofi": "aws-ofi-nccl over EFA",
    "tcpx": "GPUDirect-TCPX(O) plugin",
}


def _fabric_lines(fabric: dict[str, Any]) -> list[str]:
    """SHARP, the transport's latencies and the tuner, as ``render`` prints them."""
    step = fabric["step_latency_us"]
    per_message = (
        "NCCL's NET hwLat table (2.7-14 us per inter-node step)"
        if step is None
        else f"{step:g} us per inter-node step"
        + (f" (+{fabric['simple_extra_latency_us']:g} us Simple)"
           if fabric["simple_extra_latency_us"] else "")
    )  # fmt: skip
    tuner = (
        "NCCL's tuner"
        if fabric["tuner"] == "nccl"
        else f"the {fabric['tuner']} tuner plugin (NCCL's tuner outside its regions)"
    )
    if fabric["sharp"] and fabric["collnet"]:
        sharp = "yes (SHARP switches, NCCL_COLLNET_ENABLE=1: CollNet, NVLS across nodes)"
    elif fabric["sharp"]:
        sharp = "no (SHARP switches, but NCCL's CollNet is off: NCCL_COLLNET_ENABLE unset)"
    else:
        sharp = "no"
    lines = [
        f"in-network reduction: {sharp}",
        f"transport: {_TRANSPORTS[fabric['transport']]}; plugin-reported latency "
        f"{fabric['plugin_latency_us']:g} us (NCCL's tuner adds it per inter-node step)",
        f"per-message latency: {per_message}; algorithm and protocol: {tuner}",
    ]
    if fabric["message_gap_us"] or fabric["channels"]:
        gap = fabric["message_gap_us"]
        lines.append(
            (f"at least {gap:g} us per 512 KiB network message on a channel (Ring/Simple)"
             if gap else "no per-message gap")
            + (f"; {fabric['channels']} channels pinned (NCCL_MIN/MAX_NCHANNELS)"
               if fabric["channels"] else "")
        )  # fmt: skip
    return lines


def _check_lines(checks: dict[str, Any]) -> list[str]:
    """The presets against public nccl-tests results, or "unvalidated" where none is shipped."""
    lines = [
        "checked against public nccl-tests results (uncalibrated busbw error, sizes >= 1 MiB; "
        "commsim validate --collectives):"
    ]
    if checks.get("oversubscribed"):
        lines.append("  (measured on the preset fabric, not oversubscribed)")
    named = [("server", checks["server"], checks["node"])]
    if checks["fabric"] is not None:
        named.append(("fabric", checks["fabric"], checks["fabric_checks"]))
    for kind, name, found in named:
        if not found:
            where = "within one server" if kind == "server" else "across servers"
            lines.append(f"  {kind} {name}: unvalidated {where} (no public measurement shipped)")
        for check in found:
            nodes = ",".join(map(str, check["nodes"]))
            sample = " (in-sample: its tables set some of this preset's figures)"
            lines.append(
                f"  {kind} {name}: {check['busbw_mape_pct']:.1f}% MAPE "
                f"({check['mean_busbw_error_pct']:+.1f}% mean) over {check['num_points']} points "
                f"at {nodes} node(s) of {check['cluster']} ({check['sources'][0]})"
                + (sample if check.get("in_sample") else "")
            )
    return lines


def render(summary: dict[str, Any]) -> str:
    """The human-readable summary."""
    gpu = summary["gpu"]
    counts = ", ".join(f"{k.replace('_', ' ')} {v:,}" for k, v in summary["counts"].items() if v)
    links = summary.get("links", {})
    bw = summary["per_gpu_gbps"]
    lines = [
        f"cluster: {summary['name']}",
        f"GPUs: {summary['gpus']:,} ({summary['servers']:,} server(s) x "
        f"{summary['gpus_per_server']} {gpu['model']}; {gpu['hbm_gib']:g} GiB HBM at "
        f"{gpu['hbm_tbps']:g} TB/s, {gpu['bf16_tflops']:g} TFLOP/s bf16 dense)",
        f"nodes by kind: {counts}",
        f"in-switch reduction (NVLS): {'yes' if summary['nvls'] else 'no'}",
        "per-GPU bandwidth, GB/s per direction:",
        f"  {'':<12}{'nominal':>12}{'effective':>12}",
        _row("NVLink", bw["nvlink"], f"to its NVLink peers ({links.get('nvlink') or 'none'})"),
        _row("network", bw["network"], _network_note(summary)),
        _row(
            "PCIe", bw["pcie"], f"x16 ({links.get('pcie')})" if bw["pcie"]["nominal_gbps"] else ""
        ),
        *([_row("loopback", bw["loopback"], "to the host")] if "loopback" in bw else []),
        _row(
            "bisection",
            {
                "nominal_gbps": summary["bisection_gbps"]["nominal"],
                "effective_gbps": summary["bisection_gbps"]["effective"],
            },
            "half the GPUs to the other half"
            + (" (max-flow, all paths)" if summary["servers"] == 1 else ""),
        ),
    ]
    fabric = summary.get("fabric")
    if fabric is not None:
        down, up = fabric["leaf_ports_down_up"]
        ratios = ", ".join(f"{tier} {r:.2f}:1" for tier, r in fabric["oversubscription"].items())
        wiring = "rail-optimised" if fabric["rail_optimized"] else "NICs in order"
        lines += [
            f"fabric: {fabric['name']} ({fabric['link']}), radix {fabric['radix']}, "
            f"{fabric['tiers']} tier(s), {wiring}",
            f"oversubscription: {ratios or 'none (one switch)'} (leaf ports {down} down / {up} up)",
            *_fabric_lines(fabric),
        ]
    if (checks := summary.get("checked_against")) is not None:
        lines += _check_lines(checks)
    lines.append("hops between GPUs (rank pair: links on the path, latency):")
    for label, hop in summary["hops"].items():
        path = "-".join(hop["links"])
        lines.append(
            f"  {label:<11} {hop['pair'][0]} -> {hop['pair'][1]}: {hop['hops']} ({path}), "
            f"{hop['latency_us']:.2f} us"
        )
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Build the cluster, print its summary, and draw it if asked."""
    where = "cluster" if args.cluster in NODE_PRESETS else args.cluster
    inputs = () if args.cluster in NODE_PRESETS else (args.cluster,)
    targets = check_outputs({"--draw": (args.draw, DRAWING_FORMATS)}, inputs=inputs)
    topology = cluster_from_mapping(_mapping(args), where=where)
    summary = summarize(topology)
    if args.cluster in NODE_PRESETS:
        from sim.validation.collectives import preset_checks

        fabric = summary.get("fabric", {}).get("name")
        summary["checked_against"] = {
            "server": args.cluster, "fabric": fabric, **preset_checks(args.cluster, fabric),
            "oversubscribed": (args.oversubscription or 1.0) > 1.0,
        }  # fmt: skip
    print(json.dumps(summary, indent=2) if args.json else render(summary))
    if (drawing := targets.get("--draw")) is not None:
        from topologies.draw import draw_topology

        draw_topology(topology, drawing)
        if not args.json and not drawing.is_stdout:
            print(f"drawing written to {drawing.name}")
    return 0
