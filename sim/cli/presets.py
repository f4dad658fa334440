"""``commsim presets``: every name a plan or a command accepts for a model, a server, a fabric, a
GPU or a CPU, with the few figures that tell them apart.

    commsim presets            # all five tables
    commsim presets models     # one of them
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

TABLES = ("models", "nodes", "fabrics", "gpus", "cpus")
"""What ``commsim presets`` lists, in its order."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Define the ``commsim presets`` flags."""
    parser.add_argument(
        "table", nargs="?", choices=TABLES, help="list only this kind (default: every kind)"
    )


def run(args: argparse.Namespace) -> int:
    """Print the tables; returns 0."""
    tables: dict[str, Callable[[], list[str]]] = {
        "models": model_lines,
        "nodes": node_lines,
        "fabrics": fabric_lines,
        "gpus": gpu_lines,
        "cpus": cpu_lines,
    }
    chosen = [args.table] if args.table else list(TABLES)
    print("\n\n".join("\n".join(tables[name]()) for name in chosen))
    return 0


def model_lines() -> list[str]:
    """Model presets (``model: <name>`` or ``--model <name>``): shape and parameters."""
    from schedules.model_presets import MODEL_PRESETS, resolve_model_preset
    from schedules.params import active_params, total_params
    from schedules.plan import ModelConfig

    lines = [
        "models (plan model: NAME, --model NAME)",
        f"  {'name':<20} {'layers':>6} {'hidden':>7} {'heads':>9} {'vocab':>7} {'seq':>6}"
        f" {'params':>9}",
    ]
    for name in MODEL_PRESETS:
        model = ModelConfig(**resolve_model_preset(name))
        heads = f"{model.num_heads}/{model.num_kv_heads}"
        total, active = total_params(model) / 1e9, active_params(model) / 1e9
        params = f"{total:.1f}B" if total == active else f"{total:.0f}B/{active:.0f}B"
        lines.append(
            f"  {name:<20} {model.num_layers:>6} {model.hidden_size:>7} {heads:>9} "
            f"{model.vocab_size:>7} {model.seq_len:>6} {params:>9}"
        )
    lines.append("  (heads: query/key-value; params: total, or total/active for MoE)")
    return lines


def node_lines() -> list[str]:
    """Server presets (``cluster.node``, ``--cluster NAME[:N]``): GPUs, links, CPUs."""
    from topologies.nodes import NODE_PRESETS

    lines = [
        "nodes (plan cluster.node, --cluster NAME[:N])",
        f"  {'name':<14} {'GPUs':>4} {'gpu':<15} {'intra-node':<13} {'NICs':>4} "
        f"{'default fabric':<14} cpu",
    ]
    for name, spec in NODE_PRESETS.items():
        lines.append(
            f"  {name:<14} {spec.num_gpus:>4} {spec.gpu:<15} {spec.intra:<13} "
            f"{spec.nics_per_node:>4} {spec.default_fabric or '-':<14} "
            f"{spec.num_cpus} x {spec.cpu_model or 'CPU (model not catalogued)'}"
        )
    return lines


def fabric_lines() -> list[str]:
    """Fabric presets (``cluster.fabric``, ``--fabric NAME``): link and switches."""
    from topologies.fabrics import FABRIC_PRESETS
    from topologies.hardware import GBPS, LINKS

    width = max(len(name) for name in FABRIC_PRESETS)
    lines = [
        "fabrics (plan cluster.fabric, --fabric NAME)",
        f"  {'name':<{width}} {'link':<12} {'GB/s':>6} {'radix':>5} {'transport':<9} features",
    ]
    for name, spec in FABRIC_PRESETS.items():
        link = LINKS[spec.link]
        flags = (
            ("rail-optimized", spec.rail_optimized), ("SHARP", spec.sharp),
            ("CollNet", spec.collnet),
            ("Simple only", spec.protocols == ("simple",)),
            (f"{'/'.join(spec.algorithms)} only", bool(spec.algorithms)),
            (f"{spec.channels} channels", bool(spec.channels)),
            (f"{spec.message_gap_s * 1e6:g} us per message", bool(spec.message_gap_s)),
        )  # fmt: skip
        features = [f for f, on in flags if on]
        lines.append(
            f"  {name:<{width}} {spec.link:<12} {link.nominal_bandwidth_bytes_per_s / GBPS:>6.3g} "
            f"{spec.radix:>5} {spec.transport:<9} {', '.join(features) or '-'}"
        )
    lines.append("  (GB/s: nominal, per direction per port)")
    return lines


def gpu_lines() -> list[str]:
    """GPUs (``node: {gpu: NAME, ...}`` in a cluster file): memory and dense peaks."""
    from topologies.hardware import GIB, GPUS

    lines = [
        "gpus (a node's gpu)",
        f"  {'name':<15} {'HBM GiB':>7} {'HBM TB/s':>8} {'16-bit TFLOP/s':>14} {'fp8 TFLOP/s':>11}",
    ]
    for name, gpu in GPUS.items():
        peak = gpu.peak_flops_per_s
        half, fp8 = peak.get("bf16") or peak.get("fp16"), peak.get("fp8")
        half_text, fp8_text = (f"{p / 1e12:.4g}" if p else "-" for p in (half, fp8))
        lines.append(
            f"  {name:<15} {gpu.hbm_bytes / GIB:>7.0f} "
            f"{gpu.hbm_bandwidth_bytes_per_s / 1e12:>8.2f} {half_text:>14} {fp8_text:>11}"
        )
    lines.append("  (16-bit: dense bf16, or fp16 where the GPU has no bf16)")
    return lines


def cpu_lines() -> list[str]:
    """Host CPUs (``cpu_model`` of a node; the CPU optimizer of offloaded plans)."""
    from topologies.hardware import CPUS

    lines = ["cpus (a node's cpu_model)", f"  {'name':<15} {'cores':>5} {'memory GB/s':>11}"]
    for name, cpu in CPUS.items():
        bandwidth = cpu.memory_bandwidth_bytes_per_s / 1e9
        lines.append(f"  {name:<15} {cpu.num_cores:>5} {bandwidth:>11.0f}")
    return lines
