"""The memory passes of Megatron's mixed-precision optimizer step besides Adam's kernel.

extra_bytes = megatron_step_bytes(plan, optimizer_params=p, params=q, grad_bytes=2)
"""

from __future__ import annotations

from schedules.data_parallel.registry import data_parallel_kind
from schedules.optimizer_states import FP32_GRAD_BYTES, te_master_weights
from schedules.plan import Plan
from schedules.stacks import kernel_stack

MEGATRON_STEP_PASSES = {"grad_norm": 1, "master_read": 4, "unscale_fp16": 2, "zero_grads": 1}
"""Memory passes of Megatron's mixed-precision optimizer step besides Adam's own (the
``ADAM_BYTES_PER_PARAM`` kernel, whose 26 bytes include writing the 16-bit weight), per
parameter, in bytes of the fp32 main gradient (``megatron/core/optimizer``,
``MixedPrecisionOptimizer.step`` and the distributed optimizer's): the gradient norm of
``clip_grad_norm`` reads every main gradient (1 x); ``_copy_main_params_to_model_params`` reads
the fp32 master weight (4 bytes) to write the 16-bit one; with fp16's loss scaler
``_unscale_main_grads_and_check_for_nan`` reads and writes every main gradient (2 x); the next
step's ``zero_grad_buffer`` clears the local gradient buffer (1 x its own bytes per local
parameter). Where the buffer holds 16-bit gradients, ``_copy_model_grads_to_main_grads`` first
casts them to fp32 (``main_grad.float()``: read the buffer's bytes, write 4), and Adam reads
those 4 bytes, not the buffer's. The first passes run over the parameters this GPU's optimizer
updates. Megatron's two optimizers only (``data_parallel: ddp`` and ``distributed_optimizer``):
ZeRO and FSDP run their framework's step. Where Transformer Engine's Adam holds the master
weights (the precision-aware optimizer, ``schedules.optimizer_states.te_master_weights``) it
reads the buffer's gradients and writes the weights itself: the norm and the zeroing remain."""


def megatron_step_bytes(
    plan: Plan, *, optimizer_params: float, params: float, grad_bytes: float
) -> float:
    """Bytes the Megatron stack's optimizer step moves besides Adam (``MEGATRON_STEP_PASSES``),
    ``grad_bytes`` being the gradient buffer's; 0 elsewhere."""
    megatron_optimizer = data_parallel_kind(plan.parallel).name in ("ddp", "distributed_optimizer")
    if kernel_stack(plan) != "megatron" or not megatron_optimizer:
        return 0.0
    passes, main = MEGATRON_STEP_PASSES, FP32_GRAD_BYTES
    if te_master_weights(plan):
        # Transformer Engine's Adam reads the buffer's gradients (``use_decoupled_grad``) and
        # writes the 16-bit weights itself: no fp32 copy, no master read
        return passes["grad_norm"] * grad_bytes * optimizer_params + (
            passes["zero_grads"] * grad_bytes * params
        )
    per_param: float = passes["grad_norm"] * main + passes["master_read"]
    if grad_bytes < main:  # the fp32 copy of 16-bit gradients, and Adam reads it
        per_param += grad_bytes + main + (main - grad_bytes)
    if plan.training.precision == "fp16":
        per_param += passes["unscale_fp16"] * main
    return per_param * optimizer_params + passes["zero_grads"] * grad_bytes * params
