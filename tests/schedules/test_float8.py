"""torchao float8 recipes: the casts and GEMMs of a tiny layer, counted by hand; the recipe and
float8 all-gather choices; the torchtitan importer's float8 tables.

The tiny layer: h = 64, 4 heads (kd = 64), gated f = 128, s = 32, b = 1, tp = 1, so T = 32
tokens and the weight GEMMs (m, n, k) are qkv (32, 192, 64), proj (32, 64, 64),
fc1 (32, 256, 64), fc2 (32, 64, 128). Summed over the four linears: inputs X = 32 (64 + 64 +
64 + 128) = 10,240 elements, weights W = 64 (192 + 64 + 256 + 128) = 40,960, output gradients
G = 32 (192 + 64 + 256 + 64) = 18,432.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from schedules.float8 import layer_gather_bytes, scale_precompute_bytes
from schedules.importers import from_torchtitan_toml
from schedules.kernels import layer_kernels
from schedules.params import layer_params_per_gpu
from schedules.plan import Plan, load_plan
from schedules.resolve import resolve_plan
from tests.model_configs import TINY_FP8_LAYER, fp8_cast_bytes_per_phase

X, W, G = 10_240, 40_960, 18_432


def tiny(parallel: dict[str, Any] | None = None, **training: Any) -> Plan:
    """The tiny layer under FSDP2 (no autocast weight casts) with these training keys."""
    raw = {
        "model": TINY_FP8_LAYER,
        "cluster": {"node": "dgx-h100"},
        "parallel": {"data_parallel": "fsdp2"} | (parallel or {}),
        "training": {"micro_batch_size": 1, "global_batch_size": 8, "stack": "compile"} | training,
    }
    return load_plan(raw)


cast_bytes_per_phase = fp8_cast_bytes_per_phase


@pytest.mark.parametrize(
    ("training", "expected"),
    [
        # amax fused into the producer, one cast writes both layouts: 4X + (2 + 3)W | 3W + 4G
        ({}, (4 * X + 5 * W, 3 * W + 4 * G, 0)),
        # 3X + 3W | 7W + 3G | 3X + 4W (post-scale of the weight gradient) + 3G
        ({"float8_recipe": "rowwise"}, (3 * X + 3 * W, 7 * W + 3 * G, 3 * X + 4 * W + 3 * G)),
        ({"float8_recipe": "rowwise_with_gw_hp"}, (X + 3 * W, 3 * W + G, 0)),
        # the weight arrives in float8: only its transposed copy for the input gradient
        ({"float8_all_gather": True}, (4 * X, 2 * W + 4 * G, 0)),
    ],
)
def test_compiled_cast_bytes_of_a_tiny_layer(
    training: dict[str, Any], expected: tuple[float, ...]
) -> None:
    assert cast_bytes_per_phase(tiny(precision="fp8", **training)) == expected


def test_eager_casts_count_every_op_and_every_linear() -> None:
    """33 bytes per cast (abs 4, max 2, to fp32 6, scale 8, clamp 8, to fp8 5), recast in the
    backward, +2 per transposed float8 copy; wq, wk, wv (and w1, w3) each cast the input."""
    x_eager = 32 * 64 * 3 + 32 * 64 + 32 * 64 * 2 + 32 * 128
    assert x_eager == 16_384
    expected = (33 * (x_eager + W), 35 * W + 33 * G, 35 * (x_eager + G))
    assert cast_bytes_per_phase(tiny(precision="fp8", stack="eager")) == expected


def test_tensorwise_tp_casts_the_gathered_operands_on_their_shard() -> None:
    """TP 2 with SP: qkv (32, 96, 64), proj (32, 64, 32), fc1 (32, 128, 64), fc2 (32, 64, 64).
    The inputs of qkv and fc1 and the output gradients of proj and fc2 are cast on their
    sequence shard (3 bytes per shard element: 1.5 per gathered one) and copied transposed
    (1 + 1) for the weight gradient; the rest as without TP."""
    plan = tiny({"tp": 2, "sequence_parallel": True}, precision="fp8")
    x_gathered, g_gathered = 32 * 64 * 2, 32 * 64 * 2  # qkv + fc1 inputs, proj + fc2 gradients
    x_local, g_local = 32 * 32 + 32 * 64, 32 * 96 + 32 * 128  # proj + fc2 in, qkv + fc1 grads
    w = 96 * 64 + 64 * 32 + 128 * 64 + 64 * 64  # = 20,480: W / 2
    assert cast_bytes_per_phase(plan) == (
        1.5 * x_gathered + 4 * x_local + 5 * w,
        3 * w + 4 * g_local + 1.5 * g_gathered,
        2 * x_gathered + 2 * g_gathered,
    )
    # rowwise keeps bf16 TP all-gathers and casts the gathered tensors
    rowwise = tiny({"tp": 2, "sequence_parallel": True}, precision="fp8", float8_recipe="rowwise")
    x, g = x_gathered + x_local, g_gathered + g_local
    assert cast_bytes_per_phase(rowwise) == (3 * x + 3 * w, 7 * w + 3 * g, 3 * x + 4 * w + 3 * g)


def test_the_kernels_of_a_tensorwise_layer() -> None:
    layer = layer_kernels(tiny(precision="fp8"))
    assert [k.name for k in layer.forward] == [
        "qkv_fp8_cast", "qkv", "proj_fp8_cast", "proj", "fc1_fp8_cast", "fc1",
        "fc2_fp8_cast", "fc2", "attention", "elementwise",
    ]  # fmt: skip
    assert [k.name for k in layer.backward_weight] == [
        "qkv_wgrad", "proj_wgrad", "fc1_wgrad", "fc2_wgrad",
    ]  # fmt: skip
    qkv_cast = layer.forward[0]
    assert qkv_cast.kind == "memory" and qkv_cast.bytes == 4 * 32 * 64 + 5 * 192 * 64
    gemms = [k for phase in (layer.forward, layer.backward_input, layer.backward_weight)
             for k in phase if k.kind == "gemm"]  # fmt: skip
    assert {(k.dtype, k.backend) for k in gemms} == {("fp8", "")}


def test_rowwise_runs_the_cutlass_kernel_forward_and_gw_hp_keeps_wgrad_in_bf16() -> None:
    rowwise = layer_kernels(tiny(precision="fp8", float8_recipe="rowwise"))
    assert [k.backend for k in rowwise.forward if k.kind == "gemm"] == ["cutlass_rowwise"] * 4
    assert {k.backend for k in rowwise.backward_input if k.kind == "gemm"} == {""}
    gw_hp = layer_kernels(tiny(precision="fp8", float8_recipe="rowwise_with_gw_hp"))
    assert [k.dtype for k in gw_hp.backward_weight] == ["bf16"] * 4
    assert {k.dtype for k in gw_hp.backward_input if k.kind == "gemm"} == {"fp8"}


def test_without_fp8_nothing_is_cast_and_megatron_casts_are_transformer_engines() -> None:
    assert cast_bytes_per_phase(tiny()) == (0, 0, 0)
    # torchao's casts are elementwise kernels; Transformer Engine's (test_transformer_engine.py)
    # are copies
    layer = layer_kernels(tiny(precision="fp8", stack="megatron"))
    megatron_casts = [k for k in layer.forward if k.name.endswith("_fp8_cast")]
    assert megatron_casts and {k.memory_class for k in megatron_casts} == {"copy"}


def test_op_recompute_recasts_the_rerun_linears() -> None:
    """wk (32, 64, 64), wo (32, 64, 64) and w3 (32, 128, 64) again: 4X + 5W each."""
    plan = load_plan(
        {
            "model": {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_heads": 4,
                      "ffn_hidden_size": 128, "vocab_size": 256, "seq_len": 32},
            "cluster": {"node": "dgx-h100"},
            "parallel": {"data_parallel": "fsdp2", "recompute": "op"},
            "training": {"micro_batch_size": 1, "global_batch_size": 8, "stack": "compile",
                         "precision": "fp8"},
        }
    )  # fmt: skip
    recompute = layer_kernels(plan).recompute
    assert [k.name for k in recompute] == [
        "k_recompute_fp8_cast", "k_recompute", "proj_recompute_fp8_cast", "proj_recompute",
        "fc1_up_recompute_fp8_cast", "fc1_up_recompute", "elementwise",
    ]  # fmt: skip
    assert sum(
        k.bytes for k in recompute if k.name.endswith("_fp8_cast")
    ) == 3 * 4 * 32 * 64 + 5 * 64 * (64 + 64 + 128)


def test_float8_all_gather_halves_the_linear_weights_on_the_wire() -> None:
    """A layer's linear weights (40,960) at 1 byte, its two norms (2 x 64) at 2 bytes."""
    plan = tiny(precision="fp8", float8_all_gather=True)
    assert layer_params_per_gpu(plan.model, 1) == W + 128
    assert layer_gather_bytes(plan) == W + 2 * 128
    assert layer_gather_bytes(tiny(precision="fp8")) == 2 * (W + 128)
    # the step-end scale precompute reads the float8 weights' fp32 shards: 4 bytes each
    read = scale_precompute_bytes(plan, num_layers=2, params=1000.0, optimizer_params=100.0)
    assert read == pytest.approx(4 * 100 * 2 * W / 1000)
    bf16_gather = tiny(precision="fp8")
    assert scale_precompute_bytes(bf16_gather, num_layers=2, params=1.0, optimizer_params=1.0) == 0


@pytest.mark.parametrize(
    ("training", "message"),
    [
        ({"precision": "fp8", "float8_recipe": "blockwise"},
         "training.float8_recipe='blockwise' is not one of tensorwise, rowwise, "
         "rowwise_with_gw_hp"),
        ({"float8_recipe": "rowwise"},
         "training.float8_recipe needs training.precision=fp8, got precision=bf16"),
        ({"float8_all_gather": True},
         "training.float8_all_gather needs training.precision=fp8, got precision=bf16"),
        ({"precision": "fp8", "float8_recipe": "rowwise", "float8_all_gather": True},
         "training.float8_all_gather needs float8_recipe tensorwise"),
    ],
)  # fmt: skip
def test_bad_float8_choices(training: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as error:
        tiny(**training)
    assert str(error.value).startswith(message)


def test_float8_choices_that_need_the_layout() -> None:
    with pytest.raises(ValueError, match="float8_recipe=rowwise is torchao's Float8Linear"):
        resolve_plan(tiny(precision="fp8", float8_recipe="rowwise", stack="megatron"), 8)
    ddp = load_plan(
        {
            "model": "llama3-8b",
            "cluster": {"node": "dgx-h100"},
            "parallel": {"data_parallel": "ddp"},
            "training": {"micro_batch_size": 1, "global_batch_size": 8, "precision": "fp8",
                         "float8_all_gather": True},
        }
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"float8_all_gather needs FSDP2 .* got data_parallel=ddp"):
        resolve_plan(ddp, 8)


# --- torchtitan's float8 tables ------------------------------------------------------------

TITAN_V02 = """
[model]
flavor = "8B"
converters = ["quantize.linear.float8"]
[training]
local_batch_size = 2
[parallelism]
data_parallel_shard_degree = 8
[quantize.linear.float8]
recipe_name = "rowwise"
filter_fqns = ["output"]
"""
TITAN_V01 = """
[model]
flavor = "8B"
converters = ["float8"]
[training]
local_batch_size = 2
[parallelism]
data_parallel_shard_degree = 8
[float8]
enable_fsdp_float8_all_gather = true
precompute_float8_dynamic_scale_for_fsdp = true
force_recompute_fp8_weight_in_bwd = true
"""


def _import(tmp_path: Path, toml: str) -> Any:
    path = tmp_path / "t.toml"
    path.write_text(toml)
    return from_torchtitan_toml(path)


def test_torchtitan_reads_the_recipe_name(tmp_path: Path) -> None:
    imported = _import(tmp_path, TITAN_V02)
    training = imported.sections["training"]
    assert (training["precision"], training["float8_recipe"]) == ("fp8", "rowwise")
    assert "float8_all_gather" not in training
    assert "t.toml: model.converters float8 (torchao Float8Linear): recipe rowwise" in (
        imported.warnings
    )


def test_torchtitan_reads_float8_all_gather(tmp_path: Path) -> None:
    imported = _import(tmp_path, TITAN_V01)
    training = imported.sections["training"]
    assert (training["float8_recipe"], training["float8_all_gather"]) == ("tensorwise", True)
    assert imported.warnings[-2:] == (
        "t.toml: model.converters float8 (torchao Float8Linear): recipe tensorwise with float8 "
        "all-gather",
        "t.toml: float8.force_recompute_fp8_weight_in_bwd is not modelled (ignored)",
    )


def test_torchtitan_refuses_a_recipe_with_float8_all_gather(tmp_path: Path) -> None:
    toml = TITAN_V01.replace("[float8]", '[float8]\nrecipe_name = "rowwise"')
    with pytest.raises(ValueError, match="enable_fsdp_float8_all_gather with recipe_name rowwise"):
        _import(tmp_path, toml)
