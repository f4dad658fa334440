"""Transformer Engine FP8 on the megatron stack: the casts and transposes of a tiny layer,
counted by hand; the per-step weight casts; the recipe choice.

The tiny layer: h = 64, 4 heads (kd = 64), gated f = 128, s = 32, b = 1, so T = 32 tokens.
At tp = 1 the weight GEMMs (m, n, k) are qkv (32, 192, 64), proj (32, 64, 64), fc1 (32, 256, 64),
fc2 (32, 64, 128): norm-cast inputs XN = 32 (64 + 64) = 4,096 elements (qkv, fc1), cast inputs
XL = 32 (64 + 128) = 6,144 (proj, fc2), output gradients G = 32 (192 + 64 + 256 + 64) = 18,432,
weights W = 64 (192 + 64 + 256 + 128) = 40,960 per layer.
At tp = 2 with sequence parallelism: qkv (32, 96, 64), proj (32, 64, 32), fc1 (32, 128, 64),
fc2 (32, 64, 64): XN = 4,096 gathered (2,048 on the shard), XL = 32 (32 + 64) = 3,072, the
column-parallel gradients GC = 32 (96 + 128) = 7,168, the row-parallel ones GR = 32 (64 + 64) =
4,096 gathered (2,048 on the shard).
"""

from __future__ import annotations

from typing import Any

import pytest

from schedules.kernels import layer_kernels
from schedules.plan import Plan, load_plan
from schedules.resolve import resolve_plan
from schedules.transformer_engine import te_cast_bytes, weight_cast_bytes_per_step
from tests.model_configs import TINY_FP8_LAYER, fp8_cast_bytes_per_phase

XN, XL, G, W = 4_096, 6_144, 18_432, 40_960
SP_XL, SP_GC, SP_GR = 3_072, 7_168, 4_096


def tiny(parallel: dict[str, Any] | None = None, **training: Any) -> Plan:
    """The tiny layer on the megatron stack with these parallel and training keys."""
    raw = {
        "model": TINY_FP8_LAYER,
        "cluster": {"node": "dgx-h100"},
        "parallel": {"data_parallel": "distributed_optimizer"} | (parallel or {}),
        "training": {"micro_batch_size": 1, "global_batch_size": 8, "stack": "megatron"} | training,
    }
    return load_plan(raw)


cast_bytes_per_phase = fp8_cast_bytes_per_phase


SP = {"tp": 2, "sequence_parallel": True}


@pytest.mark.parametrize(
    ("parallel", "training", "expected"),
    [
        # the norm's FP8 output transposed 1 + 1, the other inputs cast-transposed 2 + 1 + 1;
        # every gradient cast-transposed
        ({}, {}, (2 * XN + 4 * XL, 4 * G, 0)),
        # current scaling: + 2 per element cast from bf16; the norm output cast-transposed
        ({}, {"te_fp8_recipe": "current"}, (4 * XN + 6 * XL, 6 * G, 0)),
        # sequence parallel: the norm casts its shard, the gathered input is transposed in the
        # wgrad; proj and fc2 cast their gradient shard (2 + 1) and transpose it once gathered
        (SP, {}, (4 * SP_XL, 4 * SP_GC + 3 * SP_GR / 2, 2 * XN + 2 * SP_GR)),
        (
            SP,
            {"te_fp8_recipe": "current"},
            (3 * XN / 2 + 6 * SP_XL, 6 * SP_GC + 5 * SP_GR / 2, 2 * XN + 2 * SP_GR),
        ),
    ],
)
def test_cast_bytes_of_a_tiny_layer(
    parallel: dict[str, Any], training: dict[str, Any], expected: tuple[float, float, float]
) -> None:
    plan = tiny(parallel, precision="fp8", **training)
    assert cast_bytes_per_phase(plan) == expected


def test_casts_are_copy_kernels_before_fp8_gemms() -> None:
    layer = layer_kernels(tiny(precision="fp8"))
    names = [k.name for k in layer.forward[:4]]
    assert names == ["qkv_fp8_cast", "qkv", "proj_fp8_cast", "proj"]
    assert {k.memory_class for k in layer.forward if k.name.endswith("_fp8_cast")} == {"copy"}
    gemms = [k for k in (*layer.forward, *layer.backward_input, *layer.backward_weight)]
    weight_gemms = [k for k in gemms if k.name.split("_")[0] in ("qkv", "proj", "fc1", "fc2")]
    assert {k.dtype for k in weight_gemms if k.kind == "gemm"} == {"fp8"}


def test_weight_casts_once_per_step() -> None:
    # cast-transposed: read 2, write 1 + 1 (+ 2 for the amax under current scaling)
    assert weight_cast_bytes_per_step(tiny(precision="fp8"), 2) == 2 * 4 * W
    current = tiny(precision="fp8", te_fp8_recipe="current")
    assert weight_cast_bytes_per_step(current, 2) == 2 * 6 * W


def test_bf16_and_pytorch_stacks_have_no_te_casts() -> None:
    bf16 = tiny()
    assert cast_bytes_per_phase(bf16) == (0, 0, 0)
    assert weight_cast_bytes_per_step(bf16, 2) == 0
    compile_fp8 = tiny({"data_parallel": "fsdp2"}, precision="fp8", stack="compile")
    assert te_cast_bytes(compile_fp8, "qkv", (32, 192, 64)) == (0.0, 0.0, 0.0)
    assert weight_cast_bytes_per_step(compile_fp8, 2) == 0


def test_te_recipe_needs_fp8_and_megatron() -> None:
    with pytest.raises(ValueError, match=r"te_fp8_recipe needs training\.precision=fp8"):
        tiny(te_fp8_recipe="current")
    with pytest.raises(ValueError, match=r"te_fp8_recipe='hybrid' is not one of delayed, current"):
        tiny(precision="fp8", te_fp8_recipe="hybrid")
    compile_fp8 = tiny(
        {"data_parallel": "fsdp2"}, precision="fp8", stack="compile", te_fp8_recipe="delayed"
    )
    with pytest.raises(ValueError, match="te_fp8_recipe=delayed is Transformer Engine's"):
        resolve_plan(compile_fp8, 8)
