"""One rank's benchmark loop: per op and size, time out-of-place then in-place, check, report.

Like nccl-tests' shared harness: each op only contributes its definition (``collectives``), its
call and buffers (``calls``) and its expected result (``data``); this module does the sweep,
warm-up, timing, checking, combining across ranks, the table (rank 0) and the results files
(rank 0, rewritten after every size). Ops the backend cannot run are probed once and skipped
with a note; sizes that do not fit in memory are dropped with nccl-tests' message.

    exit_code = run_rank(options)   # inside a process that torchrun or the spawner started
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from comm_bench.calls import Buffers, checkable, make_buffers, make_call, min_world_size
from comm_bench.data import TORCH_DTYPES, count_wrong, expected_output, fill_input, reduce_pattern
from comm_bench.dist_env import DistContext, available_memory_bytes, gather_env, init_distributed
from comm_bench.faults import (
    EXIT_FAILURE,
    EXIT_NOTHING,
    EXIT_WRONG,
    Watchdog,
    inject_faults,
    note_step,
)
from comm_bench.memory import shortfall
from comm_bench.options import BenchOptions
from comm_bench.timing import Timing, combine, time_calls
from vocab import collectives as coll
from vocab.nccl_table import (
    footer,
    format_row,
    op_banner,
    op_closing,
    run_header,
    table_header,
)
from vocab.records import Record
from vocab.writer import ResultsWriter, default_output_path

MEMORY_FRACTION = 0.8
"""Share of the available memory the buffers of one size may use."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OpRun:
    """Everything fixed while one op's sizes are swept."""

    op: str
    """The collective."""
    ctx: DistContext
    """This rank."""
    options: BenchOptions
    """The command line."""
    num_nodes: int
    """Hosts the world spans."""


def _say(ctx: DistContext, line: str) -> None:
    if ctx.rank == 0:
        print(line, flush=True)


def bytes_needed(op: str, size_bytes: int, elem_bytes: int, world_size: int) -> int:
    """Peak bytes one rank allocates for one size: buffers, expected result and check index."""
    counts = coll.get(op).counts(size_bytes, elem_bytes, world_size)
    elems = counts.send_elems + 2 * counts.recv_elems
    return elems * elem_bytes + 8 * max(counts.send_elems, counts.recv_elems)


def check_max_size(
    options: BenchOptions, device: torch.device, *, world_size: int, local_ranks: int = 1
) -> None:
    """Refuse, before any rank starts, a sweep whose largest size needs more than the whole
    memory of ``device`` for every op that runs (``local_ranks`` processes sharing it: the CPU's
    RAM); what fits it but not what is free is left to ``cap_sizes``."""
    largest = max(options.sizes(), default=0)
    elem_bytes = coll.dtype_bytes(options.dtype)
    for op in options.ops:
        if min_world_size(op) > world_size:
            continue  # skipped by the probe, allocates nothing
        needed = bytes_needed(op, largest, elem_bytes, world_size)
        short = shortfall(needed, device, ranks=local_ranks)
        if short is not None:
            raise ValueError(
                f"-e {options.max_bytes}: {op} at {largest} B needs {short}; use a smaller -e"
            )


def cap_sizes(sizes: list[int], op: str, options: BenchOptions, ctx: DistContext) -> list[int]:
    """Drop sizes whose buffers do not fit (every rank agrees on the smallest cap)."""
    budget = MEMORY_FRACTION * available_memory_bytes(ctx.device, ctx.local_world_size)
    elem_bytes = coll.dtype_bytes(options.dtype)
    fit = [s for s in sizes if bytes_needed(op, s, elem_bytes, ctx.world_size) <= budget]
    largest = torch.tensor([max(fit, default=-1)], dtype=torch.int64)
    dist.all_reduce(largest, op=dist.ReduceOp.MIN, group=ctx.side_group)
    kept = [s for s in sizes if s <= int(largest.item())]
    if len(kept) < len(sizes):
        _say(ctx, f"# Reducing maxBytes to {max(kept, default=0)} due to memory limitation")
    return kept


def probe(op: str, options: BenchOptions, ctx: DistContext) -> str | None:
    """None if the backend runs ``op`` with this dtype and reduction, else why not."""
    if ctx.world_size < min_world_size(op):
        return f"needs at least {min_world_size(op)} ranks"
    reason = ""
    try:
        counts = coll.get(op).counts(
            16 * ctx.world_size, coll.dtype_bytes(options.dtype), ctx.world_size
        )
        bufs = make_buffers(
            op, counts, ctx.rank, ctx.world_size, False, TORCH_DTYPES[options.dtype], ctx.device
        )
        make_call(op, bufs, ctx.rank, ctx.world_size, options.redop, options.root)()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
    except Exception as error:  # any backend refusal means "skip this op"
        reason = _first_line(error)
    ok = torch.tensor([0 if reason else 1], dtype=torch.int64)
    dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=ctx.side_group)
    if int(ok.item()) == 1:
        return None
    return reason or "another rank could not run it"


def _check(run: OpRun, bufs: Buffers, call: Callable[[], None]) -> int:
    """Run the ``-c`` check iterations and return the wrong elements summed over ranks, of the
    first iteration that had any (nccl-tests' ``BenchTime``: each pass's count replaces the
    last, and the passes stop at the first with wrong elements)."""
    o, ctx = run.options, run.ctx
    pattern = reduce_pattern(o.redop, ctx.world_size, o.dtype) if coll.get(run.op).reduces else None
    inexact = pattern is not None and not pattern.exact
    ulps = 2 * ctx.world_size if inexact and TORCH_DTYPES[o.dtype].is_floating_point else 0
    wrong = 0
    for rep in range(o.check_iters):
        fill_input(run.op, bufs.send, ctx.rank, ctx.world_size, rep, pattern)
        call()
        if ctx.device.type == "cuda":
            torch.cuda.synchronize()
        expected = expected_output(
            run.op, bufs.recv, ctx.rank, ctx.world_size, o.root, rep, pattern
        )
        total = torch.tensor([count_wrong(bufs.recv, expected, ctx.rank, ulps=ulps)])
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ctx.side_group)
        wrong = int(total.item())
        if wrong:
            break
    return wrong


def measure(run: OpRun, size_bytes: int, in_place: bool, watchdog: Watchdog) -> Record:
    """Time and check one (op, size, placement); the returned record is combined across ranks."""
    o, ctx, op = run.options, run.ctx, run.op
    definition = coll.get(op)
    counts = definition.counts(size_bytes, coll.dtype_bytes(o.dtype), ctx.world_size)
    bufs = make_buffers(
        op, counts, ctx.rank, ctx.world_size, in_place, TORCH_DTYPES[o.dtype], ctx.device
    )
    call = make_call(op, bufs, ctx.rank, ctx.world_size, o.redop, o.root)
    where = f"{op} {counts.size_bytes} B {'in-place' if in_place else 'out-of-place'}"
    watchdog.arm(f"{where} (timed loop)", o.warmup_iters + o.iters + 1)
    local = time_calls(
        call, iters=o.iters, warmup_iters=o.warmup_iters, device=ctx.device, group=ctx.side_group
    )
    timing = combine(local, o.average, group=ctx.side_group)
    watchdog.arm(f"{where} (check)", o.check_iters + 1)
    num_wrong = None
    if o.check_iters > 0 and checkable(op, in_place):
        num_wrong = _check(run, bufs, call)
    return _record(run, counts, in_place, timing, num_wrong)


def _record(
    run: OpRun, counts: coll.Counts, in_place: bool, timing: Timing, num_wrong: int | None
) -> Record:
    o, op, n = run.options, run.op, run.ctx.world_size
    definition = coll.get(op)
    return Record(
        op=op,
        size_bytes=counts.size_bytes,
        count=counts.count,
        dtype=o.dtype,
        world_size=n,
        num_nodes=run.num_nodes,
        in_place=in_place,
        time_us=timing.mean_s * 1e6,
        algbw_gbps=coll.algbw_gbps(counts.size_bytes, timing.mean_s),
        busbw_gbps=coll.busbw_gbps(op, counts.size_bytes, timing.mean_s, n),
        num_wrong=num_wrong,
        redop=o.redop if definition.prints_redop else "none",
        root=o.root if definition.rooted else -1,
        time_min_us=timing.min_s * 1e6,
        time_median_us=timing.median_s * 1e6,
        time_p99_us=timing.p99_s * 1e6,
        num_iters=timing.num_iters,
        source="measured",
    )


def sweep(run: OpRun, writer: ResultsWriter | None, watchdog: Watchdog) -> list[Record]:
    """All sizes of one op; rank 0 prints each line and saves each size as it finishes."""
    ctx, o = run.ctx, run.options
    records: list[Record] = []
    for size in cap_sizes(o.sizes(), run.op, o, ctx):
        note_step(ctx.rank, f"{run.op} {size} B")
        watchdog.arm(f"{run.op} {size} B (start)")
        inject_faults(ctx.rank, run.op, size)
        try:
            pair = [measure(run, size, in_place, watchdog) for in_place in (False, True)]
        except Exception as error:
            raise RuntimeError(f"{run.op} {size} B failed: {_first_line(error)}") from error
        watchdog.disarm()
        records.extend(pair)
        _say(ctx, format_row(pair[0], pair[1], o.per_iter_columns))
        if writer is not None:
            writer.add(pair)
    return records


def _run_ops(ctx: DistContext, options: BenchOptions, output: Path) -> int:
    env = gather_env(ctx)
    config = options.to_config() | {"output": str(output)}
    writer = ResultsWriter(output, env=env, config=config) if ctx.rank == 0 else None
    for line in run_header(env, config, options.ops[0]):
        _say(ctx, line)
    watchdog = Watchdog(rank=ctx.rank, timeout_s=options.timeout_s)
    every: list[Record] = []
    skipped: list[str] = []
    for index, op in enumerate(options.ops):
        # nccl-tests' order, one binary per op: banner, (header,) table, footer, closing lines
        if index:
            _say(ctx, op_banner(op))
        _say(ctx, "#")
        watchdog.arm(f"{op} (probe)", 2)
        reason = probe(op, options, ctx)
        watchdog.disarm()
        if reason is not None:
            _say(ctx, f"# {op}: skipped, backend {ctx.backend} cannot run it ({reason})")
            skipped.append(f"{op} ({reason})")
        else:
            for line in table_header(options.per_iter_columns):
                _say(ctx, line)
            records = sweep(
                OpRun(op=op, ctx=ctx, options=options, num_nodes=env["num_nodes"]),
                writer,
                watchdog,
            )
            every.extend(records)
            for line in footer(records):
                _say(ctx, line)
        for line in op_closing(op):
            _say(ctx, line)
    _say(ctx, f"# Results: {output} and {output.with_suffix('.csv')}")
    if not every:
        if ctx.rank == 0:
            print(
                f"commbench: error: nothing was measured: backend {ctx.backend} cannot run "
                f"{'; '.join(skipped)} with -d {options.dtype} -o {options.redop}",
                file=sys.stderr,
            )
        return EXIT_NOTHING
    return EXIT_WRONG if any(r.num_wrong for r in every) else 0


def run_rank(options: BenchOptions) -> int:
    """Run the benchmark as one rank of the launcher's world; returns the exit code."""
    ctx = init_distributed(options.backend, options.timeout_s)
    output = options.output or _agreed_output(ctx, options)
    try:
        code = _run_ops(ctx, options, output)
    except Exception as error:  # a collective failed: a peer died, or a timeout
        print(f"commbench: error: rank {ctx.rank}: {_first_line(error)}", file=sys.stderr)
        if ctx.rank == 0:
            print(f"commbench: results measured so far are in {output}", file=sys.stderr)
        if "COMMBENCH_TRACEBACK" in os.environ:
            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        # No teardown: destroying the group (even at interpreter exit) can wait on the dead peer.
        os._exit(EXIT_FAILURE)
    _shutdown()
    return code


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else repr(error)


def _agreed_output(ctx: DistContext, options: BenchOptions) -> Path:
    """Rank 0 picks the timestamped default path; everyone learns it."""
    chosen = [str(default_output_path(options.ops)) if ctx.rank == 0 else ""]
    dist.broadcast_object_list(chosen, src=0, group=ctx.side_group)
    return Path(chosen[0])


def _shutdown() -> None:
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # tearing down after a failure must not mask the first error
        pass
