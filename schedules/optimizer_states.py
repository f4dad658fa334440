"""What Megatron's distributed optimizer keeps and moves per parameter: gradient buffer, master
weights, Adam's moments, and the weights it all-gathers.

Read in Megatron-Core (``optimizer/__init__.py``, ``optimizer/distrib_optimizer.py``,
``optimizer/optimizer_config.py``, ``training/arguments.py``) and Transformer Engine's
``FusedAdam``:

- **Gradients** (``parallel.grad_reduce_in_fp32``): the DDP gradient buffer, which the
  distributed optimizer reduce-scatters, is fp32 (4 bytes) when ``grad_reduce_in_fp32`` is set,
  else the weights' bf16 (2). Megatron-LM sets it for bf16 training unless
  ``--grad-reduce-in-bf16`` or ``--main-grads-dtype bf16``; Megatron-Bridge's ``bf16_mixed``
  sets it and its performance recipes of 2026 clear it.
- **Adam's state** (``parallel.use_precision_aware_optimizer``): without the flag, an fp32
  master copy and two fp32 moments (12 bytes, the ZeRO paper's K). With it the moments are
  stored in ``exp_avg_dtype`` and ``exp_avg_sq_dtype`` (fp32 4, fp16 or bf16 2, fp8 1), and the
  master weights are Transformer Engine's (``master_weights=True``) unless the weights are FP8
  with a per-tensor current-scaling recipe and ``main_params_dtype`` is fp32
  (``use_precision_aware_optimizer_no_fp8_or_ds_fp8``: then Megatron keeps its own fp32 copy,
  4 bytes). Transformer Engine stores an fp32 master of a bf16 weight as the 16 bits it adds
  (``store_param_remainders``, on by default from TE 2.1: an int16 shard), an fp16 master in 2.
- **FP8 weights** (``training.fp8_param_gather``): the transformer layers' weights are FP8
  tensors (1 byte, their transpose another, ``schedules.memory.FP8_CACHE_BYTES_PER_PARAM``)
  with no bf16 copy; the parameter all-gather moves them at 1 byte. The embedding, the final
  norm, the LM head and the multi-token-prediction depths' embedding and projections stay
  bf16 (counted with the rest of a chunk's non-layer parameters; the depths' own layer too,
  a simplification).

    grad_bytes(plan.parallel); optimizer_bytes_per_param(plan); adam_traffic_bytes(plan)
"""

from __future__ import annotations

from schedules.params import mixed_gather_bytes
from schedules.plan import ParallelConfig, Plan

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1}
"""Bytes per element of the optimizer dtypes Megatron accepts."""
FP32_GRAD_BYTES = 4
"""fp32 gradient buffer (``grad_reduce_in_fp32``)."""
BF16_GRAD_BYTES = 2
"""bf16 gradient buffer (``grad_reduce_in_fp32`` off)."""
PARAM_REMAINDER_BYTES = 2
"""Transformer Engine's fp32 master weight of a bf16 weight, stored as its low 16 bits
(``store_param_remainders``; Megatron's checkpoint code allocates it as int16)."""
WEIGHT_WRITE_BYTES = 2
"""Adam writes the updated bf16 weight (the distributed optimizer's shard of the buffer)."""


def grad_bytes(parallel: ParallelConfig) -> int:
    """Bytes of one element of the distributed optimizer's gradient buffer."""
    return FP32_GRAD_BYTES if parallel.grad_reduce_in_fp32 else BF16_GRAD_BYTES


def te_master_weights(plan: Plan) -> bool:
    """Whether Transformer Engine's FusedAdam holds the master weights (Megatron-Core's
    ``use_precision_aware_optimizer_no_fp8_or_ds_fp8``): the precision-aware optimizer, with
    fp16 masters, or over weights that are not FP8 under current scaling. Not for
    Megatron-Bridge's bf16 runs: Bridge copies its mixed-precision config's ``fp8_recipe``
    ("tensorwise" by default) into the optimizer config even without FP8, so there Megatron
    keeps its own fp32 master (4 bytes, where this rule gives a bf16 plan 2)."""
    parallel = plan.parallel
    if not parallel.use_precision_aware_optimizer:
        return False
    if parallel.main_params_dtype != "fp32":
        return True
    current_fp8 = plan.training.precision == "fp8" and plan.training.te_fp8_recipe == "current"
    return not current_fp8


def master_bytes_per_param(plan: Plan) -> int:
    """Bytes of one master weight: Megatron's fp32 copy, or Transformer Engine's (the 16-bit
    remainder of an fp32 master of a bf16 weight, an fp16 master)."""
    if not te_master_weights(plan):
        return DTYPE_BYTES["fp32"]
    if stores_remainders(plan):
        return PARAM_REMAINDER_BYTES
    master = plan.parallel.main_params_dtype
    return DTYPE_BYTES[master]


def optimizer_bytes_per_param(plan: Plan) -> int:
    """Adam's state per parameter: master weight plus the two moments as stored (without the
    precision-aware optimizer fp32 master weights, momentum and variance: the ZeRO paper's
    K = 12, Sec. 3.1)."""
    parallel = plan.parallel
    moments = DTYPE_BYTES[parallel.exp_avg_dtype] + DTYPE_BYTES[parallel.exp_avg_sq_dtype]
    return master_bytes_per_param(plan) + moments


STATE_TRAFFIC_BYTES = {"fp32": 8, "bf16": 24, "fp16": 40, "fp8": 22}
"""Bytes Transformer Engine's FusedAdam moves per parameter for one state of each dtype
(``fused_adam.py``): fp32 read and written by the kernel; a lower-precision state is first
unscaled into an fp32 temporary (``get_unscaled_state``: read it, write 4; fp16 then multiplies
by its scale, 4 + 4), the kernel reads and writes the temporary (8), and ``_apply_scale`` writes
it back (bf16: ``copy_(unscaled.bfloat16())``, a conversion 4 + 2 and the copy 2 + 2; fp16:
``aminmax`` 4, the rescale 4 + 4, the copy 4 + 2; fp8: ``aminmax`` 4, the cast 4 + 1)."""
FUSED_BF16_STATE_BYTES = 4
"""A bf16 moment when both are bf16 (``fuse_unscale``): the kernel reads and writes it."""
REMAINDER_TRAFFIC_BYTES = 8
"""Transformer Engine's master as a remainder: the kernel reads and writes the bf16 weight and
its int16 remainder (and so writes the updated weight itself)."""


def adam_traffic_bytes(plan: Plan) -> int:
    """Bytes the fused Adam moves per parameter besides the gradient: each state as
    ``STATE_TRAFFIC_BYTES`` (the moments ``FUSED_BF16_STATE_BYTES`` each when both are bf16),
    the master as its own, and the updated 16-bit weight written (26 without the
    precision-aware optimizer, as ``sim.compute.compute_model.ADAM_BYTES_PER_PARAM``). Not
    priced: the fp32 temporaries' memory during the step (4 bytes a parameter for each
    unfused lower-precision state), which comes after the backward has freed the activations."""
    parallel = plan.parallel
    fused = parallel.exp_avg_dtype == parallel.exp_avg_sq_dtype == "bf16"
    moments = sum(
        FUSED_BF16_STATE_BYTES if fused else STATE_TRAFFIC_BYTES[dtype]
        for dtype in (parallel.exp_avg_dtype, parallel.exp_avg_sq_dtype)
    )
    if stores_remainders(plan):
        return moments + REMAINDER_TRAFFIC_BYTES
    master = parallel.main_params_dtype if te_master_weights(plan) else "fp32"
    return moments + STATE_TRAFFIC_BYTES[master] + WEIGHT_WRITE_BYTES


def stores_remainders(plan: Plan) -> bool:
    """Whether the master weights are Transformer Engine's fp32 remainders of bf16 weights
    (``store_param_remainders and p.dtype == torch.bfloat16`` in ``fused_adam.py``: bf16
    training, FP8 over bf16 weights; not fp16)."""
    bf16_weights = plan.training.precision in ("bf16", "fp8")
    fp32_masters = plan.parallel.main_params_dtype == "fp32"
    return te_master_weights(plan) and fp32_masters and bf16_weights


def fp8_params(plan: Plan) -> bool:
    """Whether the layers' weights are FP8 tensors (``training.fp8_param_gather``)."""
    return plan.training.fp8_param_gather and plan.training.precision == "fp8"


def gather_bytes(plan: Plan, params: float, layer_params: float) -> float:
    """Bytes of the parameter all-gather of ``params`` parameters of which ``layer_params`` are
    the transformer layers': FP8 at 1 byte with ``fp8_param_gather``, bf16 at 2 otherwise."""
    return mixed_gather_bytes(params, layer_params if fp8_params(plan) else 0.0)
