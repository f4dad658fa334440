"""The offload section of the ``commsim plan`` report: host traffic, CPU step, host memory.

Reads ``PlanResult.offload`` (``sim.replay.offload.offload_summary``): the PCIe bytes of one GPU
per step each way with the rate its server's shared links leave it, the NVMe bytes, the CPU
optimizer step and what its rate rests on, and the host memory (and NVMe space) one server
needs against what it has. GB and GB/s are 1e9, GiB 2**30.

    lines = offload_lines(result.offload)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GIB = 2**30
"""Bytes per GiB."""
_WIDTH = 28


def offload_lines(summary: Mapping[str, Any]) -> list[str]:
    """The report's offload section (empty for a plan that offloads nothing)."""
    if not summary:
        return []
    pin = "pinned" if summary["pin_memory"] else "pageable"
    framework = f"{summary['framework']}: " if summary.get("framework") else ""
    lines = [
        f"Offload ({framework}optimizer on {summary['optimizer']}, parameters on "
        f"{summary['param']}, {pin} host buffers)",
        _row(
            "  PCIe per GPU per step",
            f"{summary['pcie_d2h_bytes_per_gpu'] / 1e9:.2f} GB to host at "
            f"{summary['pcie_d2h_bytes_per_s_per_gpu'] / 1e9:.1f} GB/s, "
            f"{summary['pcie_h2d_bytes_per_gpu'] / 1e9:.2f} GB to GPU at "
            f"{summary['pcie_h2d_bytes_per_s_per_gpu'] / 1e9:.1f} GB/s",
        ),
    ]
    read, write = summary["nvme_read_bytes_per_gpu"], summary["nvme_write_bytes_per_gpu"]
    if read or write:
        lines.append(
            _row("  NVMe per GPU per step", f"read {read / 1e9:.2f} GB, write {write / 1e9:.2f} GB")
        )
    lines.append(
        _row(
            "  CPU optimizer step",
            f"{summary['cpu_optimizer_s'] * 1e3:.1f} ms ({summary['cpu_adam_basis']})",
        )
    )
    if summary.get("cpu_grad_accumulate_s"):
        lines.append(
            _row(
                "  CPU gradient accumulation",
                f"{summary['cpu_grad_accumulate_s'] * 1e3:.1f} ms (FSDP2 adds each later "
                "micro-batch's shards into the CPU gradients)",
            )
        )
    memory = summary["host_memory_bytes_per_node"]
    lines.append(_row("  Host memory per node", _fit(memory["total"], summary["host_ram_bytes"])))
    parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in memory.items() if k != "total" and v)
    if parts:
        lines.append(_row("", f"(GiB: {parts})"))
    if summary["nvme_bytes_per_node"]:
        lines.append(
            _row(
                "  NVMe per node",
                _fit(summary["nvme_bytes_per_node"], summary["nvme_capacity_bytes"]),
            )
        )
    return lines


def _fit(need: float, have: float | None) -> str:
    if not have:
        return f"{need / GIB:.1f} GiB (the node's capacity is not in the catalogue: not judged)"
    verdict = "fits" if need <= have else f"DOES NOT FIT ({(need - have) / GIB:.1f} GiB over)"
    return f"{need / GIB:.1f} GiB of {have / GIB:.1f} GiB: {verdict}"


def _row(label: str, value: str) -> str:
    return f"{label:<{_WIDTH}}{value}"
