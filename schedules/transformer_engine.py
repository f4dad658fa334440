"""Transformer Engine FP8 on the megatron stack: the casts and transposes each TE linear adds to
a layer's weight GEMMs, per micro-batch, and the weight casts it makes once per step.

Megatron-Core's layer runs qkv and fc1 as ``TELayerNormColumnParallelLinear``
(``layernorm_linear.py``) and proj and fc2 as ``TERowParallelLinear`` (``linear.py``). All three
GEMMs of each run in FP8 (E4M3 forward, E5M2 gradients under the ``HYBRID`` format): fprop on
the row-wise input and weight, dgrad on the row-wise gradient and the column-wise (transposed)
weight, wgrad on the column-wise gradient and input. A cast from bf16 reads 2 bytes and writes 1;
a fused cast-transpose writes both layouts (2 + 1 + 1); an FP8 transpose reads 1 and writes 1.

- Input of qkv, fc1: the norm writes FP8 itself (``apply_normalization`` with the input
  quantizer: ``with_quantized_norm``), on the sequence shard under sequence parallelism, then the
  FP8 shard is all-gathered; the wgrad's column-wise copy is an FP8 transpose of the gathered
  input (backward: ``ln_out_total.update_usage(columnwise_usage=True)``; without sequence
  parallelism in the forward).
- Input of proj, fc2 (row-parallel, nothing gathered): cast-transpose (``_linear_forward_impl``:
  ``input_quantizer.set_usage(rowwise=True, columnwise=backward_needs_input)``).
- Output gradient (``TransformerEngineBaseModule.grad_output_preprocess``): qkv, fc1 cast-transpose
  it; proj, fc2 under sequence parallelism cast their shard row-wise, all-gather it in FP8
  (``distributed._all_gather_fp8``: "we cannot directly gather the transposed fp8 tensor") and
  transpose the gathered gradient for the wgrad.
- Weight: cast-transposed on the first micro-batch of a step and reused by the others
  (``quantize_weight(update_workspace=is_first_microbatch is None or is_first_microbatch)``;
  Megatron-Core sets ``is_first_microbatch`` per step): ``weight_cast_bytes_per_step``.

Recipes (``training.te_fp8_recipe``): ``delayed`` (``DelayedScaling``, TE's default on Hopper:
the cast kernels record each tensor's amax and use the scale from the history,
``amax_history_len`` 1024 and ``amax_compute_algo`` "max" by default) and ``current``
(``Float8CurrentScaling``: each cast from bf16 first reads the tensor for its amax, 2 bytes per
element; the norm computes its output's amax itself, ``FUSED_NORM_AMAX_FP8``, writes bf16 and
is then cast). Not modelled: the amax reductions and the delayed history/scale update (one
all-reduce of a few floats and one fused kernel over the history per autocast exit, latency
alone), the norm writing 1 byte less. The FP8 all-gathers move 1 byte per element
(``schedules.kernels.tp_gather_bytes``).

Source: NVIDIA/TransformerEngine at d0067d0 (``transformer_engine/pytorch/module/linear.py``,
``layernorm_linear.py``, ``base.py``, ``distributed.py``, ``quantization.py``,
``csrc/extensions/normalization.cpp``, ``common/recipe/__init__.py``).

    forward_bytes, dgrad_bytes, wgrad_bytes = te_cast_bytes(plan, "proj", (8192, 8192, 2048))
"""

from __future__ import annotations

from schedules.float8 import Bytes, layer_linear_params_per_gpu
from schedules.plan import Plan
from schedules.stacks import kernel_stack

NORM_LINEARS = ("qkv", "fc1")
"""The layer GEMMs whose input the norm before them casts (``TELayerNormColumnParallelLinear``);
proj and fc2 are ``TERowParallelLinear``."""
CAST_BYTES = 3
"""Cast from bf16 to one FP8 layout: read 2, write 1."""
CAST_TRANSPOSE_BYTES = 4
"""Cast from bf16 to both FP8 layouts: read 2, write 1 + 1."""
TRANSPOSE_BYTES = 2
"""Transposed copy of an FP8 tensor: read 1, write 1."""
FP32_AMAX_BYTES = 4
"""The amax pass over an fp32 master shard before its cast to FP8 (``fp8_param_gather`` under
current scaling)."""
AMAX_BYTES = {"delayed": 0, "current": 2}
"""Per element cast from bf16, the pass that finds its amax first: none under delayed scaling
(recorded by the cast), a read of the bf16 tensor under current scaling (``compute_amax``)."""


def te_recipe(plan: Plan) -> str | None:
    """Transformer Engine's FP8 recipe: ``training.te_fp8_recipe`` or ``delayed`` for FP8 plans
    on the megatron stack; None without FP8 or on the PyTorch stacks (torchao)."""
    if plan.training.precision != "fp8" or kernel_stack(plan) != "megatron":
        return None
    return plan.training.te_fp8_recipe or "delayed"


def te_cast_bytes(plan: Plan, name: str, shape: tuple[float, float, float]) -> Bytes:
    """Bytes the FP8 casts and transposes of the TE linear ``name`` (``WEIGHT_GEMMS``) of forward
    ``shape`` (m, n, k) move per micro-batch on one GPU: forward, input backward, weight backward.
    The weight's cast is per step (``weight_cast_bytes_per_step``)."""
    recipe = te_recipe(plan)
    if recipe is None:
        return (0.0, 0.0, 0.0)
    m, n, k = shape
    amax, tp = AMAX_BYTES[recipe], plan.parallel.tp
    gathered = plan.parallel.sequence_parallel and tp > 1
    if name in NORM_LINEARS:
        forward, wgrad = _norm_input_bytes(recipe, m * k, tp, gathered)
        return forward, (amax + CAST_TRANSPOSE_BYTES) * m * n, wgrad
    forward = (amax + CAST_TRANSPOSE_BYTES) * m * k
    if gathered:  # the gradient's shard cast row-wise, gathered, then transposed
        return forward, (amax + CAST_BYTES) * m * n / tp, TRANSPOSE_BYTES * m * n
    return forward, (amax + CAST_TRANSPOSE_BYTES) * m * n, 0.0


def _norm_input_bytes(recipe: str, size: float, tp: int, gathered: bool) -> tuple[float, float]:
    """(forward, weight backward) bytes of a norm-cast input of ``size`` gathered elements."""
    if gathered:  # the shard cast (by the norm under delayed), the transpose after the gather
        shard_cast = CAST_BYTES * size / tp if recipe == "current" else 0.0
        return shard_cast, TRANSPOSE_BYTES * size
    return (CAST_TRANSPOSE_BYTES if recipe == "current" else TRANSPOSE_BYTES) * size, 0.0


def weight_cast_bytes_per_step(plan: Plan, num_layers: int, optimizer_params: float = 0.0) -> float:
    """Bytes the weight casts of ``num_layers`` layers move on one GPU per step: each linear
    weight (bf16) cast-transposed once, on the first micro-batch, with its amax pass under
    current scaling. With FP8 weights (``fp8_param_gather``) each gathered weight is only
    transposed, and the optimizer casts its own ``optimizer_params`` shard after the step
    (reading the fp32 master is Megatron's step pass, ``schedules.optimizer_passes``; current
    scaling reads it once more for the amax)."""
    recipe = te_recipe(plan)
    if recipe is None:
        return 0.0
    weights = num_layers * layer_linear_params_per_gpu(plan.model, plan.parallel.tp)
    if plan.training.fp8_param_gather:
        amax = FP32_AMAX_BYTES if recipe == "current" else 0.0
        return TRANSPOSE_BYTES * weights + amax * optimizer_params
    return (AMAX_BYTES[recipe] + CAST_TRANSPOSE_BYTES) * weights
