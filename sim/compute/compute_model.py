"""Compute time of kernels on one GPU: a roofline with shape-dependent efficiency.

Prices the kernels ``schedules.kernels`` describes (a layer, the embedding, the head) without
calling back into the description.

Each kernel takes ``max(flops / rate(shape), bytes / memory_bandwidth)`` (plus a fitted per-kernel
latency when calibrated), where ``rate = peak[dtype] * eff_max * prod(d / (d + dim_half))`` over
the kernel's dimensions: small m, n, k (or sequence lengths) fill the GPU less. Defaults, used
without a calibration (``commbench --compute`` measures the real curve):

- GEMM ``eff_max`` 0.82 on Hopper and 0.86 on Ampere with dim_half 128, i.e. ~78% / ~82% of the
  dense peak on 8192^3 bf16 GEMMs (published cuBLAS and Megatron-LM figures: large bf16 GEMMs
  reach ~75-80% of dense peak on H100, ~80-85% on A100); FP8 GEMMs 0.70 of the FP8 peak.
- attention (fused, FlashAttention-style) forward 0.60 of peak and backward 0.50 with
  dim_half 256 on the query and key lengths (FlashAttention-2, Dao 2023: 50-73% of peak forward
  on A100; FlashAttention-3, Shah et al. 2024: ~75% on H100; cuDNN's fused attention in
  between). The backward kernel does 2.5x the forward FLOPs (it recomputes QK^T).
  ``training.attention_backend: flash2`` (FlashAttention-2, torch SDPA's flash backend) runs at
  ``FLASH2_ON_HOPPER`` of that forward and ``FLASH2_BACKWARD_ON_HOPPER`` backward on Hopper,
  whose TMA and warp-group MMAs it does not use.
- memory-bound kernels (norms, residual adds, activations, rotary, softmax) at 0.80 of the HBM
  bandwidth (STREAM-like kernels reach ~80-90%).

FP8 plans use the FP8 peak for the weight GEMMs only; attention and elementwise stay bf16. A
GEMM with row-wise float8 scales (``schedules.float8``) runs at ``ROWWISE_SCALED_MM`` of that.

    times = ComputeModel(GPUS["h100-sxm"]).layer_times(plan)
    seconds = ComputeModel(GPUS["h100-sxm"]).price(layer_kernels(plan).forward)
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable
from dataclasses import dataclass

from schedules.float8 import ROWWISE_GEMM_BACKEND
from schedules.kernels import (
    Kernel,
    PieceKernels,
    attention,
    autocast_weights,
    element_bytes,
    embedding_kernels,
    gemm,
    head_kernels,
    kernel_stack,
    layer_kernels,
    memory,
    mtp_kernels,
)
from schedules.moe_kernels import moe_layer_kernels
from schedules.plan import Plan
from topologies.hardware import GPUSpec
from vocab.compute_calibration import ComputeCalibration, KernelFit

_DEFAULT_EFFICIENCY = {
    # GPUSpec.family (the rest: other): (gemm 16-bit, gemm fp8, attention fwd, bwd, memory)
    "hopper": (0.82, 0.70, 0.60, 0.50, 0.80),
    "ampere": (0.86, 0.70, 0.65, 0.50, 0.80),
    "other": (0.80, 0.70, 0.55, 0.45, 0.80),
}
GEMM_DIM_HALF = 128.0
"""Default GEMM saturation dimension (a 128-wide tile dimension reaches half the rate)."""
ATTENTION_DIM_HALF = 256.0
"""Default attention saturation length for the query and key sequence lengths."""
FLASH2_ON_HOPPER = 0.35 / 0.60
"""FlashAttention-2's forward speed on Hopper relative to the fused-attention default (cuDNN,
FlashAttention-3): it reaches about 35% of the H100's dense peak (Shah et al. 2024,
FlashAttention-3, arXiv:2407.08608, abstract), against the 60% forward default; torch SDPA's
default (flash) backend measured 329 TFLOP/s where cuDNN and FA3 ran 631 on one H100 at
(1, 24, 4608, 128) (pytorch/pytorch#142132, torch 2.6 nightly, December 2024): 0.52. Measured
here on one H100 SXM (torch 2.11's flash kernel, head dimension 128, 16 and 32 heads, 32k
queries against 16k-32k keys, causal and not; ``results/mechanisms/probe_cp_fp8.json``): 343
TFLOP/s, 0.347 of the peak. On Ampere FlashAttention-2 is the reference: no change."""
FLASH2_BACKWARD_ON_HOPPER = 0.319 / 0.50
"""FlashAttention-2's backward on Hopper relative to the backward default: measured on the same
calls as the forward (``FLASH2_ON_HOPPER``), 315 TFLOP/s at 2.5x the forward's FLOPs, 0.319 of
the H100's peak (304-323 over the six calls): 0.92 of its forward rate, where the defaults' own
backward runs at 0.83 of theirs."""
ROWWISE_SCALED_MM = 0.90
"""Speed of ``torch._scaled_mm`` with row-wise scales (PyTorch's CUTLASS kernel, fast
accumulation: the forward GEMM of torchao's rowwise recipes) relative to the tensorwise cuBLAS
kernel on H100: "most shapes are within 90-100% of tensor-wise efficiency, but there's a long
tail going down to 50%" (pytorch/pytorch#147971, February 2025, after the tile heuristics of
pytorch/pytorch#134781); the lower edge of that bulk. The backward GEMMs of those recipes run
cuBLAS's tensorwise kernel (torchao ``addmm_float8_unwrapped``): no factor."""
IN_STEP_SLOWDOWN = {"ampere": 0.107, "hopper": 0.187}
"""Fraction by which the kernels of a multi-GPU training job run longer than the isolated curves
say, per GPU generation (``GPUSpec.family``): a fitted factor, not a mechanism. Every published
multi-GPU run is slower than the kernel curves, from 8 GPUs to 3,072 and on every source, while
single-GPU steps are not (a plain-PyTorch loop on one H100, refdata/h100/traces: -2.3% to
+1.7% without it; +17% to +27% with 0.21, against an earlier inventory), so it applies to plans
of more than one GPU only. Which
mechanism it stands for is not separated: sustained clocks under the power cap (one H100's
8192^3 GEMMs, back to back, ran 12% below their burst rate at 700 W; results/mechanisms), NCCL's
resident kernels, jitter, framework costs the kernel inventory lacks. Restricted to one class
of kernels it scores worse leave-one-source-out (``tools/slowdown_scope.py``: GEMMs 9.2%,
tensor-core kernels 7.4%, memory-bound kernels 7.7%, a cost per launch 17.4%, against 7.0% on
every kernel; docs/validation.md), so the clock alone is not what the published runs show.
The device's gap between kernels (``KERNEL_GAP_S``) is priced apart, and took 0.008 (Ampere)
and 0.002 (Hopper) off it; Megatron-Core's cross-entropy, priced as each run's configuration
ran it (``schedules.kernels.MEGATRON_CROSS_ENTROPY``), took 0.002 and 0.015 more.

Fitted on every published run of the generation in ``refdata/validation/cases.json`` (least
absolute error in log step time, robust to the runs whose mechanisms are missing): Ampere on
the 26 A100 runs of Narayanan et al. 2021 and Korthikanti et al. 2022, Hopper on the 45 H100 and
H200 runs of NeMo, torchtitan, Megatron-Core MoE and Megatron-Bridge. The generations differ
once the attention dropout of the pre-FlashAttention Megatron runs is priced
(``schedules.kernels.DROPOUT_BYTES``): each A100 run alone would take -0.01-0.21 (median 0.09;
the six ZeRO-3 runs of Narayanan Table 2 aside, whose fetch the model misses), each H100 or
H200 run 0.08-0.55 (median 0.19; above 0.4 only the 8B context-parallel rows at 128k-256k and
Qwen3-235B-A22B). On A100 the factor is not a per-kernel effect: one 22B layer on 8 GPUs, its
kernels and TP collectives priced without it, takes what Korthikanti et al. Table 4 measured
within 4 % on all five layouts (``tests/sim/validation/test_layer_times.py``); what the same
paper's full steps want on top is spent outside the layers. ``commsim validate
--leave-one-source-out`` refits it without the source it scores (``docs/validation.md``). Fits
to measured steps set it to 0."""
IN_STEP_SLOWDOWN_ELSEWHERE = 0.165
"""The in-step slowdown of a generation no published run here used (Volta, Blackwell, AMD, ...):
the same fit over all 71 runs."""


def default_in_step_slowdown(family: str) -> float:
    """The in-step slowdown of a multi-GPU job on a GPU of this ``GPUSpec.family``."""
    return IN_STEP_SLOWDOWN.get(family, IN_STEP_SLOWDOWN_ELSEWHERE)


DEFAULT_OVERLAP_SLOWDOWN = 0.189
"""Compute runs 18.9% longer while a collective runs beside it: the mean slowdown Lee et al.
measured overlapping GPT and Llama training kernels with NCCL/RCCL collectives on A100, H100,
MI250 and MI210 (arXiv:2507.03114, 2025: mean 18.9%, up to 40%). The mechanism: NCCL's kernels
hold SMs (one block per channel, 16-32 of an H100's 132 SMs) and HBM bandwidth. A compute
calibration's ``overlap_slowdown`` replaces it."""
MOE_MLP_KERNELS = ("experts_", "shared_", "moe_act")
"""Name prefixes of an MoE layer's kernels that run after the token dispatch (the routed and
shared experts' GEMMs, forward, input and weight gradients, and the activation rerun of
``recompute_modules`` ``moe_act`` / ``shared_experts``)."""
DENSE_MLP_KERNELS = ("fc1", "fc2", "mlp_recompute")
"""The same for a dense layer: its MLP's GEMMs (and their FP8 casts) and the rerun of
``recompute_modules`` ``mlp``."""
KERNEL_GAP_S = 1.5e-6
"""GPU time between one kernel's end and the next one's start on a stream while the host is
ahead of it (the device's own launch latency: the next grid starts once the previous drains).
Measured in twelve torch.profiler traces of whole training steps, eager and compiled, on one H100
(results/h100_heldout, refdata/h100/traces: a separate plain-PyTorch loop) and one H200
(results/heldout5/traced): the gaps under 10 us between consecutive kernels have medians of
1.25-1.60 us and means of 1.51-1.89 us in every one, 1,513-3,977 gaps each; the gaps above are
the host falling behind (``host_s_per_launch``). The unprofiled GPU-bound steps agree: step time
minus the profiled kernels' busy time is 1.0-1.6 us per kernel on the eager H100 steps of
results/h100_heldout. Every launch on the GPU pays it (``launch_count``), CUDA graphs included.
A profiled step measures its own (``commbench --step``, ``commsim fit --trace``:
``ComputeCalibration.kernel_gap_s``)."""
DEFAULT_HOST_S_PER_LAUNCH = 27.6e-6
"""Host time per kernel launch of an eager PyTorch training step: 97.8 ms for 3,549 kernels in
the most host-bound step measured on one H100 (``commbench --step``, an 8-layer h1024 model, 4
micro-batches, 60% of the GPU idle; refdata/h100, a gVisor sandbox, so above bare metal);
the same model compiled: 29.8 us per kernel (47.9 ms, 1,609 kernels)."""
LAUNCHES_PER_KERNEL = {
    "eager": 2.39,
    "compile": 2.14,
    "eager/bf16_weights": 2.30,
    "compile/bf16_weights": 2.16,
    "megatron": 2.61,
}
"""Kernels a training loop launches per kernel of the modelled inventory (``schedules.kernels``
lists the work, not every launch: casts, views made contiguous, fills, bias and rotary pieces),
per loop (``launch_loop``): the stack, and how the loop keeps its weights. Counted on one H100
against the inventory of this version, the fused optimizer's launches
(``OPTIMIZER_ELEMENTS_PER_LAUNCH``) and the launches known per kernel (``known_launches``:
cuBLAS's memsets, the eager rotary's and grouped-query repeat's kernels, autocast's bias casts)
left out:

- ``eager`` / ``compile`` (autocast over fp32 weights; ``commbench --step``'s reference model):
  each ``commbench --step`` profile's kernels over the modelled ones (refdata/h100): seven eager
  files 2.26-2.50 (mean 2.39; 2.47-3.20 before the memsets, repeats and bias casts were counted
  apart, when the 8-layer h1024 model's 2.47 and 2.53 stood below every larger one) and two
  compiled ones, 2.05 and 2.22 (mean 2.14). The held-out files of results/h100_heldout, counted
  after: eager 2.33-2.46 (Llama-style and GPT-style alike), compiled 2.12-2.35;
- ``/bf16_weights`` (bf16 weights with fp32 master weights, and FSDP or ZeRO, whose compute
  weights are bf16 too): the torch.profiler traces of a separate plain-PyTorch loop
  (refdata/h100/traces): eager 2.27 (h1024, 8 layers) and 2.32 (h2048, 16 layers), compiled
  2.16, against plans that say what the loop runs (no rotary, the grouped K/V heads handed to
  SDPA; 2.14 for the h2048 step while its plan listed the repeat's kernels, 2.41 and 2.78
  before the memsets were counted apart);
- ``megatron`` (Transformer Engine's fused kernels): not measured; the plain loop's first eager
  count, against an earlier inventory.

The spread within one loop (about +-5%) is the error a launch-bound step takes from this
default; ``commbench --step`` or a trace of the user's loop replaces it with its own count."""
SMALL_KERNEL_S = 2.8e-6
"""GPU time of a kernel too small for its bytes to count (``Kernel.small_kernels``): its own
run plus the gap before the next kernel starts, when the host is ahead. Measured in the
torch.profiler traces of refdata/h100/traces (one H100, two eager steps): kernels under 2 us
ran a median 1.34 and 1.50 us, and a kernel launched before the one ahead of it ended started a
median 1.31 and 1.47 us after that one (851 and 1,996 such pairs)."""
OPTIMIZER_ELEMENTS_PER_LAUNCH = 65536 * 320
"""Parameters one launch of the fused (or foreach) Adam kernel updates: PyTorch's
``multi_tensor_apply`` cuts the tensor lists into chunks of ``kChunkSize`` = 65,536 elements
and launches once ``depth_to_max_blocks`` = 320 chunks are queued (``MultiTensorApply.cuh``; one
launch sooner past 36 tensors of four lists, which large layers never reach). The traces of
refdata/h100/traces count 72 and 10 ``FusedOptimizerTensorListMetadata`` launches for 1.50 B and
0.20 B parameters, as the ratio gives (71.5, 9.5). They hide behind their own kernels (0.2 ms
of GPU time each against tens of microseconds of host time), so they are not charged to the
host; they are left out of the per-kernel launch count (``LAUNCHES_PER_KERNEL``)."""


GEMM_MEMSET_OUTPUT_ELEMENTS = 2**23
"""Output elements from which cuBLAS zeroes a workspace before a bf16 GEMM on the H100
(``cudaMemsetAsync``: one more host launch, a ``Memset (Device)`` activity in the profile)
when the output has more elements than this. Counted in five torch.profiler traces of two loops
(torch 2.11, CUDA 13.0, cuBLAS's ``nvjet`` kernels; refdata/h100/traces and
results/h100_heldout), 51 GEMM shapes of 8-element-aligned dimensions: every one with an output
of 12.6 M elements or more had its memset (12.6 M to 1.05 G), none with 2^23 = 8.4 M or fewer did
(0.6 M to 8.4 M), whatever the reduction dimension (768 to 128,256). The rule gives the traces'
own counts: 104 memsets in the h1024 step's GEMMs, 222 in the traced 12-layer Llama step's.
Shapes with a dimension not a multiple of 8 run other kernels (CUTLASS) and are not counted.
PyTorch stacks only (the Megatron stack's launches are not measured)."""


UNCOUNTED_GEMMS = ("scores", "context")
"""GEMMs the memset rule leaves out, besides MoE's grouped expert GEMMs (``experts_*``): the
unfused attention's batched score and context products, whose ``dims`` are one head's matrix.
The rule was counted on linear layers' GEMMs only."""


def gemm_memsets(kernel: Kernel, loop: str) -> int:
    """1 where cuBLAS launches a memset before the GEMM ``kernel`` (``GEMM_MEMSET_OUTPUT_ELEMENTS``)
    on the ``loop`` (``launch_loop``), else 0."""
    if kernel.kind != "gemm" or kernel.dtype != "bf16" or len(kernel.dims) < 3:
        return 0
    if kernel.name in UNCOUNTED_GEMMS or kernel.name.startswith("experts_"):
        return 0
    if loop.split("/")[0] == "megatron":
        return 0
    m, n, k = kernel.dims[:3]
    aligned = all(float(size) % 8 == 0 for size in (m, n, k))
    return int(aligned and m * n > GEMM_MEMSET_OUTPUT_ELEMENTS)


def known_launches(kernel: Kernel, loop: str) -> float:
    """Launches ``kernel`` makes beyond the loop's per-kernel count: those its loop's code
    gives it (``Kernel.extra_launches``) and cuBLAS's memset (``gemm_memsets``)."""
    return kernel.extra_launches + gemm_memsets(kernel, loop)


def optimizer_launches(params: float) -> int:
    """Fused Adam launches for ``params`` local parameters (``OPTIMIZER_ELEMENTS_PER_LAUNCH``)."""
    return math.ceil(params / OPTIMIZER_ELEMENTS_PER_LAUNCH) if params > 0 else 0


GEMM_ALIGNED_BYTES = 16
"""Tensor-core GEMM kernels load operands in 16-byte vectors: every dimension should be a
multiple of 16 bytes (8 bf16 elements; NVIDIA, Matrix Multiplication Background User's Guide,
"Tensor Core Requirements"). cuBLAS runs other shapes on slower kernels."""
UNALIGNED_GEMM = {4: 0.35, 2: 0.18}
"""Rate of a GEMM whose least-aligned dimension is a multiple of only 4 (or 8) bytes, or of only
2 bytes (an odd bf16 count), relative to the aligned shape. Measured on one H200 (torch 2.11,
CUDA 13.0, ``tools/kernel_probe.py``, results/mechanisms): bf16 language-model-head GEMMs of
4096 tokens x 2560 hidden, vocabulary 50304 / 50258 / 50257, mean over the forward,
input-gradient and weight-gradient layouts: 727 / 252 / 126 TFLOP/s; 8192 x 4096 with vocabulary
32000 / 32001: 709 / 129. GPT-2's 50257 is why nanoGPT pads its vocabulary to 50304."""
ATTENTION_HEAD_DIM_TILE = 32
"""Fused attention runs the head dimension padded to a multiple of 32 (FlashAttention-2's
``flash_api.cpp`` rounds ``head_size`` up to a multiple of 32 and dispatches the kernel compiled
for it): a head dimension of 80 costs what 96 does. Measured on one H200 (causal, batch 2,
sequence 2048, width 2560): FlashAttention-2 at 80 ran 0.262 / 0.808 ms forward / backward
where 96 with the same FLOPs would take 0.267 / 0.816 ms (results/mechanisms)."""
HOPPER_ATTENTION_HEAD_DIM = {64: (0.715, 0.79), 96: (0.825, 0.885), 128: (1.0, 1.0)}
"""Rate of Hopper's fused attention (cuDNN; FlashAttention-3 is built the same way: warp-group
MMAs over the head dimension, softmax per score) at a padded head dimension, forward and
backward, relative to 128 (linear in between, the 64 value below, 1 above). Measured with
cuDNN on one H200 as above: 261 / 301 / 365 TFLOP/s forward and 251 / 281 / 318 backward at
64 / 96 / 128. FlashAttention-2 on Hopper does not shrink so (1.03 / 1.05 forward at 64 / 96)
and gets only the padding."""
CAST_EFFICIENCY = {"h100-sxm": 0.62, "h200": 0.51}
"""Fraction of HBM bandwidth a step's casts between dtypes (the ``copy`` memory class, where
``Kernel.converts``) reach, in place of the 0.80 default, per GPU where measured
(``tools/kernel_probe.py --parts memory_kernels`` at three step-sized tensors of 16.8-67 M elements;
results/mechanisms/probe_memory_h100.json and probe_memory_h200.json). The casts between fp32 and
bf16 ran at 1.58-2.82 TB/s on one H100 (mean 2.06: 0.62 of 3.35) and 1.64-3.77 TB/s on one H200
(mean 2.46: 0.51 of 4.8), bf16 to fp32 the slowest on both. Other Hopper GPUs take the H100's
figure; other families keep the default. The same probe puts adds, GeLU and the norms at 0.67 (H100)
and 0.57 (H200) on average, but the elementwise class stays at the default on the H100 (the H200
takes the ratio of the two: ``ELEMENTWISE_EFFICIENCY``): at 0.67 the plain
bf16-weights loop of refdata/h100/traces went from +6 / +9 % to +10 / +14 % and the published H100
runs from 6.8 % to 7.4 % (an eager loop's elementwise bytes vary more with its code than this rate
does). Copies that convert nothing run at ``MOVE_EFFICIENCY`` instead."""
MOVE_EFFICIENCY = {"h100-sxm": 0.78, "h200": 0.68}
"""Fraction of HBM bandwidth the copies that convert nothing (a layout copy, a concatenation, a
zero fill: ``Kernel.converts`` false; the ``copy`` memory class) reach on Hopper, per GPU: the
zero fills of the same probes (results/mechanisms/probe_memory_h100.json and
probe_memory_h200.json: 2.45, 2.40 and 3.03 TB/s on one H100, mean 0.78 of 3.35; 2.90, 2.89 and
4.04 TB/s on one H200, mean 0.68 of 4.8), faster than the casts on both. The plain loop's H100
traces concatenate split gradients at 3.0-4.0 TB/s (``EAGER_SPLIT_GRAD_BYTES``); at the casts'
rate the traced loop's copy class came out 15% slow."""
ELEMENTWISE_EFFICIENCY = {"h200": 0.678}
"""Fraction of HBM bandwidth the elementwise memory class (norms, activations, adds, rotary)
reaches on a GPU whose rate is measured relative to the H100's, in place of the 0.80 default:
the H100's default times the ratio of the two GPUs' measured elementwise efficiencies. In the
same probes (``tools/kernel_probe.py --parts memory_kernels``, results/mechanisms/
probe_memory_h100.json and probe_memory_h200.json: the adds, in-place add, norms and GeLU at three
step-sized tensors) the H100 moved 2.20 TB/s on average (0.656 of 3.35) and the H200 2.67 TB/s
(0.556 of 4.8): 1.21 times the H100's rate, not the 1.43 of their bandwidths, since both run the
same SMs at the same clocks. 0.80 x 0.556 / 0.656 = 0.678. Without it every GPU-bound H200 step
of results/h200_heldout and results/heldout5 came out 2-10 % fast."""
ADAM_BYTES_PER_PARAM = 26.0
"""Fused Adam traffic per parameter besides the gradient: read and write fp32 master, m, v
(24 bytes) and write the bf16 copy (2 bytes)."""


def launch_loop(plan: Plan) -> str:
    """Which ``LAUNCHES_PER_KERNEL`` entry a plan's loop takes: its stack, with
    ``/bf16_weights`` on the PyTorch stacks where the compute weights are bf16 (torch DDP with
    ``training.mixed_precision: bf16_weights``; FSDP and ZeRO)."""
    stack = kernel_stack(plan)
    if stack == "megatron" or autocast_weights(plan):
        return stack
    return f"{stack}/bf16_weights"


def default_efficiency(gpu: GPUSpec, kind: str, dtype: str) -> float:
    """Default fraction of the dense peak (or of HBM bandwidth for ``memory``) for ``kind``."""
    defaults = _DEFAULT_EFFICIENCY.get(gpu.family, _DEFAULT_EFFICIENCY["other"])
    gemm16, gemm8, attention_fwd, attention_bwd, memory = defaults
    table = {
        "gemm": gemm8 if dtype == "fp8" else gemm16,
        "attention_forward": attention_fwd,
        "attention_backward": attention_bwd,
        "memory": memory,
    }
    return table[kind]


def gemm_alignment(dims: Iterable[float], dtype: str) -> float:
    """Rate factor of a GEMM with these (m, n, k) in ``dtype``: 1 when every dimension is a
    multiple of ``GEMM_ALIGNED_BYTES``, else ``UNALIGNED_GEMM`` of its least-aligned one. A
    fractional dimension is an average count (tokens per expert), and a dimension of 1 makes a
    matrix-vector product (memory-bound, no tensor-core tiles): neither is judged."""
    worst = GEMM_ALIGNED_BYTES
    for dim in dims:
        if dim <= 1 or not float(dim).is_integer():
            continue
        size = int(dim) * element_bytes(dtype)
        worst = min(worst, size & -size)  # the largest power of two dividing it
    if worst >= GEMM_ALIGNED_BYTES:
        return 1.0
    return UNALIGNED_GEMM[4] if worst >= 4 else UNALIGNED_GEMM[2]


def _interp(x: float, xs: list[int], ys: list[float]) -> float:
    """``numpy.interp(x, xs, ys)`` for increasing ``xs``: linear between the points, the end
    values beyond them (the same arithmetic, so the same floats)."""
    if x <= xs[0]:
        return float(ys[0])
    if x >= xs[-1]:
        return float(ys[-1])
    j = bisect.bisect_right(xs, x) - 1
    slope = (ys[j + 1] - ys[j]) / (xs[j + 1] - xs[j])
    return float(slope * (x - xs[j]) + ys[j])


def attention_head_dim_factor(head_dim: float, kind: str, backend: str, family: str) -> float:
    """Rate factor of fused attention at ``head_dim``: the useful share of the padded head
    dimension (``ATTENTION_HEAD_DIM_TILE``), times Hopper's fused kernels' rate at that padded
    size (``HOPPER_ATTENTION_HEAD_DIM``; not FlashAttention-2's)."""
    if head_dim <= 0:
        return 1.0
    tile = ATTENTION_HEAD_DIM_TILE
    padded = -(-head_dim // tile) * tile
    factor = head_dim / padded
    if family == "hopper" and backend != "flash2":
        column = 1 if kind == "attention_backward" else 0
        sizes = sorted(HOPPER_ATTENTION_HEAD_DIM)
        rates = [HOPPER_ATTENTION_HEAD_DIM[size][column] for size in sizes]
        factor *= _interp(padded, sizes, rates)  # held flat beyond both ends
    return factor


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerTimes:
    """Seconds of one piece of the model on one GPU for one micro-batch."""

    forward_s: float
    """Forward pass."""
    backward_input_s: float
    """Input-gradient half of the backward (with the attention and elementwise backward)."""
    backward_weight_s: float
    """Weight-gradient GEMMs (the deferrable 'W' of zero-bubble schedules)."""
    recompute_s: float = 0.0
    """Recomputation before the backward (none: 0; selective: attention core; full: forward)."""
    forward_launch_s: float = 0.0
    """Host time to launch the forward's kernels."""
    backward_input_launch_s: float = 0.0
    """Host time to launch the input-gradient half's kernels."""
    backward_weight_launch_s: float = 0.0
    """Host time to launch the weight-gradient GEMMs."""
    recompute_launch_s: float = 0.0
    """Host time to launch the recomputation's kernels."""

    @property
    def backward_s(self) -> float:
        """The whole backward, input plus weight gradients (without recomputation)."""
        return self.backward_input_s + self.backward_weight_s


class ComputeModel:
    """Kernel times on one GPU from its spec, default efficiencies and an optional calibration."""

    def __init__(
        self,
        gpu: GPUSpec,
        calibration: ComputeCalibration | None = None,
        *,
        distributed: bool = True,
    ) -> None:
        if calibration is not None and calibration.gpu and calibration.gpu != gpu.name:
            raise ValueError(
                f"compute calibration is for GPU {calibration.gpu!r} ({calibration.device}), "
                f"not {gpu.name!r}; measure this GPU or clear the calibration's 'gpu'"
            )
        self.gpu = gpu
        self.calibration = calibration or ComputeCalibration()
        self.distributed = distributed

    def _peak(self, dtype: str) -> float:
        peaks = self.gpu.peak_flops_per_s
        if dtype not in peaks:
            raise ValueError(
                f"GPU {self.gpu.name} has no {dtype} peak (it has {', '.join(sorted(peaks))})"
            )
        return peaks[dtype]

    def kernel_fit(self, kind: str, dtype: str, backend: str = "") -> KernelFit:
        """The curve used for ``kind`` in ``dtype``: calibrated (a measured curve is whatever
        kernel ran where it was measured), or the spec's peak x efficiency x the attention
        ``backend``'s factor."""
        fitted = self.calibration.kernel(kind, dtype)
        if fitted is not None:
            return fitted
        efficiency = self.calibration.efficiency.get(kind)
        if efficiency is None:
            efficiency = default_efficiency(self.gpu, kind, dtype)
        if backend == "flash2" and kind != "gemm" and self.gpu.family == "hopper":
            efficiency *= (
                FLASH2_BACKWARD_ON_HOPPER if kind == "attention_backward" else FLASH2_ON_HOPPER
            )
        if backend == ROWWISE_GEMM_BACKEND and kind == "gemm":
            efficiency *= ROWWISE_SCALED_MM
        dim_half = GEMM_DIM_HALF if kind == "gemm" else ATTENTION_DIM_HALF
        return KernelFit(max_flops_per_s=self._peak(dtype) * efficiency, dim_half=dim_half)

    @property
    def overlap_slowdown(self) -> float:
        """Fraction by which compute slows while communication runs beside it."""
        value = self.calibration.overlap_slowdown
        return DEFAULT_OVERLAP_SLOWDOWN if value is None else float(value)

    def memory_bandwidth_bytes_per_s(
        self, memory_class: str = "", *, converts: bool = True
    ) -> float:
        """Achievable memory bandwidth: measured, or the spec's HBM bandwidth x efficiency
        (a step calibration's efficiency of the kernel's ``memory_class`` where it has one; on
        Hopper a ``copy`` takes the casts' measured rate, or the fills' when it converts no
        dtype)."""
        measured = self.calibration.memory_bandwidth_bytes_per_s
        if measured is not None:
            return measured
        efficiency = self.calibration.efficiency.get(f"memory_{memory_class}")
        if efficiency is None:
            efficiency = self.calibration.efficiency.get("memory")
        if efficiency is None and memory_class == "copy" and self.gpu.family == "hopper":
            rates = CAST_EFFICIENCY if converts else MOVE_EFFICIENCY
            efficiency = rates.get(self.gpu.name, rates["h100-sxm"])
        if efficiency is None and memory_class == "elementwise":
            efficiency = ELEMENTWISE_EFFICIENCY.get(self.gpu.name)
        if efficiency is None:
            efficiency = default_efficiency(self.gpu, "memory", "bf16")
        return self.gpu.hbm_bandwidth_bytes_per_s * efficiency

    @property
    def host_s_per_launch(self) -> float:
        """Host time per kernel launch: calibrated, or ``DEFAULT_HOST_S_PER_LAUNCH``."""
        value = self.calibration.host_s_per_launch
        return DEFAULT_HOST_S_PER_LAUNCH if value is None else float(value)

    def launches_per_kernel(self, loop: str) -> float:
        """Launches per modelled kernel: calibrated, or the ``loop``'s default
        (``launch_loop``)."""
        value = self.calibration.launches_per_kernel
        return (
            LAUNCHES_PER_KERNEL.get(loop, LAUNCHES_PER_KERNEL["eager"]) if value is None else value
        )

    @property
    def kernel_gap_s(self) -> float:
        """GPU time between consecutive kernels: calibrated, or ``KERNEL_GAP_S`` (none on the
        ``cpu`` pseudo-GPU, whose operators run back to back on the host)."""
        value = self.calibration.kernel_gap_s
        if value is None:
            return 0.0 if self.gpu.family == "cpu" else KERNEL_GAP_S
        return float(value)

    def launch_count(self, kernels: Iterable[Kernel], loop: str) -> float:
        """Launches of ``kernels`` as the ``loop`` (``launch_loop``) runs them: the loop's
        launches per modelled kernel, plus the launches the code or the library gives some of
        them (``known_launches``)."""
        count = extra = 0.0
        for kernel in kernels:
            count += 1
            extra += known_launches(kernel, loop)
        return count * self.launches_per_kernel(loop) + extra

    def launch_s(self, kernels: Iterable[Kernel], loop: str) -> float:
        """Host time to launch ``kernels`` as the ``loop`` runs them (``launch_count``)."""
        return self.launch_count(kernels, loop) * self.host_s_per_launch

    def run_s(self, kernels: tuple[Kernel, ...], loop: str) -> float:
        """GPU time of ``kernels`` run one after another as the ``loop`` launches them: their
        own times and the gap before each launch (``kernel_gap_s``), the gaps scaled by
        ``time_factor`` as the kernels are (so the in-step slowdown's share of the compute
        stream stays ``s / (1 + s)`` of it)."""
        gaps_s = self.launch_count(kernels, loop) * self.kernel_gap_s * self.time_factor
        return self.price(kernels) + gaps_s

    @property
    def in_step_slowdown(self) -> float:
        """Fraction by which kernels run longer inside a step than their isolated curves: the
        calibration's, else its GPU generation's default for a multi-GPU job and none on one
        GPU."""
        value = self.calibration.in_step_slowdown
        if value is None:
            return default_in_step_slowdown(self.gpu.family) if self.distributed else 0.0
        return float(value)

    @property
    def time_factor(self) -> float:
        """Factor on every kernel time: the in-step slowdown times the calibration's scale."""
        return (1.0 + self.in_step_slowdown) * self.calibration.time_scale

    def memory_time_s(
        self, num_bytes: float, memory_class: str = "", *, converts: bool = True
    ) -> float:
        """A memory-bound kernel moving ``num_bytes`` (read + written), times ``time_factor``."""
        rate = self.memory_bandwidth_bytes_per_s(memory_class, converts=converts)
        return num_bytes / rate * self.time_factor

    def kernel_time_s(self, kernel: Kernel) -> float:
        """One kernel: max(flops / rate(dims), latency + bytes / bandwidth); memory: bytes only."""
        small_s = kernel.small_kernels * SMALL_KERNEL_S * self.time_factor
        if kernel.kind == "memory":
            return small_s + self.memory_time_s(
                kernel.bytes, kernel.memory_class, converts=kernel.converts
            )
        fit = self.kernel_fit(kernel.kind, kernel.dtype, kernel.backend)
        scale = self.time_factor
        if kernel.kind == "gemm":
            scale /= gemm_alignment(kernel.dims, kernel.dtype)
        else:
            scale /= attention_head_dim_factor(
                kernel.head_dim, kernel.kind, kernel.backend, self.gpu.family
            )
        compute_s = fit.time_s(kernel.flops, kernel.dims) * scale
        return small_s + max(compute_s, fit.latency_s * scale + self.memory_time_s(kernel.bytes))

    def price(self, kernels: Iterable[Kernel]) -> float:
        """Seconds of ``kernels`` run one after another."""
        return sum((self.kernel_time_s(kernel) for kernel in kernels), 0.0)

    def gemm_time_s(self, m: float, n: float, k: float, dtype: str = "bf16") -> float:
        """(m x k) @ (k x n): max(2mnk / rate(m, n, k), operand bytes / bandwidth)."""
        return self.kernel_time_s(gemm("gemm", m, n, k, dtype))

    def attention_time_s(
        self,
        *,
        batch: float,
        num_heads: float,
        seq_q: float,
        seq_kv: float,
        head_dim: float,
        causal: bool = True,
        dtype: str = "bf16",
        backward: bool = False,
    ) -> float:
        """Fused attention (scores, softmax, AV) forward, or its backward with ``backward``."""
        kernel = attention(
            batch=batch,
            num_heads=num_heads,
            seq_q=seq_q,
            seq_kv=seq_kv,
            head_dim=head_dim,
            causal=causal,
            dtype=dtype,
            backward=backward,
        )
        return self.kernel_time_s(kernel)

    def piece_times(
        self, kernels: PieceKernels, loop: str = "eager", *, graphed: bool = False
    ) -> LayerTimes:
        """Each phase of one piece of the model, priced, with the host time to launch it as
        the ``loop`` (``launch_loop``) runs it; ``graphed``: the forward and the backward are a
        captured CUDA graph each (Megatron-Core's ``CudaGraphManager`` maps a layer's forward and
        backward passes to one graph each), one host launch (``cudaGraphLaunch``) whatever their
        kernels; the backward's launch is charged to its input gradients (the weight gradients and
        any recompute run inside it)."""

        def launch(phase: tuple[Kernel, ...]) -> float:
            if graphed:
                return self.host_s_per_launch if phase else 0.0
            return self.launch_s(phase, loop)

        return LayerTimes(
            forward_s=self.run_s(kernels.forward, loop),
            backward_input_s=self.run_s(kernels.backward_input, loop),
            backward_weight_s=self.run_s(kernels.backward_weight, loop),
            recompute_s=self.run_s(kernels.recompute, loop),
            forward_launch_s=launch(kernels.forward),
            backward_input_launch_s=launch(kernels.backward_input),
            backward_weight_launch_s=0.0 if graphed else launch(kernels.backward_weight),
            recompute_launch_s=0.0 if graphed else launch(kernels.recompute),
        )

    def layer_times(self, plan: Plan) -> LayerTimes:
        """One transformer layer on one GPU for one micro-batch, sharded as the plan says."""
        return self.piece_times(
            layer_kernels(plan), launch_loop(plan), graphed=plan.training.cuda_graphs
        )

    def moe_layer_times(self, plan: Plan) -> LayerTimes:
        """One MoE layer on the busiest GPU for one micro-batch (``schedules.moe_kernels``);
        captured in CUDA graphs only with a capacity factor (a dropless dispatcher syncs the
        host on its token counts)."""
        graphed = plan.training.cuda_graphs and plan.model.moe_capacity_factor is not None
        return self.piece_times(moe_layer_kernels(plan), launch_loop(plan), graphed=graphed)

    def layer_halves_times(self, plan: Plan, *, moe: bool) -> tuple[LayerTimes, LayerTimes]:
        """One layer's times split as Megatron-Core's combined 1F1B schedules it
        (``schedules.pipeline_schedules.a2a_overlap``): the part before the token dispatch
        (norms, attention, and in an MoE layer the router and permutation; Megatron's
        ``pre_dispatch_computation``) and the MLP's part (a dense layer's MLP GEMMs, an MoE
        layer's routed and shared experts' GEMMs, their reruns; ``mlp``). The memory-bound
        pass over the layer's elementwise work stays with the first."""
        kernels = moe_layer_kernels(plan) if moe else layer_kernels(plan)
        prefixes = MOE_MLP_KERNELS if moe else DENSE_MLP_KERNELS

        def part(mlp: bool) -> PieceKernels:
            def keep(phase: tuple[Kernel, ...]) -> tuple[Kernel, ...]:
                return tuple(k for k in phase if k.name.startswith(prefixes) == mlp)

            return PieceKernels(
                forward=keep(kernels.forward),
                backward_input=keep(kernels.backward_input),
                backward_weight=keep(kernels.backward_weight),
                recompute=keep(kernels.recompute),
            )

        loop = launch_loop(plan)
        graphed = plan.training.cuda_graphs and not moe
        return (
            self.piece_times(part(False), loop, graphed=graphed),
            self.piece_times(part(True), loop, graphed=graphed),
        )

    def embedding_times(self, plan: Plan) -> LayerTimes:
        """Input embedding of the first stage (memory-bound lookup, scatter-add backward)."""
        return self.piece_times(embedding_kernels(plan), launch_loop(plan))

    def head_times(self, plan: Plan) -> LayerTimes:
        """Final norm, LM head GEMM and vocab-parallel cross-entropy of the last stage."""
        return self.piece_times(head_kernels(plan), launch_loop(plan))

    def mtp_times(self, plan: Plan) -> LayerTimes:
        """One multi-token-prediction depth's embedding, norms and projection
        (``schedules.kernels.mtp_kernels``); its layer and head are priced as the others."""
        return self.piece_times(mtp_kernels(plan), launch_loop(plan))

    def optimizer_step_s(
        self,
        num_params: float,
        *,
        grad_bytes_per_param: float = 2.0,
        adam_bytes_per_param: float = ADAM_BYTES_PER_PARAM,
    ) -> float:
        """Fused Adam over ``num_params`` local parameters: memory-bound, ``adam_bytes_per_param``
        (26 for fp32 state) + grad bytes each (or the calibration's measured
        ``optimizer_bytes_per_param``)."""
        if num_params < 0:
            raise ValueError(f"num_params must be >= 0, got {num_params}")
        per_param = self.calibration.optimizer_bytes_per_param
        if per_param is None:
            per_param = adam_bytes_per_param + grad_bytes_per_param
        return self.kernel_time_s(memory("adam", num_params * per_param, "optimizer"))
