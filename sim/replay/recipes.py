"""Per-micro-batch costs and pass recipes every replayed rank is built from.

The compute model gives per-layer, embedding and head times; ``schedules`` gives message sizes and
parameter counts; this module turns them into the forward/backward recipes of a model chunk (TP/SP
and CP collectives in place, embedding and head work on the first and last virtual stage), the
parameters of a chunk, the optimizer time and the step-end gradient-norm group.

    recipes = layer_recipes(plan, step_costs(plan, compute), num_layers=4)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from schedules.actions import CommStep, ComputeStep, HostStep, Step
from schedules.activations import ACTIVATION_BYTES
from schedules.arithmetic import (
    cp_kv_message_bytes,
    pp_message_bytes,
    tp_branches_per_layer,
    tp_message_bytes,
)
from schedules.context_parallel import RingStep, RingWork, ring_attention, runs_torch_ring
from schedules.data_parallel.registry import data_parallel_kind
from schedules.float8 import scale_precompute_bytes
from schedules.kernels import (
    checkpoint_tail_skipped,
    kernel_stack,
    linear_gemm_shapes,
    master_copy_bytes,
    ring_work_kernels,
    torch_async_tp,
    tp_gather_bytes,
    weight_gemm_shapes,
)
from schedules.moe import dispatch_bytes, expert_tokens, is_moe
from schedules.moe_kernels import megatron_moe
from schedules.mtp import mtp_depths, mtp_layer_is_moe
from schedules.optimizer_passes import megatron_step_bytes
from schedules.optimizer_states import adam_traffic_bytes
from schedules.plan import Plan
from schedules.recompute_modules import selective_modules
from schedules.stages import recomputed_layers
from schedules.step import StepDescription
from schedules.tp_steps import (
    TE_GATHERS_BLOCK_WITHOUT_GRAD,
    LinearShares,
    branch_shares,
    tp_backward_steps,
    tp_forward_steps,
)
from schedules.transformer_engine import weight_cast_bytes_per_step
from sim.compute.compute_model import ComputeModel, LayerTimes, launch_loop


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCosts:
    """The per-micro-batch times and message sizes every rank's recipes are built from."""

    layer: LayerTimes
    """One transformer layer."""
    embed: LayerTimes
    """Input embedding (first stage)."""
    head: LayerTimes
    """Final norm, LM head and loss (last stage)."""
    shares: LinearShares
    """Column-parallel wgrad shares of a layer (TP overlap windows)."""
    tp_bytes: float
    """One TP collective message."""
    tp_gather_bytes: float
    """One sequence-parallel all-gather (``schedules.kernels.tp_gather_bytes``: float8 operands
    under torchtitan's float8 TP, else ``tp_bytes``)."""
    cp_bytes: float
    """One CP ring step's K and V."""
    cp_forward: tuple[Step, ...] = ()
    """torch's ring attention in one layer's forward, priced (``ring_steps``; empty without it)."""
    cp_backward: tuple[Step, ...] = ()
    """torch's ring attention in one layer's backward, priced."""
    p2p_bytes: float
    """One pipeline send."""
    moe_layer: LayerTimes | None = None
    """One MoE layer on the busiest GPU (None for a dense model)."""
    dispatch_bytes: float = 0.0
    """One MoE token dispatch (or combine) message per GPU."""
    expert_tp_bytes: float = 0.0
    """The all-gather (reduce-scatter) of the dispatched tokens over expert TP (etp > 1)."""
    moe_sync_s: float = 0.0
    """Host time after Megatron-Core's device synchronisation in an MoE layer's dispatch
    before the GPU has work again (``moe_sync_s``; 0 where the dispatcher does not sync)."""
    kept: StepCosts | None = None
    """The same costs without recomputation: the layers block recompute leaves alone
    (``parallel.recompute_num_layers``; None when every layer is treated alike)."""
    mtp: LayerTimes | None = None
    """One multi-token-prediction depth's embedding, norms and projection (None without
    ``model.mtp_num_layers``)."""
    dense_halves: tuple[LayerTimes, LayerTimes] | None = None
    """One dense layer's attention side and MLP (``ComputeModel.layer_halves_times``), for the
    combined passes of ``parallel.overlap_moe_expert_parallel_comm`` (else None)."""
    moe_halves: tuple[LayerTimes, LayerTimes] | None = None
    """One MoE layer before and after its token dispatch, the same way (else None)."""


def step_costs(plan: Plan, compute: ComputeModel, *, gpus_per_node: int | None = None) -> StepCosts:
    """Times from the compute model and sizes from ``schedules`` for one micro-batch
    (``gpus_per_node``: the servers' size, which the flex dispatcher's message needs)."""
    model, parallel, b = plan.model, plan.parallel, plan.training.micro_batch_size
    dtype = "fp8" if plan.training.precision == "fp8" else "bf16"
    linears = linear_gemm_shapes(plan)  # each fused GEMM as the GEMMs that run it
    wgrad = [sum(compute.gemm_time_s(k, n, m, dtype) for m, n, k in gemms) for gemms in linears]
    total = sum(wgrad) or 1.0
    tokens, _, hidden = weight_gemm_shapes(plan)[0]
    k_wgrad = compute.gemm_time_s(hidden, model.kv_size / parallel.tp, tokens, dtype)
    layer = compute.layer_times(plan)
    cp_forward, cp_backward = ring_steps(plan, compute)
    outside_ring_s = _less(layer.forward_s, cp_forward)  # what tp_forward_steps is given
    forward = tuple(
        sum(compute.gemm_time_s(m, n, k, dtype) for m, n, k in gemms) / outside_ring_s
        if outside_ring_s
        else 0.0
        for gemms in linears
    )
    combined = is_moe(model) and parallel.overlap_moe_expert_parallel_comm
    moe_layer, dispatch, expert_tp, sync = None, 0.0, 0.0, 0.0
    if is_moe(model):
        moe_layer = compute.moe_layer_times(plan)
        dispatch = dispatch_bytes(plan, gpus_per_node=gpus_per_node)
        if parallel.expert_tp > 1:
            expert_tp = expert_tokens(plan) * model.hidden_size * ACTIVATION_BYTES
        sync = moe_sync_s(plan, compute)
    return StepCosts(
        layer=layer,
        embed=compute.embedding_times(plan),
        head=compute.head_times(plan),
        shares=branch_shares(
            LinearShares(
                qkv=wgrad[0] / total,
                k=k_wgrad / total,
                proj=wgrad[1] / total,
                fc1=wgrad[2] / total,
                fc2=wgrad[3] / total,
                forward=forward,
            ),
            parallel_block=model.parallel_block,
        ),
        tp_bytes=tp_message_bytes(model, b, cp=parallel.cp),
        tp_gather_bytes=tp_gather_bytes(plan),
        cp_bytes=cp_kv_message_bytes(model, b, tp=parallel.tp, cp=parallel.cp),
        cp_forward=cp_forward,
        cp_backward=cp_backward,
        p2p_bytes=pp_message_bytes(
            model, b, tp=parallel.tp, cp=parallel.cp, sequence_parallel=parallel.sequence_parallel
        ),
        moe_layer=moe_layer,
        dispatch_bytes=dispatch,
        expert_tp_bytes=expert_tp,
        moe_sync_s=sync,
        kept=None
        if parallel.recompute_num_layers is None
        else step_costs(kept_plan(plan), compute, gpus_per_node=gpus_per_node),
        mtp=compute.mtp_times(plan) if mtp_depths(model) else None,
        dense_halves=compute.layer_halves_times(plan, moe=False) if combined else None,
        moe_halves=compute.layer_halves_times(plan, moe=True) if combined else None,
    )


def moe_shares(plan: Plan, costs: StepCosts) -> LinearShares:
    """The GEMM windows of an MoE layer's TP collectives, as shares of that layer's weight
    gradient time: its attention linears are a dense layer's (their time over the MoE layer's
    wgrad), its shared expert's (if any) a dense MLP's scaled by their widths; the routed
    experts' linears have no TP collective of their own, and the forward's windows are left
    unknown (its collectives run beside the whole layer)."""
    moe_layer = costs.moe_layer
    if moe_layer is None or moe_layer.backward_weight_s <= 0:
        return LinearShares()
    shares, scale = costs.shares, costs.layer.backward_weight_s / moe_layer.backward_weight_s
    shared = plan.model.moe_shared_expert_ffn_hidden_size / plan.model.ffn_hidden_size
    return LinearShares(
        qkv=shares.qkv * scale,
        k=shares.k * scale,
        proj=shares.proj * scale,
        fc1=shares.fc1 * scale * shared,
        fc2=shares.fc2 * scale * shared,
    )


def kept_plan(plan: Plan) -> Plan:
    """The plan with no recomputation: what the layers outside block recompute run."""
    parallel = dataclasses.replace(plan.parallel, recompute="none", recompute_num_layers=None)
    return dataclasses.replace(plan, parallel=parallel)


def _cp_steps(plan: Plan, costs: StepCosts, num_layers: int, op: str) -> list[Step]:
    """Megatron's ring attention: one K/V exchange per layer, overlapped with the attention
    compute (torch's ring is ``ring_steps``)."""
    cp = plan.parallel.cp
    if cp == 1 or costs.cp_forward:
        return []
    size = costs.cp_bytes * cp
    return [
        CommStep(
            name=f"{op} kv", group="cp", op=op, size_bytes=size, repeat=num_layers, overlap=True
        )
    ]


def ring_steps(plan: Plan, compute: ComputeModel) -> tuple[tuple[Step, ...], tuple[Step, ...]]:
    """One layer's torch ring attention (``schedules.context_parallel``), forward and backward,
    as recipe steps: each stretch of kernels priced, each exchange a collective on ``cp``
    (overlapped as the ring overlaps it); empty where torch's ring does not run."""
    stack = kernel_stack(plan)
    if not runs_torch_ring(plan, stack):
        return (), ()
    ring = ring_attention(plan, stack)

    def steps(ring_pass: tuple[RingStep, ...], backward: bool) -> tuple[Step, ...]:
        return tuple(
            ComputeStep(
                name=s.name,
                duration_s=compute.run_s(
                    ring_work_kernels(plan, s, backward=backward), launch_loop(plan)
                ),
            )
            if isinstance(s, RingWork)
            else CommStep(
                name=s.name, group="cp", op=s.op, size_bytes=s.size_bytes, overlap=s.overlap
            )
            for s in ring_pass
        )

    return steps(ring.forward, False), steps(ring.backward, True)


def _repeat(steps: tuple[Step, ...], num_layers: int) -> tuple[Step, ...]:
    """One layer's ``steps`` for ``num_layers`` aggregated layers: each compute ``num_layers``
    times as long, each collective ``num_layers`` calls back to back."""
    return tuple(
        dataclasses.replace(s, duration_s=s.duration_s * num_layers)
        if isinstance(s, ComputeStep)
        else dataclasses.replace(s, repeat=s.repeat * num_layers)
        if isinstance(s, CommStep)
        else s
        for s in steps
    )


def _less(total_s: float, steps: tuple[Step, ...]) -> float:
    """``total_s`` without the compute of ``steps`` (a rounding residue counts as 0)."""
    rest = total_s - sum(s.duration_s for s in steps if isinstance(s, ComputeStep))
    return 0.0 if rest <= 1e-12 * total_s else rest


def _before_bwd(steps: tuple[Step, ...], ring: tuple[Step, ...]) -> tuple[Step, ...]:
    """``ring`` placed before the pass's main backward compute (``bwd``), where the attention
    backward runs among the layer's input gradients."""
    return _before(steps, ring, "bwd", at_end=True)


def _before(
    steps: tuple[Step, ...], inserted: tuple[Step, ...], name: str, *, at_end: bool = False
) -> tuple[Step, ...]:
    """``inserted`` placed before the pass's compute step ``name`` (where the attention runs:
    ``fwd`` or ``bwd``, the layer's compute outside the GEMM windows); without one, at the end
    (``at_end``) or at the start."""
    names = [s.name if isinstance(s, ComputeStep) else "" for s in steps]
    at = names.index(name) if name in names else (len(steps) if at_end else 0)
    return steps[:at] + inserted + steps[at:]


def pass_extras(plan: Plan, costs: StepCosts, *, first: bool, last: bool) -> dict[str, list[Step]]:
    """Embedding and head work (with their TP collectives) of the first and last virtual stage."""
    tp, sp, size = plan.parallel.tp, plan.parallel.sequence_parallel, costs.tp_bytes
    out: dict[str, list[Step]] = {"fwd_pre": [], "fwd_post": [], "bwd_pre": [], "bwd_post": []}
    embed, head = costs.embed, costs.head
    if first:
        out["fwd_pre"].append(
            ComputeStep(name="embed", duration_s=embed.forward_s, launch_s=embed.forward_launch_s)
        )
        if tp > 1:
            op = "reduce_scatter" if sp else "all_reduce"
            out["fwd_pre"].append(CommStep(name=f"embed {op}", group="tp", op=op, size_bytes=size))
        out["bwd_post"].append(
            ComputeStep(
                name="embed bwd", duration_s=embed.backward_s, launch_s=_backward_launch(embed)
            )
        )
    if last:
        if tp > 1 and sp:
            out["fwd_post"].append(
                CommStep(name="head all_gather", group="tp", op="all_gather", size_bytes=size)
            )
        out["fwd_post"].append(
            ComputeStep(name="head", duration_s=head.forward_s, launch_s=head.forward_launch_s)
        )
        out["bwd_pre"].append(
            ComputeStep(
                name="head bwd", duration_s=head.backward_s, launch_s=_backward_launch(head)
            )
        )
        if tp > 1:
            op = "reduce_scatter" if sp else "all_reduce"
            out["bwd_pre"].append(CommStep(name=f"head {op}", group="tp", op=op, size_bytes=size))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class MtpParts:
    """One multi-token-prediction depth's recipe pieces around its layer (``mtp_recipes``)."""

    forward: tuple[Step, ...]
    """The embedding, norms and projection with their TP collectives, before the layer."""
    head_forward: tuple[Step, ...]
    """Its LM head and loss, after the layer."""
    head_backward: tuple[Step, ...]
    """Their backward, before the layer's."""
    rerun: tuple[Step, ...]
    """The projection again before the layer's backward under full recompute (else empty)."""
    backward_input: tuple[Step, ...]
    """The projection's input gradient with its TP collectives, after the layer's backward."""
    backward_weight: tuple[Step, ...]
    """The projection's weight gradient and the embedding's backward."""


def mtp_parts(plan: Plan, costs: StepCosts) -> MtpParts | None:
    """One depth's pieces (``mtp_recipes``); None without ``model.mtp_num_layers``."""
    mtp = costs.mtp
    if not mtp_depths(plan.model) or mtp is None:
        return None
    tp, sp, size = plan.parallel.tp, plan.parallel.sequence_parallel, costs.tp_bytes
    head = pass_extras(plan, costs, first=False, last=True)

    def comm(name: str, op: str, factor: float = 1.0, *, overlap: bool = False) -> CommStep:
        return CommStep(
            name=f"mtp {name} {op}", group="tp", op=op, size_bytes=factor * size, overlap=overlap
        )

    reduce = "reduce_scatter" if sp else "all_reduce"
    gathers = [comm("eh_proj input", "all_gather", 2.0)] if tp > 1 and sp else []
    gathers += [comm("eh_proj output", "all_gather")] if tp > 1 else []
    forward: list[Step] = [
        ComputeStep(name="mtp eh_proj", duration_s=mtp.forward_s, launch_s=mtp.forward_launch_s),
        *([comm("embed", reduce)] if tp > 1 else []),
        *gathers,
    ]
    rerun: list[Step] = []
    if mtp.recompute_s > 0 and costs.kept is None:  # block recompute leaves the depths alone
        rerun = [
            ComputeStep(
                name="mtp eh_proj rerun",
                duration_s=mtp.recompute_s,
                launch_s=mtp.recompute_launch_s,
            ),
            *gathers,
        ]
    dgrad = ComputeStep(
        name="mtp eh_proj bwd",
        duration_s=mtp.backward_input_s,
        launch_s=mtp.backward_input_launch_s,
    )
    backward_input: list[Step] = [dgrad]
    if tp > 1:  # asynchronous, as Megatron's linears run them: beside dgrad, beside wgrad
        backward_input = [
            *([comm("sp split", "all_gather")] if sp else []),
            *([comm("eh_proj input", "all_gather", 2.0, overlap=True)] if sp else []),
            dgrad,
            comm("eh_proj input grad", reduce, 2.0, overlap=True),
        ]
    weight = ComputeStep(
        name="mtp eh_proj wgrad",
        duration_s=mtp.backward_weight_s,
        launch_s=mtp.backward_weight_launch_s,
    )
    return MtpParts(
        forward=tuple(forward),
        head_forward=tuple(head["fwd_post"]),
        head_backward=tuple(head["bwd_pre"]),
        rerun=tuple(rerun),
        backward_input=tuple(backward_input),
        backward_weight=(weight,),
    )


def mtp_layer_costs(plan: Plan, costs: StepCosts) -> tuple[Plan, StepCosts]:
    """The plan and costs a depth's layer runs with: block recompute leaves it alone."""
    return (kept_plan(plan), costs.kept) if costs.kept is not None else (plan, costs)


def mtp_recipes(plan: Plan, costs: StepCosts) -> dict[str, tuple[Step, ...]]:
    """Forward, backward, Bi and W recipes of the multi-token-prediction depths on the last
    virtual stage (``schedules.mtp``), each: the embedding looked up again (its output reduced
    over TP as the first stage's), the projection with its TP collectives (under sequence
    parallelism the 2h input gathered, the output gathered over the hidden dimension and split
    back, blocking; in the backward the split's gather, then the input's re-gather beside the
    input-gradient GEMM and the input gradient's reduction beside the next compute, as
    Megatron's linears run them), one layer of the last layer's kind, then its LM head and
    loss. Under full recompute the projection and the layer run again before their backward
    (Megatron's uniform method; block recompute leaves the depths alone)."""
    parts = mtp_parts(plan, costs)
    if parts is None:
        return {"F": (), "B": (), "Bi": (), "W": ()}
    depths = mtp_depths(plan.model)
    layer_plan, layer_costs = mtp_layer_costs(plan, costs)
    layer = uniform_recipes(layer_plan, layer_costs, 1, moe=mtp_layer_is_moe(plan.model))
    one_f = (*parts.forward, *layer["F"], *parts.head_forward)
    one_bi = (*parts.head_backward, *parts.rerun, *layer["Bi"], *parts.backward_input)
    one_b = (
        *parts.head_backward,
        *parts.rerun,
        *layer["B"],
        *parts.backward_input,
        *parts.backward_weight,
    )
    one_w = (*layer["W"], *parts.backward_weight)
    return {"F": one_f * depths, "B": one_b * depths, "Bi": one_bi * depths, "W": one_w * depths}


def _backward_launch(times: LayerTimes) -> float:
    return times.backward_input_launch_s + times.backward_weight_launch_s


def _with_launches(steps: tuple[Step, ...], launch_s: float, busy_s: float) -> tuple[Step, ...]:
    """``steps`` with the host time ``launch_s`` of their ``busy_s`` of compute spread over
    their compute steps in proportion to their duration."""
    if launch_s <= 0 or busy_s <= 0:
        return steps
    density = launch_s / busy_s
    return tuple(
        dataclasses.replace(s, launch_s=s.duration_s * density) if isinstance(s, ComputeStep) else s
        for s in steps
    )


def layer_recipes(
    plan: Plan, costs: StepCosts, num_layers: int, num_moe: int = 0
) -> dict[str, tuple[Step, ...]]:
    """Forward, backward, Bi and W recipes of ``num_layers`` consecutive layers, ``num_moe`` of
    them MoE layers (their recipes follow the dense ones': the layers are aggregated). Under
    block recompute the first ``recompute_num_layers`` are recomputed, the others keep their
    activations (their backward comes first)."""
    if costs.kept is not None:
        recomputed = recomputed_layers(plan.parallel, num_layers)
        moe_recomputed = min(num_moe, recomputed * num_moe // max(num_layers, 1))
        first = _recipes(plan, costs, recomputed, moe_recomputed)
        rest = _recipes(
            kept_plan(plan), costs.kept, num_layers - recomputed, num_moe - moe_recomputed
        )
        return {
            "F": first["F"] + rest["F"],
            "B": rest["B"] + first["B"],
            "Bi": rest["Bi"] + first["Bi"],
            "W": rest["W"] + first["W"],
        }
    return _recipes(plan, costs, num_layers, num_moe)


def _recipes(
    plan: Plan, costs: StepCosts, num_layers: int, num_moe: int
) -> dict[str, tuple[Step, ...]]:
    dense = uniform_recipes(plan, costs, num_layers - num_moe)
    if not num_moe:
        return dense
    moe = uniform_recipes(plan, costs, num_moe, moe=True)
    return {key: dense[key] + moe[key] for key in dense}


def moe_sync_s(plan: Plan, compute: ComputeModel) -> float:
    """Host time between the device synchronisation in an MoE layer's token dispatch and the
    GPU's next work: the host launches again from the point the GPU reached, so the GPU waits for
    one modelled kernel's launches (``ComputeModel.launch_s``). The token counts go to the host
    once per layer's forward (read in the source, none measured):

    - Megatron-Core, both dispatchers (core v0.9 and the development branch's
      ``token_dispatcher.py``): the alltoall dispatcher synchronises before its all-to-all
      (``cuda_sync_point`` ``before_ep_alltoall``: the splits and the grouped GEMMs' sizes are
      host values), the allgather dispatcher after its gather (``.cpu()`` of the local experts'
      counts);
    - torchtitan's expert parallelism (``distributed/expert_parallel.py``, 2025:
      ``_token_dispatch`` exchanges the counts by all-to-all and ``.tolist()``s the splits, "this
      would incur a device-to-host sync"), so the PyTorch stacks with ep > 1.

    0 otherwise, and with a capacity factor, priced as Megatron's drop-and-pad
    (``--moe-pad-expert-input-to-capacity``: static shapes, no copy, what CUDA graphs capture,
    ``ComputeModel.moe_layer_times``)."""
    if plan.model.moe_capacity_factor is not None:
        return 0.0
    if not megatron_moe(plan) and plan.parallel.ep < 2:
        return 0.0
    return compute.host_s_per_launch * compute.launches_per_kernel(launch_loop(plan))


MOE_COUNT_BYTES = 8
"""Bytes per expert of the token counts Megatron-Core's alltoall dispatcher gathers over the
expert-TP x EP group before each dispatch (int64, ``gather_from_sequence_parallel_region``)."""
TORCH_MOE_COUNT_BYTES = 4
"""Bytes per expert of the token counts torchtitan's expert parallelism exchanges by all-to-all
over EP before each dispatch (``torch.histc``'s float32)."""


def dispatch_counts(plan: Plan, costs: StepCosts, forwards: int) -> list[Step]:
    """What precedes ``forwards`` forward token dispatches: Megatron-Core's alltoall dispatcher
    gathers the token counts over expert-TP x EP, torchtitan exchanges them by all-to-all over
    EP, then the host synchronises on them (``moe_sync_s``); under the flex dispatcher DeepEP
    lays the tokens out on the GPU and the host only waits for the counts. Empty where the
    dispatcher does not synchronise."""
    parallel = plan.parallel
    sync: list[Step] = []
    if costs.moe_sync_s and forwards:
        sync = [HostStep(name="moe sync", duration_s=forwards * costs.moe_sync_s)]
    counts: list[Step] = []
    if sync and megatron_moe(plan) and parallel.moe_token_dispatcher == "flex":
        counts = list(sync)  # DeepEP lays the tokens out on the GPU; the host waits for counts
    elif sync and megatron_moe(plan):
        counts_bytes = MOE_COUNT_BYTES * plan.model.num_experts * parallel.expert_tp * parallel.ep
        counts = [
            CommStep(
                name="moe counts all_gather",
                group="tpep",
                op="all_gather",
                size_bytes=counts_bytes,
                repeat=forwards,
            ),
            *sync,
        ]
    elif sync:  # torchtitan: the counts by all-to-all over EP, then ``.tolist()``
        counts = [
            CommStep(
                name="moe counts all_to_all",
                group="ep",
                op="all_to_all",
                size_bytes=TORCH_MOE_COUNT_BYTES * plan.model.num_experts,
                repeat=forwards,
            ),
            *sync,
        ]
    return counts


def expert_steps(
    plan: Plan, costs: StepCosts, num_layers: int, *, recompute: bool, backward: bool
) -> list[Step]:
    """The token dispatch and combine of ``num_layers`` MoE layers in one pass (blocking, as
    Megatron-Core runs them), with the expert-TP gather and scatter when etp > 1; twice with
    full recompute (the recomputed forward dispatches again). Each forward dispatch of
    Megatron-Core's alltoall dispatcher first gathers the token counts over expert-TP x EP and
    synchronises the device; its allgather dispatcher synchronises after its gather;
    torchtitan's expert parallelism exchanges the counts by all-to-all over EP and synchronises
    (``moe_sync_s``)."""
    parallel, passes = plan.parallel, 2 if recompute else 1
    size, n = costs.dispatch_bytes, num_layers * passes
    forwards = num_layers if recompute or not backward else 0  # passes that run the forward
    sync: list[Step] = []
    if costs.moe_sync_s and forwards:
        sync = [HostStep(name="moe sync", duration_s=forwards * costs.moe_sync_s)]
    if parallel.moe_token_dispatcher == "allgather":
        return [
            CommStep(
                name="moe all_gather", group="tpep", op="all_gather", size_bytes=size, repeat=n
            ),
            *sync,
            CommStep(
                name="moe reduce_scatter",
                group="tpep",
                op="reduce_scatter",
                size_bytes=size,
                repeat=n,
            ),
        ]
    counts = dispatch_counts(plan, costs, forwards)
    steps: list[Step] = [
        *counts,
        CommStep(name="moe dispatch", group="ep", op="all_to_all", size_bytes=size, repeat=n),
    ]
    if costs.expert_tp_bytes:
        etp = costs.expert_tp_bytes
        steps += [
            CommStep(
                name="moe etp all_gather", group="etp", op="all_gather", size_bytes=etp, repeat=n
            ),
            CommStep(
                name="moe etp reduce_scatter",
                group="etp",
                op="reduce_scatter",
                size_bytes=etp,
                repeat=n,
            ),
        ]
    steps.append(
        CommStep(name="moe combine", group="ep", op="all_to_all", size_bytes=size, repeat=n)
    )
    return steps


def uniform_recipes(
    plan: Plan, costs: StepCosts, num_layers: int, *, moe: bool = False, expert_comm: bool = True
) -> dict[str, tuple[Step, ...]]:
    """Recipes of ``num_layers`` identical layers (dense, or MoE with their dispatch unless
    ``expert_comm`` is off)."""
    parallel = plan.parallel
    layer = costs.moe_layer if moe and costs.moe_layer is not None else costs.layer
    per_layer = tp_branches_per_layer(plan.model)
    if moe and not plan.model.moe_shared_expert_ffn_hidden_size:
        per_layer = 1
    if num_layers == 0:
        return {"F": (), "B": (), "Bi": (), "W": ()}

    ring_fwd, ring_bwd = costs.cp_forward, costs.cp_backward

    torch_async = torch_async_tp(plan)
    # Transformer Engine's userbuffers (Megatron's tp_comm_overlap)
    userbuffers = parallel.tp_comm_overlap and kernel_stack(plan) == "megatron"
    shares = costs.shares
    if moe and torch_async:  # async TP's windows are a dense layer's GEMMs: an MoE layer's block
        shares = LinearShares()
    elif moe:
        shares = moe_shares(plan, costs)

    modules = selective_modules(parallel)
    shared = bool(plan.model.moe_shared_expert_ffn_hidden_size)
    # a rerun MLP's TP collectives block; with Transformer Engine's userbuffers the rerun (with
    # autograd on) overlaps them like the forward's (its first forward, without autograd, would
    # block its input gather instead: not priced)
    rerun_mlp_collectives = (
        parallel.tp > 1
        and not userbuffers
        and (("mlp" in modules and not moe) or ("shared_experts" in modules and moe and shared))
    )

    def backward(split: str) -> tuple[Step, ...]:
        ring = ring_bwd if split != "weight" else ()
        # recomputing the attention core (selective, full) runs the forward ring again
        rerun = ring_fwd if ring and parallel.recompute in ("selective", "full") else ()
        steps = tp_backward_steps(
            backward_input_s=_less(layer.backward_input_s, ring),
            backward_weight_s=layer.backward_weight_s,
            recompute_s=_less(layer.recompute_s, rerun),
            num_layers=num_layers,
            tp_bytes=costs.tp_bytes,
            shares=shares,
            tp=parallel.tp,
            sequence_parallel=parallel.sequence_parallel,
            full_recompute=parallel.recompute == "full",
            split=split,
            per_layer=per_layer,
            dtensor=kernel_stack(plan) != "megatron" and not parallel.tp_comm_overlap,
            torch_async=torch_async,
            regather=parallel.recompute == "op",
            gather_bytes=costs.tp_gather_bytes,
            gated_mlp=plan.model.gated_mlp,
            parallel_block=plan.model.parallel_block,
            rerun_tail=moe or not checkpoint_tail_skipped(plan),
            userbuffers=userbuffers,
        )
        if split != "weight" and rerun_mlp_collectives:
            # Megatron-Core's checkpointed MLP (recompute_modules mlp / shared_experts) runs
            # its forward again, its blocking TP collectives included
            rerun_tp = tp_forward_steps(
                forward_s=0.0,
                num_layers=num_layers,
                tp_bytes=costs.tp_bytes,
                tp=parallel.tp,
                sequence_parallel=parallel.sequence_parallel,
                per_layer=1,
                gather_bytes=costs.tp_gather_bytes,
            )
            steps = _before_bwd(steps, rerun_tp)
        if not ring:
            return steps
        return _repeat(rerun, num_layers) + _before_bwd(steps, _repeat(ring, num_layers))

    forward = tp_forward_steps(
        forward_s=_less(layer.forward_s, ring_fwd),
        num_layers=num_layers,
        tp_bytes=costs.tp_bytes,
        tp=parallel.tp,
        sequence_parallel=parallel.sequence_parallel,
        # asynchronous TP's windows are a dense layer's GEMMs: an MoE layer's collectives block
        tp_comm_overlap=parallel.tp_comm_overlap and not (moe and torch_async),
        per_layer=per_layer,
        gather_bytes=costs.tp_gather_bytes,
        shares=None if moe else costs.shares,  # the shares are a dense layer's forward
        pipeline_chunks=parallel.tp if torch_async or userbuffers else 1,
        userbuffers=userbuffers,
        # a fully recomputed layer's first forward runs without autograd
        blocking_gathers=userbuffers
        and parallel.recompute == "full"
        and TE_GATHERS_BLOCK_WITHOUT_GRAD,
    ) + _repeat(ring_fwd, num_layers)
    cp_fwd = tuple(_cp_steps(plan, costs, num_layers, "all_gather"))
    cp_bwd = tuple(_cp_steps(plan, costs, num_layers, "reduce_scatter"))
    ep_fwd: tuple[Step, ...] = ()
    ep_bwd: tuple[Step, ...] = ()
    if moe and expert_comm:
        ep_fwd = tuple(expert_steps(plan, costs, num_layers, recompute=False, backward=False))
        full = parallel.recompute == "full"
        ep_bwd = tuple(expert_steps(plan, costs, num_layers, recompute=full, backward=True))
    rec, dgrad, wgrad = layer.recompute_s, layer.backward_input_s, layer.backward_weight_s
    rec_l, dgrad_l = layer.recompute_launch_s, layer.backward_input_launch_s
    wgrad_l = layer.backward_weight_launch_s
    forward = _with_launches(forward, layer.forward_launch_s, layer.forward_s)
    return {
        # Megatron's CP exchange runs inside the attention, beside the layer's other compute
        "F": _before(forward, cp_fwd, "fwd") + ep_fwd,
        "B": _before(
            _with_launches(backward(""), rec_l + dgrad_l + wgrad_l, rec + dgrad + wgrad),
            cp_bwd,
            "bwd",
        )
        + ep_bwd,
        "Bi": _before(
            _with_launches(backward("input"), rec_l + dgrad_l, rec + dgrad), cp_bwd, "bwd"
        )
        + ep_bwd,
        "W": _with_launches(backward("weight"), wgrad_l, wgrad),
    }


def reduce_bytes_per_param(plan: Plan) -> float:
    """Bytes per parameter of the data-parallel gradient reduction: FSDP's ``reduce_dtype``
    (``fsdp_reduce_dtype``), otherwise the kind's gradient dtype."""
    return data_parallel_kind(plan.parallel).reduce_bytes_per_param(plan.parallel)


def optimizer_time_s(step: StepDescription, compute: ComputeModel, stage: int) -> float:
    """Adam over the parameters one GPU of ``stage`` updates (``StageDescription``), then the
    float8 scale precompute where weights are all-gathered in float8 (``schedules.float8``), and
    Transformer Engine's FP8 weight casts: made on a step's first micro-batch and reused, they
    are charged here once per step (``schedules.transformer_engine``); with ``bf16_weights`` the
    copies to and from the fp32 master weights (``schedules.kernels.master_copy_bytes``); on the
    Megatron stack its optimizer's other passes (``schedules.optimizer_passes``)."""
    desc = step.stages[stage]
    adam_s = compute.optimizer_step_s(
        desc.optimizer_params,
        grad_bytes_per_param=step.kind.grad_bytes(step.plan.parallel),
        adam_bytes_per_param=adam_traffic_bytes(step.plan),
    )
    num_layers = sum(chunk.num_layers for chunk in desc.chunks)
    precompute = scale_precompute_bytes(
        step.plan,
        num_layers=num_layers,
        params=desc.params,
        optimizer_params=desc.optimizer_params,
    )
    copies = weight_cast_bytes_per_step(step.plan, num_layers, desc.optimizer_params)
    copies += master_copy_bytes(step.plan, desc.optimizer_params)
    passes = megatron_step_bytes(
        step.plan,
        optimizer_params=desc.optimizer_params,
        params=desc.params,
        grad_bytes=step.kind.grad_bytes(step.plan.parallel),
    )
    extra_s = compute.memory_time_s(precompute + passes) if precompute + passes else 0.0
    if copies:
        extra_s += compute.memory_time_s(copies, "copy")
    return adam_s + extra_s
