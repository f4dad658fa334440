"""Per-pass recipes of tensor/sequence parallelism: a layer's forward and backward as compute
steps and TP collectives, placed as each stack runs them (Megatron with and without Transformer
Engine's userbuffers, PyTorch's DTensor, PyTorch's asynchronous TP); ``ProgramBuilder.run_steps``
(``schedules.actions``) turns them into actions.

    steps = tp_forward_steps(forward_s=1e-3, num_layers=4, tp_bytes=8e6, sequence_parallel=True)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from schedules.actions import CommStep, ComputeStep, HostStep, MarkStep, Step


@dataclass(frozen=True, slots=True, kw_only=True)
class LinearShares:
    """Fractions of a layer's weight-gradient time spent in the column-parallel GEMMs."""

    qkv: float = 0.0
    """QKV projection share of the wgrad (also its dgrad share: same FLOPs)."""
    fc1: float = 0.0
    """MLP input projection(s) share of the wgrad."""
    k: float = 0.0
    """Time share of the wgrad of a separate K projection (torchtitan's wk, timed as its own
    GEMM: the one torchtitan's per-op recompute reruns on the gathered input)."""
    proj: float = 0.0
    """Attention output projection share of the wgrad (also its dgrad share)."""
    fc2: float = 0.0
    """MLP output projection share of the wgrad (also its dgrad share)."""
    forward: tuple[float, ...] = ()
    """Shares of the layer's forward time of its QKV, projection, MLP input and MLP output
    GEMMs (``schedules.kernels.WEIGHT_GEMMS`` order): the windows the overlapped TP
    collectives of ``tp_forward_steps`` run in; empty: unknown."""


def branch_shares(shares: LinearShares, *, parallel_block: bool) -> LinearShares:
    """``shares`` as the layer's TP collectives see them: in a ``parallel_block`` the one input
    all-gather feeds the QKV and MLP-input GEMMs and the one reduce-scatter follows the
    projection and MLP-output GEMMs, so each window is a pair's, in the first pair's slots."""
    if not parallel_block:
        return shares
    f = shares.forward
    forward = (f[0] + f[2], f[1] + f[3], 0.0, 0.0) if f else ()
    return LinearShares(qkv=shares.qkv + shares.fc1, proj=shares.proj + shares.fc2, forward=forward)


def _drop_empty(steps: list[Step]) -> tuple[Step, ...]:
    """Steps without zero-repeat collectives or zero-length compute."""
    return tuple(
        s
        for s in steps
        if (isinstance(s, CommStep) and s.repeat > 0)
        or (isinstance(s, ComputeStep) and s.duration_s > 0)
        or isinstance(s, (MarkStep, HostStep))
    )


def tp_forward_steps(
    *,
    forward_s: float,
    num_layers: int,
    tp_bytes: float,
    tp: int = 2,
    sequence_parallel: bool = False,
    tp_comm_overlap: bool = False,
    extra: tuple[Step, ...] = (),
    per_layer: int = 2,
    gather_bytes: float | None = None,
    shares: LinearShares | None = None,
    tail: bool = True,
    pipeline_chunks: int = 1,
    userbuffers: bool = False,
    blocking_gathers: bool = False,
) -> tuple[Step, ...]:
    """Forward of ``num_layers`` layers (each ``forward_s``) with their TP collectives.

    Without SP: 2 all-reduces per layer; with SP: 2 all-gathers + 2 reduce-scatters, all on the
    critical path (Megatron), or hidden behind the GEMMs under ``tp_comm_overlap``. With SP and
    the forward GEMMs' ``shares`` each collective overlaps only the GEMM it is fused with: the
    input all-gathers the QKV and MLP-input GEMMs that consume them, the reduce-scatters the
    projection and MLP-output GEMMs that produce them (Transformer Engine's userbuffers
    all-gather + GEMM and GEMM + reduce-scatter, torch's ``fused_all_gather_matmul`` and
    ``fused_matmul_reduce_scatter``), so a pair takes the longer of the two and the rest of the
    layer runs alone; without ``shares`` the collectives run beside the whole layer compute.
    ``per_layer`` is 1 for MoE layers without shared experts (their MLP leaves TP for the
    expert-parallel dispatcher: only the attention block's pair remains). ``gather_bytes``: the
    all-gathers' size where it differs from ``tp_bytes`` (float8 operands). Without ``tail`` the
    MLP output's reduce-scatter (or all-reduce) and its fused GEMM are left out: PyTorch's full
    recompute does not rerun them (``schedules.kernels.full_recompute_kernels``).
    ``pipeline_chunks``: the pieces each fused GEMM is decomposed into (``_pipelined_pair``).
    ``userbuffers``: Transformer Engine's (Megatron's ``tp_comm_overlap``): the gathers are ring
    exchanges on the copy engines in ``pipeline_chunks`` pieces, the scatters follow the GEMM in
    ``TE_PIPELINE_SPLITS`` pieces (``_te_pipelined_scatter``); ``blocking_gathers``: the
    gathers block instead (TE turns their userbuffers off when autograd is off: the first forward
    of a fully recomputed layer).
    """
    gathered = tp_bytes if gather_bytes is None else gather_bytes
    last = 0 if tail or per_layer < 2 else 1  # collectives left out per layer
    if tp > 1 and tp_comm_overlap and sequence_parallel and shares and shares.forward:
        return _fused_forward_steps(
            forward_s=forward_s,
            num_layers=num_layers,
            sizes={"all_gather": gathered, "reduce_scatter": tp_bytes},
            shares=shares.forward,
            pairs=2 * per_layer - last,
            extra=extra,
            chunks=pipeline_chunks,
            userbuffers=userbuffers,
            blocking_gathers=blocking_gathers,
        )
    steps: list[Step] = []
    if tp > 1:
        ops = ("all_gather", "reduce_scatter") if sequence_parallel else ("all_reduce",)
        per_op = per_layer * num_layers
        steps = [
            CommStep(
                name=op,
                group="tp",
                op=op,
                size_bytes=gathered if op == "all_gather" else tp_bytes,
                repeat=per_op if op == "all_gather" else per_op - last * num_layers,
                overlap=tp_comm_overlap and not (blocking_gathers and op == "all_gather"),
            )
            for op in ops
        ]
    compute = ComputeStep(name="fwd", duration_s=forward_s * num_layers)
    ordered = [*steps, compute] if tp_comm_overlap else [compute, *steps]
    return _drop_empty([*ordered, *extra])


TE_GRAD_GATHER_BESIDE_DGRAD = ("proj_dgrad", "fc2_dgrad")
"""The userbuffers Transformer Engine runs as ``ring_exchange`` in the backward: the output
gradient of the attention projection and of the MLP output (row-parallel, sequence-parallel
linears) is all-gathered in pieces beside their dgrad GEMM (``initialize_ub``'s default
``methods`` in ``transformer_engine/pytorch/module/base.py``, unchanged from TE 1.5 to 2.x;
``Linear``'s backward runs ``SPLIT_PIPELINED_AG_P2P`` on ``ub_name + "_dgrad"`` when
``ub_overlap_ag``), which Megatron-Core's ``TELinear`` sets from ``tp_comm_overlap_ag`` (default
True) whenever ``tp_comm_overlap`` is on; expert linears get no userbuffers (a shared
expert's do)."""

TE_GATHERS_BLOCK_WITHOUT_GRAD = True
"""Transformer Engine's ``LayerNormLinear`` (the QKV and MLP-input linears) turns its userbuffers
all-gather off when autograd is off and gathers with a plain NCCL all-gather first (TE 1.7
``layernorm_linear.py``: ``if tp_world_size == 1 or (not is_grad_enabled): ub_overlap_ag =
False``; the same in 2.x), and Megatron's full recompute runs a layer's first forward under
``torch.no_grad`` (``tensor_parallel/random.py`` ``CheckpointFunction.forward``): there those
two gathers block (``tp_forward_steps(blocking_gathers=True)``); ``Linear``'s reduce-scatters
keep their userbuffers, and the rerun, with autograd on, pairs everything again."""

TE_RING_EXCHANGE_ON_COPY_ENGINES = True
"""Transformer Engine's ring-exchange userbuffers (the forward's input gathers, the backward's
output-gradient gathers) move their pieces with ``cudaMemcpyAsync`` on the copy engines (TE 1.7
``comm_gemm_overlap.h``: ``use_ce = 1``, one SM; ``use_ce`` True by default from 1.9), and
their GEMM keeps every SM (``set_sm_margin`` off for ring exchanges in every release), so the
compute beside them is not slowed by the overlap slowdown (``CommStep.sm_free``). The pipelined
and bulk ones run userbuffers kernels on 16 SMs and slow it as NCCL's do."""

FUSED_FORWARD_PAIRS = (
    ("all_gather", 0),
    ("reduce_scatter", 1),
    ("all_gather", 2),
    ("reduce_scatter", 3),
)
"""A sequence-parallel layer's forward collectives and the GEMM each is fused with (index into
``LinearShares.forward``): QKV's input gather, the projection's output scatter, the MLP
input's gather, the MLP output's scatter."""


def _fused_forward_steps(
    *,
    forward_s: float,
    num_layers: int,
    sizes: dict[str, float],
    shares: tuple[float, ...],
    pairs: int,
    extra: tuple[Step, ...],
    chunks: int = 1,
    userbuffers: bool = False,
    blocking_gathers: bool = False,
) -> tuple[Step, ...]:
    """``tp_forward_steps`` under ``tp_comm_overlap`` with the GEMM windows: each of the first
    ``pairs`` collectives beside its GEMM (the compute after the pair waits for both;
    ``_pipelined_pair``; Transformer Engine's scatters ``_te_pipelined_scatter``), then the
    rest of the layers."""
    n = num_layers
    steps: list[Step] = []
    window_s = 0.0
    for op, gemm in FUSED_FORWARD_PAIRS[:pairs]:
        width = shares[gemm] * forward_s * n
        window_s += width
        name = f"fwd gemm {gemm}"
        if op == "all_gather" and blocking_gathers:
            steps += _pipelined_pair(op, name, op, sizes[op], n, 0.0, 1)
            steps.append(ComputeStep(name=name, duration_s=width))
        elif op == "reduce_scatter" and userbuffers:
            steps += _te_pipelined_scatter(op, name, sizes[op], n, width)
        else:
            on_copy_engines = userbuffers and TE_RING_EXCHANGE_ON_COPY_ENGINES
            steps += _pipelined_pair(op, name, op, sizes[op], n, width, chunks, on_copy_engines)
    steps.append(ComputeStep(name="fwd", duration_s=max(forward_s * n - window_s, 0.0)))
    return _drop_empty([*steps, *extra])


def tp_backward_steps(
    *,
    backward_input_s: float,
    backward_weight_s: float,
    recompute_s: float,
    num_layers: int,
    tp_bytes: float,
    shares: LinearShares,
    tp: int = 2,
    sequence_parallel: bool = False,
    full_recompute: bool = False,
    split: str = "",
    per_layer: int = 2,
    dtensor: bool = False,
    torch_async: bool = False,
    regather: bool = False,
    gather_bytes: float | None = None,
    gated_mlp: bool = True,
    parallel_block: bool = False,
    rerun_tail: bool = True,
    userbuffers: bool = False,
) -> tuple[Step, ...]:
    """Backward of ``num_layers`` layers with TP collectives placed where Megatron puts them.

    Full recompute first replays the forward (with its blocking TP collectives; without
    ``rerun_tail`` not the MLP output's, as PyTorch's checkpoint does not rerun it:
    ``schedules.kernels.full_recompute_kernels``). Without SP the
    two column-parallel dgrad all-reduces overlap their wgrad GEMMs; with SP the two row-parallel
    gradient all-gathers block, and per column-parallel linear the input re-gather overlaps the
    dgrad GEMM and the dgrad reduce-scatter overlaps the wgrad GEMM (4 AG + 2 RS per layer).
    ``userbuffers`` (Megatron's ``tp_comm_overlap``): Transformer Engine gathers each
    row-parallel linear's output gradient beside that linear's dgrad GEMM instead
    (``TE_GRAD_GATHER_BESIDE_DGRAD``), and a full recompute's forward runs its collectives
    beside their GEMMs as the forward does (the same modules run it again).
    ``split="input"`` gives the zero-bubble Bi pass (no wgrad to hide behind: the dgrad
    collectives block), ``split="weight"`` the W pass (wgrad GEMMs only).

    ``dtensor``: PyTorch's tensor parallelism (DTensor ``ColwiseParallel`` / ``RowwiseParallel``,
    eager or compiled, without asynchronous TP) instead. Autograd runs each linear's input and
    weight gradients in one node before the collective of the node's input, and each
    collective's result is needed by the very next node, so every TP collective of the backward
    blocks: with SP 2 gradient all-gathers and 2 dgrad reduce-scatters per layer, without SP 2
    dgrad all-reduces; ``regather`` adds what a recompute policy saving no norm output and no
    all-gather or all-reduce output (torchtitan's per-op AC) runs again in the backward: the 2
    input all-gathers with SP, the attention output's all-reduce without. ``gather_bytes``: the
    all-gathers' size where it differs from ``tp_bytes`` (float8 operands).

    ``torch_async``: PyTorch's asynchronous TP (Inductor's micro-pipeline pass,
    ``_micro_pipeline_tp``) instead: ``_torch_async_backward_steps`` (``gated_mlp``: whether the
    MLP's input gradient is a sum of two matmuls). A ``parallel_block`` has no second norm, so
    its ``regather`` without SP rebuilds nothing.
    """
    n = num_layers
    if split == "weight":
        return _drop_empty([ComputeStep(name="wgrad", duration_s=backward_weight_s * n)])
    if torch_async and tp > 1 and sequence_parallel:
        return _torch_async_backward_steps(
            backward_s=backward_input_s + (0.0 if split == "input" else backward_weight_s),
            weight_s=backward_weight_s,
            recompute_s=recompute_s,
            num_layers=n,
            sizes={
                "all_gather": tp_bytes if gather_bytes is None else gather_bytes,
                "reduce_scatter": tp_bytes,
            },
            shares=shares,
            full_recompute=full_recompute,
            regather=regather and not full_recompute,
            per_layer=per_layer,
            tp=tp,
            gated_mlp=gated_mlp,
            rerun_tail=rerun_tail,
        )
    steps: list[Step] = []
    if recompute_s > 0 and full_recompute and userbuffers and sequence_parallel and tp > 1:
        steps += _fused_rerun(
            recompute_s=recompute_s,
            num_layers=n,
            tp_bytes=tp_bytes,
            gather_bytes=tp_bytes if gather_bytes is None else gather_bytes,
            tp=tp,
            per_layer=per_layer,
            shares=shares,
            tail=rerun_tail,
            userbuffers=True,
        )
    elif recompute_s > 0:
        steps.append(ComputeStep(name="recompute", duration_s=recompute_s * n))
        if full_recompute and tp > 1:
            steps += tp_forward_steps(
                forward_s=0.0,
                num_layers=n,
                tp_bytes=tp_bytes,
                tp=tp,
                sequence_parallel=sequence_parallel,
                per_layer=per_layer,
                gather_bytes=gather_bytes,
                tail=rerun_tail,
            )
    if tp == 1:
        wgrad = 0.0 if split == "input" else backward_weight_s
        steps.append(ComputeStep(name="bwd", duration_s=(backward_input_s + wgrad) * n))
        return _drop_empty(steps)
    if dtensor:
        steps += _dtensor_backward_steps(
            backward_s=backward_input_s + (0.0 if split == "input" else backward_weight_s),
            num_layers=n,
            tp_bytes=tp_bytes,
            gather_bytes=tp_bytes if gather_bytes is None else gather_bytes,
            sequence_parallel=sequence_parallel,
            regather=regather and not full_recompute,
            per_layer=per_layer,
            parallel_block=parallel_block,
        )
        return _drop_empty(steps)
    gathered = tp_bytes if gather_bytes is None else gather_bytes
    rows: dict[str, float] = {}  # row-parallel dgrad GEMMs with their gradient's gather beside
    if sequence_parallel and userbuffers:
        rows = {
            name: share * backward_weight_s * n
            for name, share in (("proj", shares.proj), ("fc2", shares.fc2))[:per_layer]
        }
        for name, width in rows.items():
            steps += _pipelined_pair(
                f"AG grad {name}",
                f"dgrad {name}",
                "all_gather",
                gathered,
                n,
                width,
                tp,
                TE_RING_EXCHANGE_ON_COPY_ENGINES,
            )
    elif sequence_parallel:
        steps.append(
            CommStep(
                name="AG grad",
                group="tp",
                op="all_gather",
                size_bytes=gathered,
                repeat=per_layer * n,
            )
        )
    windows = (("qkv", shares.qkv), ("fc1", shares.fc1))[:per_layer]
    window = {name: share * backward_weight_s * n for name, share in windows}
    dgrad_rest = (
        backward_input_s * n - sum(window.values()) - sum(rows.values())
        if sequence_parallel
        else (backward_input_s * n)
    )
    wgrad_rest = backward_weight_s * n - sum(window.values())
    if split == "input":
        wgrad_rest = 0.0
    steps.append(ComputeStep(name="bwd", duration_s=max(dgrad_rest, 0.0) + max(wgrad_rest, 0.0)))
    reduce_op = "reduce_scatter" if sequence_parallel else "all_reduce"
    for name, width in window.items():
        if sequence_parallel:
            steps += [
                CommStep(
                    name=f"AG input {name}",
                    group="tp",
                    op="all_gather",
                    size_bytes=gathered,
                    repeat=n,
                    overlap=True,
                ),
                ComputeStep(name=f"dgrad {name}", duration_s=width),
            ]
        steps.append(
            CommStep(
                name=f"{reduce_op} dgrad {name}",
                group="tp",
                op=reduce_op,
                size_bytes=tp_bytes,
                repeat=n,
                overlap=split != "input",
            )
        )
        if split != "input":
            steps.append(ComputeStep(name=f"wgrad {name}", duration_s=width))
    return _drop_empty(steps)


def _pipelined_pair(
    comm_name: str,
    gemm_name: str,
    op: str,
    size: float,
    repeat: int,
    width_s: float,
    chunks: int,
    sm_free: bool = False,
) -> list[Step]:
    """A collective beside the GEMM it is fused with (``width_s`` of compute; with no known
    window it blocks; ``sm_free``: on the copy engines, ``CommStep.sm_free``). With the GEMM
    decomposed into ``chunks`` pieces, one per rank (PyTorch's asynchronous TP,
    ``torch/distributed/_symmetric_memory/__init__.py``, torch 2.7-2.8), a piece
    runs alone: a fused all-gather's last piece waits for the last shard to arrive
    (``_pipelined_all_gather_and_consume``: the shards are pulled one step after another, each
    piece computed as its shard lands), a fused reduce-scatter's first piece is computed before
    anything is sent (``_pipelined_produce_and_all2all``: each step computes the next rank's
    partial, then the ranks exchange). Transformer Engine's ring-exchange gathers pipeline alike,
    in tp pieces (``num_splits``), the last after the last receive. So a pair takes
    max(collective, (c - 1) / c of the GEMM) + 1 / c of it, where the plain pairing takes
    max(collective, GEMM)."""
    comm = CommStep(
        name=comm_name,
        group="tp",
        op=op,
        size_bytes=size,
        repeat=repeat,
        overlap=width_s > 0,
        sm_free=sm_free,
    )
    if chunks <= 1 or width_s <= 0:
        return [comm, ComputeStep(name=gemm_name, duration_s=width_s)]
    alone = width_s / chunks
    beside = ComputeStep(name=gemm_name, duration_s=width_s - alone)
    if op == "all_gather":
        return [comm, beside, ComputeStep(name=f"{gemm_name} last piece", duration_s=alone)]
    return [ComputeStep(name=f"{gemm_name} first piece", duration_s=alone), comm, beside]


TE_PIPELINE_SPLITS = 4
"""Pieces of Transformer Engine's pipelined GEMM + reduce-scatter (``proj_fprop``,
``fc2_fprop``: ``num_splits`` 4 in ``initialize_ub``'s defaults for the ``pipeline`` method,
TE 1.5 to 2.x)."""


def _te_pipelined_scatter(
    comm_name: str, gemm_name: str, size: float, repeat: int, width_s: float
) -> list[Step]:
    """Transformer Engine's pipelined GEMM + reduce-scatter: the GEMM runs in
    ``TE_PIPELINE_SPLITS`` pieces and each piece's reduce-scatter is issued when the piece
    ends, so the first piece runs alone, the scatters of the first pieces run beside the later
    ones, and the last piece's scatter, issued after the GEMM, is waited for before the layer
    goes on (TE 1.7 ``comm_gemm_overlap.h`` ``split_overlap_rs``; ``linear.py`` waits on it).
    With no known window the scatter blocks."""
    if width_s <= 0:
        return _pipelined_pair(comm_name, gemm_name, "reduce_scatter", size, repeat, width_s, 1)
    splits = TE_PIPELINE_SPLITS
    piece = width_s / splits
    early, last = size * (splits - 1) / splits, size / splits
    return [
        ComputeStep(name=f"{gemm_name} first piece", duration_s=piece),
        CommStep(
            name=comm_name,
            group="tp",
            op="reduce_scatter",
            size_bytes=early,
            repeat=repeat,
            overlap=True,
        ),
        ComputeStep(name=gemm_name, duration_s=width_s - piece),
        CommStep(
            name=f"{comm_name} last piece",
            group="tp",
            op="reduce_scatter",
            size_bytes=last,
            repeat=repeat,
        ),
    ]


def _fused_pair(
    name: str, op: str, size: float, repeat: int, width_s: float, chunks: int = 1
) -> list[Step]:
    """``_pipelined_pair`` named after the collective."""
    gemm = name.replace("AG", "gemm").replace("RS", "gemm")
    return _pipelined_pair(name, gemm, op, size, repeat, width_s, chunks)


def _fused_rerun(
    *,
    recompute_s: float,
    num_layers: int,
    tp_bytes: float,
    gather_bytes: float,
    tp: int,
    per_layer: int,
    shares: LinearShares,
    tail: bool,
    userbuffers: bool = False,
) -> list[Step]:
    """A full recompute's forward rerun with its TP collectives beside their GEMMs, as
    asynchronous TP (or, ``userbuffers``, Transformer Engine) pairs them in the forward.
    Without the MLP output's GEMM (``tail`` False) the other GEMMs' shares are of the shorter
    rerun; with no GEMM window known asynchronous TP's collectives block, Transformer Engine's
    run beside the whole rerun."""
    rerun_shares = shares
    if not tail and per_layer == 2 and shares.forward:
        rest = 1.0 - shares.forward[3]  # the rerun without the MLP output's GEMM
        forward = (*(share / rest for share in shares.forward[:3]), 0.0)
        rerun_shares = replace(shares, forward=forward)
    rerun = tp_forward_steps(
        forward_s=recompute_s,
        num_layers=num_layers,
        tp_bytes=tp_bytes,
        tp=tp,
        sequence_parallel=True,
        tp_comm_overlap=userbuffers or bool(shares.forward),
        per_layer=per_layer,
        gather_bytes=gather_bytes,
        shares=rerun_shares,
        tail=tail,
        pipeline_chunks=tp,
        userbuffers=userbuffers,
    )
    return [
        replace(step, name=f"recompute {step.name}") if isinstance(step, ComputeStep) else step
        for step in rerun
    ]


def _torch_async_backward_steps(
    *,
    backward_s: float,
    weight_s: float,
    recompute_s: float,
    num_layers: int,
    sizes: dict[str, float],
    shares: LinearShares,
    full_recompute: bool,
    regather: bool,
    per_layer: int,
    tp: int,
    gated_mlp: bool,
    rerun_tail: bool = True,
) -> tuple[Step, ...]:
    """The TP part of a layer's backward under PyTorch's asynchronous TP, as its pattern
    matcher rewrites a compiled graph (``torch/_inductor/fx_passes/micro_pipeline_tp.py``).

    An all-gather is fused (``fused_all_gather_matmul``) with the matmuls taking its output as
    their first operand, a reduce-scatter (``fused_matmul_reduce_scatter``) only with the one
    matmul that is its whole input. With torchtitan's modules (separate wq, wk, wv; w1 and w3
    when gated):

    - a full recompute reruns the forward with its fused pairs (``tp_forward_steps``); without
      ``rerun_tail`` not the MLP output's pair, whose GEMM the partitioner leaves out of the
      rerun, so the other GEMMs' windows are shares of the rest;
    - per-op recompute (``regather``) gathers the two inputs again, each fused with the matmul
      it reruns on them: wk, and w3 where the MLP is gated (a plain MLP reruns none: its
      gather blocks);
    - the gradient all-gathers of the projection and MLP outputs run beside their input-gradient
      GEMMs;
    - the input gradients of wq, wk and wv are summed before their reduce-scatter, which so
      stays NCCL's and blocks, as does a gated MLP's (w1 + w3); a plain MLP's is fused with
      w1's input-gradient GEMM.

    Windows are the GEMMs' shares of the weight-gradient time ``weight_s`` (an input-gradient
    or rerun GEMM has its weight gradient's FLOPs); a collective without a known window blocks.
    """
    n = num_layers
    gather, scatter = sizes["all_gather"], sizes["reduce_scatter"]
    mlp = per_layer == 2
    steps: list[Step] = []
    if recompute_s > 0 and full_recompute:
        steps += _fused_rerun(
            recompute_s=recompute_s,
            num_layers=n,
            tp_bytes=scatter,
            gather_bytes=gather,
            tp=tp,
            per_layer=per_layer,
            shares=shares,
            tail=rerun_tail,
        )
    elif recompute_s > 0:
        rerun_s = 0.0
        if regather:
            windows = [("AG input k", shares.k)]
            if mlp:
                windows.append(("AG input fc1", shares.fc1 / 2 if gated_mlp else 0.0))
            for name, share in windows:
                width = min(share * weight_s * n, max(recompute_s * n - rerun_s, 0.0))
                rerun_s += width
                steps += _fused_pair(name, "all_gather", gather, n, width, tp)
        steps.append(ComputeStep(name="recompute", duration_s=recompute_s * n - rerun_s))
    window_s = 0.0
    pairs = [("AG grad proj", "all_gather", gather, shares.proj)]
    if mlp:
        pairs.append(("AG grad fc2", "all_gather", gather, shares.fc2))
        if not gated_mlp:
            pairs.append(("RS dgrad fc1", "reduce_scatter", scatter, shares.fc1))
    for name, op, size, share in pairs:
        width = share * weight_s * n
        window_s += width
        steps += _fused_pair(name, op, size, n, width, tp)
    steps.append(ComputeStep(name="bwd", duration_s=max(backward_s * n - window_s, 0.0)))
    unfused = 1 + (1 if mlp and gated_mlp else 0)
    steps.append(
        CommStep(
            name="reduce_scatter dgrad",
            group="tp",
            op="reduce_scatter",
            size_bytes=scatter,
            repeat=unfused * n,
        )
    )
    return _drop_empty(steps)


def _dtensor_backward_steps(
    *,
    backward_s: float,
    num_layers: int,
    tp_bytes: float,
    gather_bytes: float,
    sequence_parallel: bool,
    regather: bool,
    per_layer: int,
    parallel_block: bool = False,
) -> list[Step]:
    """The TP part of ``tp_backward_steps`` under DTensor: every collective on the critical
    path (the gradient all-gathers, with ``regather`` the input ones or the attention output's
    all-reduce, the compute, then the dgrad reduce-scatters or all-reduces)."""
    n = num_layers
    steps: list[Step] = []
    if sequence_parallel:
        names = ["AG grad", "AG input"] if regather else ["AG grad"]
        steps += [
            CommStep(
                name=name,
                group="tp",
                op="all_gather",
                size_bytes=gather_bytes,
                repeat=per_layer * n,
            )
            for name in names
        ]
    elif regather and not parallel_block:  # the attention output's all-reduce, rebuilding
        # the MLP norm's input (a parallel block has no second norm)
        steps.append(
            CommStep(name="AR residual", group="tp", op="all_reduce", size_bytes=tp_bytes, repeat=n)
        )
    steps.append(ComputeStep(name="bwd", duration_s=backward_s * n))
    op = "reduce_scatter" if sequence_parallel else "all_reduce"
    steps.append(
        CommStep(name=f"{op} dgrad", group="tp", op=op, size_bytes=tp_bytes, repeat=per_layer * n)
    )
    return steps
