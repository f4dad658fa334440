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
from pathlib import Path

from comm_bench.launch import die_with_parent
from comm_bench.options import (
    BenchOptions,
    parse_options,
    validate_for_backend,
    validate_for_world,
)
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


def _check_outputs(output: Path) -> Path | None:
    """The checked results file and its CSV twin (``fileio.output``), before anything runs;
    None for standard output."""
    from fileio.output import check_output, twin

    target = check_output(output, formats=(".json",), option="--output")
    twin(target, ".csv")
    return target.path


def _check_fits(
    options: BenchOptions,
    backend: str,
    *,
    world_size: int,
    local_ranks: int,
    gpus: Sequence[int],
) -> None:
    """The sweep's largest size against the whole memory of each local rank's GPU (NCCL), or
    of the host's RAM that its ``local_ranks`` share (gloo)."""
    import torch

    from comm_bench.harness import check_max_size

    if backend == "nccl":
        for index in gpus:
            check_max_size(options, torch.device("cuda", index), world_size=world_size)
    else:
        check_max_size(options, torch.device("cpu"), world_size=world_size, local_ranks=local_ranks)


def _spawn(argv: list[str], options: BenchOptions) -> int:
    import torch

    from comm_bench.dist_env import resolve_backend
    from comm_bench.launch import spawn_local
    from vocab.writer import default_output_path

    backend = resolve_backend(options.backend)
    gpus = torch.cuda.device_count() if backend == "nccl" else 0
    nprocs = options.nprocs or gpus or DEFAULT_CPU_PROCS
    if backend == "nccl" and nprocs > gpus:
        raise ValueError(f"--nprocs {nprocs} exceeds the {gpus} GPU(s) here; NCCL needs one each")
    validate_for_world(options, nprocs)
    validate_for_backend(options, backend)
    _check_fits(options, backend, world_size=nprocs, local_ranks=nprocs, gpus=range(nprocs))
    path = _check_outputs(options.output or default_output_path(options.ops))
    if path is None:
        raise ValueError("--output -: the ranks write a results file; give a file name")
    return spawn_local(argv, nprocs=nprocs, timeout_s=options.timeout_s, output=path)


def _launched(options: BenchOptions) -> int:
    """Run as one rank of the launcher's world, after the checks that need its size."""
    import os

    from comm_bench.dist_env import check_launch_env, resolve_backend
    from comm_bench.harness import run_rank

    check_launch_env()
    world = int(os.environ["WORLD_SIZE"])
    validate_for_world(options, world)
    backend = resolve_backend(options.backend)
    validate_for_backend(options, backend)
    local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    gpu = int(os.environ.get("LOCAL_RANK", "0"))
    _check_fits(options, backend, world_size=world, local_ranks=local_ranks, gpus=[gpu])
    if options.output is not None:
        _check_outputs(options.output)
    return run_rank(options)


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
        from comm_bench.dist_env import under_launcher

        return _launched(options) if under_launcher() else _spawn(args, options)
    except ValueError as error:
        print(f"commbench: error: {cap_line(str(error))}", file=sys.stderr)
        return USAGE_EXIT
    except OSError as error:  # an output path that cannot be made (e.g. ./results is a file)
        where = f"{error.filename}: " if error.filename else ""
        message = cap_line(where + (error.strerror or str(error)))
        print(f"commbench: error: {message}", file=sys.stderr)
        return USAGE_EXIT
