"""Memory of the kinds that shard parameters and gather them unit by unit (FSDP, HSDP, ZeRO-3).

One unit is one transformer layer's parameters on a GPU (an MoE layer's: its router, shared
experts and the rank's E / ep routed experts, split etp ways; the buffers are sized by the
larger kind of layer). ``reduce_bytes`` is the element size of
the gradient reduce-scatter: FSDP's ``reduce_dtype``, ZeRO-3's gradient dtype.

    unit_buffer_bytes(plan, stage, reduce_bytes=4, gathered_units=2)
"""

from __future__ import annotations

from schedules.moe import is_moe
from schedules.params import (
    PARAM_BYTES,
    layer_params_per_gpu,
    layers_per_stage,
    moe_layer_params_per_gpu,
    stage_moe_layers,
    stage_params_per_gpu,
)
from schedules.plan import Plan


def unit_params_per_gpu(plan: Plan) -> float:
    """Parameters of the largest layer unit on one GPU: a dense layer's, or an MoE layer's
    where the model has MoE layers and they are the larger."""
    layer = layer_params_per_gpu(plan.model, plan.parallel.tp)
    if not is_moe(plan.model):
        return layer
    return max(layer, moe_layer_params_per_gpu(plan.model, plan.parallel))


def unit_gradient_bytes(plan: Plan, reduce_bytes: float) -> float:
    """One unit's unsharded gradients, plus their copy in ``reduce_bytes`` when it differs."""
    return unit_params_per_gpu(plan) * (
        PARAM_BYTES + (reduce_bytes if reduce_bytes != PARAM_BYTES else 0)
    )


def pipelined_unit_bytes(plan: Plan, reduce_bytes: float) -> float:
    """Under pipelining one unit's reduce-scatter input (the rest is held unsharded)."""
    return unit_params_per_gpu(plan) * reduce_bytes


def gathered_units_bytes(plan: Plan, num_units: float) -> float:
    """``num_units`` units' gathered bf16 parameters."""
    return num_units * unit_params_per_gpu(plan) * PARAM_BYTES


def pipelined_stage_bytes(plan: Plan, stage: int, reduce_bytes: float) -> float:
    """Under pipelining the whole stage: parameters gathered from the first forward, gradients
    accumulated unsharded in ``reduce_bytes`` until the stage's ``REDUCE_GRAD``."""
    return stage_params_per_gpu(plan, stage) * (PARAM_BYTES + reduce_bytes)


def root_params_per_gpu(plan: Plan, stage: int) -> float:
    """Parameters of a stage outside its transformer layers: embedding, final norm, LM head."""
    dense = layer_params_per_gpu(plan.model, plan.parallel.tp)
    layers = layers_per_stage(plan, stage) * dense
    if is_moe(plan.model):
        moe_extra = moe_layer_params_per_gpu(plan.model, plan.parallel) - dense
        layers += stage_moe_layers(plan, stage) * moe_extra
    return stage_params_per_gpu(plan, stage) - layers
