"""DeepSpeed ZeRO stage 3 step programs: parameters gathered per submodule, as DeepSpeed runs it.

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

Host time is not modelled. DeepSpeed has no compute-side limit on all-gathers: the hooks run on
the host, which runs ahead of the GPU, and the coordinator's ``__ongoing_fetch_events`` throttle
only waits for all-gathers already ahead in the dp FIFO; so by default an all-gather starts as
soon as that FIFO allows, and the prefetch settings change memory more than time.
``host_ahead=False`` models CPU-bound hooks instead (a hook runs when the compute before it ends).
``fetch="sync_per_weight"`` models DeepSpeed v0.3.13 (commit 12a53b43, the ZeRO-3 of Narayanan
et al. 2021's comparison): ``_allgather_param`` runs ``torch.cuda.synchronize()`` before each
weight's own all-gather, and ``fetch_sub_module`` synchronizes again before the module runs. Its
trace-based prefetch (from the second step on) is left out: each prefetched weight also starts
after a device sync, so only the last one could overlap the module's compute. Its gradient path
is modelled as the current one.

    program = zero3_program(Zero3Rank(rank=0, num_microbatches=2, submodules=subs, groups=groups))
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass

from schedules.program import Compute, ComputeStep, Program, ProgramBuilder, Step

FETCH_MODES = ("prefetch", "sync_per_weight")
"""Parameter fetch behaviours: current DeepSpeed, or v0.3.x's synchronous per-weight gathers."""
NORM_BYTES = 8.0
"""The gradient-norm all-reduce: one float64 (``get_grad_norm_direct``)."""
MAX_PARAM_REDUCE_EVENTS = 2
"""``stage3.py``: more pending reduce events than this and the host waits for the oldest."""
_NONE, _FLIGHT, _READY = 0, 1, 2
"""Parameter states: ``NOT_AVAILABLE``, ``INFLIGHT``, ``AVAILABLE`` (ZeroParamStatus)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Submodule:
    """One module in forward order; with direct parameters it is fetched, without it only
    triggers a prefetch (containers, activations: DeepSpeed hooks every module)."""

    name: str
    """Label, e.g. ``L3.qkv``."""
    num_params: float
    """Direct parameter elements on this GPU (after tensor parallelism, before ZeRO sharding)."""
    forward: tuple[Step, ...]
    """Its forward work (``ComputeStep`` / ``CommStep``)."""
    backward: tuple[Step, ...]
    """Its backward work; its gradients are ready when it ends."""
    tensors: tuple[float, ...] = ()
    """Elements of each parameter tensor (weight, bias) in registration order; empty means one
    tensor of ``num_params``. Persistence and v0.3.x's per-weight gathers are per tensor."""

    def __post_init__(self) -> None:
        if self.num_params < 0:
            raise ValueError(
                f"submodule {self.name}: num_params must be >= 0, got {self.num_params}"
            )
        if any(t <= 0 for t in self.tensors):
            raise ValueError(f"submodule {self.name}: tensor sizes must be > 0, got {self.tensors}")
        total = sum(self.tensors)
        if self.tensors and abs(total - self.num_params) > 1e-9 * max(total, 1.0):
            raise ValueError(
                f"submodule {self.name}: tensors sum to {total}, num_params is {self.num_params}"
            )

    @property
    def param_tensors(self) -> tuple[float, ...]:
        """Its tensors' element counts (none for a module without direct parameters)."""
        return self.tensors or ((self.num_params,) if self.num_params > 0 else ())


@dataclass(frozen=True, slots=True, kw_only=True)
class Zero3Rank:
    """Everything one rank's ZeRO-3 step program depends on (DeepSpeed's config defaults)."""

    rank: int
    """Global rank."""
    num_microbatches: int
    """Gradient-accumulation micro-batches (each a forward and a backward)."""
    submodules: tuple[Submodule, ...]
    """The whole model in forward order: embedding, each layer's modules, final norm, head."""
    groups: dict[str, tuple[int, ...]]
    """Ranks by group name: ``dp`` (ZeRO's partition group), ``tp``/``cp`` for the recipes, and
    the grad-norm groups."""
    param_bytes: float = 2.0
    """Bytes per parameter element gathered (bf16)."""
    grad_bytes: float = 2.0
    """Bytes per gradient element reduce-scattered (``communication_data_type``: the model's)."""
    prefetch_bucket_elems: int = 50_000_000
    """``stage3_prefetch_bucket_size``: numel one prefetch walk may gather (0: no prefetch)."""
    max_live_parameters: int = 1_000_000_000
    """``stage3_max_live_parameters``: prefetch stops while this many elements are gathered."""
    max_reuse_distance: int = 1_000_000_000
    """``stage3_max_reuse_distance``: a module used again within this many elements of trace
    keeps its parameters."""
    persistence_threshold: int = 100_000
    """``stage3_param_persistence_threshold``: tensors this small stay gathered."""
    reduce_bucket_elems: int = 500_000_000
    """``reduce_bucket_size``: gradient elements per reduce-scatter bucket."""
    overlap_comm: bool = True
    """Reduce (and all-gather) on side streams (stage-3 default) or on the compute stream."""
    fetch: str = "prefetch"
    """``prefetch`` (current DeepSpeed) or ``sync_per_weight`` (v0.3.x)."""
    host_ahead: bool = True
    """True: the host runs ahead of the GPU, so an all-gather starts once the dp FIFO lets it
    (DeepSpeed's only limiter waits for earlier all-gathers). False: the host reaches each hook
    only when the compute before it has ended (CPU-bound hooks), so all-gathers wait for it."""
    grad_norm_groups: tuple[str, ...] = ()
    """Groups of the step-end norm all-reduces, in order; DeepSpeed: ``("dp", "mp")`` (dp, then
    the model-parallel group when an ``mpu`` is given). Empty: none."""
    num_norm_groups: int = 1
    """Optimizer sub-groups (param groups split at ``sub_group_size``); each all-reduces."""
    recompute_blocks: tuple[tuple[int, int], ...] = ()
    """Activation checkpointing: ``(start, stop)`` ranges of submodules whose forward runs again
    in the backward, hooks and all, right before their backward (their ``backward`` recipes then
    leave the recompute out)."""
    optimizer_s: float = 0.0
    """Optimizer step on the local partition."""

    def __post_init__(self) -> None:
        stops = [0, *(b for block in self.recompute_blocks for b in block)]
        if (
            stops != sorted(stops)
            or stops[-1] > len(self.submodules)
            or any(a >= b for a, b in self.recompute_blocks)
        ):
            raise ValueError(
                f"recompute_blocks {self.recompute_blocks} must be disjoint, ordered, non-empty "
                f"ranges of the {len(self.submodules)} submodules"
            )
        if self.num_microbatches < 1 or self.num_norm_groups < 1:
            raise ValueError(
                f"rank {self.rank}: num_microbatches={self.num_microbatches} and "
                f"num_norm_groups={self.num_norm_groups} must be >= 1"
            )
        if self.fetch not in FETCH_MODES:
            raise ValueError(f"fetch must be one of {FETCH_MODES}, got {self.fetch!r}")
        limits = ("prefetch_bucket_elems", "max_live_parameters", "max_reuse_distance")
        for name in (*limits, "persistence_threshold", "reduce_bucket_elems"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.param_bytes <= 0 or self.grad_bytes <= 0:
            raise ValueError(f"param_bytes={self.param_bytes}, grad_bytes={self.grad_bytes}: > 0")
        missing = [g for g in ("dp", *self.grad_norm_groups) if g not in self.groups]
        if missing:
            raise ValueError(
                f"rank {self.rank}: groups {missing} missing from {sorted(self.groups)}"
            )


def layer_submodules(
    *,
    hidden: int,
    ffn: int,
    kv_size: int,
    gated: bool,
    bias: bool,
    norm_params: int,
    tp: int = 1,
    fused: bool = False,
) -> list[tuple[str, tuple[float, ...]]]:
    """A transformer layer's modules with direct parameters and their tensors on one TP rank.

    ``fused``: Megatron's names and fused QKV / gate-up (``input_norm, qkv, dense,
    post_attn_norm, fc1, fc2``); otherwise Hugging Face Llama's (``q_proj`` ... ``down_proj``).
    Column-parallel weights and biases are split ``tp`` ways; row-parallel weights too, their
    biases and the norms are replicated: the sizes sum to ``schedules.params.layer_params_per_gpu``.

    >>> layer_submodules(hidden=4, ffn=8, kv_size=2, gated=True, bias=False, norm_params=4)[1]
    ('q_proj', (16.0,))
    """
    h, f = hidden, ffn

    def linear(rows: int, cols: int, column_parallel: bool) -> tuple[float, ...]:
        weight = rows * cols / tp
        if not bias:
            return (weight,)
        return (weight, cols / tp if column_parallel else float(cols))

    norm = (float(h), float(norm_params - h)) if norm_params > h else (float(norm_params),)
    num_in = 2 if gated else 1
    if fused:
        attention = [("qkv", linear(h, h + 2 * kv_size, True)), ("dense", linear(h, h, False))]
        mlp = [("fc1", linear(h, num_in * f, True)), ("fc2", linear(f, h, False))]
    else:
        attention = [
            ("q_proj", linear(h, h, True)),
            ("k_proj", linear(h, kv_size, True)),
            ("v_proj", linear(h, kv_size, True)),
            ("o_proj", linear(h, h, False)),
        ]
        mlp = [("gate_proj", linear(h, f, True))] if gated else []
        mlp += [("up_proj", linear(h, f, True)), ("down_proj", linear(f, h, False))]
    return [("input_norm", norm), *attention, ("post_attn_norm", norm), *mlp]


def split_recipe(steps: tuple[Step, ...], fractions: tuple[float, ...]) -> list[tuple[Step, ...]]:
    """Cut a pass recipe into consecutive parts holding ``fractions`` of its compute time.

    A ``ComputeStep`` straddling a cut is split in two (same name); ``CommStep`` and ``MarkStep``
    stay where they are, in the part whose compute they follow (the first part before any
    compute). A recipe without compute time goes whole into the first part.

    >>> split_recipe((ComputeStep(name="fwd", duration_s=4.0),), (0.25, 0.75))
    [(ComputeStep(name='fwd', duration_s=1.0),), (ComputeStep(name='fwd', duration_s=3.0),)]
    """
    if not fractions or any(x < 0 for x in fractions) or abs(sum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"fractions must be >= 0 and sum to 1, got {fractions}")
    total = sum(s.duration_s for s in steps if isinstance(s, ComputeStep))
    parts: list[list[Step]] = [[] for _ in fractions]
    cuts = [total * sum(fractions[: i + 1]) for i in range(len(fractions))]
    part, elapsed = 0, 0.0
    for step in steps:
        if not isinstance(step, ComputeStep) or total <= 0:
            parts[part].append(step)
            continue
        left = step.duration_s
        while part < len(parts) - 1 and elapsed + left > cuts[part] * (1 + 1e-12):
            piece = cuts[part] - elapsed
            if piece > 0:
                parts[part].append(ComputeStep(name=step.name, duration_s=piece))
                left, elapsed = left - piece, cuts[part]
            part += 1
        parts[part].append(ComputeStep(name=step.name, duration_s=left))
        elapsed += left
    return [tuple(p) for p in parts]


def module_trace(spec: Zero3Rank) -> tuple[tuple[int, str], ...]:
    """The hooks of one micro-batch as (submodule, ``F``/``R``/``B``): the forward in order, then
    the backward in reverse, a recompute block's forward replayed before its backward.

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


class _Coordinator:
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


class _Zero3:
    """Builds one rank's ZeRO-3 program (builder state: gathers, bucket, pending waits)."""

    def __init__(self, spec: Zero3Rank) -> None:
        self.spec = spec
        self.b = ProgramBuilder(rank=spec.rank, groups=dict(spec.groups))
        self.coordinator = _Coordinator(spec)
        self.carrier: dict[int, int | None] = {}
        self.waits: list[int] = []
        self.comm_gate: list[int] = []
        self.last_dp: list[int] = []
        self.bucket_elems = 0.0
        self.bucket_producer: int | None = None
        self.reduces: list[int | None] = []

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

    def gather_one(self, label: str, params: tuple[int, ...]) -> None:
        size = sum(self.coordinator.numel[p] for p in params) * self.spec.param_bytes
        index = self.dp_collective(label, "all_gather", size, self.gather_deps())
        for p in params:
            self.carrier[p] = index

    def grads_ready(self, module: int, mb: int) -> None:
        """Per-parameter gradient hooks: reduce the bucket before it would overflow, then add."""
        for p in self.coordinator.params[module]:
            numel = self.coordinator.numel[p]
            if self.bucket_elems + numel > self.spec.reduce_bucket_elems and self.bucket_elems > 0:
                self.reduce(mb)
            self.bucket_elems += numel
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
        size = self.bucket_elems * spec.grad_bytes
        index = self.dp_collective(f"RS B{mb} bucket{n}", "reduce_scatter", size, deps)
        self.reduces.append(index)
        if index is not None and not spec.overlap_comm:
            self.waits.append(index)
        self.bucket_elems, self.bucket_producer = 0.0, None

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


def fetch_trace(spec: Zero3Rank) -> list[Fetch]:
    """The coordinator's decisions at every module hook of every micro-batch, in order."""
    coordinator = _Coordinator(spec)
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
