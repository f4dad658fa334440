"""How much memory a device has, and whether what a run would allocate could ever fit in it.

A GPU's memory is what CUDA reports as its total; a CPU's is the machine's physical RAM
(``os.sysconf``). Callers estimate the bytes their own tensors take; an estimate over the whole
memory can never be allocated, so the commands refuse it with one line before anything runs.
What fits the memory but not what is free right now is left to the allocator (a one-line error)
or, for collectives, to ``harness.cap_sizes``.

    shortfall(3 * 2**40, torch.device("cpu"))   # '3.0 TiB, more than the 23.4 GiB of RAM ...'
"""

from __future__ import annotations

import os

import torch

UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
"""Binary units, as the sizes of ``-b``/``-e`` are."""


def size_text(num_bytes: float) -> str:
    """``num_bytes`` in the largest binary unit it reaches: ``1.5 GiB``."""
    power = 0
    while power < len(UNITS) - 1 and num_bytes >= 1024 ** (power + 1):
        power += 1
    return f"{num_bytes / 1024**power:,.1f} {UNITS[power]}"


def ram_bytes() -> int | None:
    """The machine's physical memory (None where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def available_ram_bytes() -> int | None:
    """MemAvailable of /proc/meminfo: the RAM that can be allocated now (None without it)."""
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def device_memory_bytes(device: torch.device) -> int | None:
    """All the memory of ``device``: a GPU's total, or the machine's RAM for the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return ram_bytes()


def _memory_name(device: torch.device, total_bytes: int) -> str:
    if device.type == "cuda":
        return f"the {size_text(total_bytes)} of {torch.cuda.get_device_name(device)} ({device})"
    return f"the {size_text(total_bytes)} of RAM of this machine"


def shortfall(needed_bytes: int, device: torch.device, *, ranks: int = 1) -> str | None:
    """None when ``ranks`` processes holding ``needed_bytes`` each fit in the device's whole
    memory (or it cannot be told), else the clause saying why not, for a one-line error:
    ``3.0 TiB, more than the 23.4 GiB of RAM of this machine``."""
    total = device_memory_bytes(device)
    if total is None or needed_bytes * ranks <= total:
        return None
    need = size_text(needed_bytes)
    if ranks > 1:
        need = f"{need} per rank, {size_text(needed_bytes * ranks)} for {ranks} ranks"
    return f"{need}, more than {_memory_name(device, total)}"


def allocation_failure(error: BaseException) -> bool:
    """Whether ``error`` is torch refusing to allocate a tensor (out of memory, or a size whose
    byte count overflows), rather than a fault of the computation."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and any(
        word in text for word in ("allocate", "out of memory", "overflow")
    )
