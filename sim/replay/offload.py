"""Offload on the replay: host copies over the topology's PCIe links, CPU Adam, NVMe swaps.

``schedules.offload`` says what moves (bytes per copy, per step); this module says how long it
takes on a cluster:

- **PCIe.** A copy between a GPU and its host memory crosses the GPU's link to its PCIe switch
  and the switch's uplink to the CPU socket it hangs under (``topologies.nodes``: the buffers
  are taken NUMA-local, as ``deepspeed --bind_cores_to_rank`` or ``numactl`` place them). Every
  GPU of a server copies at the same time (the data-parallel ranks are symmetric), so each link
  is shared by the GPUs whose path crosses it: two GPUs behind one switch share its uplink. A
  GPU's rate is the narrowest ``effective bandwidth / GPUs sharing`` on its path (NCCL's PCIe
  budget, 24 GB/s on Gen4 x16 and 48 on Gen5, about what ``cudaMemcpy`` of pinned memory
  reaches). Pageable buffers (``pin_memory`` false) are staged through a pinned bounce buffer by
  the driver: ``PAGEABLE_FRACTION`` of that.
- **CPU Adam.** Memory-bound (``schedules.offload.CPU_ADAM_BYTES_PER_PARAM``): the ranks of a
  server share its sockets' sustained memory bandwidth (``topologies.hardware.CPUS``); a compute
  calibration's measured ``cpu_adam_params_per_s`` (``commbench --compute --device cpu``, all
  cores of the host) replaces it, shared the same way.
- **NVMe.** The server's drives striped (their bandwidths add up), shared by its ranks.

The copies are program actions of ``schedules.offload.COPY_OPS`` (DeepSpeed's placed by its step
builders, FSDP's by ``schedules.fsdp_offload``), and FSDP2's accumulation of gradient shards on
the host is a ``CPU_ADD`` action timed at the CPU optimizer's bandwidth; ``HostCopyRunner`` times
them (and hands every collective to the network model). They do not slow the compute down: copy
engines and the CPU run them, not SMs.

    rates = host_rates(topology, plan, calibration=None)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import networkx as nx
import simpy

from schedules.actions import Compute, Program
from schedules.data_parallel.registry import offload_of, replica_group_size
from schedules.layout import layout_of
from schedules.offload import (
    COPY_OPS,
    CPU_ADD,
    Offload,
    cpu_step_bytes,
    host_bytes,
    nvme_bytes,
    nvme_step_bytes,
    nvme_step_s,
)
from schedules.params import stage_params_per_gpu
from schedules.plan import Plan, num_microbatches
from sim.replay.engine import CommRunner
from sim.replay.result import Span
from topologies.hardware import CPUS, NVMES
from topologies.topology import Topology
from vocab.compute_calibration import ComputeCalibration

PAGEABLE_FRACTION = 0.5
"""Copy rate to or from pageable host memory relative to pinned: the CUDA driver stages it
through a pinned bounce buffer in chunks, serialising a host memcpy with the DMA (NVIDIA's CUDA
C++ Best Practices Guide, "Pinned Memory"; bandwidthTest --memory=pageable typically shows about
half the pinned rate on PCIe Gen4/Gen5 hosts)."""
COPY_LATENCY_S = 10e-6
"""Fixed cost of one cudaMemcpyAsync (launch and DMA set-up, about 10 us)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HostRates:
    """One rank's share of its server's host resources when every rank uses them at once."""

    d2h_bytes_per_s: float
    """GPU to host memory over PCIe."""
    h2d_bytes_per_s: float
    """Host memory to GPU over PCIe."""
    adam_bytes_per_s: float
    """Host memory bandwidth available to this rank's CPU optimizer step."""
    nvme_read_bytes_per_s: float
    """NVMe to host memory (0: the server has no drives in the catalogue)."""
    nvme_write_bytes_per_s: float
    """Host memory to NVMe."""
    adam_basis: str
    """Where the CPU Adam rate comes from (catalogue CPU or a measurement)."""


def pcie_bytes_per_s(topology: Topology, rank: int) -> float:
    """``rank``'s rate to its host socket while every GPU of its server copies at once."""
    graph = topology.graph
    node = topology.node_index(rank)
    gpus = [g for g in topology.gpus if graph.nodes[g]["node_index"] == node]
    paths = {g: _host_path(graph, g) for g in gpus}
    load: dict[tuple[str, str], int] = {}
    for path in paths.values():
        for edge in path:
            load[edge] = load.get(edge, 0) + 1
    own = paths[topology.gpus[rank]]
    edges = graph.edges
    return min(edges[e]["effective_bandwidth_bytes_per_s"] / load[e] for e in own)


def _host_path(graph: nx.DiGraph, gpu: str) -> tuple[tuple[str, str], ...]:
    """The PCIe edges from ``gpu`` up to the first CPU socket (GPU -> switch -> socket)."""
    pcie = nx.subgraph_view(graph, filter_edge=lambda u, v: graph.edges[u, v]["kind"] == "pcie")
    hops = nx.single_source_shortest_path(pcie, gpu)
    sockets = [n for n in hops if graph.nodes[n]["kind"] == "cpu"]
    if not sockets:
        raise ValueError(
            f"offload needs a PCIe path from each GPU to a CPU socket; {gpu} has none (a "
            "'loopback' localhost node has no PCIe tree)"
        )
    nearest = min(sockets, key=lambda n: (len(hops[n]), n))
    path = hops[nearest]
    return tuple(itertools.pairwise(path))


def host_rates(
    topology: Topology, plan: Plan, *, calibration: ComputeCalibration | None = None
) -> HostRates:
    """Rates of rank 0 (every server is alike; the slowest GPU of the first one sets the pace)."""
    offload = offload_of(plan.parallel)
    pin = offload is None or offload.pin_memory
    # ZeRO-1/2 pin the fp32 master partition whatever pin_memory says (stage_1_and_2.py), so
    # the step's copy to the GPU is pinned; pin_memory decides for the gradient buffers.
    pinned_master = offload is not None and offload.zero_stage in (1, 2)
    node = topology.node
    per_node = topology.gpus_per_node
    pcie = min(pcie_bytes_per_s(topology, r) for r in range(per_node))
    measured = None if calibration is None else calibration.cpu_adam_params_per_s
    if measured is not None:
        adam = measured * 28.0 / per_node
        basis = f"measured CPU Adam {measured / 1e9:.2f} Gparam/s for the host, / {per_node} ranks"
    elif node is not None and node.cpu_model is not None:
        cpu = CPUS[node.cpu_model]
        adam = cpu.sustained_bandwidth_bytes_per_s * node.num_cpus / per_node
        basis = (
            f"{node.num_cpus} x {cpu.name} at {cpu.sustained_bandwidth_bytes_per_s / 1e9:.0f} "
            f"GB/s sustained, / {per_node} ranks"
        )
    else:
        name = "custom node" if node is None else node.name
        raise ValueError(
            f"offload runs Adam on the CPU: the {name} has no cpu_model (a CPUS key: "
            f"{', '.join(CPUS)}); set cluster.node.cpu_model or pass a compute calibration "
            "with cpu_adam_params_per_s (commbench --compute --device cpu)"
        )
    read = write = 0.0
    if node is not None and node.nvme is not None:
        drive = NVMES[node.nvme]
        read = drive.read_bytes_per_s * node.num_nvme / per_node
        write = drive.write_bytes_per_s * node.num_nvme / per_node
    return HostRates(
        d2h_bytes_per_s=pcie * (1.0 if pin else PAGEABLE_FRACTION),
        h2d_bytes_per_s=pcie * (1.0 if pin or pinned_master else PAGEABLE_FRACTION),
        adam_bytes_per_s=adam,
        nvme_read_bytes_per_s=read,
        nvme_write_bytes_per_s=write,
        adam_basis=basis,
    )


def copy_time_s(rates: HostRates, op: str, size_bytes: float) -> float:
    """Seconds of one host copy of ``size_bytes``."""
    rate = {
        "d2h": rates.d2h_bytes_per_s,
        "h2d": rates.h2d_bytes_per_s,
        "nvme_read": rates.nvme_read_bytes_per_s,
        "nvme_write": rates.nvme_write_bytes_per_s,
    }[op]
    if rate <= 0:
        raise ValueError(
            f"the plan moves data to NVMe but the node has no NVMe drives in the catalogue "
            f"(node.nvme, node.num_nvme); {op} of {size_bytes:.3g} bytes cannot be timed"
        )
    return COPY_LATENCY_S + size_bytes / rate


def check_nvme(plan: Plan, rates: HostRates) -> None:
    """A plan that swaps to NVMe needs drives on its node: one line otherwise."""
    offload = offload_of(plan.parallel)
    uses = offload is not None and "nvme" in (offload.optimizer, offload.param)
    if uses and rates.nvme_read_bytes_per_s <= 0:
        raise ValueError(
            "parallel.offload_* = 'nvme' needs NVMe drives on the node: set cluster.node.nvme "
            f"(one of {', '.join(NVMES)}) and num_nvme, or use a preset that has them"
        )


def cpu_optimizer_s(
    offload: Offload, rates: HostRates, *, params: float, shards: int, precision: str
) -> float:
    """The CPU step of one rank: Adam (with the fp16 unscale and ZeRO-3's CPU cast), and with
    optimizer states on NVMe their swap-in and swap-out, overlapped as configured."""
    cpu_s = cpu_step_bytes(offload, params=params, shards=shards, precision=precision)
    cpu_s /= rates.adam_bytes_per_s
    read, write = nvme_step_bytes(offload, params=params, shards=shards)
    if not read and not write:
        return cpu_s
    return nvme_step_s(
        offload,
        read_s=read / rates.nvme_read_bytes_per_s,
        cpu_s=cpu_s,
        write_s=write / rates.nvme_write_bytes_per_s,
    )


class HostCopyRunner:
    """A ``CommRunner`` that times host copies itself and passes collectives on (state: none
    beyond its references)."""

    def __init__(self, env: simpy.Environment, inner: CommRunner, rates: HostRates) -> None:
        self.env = env
        self.inner = inner
        self.rates = rates

    def run(self, op: str, ranks: Sequence[int], size_bytes: float) -> simpy.Event:
        """A timeout for a host copy or CPU add; the inner runner's event for anything else."""
        if op in COPY_OPS:
            return self.env.timeout(copy_time_s(self.rates, op, size_bytes))
        if op == CPU_ADD:
            return self.env.timeout(size_bytes / self.rates.adam_bytes_per_s)
        return self.inner.run(op, ranks, size_bytes)


def copy_bytes_by_op(spans: Sequence[object], rank: int) -> dict[str, float]:
    """Bytes each host-copy op moved on ``rank`` in a replayed step (from its spans)."""
    out = dict.fromkeys(COPY_OPS, 0.0)
    for span in spans:
        if getattr(span, "rank", None) == rank and getattr(span, "stream", "") in out:
            out[span.stream] += float(getattr(span, "size_bytes", 0.0))  # type: ignore[attr-defined]
    return {op: size for op, size in out.items() if math.isfinite(size)}


@dataclass(frozen=True, slots=True, kw_only=True)
class OffloadReplay:
    """An offloading plan's host side on its cluster: rates and the CPU step per stage."""

    rates: HostRates
    """One rank's share of the host's links, memory and drives."""
    optimizer_s: dict[int, float]
    """CPU optimizer step (with its NVMe swaps) of one rank, by pipeline stage."""

    def apply(self, programs: Sequence[Program]) -> list[Program]:
        """``programs`` with their optimizer step timed as the CPU step of their stage."""
        out = []
        for program in programs:
            seconds = self.optimizer_s[program.stage]
            actions = tuple(
                dataclasses.replace(a, duration_s=seconds)
                if isinstance(a, Compute) and a.kind == "optimizer" and a.name == "optimizer"
                else a
                for a in program.actions
            )
            out.append(dataclasses.replace(program, actions=actions))
        return out


def offload_replay(
    plan: Plan, topology: Topology, *, calibration: ComputeCalibration | None = None
) -> OffloadReplay | None:
    """The host side of a resolved plan (None when it offloads nothing)."""
    offload = offload_of(plan.parallel)
    if offload is None:
        return None
    rates = host_rates(topology, plan, calibration=calibration)
    check_nvme(plan, rates)
    shards = replica_group_size(plan, gpus_per_node=topology.gpus_per_node)
    precision = plan.training.precision
    optimizer_s = {
        stage: cpu_optimizer_s(
            offload,
            rates,
            params=stage_params_per_gpu(plan, stage),
            shards=shards,
            precision=precision,
        )
        for stage in range(plan.parallel.pp)
    }
    return OffloadReplay(rates=rates, optimizer_s=optimizer_s)


def host_memory_per_node(plan: Plan, gpus_per_node: int) -> dict[str, float]:
    """Host bytes by component (and ``total``) on the first server: every rank's CPU buffers,
    each rank with its own pipeline stage's parameters (servers are alike)."""
    layout = layout_of(plan)
    shards = replica_group_size(plan, gpus_per_node=gpus_per_node)
    num_micro = num_microbatches(plan)
    offload = offload_of(plan.parallel)
    total: dict[str, float] = {}
    for rank in range(min(gpus_per_node, layout.world_size)):
        stage = layout.coords(rank)["pp"]
        params = stage_params_per_gpu(plan, stage)
        rank_bytes = host_bytes(offload, plan, params=params, shards=shards, num_micro=num_micro)
        for key, size in rank_bytes.items():
            total[key] = total.get(key, 0.0) + size
    total["total"] = sum(total.values())
    return total


def nvme_per_node(plan: Plan, gpus_per_node: int) -> float:
    """NVMe bytes the first server's ranks keep on its drives."""
    layout = layout_of(plan)
    shards = replica_group_size(plan, gpus_per_node=gpus_per_node)
    offload = offload_of(plan.parallel)
    return sum(
        nvme_bytes(
            offload, params=stage_params_per_gpu(plan, layout.coords(r)["pp"]), shards=shards
        )
        for r in range(min(gpus_per_node, layout.world_size))
    )


def offload_summary(
    plan: Plan, topology: Topology, host: OffloadReplay, spans: Sequence[Span], rank: int
) -> dict[str, Any]:
    """What ``commsim plan`` reports of an offloading step: the host traffic of ``rank`` (the
    critical one), its CPU step, and the host memory and NVMe space of one server."""
    offload = offload_of(plan.parallel)
    assert offload is not None
    node = topology.node
    moved = copy_bytes_by_op(spans, rank)
    stage = layout_of(plan).coords(rank)["pp"]
    shards = replica_group_size(plan, gpus_per_node=topology.gpus_per_node)
    read, write = nvme_step_bytes(offload, params=stage_params_per_gpu(plan, stage), shards=shards)
    memory = host_memory_per_node(plan, topology.gpus_per_node)
    ram = node.host_memory_bytes if node is not None and node.host_memory_bytes else None
    nvme = nvme_per_node(plan, topology.gpus_per_node)
    capacity = None
    if node is not None and node.nvme is not None:
        capacity = NVMES[node.nvme].capacity_bytes * node.num_nvme
    return {
        "framework": framework_of(offload),
        "optimizer": offload.optimizer,
        "param": offload.param,
        "pin_memory": offload.pin_memory,
        "pcie_d2h_bytes_per_gpu": moved["d2h"],
        "pcie_h2d_bytes_per_gpu": moved["h2d"],
        "pcie_d2h_bytes_per_s_per_gpu": host.rates.d2h_bytes_per_s,
        "pcie_h2d_bytes_per_s_per_gpu": host.rates.h2d_bytes_per_s,
        "nvme_read_bytes_per_gpu": moved["nvme_read"] + read,
        "nvme_write_bytes_per_gpu": moved["nvme_write"] + write,
        "cpu_optimizer_s": host.optimizer_s[stage],
        "cpu_grad_accumulate_s": sum(
            s.end_s - s.start_s for s in spans if s.rank == rank and s.stream == CPU_ADD
        ),
        "cpu_adam_basis": host.rates.adam_basis,
        "host_memory_bytes_per_node": memory,
        "host_ram_bytes": ram,
        "host_fits": None if ram is None else memory["total"] <= ram,
        "nvme_bytes_per_node": nvme,
        "nvme_capacity_bytes": capacity,
        "nvme_fits": None if not nvme or capacity is None else nvme <= capacity,
    }


def framework_of(offload: Offload) -> str:
    """The framework feature a plan's offload stands for, as its users name it."""
    if offload.fsdp:
        if offload.fsdp2:
            return f"FSDP2 CPUOffloadPolicy(pin_memory={offload.pin_memory})"
        return "FSDP1 CPUOffload(offload_params=True)"
    name = "ZeRO-Infinity" if "nvme" in (offload.optimizer, offload.param) else "ZeRO-Offload"
    return f"DeepSpeed {name}, zero{offload.zero_stage}"


def host_part(calibration: Any, gpu: Any) -> Any:
    """A CPU-measured compute calibration reduced to its CPU Adam rate when the plan runs on a
    GPU (its GEMM curves are the host's, not the GPU's); anything else unchanged."""
    adam = getattr(calibration, "cpu_adam_params_per_s", None)
    if getattr(calibration, "gpu", "") != "cpu" or gpu.name == "cpu" or adam is None:
        return calibration
    return ComputeCalibration(device=calibration.device, cpu_adam_params_per_s=adam)
