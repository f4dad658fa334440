"""Measured step times of published runs, recovered with each source's own FLOP formula.

Sources report a step time, tokens/s, TFLOP/s per GPU or MFU, and each counts FLOPs its own way
(with or without recomputation, causal or not). To compare step times without mixing
definitions, a reported throughput is turned back into seconds per step with the formula the
source itself used: t = F_source / (reported FLOP/s per GPU * num_gpus).

    measured_step_time(case).step_time_s  # e.g. 3.528 s for Narayanan et al. Table 1, 1.7B
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from schedules.flops import narayanan_flops_per_iteration


@dataclass(frozen=True, slots=True, kw_only=True)
class Measurement:
    """A published run's step time, and how it was obtained from what the source reported."""

    step_time_s: float
    """Seconds per optimizer step (the whole global batch)."""
    how: str
    """The reported figure it comes from and, if converted, the source's own formula."""


# --- the sources' own FLOP formulas (Narayanan eq. (3) lives in schedules.flops) ---


def korthikanti_model_flops_per_step(
    *, global_batch_size: int, seq_len: int, num_layers: int, hidden_size: int, vocab_size: int
) -> float:
    """Korthikanti et al. 2022 eq. (7): model FLOPs of one step (no recomputation counted).

    F = 72 B L s h^2 (1 + s/(6h) + v/(12 h L)).
    """
    b, s, layers, h, v = global_batch_size, seq_len, num_layers, hidden_size, vocab_size
    return 72.0 * b * layers * s * h**2 * (1.0 + s / (6.0 * h) + v / (12.0 * h * layers))


def megatron_core_flops_per_step(
    *,
    global_batch_size: int,
    seq_len: int,
    num_layers: int,
    hidden_size: int,
    vocab_size: int,
    num_heads: int,
    num_kv_heads: int,
    ffn_hidden_size: float,
    gated_mlp: bool,
    causal: bool = False,
    query_size: int = 0,
) -> float:
    """Megatron-Core ``num_floating_point_operations`` (model FLOPs, non-causal attention).

    12 B s l h^2 [(1 + g/a + s/h) q/h + (ffn/h)(1.5 if gated) + V/(2 l h)], q the query
    projection's width (``--kv-channels`` x heads; ``query_size`` 0: the hidden size).
    """
    b, s, layers, h, v = global_batch_size, seq_len, num_layers, hidden_size, vocab_size
    # Megatron-LM since 2025-03-06 (commit 8873b55d) halves the score term for the causal mask.
    attention = 1.0 + num_kv_heads / num_heads + s / (2 * h if causal else h)
    attention *= (query_size or h) / h
    mlp = (ffn_hidden_size / h) * (1.5 if gated_mlp else 1.0)
    return 12.0 * b * s * layers * h**2 * (attention + mlp + v / (2.0 * layers * h))


# --- reading numbers out of loosely typed fields ---


def as_number(value: Any) -> float | None:
    """A finite positive number, or None for text ("not stated", "2M tokens"), 0, NaN, inf."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) and number > 0 else None


MAX_INTEGER = 2**53
"""Largest count or dimension taken at face value (beyond it a float no longer holds integers)."""


def as_integer(value: Any) -> int | None:
    """A positive whole number (a count or a dimension) up to ``MAX_INTEGER``, or None."""
    number = as_number(value)
    if number is None or not number.is_integer() or number > MAX_INTEGER:
        return None
    return int(number)


# --- measured step time ---


def _shape(case: dict[str, Any]) -> dict[str, int] | None:
    model, parallel = case.get("model") or {}, case.get("parallel") or {}
    values = {
        "global_batch_size": as_integer(parallel.get("global_batch_size")),
        "seq_len": as_integer(model.get("seq_len")),
        "num_layers": as_integer(model.get("num_layers")),
        "hidden_size": as_integer(model.get("hidden_size")),
        "vocab_size": as_integer(model.get("vocab_size")),
    }
    return None if None in values.values() else values  # type: ignore[return-value]


def _flops_from_definition(case: dict[str, Any]) -> tuple[float, str] | None:
    """FLOPs per step with the source's own formula, chosen from its ``flops_definition`` text."""
    shape = _shape(case)
    definition = str(case.get("flops_definition") or "")
    if shape is None:
        return None
    if "Narayanan eq.(3)" in definition:
        flops = narayanan_flops_per_iteration(
            shape["global_batch_size"],
            shape["seq_len"],
            shape["num_layers"],
            shape["hidden_size"],
            shape["vocab_size"],
        )
        return flops, "Narayanan eq.(3)"
    if "eq.(7)" in definition:
        return korthikanti_model_flops_per_step(**shape), "Korthikanti eq.(7)"
    model = case.get("model") or {}
    heads, ffn = as_integer(model.get("num_heads")), as_integer(model.get("ffn_hidden_size"))
    if "Megatron-Core num_floating_point_operations" in definition and heads and ffn:
        flops = megatron_core_flops_per_step(
            **shape,
            num_heads=heads,
            num_kv_heads=as_integer(model.get("num_kv_heads")) or heads,
            ffn_hidden_size=_active_ffn(model, ffn, shape["num_layers"]),
            gated_mlp="swiglu" in str(model.get("arch") or "").lower(),
            causal="halved for the causal mask" in definition,
            query_size=heads * (as_integer(model.get("head_dim")) or 0),
        )
        return flops, "Megatron-Core num_floating_point_operations"
    return None


def _active_ffn(model: dict[str, Any], ffn: int, num_layers: int) -> float:
    """The MLP width Megatron-Core's formula counts per layer: the dense width, or for MoE
    layers top-k routed expert widths plus the shared experts' (no router), averaged over the
    layers (``num_floating_point_operations``, MoE branch)."""
    experts = as_integer(model.get("num_experts")) or 0
    if not experts:
        return float(ffn)
    first_dense = as_integer(model.get("moe_first_dense_layers")) or 0
    freq = as_integer(model.get("moe_layer_freq")) or 1
    moe = sum(1 for i in range(first_dense, num_layers) if (i - first_dense) % freq == 0)
    routed = (as_integer(model.get("moe_top_k")) or 2) * (
        as_integer(model.get("moe_ffn_hidden_size")) or ffn
    )
    shared = as_integer(model.get("moe_shared_expert_ffn_hidden_size")) or 0
    return ((num_layers - moe) * ffn + moe * (routed + shared)) / num_layers


def _peak_flops_per_s(case: dict[str, Any]) -> float | None:
    hardware = case.get("hardware") or {}
    for key in ("peak_tflops_16bit", "peak_tflops_bf16_dense"):
        peak = as_number(hardware.get(key))
        if peak:
            return peak * 1e12
    return None


def measured_step_time(case: dict[str, Any]) -> Measurement | None:
    """The measured step time: reported, or converted from tokens/s, TFLOP/s or MFU.

    Conversions use the quantity the source reported with the source's own FLOP formula, so the
    FLOP definition cancels out: t = F_source / (reported FLOP/s per GPU * num_gpus).
    """
    measured, hardware = case.get("measured") or {}, case.get("hardware") or {}
    num_gpus = as_integer(hardware.get("num_gpus"))
    reported = as_number(measured.get("iteration_time_s"))
    if reported:
        return Measurement(step_time_s=reported, how="reported iteration time")
    if not num_gpus:
        return None
    shape = _shape(case)
    tokens = as_number(measured.get("tokens_per_s_per_gpu"))
    if tokens and shape:
        step = shape["global_batch_size"] * shape["seq_len"] / (tokens * num_gpus)
        return Measurement(step_time_s=step, how="global batch tokens / reported tokens/s")
    flops = _flops_from_definition(case)
    if flops is None:
        return None
    flops_per_step, formula = flops
    tflops = as_number(measured.get("tflops_per_gpu"))
    if tflops:
        step = flops_per_step / (tflops * 1e12 * num_gpus)
        return Measurement(step_time_s=step, how=f"reported TFLOP/s/GPU with {formula}")
    mfu, peak = as_number(measured.get("mfu")), _peak_flops_per_s(case)
    if mfu and peak:
        step = flops_per_step / (mfu * peak * num_gpus)
        return Measurement(step_time_s=step, how=f"reported MFU with {formula}")
    return None


_MEMORY_KEYS_GIB = ("memory_gib", "peak_memory_gib", "max_memory_gib", "max_reserved_gib")
_MEMORY_KEYS_GB = ("memory_gb", "peak_memory_gb", "max_memory_gb")
GIB = float(1 << 30)
"""Bytes per GiB."""


def measured_memory_gib(case: dict[str, Any]) -> float | None:
    """The peak memory per GPU the source reports, in GiB (GB figures converted), or None."""
    measured = case.get("measured") or {}
    for key in _MEMORY_KEYS_GIB:
        value = as_number(measured.get(key))
        if value:
            return value
    for key in _MEMORY_KEYS_GB:
        value = as_number(measured.get(key))
        if value:
            return value * 1e9 / GIB
    return None
