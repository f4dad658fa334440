"""The nccl-tests table on stdout: header, one line per size, and the footer.

Column layout and number formats are nccl-tests' (``src/util.cu``): an ``out-of-place`` /
``in-place`` super-header, size, count, type, redop, root, then time / algbw / busbw / #wrong
for the out-of-place and then the in-place call, each number as its ``getFloatStr`` writes it.
With ``-I 1`` each block gains min / median / p99 columns after ``#wrong`` (nccl-tests' ``-I``
prints min / max / p99 / cv instead).

    print(format_row(out_of_place_record, in_place_record))
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vocab.records import Record

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

_WIDTHS = (10, 12, 8, 6, 6, *(7, 6, 6, 6) * 2)
"""nccl-tests' column widths: size, count, type, redop, root, then time, algbw, busbw, #wrong
out-of-place and in-place (``# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s ...``)."""


def _header_row(*cells: str) -> str:
    """``cells`` right-aligned in nccl-tests' widths, two spaces apart, after ``# ``; the
    padding of ``cells`` beyond those given is empty (the super-header's preamble)."""
    return "# " + "  ".join(f"{c:>{w}}" for c, w in zip(cells, _WIDTHS, strict=False))


NCCL_TESTS_HEADER = (
    _header_row(*[""] * 5) + "           out-of-place                       in-place          ",
    _header_row("size", "count", "type", "redop", "root", *("time", "algbw", "busbw", "#wrong") * 2)
    + " ",
    _header_row("(B)", "(elements)", "", "", "", *("(us)", "(GB/s)", "(GB/s)", "") * 2) + " ",
)
"""The three lines above nccl-tests' table, printed with its formats (``src/util.cu``
``writeResultHeader`` without timestamps: the empty ``%*s`` leaves a space at the end)."""
_PREAMBLE_WIDTH = 52
"""Characters of the size, count, type, redop and root columns (``# %10s  %12s  %8s  %6s  %6s``)."""
_EXTRA = ("      min   median      p99", "     (us)     (us)     (us)")
"""The per-iteration columns commbench adds after each ``#wrong`` with ``-I 1``."""


def float_str(value: float, width: int) -> str:
    """nccl-tests' ``getFloatStr``: ``%.2f``, else ``%.1f``, else ``%.0f``, whichever first fits
    in ``width`` characters, else ``%.1e`` (``%.0e`` when narrower than 7); cut to ``width``
    as its ``snprintf`` does.

    >>> [float_str(t, 7) for t in (34.734, 10585.12, 123456.7, 12345678.9)]
    ['  34.73', '10585.1', ' 123457', '1.2e+07']
    """
    for decimals in (2, 1, 0):
        text = f"{value:{width}.{decimals}f}"
        if len(text) <= width:
            return text
    return f"{value:{width}.{1 if width >= 7 else 0}e}"[:width]


def format_time_us(time_us: float) -> str:
    """nccl-tests' 7-character time: 2 decimals below 10 ms, 1 below 100 ms, none below 10 s,
    then ``1.2e+07``."""
    return float_str(time_us, 7)


def table_header(per_iter_columns: bool = False) -> list[str]:
    """The super-header (``out-of-place`` / ``in-place``), the column names and their units.

    Without ``-I 1`` exactly nccl-tests' lines; with it, each block gains commbench's min /
    median / p99 columns and the two labels are centred over the wider blocks.
    """
    if not per_iter_columns:
        return list(NCCL_TESTS_HEADER)
    names, units = (line[:-1] for line in NCCL_TESTS_HEADER[1:])
    half = (len(names) - _PREAMBLE_WIDTH) // 2
    block_names = names[_PREAMBLE_WIDTH : _PREAMBLE_WIDTH + half] + _EXTRA[0]
    block_units = units[_PREAMBLE_WIDTH : _PREAMBLE_WIDTH + half] + _EXTRA[1]
    labels = "".join(label.center(len(block_names)) for label in ("out-of-place", "in-place"))
    return [
        ("#".ljust(_PREAMBLE_WIDTH) + labels).rstrip(),
        names[:_PREAMBLE_WIDTH] + block_names * 2,
        units[:_PREAMBLE_WIDTH] + block_units * 2,
    ]


def _block(record: Record | None, per_iter_columns: bool) -> str:
    if record is None:
        return f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>6}"
    # nccl-tests: "  %6g" with a count, "    N/A" (one column narrower) without
    wrong = "  N/A" if record.num_wrong is None else f"{float(record.num_wrong):6g}"
    text = (
        f"  {format_time_us(record.time_us)}  {float_str(record.algbw_gbps, 6)}"
        f"  {float_str(record.busbw_gbps, 6)}  {wrong}"
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


def run_header(env: Mapping[str, Any], config: Mapping[str, Any], first_op: str) -> list[str]:
    """The lines before the first table, in nccl-tests' order: versions (nccl-tests' version
    line), the first test's banner (``op_banner``), the run's parameters, then world and each
    rank's device."""
    lines = [
        f"# commbench {env['commbench_version']}: torch {env['torch_version']}, "
        f"NCCL {env['nccl_version'] or 'n/a'}, backend {env['backend']}",
        op_banner(first_op),
        f"# nThread 1 nGpus 1 minBytes {config['min_bytes']} maxBytes {config['max_bytes']} "
        f"step: {_step_text(config)} warmup iters: {config['warmup_iters']} "
        f"iters: {config['iters']} agg iters: 1 validation: {config['check_iters']} "
        "graph: 0 unalign: 0",
        f"# world size {env['world_size']}: {env['num_nodes']} node(s), "
        f"{env['ranks_per_node']} rank(s) per node, host {env['host']}; times: "
        f"{config['average']} over ranks (-a)",
        "#",
        "# Using devices",
    ]
    for dev in env["devices"]:
        lines.append(
            f"#  Rank {dev['rank']:2d} Group  0 Pid {dev['pid']:6d} on {dev['host']:>10s} "
            f"device {dev['local_rank']:2d} [{dev.get('bus_id') or dev['device']}] "
            f"{dev['device_name']}"
        )
    return lines


def _step_text(config: Mapping[str, Any]) -> str:
    if config["step_factor"] > 1:
        return f"{config['step_factor']}(factor)"
    return f"{config['step_bytes']}(bytes)"


def op_banner(op: str) -> str:
    """The marker nccl-tests prints before each test's header (readers split on it)."""
    return f"# Collective test starting: {op}_perf"


def op_closing(op: str) -> list[str]:
    """nccl-tests' lines after a test's footer (``writeResultFooter``, ``finalizeFooter``)."""
    return ["#", f"# Collective test concluded: {op}_perf", "#"]
