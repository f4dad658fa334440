"""The inputs of ``commbench --compute``, checked before anything is measured.

Integer flags are at least their least value, ``--gpu`` names a catalogue GPU, size lists parse,
and every sample's tensors fit in the whole memory of the device (``comm_bench.memory``): one
``UsageError`` line (exit code 2) otherwise. What fits the memory but not what is free when it is
allocated is turned into such a line too (``allocating``).

    check_memory(torch.device("cpu"), "fp32", sizes=[65536], shapes=[], seq_lens=[],
                 attention={"batch": 1, "heads": 2, "head_dim": 32}, adam_params=0)
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator, Sequence

import torch

from comm_bench.memory import allocation_failure, shortfall
from fileio.strict import did_you_mean
from schedules.kernels import element_bytes
from topologies.hardware import GPUS

ADAM_BYTES_PER_PARAM = 16
"""What the CPU Adam step holds per parameter: the fp32 parameter, its gradient, two moments."""
COUNT_FLAGS = (
    ("--batch", "batch", 1),
    ("--heads", "heads", 1),
    ("--head-dim", "head_dim", 1),
    ("--iters", "iters", 1),
    ("--warmup", "warmup", 0),
    ("--repeats", "repeats", 1),
    ("--threads", "threads", 1),
    ("--adam-params", "adam_params", 0),
    ("--adam-threads", "adam_threads", 1),
)
"""Integer flags, their ``argparse`` names and least values (a default of None is not checked)."""


class UsageError(ValueError):
    """Bad command-line input: one line, exit code 2."""


def parse_ints(flag: str, text: str) -> list[int]:
    """'512,1024' -> [512, 1024]; anything but positive integers is a ``UsageError``."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if not values or min(values) <= 0:
        raise UsageError(f"{flag}: expected positive integers, got {text!r}")
    return values


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """'MxNxK,MxNxK' -> [(m, n, k), ...]."""
    shapes = []
    for part in text.split(","):
        dims = part.strip().lower().split("x")
        if len(dims) != 3:
            raise UsageError(f"--shapes: {part!r} is not MxNxK")
        m, n, k = parse_ints("--shapes", ",".join(dims))
        shapes.append((m, n, k))
    return shapes


def check_counts(args: argparse.Namespace, flags: Sequence[tuple[str, str, int]]) -> None:
    """Raise ``UsageError`` naming the first of ``flags`` (flag, ``argparse`` name, least value)
    whose value is below its least; a value of None (a default to be chosen) is not checked."""
    for flag, name, least in flags:
        value = getattr(args, name)
        if value is not None and value < least:
            raise UsageError(f"{flag} must be >= {least}, got {value}")


def check_flags(args: argparse.Namespace) -> None:
    """Raise ``UsageError`` naming the first integer flag below its least value, or a --gpu
    that is not a catalogue key."""
    check_counts(args, COUNT_FLAGS)
    if args.gpu not in (None, "", *GPUS):
        raise UsageError(
            f"unknown --gpu {args.gpu!r}{did_you_mean(args.gpu, GPUS)}; valid: "
            f"{', '.join(sorted(GPUS))}"
        )


def gemm_bytes(m: int, n: int, k: int, dtype: str) -> int:
    """Bytes one GEMM sample holds: A (m x k) and B (n x k) drawn in fp32, their copies in
    ``dtype`` and the m x n output (bf16 for fp8)."""
    elem = element_bytes(dtype)
    out = element_bytes("bf16") if dtype == "fp8" else elem
    return (m + n) * k * (4 + elem) + m * n * out


def attention_bytes(*, batch: int, heads: int, head_dim: int, seq: int, dtype: str) -> int:
    """Bytes one attention sample holds: q, k, v and the output gradient, the output and the
    three input gradients (in ``dtype``; fp8 runs bf16), and one of them as drawn in fp32."""
    elem = element_bytes("bf16" if dtype == "fp8" else dtype)
    return batch * heads * seq * head_dim * (8 * elem + 4)


def check_memory(
    device: torch.device,
    dtype: str,
    *,
    sizes: Sequence[int],
    shapes: Sequence[tuple[int, int, int]],
    seq_lens: Sequence[int],
    attention: dict[str, int],
    adam_params: int,
) -> None:
    """Refuse, before anything is measured, a sample whose tensors exceed the whole memory of
    the device (the CPU Adam step: of the host)."""
    wanted = [(f"--sizes {s}", gemm_bytes(s, s, s, dtype), device) for s in sizes]
    wanted += [(f"--shapes {m}x{n}x{k}", gemm_bytes(m, n, k, dtype), device) for m, n, k in shapes]
    context = "batch {batch}, {heads} heads of {head_dim}".format(**attention)
    wanted += [
        (f"--seq-lens {s} ({context})", attention_bytes(seq=s, dtype=dtype, **attention), device)
        for s in seq_lens
    ]
    host = torch.device("cpu")
    wanted.append((f"--adam-params {adam_params}", ADAM_BYTES_PER_PARAM * adam_params, host))
    for what, needed_bytes, where in wanted:
        short = shortfall(needed_bytes, where)
        if short is not None:
            raise UsageError(f"{what}: its tensors need {short}")


@contextlib.contextmanager
def allocating(what: str) -> Iterator[None]:
    """Torch refusing to allocate ``what`` as one usage line: ``check_memory`` refuses what can
    never fit, this what does not fit in the memory free now."""
    try:
        yield
    except RuntimeError as error:
        if not allocation_failure(error):
            raise
        raise UsageError(
            f"{what}: torch could not allocate its tensors (too large for the memory free now)"
        ) from None
