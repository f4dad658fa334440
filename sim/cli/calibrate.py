"""``commsim calibrate``: fit the network model's parameters to measured collectives.

Reads commbench JSON/CSV, nccl-tests logs and busbw tables (``sim.inputs.measured``), fits per
(op, algorithm, scope) a base latency, a per-step latency (when the data has several step
counts) and an efficiency curve over size, prints the fit quality (MAPE per group) and writes
the versioned calibration JSON.

    commsim calibrate results/localhost/commbench_gloo_4ranks.json --topology localhost -o cal.json
"""

from __future__ import annotations

import argparse

from fileio.output import check_output
from sim.inputs.measured import add_reading_arguments, read_measured, release_from_measured
from sim.inputs.topology import add_topology_arguments, topology_factory
from sim.network.analytical import ALGORITHMS
from sim.network.calibration import Calibration
from sim.network.comm_model import check_algo_name
from sim.network.fitting import fit_calibration


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``commsim calibrate``."""
    parser.add_argument("measured", nargs="+", help="commbench JSON/CSV, nccl-tests logs or tables")
    add_topology_arguments(parser)
    parser.add_argument(
        "--algo", default="auto",
        help=f"algorithm of records that do not name one: auto (the model's fastest, as NCCL "
        f"picks) or one of {', '.join(ALGORITHMS)}",
    )  # fmt: skip
    parser.add_argument(
        "--only", action="append", default=[], metavar="EXPR",
        help="fit only records matching EXPR (e.g. 'op=all_reduce', 'size>=1M'); repeatable",
    )  # fmt: skip
    parser.add_argument("-o", "--output", required=True, help="calibration JSON to write")
    add_reading_arguments(parser)


def describe(calibration: Calibration) -> list[str]:
    """Readable lines: one per fitted group with its parameters and MAPE."""
    lines = [
        "#  op/algo/scope                    points  MAPE(%)  base(us)  step(us)  eff_max"
        "  half(KiB)  shape  nccl_lat_x"
    ]
    for group_key, p in sorted(calibration.params.items()):
        q = calibration.quality[group_key]
        step = p.intra_step_latency_s if group_key.endswith("intra") else p.inter_step_latency_s
        lines.append(
            f"   {group_key:<32} {q.num_points:6d}  {q.mape:7.2f}  {p.base_latency_s * 1e6:8.2f}"
            f"  {step * 1e6:8.2f}  {p.efficiency_max:7.3f}  {p.half_size_bytes / 1024:9.1f}"
            f"  {p.shape:5.2f}  {p.protocol_latency_scale:10.3f}"
        )
    return lines


def run(args: argparse.Namespace) -> int:
    """Fit, print the quality, write the calibration."""
    check_algo_name(args.algo)  # also where every file names its records' algorithm
    target = check_output(args.output, inputs=args.measured, formats=(".json",), option="-o")
    records = read_measured(
        args.measured, args.only, op=args.op, allow_wrong=args.allow_wrong, note=_note
    )
    release_from_measured(args, _note)
    factory = topology_factory(args)
    calibration, notes = fit_calibration(
        records, factory, topology_name=args.topology, sources=args.measured,
        assumed_algo=args.algo,
    )  # fmt: skip
    if not calibration.params:
        raise ValueError(f"nothing could be fitted: {'; '.join(notes)}")
    print(f"# commsim calibrate: {_used(calibration, len(records))}, from "
          f"{len(args.measured)} file(s), topology {args.topology}")  # fmt: skip
    print("\n".join(describe(calibration)))
    for note in notes:
        print(f"# note: {note}")
    fitted = sorted({k.split("/")[0] for k in calibration.params})
    print(
        f"# other (op, algo, scope) fall back: same algorithm other op, then the scope's "
        f"machine overhead and efficiency, then defaults (fitted ops: {', '.join(fitted)})"
    )
    calibration.save(target)
    if not target.is_stdout:
        print(f"# wrote {target.name}")
    return 0


def _used(calibration: Calibration, num_read: int) -> str:
    """``56 of 112 records used (56 in-place twins of out-of-place ones)``: what the fit used,
    and why the rest were left out."""
    used = sum(q.num_points for q in calibration.quality.values())
    priced = int(calibration.fitted_from.get("num_records", num_read))
    why = [
        f"{num_read - priced} in-place twins of out-of-place ones" if num_read > priced else "",
        f"{priced - used} in groups of too few sizes" if priced > used else "",
    ]
    reasons = ", ".join(w for w in why if w)
    return f"{used} of {num_read} records used" + (f" ({reasons})" if reasons else "")


def _note(line: str) -> None:
    print(f"# note: {line}")
