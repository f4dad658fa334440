"""FSDP CPU offload in a step program: the host copies around each unit's collectives.

Read from torch 2.13. FSDP2, ``fully_shard(offload_policy=CPUOffloadPolicy(pin_memory))``
(``_fully_shard/_fsdp_param.py``, ``_fsdp_collectives.py``, ``_fsdp_param_group.py``):

- **Before the all-gather**: ``foreach_all_gather`` takes ``FSDPParam.all_gather_inputs``, which
  copies the fp32 shard to the GPU (``.to(device, non_blocking=True)``) and casts it, on the
  all-gather copy-in stream; the all-gather stream waits for that stream. The copy-in stream
  waits for the same copy-out events as the all-gather, so the copy is gated like it.
- **After the reduce-scatter**: ``foreach_reduce`` casts the shard (HSDP: after the all-reduce)
  to the parameter dtype, fp32, and copies it to the host on that post-reduce stream, so the next
  reduce-scatter (HSDP: all-reduce) queues behind the copy. The copy is ``non_blocking`` only
  into pinned memory with no CPU gradient to add into (the first micro-batch after
  ``zero_grad``); otherwise the host waits for it and, on later micro-batches, adds it into the
  CPU gradient before it issues the next unit's backward.
- **Step end**: ``finalize_backward`` makes the compute stream wait for the post-reduce events
  and the host for every ``grad_offload_event``; the optimizer then steps on the CPU tensors.

FSDP1, ``CPUOffload(offload_params=True)`` (``_flat_param.py``, ``_runtime_utils.py``):
``pre_unshard`` copies the pinned fp32 flat shard to the GPU on the pre-unshard stream, which the
unshard stream waits for; ``_unshard`` issues it before the rate limiter, whose
``event.synchronize()`` then holds the host (so later copies are issued after that free event).
``_offload_grad`` copies the fp32 sharded gradient into the pinned ``_cpu_grad`` on the
post-backward stream after the reduce-scatter (HSDP: on the all-reduce stream after the
all-reduce), non-blocking; the post-backward final callback synchronizes the host with it.

    host = FsdpHostCopies(b, offload)
    deps = host.fetch("u0 mb0", gathered_bytes, deps)
    reduced = reduce_unit(b, "u0 mb0", size, waits, tail=host.tail)
    copies, held = host.grads("u0 mb0", size, reduced, waits, microbatch=0)
"""

from __future__ import annotations

from schedules.actions import ProgramBuilder
from schedules.offload import RankOffload, add_copies


class FsdpHostCopies:
    """One rank's FSDP offload copies as its program is built (state: the last gradient copy,
    which the next reduction on its stream queues behind, and the last free event the host was
    held at). With ``offload`` None it adds nothing."""

    def __init__(self, b: ProgramBuilder, offload: RankOffload | None) -> None:
        self.b = b
        self.offload = offload
        self.tail: tuple[int, ...] = ()
        self.gate: tuple[int, ...] = ()

    def fetch(self, label: str, gathered_bytes: float, deps: tuple[int, ...]) -> tuple[int, ...]:
        """Copy the shard of an all-gather of ``gathered_bytes`` to the GPU, issued after
        ``deps``; returns what the all-gather waits for (the copy, or ``deps`` without one)."""
        if self.offload is None:
            return deps
        copies = self.offload.fetch(gathered_bytes)
        copied = add_copies(self.b, label, copies, tuple(sorted({*deps, *self.gate})))
        return deps if copied is None else (copied,)

    def held(self, free: int) -> None:
        """The host waited for the free event ``free`` (FSDP1's rate limiter): what it issues
        afterwards, copies included, starts after it."""
        self.gate = (free,)

    def grads(
        self, label: str, size: float, reduced: list[int], waits: list[int], microbatch: int
    ) -> tuple[list[int], list[int]]:
        """The copy to the host of a unit's gradient, reduced by ``reduced`` (``reduce_unit``
        with ``tail=self.tail``; none for a one-rank group: after the compute ``waits`` then) from
        ``size`` bytes; returns (the copies, what the host waits for before issuing more)."""
        if self.offload is None:
            return [], []
        after = tuple(reduced[-1:]) or self.b.after_compute(*waits)
        last = add_copies(self.b, label, self.offload.bucket(size, microbatch), after)
        if last is None:
            return [], []
        self.tail = (last,)
        return [last], [last] if self.offload.blocks_host(microbatch) else []
