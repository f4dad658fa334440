"""The nccl-tests table on stdout: header, one line per size, and the footer.

Column layout is nccl-tests' (``src/common.cu``): size, count, type, redop, root, then
time / algbw / busbw / #wrong for the out-of-place and then the in-place call. With ``-I 1``
each block gains min / median / p99 columns after ``#wrong`` (like nccl-tests' ``-I``).

    print(format_row(out_of_place_record, in_place_record))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from comm_bench.records import Record

NCCL_TYPE_NAMES = {
    "float32": "float",
    "float16": "half",
    "bfloat16": "bfloat16",
    "float64": "double",
    "int32": "int32",
    "int64": "int64",
    "int8": "int8",
    "uint8": "uint8",
}
"""Our dtype names as nccl-tests prints them in the ``type`` column."""

_PREAMBLE = (
    "#       size         count      type   redop    root",
    "#        (B)    (elements)".ljust(52),
)
_BLOCK = ("     time   algbw   busbw  #wrong", "     (us)  (GB/s)  (GB/s)        ")
_EXTRA = ("      min   median      p99", "     (us)     (us)     (us)")


def format_time_us(time_us: float) -> str:
    """nccl-tests' 7-character time: 2 decimals below 10 ms, 1 below 100 ms, else none."""
    if time_us < 1e4:
        return f"{time_us:7.2f}"
    if time_us < 1e5:
        return f"{time_us:7.1f}"
    return f"{time_us:7.0f}"


def table_header(per_iter_columns: bool = False) -> list[str]:
    """The two ``#`` lines naming the columns and their units."""
    block = [b + (e if per_iter_columns else "") for b, e in zip(_BLOCK, _EXTRA, strict=True)]
    lines = [p + b + b for p, b in zip(_PREAMBLE, block, strict=True)]
    return [line.rstrip() for line in lines]


def _block(record: Record | None, per_iter_columns: bool) -> str:
    if record is None:
        return f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>6}"
    wrong = "N/A" if record.num_wrong is None else str(record.num_wrong)
    text = (
        f"  {format_time_us(record.time_us)}  {record.algbw_gbps:6.2f}"
        f"  {record.busbw_gbps:6.2f}  {wrong:>6}"
    )
    if per_iter_columns:
        extras = (record.time_min_us, record.time_median_us, record.time_p99_us)
        text += "".join(f"  {format_time_us(v) if v is not None else 'N/A':>7}" for v in extras)
    return text


def format_row(
    out_of_place: Record, in_place: Record | None, per_iter_columns: bool = False
) -> str:
    """One table line: the size's preamble, then the out-of-place and in-place blocks."""
    r = out_of_place
    type_name = NCCL_TYPE_NAMES.get(r.dtype, r.dtype)
    preamble = f"{r.size_bytes:12d}  {r.count:12d}  {type_name:>8}  {r.redop:>6}  {r.root:6d}"
    return preamble + _block(r, per_iter_columns) + _block(in_place, per_iter_columns)


def footer(records: Sequence[Record]) -> list[str]:
    """nccl-tests' two closing lines: blocks with wrong elements, and the mean busbw."""
    num_bad = sum(1 for r in records if r.num_wrong)
    mean_busbw = sum(r.busbw_gbps for r in records) / len(records) if records else 0.0
    return [
        f"# Out of bounds values : {num_bad} {'FAILED' if num_bad else 'OK'}",
        f"# Avg bus bandwidth    : {mean_busbw:g} ",
    ]


def run_header(env: Mapping[str, Any], config: Mapping[str, Any]) -> list[str]:
    """The lines before the first table: versions, backend, world and each rank's device."""
    lines = [
        f"# commbench {env['commbench_version']}: torch {env['torch_version']}, "
        f"NCCL {env['nccl_version'] or 'n/a'}, backend {env['backend']}",
        f"# nThread 1 nGpus 1 minBytes {config['min_bytes']} maxBytes {config['max_bytes']} "
        f"step: {_step_text(config)} warmup iters: {config['warmup_iters']} "
        f"iters: {config['iters']} agg iters: 1 validation: {config['check_iters']} "
        f"graph: 0 average: {config['average']}",
        f"# world size {env['world_size']}: {env['num_nodes']} node(s), "
        f"{env['ranks_per_node']} rank(s) per node, host {env['host']}",
        "#",
        "# Using devices",
    ]
    for dev in env["devices"]:
        lines.append(
            f"#  Rank {dev['rank']:2d} Group  0 Pid {dev['pid']:6d} on {dev['host']:>10s} "
            f"device {dev['local_rank']:2d} [{dev['device']}] {dev['device_name']}"
        )
    return lines


def _step_text(config: Mapping[str, Any]) -> str:
    if config["step_factor"] > 1:
        return f"{config['step_factor']}(factor)"
    return f"{config['step_bytes']}(bytes)"


def op_banner(op: str) -> str:
    """The marker nccl-tests scripts print before each test (readers split on it)."""
    return f"# Collective test starting: {op}_perf"
