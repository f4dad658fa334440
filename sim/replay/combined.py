"""The recipe of one combined forward-and-backward pass (Megatron-Core's EP all-to-all overlap).

Under ``parallel.overlap_moe_expert_parallel_comm`` a steady-state pass runs one micro-batch's
forward through a model chunk and another's backward through a chunk of the same rank, layer by
layer (``schedules.pipeline_schedules.a2a_overlap``). Megatron-Core splits each layer at its
token dispatch (``TransformerLayerSchedulePlan.run``, ``model_chunk_schedule_plan.py``) and
pairs forward layer i with the backward's i-th layer from the end:

    comm stream:  combine bwd   | dispatch fwd -> dispatch bwd  | combine fwd
    comp stream:  attention fwd | experts bwd + dW -> experts fwd | attention bwd

so each all-to-all runs beside the other pass's compute and the next compute that needs it
waits (``CommStep.overlap``). A dense layer splits the same way (attention, then its MLP) with
nothing to dispatch. A multi-token-prediction depth is one more layer of the last chunk
(Megatron builds its schedule plan as a layer's): its projection runs before its layer's
attention, its head and loss after its layer (``mtp_post_process``) and, backward, first.
Before the layers: the forward's embedding and the backward's head; after them: the layers one
pass has more of, unpaired (the backward's first), then the forward's head and the backward's
embedding. The dispatch's token counts (gathered over expert TP x EP) block before the forward's
dispatch; the host waits on them after it has queued the backward's experts, so the GPU does
not idle and the sync is not priced here. With expert tensor parallelism the expert-TP gather
and scatter block around each expert half, as Megatron runs them in that step.

Simplified: each half layer's compute is one step, its tensor-parallel collectives around it
(before its compute those before in the layer's recipe, after it the rest, each keeping whether
it overlaps); a layer splits at the time share of its kernels
(``ComputeModel.layer_halves_times``), so a TP collective falls in the half its place in the
recipe gives. With ``delay_wgrad_compute`` an expert half's weight gradients leave it and run
beside the dispatch's backward all-to-all, joined to the forward's expert half in one step.

    steps = combined_recipe(plan, f_costs, b_costs, forward_chunk, backward_chunk)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from schedules.actions import CommStep, ComputeStep, HostStep, Step
from schedules.moe import count_moe_layers
from schedules.mtp import mtp_depths, mtp_layer_is_moe
from schedules.pipeline_program import COMBINED_BACKWARD_PREFIX
from schedules.plan import Plan
from schedules.stages import chunk_first_layer
from schedules.step import ChunkDescription
from sim.replay.recipes import (
    StepCosts,
    dispatch_counts,
    mtp_layer_costs,
    mtp_parts,
    pass_extras,
    uniform_recipes,
)

FORWARD_PREFIX = "f "
"""Name prefix of a combined pass's forward compute steps."""
BACKWARD_PREFIX = COMBINED_BACKWARD_PREFIX
"""Name prefix of its backward compute steps (the gradient-bucket marks follow these)."""


Pieces = tuple[Step, ...]
LayerPieces = tuple[Pieces, Pieces, Pieces, Pieces, Pieces]
"""A layer's five pieces in the combined pass (``_forward_layer``, ``_backward_layer``)."""


@dataclass(frozen=True, slots=True)
class _Layer:
    """One layer of a chunk as the combined pass sees it."""

    moe: bool
    """An MoE layer (it has all-to-alls)."""
    mtp: bool = False
    """A multi-token-prediction depth's layer (with its projection and head)."""


def _compute_s(steps: tuple[Step, ...]) -> float:
    return sum(s.duration_s for s in steps if isinstance(s, ComputeStep))


def split_at(steps: tuple[Step, ...], seconds: float) -> tuple[tuple[Step, ...], tuple[Step, ...]]:
    """``steps`` cut after ``seconds`` of their compute: a compute step across the cut is split
    (with its share of launch time); other steps go with the compute they follow."""
    head: list[Step] = []
    tail: list[Step] = []
    done = 0.0
    for step in steps:
        if tail or (isinstance(step, ComputeStep) and done >= seconds):
            tail.append(step)
        elif not isinstance(step, ComputeStep):
            head.append(step)
        elif done + step.duration_s <= seconds:
            head.append(step)
            done += step.duration_s
        else:
            first = step.part(seconds - done)
            head.append(first)
            rest = step.duration_s - first.duration_s
            tail.append(replace(step, duration_s=rest, launch_s=step.launch_s - first.launch_s))
            done = seconds
    return tuple(head), tuple(tail)


def collapsed(steps: tuple[Step, ...], name: str) -> tuple[Step, ...]:
    """``steps`` as one compute step (``name``) with their collectives around it: those before
    the first compute lead, the rest follow (a half layer of the combined pass)."""
    first = next((i for i, s in enumerate(steps) if isinstance(s, ComputeStep)), len(steps))
    computes = [s for s in steps if isinstance(s, ComputeStep)]
    compute = ComputeStep(
        name=name,
        duration_s=sum(s.duration_s for s in computes),
        launch_s=sum(s.launch_s for s in computes),
    )
    lead = [s for s in steps[:first] if isinstance(s, CommStep | HostStep)]
    tail = [s for s in steps[first:] if isinstance(s, CommStep | HostStep)]
    return (*lead, compute, *tail)


def _halves(
    plan: Plan, costs: StepCosts, *, moe: bool, backward: bool
) -> tuple[tuple[Step, ...], tuple[Step, ...]]:
    """One layer's recipe without its all-to-alls, as the two halves the combined pass runs:
    forward (attention side, MLP or experts); backward (MLP or experts, attention side)."""
    recipe = uniform_recipes(plan, costs, 1, moe=moe, expert_comm=False)["B" if backward else "F"]
    prefix = BACKWARD_PREFIX if backward else FORWARD_PREFIX
    halves = costs.moe_halves if moe else costs.dense_halves
    if halves is None:
        raise ValueError("a combined pass needs the layers' halves (StepCosts.moe_halves)")
    attention, mlp = halves
    total = _compute_s(recipe)
    if backward:
        mlp_s = mlp.backward_s + mlp.recompute_s
        whole_s = mlp_s + attention.backward_s + attention.recompute_s
        first, second = split_at(recipe, total * mlp_s / whole_s if whole_s else 0.0)
        return collapsed(first, f"{prefix}mlp"), collapsed(second, f"{prefix}attention")
    whole_s = attention.forward_s + mlp.forward_s
    first, second = split_at(recipe, total * attention.forward_s / whole_s if whole_s else 0.0)
    return collapsed(first, f"{prefix}attention"), collapsed(second, f"{prefix}mlp")


def _expert_comms(
    plan: Plan, costs: StepCosts, *, backward: bool
) -> tuple[tuple[Step, ...], tuple[Step, ...]]:
    """A layer's two all-to-alls on the communication stream, overlapped: forward (the token
    counts' gather, blocking, then the dispatch; the combine), backward (the combine's
    gradient; the dispatch's)."""
    size = costs.dispatch_bytes

    def a2a(name: str) -> CommStep:
        return CommStep(name=name, group="ep", op="all_to_all", size_bytes=size, overlap=True)

    if backward:
        return (a2a("moe combine bwd"),), (a2a("moe dispatch bwd"),)
    # the counts' gather, not the host's wait on them (it waits with the other pass queued)
    counts = tuple(s for s in dispatch_counts(plan, costs, 1) if isinstance(s, CommStep))
    return (*counts, a2a("moe dispatch")), (a2a("moe combine"),)


def _expert_tp(costs: StepCosts, steps: tuple[Step, ...]) -> tuple[Step, ...]:
    """An expert half with its expert-TP gather before and scatter after (etp > 1)."""
    if not costs.expert_tp_bytes:
        return steps
    size = costs.expert_tp_bytes
    return (
        CommStep(name="moe etp all_gather", group="etp", op="all_gather", size_bytes=size),
        *steps,
        CommStep(name="moe etp reduce_scatter", group="etp", op="reduce_scatter", size_bytes=size),
    )


def _forward_layer(
    plan: Plan, costs: StepCosts, layer: _Layer
) -> tuple[
    tuple[Step, ...], tuple[Step, ...], tuple[Step, ...], tuple[Step, ...], tuple[Step, ...]
]:
    """(attention half, dispatch, MLP half, combine, after) of a forward layer."""
    run_plan, run_costs = mtp_layer_costs(plan, costs) if layer.mtp else (plan, costs)
    pre, mlp = _halves(run_plan, run_costs, moe=layer.moe, backward=False)
    dispatch, combine = (
        _expert_comms(run_plan, run_costs, backward=False) if layer.moe else ((), ())
    )
    mlp = _expert_tp(run_costs, mlp) if layer.moe else mlp
    after: tuple[Step, ...] = ()
    parts = mtp_parts(plan, costs) if layer.mtp else None
    if parts is not None:  # the projection and the attention: one step beside the combine
        pre, after = collapsed((*parts.forward, *pre), "mtp attention"), parts.head_forward
    prefix = FORWARD_PREFIX
    return _named(pre, prefix), dispatch, _named(mlp, prefix), combine, _named(after, prefix)


def _backward_layer(
    plan: Plan, costs: StepCosts, layer: _Layer
) -> tuple[
    tuple[Step, ...], tuple[Step, ...], tuple[Step, ...], tuple[Step, ...], tuple[Step, ...]
]:
    """(before, combine's gradient, MLP half, dispatch's gradient, attention half) of a
    backward layer."""
    run_plan, run_costs = mtp_layer_costs(plan, costs) if layer.mtp else (plan, costs)
    mlp, pre = _halves(run_plan, run_costs, moe=layer.moe, backward=True)
    combine, dispatch = _expert_comms(run_plan, run_costs, backward=True) if layer.moe else ((), ())
    mlp = _expert_tp(run_costs, mlp) if layer.moe else mlp
    before: tuple[Step, ...] = ()
    parts = mtp_parts(plan, costs) if layer.mtp else None
    if parts is not None:
        before = (*parts.head_backward, *parts.rerun)
        pre = collapsed((*pre, *parts.backward_input, *parts.backward_weight), "mtp attention")
    prefix = BACKWARD_PREFIX
    return _named(before, prefix), combine, _named(mlp, prefix), dispatch, _named(pre, prefix)


def _delayed_weight(mlp: Pieces, costs: StepCosts) -> tuple[Pieces, Pieces]:
    """A backward expert half without its weight gradients, and those (``delay_wgrad_compute``):
    its compute split at the weight gradients' share of the experts' time."""
    assert costs.moe_halves is not None
    _, experts = costs.moe_halves
    whole_s = experts.backward_s + experts.recompute_s
    share = experts.backward_weight_s / whole_s if whole_s else 0.0
    index = next(i for i, s in enumerate(mlp) if isinstance(s, ComputeStep))
    compute = mlp[index]
    assert isinstance(compute, ComputeStep)
    dgrad = compute.part(compute.duration_s * (1.0 - share))
    weight = ComputeStep(
        name=f"{BACKWARD_PREFIX}mlp dW",
        duration_s=compute.duration_s - dgrad.duration_s,
        launch_s=compute.launch_s - dgrad.launch_s,
    )
    return (*mlp[:index], dgrad, *mlp[index + 1 :]), (weight,)


def _layers(plan: Plan, chunk: ChunkDescription) -> list[_Layer]:
    """A chunk's layers in forward order, with its multi-token-prediction depths last."""
    first = chunk_first_layer(plan.parallel, plan.model.num_layers, chunk.vstage)
    layers = [
        _Layer(moe=count_moe_layers(plan.model, start=first + i, count=1) == 1)
        for i in range(chunk.num_layers)
    ]
    if chunk.last:
        depth = _Layer(moe=mtp_layer_is_moe(plan.model), mtp=True)
        layers += [depth] * mtp_depths(plan.model)
    return layers


def _named(steps: tuple[Step, ...], prefix: str) -> tuple[Step, ...]:
    return tuple(
        replace(s, name=prefix + s.name)
        if isinstance(s, ComputeStep) and not s.name.startswith(prefix)
        else s
        for s in steps
    )


def _one(plan: Plan, costs: StepCosts, layer: _Layer, *, backward: bool) -> tuple[Step, ...]:
    """A layer of one pass alone, in the same pieces, its all-to-alls blocking (nothing runs
    beside them)."""
    if backward:
        before, combine, mlp, dispatch, pre = _backward_layer(plan, costs, layer)
        steps = (*before, *combine, *mlp, *dispatch, *pre)
    else:
        pre, dispatch, mlp, combine, after = _forward_layer(plan, costs, layer)
        steps = (*pre, *dispatch, *mlp, *combine, *after)
    return tuple(
        replace(s, overlap=False) if isinstance(s, CommStep) and s.group == "ep" else s
        for s in steps
    )


def combined_recipe(
    plan: Plan,
    f_costs: StepCosts,
    b_costs: StepCosts,
    forward: ChunkDescription,
    backward: ChunkDescription,
) -> tuple[Step, ...]:
    """One combined pass: ``forward``'s chunk forward and ``backward``'s chunk backward."""
    f_extras = pass_extras(plan, f_costs, first=forward.first, last=forward.last)
    b_extras = pass_extras(plan, b_costs, first=backward.first, last=backward.last)
    f_layers, b_layers = _layers(plan, forward), _layers(plan, backward)[::-1]
    pairs = min(len(f_layers), len(b_layers))
    steps: list[Step] = [
        *_named(tuple(f_extras["fwd_pre"]), FORWARD_PREFIX),
        *_named(tuple(b_extras["bwd_pre"]), BACKWARD_PREFIX),
    ]
    for i in range(pairs):
        f_pre, f_dispatch, f_mlp, f_combine, f_after = _forward_layer(plan, f_costs, f_layers[i])
        b_before, b_combine, b_mlp, b_dispatch, b_pre = _backward_layer(plan, b_costs, b_layers[i])
        if plan.parallel.delay_wgrad_compute and b_layers[i].moe:
            b_mlp, weight = _delayed_weight(b_mlp, b_costs)
            f_mlp = collapsed((*weight, *f_mlp), "b mlp dW, f mlp")
        steps += [
            *b_before,
            *b_combine,
            *f_pre,
            *f_dispatch,
            *b_mlp,
            *b_dispatch,
            *f_mlp,
            *f_combine,
            *b_pre,
            *f_after,
        ]
    for layer in b_layers[pairs:]:
        steps += _one(plan, b_costs, layer, backward=True)
    for layer in f_layers[pairs:]:
        steps += _one(plan, f_costs, layer, backward=False)
    steps += _named(tuple(f_extras["fwd_post"]), FORWARD_PREFIX)
    steps += _named(tuple(b_extras["bwd_post"]), BACKWARD_PREFIX)
    return tuple(steps)
