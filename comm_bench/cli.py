"""The ``commbench`` command: nccl-tests-style collective benchmarks through torch.distributed.

Under torchrun (RANK, WORLD_SIZE, ... set) this process is one rank of that world, on one or
many nodes. Otherwise it spawns ``--nprocs`` local ranks (default: the GPUs present, or 4 on
CPU) and watches them. ``commbench --compute ...`` runs the compute benchmark instead.
Bad flags print one ``commbench: error: ...`` line and exit with code 2, before anything runs.

    commbench --ops all_gather -b 1K -e 16M -f 2
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from comm_bench.launch import die_with_parent
from comm_bench.options import BenchOptions, parse_options, validate_for_world
from fileio.strict import cap_line

USAGE_EXIT = 2
"""Exit code for bad command-line input."""

DEFAULT_CPU_PROCS = 4
"""Local ranks spawned on a machine without GPUs."""


def _compute(argv: list[str]) -> int:
    """Hand ``commbench --compute ...`` to the compute benchmark, if it is installed."""
    try:
        compute = importlib.import_module("comm_bench.compute")
    except ModuleNotFoundError as error:
        if error.name != "comm_bench.compute":
            raise
        print(
            "commbench: error: --compute is not available (comm_bench.compute is missing)",
            file=sys.stderr,
        )
        return USAGE_EXIT
    return int(compute.main([a for a in argv if a != "--compute"]))


def _launched_world() -> int:
    import os

    return int(os.environ["WORLD_SIZE"])


def _spawn(argv: list[str], options: BenchOptions) -> int:
    import torch

    from comm_bench.dist_env import resolve_backend
    from comm_bench.launch import spawn_local
    from fileio.output import check_output
    from vocab.writer import default_output_path

    backend = resolve_backend(options.backend)
    gpus = torch.cuda.device_count() if backend == "nccl" else 0
    nprocs = options.nprocs or gpus or DEFAULT_CPU_PROCS
    if backend == "nccl" and nprocs > gpus:
        raise ValueError(f"--nprocs {nprocs} exceeds the {gpus} GPU(s) here; NCCL needs one each")
    validate_for_world(options, nprocs)
    output = options.output or default_output_path(options.ops)
    target = check_output(output, formats=(".json",), option="--output")
    if target.path is None:
        raise ValueError("--output -: the ranks write a results file; give a file name")
    return spawn_local(argv, nprocs=nprocs, timeout_s=options.timeout_s, output=target.path)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``commbench``; returns the exit code."""
    die_with_parent()  # first, before importing torch takes seconds: a no-op unless spawned
    args = list(sys.argv[1:] if argv is None else argv)
    if "--compute" in args:
        return _compute(args)
    if "--step" in args:
        from comm_bench import step

        return step.main([a for a in args if a != "--step"])
    try:
        options = parse_options(args)
        from comm_bench.dist_env import check_launch_env, under_launcher

        if not under_launcher():
            return _spawn(args, options)
        check_launch_env()
        validate_for_world(options, _launched_world())
        if options.output is not None:
            from fileio.output import check_output

            check_output(options.output, formats=(".json",), option="--output")
        from comm_bench.harness import run_rank

        return run_rank(options)
    except ValueError as error:
        print(f"commbench: error: {cap_line(str(error))}", file=sys.stderr)
        return USAGE_EXIT
    except OSError as error:  # an output path that cannot be made (e.g. ./results is a file)
        where = f"{error.filename}: " if error.filename else ""
        message = cap_line(where + (error.strerror or str(error)))
        print(f"commbench: error: {message}", file=sys.stderr)
        return USAGE_EXIT
