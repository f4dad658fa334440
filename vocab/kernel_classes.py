"""Which class of work a profiled kernel (or CPU operator) belongs to, from its name.

``commbench --step`` sums a training step's profile by class; ``sim.replay.step_fit`` compares
each class with what the compute model prices for it. Rules are tried in order (the first match
wins), on the lower-cased name of a CUDA kernel (``sm90_xmma_gemm_...``, ``flash_fwd_kernel``,
``vectorized_elementwise_kernel<...>``) or of an ATen operator on CPU (``aten::mm``,
``aten::_scaled_dot_product_flash_attention_for_cpu``).

    classify("ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_32x5_tn")  # "gemm"
"""

from __future__ import annotations

import re
import statistics

CLASSES = (
    "gemm",
    "attention",
    "elementwise",
    "loss",
    "optimizer",
    "copy",
    "communication",
    "other",
)
"""Work classes of a step profile, in report order."""

_RULES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(pattern))
    for name, pattern in (
        ("communication", r"nccl|all_?reduce|all_?gather|reduce_?scatter|c10d"),
        ("attention", r"flash|fmha|attention|attn|sdpa|cudnn_?mha"),
        ("optimizer", r"adam|multi_tensor|foreach|optim|lerp|addcdiv|addcmul"),
        ("loss", r"cross_entropy|nll_loss|log_softmax|logsoftmax"),
        (
            "gemm",
            r"gemm|xmma|cutlass|cublas|nvjet|matmul|aten::(mm|addmm|bmm|linear|baddbmm)\b"
            r"|^(mm|addmm|bmm)$|s16816|h16816|wgmma",
        ),
        ("copy", r"copy|memcpy|memset|to_copy|\bcast|convert|clone|\bfill|aten::cat\b|_to\b"),
        (
            "elementwise",
            r"norm|elementwise|vectorized|reduce|unrolled|silu|gelu|sigmoid|relu|swiglu|rsqrt"
            r"|rotary|rope|embedding|index|aten::(add|mul|sub|div|neg|pow|mean|sum|exp|tanh"
            r"|where|masked_fill|cos|sin|sqrt|rsub|square)_?\b",
        ),
    )
)


def classify(name: str) -> str:
    """The class of a kernel or operator name (``other`` when no rule matches)."""
    lowered = name.lower()
    for kind, pattern in _RULES:
        if pattern.search(lowered):
            return kind
    return "other"


HOST_BOUND_GAP_S = 10e-6
"""Gaps between consecutive kernels from this long up are the host falling behind (or a
synchronisation), not the device's own gap (``kernel_gap_s``)."""


def kernel_gap_s(intervals: list[tuple[float, float]]) -> float:
    """Median time (seconds; intervals in seconds) between one kernel's end and the next one's
    start, over the gaps shorter than ``HOST_BOUND_GAP_S``: the device's own gap while the host
    is ahead (the median: a profile whose host lags now and then pulls the mean up). Kernels
    that start before the previous ones end (another stream) are skipped; 0 with no such gap."""
    gaps = []
    end = float("inf")
    for start, stop in sorted(intervals):
        if 0.0 <= start - end < HOST_BOUND_GAP_S:
            gaps.append(start - end)
        end = stop if end == float("inf") else max(end, stop)
    return statistics.median(gaps) if gaps else 0.0


def busy_time_s(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals: the time a device was running anything."""
    total = 0.0
    end = float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total
