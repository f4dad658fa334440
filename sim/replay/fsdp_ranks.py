"""FSDP / HSDP / ZeRO-3 ranks: their process groups, units and step programs.

Without pipelining a plan runs FSDP1 (``FullyShardedDataParallel``, one unit per layer, root with
embedding and head) or FSDP2 (``fully_shard`` as torchtitan wraps the model: embedding, each
layer, ``[norm, output]``); under pipelining the FSDP2 units of every chunk of a stage join the
pipeline program (``schedules.fsdp_program.FsdpStages``).

    programs = fsdp2_programs(plan, costs, compute, ranks=(0, 8), gpus_per_node=8)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from schedules.actions import ChunkWork, Program, Step
from schedules.arithmetic import layer_params_per_gpu
from schedules.data_parallel.units import root_params_per_gpu
from schedules.float8 import layer_gather_bytes
from schedules.fsdp2_program import Fsdp2Rank, Fsdp2Unit, fsdp2_program
from schedules.fsdp_program import NO_WORK, FsdpRank, FsdpStages, FsdpUnits, fsdp_program
from schedules.moe import expert_params_per_gpu, is_moe, is_moe_layer, mean_hottest, with_hottest
from schedules.offload import RankOffload
from schedules.params import embedding_params_per_gpu, moe_layer_params_per_gpu
from schedules.plan import Plan
from schedules.stages import chunk_first_layer
from schedules.step import ChunkDescription, StepDescription
from sim.compute.compute_model import ComputeModel
from sim.replay.recipes import (
    StepCosts,
    layer_recipes,
    optimizer_time_s,
    pass_extras,
    step_costs,
)


def reshard_after_forward(plan: Plan) -> bool:
    """The FSDP knob; unset (None) means the framework default: True alone, False under PP
    (torchtitan: the pipeline reuses the parameters for every micro-batch)."""
    value = plan.parallel.fsdp_reshard_after_forward
    return plan.parallel.pp == 1 if value is None else bool(value)


def fsdp_groups(step: StepDescription, rank: int) -> dict[str, tuple[int, ...]]:
    """``tp``, ``cp``, ``dp`` (the FSDP shard group) and, for HSDP, ``hsdp`` (replicate).

    The shard group spans the CP ranks too, as the state is sharded over DP x CP: torchtitan
    applies ``fully_shard`` on its ``dp_shard_cp`` mesh (HSDP: ``("dp_replicate",
    "dp_shard_cp")``), so parameters are gathered from, and gradients reduce-scattered over,
    every rank of it; each CP rank's gradients cover its own tokens only. An MoE model's ranks
    also have ``ep``, ``etp``, ``tpep`` (its recipes' token exchange) and ``edp``, the routed
    experts' shard group under expert parallelism (torchtitan's ``edp_mesh``)."""
    par, layout = step.plan.parallel, step.layout
    groups = {"tp": layout.group("tp", rank), "cp": layout.group("cp", rank)}
    shard = step.replica_group_size // par.cp
    if shard < par.dp:  # HSDP: FSDP inside shard groups, replicas across them
        groups["dp"] = layout.group("dpcp_shard", rank, shard_size=shard)
        groups["hsdp"] = layout.group("dp_replicate", rank, shard_size=shard)
    else:
        groups["dp"] = layout.group("dpcp", rank)
    if is_moe(step.plan.model):
        groups.update({g: layout.group(g, rank) for g in ("ep", "etp", "edp", "tpep")})
    return groups


def host_copies(step: StepDescription, groups: dict[str, tuple[int, ...]]) -> RankOffload | None:
    """The FSDP CPU offload of a rank (None: none), its copies sized as the shards of the group
    its units are gathered over."""
    offload = step.stages[0].offload
    if offload is None:
        return None
    return dataclasses.replace(offload, shards=len(groups.get("dp", ())) or 1)


def sharded_groups(step: StepDescription, rank: int, *extra: str) -> dict[str, tuple[int, ...]]:
    """``fsdp_groups`` plus the named layout groups (step-end norm group, ``mp``), when given."""
    groups = fsdp_groups(step, rank)
    groups.update({name: step.layout.group(name, rank) for name in extra if name})
    return groups


def fsdp_stages(
    step: StepDescription,
    costs: StepCosts,
    stage: int,
    chunk_costs: Callable[[ChunkDescription], StepCosts] | None = None,
) -> FsdpStages:
    """The FSDP2 units of every chunk of pipeline rank ``stage`` (one unit per layer + root). An
    MoE layer is a unit of its own kind (``FsdpUnits.moe_units``): its recipes at the chunk's
    costs (``chunk_costs``: a per-layer imbalance what-if's mean over the chunk), its routed
    experts under expert parallelism gathered and reduced over ``edp``."""
    plan = step.plan
    par, model = plan.parallel, plan.model
    layer = _layer_work(layer_recipes(plan, costs, 1))
    per_param = step.reduce_bytes_per_param
    unit_params = layer_params_per_gpu(model, par.tp)
    moe_params, experts = moe_unit_params(plan)
    chunks = []
    for chunk in step.stages[stage].chunks:
        num_units = chunk.num_layers
        x = pass_extras(plan, costs, first=chunk.first, last=chunk.last)
        root_params = chunk.params - unit_params * num_units
        root_params -= (moe_params - unit_params) * chunk.num_moe_layers
        first = chunk_first_layer(par, model.num_layers, chunk.vstage)
        moe_units = frozenset(u for u in range(num_units) if is_moe_layer(model, first + u))
        moe_layer = NO_WORK
        if moe_units:  # at the chunk's mean busiest-expert factor, as its pipeline work
            variant = with_hottest(plan, chunk.moe_hottest)
            moe_costs = costs if chunk_costs is None else chunk_costs(chunk)
            moe_layer = _layer_work(layer_recipes(variant, moe_costs, 1, 1))
        chunks.append(
            FsdpUnits(
                num_units=num_units,
                layer=layer,
                unit_param_bytes=layer_gather_bytes(plan),
                unit_grad_bytes=unit_params * per_param,
                root_param_bytes=root_params * 2.0,
                root_grad_bytes=root_params * per_param,
                embed=_extra_work(x["fwd_pre"], x["bwd_post"]),
                head=_extra_work(x["fwd_post"], x["bwd_pre"]),
                moe_units=moe_units,
                moe_layer=moe_layer,
                moe_param_bytes=(moe_params - experts) * 2.0,
                moe_grad_bytes=(moe_params - experts) * per_param,
                expert_param_bytes=experts * 2.0,
                expert_grad_bytes=experts * per_param,
            )
        )
    return FsdpStages(
        chunks=tuple(chunks),
        reshard_after_forward=reshard_after_forward(plan),
        reduce_before_send=par.fsdp_pp_reduce == "before_send",
    )


def moe_unit_params(plan: Plan) -> tuple[float, float]:
    """An MoE layer unit's parameters on one GPU (a dense layer's for a dense model), and of
    those the routed experts that expert parallelism shards over ``edp`` instead of the unit's
    group (0 without it: they are gathered with the rest)."""
    model, par = plan.model, plan.parallel
    if not is_moe(model):
        return layer_params_per_gpu(model, par.tp), 0.0
    experts = expert_params_per_gpu(model, par) if par.ep > 1 else 0.0
    return moe_layer_params_per_gpu(model, par), experts


def _layer_work(recipes: dict[str, tuple[Step, ...]]) -> ChunkWork:
    """One layer's pass recipes as its ``ChunkWork``."""
    return ChunkWork(
        forward=recipes["F"],
        backward=recipes["B"],
        backward_input=recipes["Bi"],
        backward_weight=recipes["W"],
    )


def _extra_work(forward: list[Step], backward: list[Step]) -> ChunkWork:
    return ChunkWork(
        forward=tuple(forward), backward=tuple(backward), backward_input=tuple(backward)
    )


def fsdp_programs(
    step: StepDescription, costs: StepCosts, compute: ComputeModel, ranks: tuple[int, ...]
) -> list[Program]:
    """Programs of ``ranks`` for an FSDP1 / HSDP plan without pipelining."""
    plan = step.plan
    par = plan.parallel
    recipes = layer_recipes(plan, costs, 1)
    x = pass_extras(plan, costs, first=True, last=True)
    per_param = step.reduce_bytes_per_param
    unit_params = layer_params_per_gpu(plan.model, par.tp)
    root_params = step.stages[0].params - unit_params * plan.model.num_layers
    units = FsdpUnits(
        num_units=plan.model.num_layers,
        layer=ChunkWork(forward=recipes["F"], backward=recipes["B"]),
        unit_param_bytes=unit_params * 2.0,
        unit_grad_bytes=unit_params * per_param,
        root_param_bytes=root_params * 2.0,
        root_grad_bytes=root_params * per_param,
        embed=ChunkWork(forward=tuple(x["fwd_pre"]), backward=tuple(x["bwd_post"])),
        head=ChunkWork(forward=tuple(x["fwd_post"]), backward=tuple(x["bwd_pre"])),
    )
    norm_group = step.grad_norm_group
    programs = []
    for rank in ranks:
        groups = sharded_groups(step, rank, norm_group)
        spec = FsdpRank(
            rank=rank,
            num_microbatches=step.num_microbatches,
            units=units,
            groups=groups,
            backward_prefetch=par.fsdp_backward_prefetch,
            limit_all_gathers=par.fsdp_limit_all_gathers,
            reshard_after_forward=reshard_after_forward(plan),
            forward_prefetch=par.fsdp_forward_prefetch,
            grad_norm_group=norm_group,
            optimizer_s=optimizer_time_s(step, compute, 0),
            offload=host_copies(step, groups),
        )
        programs.append(fsdp_program(spec))
    return programs


def fsdp2_units(
    step: StepDescription, costs: StepCosts, compute: ComputeModel
) -> tuple[Fsdp2Unit, ...]:
    """torchtitan's units: the embedding, every layer, then ``[norm, output]``.

    ``[norm, output]`` keeps its parameters after forward unless ``fsdp_reshard_after_forward``
    is set True (torchtitan's ``reshard_after_forward_policy = "always"``). An MoE layer is one
    unit with its router and shared experts; under expert parallelism its routed experts are
    sharded over ``edp`` instead of the unit's group (torchtitan's ``apply_fsdp``: a per-parameter
    mesh, or the experts as their own ``fully_shard`` prefetched with the layer), so they are
    gathered and reduced by collectives of their own.
    """
    plan = step.plan
    par, model = plan.parallel, plan.model
    dense_recipes = layer_recipes(plan, costs, 1)
    moe_recipes = layer_recipes(plan, costs, 1, 1) if is_moe(model) else dense_recipes
    x = pass_extras(plan, costs, first=True, last=True)
    reduce_bytes = step.reduce_bytes_per_param
    layer = layer_params_per_gpu(model, par.tp)
    moe_layer, experts = moe_unit_params(plan)
    root = root_params_per_gpu(plan, 0)
    embed = min(root, embedding_params_per_gpu(model, par.tp))
    layers_reshard = reshard_after_forward(plan)
    layer_gather = layer_gather_bytes(plan)

    def unit(
        name: str,
        params: float,
        fwd: list[Step] | tuple[Step, ...],
        bwd: list[Step] | tuple[Step, ...],
        reshard: bool,
        gathered: float | None = None,
        expert_params: float = 0.0,
    ) -> Fsdp2Unit:
        gathered = params * 2.0 if gathered is None else gathered  # float8 all-gather: less
        return Fsdp2Unit(
            name=name,
            param_bytes=gathered,
            grad_bytes=params * reduce_bytes,
            forward=tuple(fwd),
            backward=tuple(bwd),
            copy_out_s=compute.memory_time_s(2.0 * (gathered + expert_params * 2.0)),
            copy_in_s=compute.memory_time_s((2.0 + reduce_bytes) * (params + expert_params)),
            reshard_after_forward=reshard,
            expert_param_bytes=expert_params * 2.0,
            expert_grad_bytes=expert_params * reduce_bytes,
        )

    priced: dict[float, dict[str, tuple[Step, ...]]] = {}

    def layer_moe_recipes(i: int) -> dict[str, tuple[Step, ...]]:
        """The MoE layer's recipes at its own busiest-expert factor where a what-if sets one."""
        hottest = mean_hottest(plan, (i,))
        if hottest is None:
            return moe_recipes
        if hottest not in priced:
            variant = with_hottest(plan, hottest)
            priced[hottest] = layer_recipes(variant, step_costs(variant, compute), 1, 1)
        return priced[hottest]

    def layer_unit(i: int) -> Fsdp2Unit:
        if not is_moe_layer(model, i):
            return unit(f"L{i}", layer, dense_recipes["F"], dense_recipes["B"], layers_reshard,
                        layer_gather)  # fmt: skip
        recipes = layer_moe_recipes(i)
        return unit(f"L{i}", moe_layer - experts, recipes["F"], recipes["B"], layers_reshard,
                    expert_params=experts)  # fmt: skip

    return (
        unit("embed", embed, x["fwd_pre"], x["bwd_post"], layers_reshard),
        *(layer_unit(i) for i in range(model.num_layers)),
        unit(
            "head",
            root - embed,
            x["fwd_post"],
            x["bwd_pre"],
            par.fsdp_reshard_after_forward is True,
        ),
    )


def fsdp2_programs(
    step: StepDescription, costs: StepCosts, compute: ComputeModel, ranks: tuple[int, ...]
) -> list[Program]:
    """Programs of ``ranks`` for an FSDP2 / HSDP-over-FSDP2 plan without pipelining."""
    units = fsdp2_units(step, costs, compute)
    norm_group = step.grad_norm_group
    programs = []
    for rank in ranks:
        groups = sharded_groups(step, rank, norm_group)
        spec = Fsdp2Rank(
            rank=rank,
            num_microbatches=step.num_microbatches,
            units=units,
            groups=groups,
            grad_norm_group=norm_group,
            optimizer_s=optimizer_time_s(step, compute, 0),
            offload=host_copies(step, groups),
        )
        programs.append(fsdp2_program(spec))
    return programs
