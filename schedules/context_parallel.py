"""Context-parallel attention as torch's ``context_parallel`` runs it (torchtitan): the rounds of
the ring on one GPU, what each computes and what it exchanges, in issue order.

Source: torch ``torch/distributed/tensor/experimental/_attention.py`` (``_context_parallel/
_attention.py`` in later releases): ``_templated_ring_attention`` and its backward, the
rotaters ``_AllGatherRotater`` and ``_AllToAllRotater``, ``_SDPAMerger`` and
``_is_causal_behavior`` under the defaults ``enable_load_balance=True`` and
``convert_to_f32=True``. torchtitan (``create_context_parallel_ctx``, up to the January 2026
refactor) picks the rotater with ``[parallelism] context_parallel_rotate_method`` (default
``allgather``), and its Llama attention repeats K and V to every query head (``repeat_kv``)
before SDPA, so the ring carries K and V as wide as Q.

Per layer and micro-batch on one GPU, with E = b (s/cp) h/t elements in each of the local Q, K,
V and output and R = E/d rows of its fp32 log-sum-exp:

- Load balancing gives each rank two chunks of s/(2cp) tokens, one from the head and one from
  the tail. Round 0 attends the local queries to the local keys, causal (s/cp x s/cp). Each of
  the cp - 1 later rounds is one non-causal call on half a block: the local queries against
  the first chunk of the visiting K/V (rounds i <= rank), or the second half of the queries
  against all of it (i > rank), s/cp x s/(2cp) either way. That is the FLOPs of one causal
  s/cp x s call, in cp kernels that each fill the GPU less.
- Forward exchange: ``allgather`` gathers every rank's K and V once, issued before round 0 and
  waited at round 1 (it hides behind round 0 only); ``alltoall`` passes the visiting K/V on to
  the next rank at the start of every round but the last (``permute_tensor``: a ring shift), so
  the transfer for round i + 1 runs beside round i. Before each send K and V are concatenated
  into one buffer (every round but the last, whichever rotater).
- Merge: each round's output joins an fp32 running output through the log-sum-exps
  (``out - sigmoid(lse_i - lse) * (out - out_i)``, elementwise over E), cast back at the end.
- Backward: a fresh rotater exchanges K and V again as in the forward; each round's attention
  backward gives dQ, dK, dV, accumulated in fp32; the dK/dV accumulated so far travel one rank
  on after every round (always a ring shift, in fp32), each waited for after the next round's
  attention backward, the last one before the layer's backward goes on.
- Memory: the op saves what SDPA saves without CP (Q, K, V, output, log-sum-exp), so the
  activations per layer are unchanged; the ring's working set is transient
  (``ring_buffer_bytes``).
- Compiled (``compile``): torchtitan compiles each block with ``fullgraph=True``, so the ring is
  traced, and while tracing every functional collective is waited for where it is issued
  (``torch/distributed/_functional_collectives.py`` ``_maybe_wrap_tensor``: ``if
  _are_we_tracing(): return wait_tensor(self)``, torch 2.6); Inductor keeps that order
  (``torch/_inductor/config.py`` ``reorder_for_compute_comm_overlap = False``, which torchtitan
  does not set). Every exchange of a compiled ring therefore runs on the critical path
  (``COMPILE_WAITS_AT_ISSUE``). With ``allgather`` the K/V concatenations of the later rounds
  feed a rotater that no longer reads them (``_AllGatherRotater.exchange_buffers`` gathers only
  once), so the compiled graph drops them; eager runs them.

The kernels listed are those of the last CP rank: all its later rounds take the first half of
the visiting K/V and merge whole outputs, the most merge traffic of any rank (every rank runs
the same attention FLOPs). Megatron's CP (Transformer Engine's ``AttnFuncWithCPAndKVP2P``) runs
the same rounds on two alternating streams with fused corrections; it keeps the one fused
attention call and one exchange per pass of ``schedules.kernels`` (``runs_torch_ring``).

    ring = ring_attention(plan, stack="eager"); [step.name for step in ring.forward]
"""

from __future__ import annotations

from dataclasses import dataclass

from schedules.messages import cp_grad_message_bytes, cp_kv_message_bytes
from schedules.plan import Plan
from schedules.stacks import kernel_stack

DEFAULT_ROTATE_METHOD = "allgather"
"""torchtitan's ``context_parallel_rotate_method`` default (torch's own: ``ALL_GATHER``)."""
COMPILE_WAITS_AT_ISSUE = True
"""Whether a compiled ring waits for each exchange where it is issued: torch's functional
collectives wait at once while traced (``_maybe_wrap_tensor``), and Inductor does not move the
waits by default (``reorder_for_compute_comm_overlap = False``)."""
FORWARD_PASS_BYTES: dict[str, dict[str, float]] = {
    "eager": {"kv_contiguous": 8, "kv_cat": 8, "first_cast": 6, "merge": 38, "final_cast": 6},
    "compile": {"kv_contiguous": 0, "kv_cat": 8, "first_cast": 0, "merge": 10, "final_cast": 6},
}
"""Bytes per element of E that each memory-bound pass of the forward ring moves.

``eager``, op by op from the source: ``key.contiguous()`` and ``value.contiguous()`` copy the
transposed K and V (2 x (2 + 2)); ``torch.cat`` of K and V into the send buffer (2 x (2 + 2));
round 0's output cast to fp32 (2 + 4); each later merge casts the round's output (2 + 4), then
``out - out_i`` (4 + 4 + 4), ``sigmoid(...) * (...)`` (4 + 4) and ``out - ...`` (4 + 4 + 4) = 38;
the final cast to bf16 (4 + 2). ``compile``: the ring is traced through DTensor's dispatch and
Inductor fuses each merge into one kernel (read the fp32 output and the round's bf16 output,
write the fp32 output: 4 + 2 + 4), the first cast into the first merge and the copies into the
buffer they feed."""
MERGE_ROW_BYTES = {"eager": 52.0, "compile": 12.0}
"""Bytes per row (R) of a merge's log-sum-exp arithmetic, fp32: eager ``lse_i - lse``,
``sigmoid``, ``lse - lse_i``, ``logsigmoid``, ``lse - ...`` (12 + 8 + 12 + 8 + 12); compile one
kernel (read 2 rows, write 1)."""
BACKWARD_PASS_BYTES: dict[str, dict[str, float]] = {
    "eager": {
        "grad_zeros": 12,
        "kv_contiguous": 8,
        "kv_cat": 8,
        "first_accumulate": 46,
        "accumulate": 52,
        "final_cast": 18,
    },
    "compile": {
        "grad_zeros": 0,
        "kv_contiguous": 0,
        "kv_cat": 8,
        "first_accumulate": 18,
        "accumulate": 28,
        "final_cast": 18,
    },
}
"""Bytes per element of E of each memory-bound pass of the backward ring.

``eager``, from the source: fp32 ``zeros_like`` dQ, dK, dV (3 x 4); the K/V copies and
concatenations as in the forward; round 0 adds its bf16 dK and dV into the fp32 sums (2 x
(4 + 2 + 4)), concatenates them into the fp32 send buffer (2 x (4 + 4)) and adds dQ (10) = 46;
each later round adds its half-length dK and dV into the received sums and rebuilds them with
``torch.cat`` (2 x (5 + 8)), concatenates them (16) and adds dQ (10) = 52; the end casts dQ
(4 + 2) and the received fp32 dK/dV (2 x (4 + 2)) to bf16 = 18. ``compile``: a round's dK/dV
sums go straight into the send buffer (round 0: read 2 x 2, write 2 x 4, plus dQ 2 + 4 = 18;
later rounds: read 2 x 4 + 2 x 1, write 2 x 4, plus dQ 10 = 28)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionCall:
    """One SDPA kernel of a round: ``seq_q`` local queries against ``seq_kv`` visiting keys."""

    seq_q: float
    """Query tokens."""
    seq_kv: float
    """Key/value tokens."""
    causal: bool
    """Causal mask (round 0 only)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RingWork:
    """Kernels the compute stream runs between two points where the ring issues or waits."""

    name: str
    """Label, e.g. ``ring 2``."""
    attention: tuple[AttentionCall, ...] = ()
    """SDPA calls (forward, or backward in ``RingAttention.backward``)."""
    passes: tuple[tuple[str, float], ...] = ()
    """Memory-bound passes: (name, bytes read plus written)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RingExchange:
    """A K/V (or dK/dV) exchange over the CP group, issued after the work before it."""

    name: str
    """Label, e.g. ``kv all_gather``."""
    op: str
    """``all_gather`` (size: the output) or ``send_recv`` (every rank sends ``size_bytes`` to
    the next: a ring shift)."""
    size_bytes: float
    """Message size (nccl-tests semantics)."""
    overlap: bool = True
    """True: runs beside the next work, which the work after it waits for; False: the next work
    waits for it."""


RingStep = RingWork | RingExchange
"""One element of a ring pass."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RingAttention:
    """The ring attention of one layer and micro-batch on one GPU."""

    forward: tuple[RingStep, ...]
    """Forward (also what a recompute of the attention core reruns)."""
    backward: tuple[RingStep, ...]
    """Backward."""


def runs_torch_ring(plan: Plan, stack: str) -> bool:
    """Whether the plan's CP is torch's ring (cp > 1 on the eager or compile stack)."""
    return plan.parallel.cp > 1 and stack != "megatron"


def rotate_method(plan: Plan) -> str:
    """``parallel.cp_rotate_method``, or torchtitan's default."""
    return plan.parallel.cp_rotate_method or DEFAULT_ROTATE_METHOD


def check_context_parallel(plan: Plan) -> None:
    """A rotate method needs torch's ring; torch's ring needs a fused SDPA kernel; no ring over
    a sliding window."""
    parallel = plan.parallel
    stack = kernel_stack(plan)
    window = plan.model.attention_window
    if parallel.cp > 1 and 0 < window < plan.model.seq_len:
        raise ValueError(
            f"model.attention_window={window} with parallel.cp={parallel.cp}: context "
            "parallelism over a sliding window (rounds outside the window skipped) is not "
            "modelled; model.attention_window: 0 prices full causal attention"
        )
    method = parallel.cp_rotate_method
    if method is not None and (parallel.cp == 1 or stack == "megatron"):
        raise ValueError(
            f"parallel.cp_rotate_method={method} applies to torch's context_parallel (cp > 1 "
            f"on stack eager or compile; Transformer Engine's ring always sends K/V to the next "
            f"rank), got cp={parallel.cp}, stack={stack}"
        )
    grouped = plan.model.num_kv_heads < plan.model.num_heads
    if runs_torch_ring(plan, stack) and grouped and not plan.training.repeat_kv:
        raise ValueError(
            f"training.repeat_kv=false with cp={parallel.cp}: torch's context-parallel ring is "
            "priced as torchtitan runs it, K and V repeated to every query head before SDPA"
        )
    if runs_torch_ring(plan, stack) and not plan.training.flash_attention:
        raise ValueError(
            f"training.flash_attention=false with cp={parallel.cp}: torch's context_parallel "
            f"runs only the fused SDPA kernels (flash, memory-efficient, cuDNN)"
        )


def _sizes(plan: Plan) -> tuple[float, float, float, float]:
    """(E, R, local K/V bytes, dK/dV bytes) of one GPU."""
    model, parallel = plan.model, plan.parallel
    b, t, cp = plan.training.micro_batch_size, parallel.tp, parallel.cp
    rows = b * model.seq_len / cp * model.num_heads / t
    kv = cp_kv_message_bytes(model, b, tp=t, cp=cp, repeat_kv=True)
    return rows * model.head_dim, rows, kv, cp_grad_message_bytes(model, b, tp=t, cp=cp)


def _passes(*named: tuple[str, float]) -> tuple[tuple[str, float], ...]:
    return tuple((name, size) for name, size in named if size > 0)


def _overlaps(stack: str) -> bool:
    """Whether the ring's exchanges run beside its rounds: eager waits where the result is
    used; a compiled ring waits where it issues (``COMPILE_WAITS_AT_ISSUE``)."""
    return not (stack == "compile" and COMPILE_WAITS_AT_ISSUE)


def _later_cats(plan: Plan, stack: str) -> bool:
    """Whether the rounds after the first concatenate K and V: always with ``alltoall`` (the
    buffer is sent); with ``allgather`` only in eager (compiled, nothing reads them)."""
    return rotate_method(plan) == "alltoall" or stack != "compile"


def _kv_exchange(plan: Plan, kv_bytes: float, overlap: bool) -> RingExchange:
    """The first K/V exchange: the all-gather, or the send for round 1."""
    if rotate_method(plan) == "allgather":
        size = plan.parallel.cp * kv_bytes
        return RingExchange(name="kv all_gather", op="all_gather", size_bytes=size, overlap=overlap)
    return RingExchange(name="kv send_recv 1", op="send_recv", size_bytes=kv_bytes, overlap=overlap)


def _forward(plan: Plan, stack: str) -> tuple[RingStep, ...]:
    cp, per = plan.parallel.cp, FORWARD_PASS_BYTES[stack]
    e, r, kv, _ = _sizes(plan)
    s = plan.model.seq_len / cp
    gather = rotate_method(plan) == "allgather"
    overlap = _overlaps(stack)
    cat = ("kv_cat", per["kv_cat"] * e)
    later_cat = _later_cats(plan, stack)
    merge = ("merge", per["merge"] * e + MERGE_ROW_BYTES[stack] * r)
    steps: list[RingStep] = [
        RingWork(name="ring kv", passes=_passes(("kv_contiguous", per["kv_contiguous"] * e), cat)),
        _kv_exchange(plan, kv, overlap),
        RingWork(
            name="ring 0",
            attention=(AttentionCall(seq_q=s, seq_kv=s, causal=True),),
            passes=_passes(("first_cast", per["first_cast"] * e)),
        ),
    ]
    for i in range(1, cp):
        last = i == cp - 1
        if not gather and not last:
            steps.append(RingWork(name=f"ring {i} kv", passes=_passes(cat)))
            steps.append(
                RingExchange(
                    name=f"kv send_recv {i + 1}", op="send_recv", size_bytes=kv, overlap=overlap
                )
            )
        tail = (("final_cast", per["final_cast"] * e),) if last else ()
        steps.append(
            RingWork(
                name=f"ring {i}",
                attention=(AttentionCall(seq_q=s, seq_kv=s / 2, causal=False),),
                passes=_passes(
                    *((cat,) if gather and later_cat and not last else ()), merge, *tail
                ),
            )
        )
    return tuple(steps)


def _backward(plan: Plan, stack: str) -> tuple[RingStep, ...]:
    """The backward rounds. With ``alltoall`` the send for round i + 1 is issued with round i's
    dK/dV send (one compute step earlier than the source, after the K/V concatenation) and
    waited for before round i's accumulation instead of round i + 1's attention: the pass
    recipe's one-step overlap window, a round's memory pass off its hiding time."""
    cp, per = plan.parallel.cp, BACKWARD_PASS_BYTES[stack]
    e, _, kv, dkv = _sizes(plan)
    s = plan.model.seq_len / cp
    overlap = _overlaps(stack)
    cat = ("kv_cat", per["kv_cat"] * e)
    later = _passes(cat) if _later_cats(plan, stack) else ()
    steps: list[RingStep] = [
        RingWork(
            name="ring bwd kv",
            passes=_passes(
                ("grad_zeros", per["grad_zeros"] * e),
                ("kv_contiguous", per["kv_contiguous"] * e),
                cat,
            ),
        ),
        _kv_exchange(plan, kv, overlap),
        RingWork(
            name="ring bwd 0",
            attention=(AttentionCall(seq_q=s, seq_kv=s, causal=True),),
            passes=_passes(("first_accumulate", per["first_accumulate"] * e)),
        ),
        RingExchange(name="dkv send_recv 0", op="send_recv", size_bytes=dkv, overlap=overlap),
    ]
    for i in range(1, cp):
        last = i == cp - 1
        if rotate_method(plan) == "alltoall" and not last:
            steps.append(
                RingExchange(
                    name=f"kv send_recv {i + 1}", op="send_recv", size_bytes=kv, overlap=overlap
                )
            )
        steps += [
            RingWork(
                name=f"ring bwd {i}",
                attention=(AttentionCall(seq_q=s, seq_kv=s / 2, causal=False),),
                passes=() if last else later,
            ),
            RingWork(
                name=f"ring bwd {i} accumulate",
                passes=_passes(("accumulate", per["accumulate"] * e)),
            ),
            RingExchange(
                name=f"dkv send_recv {i}",
                op="send_recv",
                size_bytes=dkv,
                overlap=overlap and not last,
            ),
        ]
    steps.append(
        RingWork(name="ring bwd out", passes=_passes(("final_cast", per["final_cast"] * e)))
    )
    return tuple(steps)


def ring_attention(plan: Plan, stack: str) -> RingAttention:
    """torch's ring attention of one layer and micro-batch on one GPU (cp > 1, eager or compile)."""
    if not runs_torch_ring(plan, stack):
        raise ValueError(f"no torch ring attention with cp={plan.parallel.cp}, stack={stack}")
    return RingAttention(forward=_forward(plan, stack), backward=_backward(plan, stack))


def ring_buffer_bytes(plan: Plan, stack: str) -> float:
    """Transient bytes of the ring at its peak, a layer's backward: the visiting K/V (every
    rank's after ``allgather``, this and the next block with ``alltoall``), the fp32 dQ, dK, dV
    sums, the fp32 dK/dV received and the one being sent, and a round's bf16 dQ, dK, dV
    (0 where torch's ring does not run)."""
    if not runs_torch_ring(plan, stack):
        return 0.0
    e, _, kv, dkv = _sizes(plan)
    visiting = plan.parallel.cp * kv if rotate_method(plan) == "allgather" else 2 * kv
    return visiting + 3 * 4 * e + 2 * dkv + 3 * 2 * e
