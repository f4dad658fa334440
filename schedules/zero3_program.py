"""DeepSpeed ZeRO stage 3 step programs: parameters gathered per submodule, as DeepSpeed runs it.

Modelled on DeepSpeed v0.16.4 (commit e2dc3eeb), checked against its source:

- Hooks (``partitioned_param_coordinator.py``, ``fetch_sub_module`` / ``release_sub_module``):
  which parameters each module's hooks gather, prefetch and free is ``schedules.zero3_fetch``;
  each gather is one all-gather on the dp group, and the module's compute waits for the
  all-gathers that carry its parameters.
- Persistence (``partition_parameters.py``, ``Init._convert_to_deepspeed_param``): a tensor with
  ``numel <= stage3_param_persistence_threshold`` is never fetched in the step. It is not
  gathered once at init only: the optimizer step partitions everything
  (``_partition_all_parameters``) and ``_post_step`` all-gathers the persistent tensors again,
  one ``all_gather_into_tensor`` per tensor, then synchronizes.
- Gradients (``stage3.py``, ``reduce_independent_p_g_buckets_and_remove_grads``): one hook per
  parameter; the bucket is reduce-scattered BEFORE adding a gradient that would overflow
  ``reduce_bucket_size`` (one ``reduce_scatter_coalesced`` call), and the rest at the end of
  every micro-batch's backward (``independent_gradient_partition_epilogue``, called by
  ``engine.allreduce_gradients`` for stage >= 2 at every micro-batch), which then synchronizes
  the host with the reduce stream. With ``overlap_comm`` (the stage-3 default, ``config.py``)
  the bucket is filled and reduced on ``reduce_and_partition_stream``, which waits for the
  compute stream at each gradient; the refill waits for the previous reduce on that stream, not
  the compute. The compute only waits through the host throttle (``max_param_reduce_events = 2``:
  before reducing bucket n the host synchronizes with bucket n - 3). Without ``overlap_comm``
  that stream is the compute stream (the compute waits for every reduce) and so is the
  all-gather stream (``parameter_offload.py``: the all-gathers wait for the compute before them).
- Step end (``stage3.py``, ``step`` / ``get_grad_norm_direct``): per optimizer sub-group a float64
  norm all-reduce on the dp group, then on the model-parallel group (``mpu``), then the optimizer.

Host time of the current release is not modelled. DeepSpeed has no compute-side limit on
all-gathers: the hooks run on the host, which runs ahead of the GPU, and the coordinator's
``__ongoing_fetch_events`` throttle only waits for all-gathers already ahead in the dp FIFO; so
by default an all-gather starts as soon as that FIFO allows, and the prefetch settings change
memory more than time.
``host_ahead=False`` models CPU-bound hooks instead (a hook runs when the compute before it ends).
``fetch="sync_per_weight"`` models DeepSpeed v0.3.13 (commit 12a53b43, the ZeRO-3 of Narayanan
et al. 2021's comparison): ``_allgather_param`` runs ``torch.cuda.synchronize()`` before each
weight's own all-gather, and ``fetch_sub_module`` synchronizes again before the module runs (its
prefetch is left out: ``schedules.zero3_fetch``). Its list-based collectives cost host time
per dp rank (``host_loop_s``, ``host_copy_s``, on the rank's host thread): before each weight's
all-gather a Python loop builds one view per rank (the GPU is idle: the host just synchronized),
and after it torch copies each rank's part out of the flat buffer, launched while the
all-gather runs. Its gradients are reduce-scattered one parameter at a time
(``_reduce_scatter_gradients`` over the bucket, each call again building one view per rank and
torch copying each into a flat buffer first); that host work starts when the host reaches the
gradient hooks, i.e. when the module's backward is launched, so it runs beside the backward.

    program = zero3_program(Zero3Rank(rank=0, num_microbatches=2, submodules=subs, groups=groups))
"""

from __future__ import annotations

from collections import Counter

from schedules.actions import Compute, Program, ProgramBuilder
from schedules.offload import add_copies
from schedules.zero3_fetch import Fetch, ParamCoordinator
from schedules.zero3_spec import Zero3Rank

NORM_BYTES = 8.0
"""The gradient-norm all-reduce: one float64 (``get_grad_norm_direct``)."""
MAX_PARAM_REDUCE_EVENTS = 2
"""``stage3.py``: more pending reduce events than this and the host waits for the oldest."""


class _Zero3:
    """Builds one rank's ZeRO-3 program (builder state: gathers, bucket, pending waits)."""

    def __init__(self, spec: Zero3Rank) -> None:
        self.spec = spec
        self.b = ProgramBuilder(rank=spec.rank, groups=dict(spec.groups))
        self.coordinator = ParamCoordinator(spec)
        self.carrier: dict[int, int | None] = {}
        self.waits: list[int] = []
        self.comm_gate: list[int] = []
        self.last_dp: list[int] = []
        self.bucket_elems = 0.0
        self.bucket_producer: int | None = None
        self.reduces: list[int | None] = []
        self.last_gather: int | None = None
        self.bucket_params: list[float] = []
        self.hook_deps: tuple[int, ...] = ()
        dp = len(spec.groups["dp"])
        self.per_weight = spec.fetch == "sync_per_weight" and dp > 1
        self.loop_s, self.copy_s = dp * spec.host_loop_s, dp * spec.host_copy_s

    def build(self) -> Program:
        for mb in range(self.spec.num_microbatches):
            self.micro_batch(mb)
        self.finish()
        return self.b.program()

    def micro_batch(self, mb: int) -> None:
        spec, coordinator = self.spec, self.coordinator
        flushed = coordinator.reset()
        self.waits += [i for p in flushed if (i := self.carrier.get(p)) is not None]
        for step in range(len(coordinator.trace)):
            fetch = coordinator.fetch(step)
            sub, tag = spec.submodules[fetch.module], f"{fetch.kind}{mb}"
            self.gather(fetch, tag)
            deps = [*self.waits, *(i for p in fetch.waits if (i := self.carrier[p]) is not None)]
            recipe = sub.backward if fetch.kind == "B" else sub.forward
            self.waits = self.b.run_steps(f"{tag} {sub.name}", recipe, tuple(sorted(set(deps))))
            if fetch.kind == "B":
                self.hook_deps = tuple(sorted(set(deps)))
                self.grads_ready(fetch.module, mb)
            coordinator.release(step)
        if self.bucket_elems > 0:
            self.reduce(mb)
        issued = [i for i in self.reduces if i is not None]
        self.waits += issued[-1:]
        self.comm_gate = list(self.b.after_compute(*issued[-1:]))
        self.reduces = []

    def dp_collective(self, name: str, op: str, size: float, deps: list[int]) -> int | None:
        """A collective on the dp FIFO, after any host sync not yet passed on."""
        index = self.b.collective(
            name, "dp", op, size, deps=tuple(sorted({*deps, *self.comm_gate}))
        )
        if index is not None:
            self.comm_gate, self.last_dp = [], [index]
        return index

    def gather_deps(self) -> list[int]:
        """When an all-gather may start: v0.3.x after a device sync; without overlap_comm (the
        compute stream is its stream) or a host ahead after the compute so far; else at once."""
        spec = self.spec
        if spec.fetch == "sync_per_weight":
            return list(self.b.after_compute(*self.waits, *self.last_dp))
        return [] if spec.overlap_comm and spec.host_ahead else list(self.b.after_compute())

    def gather(self, fetch: Fetch, tag: str) -> None:
        """The fetch's own all-gather(s), then its prefetch all-gather."""
        subs, owner = self.spec.submodules, self.coordinator.owner
        name = subs[fetch.module].name
        per_weight = self.spec.fetch == "sync_per_weight"
        for k, params in enumerate(fetch.own):
            label = f"AG {tag} {name}" + (f" w{k}" if per_weight else "")
            self.gather_one(label, params)
        if fetch.prefetch:
            owners = dict.fromkeys(subs[owner[p]].name for p in fetch.prefetch)
            self.gather_one(f"AG {tag} {name} prefetch {'+'.join(owners)}", fetch.prefetch)

    def host(self, label: str, seconds: float, deps: tuple[int, ...]) -> int | None:
        """Host-thread work (v0.3.x's per-rank loops); None when it takes no time."""
        if seconds <= 0:
            return None
        return self.b.add(
            Compute(name=label, duration_s=seconds, kind="host", stream="host", deps=deps)
        )

    def gather_one(self, label: str, params: tuple[int, ...]) -> None:
        size = sum(self.coordinator.numel[p] for p in params) * self.spec.param_bytes
        deps = self.gather_deps()
        views = (
            self.host(f"host {label} views", self.loop_s, tuple(deps)) if self.per_weight else None
        )
        deps = deps if views is None else [views]
        copied = None
        if self.spec.offload is not None:  # the partition from the host, on the gather stream
            behind = [] if self.last_gather is None else [self.last_gather]
            fetch = self.spec.offload.fetch(size)
            copied = add_copies(self.b, label, fetch, tuple(sorted({*deps, *behind})))
            deps = deps if copied is None else [copied]
        index = self.dp_collective(label, "all_gather", size, deps)
        index = copied if index is None else index
        self.last_gather = index if index is not None else self.last_gather
        for p in params:
            self.carrier[p] = index
        if self.per_weight and index is not None:
            out = self.host(f"host {label} copy-out", self.copy_s, tuple(deps))
            self.waits += [] if out is None else [out]

    def grads_ready(self, module: int, mb: int) -> None:
        """Per-parameter gradient hooks: reduce the bucket before it would overflow, then add."""
        for p in self.coordinator.params[module]:
            numel = self.coordinator.numel[p]
            if self.bucket_elems + numel > self.spec.reduce_bucket_elems and self.bucket_elems > 0:
                self.reduce(mb)
            self.bucket_elems += numel
            self.bucket_params.append(numel)
            self.bucket_producer = self.b.last_compute

    def reduce(self, mb: int) -> None:
        """Reduce-scatter the bucket (``__reduce_and_partition_ipg_grads``)."""
        spec, n = self.spec, len(self.reduces)
        if spec.overlap_comm:
            oldest = n - MAX_PARAM_REDUCE_EVENTS - 1
            if oldest >= 0 and (old := self.reduces[oldest]) is not None:
                self.waits.append(old)  # the host waits for bucket n - 3 before going on
            producer = self.bucket_producer
            deps = [] if producer is None else [producer]
        else:
            deps = list(self.b.after_compute())
        if self.per_weight and spec.offload is None:
            index = self.reduce_each(f"RS B{mb} bucket{n}", deps)
        else:
            index = self.reduce_bucket(mb, n, deps)
        self.reduces.append(index)
        if index is not None and not spec.overlap_comm:
            self.waits.append(index)
        self.bucket_elems, self.bucket_producer, self.bucket_params = 0.0, None, []

    def reduce_each(self, label: str, deps: list[int]) -> int | None:
        """v0.3.x: one reduce-scatter per parameter of the bucket, each after its host loops
        (which start at the hook, beside the backward); returns the last."""
        index = None
        for k, numel in enumerate(self.bucket_params):
            host = self.host(f"host {label} p{k}", self.loop_s + self.copy_s, self.hook_deps)
            after = deps if host is None else [*deps, host]
            size = numel * self.spec.grad_bytes
            index = self.dp_collective(f"{label} p{k}", "reduce_scatter", size, after)
        return index

    def reduce_bucket(self, mb: int, n: int, deps: list[int]) -> int | None:
        """One reduce-scatter of the whole bucket (``reduce_scatter_coalesced``), then its copy
        to the host under offload; returns what finishes it."""
        spec = self.spec
        size = self.bucket_elems * spec.grad_bytes
        if spec.offload is not None and self.reduces and self.reduces[-1] is not None:
            deps.append(self.reduces[-1])  # partition_grads ran on the same stream
        index = self.dp_collective(f"RS B{mb} bucket{n}", "reduce_scatter", size, deps)
        if spec.offload is not None:
            after = (index,) if index is not None else tuple(deps or self.b.after_compute())
            copied = add_copies(self.b, f"B{mb} bucket{n}", spec.offload.bucket(size, mb), after)
            index = index if copied is None else copied
        return index

    def finish(self) -> None:
        """Norm all-reduces, optimizer, then the persistent parameters' all-gathers."""
        spec, b = self.spec, self.b
        norms: list[int] = []
        for g in range(spec.num_norm_groups):
            for group in spec.grad_norm_groups:
                suffix = f" g{g}" if spec.num_norm_groups > 1 else ""
                index = b.collective(
                    f"AR grad norm {group}{suffix}",
                    group,
                    "all_reduce",
                    NORM_BYTES,
                    deps=b.after_compute(*self.waits, *norms[-1:]),
                    phase="optimizer",
                )
                norms += [] if index is None else [index]
        optimizer = b.add(
            Compute(
                name="optimizer",
                duration_s=spec.optimizer_s,
                kind="optimizer",
                deps=tuple(sorted({*self.waits, *norms})),
            )
        )
        if spec.offload is not None:
            step = spec.offload.step()
            copied = add_copies(b, "params", step, (optimizer,), phase="optimizer")
            if copied is not None:
                optimizer = b.add(
                    Compute(name="params copied", duration_s=0.0, kind="optimizer", deps=(copied,))
                )
        coordinator = self.coordinator
        counts = Counter(
            n for n, p in zip(coordinator.numel, coordinator.persistent, strict=True) if p
        )
        issued = [
            b.collective(
                f"AG persistent {count}x{numel:g}",
                "dp",
                "all_gather",
                numel * spec.param_bytes,
                repeat=count,
                deps=(optimizer,),
                phase="optimizer",
            )
            for numel, count in counts.items()
        ]
        ready = tuple(i for i in issued if i is not None)
        if ready:
            b.add(Compute(name="params gathered", duration_s=0.0, kind="optimizer", deps=ready))


def zero3_program(spec: Zero3Rank) -> Program:
    """One rank's ZeRO-3 step: per micro-batch the forward and backward module by module.

    Before each module: its own all-gather (if its parameters are neither gathered nor in
    flight), then the prefetch all-gather; the module's compute waits for the all-gathers that
    carry its parameters. After each backward: its gradients fill the bucket, reduce-scattered
    when the next would overflow it. After the last micro-batch: norm all-reduces, optimizer,
    persistent all-gathers. Collective names: ``AG F0 qkv``, ``AG B1 fc2 prefetch fc1+qkv``,
    ``RS B0 bucket2``, ``AR grad norm dp``, ``AG persistent 4x1024``.
    """
    return _Zero3(spec).build()
