"""The memory a device has, and the clause that refuses what could never fit in it."""

from __future__ import annotations

import pytest
import torch

from comm_bench import memory

GIB = 1 << 30


def test_sizes_read_in_the_largest_binary_unit() -> None:
    assert memory.size_text(512) == "512.0 B"
    assert memory.size_text(1536) == "1.5 KiB"
    assert memory.size_text(5 << 40) == "5.0 TiB"
    assert memory.size_text(2 << 70) == "2,048.0 EiB"  # no unit past EiB


def test_the_cpus_memory_is_the_machines_ram(monkeypatch: pytest.MonkeyPatch) -> None:
    assert memory.device_memory_bytes(torch.device("cpu")) == memory.ram_bytes()
    monkeypatch.setattr(memory, "ram_bytes", lambda: 16 * GIB)
    cpu = torch.device("cpu")
    assert memory.shortfall(16 * GIB, cpu) is None
    assert memory.shortfall(16 * GIB + 1, cpu) == (
        "16.0 GiB, more than the 16.0 GiB of RAM of this machine"
    )
    assert memory.shortfall(5 * GIB, cpu, ranks=4) == (
        "5.0 GiB per rank, 20.0 GiB for 4 ranks, more than the 16.0 GiB of RAM of this machine"
    )
    monkeypatch.setattr(memory, "ram_bytes", lambda: None)
    assert memory.shortfall(1 << 80, cpu) is None  # unknown: left to the allocator


def test_a_gpu_is_named_by_its_model(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory, "device_memory_bytes", lambda device: 80 * GIB)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: "NVIDIA H100 80GB HBM3")
    assert memory.shortfall(81 * GIB, torch.device("cuda", 1)) == (
        "81.0 GiB, more than the 80.0 GiB of NVIDIA H100 80GB HBM3 (cuda:1)"
    )


def test_allocation_failures_are_told_from_other_errors() -> None:
    with pytest.raises(RuntimeError) as overflow:
        torch.empty(10**10, 10**10)
    assert memory.allocation_failure(overflow.value)
    assert memory.allocation_failure(RuntimeError("DefaultCPUAllocator: can't allocate memory"))
    assert not memory.allocation_failure(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    assert not memory.allocation_failure(ValueError("out of memory"))


def test_available_ram_is_at_most_the_machines() -> None:
    available, total = memory.available_ram_bytes(), memory.ram_bytes()
    if available is not None and total is not None:
        assert 0 < available <= total
