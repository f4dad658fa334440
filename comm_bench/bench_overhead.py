"""How much time the harness adds to the torch calls it measures, for sizes of 1 MiB and up.

Two gloo ranks (or ``--nprocs``) run, per size, alternating trials of (a) a bare loop of
``dist.all_reduce`` between two clock readings and (b) the harness's ``time_calls`` on the same
buffer; the overhead is the ratio of the medians over trials, minus one. The spec's bar is 2%.

    python -m comm_bench.bench_overhead --sizes 1M,4M,16M --trials 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from comm_bench.calls import make_buffers, make_call
from comm_bench.launch import free_port
from comm_bench.timing import time_calls
from vocab.collectives import get
from vocab.sizes import parse_size


def bare_loop_s(tensor: torch.Tensor, iters: int) -> float:
    """Seconds per call of ``iters`` back-to-back ``dist.all_reduce`` after a barrier."""
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(tensor)
    return (time.perf_counter() - start) / iters


def compare(size_bytes: int, iters: int, trials: int) -> tuple[float, float]:
    """Median seconds per call over ``trials``: (bare loop, harness)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    counts = get("all_reduce").counts(size_bytes, 4, world)
    bufs = make_buffers(
        "all_reduce", counts, rank, world, False, torch.float32, torch.device("cpu")
    )
    call = make_call("all_reduce", bufs, rank, world, "sum", 0)
    bare, harness = [], []
    for _ in range(trials):
        bare.append(bare_loop_s(bufs.recv, iters))
        timing = time_calls(call, iters=iters, warmup_iters=0, device=torch.device("cpu"))
        harness.append(timing.mean_s)
    both = torch.tensor([statistics.median(bare), statistics.median(harness)], dtype=torch.float64)
    dist.all_reduce(both)
    both /= world
    return float(both[0]), float(both[1])


def harness_cost_s(iters: int = 10_000) -> float:
    """Seconds the timed loop itself adds per call: ``time_calls`` around a no-op call."""
    timing = time_calls(lambda: None, iters=iters, warmup_iters=0, device=torch.device("cpu"))
    return timing.mean_s


def _worker(rank: int, world: int, port: int, args: argparse.Namespace) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cost_s = harness_cost_s()
    if rank == 0:
        print(
            f"# harness cost per call (timed loop around a no-op): {cost_s * 1e6:.3f} us",
            flush=True,
        )
    for text in args.sizes.split(","):
        size = parse_size(text)
        bare_loop_s(torch.zeros(size // 4), 3)  # warm the connections for this size
        bare_s, harness_s = compare(size, args.iters, args.trials)
        if rank == 0:
            overhead = (harness_s / bare_s - 1.0) * 100.0
            print(
                f"{size:>10d} B  bare {bare_s * 1e6:10.1f} us  harness "
                f"{harness_s * 1e6:10.1f} us  overhead {overhead:+6.2f} % (noise included), "
                f"loop cost {cost_s / bare_s * 100:.4f} %",
                flush=True,
            )
    dist.destroy_process_group()


def main(argv: Sequence[str] | None = None) -> int:
    """Spawn the ranks and print one line per size."""
    parser = argparse.ArgumentParser(prog="python -m comm_bench.bench_overhead")
    parser.add_argument("--sizes", default="1M,4M,16M", help="comma-separated sizes")
    parser.add_argument("--iters", type=int, default=20, help="calls per trial")
    parser.add_argument("--trials", type=int, default=15, help="alternating trials per size")
    parser.add_argument("--nprocs", type=int, default=2, help="gloo ranks")
    args = parser.parse_args(argv)
    print(
        f"# harness overhead vs a bare dist.all_reduce loop: gloo, {args.nprocs} ranks, "
        f"{args.iters} calls x {args.trials} trials, medians",
        flush=True,
    )
    mp.spawn(_worker, args=(args.nprocs, free_port(), args), nprocs=args.nprocs, join=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
