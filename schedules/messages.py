"""Message sizes of every collective a training step issues (nccl-tests size semantics).

Sizes follow vocab.collectives: an all-reduce's buffer, an all-gather's *output* and a
reduce-scatter's *input* buffer. So every TP collective of a layer is one b(s/cp)h activation
tensor, whichever op moves it (Megatron ``layers.py``/``mappings.py``); a pipeline send is the
layer output b(s/cp)h, divided by t when sequence parallel keeps it sharded; data parallelism
reduces each GPU's gradient shard in the reduce dtype and gathers parameters in their dtype. Context
parallelism passes each rank's K and V around its ring (and, in torch's backward, their fp32
gradients).

    tp_message_bytes(plan.model, micro_batch_size=1)
"""

from __future__ import annotations

from schedules.data_parallel.registry import data_parallel_kind
from schedules.optimizer_states import gather_bytes
from schedules.params import (
    PARAM_BYTES,
    layer_params_per_gpu,
    stage_layer_params_per_gpu,
    stage_params_per_gpu,
)
from schedules.plan import ModelConfig, Plan

ACTIVATION_COMM_BYTES = 2
"""Bytes per element of TP/PP activation traffic (bf16; TE's FP8 all-gather is off by default)."""


def tp_message_bytes(model: ModelConfig, micro_batch_size: float, *, cp: int = 1) -> float:
    """One TP all-reduce (no SP), all-gather output or reduce-scatter input (SP): 2 b (s/cp) h."""
    return ACTIVATION_COMM_BYTES * micro_batch_size * model.seq_len / cp * model.hidden_size


def tp_branches_per_layer(model: ModelConfig) -> int:
    """Tensor-parallel regions one after the other in a layer, each entered with a gather (or
    nothing) and left with a reduction: attention, then the MLP (2); a parallel block's two
    branches share the gather of their one input and reduce their summed outputs once (1), as
    a block written for it does (PaLM's, MegaScale's)."""
    return 1 if model.parallel_block else 2


def tp_collectives_per_layer(
    sequence_parallel: bool, *, parallel_block: bool = False
) -> dict[str, dict[str, int]]:
    """TP collectives per layer and micro-batch, each of ``tp_message_bytes``.

    Without SP: 2 all-reduces forward (after the attention projection and the MLP down
    projection) and 2 backward (the column-parallel input gradients). With SP: forward 2
    all-gathers + 2 reduce-scatters; backward 4 all-gathers (2 gradient gathers for the
    row-parallel layers, 2 re-gathers of the saved sharded inputs) + 2 reduce-scatters
    (Megatron ``layers.py``; the textbook '2 AG + 2 RS' omits the re-gathers). Half of each in a
    ``parallel_block`` (``tp_branches_per_layer``).
    """
    n = 1 if parallel_block else 2
    if sequence_parallel:
        return {
            "forward": {"all_gather": n, "reduce_scatter": n},
            "backward": {"all_gather": 2 * n, "reduce_scatter": n},
        }
    return {"forward": {"all_reduce": n}, "backward": {"all_reduce": n}}


def pp_message_bytes(
    model: ModelConfig,
    micro_batch_size: float,
    *,
    tp: int = 1,
    cp: int = 1,
    sequence_parallel: bool = False,
) -> float:
    """One pipeline send (activation forward or its gradient backward): [s/cp (/t if SP), b, h]."""
    tokens = micro_batch_size * model.seq_len / cp / (tp if sequence_parallel else 1)
    return ACTIVATION_COMM_BYTES * tokens * model.hidden_size


def cp_kv_message_bytes(
    model: ModelConfig, micro_batch_size: float, *, tp: int, cp: int, repeat_kv: bool = False
) -> float:
    """One ring step of context-parallel attention: this rank's K and V, 2 * 2 b (s/cp) kd / t;
    with ``repeat_kv`` ad wide instead of kd (torchtitan's Llama expands K and V to every query
    head before SDPA, and torch's ring passes them on expanded)."""
    tokens = micro_batch_size * model.seq_len / cp
    width = model.q_size if repeat_kv else model.kv_size
    return 2 * ACTIVATION_COMM_BYTES * tokens * width / tp


CP_GRAD_BYTES = 4
"""Bytes per element of the dK/dV torch's ring passes on: fp32 (``convert_to_f32``)."""


def cp_grad_message_bytes(
    model: ModelConfig, micro_batch_size: float, *, tp: int, cp: int
) -> float:
    """One dK/dV ring step of torch's context-parallel backward: the fp32 gradients of the
    expanded K and V, 2 * 4 b (s/cp) h / t."""
    kv = cp_kv_message_bytes(model, micro_batch_size, tp=tp, cp=cp, repeat_kv=True)
    return kv * CP_GRAD_BYTES / ACTIVATION_COMM_BYTES


def dp_grad_bytes(plan: Plan, stage: int = 0) -> float:
    """Gradient bytes one GPU of pipeline rank ``stage`` reduces per step over DP (reduce dtype).

    The all-reduce buffer (ddp, zero1/2: DeepSpeed all-reduces whole buckets) or the
    reduce-scatter input (fsdp, zero3, distributed_optimizer) of all its parameters.
    """
    per_param = data_parallel_kind(plan.parallel).grad_bytes(plan.parallel)
    return stage_params_per_gpu(plan, stage) * per_param


def dp_param_bytes(plan: Plan, stage: int = 0) -> float:
    """Parameter bytes one GPU of pipeline rank ``stage`` all-gathers (output buffer size):
    bf16, the layers' weights FP8 with ``fp8_param_gather`` (``schedules.optimizer_states``)."""
    params = stage_params_per_gpu(plan, stage)
    return gather_bytes(plan, params, stage_layer_params_per_gpu(plan, stage))


def fsdp_unit_param_bytes(plan: Plan) -> float:
    """All-gather output of one FSDP/ZeRO-3 unit, one transformer layer on one TP rank."""
    return layer_params_per_gpu(plan.model, plan.parallel.tp) * PARAM_BYTES


def fsdp_unit_grad_bytes(plan: Plan) -> float:
    """Reduce-scatter input of one FSDP/ZeRO-3 unit, one layer's gradient in the reduce dtype."""
    per_param = data_parallel_kind(plan.parallel).grad_bytes(plan.parallel)
    return layer_params_per_gpu(plan.model, plan.parallel.tp) * per_param
