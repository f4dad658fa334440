"""The torch.distributed call of each op, with nccl-tests' out-of-place and in-place buffers.

In-place buffers follow nccl-tests (``startColl``): all_gather's input is the slice
``rank * count`` of its output, reduce_scatter's output is the slice ``rank * count`` of its input,
and all_to_all and send_recv send from and receive into one buffer. torch.distributed's
all_reduce, broadcast and reduce exist only in the in-place form (the result overwrites the
input), so their out-of-place block times the same call on buffers of its own.

Usage: ``make_call(op, make_buffers(op, counts, rank, n, in_place, dtype, device), rank, n,
"sum", root)()`` issues one collective.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from vocab.collectives import MIN_WORLD_SIZE, Counts, get

REDUCE_OPS = {
    "sum": dist.ReduceOp.SUM,
    "prod": dist.ReduceOp.PRODUCT,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "avg": dist.ReduceOp.AVG,
}
"""nccl-tests' reduction names to torch's."""

# torch 2.10+ renamed the tensor forms; older releases only have the original names.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


@dataclass(frozen=True, slots=True, kw_only=True)
class Buffers:
    """The send and receive tensors of one call (views of one tensor when in-place)."""

    send: torch.Tensor
    """What this rank contributes."""
    recv: torch.Tensor
    """Where this rank's result lands."""


def make_buffers(
    op: str,
    counts: Counts,
    rank: int,
    world_size: int,
    in_place: bool,
    dtype: torch.dtype,
    device: torch.device,
) -> Buffers:
    """Allocate the buffers of ``op`` for one size and placement."""

    def empty(num_elems: int) -> torch.Tensor:
        return torch.zeros(num_elems, dtype=dtype, device=device)

    if op in ("all_reduce", "broadcast", "reduce"):
        buf = empty(counts.send_elems)
        return Buffers(send=buf, recv=buf)
    if not in_place:
        return Buffers(send=empty(counts.send_elems), recv=empty(counts.recv_elems))
    if op == "all_gather":
        recv = empty(counts.recv_elems)
        return Buffers(send=recv[rank * counts.count : (rank + 1) * counts.count], recv=recv)
    if op == "reduce_scatter":
        send = empty(counts.send_elems)
        return Buffers(send=send, recv=send[rank * counts.count : (rank + 1) * counts.count])
    buf = empty(counts.send_elems)  # all_to_all, send_recv: one buffer, as nccl-tests
    return Buffers(send=buf, recv=buf)


def make_call(
    op: str,
    bufs: Buffers,
    rank: int,
    world_size: int,
    redop: str,
    root: int,
    group: dist.ProcessGroup | None = None,
) -> Callable[[], None]:
    """A no-argument function issuing one ``op`` on ``bufs`` (blocking on gloo, queued on NCCL)."""
    reduce_op = REDUCE_OPS[redop]
    send, recv = bufs.send, bufs.recv
    if op == "all_reduce":
        return lambda: dist.all_reduce(recv, op=reduce_op, group=group)
    if op == "all_gather":
        return lambda: _ALL_GATHER(recv, send, group=group)
    if op == "reduce_scatter":
        return lambda: _REDUCE_SCATTER(recv, send, op=reduce_op, group=group)
    if op == "all_to_all":
        return lambda: dist.all_to_all_single(recv, send, group=group)
    if op == "broadcast":
        return lambda: dist.broadcast(recv, src=root, group=group)
    if op == "reduce":
        return lambda: dist.reduce(recv, dst=root, op=reduce_op, group=group)
    if op == "send_recv":
        return _send_recv_call(send, recv, rank, world_size, group)
    raise ValueError(f"no call for op {op!r}")


def _send_recv_call(
    send: torch.Tensor,
    recv: torch.Tensor,
    rank: int,
    world_size: int,
    group: dist.ProcessGroup | None,
) -> Callable[[], None]:
    """nccl-tests' sendrecv: send to rank + 1 and receive from rank - 1, as one batch."""
    peer_to, peer_from = (rank + 1) % world_size, (rank - 1) % world_size

    def call() -> None:
        p2p = [
            dist.P2POp(dist.isend, send, peer_to, group=group),
            dist.P2POp(dist.irecv, recv, peer_from, group=group),
        ]
        for work in dist.batch_isend_irecv(p2p):
            work.wait()

    return call


UNDEFINED_IN_PLACE = ("all_to_all", "send_recv")
"""Ops whose in-place result neither NCCL nor gloo defines: a chunk can be overwritten by the
receive before it is sent (nccl-tests#253), so their in-place ``#wrong`` is reported as N/A."""


def checkable(op: str, in_place: bool) -> bool:
    """Whether the result of ``op`` in this placement is defined, hence checked."""
    return not (in_place and op in UNDEFINED_IN_PLACE)


def min_world_size(op: str) -> int:
    """Fewest ranks the op can run on (send_recv needs a peer other than itself)."""
    get(op)
    return MIN_WORLD_SIZE.get(op, 1)
