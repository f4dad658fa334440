"""Per-micro-batch costs and pass recipes every replayed rank is built from.

The compute model gives per-layer, embedding and head times; ``schedules`` gives message sizes and
parameter counts; this module turns them into the forward/backward recipes of a model chunk (TP/SP
and CP collectives in place, embedding and head work on the first and last virtual stage), the
parameters of a chunk, the optimizer time and the step-end gradient-norm group.

    recipes = layer_recipes(plan, step_costs(plan, compute), num_layers=4)
"""

from __future__ import annotations

from dataclasses import dataclass

from schedules.actions import (
    CommStep,
    ComputeStep,
    LinearShares,
    Step,
    tp_backward_steps,
    tp_forward_steps,
)
from schedules.activations import ACTIVATION_BYTES
from schedules.arithmetic import (
    cp_kv_message_bytes,
    pp_message_bytes,
    tp_message_bytes,
)
from schedules.data_parallel.registry import data_parallel_kind
from schedules.kernels import kernel_stack, weight_gemm_shapes
from schedules.moe import dispatch_bytes, expert_tokens, is_moe
from schedules.plan import Plan
from schedules.step import StepDescription
from sim.compute.compute_model import ComputeModel, LayerTimes


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
    cp_bytes: float
    """One CP ring step's K and V."""
    p2p_bytes: float
    """One pipeline send."""
    moe_layer: LayerTimes | None = None
    """One MoE layer on the busiest GPU (None for a dense model)."""
    dispatch_bytes: float = 0.0
    """One MoE token dispatch (or combine) message per GPU."""
    expert_tp_bytes: float = 0.0
    """The all-gather (reduce-scatter) of the dispatched tokens over expert TP (etp > 1)."""


def step_costs(plan: Plan, compute: ComputeModel) -> StepCosts:
    """Times from the compute model and sizes from ``schedules`` for one micro-batch."""
    model, parallel, b = plan.model, plan.parallel, plan.training.micro_batch_size
    dtype = "fp8" if plan.training.precision == "fp8" else "bf16"
    wgrad = [compute.gemm_time_s(k, n, m, dtype) for m, n, k in weight_gemm_shapes(plan)]
    total = sum(wgrad) or 1.0
    moe_layer, dispatch, expert_tp = None, 0.0, 0.0
    if is_moe(model):
        moe_layer, dispatch = compute.moe_layer_times(plan), dispatch_bytes(plan)
        if parallel.expert_tp > 1:
            expert_tp = expert_tokens(plan) * model.hidden_size * ACTIVATION_BYTES
    return StepCosts(
        layer=compute.layer_times(plan),
        embed=compute.embedding_times(plan),
        head=compute.head_times(plan),
        shares=LinearShares(qkv=wgrad[0] / total, fc1=wgrad[2] / total),
        tp_bytes=tp_message_bytes(model, b, cp=parallel.cp),
        cp_bytes=cp_kv_message_bytes(model, b, tp=parallel.tp, cp=parallel.cp),
        p2p_bytes=pp_message_bytes(
            model, b, tp=parallel.tp, cp=parallel.cp, sequence_parallel=parallel.sequence_parallel
        ),
        moe_layer=moe_layer,
        dispatch_bytes=dispatch,
        expert_tp_bytes=expert_tp,
    )


def _cp_steps(plan: Plan, costs: StepCosts, num_layers: int, op: str) -> list[Step]:
    """Ring attention's K/V exchange per layer, overlapped with the attention compute."""
    cp = plan.parallel.cp
    if cp == 1:
        return []
    size = costs.cp_bytes * cp
    return [
        CommStep(
            name=f"{op} kv", group="cp", op=op, size_bytes=size, repeat=num_layers, overlap=True
        )
    ]


def pass_extras(plan: Plan, costs: StepCosts, *, first: bool, last: bool) -> dict[str, list[Step]]:
    """Embedding and head work (with their TP collectives) of the first and last virtual stage."""
    tp, sp, size = plan.parallel.tp, plan.parallel.sequence_parallel, costs.tp_bytes
    out: dict[str, list[Step]] = {"fwd_pre": [], "fwd_post": [], "bwd_pre": [], "bwd_post": []}
    if first:
        out["fwd_pre"].append(ComputeStep(name="embed", duration_s=costs.embed.forward_s))
        if tp > 1:
            op = "reduce_scatter" if sp else "all_reduce"
            out["fwd_pre"].append(CommStep(name=f"embed {op}", group="tp", op=op, size_bytes=size))
        out["bwd_post"].append(ComputeStep(name="embed bwd", duration_s=costs.embed.backward_s))
    if last:
        if tp > 1 and sp:
            out["fwd_post"].append(
                CommStep(name="head all_gather", group="tp", op="all_gather", size_bytes=size)
            )
        head = costs.head
        out["fwd_post"].append(ComputeStep(name="head", duration_s=head.forward_s))
        out["bwd_pre"].append(ComputeStep(name="head bwd", duration_s=head.backward_s))
        if tp > 1:
            op = "reduce_scatter" if sp else "all_reduce"
            out["bwd_pre"].append(CommStep(name=f"head {op}", group="tp", op=op, size_bytes=size))
    return out


def layer_recipes(
    plan: Plan, costs: StepCosts, num_layers: int, num_moe: int = 0
) -> dict[str, tuple[Step, ...]]:
    """Forward, backward, Bi and W recipes of ``num_layers`` consecutive layers, ``num_moe`` of
    them MoE layers (their recipes follow the dense ones': the layers are aggregated)."""
    dense = _uniform_recipes(plan, costs, num_layers - num_moe)
    if not num_moe:
        return dense
    moe = _uniform_recipes(plan, costs, num_moe, moe=True)
    return {key: dense[key] + moe[key] for key in dense}


def _ep_steps(plan: Plan, costs: StepCosts, num_layers: int, *, recompute: bool) -> list[Step]:
    """The token dispatch and combine of ``num_layers`` MoE layers in one pass (blocking, as
    Megatron-Core runs them), with the expert-TP gather and scatter when etp > 1; twice with
    full recompute (the recomputed forward dispatches again)."""
    parallel, passes = plan.parallel, 2 if recompute else 1
    size, n = costs.dispatch_bytes, num_layers * passes
    if parallel.moe_token_dispatcher == "allgather":
        return [
            CommStep(
                name="moe all_gather", group="tpep", op="all_gather", size_bytes=size, repeat=n
            ),
            CommStep(
                name="moe reduce_scatter",
                group="tpep",
                op="reduce_scatter",
                size_bytes=size,
                repeat=n,
            ),
        ]
    steps: list[Step] = [
        CommStep(name="moe dispatch", group="ep", op="all_to_all", size_bytes=size, repeat=n)
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


def _uniform_recipes(
    plan: Plan, costs: StepCosts, num_layers: int, *, moe: bool = False
) -> dict[str, tuple[Step, ...]]:
    """Recipes of ``num_layers`` identical layers (dense, or MoE with their dispatch)."""
    parallel = plan.parallel
    layer = costs.moe_layer if moe and costs.moe_layer is not None else costs.layer
    per_layer = 1 if moe and not plan.model.moe_shared_expert_ffn_hidden_size else 2
    if num_layers == 0:
        return {"F": (), "B": (), "Bi": (), "W": ()}

    def backward(split: str) -> tuple[Step, ...]:
        return tp_backward_steps(
            backward_input_s=layer.backward_input_s,
            backward_weight_s=layer.backward_weight_s,
            recompute_s=layer.recompute_s,
            num_layers=num_layers,
            tp_bytes=costs.tp_bytes,
            shares=costs.shares,
            tp=parallel.tp,
            sequence_parallel=parallel.sequence_parallel,
            full_recompute=parallel.recompute == "full",
            split=split,
            per_layer=per_layer,
            dtensor=kernel_stack(plan) != "megatron" and not parallel.tp_comm_overlap,
            regather=parallel.recompute == "op",
        )

    forward = tp_forward_steps(
        forward_s=layer.forward_s,
        num_layers=num_layers,
        tp_bytes=costs.tp_bytes,
        tp=parallel.tp,
        sequence_parallel=parallel.sequence_parallel,
        tp_comm_overlap=parallel.tp_comm_overlap,
        per_layer=per_layer,
    )
    cp_fwd = tuple(_cp_steps(plan, costs, num_layers, "all_gather"))
    cp_bwd = tuple(_cp_steps(plan, costs, num_layers, "reduce_scatter"))
    ep_fwd: tuple[Step, ...] = ()
    ep_bwd: tuple[Step, ...] = ()
    if moe:
        ep_fwd = tuple(_ep_steps(plan, costs, num_layers, recompute=False))
        full = parallel.recompute == "full"
        ep_bwd = tuple(_ep_steps(plan, costs, num_layers, recompute=full))
    return {
        "F": cp_fwd + forward + ep_fwd,
        "B": cp_bwd + backward("") + ep_bwd,
        "Bi": cp_bwd + backward("input") + ep_bwd,
        "W": backward("weight"),
    }


def reduce_bytes_per_param(plan: Plan) -> float:
    """Bytes per parameter of the data-parallel gradient reduction: FSDP's ``reduce_dtype``
    (``fsdp_reduce_dtype``), otherwise the kind's gradient dtype."""
    return data_parallel_kind(plan.parallel).reduce_bytes_per_param(plan.parallel)


def optimizer_time_s(step: StepDescription, compute: ComputeModel, stage: int) -> float:
    """Adam over the parameters one GPU of ``stage`` updates (``StageDescription``)."""
    return compute.optimizer_step_s(
        step.stages[stage].optimizer_params, grad_bytes_per_param=step.kind.grad_bytes_per_param
    )
