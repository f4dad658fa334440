"""One rank's distributed setup: backend, device, process groups, run environment, free memory.

The launcher (torchrun, or commbench's own spawner) sets RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT. With CUDA each rank binds GPU LOCAL_RANK and
uses NCCL; bookkeeping (times, #wrong, host names) goes over a separate gloo group so that
it never queues behind the measured collectives.

    ctx = init_distributed("auto", timeout_s=120.0)
"""

from __future__ import annotations

import os
import platform
import socket
from dataclasses import dataclass
from datetime import timedelta
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch
import torch.distributed as dist

from comm_bench.memory import available_ram_bytes

LAUNCH_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""Environment variables that show a launcher started this process."""


@dataclass(frozen=True, slots=True, kw_only=True)
class DistContext:
    """What this rank is and where it runs."""

    rank: int
    """Global rank."""
    world_size: int
    """Ranks in the world."""
    local_rank: int
    """Rank on this host."""
    local_world_size: int
    """Ranks on this host."""
    backend: str
    """``nccl`` or ``gloo``."""
    device: torch.device
    """Where buffers live."""
    side_group: Any
    """gloo group for bookkeeping (None: the default group is already gloo)."""


def check_launch_env() -> None:
    """Raise one clear ``ValueError`` unless the launcher's variables describe a valid rank."""
    values: dict[str, int] = {}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        text = os.environ.get(name)
        if text is None:
            continue
        if not text.strip().isdigit():
            raise ValueError(f"environment {name}={text[:60]!r} is not a non-negative integer")
        values[name] = int(text)
    world, rank = values.get("WORLD_SIZE", 1), values.get("RANK", 0)
    if world < 1 or rank >= world:
        raise ValueError(f"environment RANK={rank} is not a rank of WORLD_SIZE={world}")
    local_world = values.get("LOCAL_WORLD_SIZE", world)
    if values.get("LOCAL_RANK", 0) >= max(local_world, 1):
        raise ValueError(
            f"environment LOCAL_RANK={values['LOCAL_RANK']} is not below "
            f"LOCAL_WORLD_SIZE={local_world}"
        )
    if not 1 <= values.get("MASTER_PORT", 1) <= 65535:
        raise ValueError(f"environment MASTER_PORT={values['MASTER_PORT']} is not a TCP port")


def under_launcher() -> bool:
    """Whether torchrun (or the spawner) set up this process as one rank of a world."""
    return all(name in os.environ for name in LAUNCH_VARS)


def resolve_backend(backend: str) -> str:
    """``auto`` to nccl with CUDA and gloo otherwise; nccl without CUDA is a ValueError."""
    cuda = torch.cuda.is_available()
    if backend == "auto":
        return "nccl" if cuda and dist.is_nccl_available() else "gloo"
    if backend == "nccl" and not (cuda and dist.is_nccl_available()):
        raise ValueError("--backend nccl needs CUDA GPUs and a torch built with NCCL; use gloo")
    return backend


def init_distributed(backend: str, timeout_s: float) -> DistContext:
    """Join the world described by the environment; every collective is bounded by ``timeout_s``."""
    backend = resolve_backend(backend)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    timeout = timedelta(seconds=timeout_s)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
        side_group = dist.new_group(backend="gloo", timeout=timeout)
    else:
        device = torch.device("cpu")
        dist.init_process_group(backend, timeout=timeout)
        side_group = None
    return DistContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local_rank,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        backend=backend,
        device=device,
        side_group=side_group,
    )


def device_name(device: torch.device) -> str:
    """The GPU's marketing name, or the CPU model."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or _cpu_model() or platform.machine()


def bus_id(device: torch.device) -> str | None:
    """The GPU's PCI location as nccl-tests prints it (``0000:18:00``: domain, bus, device, in
    hex), or None on a CPU or where torch's device properties do not carry it."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    parts = [getattr(props, f"pci_{name}_id", None) for name in ("domain", "bus", "device")]
    if any(not isinstance(part, int) for part in parts):
        return None
    domain, bus, dev = parts
    return f"{domain:04x}:{bus:02x}:{dev:02x}"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def nccl_version() -> str | None:
    """NCCL's version as ``2.21.5``, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    version = torch.cuda.nccl.version()
    if isinstance(version, tuple):  # (2, 21, 5) or, in newer torch, a suffix after the patch
        return ".".join(str(part) for part in version[:3])
    return str(version)


def gather_env(ctx: DistContext) -> dict[str, Any]:
    """The JSON ``env`` section, the same on every rank (host and device of each rank)."""
    mine = {
        "rank": ctx.rank,
        "local_rank": ctx.local_rank,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "device": str(ctx.device),
        "bus_id": bus_id(ctx.device),
        "device_name": device_name(ctx.device),
    }
    everyone: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(everyone, mine, group=ctx.side_group)
    hosts = sorted({d["host"] for d in everyone})
    try:
        own_version = version("commbench")
    except PackageNotFoundError:
        own_version = "unknown"
    return {
        "commbench_version": own_version,
        "torch_version": torch.__version__,
        "nccl_version": nccl_version(),
        "python_version": platform.python_version(),
        "backend": ctx.backend,
        "world_size": ctx.world_size,
        "num_nodes": len(hosts),
        "ranks_per_node": ctx.world_size // max(len(hosts), 1),
        "host": mine["host"],
        "hosts": hosts,
        "devices": everyone,
    }


def available_memory_bytes(device: torch.device, local_world_size: int) -> int:
    """Memory one rank may use: free GPU memory, or MemAvailable / ranks on this host."""
    if device.type == "cuda":
        free_bytes, _total = torch.cuda.mem_get_info(device)
        return int(free_bytes)
    available = available_ram_bytes()
    return 1 << 62 if available is None else available // max(local_world_size, 1)
