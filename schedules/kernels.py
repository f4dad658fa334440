"""What a transformer layer, the embedding and the LM head run on one GPU: lists of kernels.

A description only: each kernel has a kind, FLOPs, the dimensions that set how well it fills the
GPU, the bytes it moves and its dtype; ``sim.compute`` prices such lists and never calls back.

Per micro-batch of b sequences on one GPU, with T = b s / cp tokens, t = tp, kd the key/value
width, f the MLP width: weight GEMMs QKV (T x (h + 2kd)/t x h), attention projection
(T x h x h/t), MLP up (T x f/t x h, 2f/t when gated) and down (T x h x f/t); the attention core
(fused, or eager batched GEMMs plus a softmax when ``flash_attention`` is off); memory-bound
kernels: 2 norms (1 in a parallel block) and 2 residual adds (on T/t tokens with sequence
parallelism, else T), rotary
embeddings on Q and K, the MLP activation. The backward of a weight GEMM (m, n, k) is an
input-gradient GEMM (m, k, n) and a weight-gradient GEMM (k, n, m); elementwise backward moves
twice the forward bytes. FP8 plans on the eager and compile stacks run torchao's
``Float8Linear``: each weight GEMM with the float8 casts of its recipe (``schedules.float8``);
on the megatron stack Transformer Engine's casts (``schedules.transformer_engine``).

    kernels = layer_kernels(plan); [k.name for k in kernels.forward]
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from schedules.activations import ACTIVATION_BYTES
from schedules.context_parallel import RingStep, RingWork, ring_attention, runs_torch_ring
from schedules.data_parallel.registry import data_parallel_kind
from schedules.float8 import (
    cast_bytes,
    float8_recipe,
    forward_backend,
    sharded_casts,
    wgrad_dtype,
)
from schedules.flops import window_pairs_fraction
from schedules.messages import ACTIVATION_COMM_BYTES, tp_branches_per_layer, tp_message_bytes
from schedules.mla import latent_linears, latent_norm_elements, latent_split
from schedules.moe import expert_tokens, expert_width
from schedules.mtp import mtp_projection_params
from schedules.params import embedding_params_per_gpu, layer_params_per_gpu
from schedules.plan import ModelConfig, Plan, num_microbatches
from schedules.recompute_modules import selective_modules, separate_norms
from schedules.stacks import kernel_stack, loss_compiled, megatron_cross_entropy
from schedules.transformer_engine import te_cast_bytes, te_recipe

KERNEL_KINDS = ("gemm", "attention_forward", "attention_backward", "memory")
"""What prices a kernel: a GEMM curve, a fused-attention curve, or memory bandwidth alone."""
MEMORY_CLASSES = ("elementwise", "loss", "copy", "optimizer")
"""What a memory-bound kernel is in a profile (``vocab.kernel_classes``): norms, activations,
residuals and the like; the loss over the logits; casts and copies; the optimizer step. A step
calibration fits each pass class its own share of the memory bandwidth (the optimizer: its
bytes per parameter)."""
ATTENTION_BACKWARD_FLOPS_RATIO = 2.5
"""Fused attention backward FLOPs / forward FLOPs (5 matmuls instead of 2, FlashAttention)."""
COMPILED_CROSS_ENTROPY_BYTES = (4, 4)
"""Bytes per logit of the compiled cross-entropy, forward and backward: Inductor turns
``cross_entropy(logits.float())`` into reductions over the bf16 logits that never write the fp32
copy. Forward: an online-softmax reduction (``triton_red_fused__log_softmax__to_copy_..._
prepare_softmax_online``) that reads the logits twice, max and sum; backward: one kernel reading
the logits and writing their bf16 gradient
(``..._log_softmax_backward_data_..._nll_loss_backward``).
Measured in the compiled trace of refdata/h100/traces (Llama 1B, 8,192 tokens x 128,256 per
micro-batch, one H100): 1.61 ms forward and 1.55 ms backward per micro-batch, 4.2 GB each at
2.6-2.7 TB/s; PyTorch's eager loss moves 48 bytes per logit (``TORCH_CROSS_ENTROPY_BYTES``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Kernel:
    """One kernel on one GPU."""

    name: str
    """What it computes (``qkv``, ``attention``, ``elementwise``, ...)."""
    kind: str
    """One of ``KERNEL_KINDS``."""
    dtype: str = "bf16"
    """Math dtype (picks the peak and the fitted curve)."""
    flops: float = 0.0
    """Floating-point operations (0 for memory-bound kernels)."""
    dims: tuple[float, ...] = ()
    """Dimensions whose size sets the fraction of peak reached (m, n, k; query/key lengths)."""
    bytes: float = 0.0
    """Bytes read plus written: the roofline floor (the whole cost of a ``memory`` kernel)."""
    backend: str = ""
    """Which implementation runs: an attention kernel's ``training.attention_backend``, or a
    GEMM's (``schedules.float8.ROWWISE_GEMM_BACKEND``; "" for the library default)."""
    memory_class: str = "elementwise"
    """For a ``memory`` kernel, one of ``MEMORY_CLASSES``."""
    head_dim: float = 0.0
    """For an attention kernel, the head dimension (its kernels tile it: ``sim.compute``)."""
    converts: bool = True
    """For a ``copy`` kernel: whether it converts between dtypes (a cast), which runs at the
    casts' measured rate (``sim.compute.compute_model.CAST_EFFICIENCY``); a copy that only moves
    or fills bytes (a layout copy, a concatenation, a zero fill) at the fills' measured rate
    (``MOVE_EFFICIENCY``)."""
    extra_launches: float = 0.0
    """Host launches this modelled kernel makes beyond its loop's per-kernel count
    (``sim.compute.compute_model.LAUNCHES_PER_KERNEL``), where the loop's code gives them
    (``EAGER_ROTARY_LAUNCHES``)."""
    small_kernels: float = 0.0
    """Kernels run beside this one whose data is too small for their bytes to count (a
    router's top-k, softmax and bookkeeping over a few thousand tokens): each takes
    ``sim.compute.compute_model.SMALL_KERNEL_S`` of GPU time. Their launches are in
    ``extra_launches``."""

    def __post_init__(self) -> None:
        if self.kind not in KERNEL_KINDS:
            raise ValueError(f"kernel kind must be one of {', '.join(KERNEL_KINDS)}: {self.kind!r}")
        assert self.memory_class in MEMORY_CLASSES, self.memory_class


@dataclass(frozen=True, slots=True, kw_only=True)
class PieceKernels:
    """The kernels of one piece of the model (a layer, the embedding, the head), per phase."""

    forward: tuple[Kernel, ...]
    """Forward pass."""
    backward_input: tuple[Kernel, ...]
    """Input-gradient half of the backward (with the attention and elementwise backward)."""
    backward_weight: tuple[Kernel, ...]
    """Weight-gradient GEMMs (the deferrable 'W' of zero-bubble schedules)."""
    recompute: tuple[Kernel, ...] = ()
    """Rerun before the backward (none; selective: the attention core; full: the forward)."""


def element_bytes(dtype: str) -> int:
    """Bytes per element of a GEMM operand in ``dtype``."""
    return 1 if dtype == "fp8" else (4 if dtype in ("fp32", "tf32") else 2)


def gemm(name: str, m: float, n: float, k: float, dtype: str = "bf16", backend: str = "") -> Kernel:
    """(m x k) @ (k x n): 2mnk FLOPs; reads both operands, writes a 16-bit (m x n) result;
    ``backend`` names a kernel other than the library default (``schedules.float8``)."""
    operand_bytes = element_bytes(dtype) * (m * k + k * n) + 2 * m * n
    return Kernel(
        name=name,
        kind="gemm",
        dtype=dtype,
        flops=2.0 * m * n * k,
        dims=(m, n, k),
        bytes=operand_bytes,
        backend=backend,
    )


INDUCTOR_GEMM_ALIGNMENT = {"bf16": 8, "fp16": 8, "fp32": 4}
"""Elements a compiled GEMM's dimensions are padded to a multiple of. Inductor's ``pad_mm`` pass
(``torch/_inductor/fx_passes/pad_mm.py``, on by default: ``config.shape_padding``) rewrites an
``mm`` / ``addmm`` / ``bmm`` whose dimension is not a multiple of ``get_alignment_size`` (8 for
16-bit types, 4 for fp32) to a zero-padded one when its benchmark finds that faster, which on
Hopper it does for the odd vocabularies (measured: GPT-2's 50257 ran as 50264 in the compiled
H100 steps of results/h100_heldout, its head GEMMs at the aligned rate)."""


def compiled_gemm(plan: Plan, name: str, m: float, n: float, k: float, dtype: str) -> Kernel:
    """``gemm`` as the plan's stack runs it: on ``compile`` each whole dimension padded to
    ``INDUCTOR_GEMM_ALIGNMENT`` (a fractional average count is left alone)."""
    multiple = INDUCTOR_GEMM_ALIGNMENT.get(dtype, 0)
    if kernel_stack(plan) != "compile" or not multiple:
        return gemm(name, m, n, k, dtype)
    m, n, k = (
        -(-dim // multiple) * multiple if float(dim).is_integer() else dim for dim in (m, n, k)
    )
    return gemm(name, m, n, k, dtype)


def attention(
    *,
    batch: float,
    num_heads: float,
    seq_q: float,
    seq_kv: float,
    head_dim: float,
    causal: bool = True,
    dtype: str = "bf16",
    backward: bool = False,
    backend: str = "cudnn",
    window: float = 0.0,
    value_head_dim: float = 0.0,
) -> Kernel:
    """Fused attention (scores, softmax, AV) forward, or its backward with ``backward``. With a
    causal sliding ``window`` the kernel skips the blocks outside it (FlashAttention's
    ``window_size``): the products inside (``schedules.flops.window_pairs_fraction``), each
    query's keys the window's. ``value_head_dim``: the value heads' width where it is not the
    query and key heads' ``head_dim`` (multi-head latent attention: QK^T over ``head_dim``, AV
    and the output over ``value_head_dim``); the kernel's head-dimension rate is its
    ``head_dim``'s."""
    share = window_pairs_fraction(seq_kv, window) if causal else 1.0
    widths = head_dim + (value_head_dim or head_dim)  # QK^T's and AV's
    flops = 2.0 * batch * num_heads * seq_q * seq_kv * widths * share
    if backward:
        flops *= ATTENTION_BACKWARD_FLOPS_RATIO
    io_bytes = ACTIVATION_BYTES * batch * num_heads * widths * (seq_q + seq_kv)
    io_bytes *= 2 if backward else 1
    keys = min(seq_kv, window) if window and causal else seq_kv
    return Kernel(
        name="attention_backward" if backward else "attention",
        kind="attention_backward" if backward else "attention_forward",
        dtype=dtype,
        flops=flops,
        dims=(seq_q, keys),
        bytes=io_bytes,
        backend=backend,
        head_dim=head_dim,
    )


def memory(
    name: str, num_bytes: float, memory_class: str = "elementwise", *, converts: bool = True
) -> Kernel:
    """A memory-bound kernel moving ``num_bytes`` (read + written); ``converts``: see
    ``Kernel.converts``."""
    return Kernel(
        name=name, kind="memory", bytes=num_bytes, memory_class=memory_class, converts=converts
    )


def dtypes(plan: Plan) -> tuple[str, str]:
    """(GEMM dtype, dtype of everything else): FP8 plans run only the layer GEMMs in FP8."""
    precision = plan.training.precision
    other = "fp16" if precision == "fp16" else "bf16"
    return ("fp8" if precision == "fp8" else other), other


def _tokens(plan: Plan) -> float:
    return plan.training.micro_batch_size * plan.model.seq_len / plan.parallel.cp


def residual_stream_elements(plan: Plan) -> float:
    """Elements of one micro-batch's residual stream on one GPU (tokens x hidden; the tokens
    split over tensor-parallel ranks under sequence parallelism): what a norm or a residual add
    reads."""
    tokens = _tokens(plan)
    if plan.parallel.sequence_parallel:
        tokens /= plan.parallel.tp
    return tokens * plan.model.hidden_size


WEIGHT_GEMMS = ("qkv", "proj", "fc1", "fc2")
"""Names of a layer's weight GEMMs, in ``weight_gemm_shapes`` order."""


def weight_gemm_shapes(plan: Plan) -> tuple[tuple[float, float, float], ...]:
    """Forward (m, n, k) of the QKV, projection, MLP up and MLP down GEMMs on one GPU (the query
    and projection input ad wide: h unless ``head_dim`` is set apart). Under multi-head latent
    attention the QKV entry stands for its down and up projections (``linear_gemm_shapes`` has
    them one by one): h deep and as wide as gives their FLOPs."""
    model, t = plan.model, plan.parallel.tp
    tokens, h, f, q = _tokens(plan), model.hidden_size, model.ffn_hidden_size, model.q_size
    up_width = 2 * f if model.gated_mlp else f
    qkv_width = (q + 2 * model.kv_size) / t
    if model.multi_latent:
        qkv_width = sum(n * k * share for n, k, _, share in _projection_pieces(plan)["qkv"]) / h
    return (
        (tokens, qkv_width, h),
        (tokens, h, model.attention_out_size / t),
        (tokens, up_width / t, h),
        (tokens, h, f / t),
    )


ELEMENTWISE_BYTES = {
    "megatron": {"rmsnorm": 4, "layernorm": 4, "rotary": 4, "gated": 6, "plain": 4, "residual": 6},
    "compile": {"rmsnorm": 4, "layernorm": 4, "rotary": 4, "gated": 6, "plain": 4, "residual": 6},
    "eager": {"rmsnorm": 4, "layernorm": 4, "rotary": 20, "gated": 10, "plain": 4, "residual": 6},
}
"""Bytes moved per element of each memory-bound piece of a layer's forward (bf16 activations).

``megatron``: fused kernels (Transformer Engine / apex norms, fused rotary, fused bias-SwiGLU):
read and write once (a gated activation reads 2 and writes 1 element per output). ``compile``:
Inductor fuses each elementwise chain into one kernel, the same traffic. ``eager``: PyTorch's
``nn.LayerNorm`` and ``nn.RMSNorm`` are one native kernel each (``_fused_rms_norm`` since
mid-2025, pytorch/pytorch#153666; ``vectorized_layer_norm_kernel`` in the plain loop's trace of
refdata/h100/traces, 2.3 TB/s at 4 bytes per element; Hugging Face's unfused ``LlamaRMSNorm``
would move 36), and the rest is
counted from the Hugging Face Llama modules (``apply_rotary_pos_emb``: ``q * cos`` 2+2,
``rotate_half`` neg 1+1 and cat 2+2, ``* sin`` 2+2, add 4+2 = 20; SwiGLU ``act_fn(gate) * up``:
silu 2+2, mul 4+2 = 10). Residual adds read two tensors and write one in every stack. Under
autocast over fp32 weights the residual stream is fp32 (``FP32_RESIDUAL_BYTES``)."""
EAGER_ROTARY_LAUNCHES = {"forward": 18.0, "backward": 24.0}
"""Kernels the rotary embedding of ``commbench --step``'s model launches per layer and
micro-batch, on Q and K (``comm_bench/step_model.py`` ``apply_rotary``, counted op by op with
a dispatch mode in the tests): forward 9 each (the cos and sin tables cast to bf16, four
multiplications, a subtraction, an addition, a stack), backward 12 each (four multiplications,
a negation, three additions, and two ``slice_backward``, each a zero fill and a strided copy).
They are the difference between that model's Llama-style and GPT-style eager steps on one H100
(106.5 and 65.6 kernels per layer and micro-batch in results/h100_heldout's traces, against 24
and 25 modelled: 2.69 and 2.62 launches per modelled kernel once these 42 are taken out), which
one per-kernel ratio could not carry (4.6 and 3.0). The memory-bound layer kernel they belong
to (``elementwise``) carries them, on the eager loop under autocast (the reference model's)."""
UNFUSED_RMSNORM_BYTES = 36
"""Bytes per element of an RMSNorm run as separate eager kernels (``training.fused_norm``
false), counted from Hugging Face's ``LlamaRMSNorm`` (torch's composite ``rms_norm`` before its
fused kernel does the same passes): ``to(float32)`` 2+4, ``pow`` 4+4, ``mean`` 4, ``* rsqrt``
4+4, ``to(input_dtype)`` 4+2, ``weight *`` 2+2."""
FP32_RESIDUAL_BYTES = {
    "eager": {"norm": 8, "residual": 10, "cast": 6},
    "compile": {"norm": 6, "residual": 6, "cast": 0},
}
"""Bytes per element of a norm, a residual add and the cast of the norm's output to bf16 where
the residual stream is fp32: under ``torch.autocast`` over fp32 weights (``autocast_weights``)
the embedding's output is fp32 (``embedding`` is not on autocast's cast lists) and stays so, since
an fp32 stream plus a bf16 branch promotes to fp32 (``aten::add`` with float and bf16 inputs in
the H100 traces of results/h100_heldout). ``eager``: the norm reads and writes fp32 (8:
``native_layer_norm`` on float inputs, layer_norm is on autocast's fp32 list), the add reads 4 + 2
and writes 4 (10), and the next GEMM's autocast casts the norm's output to bf16 (read 4, write 2:
a copy kernel), whose backward casts the gradient back. ``compile``: Inductor fuses the add, the
norm and the cast (``triton_red_fused__to_copy_add_native_layer_norm``): read the fp32 stream 4
and the bf16 branch 2, write the fp32 stream 4 and the bf16 normed 2, 12 per norm and add pair
where bf16 needs 10."""
FP32_RESIDUAL_BRANCH_CASTS = 2
"""Branch outputs (attention, MLP) whose gradient the fp32 residual stream casts to bf16 in the
backward, per layer, sequential or parallel (autograd returns each input's gradient in its
dtype); beside them each linear that read a norm's cast output casts its input's gradient back to
fp32 (``norm_grad_cast_bytes``). The eager H100 trace of results/h100_heldout (Llama h1536) shows
four fp32-to-bf16 and two bf16-to-fp32 activation-sized casts per layer: two forward, four
backward."""
EAGER_ATTENTION_LAYOUT_BYTES = 4
"""Bytes per element of the attention output's layout copy in an eager layer: the heads-major
output is made (tokens, hidden) contiguous again (``y.transpose(1, 2).contiguous()`` in
nanoGPT, Hugging Face's attention modules and ``commbench --step``'s model; read 2, write 2),
and its gradient is copied back the same way in the backward."""
EAGER_SPLIT_GRAD_BYTES = 4
"""Bytes per output element of a fused projection whose output an eager layer splits (the QKV
projection into q, k and v; a gated MLP's one up projection into gate and value, as the
inventory's GEMMs are fused): autograd's split backward concatenates the pieces' gradients into
one (``aten::cat``, read 2, write 2; 0.026 and 0.089 ms per layer and micro-batch in the eager
Llama trace of results/h100_heldout/traced, 4.0 and 3.0 TB/s). Inductor writes the pieces into
one buffer; Megatron's fused kernels take the views."""
FUSED_ATTENTION_BACKWARD_AUX_BYTES = 10
"""Bytes per query element (tokens x heads x head dimension) of the two small kernels around a
fused attention backward: the row sums of dO * O read both (4; cuDNN's ``compute_dot_do_o``,
FlashAttention's ``flash_bwd_dot_do_o_kernel``) and the fp32 dQ accumulator is converted to bf16
(read 4, write 2; ``convert_dq_to_16bits``, ``flash_bwd_convert_dq_kernel``). In the H100 traces
of results/h100_heldout they take 0.05 and 0.04 ms per layer and micro-batch at 16.8 M query
elements; the fitted attention rates time the main kernel only."""
BIAS_GRAD_BYTES = 2
"""Bytes per element of a biased linear's output gradient read again to sum it into the bias
gradient (``aten::sum`` over the tokens of the bf16 gradient in the eager H100 traces, Inductor's
``triton_red_fused_sum`` when compiled): a reduction pass over each biased output, per
micro-batch."""
WEIGHT_CAST_BYTES_PER_PARAM = 12
"""Autocast over fp32 weights (eager and compiled DDP steps): every forward casts each weight to
bf16 (read 4, write 2; autocast caches casts only within one forward), and every backward casts
its bf16 weight gradient to fp32 (read 2, write 4) before accumulating it into ``.grad``."""


GRAD_ACCUMULATE_ACCESSES = 3
"""Weight gradients summed over micro-batches in a torch DDP step: from the second micro-batch
on, autograd's ``AccumulateGrad`` adds each new gradient into ``.grad`` (read both, write one:
three accesses of a gradient element, 12 bytes under autocast's fp32 gradients, 6 with
``bf16_weights``); the first micro-batch's gradient becomes ``.grad`` without a kernel. The one
``commbench --step`` shape measured at 1 and 4 micro-batches on one H100 (refdata/h100, Llama
1B, 1.5 B parameters) adds 6.2 ms of elementwise kernels per extra micro-batch beyond the first's
multiple; 18 GB at the default bandwidth is 6.7 ms."""


def accumulated_fraction(plan: Plan) -> float:
    """Share of a step's micro-batches whose weight gradients are added into ``.grad`` by a
    separate kernel, (m - 1) / m, in torch DDP (and one-GPU) steps; 0 elsewhere (Megatron's
    wgrad GEMMs accumulate into ``main_grad``, FSDP and ZeRO into their own shards) and on an
    unresolved plan."""
    if not torch_ddp_step(plan) or plan.parallel.dp <= 0:
        return 0.0
    micro = num_microbatches(plan)
    return (micro - 1) / micro if micro > 1 else 0.0


FSDP_UNSHARDED_ACCUMULATE_BYTES = {"first": 6.0, "later": 10.0}
"""Bytes per parameter that FSDP2 moves to keep a unit's unsharded gradient across the
micro-batches of a pipelined step. torch's pipeline stage runs every backward but the last with
gradient sync off (``set_requires_gradient_sync(False)``), and each unit's post-backward
(``FSDPParamGroup.post_backward``) keeps the gradient in the reduce dtype when it differs from
the parameters': the first micro-batch casts it (``FSDPParam.to_accumulated_grad_if_needed``,
bf16 -> fp32: read 2, write 4), each later one adds the new bf16 gradient into it
(``accumulate_unsharded_grad_if_needed``: read 4 + 2, write 4), the last before its
reduce-scatter. With the reduce dtype the parameters' own, autograd adds into ``.grad``
instead (``GRAD_ACCUMULATE_ACCESSES`` x 2 bytes from the second micro-batch on)."""


def fsdp_accumulate_bytes_per_param(plan: Plan) -> float:
    """Bytes per parameter and micro-batch, averaged over the step, of FSDP2's unsharded
    gradient accumulation under pipelining (``FSDP_UNSHARDED_ACCUMULATE_BYTES``); 0 without
    pipelining (every backward reduce-scatters), elsewhere and on an unresolved plan."""
    parallel = plan.parallel
    torch_fsdp = data_parallel_kind(parallel).torch_fsdp and kernel_stack(plan) != "megatron"
    if not torch_fsdp or parallel.pp <= 1 or parallel.dp <= 0 or parallel.dp * parallel.cp == 1:
        return 0.0  # one rank per stage: nothing sharded, autograd's own accumulation
    micro = num_microbatches(plan)
    if micro <= 1:
        return 0.0
    if parallel.reduce_dtype_bytes == ACTIVATION_BYTES:  # adds into .grad from the second on
        return GRAD_ACCUMULATE_ACCESSES * ACTIVATION_BYTES * (micro - 1) / micro
    first, later = (
        FSDP_UNSHARDED_ACCUMULATE_BYTES["first"],
        FSDP_UNSHARDED_ACCUMULATE_BYTES["later"],
    )
    return (first + later * (micro - 1)) / micro


def grad_accumulate_kernels(plan: Plan, params: float) -> tuple[Kernel, ...]:
    """The accumulation of ``params`` weight gradients per micro-batch, averaged over the step
    (torch DDP: ``accumulated_fraction``; FSDP2 under pipelining:
    ``fsdp_accumulate_bytes_per_param``); none where there is nothing to add."""
    ddp = GRAD_ACCUMULATE_ACCESSES * grad_bytes_per_element(plan) * accumulated_fraction(plan)
    size = (ddp + fsdp_accumulate_bytes_per_param(plan)) * params
    return (memory("grad_accumulate", size),) if size > 0 else ()


def elementwise_forward_bytes(plan: Plan) -> float:
    """Bytes the memory-bound kernels of one layer's forward move on one GPU, per its stack."""
    model, parallel = plan.model, plan.parallel
    per = ELEMENTWISE_BYTES[kernel_stack(plan)]
    tokens, t = _tokens(plan), parallel.tp
    norm, residual = per[model.norm], per["residual"]
    if autocast_weights(plan):  # the fp32 residual stream
        norm, residual = (FP32_RESIDUAL_BYTES[kernel_stack(plan)][k] for k in ("norm", "residual"))
    if unfused_norm(plan):
        norm = UNFUSED_RMSNORM_BYTES
    stream = residual_stream_elements(plan)
    if model.dropout:  # each add drops out the branch it adds, writing its mask
        residual += DROPOUT_MASK_BYTES
    norms = model.norms_per_layer * norm * stream
    if model.qk_norm:  # each query and key head normed over its d channels
        qk_norm = EAGER_QK_NORM["bytes"][0] if composite_qk_norm(plan) else norm
        norms += qk_norm * qk_norm_elements(plan)
    residuals = 2 * residual * stream  # 2 adds (a parallel block adds its two branches in turn)
    rotary = 0.0
    if model.position_embedding == "rope":
        rotary = per["rotary"] * tokens * rotary_width(plan)
    if model.multi_latent:  # the latents' norms, on each rank's own tokens under Megatron's SP
        norms += norm * latent_norm_elements(
            model, tokens, latent_split(plan.parallel, kernel_stack(plan))
        )
        rotary += latent_assembly_bytes(plan)
    activation = per["gated" if model.gated_mlp else "plain"] * tokens * model.ffn_hidden_size / t
    expand = 0.0
    if repeats_kv(plan):
        # repeat_kv: K and V expanded to every query head (read kd, write ad, each)
        expand = 2 * ACTIVATION_BYTES * tokens * (model.kv_size + model.q_size) / t
    return norms + residuals + rotary + activation + expand


def rotary_width(plan: Plan) -> float:
    """Channels per token the rotary embedding turns on one GPU: the queries' and keys'
    (``(q_size + kv_size) / t``), under multi-head latent attention only their rotary parts:
    every query head's ``qk_rope_head_dim`` and the one key they share, whole on every TP rank."""
    model, t = plan.model, plan.parallel.tp
    if model.multi_latent:
        return model.qk_rope_head_dim * (model.num_heads / t + 1)
    return (model.q_size + model.kv_size) / t


def latent_assembly_bytes(plan: Plan) -> float:
    """Bytes multi-head latent attention moves per micro-batch on one GPU to put its heads
    together: each query head's rotary and non-rotary parts into one (read and written), and
    each key head from its up-projected part and the shared rotary key, the values split off
    the same output (Megatron-Core's ``MLASelfAttention.get_query_key_value_tensors``:
    ``torch.cat`` of ``q_no_pe`` and ``q_pos_emb``, of ``k_no_pe`` and the expanded
    ``k_pos_emb``; one fused pass with ``apply_rope_fusion``); 0 for other attention."""
    model, t = plan.model, plan.parallel.tp
    if not model.multi_latent:
        return 0.0
    query = 2 * model.q_size / t  # read and write every query head
    up = model.num_heads * (model.head_dim + model.value_head_dim) / t  # kv_up's output, read
    written = (model.kv_size + model.value_size) / t  # the keys and values, written
    return ACTIVATION_BYTES * _tokens(plan) * (query + up + model.qk_rope_head_dim + written)


def qk_norm_elements(plan: Plan) -> float:
    """Query and key elements one GPU norms per layer and micro-batch (``model.qk_norm``)."""
    model = plan.model
    return _tokens(plan) * (model.q_size + model.kv_size) / plan.parallel.tp


EAGER_QK_NORM = {"bytes": (40.0, 108.0), "launches": (16.0, 34.0)}
"""Bytes per normed element (forward, backward) and launches per layer and micro-batch (both
norms) of the query and key norms where torch runs ``rms_norm`` as its composite
(``composite_qk_norm``): the fused kernel needs the input's dtype to equal the weight's, and
under autocast over fp32 weights the bf16 projection meets an fp32 weight (torch warns: "Mismatch
dtype between input and weight ... Cannot dispatch to fused implementation"). Counted op by op
with a dispatch mode (tests/comm_bench/test_step_model.py): forward a cast to fp32 (2 + 4),
``pow`` (4 + 4), ``mean`` (4), ``add_`` and ``rsqrt`` on the row statistics, two products
(4 + 4 each) and the cast back (4 + 2) = 40; backward 16 passes, 108. Kernels on one H200
(results/heldout5/probe_ce_qknorm.json, ``tools/kernel_probe.py --parts qk_norm``): 8 forward and
17 backward per norm (a memset among them), 2.3-2.8 TB/s at these bytes; with bf16 weights the
fused kernel runs instead (1 and 4 kernels). In results/heldout5's eager Qwen3-shaped steps the
step held 2,800 more kernels than the plain RMSNorm would give (28 layers, 2 micro-batches)."""


def composite_qk_norm(plan: Plan) -> bool:
    """Whether the plan's query and key RMSNorms (Qwen3's, whatever the model's other norms)
    run as torch's composite (``EAGER_QK_NORM``): eager, under autocast over fp32 weights (the
    reference loop; bf16 weights and compiled steps fuse them)."""
    return plan.model.qk_norm and kernel_stack(plan) == "eager" and autocast_weights(plan)


def eager_qk_norm_launches(plan: Plan) -> dict[str, float]:
    """``EAGER_QK_NORM``'s launches where the plan runs the composite norms, else none."""
    if not composite_qk_norm(plan):
        return {"forward": 0.0, "backward": 0.0}
    forward, backward = EAGER_QK_NORM["launches"]
    return {"forward": forward, "backward": backward}


def elementwise_backward_bytes(plan: Plan, forward_bytes: float) -> float:
    """Bytes of a layer's memory-bound backward: twice its forward's, the composite query and
    key norms at their own count (``EAGER_QK_NORM``)."""
    if not composite_qk_norm(plan):
        return 2 * forward_bytes
    qk_forward, qk_backward = EAGER_QK_NORM["bytes"]
    elements = qk_norm_elements(plan)
    return 2 * (forward_bytes - qk_forward * elements) + qk_backward * elements


def eager_rotary_launches(plan: Plan) -> dict[str, float]:
    """``EAGER_ROTARY_LAUNCHES`` where the plan runs ``commbench --step``'s eager rotary (rope
    on the eager stack under autocast), else none."""
    runs = (
        plan.model.position_embedding == "rope"
        and kernel_stack(plan) == "eager"
        and autocast_weights(plan)
    )
    return dict(EAGER_ROTARY_LAUNCHES) if runs else {"forward": 0.0, "backward": 0.0}


AUTOCAST_BIAS_CASTS = 4.0
"""Launches a layer's four biased linears add under autocast over fp32 weights, in the forward
and again in the backward: each bias is cast to bf16 beside its weight, and its bf16 gradient
cast back to fp32 (results/h100_heldout's GPT-style eager trace, 48 layer-micro-batches: 10
casts per layer in the linears' forward against the 6 of the unbiased Llama-style trace, and
4.25 more casts per layer in the backward). They ride on the layer's weight casts
(``weight_cast``, ``grad_cast``), whose bytes already count the biases. Compiled too: the
compiled GPT-style files of results/h100_heldout launch 2.22 and 2.35 kernels per modelled
kernel with them counted apart, 2.57 and 2.69 without, against 2.05-2.22 for the compiled
Llama-style files."""
EAGER_GQA_REPEAT_LAUNCHES = {"forward": 2.0, "backward": 2.0}
"""Kernels the eager stack's grouped-query attention launches per layer and micro-batch to
repeat K and V to every query head (``repeat_interleave`` in ``commbench --step``'s model,
``repeat_kv`` in torchtitan's): one copy each in the forward, one sum each in the backward
(counted in results/h100_heldout/traced's trace of a 12-layer, 12/4-head step: 48
``repeat_interleave`` copies and 48 sums over 24 layer-micro-batches). Part of the attention
core, so a selective or full recompute launches them again."""


def repeats_kv(plan: Plan) -> bool:
    """Whether the plan's eager attention copies K and V to every query head: fewer K/V heads
    than query heads, unless ``training.repeat_kv`` says the attention call takes them grouped."""
    model = plan.model
    grouped = model.num_kv_heads < model.num_heads
    return kernel_stack(plan) == "eager" and grouped and plan.training.repeat_kv


def eager_gqa_repeat_launches(plan: Plan) -> dict[str, float]:
    """``EAGER_GQA_REPEAT_LAUNCHES`` where the eager stack repeats K and V (``repeats_kv``; the
    bytes are in ``elementwise_forward_bytes``), else none."""
    runs = repeats_kv(plan)
    return dict(EAGER_GQA_REPEAT_LAUNCHES) if runs else {"forward": 0.0, "backward": 0.0}


def unfused_norm(plan: Plan) -> bool:
    """Whether the plan's RMSNorms run as separate eager kernels (``training.fused_norm``)."""
    return (
        kernel_stack(plan) == "eager"
        and plan.model.norm == "rmsnorm"
        and plan.training.fused_norm is False
    )


def norm_output_readers(model: ModelConfig) -> int:
    """Linears of one layer that read a norm's output: the attention's input projection (three
    with ``separate_projections``) and the MLP's (two, gate and up, when separate and gated)."""
    attention = 3 if model.separate_projections else 1
    if model.multi_latent:  # the query's and the key/value latent's down projections
        attention = 2
    mlp = 2 if model.separate_projections and model.gated_mlp else 1
    return attention + mlp


def norm_cast_bytes(plan: Plan) -> float:
    """Bytes of one layer's casts of its fp32 norm outputs to bf16 per micro-batch on one GPU
    (``FP32_RESIDUAL_BYTES``; their gradients are cast back in the backward): autocast casts the
    input of every linear that reads a norm's output, each a copy of its own
    (``norm_output_readers``: two in a fused layer, sequential or parallel, five with separate
    gated projections; results/heldout5/traced's separate-projection step against its fused
    twin); 0 where the residual stream is bf16 or the casts are fused."""
    if not autocast_weights(plan):
        return 0.0
    cast = FP32_RESIDUAL_BYTES[kernel_stack(plan)]["cast"]
    return norm_output_readers(plan.model) * cast * residual_stream_elements(plan)


def norm_grad_cast_bytes(plan: Plan) -> float:
    """Bytes of one layer's backward casts where the residual stream is fp32
    (``FP32_RESIDUAL_BRANCH_CASTS``): each linear that read a norm's cast output turns its input's
    bf16 gradient into fp32 (``norm_output_readers``), and each residual add gives its bf16
    branch (attention, MLP) the fp32 stream's gradient cast down: readers + 2, four in a fused
    layer, seven with separate gated projections (results/heldout5/traced's trace: five
    bf16-to-fp32 and two fp32-to-bf16 activation-sized casts per layer and micro-batch)."""
    casts = norm_cast_bytes(plan)
    if not casts:
        return 0.0
    readers = norm_output_readers(plan.model)
    return casts * (readers + FP32_RESIDUAL_BRANCH_CASTS) / readers


def split_grad_bytes(plan: Plan) -> float:
    """Bytes of one layer's split-backward concatenations per micro-batch on one GPU
    (``EAGER_SPLIT_GRAD_BYTES``): eager, the QKV output and the up projection's when gated;
    compiled, the QKV output only (its q, k and v gradients come from the attention backward's
    separate outputs: ``triton_poi_fused_cat_transpose`` in the compiled GPT trace, while the
    gated MLP's two gradients come from one fused kernel that writes them in place). Latent
    attention splits the query up projection's output (non-rotary and rotary channels), the
    key/value one's (keys and values) and the key/value latent (latent and rotary key), and
    the backward concatenates each one's gradients (torchtitan's DeepSeek-V3,
    ``commbench --step``'s ``LatentAttention``)."""
    stack = kernel_stack(plan)
    model = plan.model
    if stack not in ("eager", "compile"):
        return 0.0
    _, _, up, _ = weight_gemm_shapes(plan)
    gated = stack == "eager" and model.gated_mlp and not model.separate_projections
    return attention_split_grad_bytes(plan) + (
        EAGER_SPLIT_GRAD_BYTES * up[0] * up[1] if gated else 0.0
    )


def attention_split_grad_bytes(plan: Plan) -> float:
    """The attention's part of ``split_grad_bytes`` (an MoE layer's whole part: its experts'
    GEMMs are grouped): the fused QKV output's concatenation, none for separate linears, latent
    attention's up projections' outputs and key/value latent."""
    model = plan.model
    if kernel_stack(plan) not in ("eager", "compile"):
        return 0.0
    if model.multi_latent:  # the up projections' outputs and the key/value latent, split
        heads = model.q_size + model.num_heads * (model.head_dim + model.value_head_dim)
        latent = model.kv_lora_rank + model.qk_rope_head_dim
        return EAGER_SPLIT_GRAD_BYTES * _tokens(plan) * (heads / plan.parallel.tp + latent)
    if model.separate_projections:  # separate linears: no fused weight, no split
        return 0.0
    qkv = weight_gemm_shapes(plan)[0]
    return EAGER_SPLIT_GRAD_BYTES * qkv[0] * qkv[1]


def attention_layout_bytes(plan: Plan) -> float:
    """Bytes of one eager layer's attention-output layout copy per micro-batch on one GPU
    (``EAGER_ATTENTION_LAYOUT_BYTES``; the same again in the backward); 0 on the fused stacks."""
    if kernel_stack(plan) != "eager":
        return 0.0
    width = plan.model.attention_out_size / plan.parallel.tp
    return EAGER_ATTENTION_LAYOUT_BYTES * _tokens(plan) * width


def bias_grad_kernels(plan: Plan) -> tuple[Kernel, ...]:
    """The bias gradients of one layer's biased linears (QKV, projection, MLP up and down) per
    micro-batch on one GPU: each output gradient read once more (``BIAS_GRAD_BYTES``)."""
    if not plan.model.linear_bias:
        return ()
    shapes = linear_gemm_shapes(plan)
    if plan.model.multi_latent:  # Megatron-Core's latent linears have no biases
        shapes = shapes[1:]
    outputs = sum(m * n for gemms in shapes for m, n, _ in gemms)
    return (memory("bias_grad", BIAS_GRAD_BYTES * outputs),)


def weight_cast_bytes(plan: Plan, layer_params: float) -> float:
    """Autocast's weight casts per micro-batch of one layer (0 where weights are kept in bf16:
    Megatron, DeepSpeed and FSDP, whose mixed precision casts the shard before gathering)."""
    return WEIGHT_CAST_BYTES_PER_PARAM * layer_params if autocast_weights(plan) else 0.0


def autocast_weights(plan: Plan) -> bool:
    """Whether the step runs under ``torch.autocast`` over fp32 weights: a torch DDP (or
    one-GPU) step whose ``training.mixed_precision`` is ``autocast``."""
    return torch_ddp_step(plan) and plan.training.mixed_precision == "autocast"


def torch_ddp_step(plan: Plan) -> bool:
    """Whether the plan's weights live as a torch DDP (or one-GPU) loop keeps them, under
    ``training.mixed_precision`` (not Megatron, FSDP or ZeRO, which keep their own)."""
    return (
        kernel_stack(plan) != "megatron" and data_parallel_kind(plan.parallel).autocast_weight_casts
    )


def grad_bytes_per_element(plan: Plan) -> int:
    """Bytes of one weight-gradient element of a torch DDP step: fp32 under autocast, else bf16
    (``bf16_weights``, the default)."""
    return 4 if plan.training.mixed_precision == "autocast" else 2


MASTER_COPY_BYTES_PER_PARAM = 12
"""``bf16_weights``: before Adam the bf16 gradients are copied into the fp32 master gradients
(read 2, write 4) and after it the fp32 master weights into the bf16 weights (read 4, write 2)."""


def master_copy_bytes(plan: Plan, optimizer_params: float) -> float:
    """The optimizer's copies between bf16 weights and fp32 master weights in a step (0 unless
    a torch DDP step keeps ``bf16_weights``)."""
    if not torch_ddp_step(plan) or plan.training.mixed_precision == "autocast":
        return 0.0
    return MASTER_COPY_BYTES_PER_PARAM * optimizer_params


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionShape:
    """The attention core's dimensions on one GPU."""

    batch: float
    """Sequences in the micro-batch."""
    num_heads: float
    """Query heads on this GPU, a / t."""
    seq_q: float
    """Query tokens on this GPU, s / cp."""
    seq_kv: float
    """Key/value tokens attended to, s (context parallelism passes all of them around)."""
    head_dim: float
    """d of the queries and keys: h / a unless ``model.head_dim`` sets it apart, with the
    rotary part under multi-head latent attention (``model.qk_head_dim``)."""
    value_head_dim: float
    """d of the values and the output (``model.value_head_dim``)."""


def attention_shape(plan: Plan) -> AttentionShape:
    """The attention core's dimensions on one GPU of the plan."""
    model, parallel = plan.model, plan.parallel
    return AttentionShape(
        batch=plan.training.micro_batch_size,
        num_heads=model.num_heads / parallel.tp,
        seq_q=model.seq_len / parallel.cp,
        seq_kv=model.seq_len,
        head_dim=model.qk_head_dim,
        value_head_dim=model.value_head_dim,
    )


def _with_launches(kernels: tuple[Kernel, ...], launches: float) -> tuple[Kernel, ...]:
    """``kernels`` with ``launches`` more on the first (the repeat before the ring's rounds)."""
    if not kernels or not launches:
        return kernels
    first = kernels[0]
    return (replace(first, extra_launches=first.extra_launches + launches), *kernels[1:])


def attention_core_kernels(plan: Plan) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
    """(forward, backward) kernels of the attention core on one GPU.

    Fused: one kernel, causal (a sliding window skips the blocks outside it). Eager: QK^T and
    AV as batched GEMMs over the full s x s scores (the causal or window mask is applied after
    the product) plus a softmax reading and writing them; the
    backward runs each of them twice (dS/dV and dQ/dK products, softmax backward). The eager
    score GEMMs are priced by their FLOPs alone: the softmax kernel carries the scores' bytes.
    With dropout, eager attention drops out the probabilities in a kernel of its own, forward
    and backward (``DROPOUT_BYTES``). Under torch's context parallel: the kernels of its ring
    (``schedules.context_parallel``).
    """
    repeat = eager_gqa_repeat_launches(plan)
    if runs_torch_ring(plan, kernel_stack(plan)):
        ring = ring_attention(plan, kernel_stack(plan))
        return (
            _with_launches(ring_kernels(plan, ring.forward), repeat["forward"]),
            _with_launches(ring_kernels(plan, ring.backward, backward=True), repeat["backward"]),
        )
    _, dtype = dtypes(plan)
    shape = attention_shape(plan)
    seq_q, seq_kv, d = shape.seq_q, shape.seq_kv, shape.head_dim
    dv = shape.value_head_dim
    if plan.training.flash_attention:
        forward, backward = (
            attention(
                batch=shape.batch,
                num_heads=shape.num_heads,
                seq_q=seq_q,
                seq_kv=seq_kv,
                head_dim=d,
                causal=True,
                dtype=dtype,
                backward=is_backward,
                backend=plan.training.attention_backend,
                window=plan.model.attention_window,
                value_head_dim=dv if dv != d else 0.0,
            )
            for is_backward in (False, True)
        )
        outputs = shape.batch * shape.num_heads * seq_q * dv  # the output and its gradient
        aux = memory("attention_backward_aux", FUSED_ATTENTION_BACKWARD_AUX_BYTES * outputs, "copy")
        return (replace(forward, extra_launches=repeat["forward"]),), (
            aux,
            replace(backward, extra_launches=repeat["backward"]),
        )
    scores = shape.batch * shape.num_heads * seq_q * seq_kv
    qk = Kernel(
        name="scores", kind="gemm", dtype=dtype, flops=2.0 * scores * d, dims=(seq_q, seq_kv, d)
    )
    av = Kernel(
        name="context", kind="gemm", dtype=dtype, flops=2.0 * scores * dv, dims=(seq_q, dv, seq_kv)
    )
    softmax = replace(
        memory("softmax", 2 * ACTIVATION_BYTES * scores), extra_launches=repeat["forward"]
    )
    softmax_backward = replace(
        memory("softmax_backward", 2 * 2 * ACTIVATION_BYTES * scores),
        extra_launches=repeat["backward"],
    )
    if not plan.model.dropout:
        return (qk, av, softmax), (qk, av, qk, av, softmax_backward)
    dropout = memory("attention_dropout", DROPOUT_BYTES * scores)
    dropout_backward = memory("attention_dropout_backward", DROPOUT_BYTES * scores)
    return (qk, softmax, dropout, av), (qk, av, dropout_backward, qk, av, softmax_backward)


DROPOUT_BYTES = 2 * ACTIVATION_BYTES + 1
"""Bytes per element of a dropout on 16-bit activations, forward and backward alike: torch's
``native_dropout`` reads the input and writes the output and a one-byte mask (``b8``);
``native_dropout_backward`` reads the gradient and the mask and writes the gradient. Unfused
attention runs one on the s x s probabilities after the softmax (Megatron-LM's
``attention_probs = self.attention_dropout(attention_probs)``, in ``ParallelAttention`` of 2021
and ``megatron/core/transformer/dot_product_attention.py`` since; a fused attention kernel drops
out inside itself)."""
DROPOUT_MASK_BYTES = 1
"""Bytes per element a dropout fused into the residual add adds to it: the one-byte mask it
writes (Megatron-LM's ``bias_dropout_add_fused_train``, after the attention projection and
after the MLP; read back in the backward)."""


def ring_work_kernels(plan: Plan, work: RingWork, *, backward: bool = False) -> tuple[Kernel, ...]:
    """One stretch of torch's ring attention: its fused attention calls (their backward with
    ``backward``), then its memory-bound passes."""
    _, dtype = dtypes(plan)
    shape = attention_shape(plan)
    calls = tuple(
        attention(
            batch=shape.batch,
            num_heads=shape.num_heads,
            seq_q=call.seq_q,
            seq_kv=call.seq_kv,
            head_dim=shape.head_dim,
            causal=call.causal,
            dtype=dtype,
            backward=backward,
            backend=plan.training.attention_backend,
        )
        for call in work.attention
    )
    return calls + tuple(memory(f"cp_{name}", size) for name, size in work.passes)


def ring_kernels(
    plan: Plan, steps: tuple[RingStep, ...], *, backward: bool = False
) -> tuple[Kernel, ...]:
    """Every kernel of a ring pass, in order (``ring_work_kernels`` of each of its works)."""
    return tuple(
        kernel
        for step in steps
        if isinstance(step, RingWork)
        for kernel in ring_work_kernels(plan, step, backward=backward)
    )


def checkpoint_tail_skipped(plan: Plan) -> bool:
    """Whether a full recompute leaves out the layer's tail (``full_recompute_kernels``): on the
    PyTorch stacks, for a layer whose MLP output projection is its last linear."""
    return (
        plan.parallel.recompute == "full"
        and kernel_stack(plan) != "megatron"
        and not plan.model.parallel_block
    )


def full_recompute_kernels(plan: Plan, forward: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
    """What a full recompute reruns of a layer's ``forward``.

    Megatron's checkpoint (``tensor_parallel.checkpoint``, a reentrant autograd function) runs
    the layers' whole forward again, their TP collectives included. PyTorch's
    (``torch.utils.checkpoint``, non-reentrant: torchtitan's ``checkpoint_wrapper``, FSDP's)
    reruns only what the backward reads: eager, it stops as soon as every saved tensor is back
    (``set_checkpoint_early_stop``, on by default), after the MLP output projection that saves
    its input, so the reduce-scatter (or all-reduce) of that projection's output and the
    residual add after it do not run again; compiled, Inductor's partitioner puts in the
    backward graph only the forward nodes the backward reads, and no backward node reads the
    MLP output projection's result: its GEMM is left out as well (``schedules.actions.
    tp_backward_steps`` drops the collective, its copies are the ``full_recompute`` phase's). An
    MoE layer (no MLP output projection: its tail is the combine) and a parallel block rerun
    their whole forward."""
    if not checkpoint_tail_skipped(plan) or not any(k.name == "fc2" for k in forward):
        return forward
    compiled = kernel_stack(plan) == "compile"
    copies = ("dtensor_sequence_copy", "async_tp_copy")
    kept = tuple(
        k
        for k in forward
        if k.name not in copies and not (compiled and k.name == "fc2" and k.kind == "gemm")
    )
    return (*kept, *_sequence_copies(plan, "full_recompute"))


def recompute_kernels(
    plan: Plan,
    forward: tuple[Kernel, ...],
    core_forward: tuple[Kernel, ...],
    elementwise_bytes: float,
    *,
    moe_layer: bool = False,
) -> tuple[Kernel, ...]:
    """What the backward runs again under ``parallel.recompute``: nothing, the attention core
    and the other modules Megatron-Core's selective recompute lists (``selective``:
    ``selective_recompute_kernels``), the forward (``full``: ``full_recompute_kernels``) or the
    per-op policy's kernels (``op``). ``moe_layer``: ``forward`` is an MoE layer's."""
    recompute = plan.parallel.recompute
    if recompute == "selective":
        return selective_recompute_kernels(plan, forward, core_forward, moe_layer=moe_layer)
    return {
        "none": (),
        "full": full_recompute_kernels(plan, forward),
        "op": op_recompute_kernels(plan, elementwise_bytes),
    }[recompute]


def selective_recompute_kernels(
    plan: Plan,
    forward: tuple[Kernel, ...],
    core_forward: tuple[Kernel, ...],
    *,
    moe_layer: bool,
) -> tuple[Kernel, ...]:
    """The kernels of the modules selective recompute reruns (``schedules.recompute_modules``;
    the attention core alone by default): the attention core; latent attention's up-projection
    GEMMs with their fused latent norms, rotary and head assembly (``mla_up_proj``); the
    separate norms (``layernorm``); a dense layer's MLP GEMMs (their casts included), its fused
    norm and activation (``mlp``); the experts' activation (``moe_act``); the shared experts'
    GEMMs and activation (``shared_experts``)."""
    modules = selective_modules(plan.parallel)
    model, parallel = plan.model, plan.parallel
    per = ELEMENTWISE_BYTES[kernel_stack(plan)]
    act = per["gated" if model.gated_mlp else "plain"]
    norm, stream, tokens = per[model.norm], residual_stream_elements(plan), _tokens(plan)
    out: list[Kernel] = list(core_forward) if "core_attn" in modules else []
    if "mla_up_proj" in modules and model.multi_latent:
        gemm_dtype, _ = dtypes(plan)
        shapes = linear_gemm_shapes(plan)[0]
        linears = latent_linears(model)
        out += [
            gemm("mla_up_proj_recompute", m, n, k, gemm_dtype)
            for (m, n, k), linear in zip(shapes, linears, strict=True)
            if not linear.duplicated  # the up projections and a direct query projection
        ]
        latents = norm * latent_norm_elements(
            model, tokens, latent_split(plan.parallel, kernel_stack(plan))
        )
        rotary = per["rotary"] * tokens * rotary_width(plan)
        out.append(memory("mla_up_proj_recompute", latents + rotary + latent_assembly_bytes(plan)))
    norms = separate_norms(plan, moe_layer=moe_layer)
    if "layernorm" in modules and norms:
        out.append(memory("layernorm_recompute", norm * stream * norms))
    if "mlp" in modules and not moe_layer:
        out += [k for k in forward if k.name.removesuffix("_fp8_cast") in ("fc1", "fc2")]
        mlp = act * tokens * model.ffn_hidden_size / parallel.tp + norm * stream
        out.append(memory("mlp_recompute", mlp))
    if "moe_act" in modules and moe_layer:
        experts = expert_tokens(plan) * expert_width(model) / parallel.expert_tp
        out.append(memory("moe_act_recompute", act * experts))
    if "shared_experts" in modules and moe_layer:
        out += [k for k in forward if k.name in ("shared_fc1", "shared_fc2")]
        shared = act * tokens * model.moe_shared_expert_ffn_hidden_size / parallel.tp
        out.append(memory("shared_experts_recompute", shared))
    return tuple(out)


def op_recompute_kernels(plan: Plan, elementwise_bytes: float) -> tuple[Kernel, ...]:
    """What torchtitan's per-op selective checkpointing reruns before a layer's backward: the
    matmuls it does not save (``schedules.flops.op_recomputed_gemms``, TP-sharded) and every
    memory-bound kernel of the forward; the attention kernel's outputs are kept."""
    gemm_dtype, _ = dtypes(plan)
    tokens, t = _tokens(plan), plan.parallel.tp
    kv, h, f = plan.model.kv_size, plan.model.hidden_size, plan.model.ffn_hidden_size
    shapes = [("k", tokens, kv / t, h), ("proj", tokens, h, plan.model.q_size / t)]
    if plan.model.gated_mlp:  # a plain MLP's fc2 output only feeds the residual: not rerun
        shapes.append(("fc1_up", tokens, f / t, h))
    # every memory-bound kernel of the forward again, with the launches its code gives it
    launches = eager_rotary_launches(plan)["forward"] + eager_qk_norm_launches(plan)["forward"]
    elementwise = replace(memory("elementwise", elementwise_bytes), extra_launches=launches)
    if float8_recipe(plan, kernel_stack(plan)) is not None:
        return (
            *(
                kernel
                for name, m, n, k in shapes
                for kernel in _float8_linear(plan, name, (m, n, k), label=f"{name}_recompute")[0]
            ),
            elementwise,
            *_sequence_copies(plan, "op_recompute"),
        )
    return (
        *(gemm(f"{name}_recompute", m, n, k, gemm_dtype) for name, m, n, k in shapes),
        elementwise,
        *_sequence_copies(plan, "op_recompute"),
    )


Phases = tuple[tuple[Kernel, ...], tuple[Kernel, ...], tuple[Kernel, ...]]
"""Kernels of a forward, an input backward and a weight backward."""


def weight_gemm_kernels(plan: Plan) -> Phases:
    """The weight GEMMs of one layer (``WEIGHT_GEMMS``), per phase: forward, input gradients,
    weight gradients; under a float8 recipe each with its casts (``schedules.float8``); with
    separate linears the fused ones split (``separate_projection_kernels``)."""
    gemm_dtype, _ = dtypes(plan)
    named = list(zip(WEIGHT_GEMMS, weight_gemm_shapes(plan), strict=True))
    if float8_recipe(plan, kernel_stack(plan)) is not None:
        linears = [_float8_linear(plan, name, shape) for name, shape in named]
        forward, dgrad, wgrad = ([k for phases in linears for k in phases[i]] for i in range(3))
        phases = tuple(forward), tuple(dgrad), tuple(wgrad)
    elif te_recipe(plan) is not None:
        linears = [_te_linear(plan, name, shape) for name, shape in named]
        forward, dgrad, wgrad = ([k for phases in linears for k in phases[i]] for i in range(3))
        phases = tuple(forward), tuple(dgrad), tuple(wgrad)
    else:
        phases = (
            tuple(compiled_gemm(plan, name, m, n, k, gemm_dtype) for name, (m, n, k) in named),
            tuple(
                compiled_gemm(plan, f"{name}_dgrad", m, k, n, gemm_dtype)
                for name, (m, n, k) in named
            ),
            tuple(
                compiled_gemm(plan, f"{name}_wgrad", k, n, m, gemm_dtype)
                for name, (m, n, k) in named
            ),
        )
    return separate_projection_kernels(plan, phases)


PROJECTION_SUM_BYTES = 2
"""Bytes per element of each extra partial input gradient that separate projections sum
(``model.separate_projections``): autograd adds the q, k and v linears' input gradients (and a
gated MLP's gate and up ones) into their common input's gradient; Inductor fuses the adds into
the next kernel that reads the sum, so each extra bf16 partial is read once more. The eager stack
runs each add as a kernel of its own (``EAGER_PROJECTION_SUM_ACCESSES``)."""
EAGER_PROJECTION_SUM_ACCESSES = 3
"""Elements an eager add of one more partial input gradient reads and writes per element (the
sum so far and the partial, the new sum), in the gradients' dtype: fp32 under autocast over fp32
weights (each partial comes out of its linear's input cast), else bf16. results/heldout5/traced's
separate-projection step runs 72 more fp32 adds of that size than its fused twin (three per layer
and micro-batch: two for q, k and v, one for gate and up)."""


def projection_sum_bytes_per_element(plan: Plan) -> float:
    """Bytes per element of each extra partial input gradient separate projections sum."""
    if kernel_stack(plan) != "eager":
        return PROJECTION_SUM_BYTES
    return EAGER_PROJECTION_SUM_ACCESSES * (4 if autocast_weights(plan) else ACTIVATION_BYTES)


def _projection_pieces(plan: Plan) -> dict[str, tuple[tuple[float, float, bool, float], ...]]:
    """(output width per GPU, input width, whether it reads the fused GEMM's input, its share of
    the fused GEMM's tokens) of the separate linears a fused GEMM of ``WEIGHT_GEMMS`` stands
    for: with ``model.separate_projections`` the query, key and value projections and a gated
    MLP's gate and up ones; under multi-head latent attention its down and up projections
    (``schedules.mla``) whatever ``separate_projections`` says: the down ones whole on every TP
    rank, on the rank's own tokens under sequence parallelism (Megatron-Core runs them before
    any gather and gathers the narrow latents in the up projections), the up ones reading the
    latents."""
    model, parallel = plan.model, plan.parallel
    t = parallel.tp
    pieces: dict[str, tuple[tuple[float, float, bool, float], ...]] = {}
    h = model.hidden_size
    if model.multi_latent:
        own_tokens = 1 / latent_split(plan.parallel, kernel_stack(plan))
        pieces["qkv"] = tuple(
            (
                x.out_width_per_gpu(t),
                x.in_width,
                not x.name.endswith("_up"),
                own_tokens if x.duplicated else 1.0,
            )
            for x in latent_linears(model)
        )
    elif model.separate_projections:
        q, kv = model.q_size / t, model.kv_size / t
        pieces["qkv"] = ((q, h, True, 1.0), (kv, h, True, 1.0), (kv, h, True, 1.0))
    if model.separate_projections and model.gated_mlp:
        f = model.ffn_hidden_size / t
        pieces["fc1"] = ((f, h, True, 1.0), (f, h, True, 1.0))
    return pieces


def linear_gemm_shapes(plan: Plan) -> tuple[tuple[tuple[float, float, float], ...], ...]:
    """``weight_gemm_shapes``, each as the forward GEMMs that run it: the fused one, or one per
    separate linear where the model has them (``_projection_pieces``)."""
    pieces = _projection_pieces(plan)
    return tuple(
        tuple((m * share, width, depth) for width, depth, _, share in pieces[name])
        if name in pieces
        else ((m, n, k),)
        for name, (m, n, k) in zip(WEIGHT_GEMMS, weight_gemm_shapes(plan), strict=True)
    )


def separate_projection_kernels(plan: Plan, phases: Phases) -> Phases:
    """``phases`` (forward, input gradients, weight gradients) with each fused projection GEMM
    split into the GEMMs of its separate linears where the model has them
    (``_projection_pieces``: ``model.separate_projections``, torchtitan's
    ``models/llama3/model.py``: ``wq``, ``wk``, ``wv``, ``w1``, ``w3``, each an ``nn.Linear`` its
    TP plan parallelises on its own, and Inductor's linear batching passes are off by default:
    ``pre_grad_fusion_options`` empty; multi-head latent attention's down and up projections).
    Each piece keeps the fused kernel's name, dtype and backend and takes its own widths; the
    pieces that read the fused GEMM's input each write a whole partial input gradient, summed at
    ``projection_sum_bytes_per_element``. Casts stay as the fused linear's."""
    pieces = _projection_pieces(plan)
    if not pieces:
        return phases
    split: list[tuple[Kernel, ...]] = []
    partials = 0.0
    for phase, kernels in enumerate(phases):
        out: list[Kernel] = []
        for kernel in kernels:
            base = kernel.name.removesuffix("_dgrad").removesuffix("_wgrad")
            parts = pieces.get(base)
            if kernel.kind != "gemm" or parts is None:
                out.append(kernel)
                continue
            fused_tokens = kernel.dims[2] if phase == 2 else kernel.dims[0]
            for width, depth, _, share in parts:
                tokens = fused_tokens * share
                m, n, k = ((tokens, width, depth), (tokens, depth, width), (depth, width, tokens))[
                    phase
                ]
                out.append(
                    gemm(kernel.name, m, n, k, kernel.dtype, kernel.backend)
                    if kernel.backend
                    else compiled_gemm(plan, kernel.name, m, n, k, kernel.dtype)
                )
            if phase == 1:
                readers = [share for _, _, reads_input, share in parts if reads_input]
                partials += sum(readers[1:]) * kernel.dims[0] * kernel.dims[1]
        split.append(tuple(out))
    if partials:
        total = projection_sum_bytes_per_element(plan) * partials
        split[1] = (*split[1], memory("projection_grad_sum", total))
    return split[0], split[1], split[2]


def _float8_linear(
    plan: Plan, name: str, shape: tuple[float, float, float], label: str = ""
) -> Phases:
    """One torchao ``Float8Linear`` ``name`` of forward shape (m, n, k), its kernels named
    ``label`` (default ``name``): its float8 casts (one memory kernel per phase that casts)
    before its GEMMs, per phase."""
    m, n, k = shape
    stack, label = kernel_stack(plan), label or name
    cast = cast_bytes(plan, stack, name, shape)
    casts = [
        (memory(f"{label}{suffix}_fp8_cast", size),) if size else ()
        for suffix, size in zip(("", "_dgrad", "_wgrad"), cast, strict=True)
    ]
    return (
        (*casts[0], gemm(label, m, n, k, "fp8", forward_backend(plan, stack))),
        (*casts[1], gemm(f"{label}_dgrad", m, k, n, "fp8")),
        (*casts[2], gemm(f"{label}_wgrad", k, n, m, wgrad_dtype(plan, stack))),
    )


def _te_linear(plan: Plan, name: str, shape: tuple[float, float, float]) -> Phases:
    """One Transformer Engine linear ``name`` of forward shape (m, n, k): its FP8 casts and
    transposes (one "copy" kernel per phase that has any) before its three FP8 GEMMs."""
    m, n, k = shape
    casts = [
        (memory(f"{name}{suffix}_fp8_cast", size, "copy"),) if size else ()
        for suffix, size in zip(
            ("", "_dgrad", "_wgrad"), te_cast_bytes(plan, name, shape), strict=True
        )
    ]
    return (
        (*casts[0], gemm(name, m, n, k, "fp8")),
        (*casts[1], gemm(f"{name}_dgrad", m, k, n, "fp8")),
        (*casts[2], gemm(f"{name}_wgrad", k, n, m, "fp8")),
    )


DTENSOR_SEQUENCE_COPIES = {
    "forward": (2, 2),
    "backward": (2, 2),
    "op_recompute": (2, 0),
    "full_recompute": (2, 1),
}
"""Chunk + cat copies per layer and micro-batch, (after all-gathers, before reduce-scatters),
of PyTorch's tensor parallelism with sequence parallelism (DTensor ``SequenceParallel`` with
``ColwiseParallel(input_layouts=Shard(1))`` and ``RowwiseParallel(output_layouts=Shard(1))``,
torchtitan's plan): the activations are (batch, sequence, hidden) and shard on the sequence,
dim 1, while NCCL gathers and scatters along dim 0, so ``torch.distributed.
_functional_collectives`` rearranges every one: an all-gather on dim 1 returns
``torch.cat(torch.chunk(res, group_size, dim=0), dim=gather_dim)`` of its output, a
reduce-scatter on dim 1 runs ``torch.cat(torch.chunk(self, group_size, dim=scatter_dim))`` on
its input first. Forward: the attention's and the MLP's input all-gathers and output
reduce-scatters; backward: their gradients, a reduce-scatter and an all-gather each;
torchtitan's per-op recompute gathers the two inputs again; a full recompute reruns the
forward's but the MLP output's reduce-scatter (``full_recompute_kernels``). Each reads and
writes the whole gathered tensor, in the collective's element size (``tp_gather_bytes``:
float8 under torchtitan's float8 TP). Since pytorch/pytorch#169404 (December 2025) an
all-gather at micro-batch 1 is a view instead; the published runs here predate it, and the
copies are priced at every micro-batch size. Asynchronous TP has its own copies
(``_async_tp_copies``: the collectives it leaves unfused, and the gathered tensors its fused
kernels return strided, ``ASYNC_TP_RETURNED_GATHER``); not on the Megatron stack
(sequence-first activations: dim 0)."""


def dtensor_sequence_copies(plan: Plan) -> bool:
    """Whether the plan's TP collectives are DTensor's on the sequence dimension, each with a
    chunk + cat copy (``DTENSOR_SEQUENCE_COPIES``)."""
    parallel = plan.parallel
    return (
        parallel.tp > 1
        and parallel.sequence_parallel
        and not parallel.tp_comm_overlap
        and kernel_stack(plan) != "megatron"
    )


def tp_gather_bytes(plan: Plan) -> float:
    """Bytes of one sequence-parallel all-gather: ``tp_message_bytes``, halved where the gathered
    operands are cast to float8 on their shard first: torchtitan's float8 TP
    (``schedules.float8.sharded_casts``) and Transformer Engine's FP8 on the megatron stack (the
    norm writes the QKV and MLP inputs in FP8 into the gather, the row-parallel linears cast
    their output gradient's shard and gather it in FP8, ``distributed._all_gather_fp8``; the
    backward's re-gather of the saved FP8 input as well): the inputs of qkv and fc1, the output
    gradients of proj and fc2, all in float8 on the wire. The reduce-scatters stay bf16."""
    size = tp_message_bytes(plan.model, plan.training.micro_batch_size, cp=plan.parallel.cp)
    te_fp8 = te_recipe(plan) is not None and plan.parallel.sequence_parallel
    if te_fp8 or sharded_casts(plan, kernel_stack(plan)):
        return size * element_bytes("fp8") / ACTIVATION_COMM_BYTES
    return size


ASYNC_TP_SHARD_COPIES = 1
"""Copies of its own shard a fused all-gather + matmul makes on the compute stream under
PyTorch's asynchronous TP (``torch/distributed/_symmetric_memory/__init__.py``,
``_pipelined_all_gather_and_consume``, the same in torch 2.7.1 and 2.8.0): into its
symmetric-memory buffer before the barrier the remote ranks pull from (an SM copy); each reads
and writes one 1/t shard. With more than one sequence per micro-batch the shard is first laid out
sequence-major (``restride_A_shard_for_fused_all_gather_matmul``: the gather runs along the
sequence, dim 1): one copy more. Where the gathered tensor is returned
(``ASYNC_TP_RETURNED_GATHER``) the shard is also copied into its own slot of it."""
ASYNC_TP_RETURNED_GATHER = 2
"""Full-size copies (read and write the gathered tensor once, counted as 2 passes) of a fused
all-gather whose gathered tensor another kernel reads besides the fused matmuls (the micro-
pipeline pass keeps ``return_A`` then: ``torch/_inductor/fx_passes/micro_pipeline_tp.py``): the
weight-gradient matmuls of the same linears read it. The fused op returns it sequence-major as a
strided view of its rank-major buffer (``unflatten``: view, flatten, ``movedim(0, gather_dim)``),
which the weight gradient's ``reshape(b s, h)`` cannot view: Inductor copies it first, the copy
that DTensor's chunk + cat makes without asynchronous TP (``DTENSOR_SEQUENCE_COPIES``). With one
sequence per micro-batch the moved dimension has size 1 and the view is contiguous: no copy.
Returned: the two gradient all-gathers of the backward (proj's and fc2's output gradients), the
two input all-gathers when the forward keeps them (no recompute, or only the attention core) or a
full recompute gathers them again, and per-op recompute's re-gathers fused with wk and w3."""


def torch_async_tp(plan: Plan) -> bool:
    """Whether the plan's TP runs PyTorch's asynchronous TP (``tp_comm_overlap`` off the
    Megatron stack: Inductor's micro-pipeline pass over symmetric memory)."""
    parallel = plan.parallel
    return (
        parallel.tp > 1
        and parallel.sequence_parallel
        and parallel.tp_comm_overlap
        and kernel_stack(plan) != "megatron"
    )


def _async_tp_copies(plan: Plan, phase: str) -> tuple[Kernel, ...]:
    """Memory passes of PyTorch's asynchronous TP per layer and phase, as one kernel.

    Forward: each fused all-gather its shard copies (``ASYNC_TP_SHARD_COPIES``); each fused
    matmul + reduce-scatter (``_fused_matmul_reduce_scatter_impl``) sums the t partial chunks
    the other ranks computed for it (``reduce_fn`` over ``stacked_partials``: reads the whole
    output, writes its shard), its input laid out sequence-major first with more than one
    sequence per micro-batch (``restride_A_for_fused_matmul_reduce_scatter``). Backward
    (``schedules.tp_steps._torch_async_backward_steps``): the fused gradient all-gathers' shard
    copies; the chunk + cat copy of each reduce-scatter left to NCCL (``DTENSOR_SEQUENCE_
    COPIES``: the attention's, and a gated MLP's), a plain MLP's fused one as in the forward.
    Per-op recompute: the re-gathers fused with wk (and a gated MLP's w3) copy their shards, a
    plain MLP's unfused one is chunked and concatenated. Every gathered tensor the weight
    gradients read is copied whole once more (``ASYNC_TP_RETURNED_GATHER``), in the backward
    for the forward's and the gradients' gathers."""
    model, t = plan.model, plan.parallel.tp
    batch = plan.training.micro_batch_size
    gathered = tp_gather_bytes(plan)
    whole = tp_message_bytes(model, batch, cp=plan.parallel.cp)
    shard_copies = ASYNC_TP_SHARD_COPIES + (1 if batch > 1 else 0)
    relayout = ASYNC_TP_RETURNED_GATHER * gathered if batch > 1 else 0.0  # a returned tensor's
    relayouts = 1 if batch > 1 else 0

    def fused_gather(returned: bool) -> tuple[float, int]:
        """Bytes and launches of a fused all-gather, its gathered tensor ``returned`` or not."""
        copies = shard_copies + (1 if returned else 0)
        size = 2 * copies * gathered / t
        if returned:
            return size + relayout, copies + relayouts
        return size, copies

    def fused_scatter(width: float) -> tuple[float, int]:
        """Bytes and launches of a fused reduce-scatter whose matmul input is ``width`` wide."""
        restride = 2 * whole * width / (model.hidden_size * t) if batch > 1 else 0.0
        return whole * (1 + 1 / t) + restride, 1 + (1 if batch > 1 else 0)

    kept = plan.parallel.recompute in ("none", "selective", "full")  # the input gathers read again
    if phase == "forward":
        gather, gather_launches = fused_gather(returned=False)
        proj, proj_launches = fused_scatter(model.attention_out_size)
        fc2, fc2_launches = fused_scatter(model.ffn_hidden_size)
        size = 2 * gather + proj + fc2
        launches = 2 * gather_launches + proj_launches + fc2_launches
    elif phase == "backward":
        gather, gather_launches = fused_gather(returned=True)
        size, launches = 2 * gather + 2 * whole, 2 * gather_launches + 1
        if kept:  # the forward's gathered inputs: their slot copies and whole copies
            size += 2 * (2 * gathered / t + relayout)
            launches += 2 * (1 + relayouts)
        if model.gated_mlp:
            size, launches = size + 2 * whole, launches + 1
        else:
            fc1, fc1_launches = fused_scatter(model.ffn_hidden_size)
            size, launches = size + fc1, launches + fc1_launches
    elif phase == "full_recompute":  # the forward's but the MLP output's fused reduce-scatter
        gather, gather_launches = fused_gather(returned=False)
        proj, proj_launches = fused_scatter(model.attention_out_size)
        size, launches = 2 * gather + proj, 2 * gather_launches + proj_launches
    else:  # op_recompute
        gather, gather_launches = fused_gather(returned=True)
        size, launches = gather, gather_launches
        if model.gated_mlp:
            size, launches = size + gather, launches + gather_launches
        else:
            size, launches = size + 2 * gathered, launches + 1
    copy = memory("async_tp_copy", size, "copy", converts=False)
    return (replace(copy, extra_launches=launches - 1),)


def _sequence_copies(plan: Plan, phase: str) -> tuple[Kernel, ...]:
    """The phase's DTensor sequence-parallel copies as one kernel (each a launch of its own),
    or under asynchronous TP its own (``_async_tp_copies``)."""
    if torch_async_tp(plan):
        return _async_tp_copies(plan, phase)
    if not dtensor_sequence_copies(plan):
        return ()
    gathers, scatters = DTENSOR_SEQUENCE_COPIES[phase]  # per two TP regions (attention, MLP)
    branches = tp_branches_per_layer(plan.model)
    gathers, scatters = gathers * branches // 2, scatters * branches // 2
    scatter = tp_message_bytes(plan.model, plan.training.micro_batch_size, cp=plan.parallel.cp)
    size = 2 * (gathers * tp_gather_bytes(plan) + scatters * scatter)  # read and write each
    copy = memory("dtensor_sequence_copy", size, "copy", converts=False)
    return (replace(copy, extra_launches=gathers + scatters - 1),)


def layer_kernels(plan: Plan) -> PieceKernels:
    """One transformer layer, one micro-batch, one GPU: forward, backward split, recompute."""
    gemms_forward, gemms_dgrad, gemms_wgrad = weight_gemm_kernels(plan)
    core_forward, core_backward = attention_core_kernels(plan)
    elementwise_bytes = elementwise_forward_bytes(plan)
    cast_bytes = weight_cast_bytes(plan, layer_params_per_gpu(plan.model, plan.parallel.tp)) / 2
    bias_casts = AUTOCAST_BIAS_CASTS if plan.model.linear_bias and autocast_weights(plan) else 0
    if bias_casts and plan.model.multi_latent:  # the latent linears have no biases
        bias_casts -= 1
    casts = (
        (replace(memory("weight_cast", cast_bytes, "copy"), extra_launches=bias_casts),)
        if cast_bytes
        else ()
    )
    norm_casts = norm_cast_bytes(plan)
    # the launch ratio covers a fused layer's two casts; separate projections launch more
    more_casts = max(norm_output_readers(plan.model) - 2, 0) if norm_casts else 0
    layout = attention_layout_bytes(plan)
    layouts = (memory("attention_layout", layout, "copy", converts=False),) if layout else ()
    rotary, qk_norm = eager_rotary_launches(plan), eager_qk_norm_launches(plan)
    forward = (
        *casts,
        *gemms_forward,
        *core_forward,
        *layouts,
        replace(
            memory("elementwise", elementwise_bytes),
            extra_launches=rotary["forward"] + qk_norm["forward"],
        ),
        *(
            (replace(memory("norm_output_cast", norm_casts, "copy"), extra_launches=more_casts),)
            if norm_casts
            else ()
        ),
        *_sequence_copies(plan, "forward"),
    )
    recompute = recompute_kernels(plan, forward, core_forward, elementwise_bytes)
    return PieceKernels(
        forward=forward,
        backward_input=(
            *gemms_dgrad,
            *core_backward,
            *layouts,
            *(
                (memory("split_grad_cat", split, "copy", converts=False),)
                if (split := split_grad_bytes(plan))
                else ()
            ),
            replace(
                memory("elementwise_backward", elementwise_backward_bytes(plan, elementwise_bytes)),
                extra_launches=rotary["backward"] + qk_norm["backward"],
            ),
            *_sequence_copies(plan, "backward"),
            *(
                (
                    replace(
                        memory("norm_grad_cast", norm_grad_cast_bytes(plan), "copy"),
                        extra_launches=more_casts,
                    ),
                )
                if norm_casts
                else ()
            ),
            *(
                (replace(memory("grad_cast", cast_bytes, "copy"), extra_launches=bias_casts),)
                if cast_bytes
                else ()
            ),
        ),
        backward_weight=(
            *gemms_wgrad,
            *bias_grad_kernels(plan),
            *grad_accumulate_kernels(plan, layer_params_per_gpu(plan.model, plan.parallel.tp)),
        ),
        recompute=recompute,
    )


def embedding_kernels(plan: Plan) -> PieceKernels:
    """Word (and learned position) embedding: a row gather forward, a scatter-add backward. In
    a torch DDP step the backward writes the whole table's gradient (``embedding_dense_backward``
    zero-fills V h / t rows before adding the tokens' rows) and accumulates it over micro-batches.
    """
    tokens, h = _tokens(plan), plan.model.hidden_size
    passes = 2 + (3 if plan.model.position_embedding == "learned" else 0)
    params = embedding_params_per_gpu(plan.model, plan.parallel.tp)
    fill = grad_bytes_per_element(plan) * params if torch_ddp_step(plan) else 0.0
    dense = (memory("embedding_grad_fill", fill, "copy", converts=False),) if fill else ()
    return PieceKernels(
        forward=(memory("embedding", passes * ACTIVATION_BYTES * tokens * h),),
        backward_input=(),
        backward_weight=(
            *dense,
            memory("embedding_backward", 3 * ACTIVATION_BYTES * tokens * h),
            *grad_accumulate_kernels(plan, params),
        ),
    )


MEGATRON_VOCAB_DIVISOR = 128
"""Megatron-LM pads the vocabulary to a multiple of ``--make-vocab-size-divisible-by``
(default 128) times the tensor-parallel size (``_vocab_size_with_padding`` in
``megatron/training/tokenizer``), so its head GEMMs are aligned whatever the tokenizer's size."""


def head_vocab_per_gpu(plan: Plan) -> float:
    """Vocabulary columns of the LM head on one GPU: ``vocab_size / tp``, padded as Megatron
    pads it on the ``megatron`` stack."""
    vocab, tp = plan.model.vocab_size, plan.parallel.tp
    if kernel_stack(plan) == "megatron":
        multiple = MEGATRON_VOCAB_DIVISOR * tp
        vocab = -(-vocab // multiple) * multiple
    return vocab / tp


TORCH_CROSS_ENTROPY_BYTES = (
    (("logits_upcast", 6, "copy"), ("cross_entropy", 16, "loss")),
    (
        ("cross_entropy_grad_fill", 4, "copy"),
        ("cross_entropy_backward", 16, "loss"),
        ("logits_grad_cast", 6, "copy"),
    ),
)
"""Bytes per logit of the PyTorch loss ``cross_entropy(logits.float(), labels)`` run eagerly
(torchtitan, nanoGPT-style loops, ``commbench --step``), per kernel, forward then backward, with
the profile class each falls in: the fp32 upcast (read 2, write 4); ``log_softmax`` over a row
wider than 1,024 (``cunn_SoftMaxForward``: a max pass, a sum-of-exponentials pass and the output
pass read the row three times and write it once, 16); ``nll_loss_backward`` zero-fills the
dense fp32 gradient (4); ``log_softmax_backward`` (a sum pass over the gradient, then gradient
and output read and the result written, 16); the cast back to the bf16 logits' gradient (read
4, write 2). 48 in all where Megatron's unfused vocab-parallel loss makes 52
(``MEGATRON_CROSS_ENTROPY``). On the seven eager H100 files of refdata/h100 the loss class
(log-softmax and NLL kernels) takes 0.89-0.91 of the 32 bytes' time at the default bandwidth."""


MEGATRON_CROSS_ENTROPY: dict[str, tuple[tuple[tuple[str, float, str], ...], ...]] = {
    "none": (
        (
            ("logits_upcast", 6, "copy"),
            ("logits_max", 4, "loss"),
            ("logits_shift", 8, "loss"),
            ("logits_exp", 8, "loss"),
            ("exp_sum", 4, "loss"),
            ("softmax_divide", 8, "loss"),
        ),
        (("softmax_scale", 8, "loss"), ("logits_grad_cast", 6, "copy")),
    ),
    "native": (
        (
            ("logits_upcast_max", 6, "loss"),
            ("logits_shift_exp_sum", 8, "loss"),
            ("softmax_divide", 8, "loss"),
        ),
        (("softmax_copy", 8, "copy"), ("softmax_scale_cast", 10, "loss")),
    ),
    "te": (
        (("online_softmax", 2, "loss"), ("cross_entropy_grad", 6, "loss")),
        (("grad_scale", 8, "loss"), ("logits_grad_cast", 6, "copy")),
    ),
    "te_inplace": (
        (("online_softmax", 2, "loss"), ("cross_entropy_grad", 4, "loss")),
        (("grad_scale", 4, "loss"),),
    ),
}
"""Bytes per logit of each pass over the vocabulary-parallel logits of Megatron-Core's
cross-entropy (``training.cross_entropy_fusion``), per kernel, forward then backward, with the
profile class each falls in. Counted from the code (bf16 logits, fp32 math):

- ``none``, ``tensor_parallel/cross_entropy.py`` (the same passes since 2019):
  ``calculate_logits_max`` upcasts (read 2, write 4) and takes the row maximum (4);
  ``calculate_predicted_logits`` subtracts it in place (8), exponentiates in place (8) and sums
  (4); ``calculate_cross_entropy_loss`` divides in place (8): 38. Backward: the softmax scaled by
  the loss gradient in place (8), then autograd casts the fp32 gradient to the logits' bf16
  (6): 14. One H200 probe timed these 38 / 14 bytes at 3.0 / 3.4 TB/s
  (``results/heldout5/probe_ce_qknorm.json``).
- ``native``, ``fusions/fused_cross_entropy.py``: the same three steps, each compiled by
  ``megatron.core.jit.jit_fuser`` (``torch.compile`` from torch 2.2). Inductor fuses the upcast
  into the maximum's reduction (one kernel writing the fp32 copy, 6), the shift, exponential and
  sum into one (8, written back in place) and the division (8): 22. Backward: functionalising
  the in-place scatter of ``calculate_gradients`` copies the saved softmax first (8), and the
  scaled, cast gradient is written with the softmax's in-place update (read 4, write 4 + 2): 18.
  The fusions and the copy are read off Inductor's generated code for these functions
  (torch 2.13; SIMD scheduling fuses a pointwise node into a reduction of the same extent).
- ``te``, Transformer Engine's ``triton/cross_entropy.py`` from 2.18: an online-softmax pass
  reads the logits (2); a second reads them again and writes the fp32 gradient (2 + 4).
  Backward: the gradient scaled in place (8), cast to bf16 by autograd (6).
- ``te_inplace``, the same kernels from 2.2 to 2.17, which wrote the gradient over the bf16
  logits: 2 + (2 + 2) forward, 4 backward."""
CROSS_ENTROPY_MOVES = frozenset({"cross_entropy_grad_fill", "softmax_copy"})
"""The copy-class passes of the loss tables that move or fill bytes without converting them
(``Kernel.converts``): PyTorch's zero fill of the dense gradient, the native fusion's fp32 copy
of the softmax."""
MEGATRON_CROSS_ENTROPY_SMALL_KERNELS = {
    "none": (12, 6),
    "native": (3, 1),
    "te": (4, 2),
    "te_inplace": (4, 2),
}
"""Kernels over one value per token (or fewer) that each implementation runs beside its passes,
forward and backward (``Kernel.small_kernels``). ``none``: the target mask (3), the shifted
target (2) and its masked fill, the predicted logit's index, gather, copy and masked fill, the
loss's log and subtraction; backward the index, the one-hot mask's cast and complement, gather,
subtraction and scatter. ``native``: Inductor's kernels over the targets, the concatenation and
the loss; backward the scatter. ``te``: three zero fills and a clamp (one more fill for the
gathered statistics under tensor parallelism, not counted); backward the constant that the
gradient is compared with to skip a unit scaling (copied from the host, which then waits for the
stream: a host sync, not priced) and a copy of the per-token gradient."""


def cross_entropy_kernels(
    plan: Plan, logits: float
) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
    """(forward, backward) kernels of the loss over ``logits`` on one GPU: Megatron's
    vocab-parallel cross-entropy, Inductor's fused one (``loss_compiled``) or PyTorch's eager one
    (``TORCH_CROSS_ENTROPY_BYTES``)."""
    if loss_compiled(plan):
        fused_forward, fused_backward = COMPILED_CROSS_ENTROPY_BYTES
        return (memory("cross_entropy", fused_forward * logits, "loss"),), (
            memory("cross_entropy_backward", fused_backward * logits, "loss"),
        )
    if kernel_stack(plan) == "megatron":
        return megatron_cross_entropy_kernels(megatron_cross_entropy(plan), logits)
    forward, backward = (_loss_passes(phase, logits) for phase in TORCH_CROSS_ENTROPY_BYTES)
    return forward, backward


def _loss_passes(passes: tuple[tuple[str, float, str], ...], logits: float) -> tuple[Kernel, ...]:
    """One memory-bound kernel per (name, bytes per logit, class) row of a loss table."""
    return tuple(
        memory(name, size * logits, kind, converts=name not in CROSS_ENTROPY_MOVES)
        for name, size, kind in passes
    )


def megatron_cross_entropy_kernels(
    implementation: str, logits: float
) -> tuple[tuple[Kernel, ...], tuple[Kernel, ...]]:
    """(forward, backward) kernels of Megatron-Core's cross-entropy ``implementation``
    (``MEGATRON_CROSS_ENTROPY``) over ``logits``: each pass over the logits a kernel, the
    phase's small kernels (``MEGATRON_CROSS_ENTROPY_SMALL_KERNELS``) run beside the first."""
    phases = []
    for passes, small in zip(
        MEGATRON_CROSS_ENTROPY[implementation],
        MEGATRON_CROSS_ENTROPY_SMALL_KERNELS[implementation],
        strict=True,
    ):
        first, *rest = _loss_passes(passes, logits)
        phases.append((replace(first, small_kernels=small, extra_launches=small), *rest))
    forward, backward = phases
    return forward, backward


def head_kernels(plan: Plan) -> PieceKernels:
    """Final norm, LM head (T x V/t x h, kept in 16-bit as Megatron does) and cross-entropy."""
    model = plan.model
    _, dtype = dtypes(plan)
    tokens, h = _tokens(plan), model.hidden_size
    vocab = head_vocab_per_gpu(plan)
    norm_bytes = 2 * 2 * ACTIVATION_BYTES * residual_stream_elements(plan)
    logits = tokens * vocab
    loss_forward, loss_backward = cross_entropy_kernels(plan, logits)
    head_params = h * vocab
    cast = weight_cast_bytes(plan, head_params) / 2
    casts = (memory("lm_head_weight_cast", cast, "copy"),) if cast else ()
    grad_casts = (memory("lm_head_grad_cast", cast, "copy"),) if cast else ()
    accumulate = () if model.tied_embeddings else grad_accumulate_kernels(plan, head_params)
    return PieceKernels(
        forward=(
            *casts,
            memory("final_norm", norm_bytes),
            compiled_gemm(plan, "lm_head", tokens, vocab, h, dtype),
            *loss_forward,
        ),
        backward_input=(
            memory("final_norm_backward", 2 * norm_bytes),
            compiled_gemm(plan, "lm_head_dgrad", tokens, h, vocab, dtype),
            *loss_backward,
        ),
        backward_weight=(
            compiled_gemm(plan, "lm_head_wgrad", h, vocab, tokens, dtype),
            *grad_casts,
            *accumulate,
        ),
    )


def mtp_kernels(plan: Plan) -> PieceKernels:
    """One multi-token-prediction depth's own work on one GPU (``schedules.mtp``), its
    transformer layer and LM head aside: the input embedding looked up again (outside the
    recompute checkpoint, so never rerun), ``enorm`` and ``hnorm``, the 2h concatenation, the
    column-parallel ``eh_proj`` (T x h/t x 2h, in FP8 under FP8 as Megatron runs it) and the
    split back to the rank's tokens under sequence parallelism; under full recompute (Megatron's
    uniform method) the norms, concatenation and projection run again."""
    model, parallel = plan.model, plan.parallel
    gemm_dtype, _ = dtypes(plan)
    tokens, h = _tokens(plan), model.hidden_size
    stream = residual_stream_elements(plan)
    norm_bytes = 2 * 2 * ACTIVATION_BYTES * stream  # two norms, each reading and writing h
    concat_bytes = 2 * ACTIVATION_BYTES * 2 * stream
    width = h / parallel.tp
    split = (memory("mtp_sp_split", 2 * ACTIVATION_BYTES * stream, "copy"),)
    projection = (
        memory("mtp_norms", norm_bytes),
        memory("mtp_concat", concat_bytes, "copy"),
        compiled_gemm(plan, "mtp_eh_proj", tokens, width, 2 * h, gemm_dtype),
        *(split if parallel.sequence_parallel else ()),
    )
    block = parallel.recompute_num_layers is not None
    rerun = projection if parallel.recompute == "full" and not block else ()
    params = mtp_projection_params_per_gpu(plan)
    return PieceKernels(
        forward=(memory("mtp_embedding", 2 * ACTIVATION_BYTES * tokens * h), *projection),
        backward_input=(
            compiled_gemm(plan, "mtp_eh_proj_dgrad", tokens, 2 * h, width, gemm_dtype),
            memory("mtp_concat_backward", concat_bytes, "copy"),
            memory("mtp_norms_backward", 2 * norm_bytes),
        ),
        backward_weight=(
            compiled_gemm(plan, "mtp_eh_proj_wgrad", 2 * h, width, tokens, gemm_dtype),
            memory("mtp_embedding_backward", 3 * ACTIVATION_BYTES * tokens * h),
            *grad_accumulate_kernels(plan, params),
        ),
        recompute=rerun,
    )


def mtp_projection_params_per_gpu(plan: Plan) -> float:
    """``eh_proj`` of one depth on one tensor-parallel rank (column-parallel)."""
    return mtp_projection_params(plan.model) / plan.parallel.tp
