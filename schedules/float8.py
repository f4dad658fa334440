"""torchao float8 training (``Float8Linear``) on the PyTorch stacks: what each recipe adds to a
layer's weight GEMMs, and what float8 all-gather changes for FSDP2.

A ``Float8Linear`` of forward shape (m, n, k) has three operands: the input X (m k elements),
the weight W (n k) and, in backward, the output gradient G (m n). Before each of its three GEMMs
(output = X W^T, grad_input = G W, grad_weight = G^T X) it scales the operands to float8 from
their absolute maximum (``tensor_to_amax``: one max per tensor, or per row) and casts them
(``hp_tensor_and_scale_to_float8``); ``torch._scaled_mm`` wants its first operand row-major and
its second column-major, so a cast for the other layout writes a transposed copy
(``float8_ops.preprocess_addmm``). The recipes (``Float8LinearConfig.from_recipe_name``):

- ``tensorwise``: one scale per tensor, every GEMM in float8 on cuBLAS; the default of torchao
  and of torchtitan up to v0.2 (``recipe_name`` unset).
- ``rowwise``: one scale per row of each operand along its GEMM's reduction dimension, so each
  tensor is cast twice, once per layout, from a transposed bf16 copy. The forward GEMM
  (fast accumulation) runs PyTorch's CUTLASS rowwise kernel (``ROWWISE_GEMM_BACKEND``, priced
  in ``sim.compute``); the backward GEMMs (no fast accumulation) run cuBLAS's tensorwise kernel
  and scale the output after (``addmm_float8_unwrapped``: ``output *= post_inverse_scale``).
  Inductor fuses that into the input gradient's consumer (the sum over wq, wk, wv or w1, w3,
  the activation backward); the weight gradient leaves the compiled graph, so it takes a pass
  (read 2, write 2 per weight element; eager: both).
- ``rowwise_with_gw_hp``: rowwise forward and input gradient, the weight gradient in bf16.

Bytes per element of each operand, forward / input backward / weight backward (``CAST_BYTES``):
``compile`` from torchao's own roofline (``torchao/testing/training/roofline_utils.py``,
``get_tensor_memory_traffic_ovhd_s``: the input and gradient amax fused into the producing
kernel, the weight's not); ``eager`` counted op by op from ``float8_utils.py`` and
``float8_training_tensor.py``: ``abs`` 2+2, ``max`` 2, ``to(float32)`` 2+4, ``* scale`` 4+4,
``clamp`` 4+4, ``to(float8)`` 4+1 = 33 per cast, a transposed float8 copy 1+1, and no reuse
between casts. Eager also casts the shared input of wq, wk, wv (and w1, w3) once per linear
(``input_casts``); Inductor computes it once. With ``float8_all_gather`` (FSDP2, tensorwise)
the weight arrives in float8: it is cast on the shard before the all-gather (1 byte per
parameter on the wire) and only its transposed copy for the input gradient remains. Under
tensorwise with sequence parallelism torchtitan casts the operands TP gathers on their sequence
shard and all-gathers them in float8 (``TP_SHARD_CASTS``).

Sources: pytorch/ao at 36027d8 (``torchao/float8/``; docs/source/workflows/training.md); torchtitan
v0.1.0-v0.2.2 (``Float8`` / ``Float8Linear`` job config, ``components/quantization/float8.py``,
``train_configs/llama3_*.toml``: ``filter_fqns = ["output"]``, the LM head stays bf16).

    forward_bytes, dgrad_bytes, wgrad_bytes = cast_bytes(plan, "compile", "qkv", (8192, 6144, 4096))
"""

from __future__ import annotations

from schedules.data_parallel.registry import data_parallel_kind
from schedules.mla import latent_duplicated_params, latent_input_params
from schedules.params import PARAM_BYTES, layer_params_per_gpu, mixed_gather_bytes
from schedules.plan import ModelConfig, Plan
from schedules.stacks import kernel_stack

ROWWISE_GEMM_BACKEND = "cutlass_rowwise"
"""``Kernel.backend`` of a forward GEMM with row-wise scales: ``torch._scaled_mm`` runs
PyTorch's CUTLASS kernel (``RowwiseScaledMM.cu``), not cuBLAS (pytorch/pytorch#153555)."""

Bytes = tuple[float, float, float]
"""Bytes per element moved in the forward, the input backward and the weight backward."""

CAST_BYTES: dict[str, dict[str, dict[str, Bytes]]] = {
    "compile": {
        # amax fused into the producer; one cast writes both float8 layouts (1 + 1)
        "tensorwise": {"input": (4, 0, 0), "weight": (5, 3, 0), "grad_output": (0, 4, 0)},
        # cast dim0 + bf16 transposed copy (1 + 2), later the dim1 cast (2 + 1); the weight's
        # forward cast 2 + 1, its transpose 2 + 2 and dim1 cast 2 + 1 in backward; the weight
        # gradient's row scales applied after the GEMM (2 + 2)
        "rowwise": {"input": (3, 0, 3), "weight": (3, 7, 4), "grad_output": (0, 3, 3)},
        # input and gradient cast once (write 1); the weight rowwise forward, tensorwise backward
        "rowwise_with_gw_hp": {"input": (1, 0, 0), "weight": (3, 3, 0), "grad_output": (0, 1, 0)},
    },
    "eager": {
        # 33 per cast; the backward recasts the saved bf16 input and weight, and copies the
        # float8 weight, gradient (G^T) and input into the layout _scaled_mm wants (+2 each);
        # rowwise scales the input and weight gradients after their GEMMs (+4 on X and W)
        "tensorwise": {"input": (33, 0, 35), "weight": (33, 35, 0), "grad_output": (0, 33, 35)},
        "rowwise": {"input": (33, 4, 35), "weight": (33, 35, 4), "grad_output": (0, 33, 35)},
        "rowwise_with_gw_hp": {
            "input": (33, 4, 0),
            "weight": (33, 35, 0),
            "grad_output": (0, 33, 0),
        },
    },
}
"""Bytes per element each operand of a ``Float8Linear`` moves in casts, per stack and recipe."""
GATHERED_WEIGHT_BYTES: Bytes = (0, 2, 0)
"""Tensorwise with float8 all-gather: the gathered float8 weight is row-major, so the input
gradient's GEMM copies it transposed (read 1, write 1); the forward uses it as gathered."""
TP_SHARD_CASTS = {"input": ("qkv", "fc1", "k", "fc1_up"), "grad_output": ("proj", "fc2")}
"""The operands tensor parallelism gathers over the sequence, cast before their all-gather under
tensorwise (torchtitan's float8 TP plan, torchao ``float8_tensor_parallel.py``):
``PrepareFloat8ModuleInput`` / ``Float8ColwiseParallel`` cast the sharded input of qkv and fc1
(and of wk and w3 where per-op recompute reruns them) once for all its linears,
``Float8RowwiseParallel`` the sharded output gradient of proj and fc2; the all-gathers then move
float8 (``schedules.kernels.tp_gather_bytes``)."""
SHARD_CAST_BYTES = {"compile": 3, "eager": 33}
"""Bytes per element of the sequence shard cast before a TP all-gather (amax fused under compile,
read 2, write 1; eager's 33)."""
GATHERED_COPY_BYTES = 2
"""Per element of a gathered float8 operand: its transposed copy for the weight gradient."""
SCALE_PRECOMPUTE_BYTES = 4
"""``precompute_float8_dynamic_scale_for_fsdp`` after the optimizer step:
``torch._foreach_norm(weights, inf)`` reads every local fp32 shard of the float8 linear weights
(its one all-reduce of a scale per linear is latency alone: not modelled)."""


def float8_recipe(plan: Plan, stack: str) -> str | None:
    """The torchao recipe the weight GEMMs run: ``training.float8_recipe`` or ``tensorwise`` for
    FP8 plans on the PyTorch stacks; None without FP8 or on ``megatron`` (Transformer Engine)."""
    if plan.training.precision != "fp8" or stack == "megatron":
        return None
    return plan.training.float8_recipe or "tensorwise"


def input_casts(plan: Plan, stack: str, name: str) -> int:
    """How often the input of the layer GEMM ``name`` (``schedules.kernels.WEIGHT_GEMMS``) is
    cast: eager casts it in every Float8Linear that reads it (torchtitan and Hugging Face keep
    wq, wk, wv and w1, w3 apart), Inductor once, and so does torchtitan's float8 TP."""
    if stack != "eager" or sharded_casts(plan, stack):
        return 1
    return {"qkv": 3, "fc1": 2 if plan.model.gated_mlp else 1}.get(name, 1)


def sharded_casts(plan: Plan, stack: str) -> bool:
    """Whether the gathered TP operands are cast on their sequence shard: tensorwise with
    sequence parallelism (``TP_SHARD_CASTS``)."""
    parallel = plan.parallel
    tensorwise = float8_recipe(plan, stack) == "tensorwise"
    return tensorwise and parallel.tp > 1 and parallel.sequence_parallel


def cast_bytes(plan: Plan, stack: str, name: str, shape: tuple[float, float, float]) -> Bytes:
    """Bytes the float8 casts of the layer linear ``name`` of forward ``shape`` (m, n, k) move:
    forward, input backward, weight backward."""
    recipe = float8_recipe(plan, stack)
    if recipe is None:
        return (0.0, 0.0, 0.0)
    m, n, k = shape
    operands = dict(CAST_BYTES[stack][recipe])
    if plan.training.float8_all_gather:
        operands["weight"] = GATHERED_WEIGHT_BYTES
    if sharded_casts(plan, stack):
        shard = SHARD_CAST_BYTES[stack] / plan.parallel.tp
        # a parallel block gathers one input for qkv and fc1 and one gradient for proj and fc2:
        # its second linear uses the float8 shard the first one cast
        shared = ("fc1", "fc1_up", "fc2") if plan.model.parallel_block else ()
        if name in TP_SHARD_CASTS["input"]:
            operands["input"] = (0 if name in shared else shard, 0, GATHERED_COPY_BYTES)
        if name in TP_SHARD_CASTS["grad_output"]:
            operands["grad_output"] = (0, 0 if name in shared else shard, GATHERED_COPY_BYTES)
    sizes = {"input": m * k * input_casts(plan, stack, name), "weight": n * k, "grad_output": m * n}
    forward, dgrad, wgrad = (
        sum(operands[role][phase] * size for role, size in sizes.items()) for phase in range(3)
    )
    return forward, dgrad, wgrad


def wgrad_dtype(plan: Plan, stack: str) -> str:
    """The weight-gradient GEMM's dtype: bf16 under ``rowwise_with_gw_hp``, else fp8."""
    return "bf16" if float8_recipe(plan, stack) == "rowwise_with_gw_hp" else "fp8"


def forward_backend(plan: Plan, stack: str) -> str:
    """``Kernel.backend`` of the forward GEMMs: the CUTLASS rowwise kernel under the rowwise
    recipes, cuBLAS ("") under tensorwise."""
    recipe = float8_recipe(plan, stack)
    return ROWWISE_GEMM_BACKEND if recipe in ("rowwise", "rowwise_with_gw_hp") else ""


def layer_linear_params_per_gpu(model: ModelConfig, tp: int) -> float:
    """Weights of one layer's linears on one GPU: h (ad + 2kd) + ad h + (2 or 3) h f, over tp;
    under multi-head latent attention its linears (``schedules.mla``: the down projections
    whole on every TP rank) and the a*d_v-wide output projection instead of the first two."""
    h, f, q = model.hidden_size, model.ffn_hidden_size, model.q_size
    num_mlp = 3 if model.gated_mlp else 2
    if model.multi_latent:
        duplicated = latent_duplicated_params(model)
        split = latent_input_params(model) - duplicated + model.attention_out_size * h
        return duplicated + (split + num_mlp * h * f) / tp
    return (h * (q + 2 * model.kv_size) + q * h + num_mlp * h * f) / tp


def layer_gather_bytes(plan: Plan) -> float:
    """All-gather output of one FSDP layer unit: float8 linear weights at 1 byte per parameter
    with ``float8_all_gather``, everything else (norms, biases) in bf16."""
    params = layer_params_per_gpu(plan.model, plan.parallel.tp)
    if not plan.training.float8_all_gather:
        return params * PARAM_BYTES
    linear = layer_linear_params_per_gpu(plan.model, plan.parallel.tp)
    return mixed_gather_bytes(params, linear)


def scale_precompute_bytes(
    plan: Plan, *, num_layers: int, params: float, optimizer_params: float
) -> float:
    """Bytes the step-end scale precompute reads on one GPU: the float8 linears' share of the
    ``optimizer_params`` it updates (``num_layers`` layers of its ``params``), 4 bytes each."""
    if not plan.training.float8_all_gather or params <= 0:
        return 0.0
    linear = num_layers * layer_linear_params_per_gpu(plan.model, plan.parallel.tp)
    return SCALE_PRECOMPUTE_BYTES * optimizer_params * linear / params


def check_float8(plan: Plan) -> None:
    """A float8 recipe needs a PyTorch stack, a TE recipe the megatron stack; float8 all-gather
    needs FSDP2 to gather with."""
    training = plan.training
    stack = kernel_stack(plan)
    if training.float8_recipe is not None and stack == "megatron":
        raise ValueError(
            f"training.float8_recipe={training.float8_recipe} is torchao's Float8Linear, which "
            f"the eager and compile stacks run; stack megatron (Transformer Engine) has its own"
        )
    if training.te_fp8_recipe is not None and stack != "megatron":
        raise ValueError(
            f"training.te_fp8_recipe={training.te_fp8_recipe} is Transformer Engine's, which "
            f"stack megatron runs; stack {stack} runs torchao's float8_recipe"
        )
    parallel = plan.parallel
    gathers = data_parallel_kind(parallel).torch_fsdp and parallel.fsdp2
    if training.float8_all_gather and not gathers:
        raise ValueError(
            f"training.float8_all_gather needs FSDP2 (data_parallel fsdp or hsdp with "
            f"fsdp_version 2), got data_parallel={parallel.data_parallel}, "
            f"fsdp_version={parallel.fsdp_version}"
        )
