"""Host cost per rank of DeepSpeed v0.3.13's per-weight ZeRO-3 collectives (Python side).

Times one iteration of the loops ``_allgather_param`` and ``_reduce_scatter_gradient`` run over
the data-parallel ranks before each call (partition_parameters.py, v0.3.13, commit 12a53b43),
and one ``copy_`` of a rank's part as torch's list-based collectives do (here on CPU tensors:
the dispatch without the CUDA launch). Best of 20 repetitions at 1,536 ranks.

    python tools/v03_host_loops.py
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

RANKS = 1536
PART = 64


def best_us_per_rank(fn: Callable[[], object]) -> float:
    fn()
    times = []
    for _ in range(20):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) / RANKS * 1e6


def main() -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    group = dist.new_group([0])
    flat = torch.zeros(RANKS * PART)
    grad = torch.zeros(RANKS * PART)

    def allgather_views() -> list[torch.Tensor]:
        partitions = []
        for i in range(RANKS):
            partitions.append(flat.narrow(0, PART * i, PART))
            if i == dist.get_rank(group=group):
                pass
        return partitions

    def reduce_scatter_views() -> list[torch.Tensor]:
        inputs = []
        for i in range(RANKS):
            start, end = i * PART, (i + 1) * PART
            if start < grad.numel() and end <= grad.numel():
                inputs.append(grad.view(-1).narrow(0, start, PART))
        return inputs

    parts = allgather_views()
    out = torch.empty(RANKS * PART)

    def copies() -> None:
        for i, part in enumerate(parts):
            part.copy_(out.narrow(0, i * PART, PART), non_blocking=True)

    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}, torch {torch.__version__}"
    )
    for label, fn in (
        ("_allgather_param loop:", allgather_views),
        ("_reduce_scatter_gradient loop:", reduce_scatter_views),
        ("copy_ dispatch (CPU tensors):", copies),
    ):
        print(f"{label:<32}{best_us_per_rank(fn):.2f} us per rank")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
