"""The commbench command line: nccl-tests' flags parsed into one frozen ``BenchOptions``.

Torch-free. Flags keep nccl-tests' letters and meanings (``-b/-e`` sizes with binary K/M/G
suffixes, ``-f`` factor, ``-i`` step, ``-n`` iterations, ``-w`` warm-up, ``-c`` checks,
``-d`` dtype, ``-o`` reduction, ``-r`` root, ``-a`` how times are combined across ranks);
bad input raises ``ValueError`` with one line naming the flag, the value and what is valid.

    >>> parse_options(["--ops", "all_gather", "-b", "1K", "-e", "4K"]).sizes()
    [1024, 2048, 4096]
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fileio.strict import did_you_mean
from vocab.collectives import (
    DTYPE_ALIASES,
    MIN_WORLD_SIZE,
    NCCL_TESTS_DTYPES,
    REDUCTIONS,
    get,
    parse_ops,
)
from vocab.sizes import parse_size

AVERAGE_MODES = {0: "rank0", 1: "mean", 2: "min", 3: "max"}
"""``-a`` values: how per-rank times are combined (nccl-tests' ``--average``)."""

BACKENDS = ("auto", "gloo", "nccl")
"""``--backend`` values; ``auto`` is nccl with CUDA, else gloo."""
FLOAT_DTYPES = ("float32", "float16", "bfloat16", "float64")
"""The floating-point ``-d`` types (the others are integers)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchOptions:
    """Everything one commbench run needs to know, validated."""

    ops: tuple[str, ...] = ("all_reduce",)
    """Collectives to measure, in order."""
    min_bytes: int = 1 << 10
    """Smallest size (``-b``)."""
    max_bytes: int = 16 << 20
    """Largest size (``-e``)."""
    step_factor: int = 2
    """Multiplicative step (``-f``); 1 means use ``step_bytes``."""
    step_bytes: int = 1 << 20
    """Additive step (``-i``), used when ``step_factor`` is 1."""
    iters: int = 20
    """Timed iterations per size and placement (``-n``)."""
    warmup_iters: int = 5
    """Untimed iterations before timing (``-w``)."""
    check_iters: int = 1
    """Correctness-check iterations after timing (``-c``); 0 disables checking."""
    dtype: str = "float32"
    """Element type (``-d``)."""
    redop: str = "sum"
    """Reduction for reducing ops (``-o``)."""
    root: int = 0
    """Root rank of broadcast and reduce (``-r``)."""
    average: int = 1
    """How times combine across ranks (``-a``): 0 rank 0, 1 mean, 2 min, 3 max."""
    per_iter_columns: bool = False
    """Print min/median/p99 columns after each ``#wrong`` (``-I 1``); the JSON always has them."""
    nprocs: int | None = None
    """Local ranks to spawn without a launcher (None: GPUs present, or 4 on CPU)."""
    backend: str = "auto"
    """torch.distributed backend."""
    timeout_s: float = 120.0
    """Seconds any one collective (or a stalled rank) may take before the run is stopped."""
    output: Path | None = None
    """JSON results file (CSV beside it); None: a timestamped file under results/commbench/."""

    def sizes(self) -> list[int]:
        """The requested sizes in bytes, nccl-tests' sweep from ``min_bytes`` to ``max_bytes``."""
        sizes: list[int] = []
        size = self.min_bytes
        while size <= self.max_bytes:
            sizes.append(size)
            size = size * self.step_factor if self.step_factor > 1 else size + self.step_bytes
        return sizes

    def to_config(self) -> dict[str, Any]:
        """The options as the JSON ``config`` section."""
        config = asdict(self)
        config["ops"] = list(self.ops)
        config["output"] = None if self.output is None else str(self.output)
        config["average"] = AVERAGE_MODES[self.average]
        return config


def canonical_dtype(name: str) -> str:
    """Our dtype name for ours, nccl-tests' (``float``, ``half``, ``double``...) or a common
    alias (``bf16``, ``fp16``, ``fp32``...); ``torch.`` in front is allowed."""
    key = name.strip().lower().removeprefix("torch.")
    names = {**NCCL_TESTS_DTYPES, **DTYPE_ALIASES}
    if key not in names:
        valid = ", ".join(sorted(names))
        raise ValueError(f"unknown dtype {name!r} for -d{did_you_mean(key, names)}; valid: {valid}")
    return names[key]


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # "-1K" is a (bad) size value, not an option: let it reach the size check that names it.
        self._negative_number_matcher = re.compile(r"^-\d[\w.]*$")

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ValueError(message)


NCCL_TESTS_FIXED = {
    ("-t", "--nthreads"): (1, "one rank per process: more ranks come from --nprocs or torchrun"),
    ("-g", "--ngpus"): (1, "one GPU per process: more ranks come from --nprocs or torchrun"),
    ("-m", "--agg_iters"): (1, "each timed iteration is one call"),
    ("-N", "--run_cycles"): (1, "the sweep runs once"),
    ("-p", "--parallel_init"): (0, "ranks join one process group"),
    ("-z", "--blocking"): (0, "calls are not waited on one by one"),
    ("-y", "--stream_null"): (0, "calls run on torch's current stream"),
    ("-G", "--cudagraph"): (0, "calls are not captured in CUDA graphs"),
    ("-C", "--report_cputime"): (0, "times are measured on the device"),
    ("-S", "--report_timestamps"): (0, "no timestamp column"),
    ("-R", "--local_register"): (0, "buffers are not registered with NCCL"),
    ("-u", "--unalign"): (0, "buffers are aligned"),
}
"""nccl-tests flags taken at the one value commbench runs (their default), so that a pasted
nccl-tests command line works: flag names -> (that value, what commbench does instead)."""


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser (errors raise ``ValueError`` instead of exiting)."""
    p = _Parser(
        prog="commbench",
        allow_abbrev=False,
        description="Measure collectives through torch.distributed, reported like nccl-tests.",
        epilog="commbench --compute ... runs the GEMM/attention compute benchmark instead.",
    )
    d = BenchOptions()
    p.add_argument("--ops", default="all_reduce", help="ops, comma separated, or 'all'")
    p.add_argument("-b", "--minbytes", default="1K", help="min size (K/M/G binary), default 1K")
    p.add_argument("-e", "--maxbytes", default="16M", help="max size, default 16M")
    p.add_argument("-f", "--stepfactor", type=int, default=d.step_factor, help="size factor")
    p.add_argument("-i", "--stepbytes", default="1M", help="size step when -f is 1")
    p.add_argument("-n", "--iters", type=int, default=d.iters, help="timed iterations")
    p.add_argument("-w", "--warmup_iters", "--warmup-iters", type=int, default=d.warmup_iters)
    p.add_argument("-c", "--check", type=int, default=d.check_iters, help="check iterations")
    p.add_argument(
        "-d",
        "--datatype",
        default=d.dtype,
        help="float32 (float, fp32), bfloat16 (bf16), float16 (half, fp16), ...",
    )
    p.add_argument("-o", "--op", default=d.redop, help=f"reduction: {', '.join(REDUCTIONS)}")
    p.add_argument("-r", "--root", type=int, default=d.root, help="root of broadcast/reduce")
    p.add_argument(
        "-a", "--average", type=int, default=d.average, help="0 rank0 1 mean 2 min 3 max"
    )
    p.add_argument("-I", "--per_iter_timing", type=int, default=0, help="1: min/median/p99 columns")
    p.add_argument("--nprocs", type=int, default=None, help="local ranks when not under torchrun")
    p.add_argument("--backend", default="auto", help="auto (nccl with CUDA, else gloo), gloo, nccl")
    p.add_argument("-T", "--timeout", type=float, default=d.timeout_s, help="seconds, default 120")
    p.add_argument("--output", type=Path, default=None, help="results JSON (CSV beside it)")
    for flags, (value, _) in NCCL_TESTS_FIXED.items():
        p.add_argument(*flags, type=int, default=value, help=f"nccl-tests' flag; {value} only")
    return p


def _check_nccl_tests_flags(args: argparse.Namespace) -> None:
    """A nccl-tests flag at another value than commbench runs: one line naming it."""
    for (short, long), (value, reason) in NCCL_TESTS_FIXED.items():
        given = getattr(args, long.removeprefix("--"))
        if given != value:
            raise ValueError(f"{short} {given}: commbench runs only {short} {value} ({reason})")


def parse_options(argv: Sequence[str]) -> BenchOptions:
    """Parse and validate ``argv``; ``ValueError`` with one line on any bad value."""
    args = build_parser().parse_args(list(argv))
    _check_nccl_tests_flags(args)
    if args.per_iter_timing not in (0, 1):
        raise ValueError(f"-I must be 0 or 1, got {args.per_iter_timing}")
    options = BenchOptions(
        ops=tuple(parse_ops(args.ops)),
        min_bytes=parse_size(args.minbytes),
        max_bytes=parse_size(args.maxbytes),
        step_factor=args.stepfactor,
        step_bytes=parse_size(args.stepbytes),
        iters=args.iters,
        warmup_iters=args.warmup_iters,
        check_iters=args.check,
        dtype=canonical_dtype(args.datatype),
        redop=args.op.strip().lower(),
        root=args.root,
        average=args.average,
        per_iter_columns=bool(args.per_iter_timing),
        nprocs=args.nprocs,
        backend=args.backend.strip().lower(),
        timeout_s=args.timeout,
        output=args.output,
    )
    validate(options)
    return options


MAX_SIZES = 10_000
"""Most sizes one sweep may have (nccl-tests sweeps have tens; ``-f 1 -i 1 -e 16G`` would have
17 billion)."""
MAX_ITERS = 1_000_000
"""Most timed (or warm-up, or check) iterations per size."""
MIN_TIMEOUT_S = 1.0
"""Shortest per-collective timeout: the ranks' rendezvous alone takes longer than a few ms."""
MAX_TIMEOUT_S = 86_400.0
"""Longest per-collective timeout (a day); inf would never detect a hung rank."""


def max_local_procs() -> int:
    """Most ranks spawned on one host without torchrun: two per CPU core, at least 8 (each rank
    is a whole Python process with torch loaded, a few hundred MB)."""
    return max(8, 2 * (os.cpu_count() or 1))


def validate(o: BenchOptions) -> None:
    """Raise ``ValueError`` naming the first flag whose value is out of range."""
    checks = [
        (o.min_bytes <= o.max_bytes, f"-b {o.min_bytes} is larger than -e {o.max_bytes}"),
        (o.step_factor >= 1, f"-f must be >= 1, got {o.step_factor}"),
        (o.step_factor > 1 or o.step_bytes > 0, f"-i must be > 0 when -f is 1, got {o.step_bytes}"),
        (o.step_factor == 1 or o.min_bytes > 0, "-b must be > 0 with a multiplicative -f"),
        (1 <= o.iters <= MAX_ITERS, f"-n must be in 1..{MAX_ITERS:,}, got {o.iters:,}"),
        (
            0 <= o.warmup_iters <= MAX_ITERS,
            f"-w must be in 0..{MAX_ITERS:,}, got {o.warmup_iters:,}",
        ),
        (0 <= o.check_iters <= MAX_ITERS, f"-c must be in 0..{MAX_ITERS:,}, got {o.check_iters:,}"),
        (
            o.redop in REDUCTIONS,
            f"unknown reduction -o {o.redop!r}; valid: {', '.join(REDUCTIONS)}",
        ),
        (o.root >= 0, f"-r must be >= 0, got {o.root}"),
        (o.average in AVERAGE_MODES, f"-a must be 0, 1, 2 or 3, got {o.average}"),
        (o.nprocs is None or o.nprocs >= 1, f"--nprocs must be >= 1, got {o.nprocs}"),
        (
            o.nprocs is None or o.nprocs <= max_local_procs(),
            f"--nprocs {o.nprocs}: at most {max_local_procs()} local ranks on this host's "
            f"{os.cpu_count()} CPU cores (use torchrun for more)",
        ),
        (o.backend in BACKENDS, f"unknown --backend {o.backend!r}; valid: {', '.join(BACKENDS)}"),
        (
            MIN_TIMEOUT_S <= o.timeout_s <= MAX_TIMEOUT_S,
            f"--timeout must be {MIN_TIMEOUT_S:g} to {MAX_TIMEOUT_S:g} seconds, got {o.timeout_s}",
        ),
        (o.output is None or o.output.suffix == ".json", f"--output must end in .json: {o.output}"),
    ]
    for ok, message in checks:
        if not ok:
            raise ValueError(message)
    if _count_sizes(o) > MAX_SIZES:
        step = f"-f {o.step_factor}" if o.step_factor > 1 else f"-i {o.step_bytes}"
        raise ValueError(
            f"-b {o.min_bytes} -e {o.max_bytes} {step} gives more than {MAX_SIZES:,} sizes; "
            "use a larger step"
        )


def _count_sizes(o: BenchOptions) -> int:
    """How many sizes ``o.sizes()`` has, counted without listing them (at most MAX_SIZES + 1)."""
    if o.step_factor == 1:
        return (o.max_bytes - o.min_bytes) // o.step_bytes + 1
    count, size = 0, o.min_bytes
    while size <= o.max_bytes and count <= MAX_SIZES:
        count, size = count + 1, size * o.step_factor
    return count


def validate_for_world(o: BenchOptions, world_size: int) -> None:
    """Checks that need the world size: the root must be a rank when a rooted op is asked, and
    a one-rank world has something to measure (``send_recv`` needs a peer)."""
    needs = {op: MIN_WORLD_SIZE.get(op, 1) for op in o.ops}
    if all(n > world_size for n in needs.values()):
        named = ", ".join(f"{op} needs {n} ranks" for op, n in needs.items())
        fewest = max(needs.values())
        raise ValueError(
            f"nothing to measure: {named}, the world has {world_size} (--nprocs {fewest})"
        )
    rooted = [op for op in o.ops if get(op).rooted]
    if rooted and o.root >= world_size:
        raise ValueError(
            f"-r {o.root} is not a rank of a {world_size}-rank world "
            f"(needed by {', '.join(rooted)})"
        )


def validate_for_backend(o: BenchOptions, backend: str) -> None:
    """Checks that need the backend (``gloo`` or ``nccl``, resolved): torch's gloo backend
    averages by dividing the sum in place, which an integer tensor cannot hold, so ``-o avg``
    on an integer ``-d`` runs no reducing op there (NCCL's ncclAvg divides integers itself).
    As in ``validate_for_world``, a run left with nothing to measure is refused; one with other
    ops measures them and skips the rest with a note."""
    integer_avg = o.redop == "avg" and o.dtype not in FLOAT_DTYPES
    if backend == "gloo" and integer_avg and all(get(op).reduces for op in o.ops):
        raise ValueError(
            f"nothing to measure: backend gloo cannot average integers (-o avg -d {o.dtype}) for "
            f"{', '.join(o.ops)}: it divides the sum in place; use a floating-point -d, another "
            "-o, or --backend nccl"
        )
