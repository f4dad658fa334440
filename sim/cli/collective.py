"""``commsim collective``: simulate collectives over a size sweep, reported like nccl-tests.

Prints the nccl-tests table (size, count, type, redop, root, time, algbw, busbw, #wrong = N/A)
for each op and writes the commbench JSON schema (``env.simulated = true``) plus a CSV beside
it, so simulated and measured files are interchangeable. A sweep still running after a second
shows a progress bar with the time left on standard error when that is a terminal (tqdm).

    commsim collective --topology dgx-h100 --nodes 2 --ops all_reduce -b 1K -e 8G -f 2
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any

import simpy

from fileio.output import Target, check_outputs, twin, write_text
from fileio.strict import shorten
from sim.inputs.calibrations import node_mismatch
from sim.inputs.topology import add_topology_arguments, topology_factory
from sim.network.analytical import ALGORITHMS
from sim.network.calibration import load_calibration
from sim.network.comm_model import FIDELITIES, CommModel
from sim.network.nccl_tables import DEFAULT_NCCL_VERSION
from sim.output.progress import progress_bar
from topologies.presets import MAX_GPUS_PER_NODE, NODE_PRESETS
from topologies.topology import Topology
from vocab.collectives import REDUCTIONS, dtype_bytes, get, parse_ops
from vocab.nccl_table import footer, format_row, op_banner, table_header
from vocab.records import Record
from vocab.sizes import parse_size
from vocab.writer import results_csv, results_json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``commsim collective``."""
    add_topology_arguments(parser)
    parser.add_argument("--ranks", type=int, default=None, help="use only the first N GPUs")
    parser.add_argument("--ops", default="all_reduce", help="comma list of ops, or 'all'")
    parser.add_argument("-b", "--minbytes", default="32M", help="smallest size (K/M/G binary)")
    parser.add_argument("-e", "--maxbytes", default="32M", help="largest size")
    parser.add_argument("-f", "--stepfactor", type=float, default=2.0, help="size factor")
    parser.add_argument("-d", "--datatype", default="float32", help="dtype of the elements")
    parser.add_argument("-o", "--op", dest="redop", default="sum", help="reduction name")
    parser.add_argument("-r", "--root", type=int, default=0, help="root rank (broadcast, reduce)")
    parser.add_argument("--algo", default="auto", help=f"auto or one of {', '.join(ALGORITHMS)}")
    parser.add_argument("--fidelity", default="analytical", help=" or ".join(FIDELITIES))
    parser.add_argument("--calibration", default=None, help="calibration JSON (commsim calibrate)")
    parser.add_argument("--output", default=None, help="results JSON (CSV written beside it)")


MAX_SIZES = 10_000
"""Most sizes one sweep may have (nccl-tests sweeps have tens)."""
MAX_SIZE_BYTES = 1 << 50
"""Sizes must be below 1P, the first size the K, M, G and T suffixes cannot spell (``-e 1P``
is a bad size, and so is the same number written out in digits)."""


def size_flag(flag: str, text: str) -> int:
    """The bytes of a size flag's value (``vocab.sizes.parse_size``), from 1 byte to below
    ``MAX_SIZE_BYTES``; else one line naming the flag and the value."""
    if len(text) > 64:  # no size below 1P is this long; int() of thousands of digits fails
        raise ValueError(f"{flag} {shorten(text)}: not a size below 1P")
    try:
        size = parse_size(text)
    except ValueError as error:
        raise ValueError(f"{flag}: {error}") from None
    if size < 1:
        raise ValueError(f"{flag} {text.strip()}: a size must be >= 1 byte")
    if size >= MAX_SIZE_BYTES:
        raise ValueError(
            f"{flag} {text.strip()}: a size must be below 1P ({MAX_SIZE_BYTES:,} bytes)"
        )
    return size


def size_sweep(min_bytes: int, max_bytes: int, factor: float) -> list[int]:
    """Sizes from ``min_bytes`` to ``max_bytes`` multiplying by ``factor`` (nccl-tests' -f)."""
    if not 1 <= min_bytes <= max_bytes:
        raise ValueError(f"-b {min_bytes} / -e {max_bytes}: need 1 <= minbytes <= maxbytes")
    if not factor > 1 or not math.isfinite(factor):
        raise ValueError(f"-f must be a finite number > 1, got {factor}")
    sizes: list[int] = []
    size = min_bytes
    while size <= max_bytes:
        if len(sizes) == MAX_SIZES:
            raise ValueError(
                f"-b {min_bytes} -e {max_bytes} -f {factor} gives more than {MAX_SIZES:,} sizes; "
                "use a larger -f"
            )
        sizes.append(size)
        size = max(int(size * factor), size + 1)
    return sizes


def simulate_sweep(
    model: CommModel, ops: list[str], ranks: list[int], sizes: list[int], *,
    dtype: str, redop: str, root: int, on_size: Callable[[], None] | None = None,
) -> list[Record]:  # fmt: skip
    """One out-of-place and one in-place record per (op, size), each collective run alone.

    ``on_size`` is called after each (op, size) is simulated (a progress bar's tick).
    """
    records = []
    n = len(ranks)
    num_nodes = model.layout(ranks).num_nodes
    for op in ops:
        definition = get(op)
        for size in sizes:
            counts = definition.counts(size, dtype_bytes(dtype), n)
            algo = model.algorithm(op, ranks, counts.size_bytes)
            start = model.env.now
            model.env.run(model.run(op, ranks, counts.size_bytes, algo=algo, root=root))
            time_s = model.env.now - start
            fields: dict[str, Any] = {
                "op": op, "size_bytes": counts.size_bytes, "count": counts.count, "dtype": dtype,
                "world_size": n, "num_nodes": num_nodes, "time_us": time_s * 1e6,
                "algbw_gbps": counts.size_bytes / time_s / 1e9 if time_s > 0 else 0.0,
                "busbw_gbps": 0.0, "redop": redop if definition.prints_redop else "none",
                "root": root if definition.rooted else -1, "algo": algo, "source": "simulated",
            }  # fmt: skip
            fields["busbw_gbps"] = fields["algbw_gbps"] * definition.busbw_factor(n)
            records.append(Record(in_place=False, **fields))
            records.append(Record(in_place=True, **fields))
            if on_size is not None:
                on_size()
    return records


def run(args: argparse.Namespace) -> int:
    """Simulate the sweep, print the tables, write JSON + CSV when ``--output`` is given."""
    ops = parse_ops(args.ops)
    min_bytes, max_bytes = size_flag("-b", args.minbytes), size_flag("-e", args.maxbytes)
    sizes = size_sweep(min_bytes, max_bytes, args.stepfactor)
    dtype_bytes(args.datatype)
    if args.redop not in REDUCTIONS:
        raise ValueError(f"unknown reduction -o {args.redop!r}; valid: {', '.join(REDUCTIONS)}")
    inputs = (args.calibration, args.topology)
    targets = check_outputs({"--output": (args.output, (".json",))}, inputs=inputs)
    output = targets.get("--output")
    csv_target = None if output is None else twin(output, ".csv", inputs=inputs)
    factory = topology_factory(args)
    topology = factory(args.nodes or 1, _localhost_ranks_per_node(args))
    num_ranks = topology.num_gpus if args.ranks is None else args.ranks
    if not 1 <= num_ranks <= topology.num_gpus:
        raise ValueError(
            f"--ranks {num_ranks}: topology {topology.name} has {topology.num_gpus} GPUs"
        )
    if not 0 <= args.root < num_ranks:
        raise ValueError(f"-r {args.root}: root must be in 0..{num_ranks - 1}")
    calibration = None if args.calibration is None else load_calibration(args.calibration)
    if calibration is not None and (note := node_mismatch(calibration, args.topology)):
        print(f"commsim: warning: --calibration {args.calibration}: {note}", file=sys.stderr)
    model = CommModel(
        simpy.Environment(), topology, fidelity=args.fidelity, calibration=calibration,
        algo=args.algo,
    )  # fmt: skip
    ranks = list(range(num_ranks))
    bar = progress_bar(len(ops) * len(sizes), "simulating", delay_s=1.0, unit="size")
    try:
        records = simulate_sweep(
            model, ops, ranks, sizes, dtype=args.datatype, redop=args.redop, root=args.root,
            on_size=bar.update,
        )  # fmt: skip
    except ValueError as error:
        if num_ranks > 1:
            raise
        # one GPU is no group for most collectives: say which flag made it one
        where = f"--ranks {num_ranks}" if args.ranks is not None else f"topology {topology.name}"
        raise ValueError(f"{where}: {error} (a group of one GPU; use 2 or more)") from None
    finally:
        bar.close()
    layout = model.layout(ranks)
    print(
        f"# commsim collective: topology {topology.name}, {num_ranks} ranks on "
        f"{layout.num_nodes} node(s), fidelity {args.fidelity}, algo {args.algo}, "
        f"calibration {args.calibration or 'none (defaults)'}, NCCL "
        f"{topology.nccl_version or DEFAULT_NCCL_VERSION}'s tuning tables"
    )
    for op in ops:
        print(op_banner(op))
        print("\n".join(table_header()))
        mine = [r for r in records if r.op == op]
        for out_of_place, in_place in zip(mine[::2], mine[1::2], strict=True):
            print(format_row(out_of_place, in_place))
        labels = [_choice_label(model, r, ranks) for r in mine[::2]]
        print(f"# algorithms: {_algo_ranges(mine[::2], labels)}")
    print("\n".join(footer(records)))
    if output is not None:
        _write(output, csv_target, args, topology, layout.num_nodes, num_ranks, records)
    return 0


def _localhost_ranks_per_node(args: argparse.Namespace) -> int:
    """Processes per host for ``localhost``: enough for ``--ranks``, else the preset's count."""
    if args.ranks is None or args.ranks < 1:
        return NODE_PRESETS["localhost"].num_gpus
    per_node = -(-args.ranks // (args.nodes or 1))
    if args.topology == "localhost" and per_node > MAX_GPUS_PER_NODE:
        raise ValueError(
            f"--ranks {args.ranks}: localhost runs at most {MAX_GPUS_PER_NODE} processes per host"
        )
    return per_node


def _choice_label(model: CommModel, record: Record, ranks: list[int]) -> str:
    """``ring/ll128``: the algorithm and NCCL protocol that ran (the algorithm alone where no
    protocol applies)."""
    algo, protocol = model.choice(record.op, ranks, record.size_bytes, record.algo)
    return f"{algo}/{protocol}" if protocol else algo


def _algo_ranges(records: list[Record], labels: list[str] | None = None) -> str:
    """``"1024-65536 ring/ll, 131072-8589934592 nvls/simple"``: what ran over which sizes."""
    spans: list[list[Any]] = []
    for r, label in zip(records, labels or [str(r.algo) for r in records], strict=True):
        if spans and spans[-1][2] == label:
            spans[-1][1] = r.size_bytes
        else:
            spans.append([r.size_bytes, r.size_bytes, label])
    return ", ".join(f"{lo}-{hi} {label}" for lo, hi, label in spans)


def _write(
    output: Target, csv_target: Target | None, args: argparse.Namespace, topology: Topology,
    num_nodes: int, num_ranks: int, records: list[Record],
) -> None:  # fmt: skip
    env = {
        "simulated": True, "topology": topology.name, "fidelity": args.fidelity,
        "calibration": args.calibration, "world_size": num_ranks, "num_nodes": num_nodes,
        "ranks_per_node": -(-num_ranks // num_nodes),
        "nccl_version": topology.nccl_version or DEFAULT_NCCL_VERSION,
    }  # fmt: skip
    config = {
        "ops": parse_ops(args.ops), "min_bytes": parse_size(args.minbytes),
        "max_bytes": parse_size(args.maxbytes), "step_factor": args.stepfactor,
        "dtype": args.datatype, "redop": args.redop, "root": args.root, "algo": args.algo,
        "topology": args.topology, "nodes": args.nodes, "fabric": args.fabric,
        "oversubscription": args.oversubscription,
    }  # fmt: skip
    write_text(output, results_json(env, config, records))
    if csv_target is not None:
        write_text(csv_target, results_csv(records))
    if not output.is_stdout:
        also = "" if csv_target is None else f" and {csv_target.name}"
        print(f"# wrote {output.name}{also}")
