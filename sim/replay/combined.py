"""The recipe of one combined forward-and-backward pass (Megatron-Core's EP all-to-all overlap).

Under ``parallel.overlap_moe_expert_parallel_comm`` a steady-state pass runs one micro-batch's
forward through a model chunk and another's backward through a chunk of the same rank, layer by
layer (``schedules.pipeline_schedules.a2a_overlap``). Megatron-Core splits each layer at its
token dispatch (``TransformerLayerSchedulePlan.run``, ``model_chunk_schedule_plan.py``) and
pairs forward layer i with the backward's i-th layer from the end:

    comm stream:  combine bwd   | dispatch fwd -> dispatch bwd  | combine fwd
    comp stream:  attention fwd | experts bwd + dW -> experts fwd | attention bwd

so each all-to-all runs beside the other pass's compute and the next compute that needs it
waits (``CommStep.overlap``). Before the layers: the forward's embedding and the backward's head
(and multi-token prediction); after them: the layers one pass has more of, unpaired, then the
forward's head and the backward's embedding. The dispatch's token counts (gathered over expert
TP x EP) and the host synchronisation they need stay before the forward's dispatch, blocking.

Simplified: each half layer's compute is one step, its tensor-parallel collectives blocking
before or after it (on their own they overlap some weight-gradient GEMMs); the halves split the
layer's recipe at the time share of its kernels (``ComputeModel.moe_halves_times``), so a TP
collective falls in the half its place in the recipe gives; a dense layer pairs whole (it has no
all-to-all to hide); with expert tensor parallelism the expert-TP gather is not ordered after the
dispatch it follows.

    steps = combined_recipe(plan, f_costs, b_costs, forward_chunk, backward_chunk)
"""

from __future__ import annotations

from dataclasses import replace

from schedules.actions import CommStep, ComputeStep, HostStep, Step
from schedules.plan import Plan
from schedules.step import ChunkDescription
from sim.replay.recipes import (
    StepCosts,
    _ep_steps,
    _uniform_recipes,
    mtp_recipes,
    pass_extras,
)

FORWARD_PREFIX = "f "
"""Name prefix of a combined pass's forward compute steps."""
BACKWARD_PREFIX = "b "
"""Name prefix of its backward compute steps (the gradient-bucket marks follow these)."""


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
    """``steps`` as one compute step (``name``) with their collectives blocking around it: those
    before the first compute lead, the rest follow (a half layer of the combined pass)."""
    first = next((i for i, s in enumerate(steps) if isinstance(s, ComputeStep)), len(steps))

    def blocking(part: tuple[Step, ...]) -> list[Step]:
        return [
            replace(s, overlap=False) if isinstance(s, CommStep) else s
            for s in part
            if isinstance(s, CommStep | HostStep)
        ]

    computes = [s for s in steps if isinstance(s, ComputeStep)]
    compute = ComputeStep(
        name=name,
        duration_s=sum(s.duration_s for s in computes),
        launch_s=sum(s.launch_s for s in computes),
    )
    return (*blocking(steps[:first]), compute, *blocking(steps[first:]))


def _halves(
    plan: Plan, costs: StepCosts, *, moe: bool, backward: bool
) -> tuple[tuple[Step, ...], tuple[Step, ...]]:
    """One layer's recipe without its all-to-alls, as the two halves the combined pass runs:
    forward (attention side, MLP or experts); backward (MLP or experts, attention side)."""
    recipe = _uniform_recipes(plan, costs, 1, moe=moe, expert_comm=False)["B" if backward else "F"]
    prefix = BACKWARD_PREFIX if backward else FORWARD_PREFIX
    halves = costs.moe_halves if moe else costs.dense_halves
    if halves is None:
        raise ValueError(
            "a combined pass needs the layers' halves (overlap_moe_expert_parallel_comm)"
        )
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
    counts' gather and host sync blocking, then the dispatch; the combine), backward (the
    combine's gradient; the dispatch's)."""
    size = costs.dispatch_bytes
    if backward:
        return (
            (CommStep(name="moe combine bwd", group="ep", op="all_to_all", size_bytes=size,
                      overlap=True),),
            (CommStep(name="moe dispatch bwd", group="ep", op="all_to_all", size_bytes=size,
                      overlap=True),),
        )  # fmt: skip
    plain = _ep_steps(plan, costs, 1, recompute=False, backward=False)
    counts = tuple(
        s for s in plain if isinstance(s, HostStep) or "counts" in getattr(s, "name", "")
    )
    return (
        (*counts, CommStep(name="moe dispatch", group="ep", op="all_to_all", size_bytes=size,
                           overlap=True)),
        (CommStep(name="moe combine", group="ep", op="all_to_all", size_bytes=size,
                  overlap=True),),
    )  # fmt: skip


def _pair(
    plan: Plan, f_costs: StepCosts, b_costs: StepCosts, *, f_moe: bool, b_moe: bool
) -> tuple[Step, ...]:
    """Forward layer and backward layer as Megatron-Core interleaves them."""
    f_pre, f_mlp = _halves(plan, f_costs, moe=f_moe, backward=False)
    b_mlp, b_pre = _halves(plan, b_costs, moe=b_moe, backward=True)
    f_dispatch, f_combine = _expert_comms(plan, f_costs, backward=False) if f_moe else ((), ())
    b_combine, b_dispatch = _expert_comms(plan, b_costs, backward=True) if b_moe else ((), ())
    return (*b_combine, *f_pre, *f_dispatch, *b_mlp, *b_dispatch, *f_mlp, *f_combine, *b_pre)


def _kinds(chunk: ChunkDescription) -> list[bool]:
    """Whether each layer of a chunk, in forward order, is an MoE layer (dense layers first)."""
    return [False] * (chunk.num_layers - chunk.num_moe_layers) + [True] * chunk.num_moe_layers


def _named(steps: tuple[Step, ...], prefix: str) -> tuple[Step, ...]:
    return tuple(
        replace(s, name=prefix + s.name) if isinstance(s, ComputeStep) else s for s in steps
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
    none: dict[str, tuple[Step, ...]] = {"F": (), "B": ()}
    f_mtp = mtp_recipes(plan, f_costs) if forward.last else none
    b_mtp = mtp_recipes(plan, b_costs) if backward.last else none
    f_kinds, b_kinds = _kinds(forward), _kinds(backward)[::-1]
    pairs = min(len(f_kinds), len(b_kinds))
    steps: list[Step] = [
        *_named(tuple(f_extras["fwd_pre"]), FORWARD_PREFIX),
        *_named((*b_extras["bwd_pre"], *b_mtp["B"]), BACKWARD_PREFIX),
    ]
    for i in range(pairs):
        steps += _pair(plan, f_costs, b_costs, f_moe=f_kinds[i], b_moe=b_kinds[i])
    for moe in b_kinds[pairs:]:
        steps += _named(_uniform_recipes(plan, b_costs, 1, moe=moe)["B"], BACKWARD_PREFIX)
    for moe in f_kinds[pairs:]:
        steps += _named(_uniform_recipes(plan, f_costs, 1, moe=moe)["F"], FORWARD_PREFIX)
    steps += _named((*f_mtp["F"], *f_extras["fwd_post"]), FORWARD_PREFIX)
    steps += _named(tuple(b_extras["bwd_post"]), BACKWARD_PREFIX)
    return tuple(steps)
