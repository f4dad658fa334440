"""The model arithmetic in one namespace: parameters, FLOPs, activation bytes and message sizes.

Each formula lives in one function, with its derivation and reference, in the module of its
concern (``params``, ``flops``, ``activations``, ``messages``); this module gathers them so that
callers import one place.

    flops, definition = model_flops_per_step(plan)
"""

from __future__ import annotations

from schedules.activations import (
    ACTIVATION_BYTES,
    head_activation_bytes,
    in_flight_microbatches,
    layer_activation_bytes,
    logits_bytes,
    stored_layer_activations,
)
from schedules.flops import (
    FLOPS_DEFINITION,
    LayerFlops,
    attention_core_flops,
    attention_linear_flops,
    gemm_flops,
    hardware_flops_per_step,
    layer_flops,
    layer_forward_flops,
    logits_flops,
    mlp_flops,
    model_flops_per_step,
    narayanan_flops_per_iteration,
    recompute_flops,
)
from schedules.messages import (
    ACTIVATION_COMM_BYTES,
    PARAM_BYTES,
    cp_grad_message_bytes,
    cp_kv_message_bytes,
    dp_grad_bytes,
    dp_param_bytes,
    fsdp_unit_grad_bytes,
    fsdp_unit_param_bytes,
    pp_message_bytes,
    tp_branches_per_layer,
    tp_collectives_per_layer,
    tp_message_bytes,
)
from schedules.params import (
    attention_params,
    embedding_params,
    layer_params,
    layer_params_per_gpu,
    layers_per_stage,
    lm_head_params,
    megatron_gpt_params,
    mlp_params,
    norm_params,
    stage_params_per_gpu,
    total_params,
)
from schedules.pipeline_schedules.interleaved import interleaved_in_flight_chunks

__all__ = [
    "ACTIVATION_BYTES",
    "ACTIVATION_COMM_BYTES",
    "FLOPS_DEFINITION",
    "PARAM_BYTES",
    "LayerFlops",
    "attention_core_flops",
    "attention_linear_flops",
    "attention_params",
    "cp_grad_message_bytes",
    "cp_kv_message_bytes",
    "dp_grad_bytes",
    "dp_param_bytes",
    "embedding_params",
    "fsdp_unit_grad_bytes",
    "fsdp_unit_param_bytes",
    "gemm_flops",
    "hardware_flops_per_step",
    "head_activation_bytes",
    "in_flight_microbatches",
    "interleaved_in_flight_chunks",
    "layer_activation_bytes",
    "layer_flops",
    "layer_forward_flops",
    "layer_params",
    "layer_params_per_gpu",
    "layers_per_stage",
    "lm_head_params",
    "logits_bytes",
    "logits_flops",
    "megatron_gpt_params",
    "mlp_flops",
    "mlp_params",
    "model_flops_per_step",
    "narayanan_flops_per_iteration",
    "norm_params",
    "pp_message_bytes",
    "recompute_flops",
    "stage_params_per_gpu",
    "stored_layer_activations",
    "total_params",
    "tp_branches_per_layer",
    "tp_collectives_per_layer",
    "tp_message_bytes",
]
