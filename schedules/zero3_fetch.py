"""DeepSpeed ZeRO stage 3 parameter coordinator: what each module hook gathers, waits for, frees.

Modelled on DeepSpeed v0.16.4 (commit e2dc3eeb), checked against its source:

- ``partitioned_param_coordinator.py``, ``fetch_sub_module``: every ``nn.Module`` gets pre/post
  forward and backward hooks (``parameter_offload.py``, ``_register_deepspeed_module``); the
  pre-hook all-gathers the module's direct parameters that are not available in one coalesced
  all-gather on the data-parallel group (``all_gather_coalesced``, one flat ``allgather_fn``),
  waits for them, then, with a recorded trace (every micro-batch after the first one ever),
  pops the module's own entries off the parameter queue and walks further along it, gathering in
  ONE more coalesced all-gather every not-yet-available parameter it meets until their numel
  reaches ``min(max_live_parameters - live numel, prefetch_bucket_size)``. The budget is per call,
  so the lookahead grows while modules are smaller than the bucket; persistent and already
  gathered parameters are skipped (but marked as seen). The trace covers one forward and backward
  (``reset_step`` at each forward's start, ``_start_of_forward_hook``), so forward prefetch runs
  on into the backward.
- ``release_sub_module`` / ``__params_to_release``: after a module's forward or backward its
  parameters are freed unless persistent, unless the prefetch walk already passed a later use,
  or unless the module is used again before ``max_reuse_distance`` numel of trace (each module
  appears twice, so the last modules of the forward stay gathered for the backward).
- Persistence (``partition_parameters.py``, ``Init._convert_to_deepspeed_param``): a tensor with
  ``numel <= stage3_param_persistence_threshold`` is never fetched in the step (the optimizer
  step's re-gather of it is in ``schedules.zero3_program``).

``fetch="sync_per_weight"`` models DeepSpeed v0.3.13 (commit 12a53b43): ``_allgather_param``
all-gathers each weight on its own. Its trace-based prefetch (from the second step on) is left
out: each prefetched weight also starts after a device sync, so only the last one could overlap
the module's compute. ``zero3_buffer_bytes`` sizes the runtime's buffers (bucket, gathered
parameters, gradient partition) from the coordinator's trace.

    fetches = fetch_trace(spec)  # one Fetch per module hook of every micro-batch
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from schedules.zero3_spec import Zero3Rank

_NONE, _FLIGHT, _READY = 0, 1, 2
"""Parameter states: ``NOT_AVAILABLE``, ``INFLIGHT``, ``AVAILABLE`` (ZeroParamStatus)."""


def module_trace(spec: Zero3Rank) -> tuple[tuple[int, str], ...]:
    """The hooks of one micro-batch as (submodule, ``F``/``R``/``B``): the forward in order, then
    the backward in reverse, a recompute block's forward replayed before its backward.

    >>> from schedules.zero3_spec import Submodule
    >>> subs = tuple(Submodule(name=str(i), num_params=1, forward=(), backward=()) for i in "abc")
    >>> spec = Zero3Rank(rank=0, num_microbatches=1, submodules=subs, groups={"dp": (0,)},
    ...                  recompute_blocks=((1, 3),))
    >>> module_trace(spec)
    ((0, 'F'), (1, 'F'), (2, 'F'), (1, 'R'), (2, 'R'), (2, 'B'), (1, 'B'), (0, 'B'))
    """
    n = len(spec.submodules)
    blocks = {stop - 1: start for start, stop in spec.recompute_blocks}
    trace = [(m, "F") for m in range(n)]
    m = n - 1
    while m >= 0:
        start = blocks.get(m, m)
        if m in blocks:
            trace += [(k, "R") for k in range(start, m + 1)]
        trace += [(k, "B") for k in range(m, start - 1, -1)]
        m = start - 1
    return tuple(trace)


@dataclass(frozen=True, slots=True, kw_only=True)
class Fetch:
    """What the parameter coordinator does at one module's pre-forward or pre-backward hook."""

    step: int
    """Position in the micro-batch trace (``module_trace``)."""
    module: int
    """Index into ``Zero3Rank.submodules``."""
    kind: str
    """``F`` forward, ``R`` recomputed forward, ``B`` backward."""
    own: tuple[tuple[int, ...], ...]
    """Parameter ids of its own all-gathers (one coalesced; one per tensor in v0.3.x)."""
    prefetch: tuple[int, ...]
    """Parameter ids of the prefetch all-gather issued after it (empty: none)."""
    waits: tuple[int, ...]
    """Its parameters still in flight: the compute waits for the all-gathers carrying them."""
    live_numel: float
    """Gathered and in-flight elements (non-persistent) once it is done."""


class ParamCoordinator:
    """DeepSpeed's ``PartitionedParameterCoordinator`` at parameter granularity (builder state)."""

    def __init__(self, spec: Zero3Rank) -> None:
        self.spec = spec
        self.numel: list[float] = []
        self.params: list[tuple[int, ...]] = []
        self.owner: list[int] = []
        for m, sub in enumerate(spec.submodules):
            first = len(self.numel)
            self.numel += sub.param_tensors
            self.owner += [m] * len(sub.param_tensors)
            self.params.append(tuple(range(first, len(self.numel))))
        self.persistent = [n <= spec.persistence_threshold for n in self.numel]
        self.state = [_READY if p else _NONE for p in self.persistent]
        self.trace, self.kinds = zip(*module_trace(spec), strict=True)
        module_numel = [sum(self.numel[p] for p in ps) for ps in self.params]
        self.before = [0.0]
        for m in self.trace:
            self.before.append(self.before[-1] + module_numel[m])
        self.next_use: list[int | None] = []
        later: dict[int, int] = {}
        for step in range(len(self.trace) - 1, -1, -1):
            self.next_use.insert(0, later.get(self.trace[step]))
            later[self.trace[step]] = step
        self.live = 0.0
        self.queue: deque[tuple[int, int]] = deque()
        self.seen: dict[int, int] = {}

    def reset(self) -> tuple[int, ...]:
        """``reset_step`` at a forward's start: in-flight leftovers are waited for and freed."""
        flushed = tuple(p for p, s in enumerate(self.state) if s == _FLIGHT)
        self._free(flushed)
        self.queue = deque((p, s) for s, m in enumerate(self.trace) for p in self.params[m])
        self.seen = {}
        return flushed

    def fetch(self, step: int) -> Fetch:
        """``fetch_sub_module``: gather what is missing, wait, then prefetch along the trace."""
        m = self.trace[step]
        missing = tuple(p for p in self.params[m] if self.state[p] == _NONE)
        per_weight = self.spec.fetch == "sync_per_weight"
        own = tuple((p,) for p in missing) if per_weight else ((missing,) if missing else ())
        self._gather(missing)
        waits = tuple(p for p in self.params[m] if self.state[p] == _FLIGHT)
        for p in waits:
            self.state[p] = _READY
        prefetch: tuple[int, ...] = ()
        if not per_weight:
            self._pop_own(step, m)
            prefetch = self._prefetch()
        return Fetch(step=step, module=m, kind=self.kinds[step], own=own, prefetch=prefetch,
                     waits=waits, live_numel=self.live)  # fmt: skip

    def _pop_own(self, step: int, m: int) -> None:
        """Take the module's own entries off the queue unless a prefetch walk already did."""
        pending = {p for p in self.params[m] if self.seen.get(p, -1) < step}
        popped: set[int] = set()
        while self.queue and len(popped) < len(pending):
            p, s = self.queue.popleft()
            self.seen[p] = s
            popped.add(p)
        assert popped == pending, f"trace out of order at step {step}: {popped} != {pending}"

    def _prefetch(self) -> tuple[int, ...]:
        """Walk the queue, gathering what is missing until its numel reaches the budget."""
        spec = self.spec
        if spec.prefetch_bucket_elems <= 0:
            return ()
        budget = min(spec.max_live_parameters - self.live, spec.prefetch_bucket_elems)
        chosen: list[int] = []
        chosen_numel = 0.0
        while self.queue and chosen_numel < budget:
            p, s = self.queue.popleft()
            self.seen[p] = max(self.seen.get(p, -1), s)
            if self.state[p] == _NONE and p not in chosen:
                chosen.append(p)
                chosen_numel += self.numel[p]
        self._gather(tuple(chosen))
        return tuple(sorted(chosen))

    def release(self, step: int) -> None:
        """``release_sub_module`` after the module ran (``__params_to_release``)."""
        m, after, j = self.trace[step], step + 1, self.next_use[step]
        if j is not None and self.before[j] - self.before[after] < self.spec.max_reuse_distance:
            return  # used again within max_reuse_distance numel of trace
        free = tuple(
            p
            for p in self.params[m]
            if not self.persistent[p] and self.seen.get(p, -1) <= after and self.state[p] == _READY
        )
        self._free(free)

    def _gather(self, params: tuple[int, ...]) -> None:
        for p in params:
            self.state[p] = _FLIGHT
            self.live += self.numel[p]

    def _free(self, params: tuple[int, ...]) -> None:
        for p in params:
            self.state[p] = _NONE
            self.live -= self.numel[p]


def fetch_trace(spec: Zero3Rank) -> list[Fetch]:
    """The coordinator's decisions at every module hook of every micro-batch, in order."""
    coordinator = ParamCoordinator(spec)
    fetches = []
    for _ in range(spec.num_microbatches):
        coordinator.reset()
        for step in range(len(coordinator.trace)):
            fetches.append(coordinator.fetch(step))
            coordinator.release(step)
    return fetches


def zero3_buffer_bytes(
    spec: Zero3Rank, *, grad_accum_bytes: float = 2.0, sub_group_elems: float = 1e9
) -> dict[str, float]:
    """Memory the ZeRO-3 runtime adds on one GPU at its peak, by buffer (bytes).

    - ``ipg_bucket``: ``torch.empty(reduce_bucket_size, dtype=model dtype)``, allocated once
      with ``contiguous_gradients`` (``stage3.py``, ``_setup_for_real_optimizer``).
    - ``reduce_scatter_copy``: the interleaved flat copy of the largest bucket that
      ``reduce_scatter_coalesced`` (``runtime/comm/coalesced_collectives.py``) reduces.
    - ``live_params``: the most gathered and in-flight non-persistent elements at any hook
      (``fetch_trace``: prefetch window, ``max_live_parameters``, reuse distance).
    - ``persistent_params``: the full copies of the persistent tensors.
    - ``grad_partition``: ``grad_partitions_flat_buffer``, this rank's 1/dp of every gradient in
      ``gradient_accumulation_dtype`` (``engine.get_data_types``: the model dtype under ZeRO
      unless ``data_types.grad_accum_dtype`` is set: 2 bytes for bf16, not fp32);
      ``averaged_gradients`` are views into it. It is the zero3 ``gradients`` term of
      ``schedules.memory``: do not add both.
    - ``step_fp32_grad``: during the step only, one optimizer sub-group's gradients flattened and
      cast to fp32 (``_prepare_fp32_grad_for_sub_group``).
    """
    dp = len(spec.groups["dp"])
    fetches = fetch_trace(spec)
    numel = [n for sub in spec.submodules for n in sub.param_tensors]
    persistent = sum(n for n in numel if n <= spec.persistence_threshold)
    partition = sum(numel) / dp
    return {
        "ipg_bucket": spec.reduce_bucket_elems * spec.grad_bytes,  # model dtype = grad dtype
        "reduce_scatter_copy": _largest_bucket(spec) * spec.grad_bytes,
        "live_params": max((f.live_numel for f in fetches), default=0.0) * spec.param_bytes,
        "persistent_params": persistent * spec.param_bytes,
        "grad_partition": partition * grad_accum_bytes,
        "step_fp32_grad": min(partition, sub_group_elems) * (grad_accum_bytes + 4.0),
    }


def _largest_bucket(spec: Zero3Rank) -> float:
    """Elements of the largest gradient bucket of a backward (gradients in reverse order)."""
    largest, elems = 0.0, 0.0
    for sub in reversed(spec.submodules):
        for n in sub.param_tensors:
            if elems + n > spec.reduce_bucket_elems and elems > 0:
                largest, elems = max(largest, elems), 0.0
            elems += n
    return max(largest, elems)
