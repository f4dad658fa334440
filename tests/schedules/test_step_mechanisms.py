"""Mechanisms read off the H100 steps of results/h100_heldout: Inductor's GEMM padding, the fp32
residual stream under autocast, bias gradients, the eager attention layout copy and fused or
unfused RMSNorm."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from schedules.kernels import (
    BIAS_GRAD_BYTES,
    EAGER_ATTENTION_LAYOUT_BYTES,
    EAGER_SPLIT_GRAD_BYTES,
    FP32_RESIDUAL_BRANCH_CASTS,
    FUSED_ATTENTION_BACKWARD_AUX_BYTES,
    UNFUSED_RMSNORM_BYTES,
    attention_layout_bytes,
    bias_grad_kernels,
    composite_qk_norm,
    elementwise_forward_bytes,
    head_kernels,
    layer_kernels,
    norm_cast_bytes,
    norm_output_readers,
    split_grad_bytes,
)
from schedules.plan import load_plan
from schedules.resolve import resolve_plan
from sim.validation.cases import parse_fused_norm

TOKENS, H, F = 2 * 1024, 1024, 4096


def _plan(model: dict[str, Any] | None = None, **training: Any) -> Any:
    raw = {
        "model": {"name": "m", "num_layers": 2, "hidden_size": H, "num_heads": 16,
                  "ffn_hidden_size": F, "vocab_size": 50257, "seq_len": 1024,
                  "norm": "layernorm", "gated_mlp": False, "position_embedding": "learned",
                  **(model or {})},
        "cluster": {"node": {"base": "dgx-h100", "num_gpus": 1}, "num_nodes": 1},
        "training": {"micro_batch_size": 2, "global_batch_size": 2,
                     "mixed_precision": "autocast", **training},
    }  # fmt: skip
    if training.get("stack") == "megatron":
        del raw["training"]["mixed_precision"]
    return resolve_plan(load_plan(raw), 1)


def _gemm(kernels: Any, name: str) -> tuple[float, ...]:
    return next(k.dims for k in kernels if k.name == name)


def test_compiled_head_gemms_pad_the_vocabulary_to_eight() -> None:
    """50257 runs as 50264 under torch.compile (pad_mm), as 50257 eagerly."""
    compiled = head_kernels(_plan(stack="compile"))
    assert _gemm(compiled.forward, "lm_head") == (TOKENS, 50264, H)
    assert _gemm(compiled.backward_input, "lm_head_dgrad") == (TOKENS, H, 50264)
    assert _gemm(compiled.backward_weight, "lm_head_wgrad") == (H, 50264, TOKENS)
    assert _gemm(head_kernels(_plan(stack="eager")).forward, "lm_head") == (TOKENS, 50257, H)


def test_autocast_keeps_an_fp32_residual_stream() -> None:
    """Eager autocast: two norms at 8 bytes, two adds at 10, GeLU at 4 per FFN element; with bf16
    weights: 4 and 6. Two 6-byte casts forward; the backward casts twice as many."""
    per_token = 2 * 8 * H + 2 * 10 * H + 4 * F
    assert elementwise_forward_bytes(_plan()) == pytest.approx(TOKENS * per_token)
    bf16 = _plan(mixed_precision="bf16_weights")
    assert elementwise_forward_bytes(bf16) == pytest.approx(
        TOKENS * (2 * 4 * H + 2 * 6 * H + 4 * F)
    )
    assert norm_cast_bytes(_plan()) == pytest.approx(2 * 6 * TOKENS * H)
    assert norm_cast_bytes(bf16) == 0.0
    layer = layer_kernels(_plan())
    grad_casts = sum(k.bytes for k in layer.backward_input if k.name == "norm_grad_cast")
    # the two readers' gradients cast up, the two branches' down: four casts
    assert FP32_RESIDUAL_BRANCH_CASTS == 2
    assert grad_casts == pytest.approx(4 * 6 * TOKENS * H)
    # compiled: the add, the norm and the cast fused: 6 + 6 per pair, no cast kernel
    compiled = _plan(stack="compile")
    assert elementwise_forward_bytes(compiled) == pytest.approx(
        TOKENS * (2 * 6 * H + 2 * 6 * H + 4 * F)
    )
    assert norm_cast_bytes(compiled) == 0.0


def test_autocast_casts_the_input_of_every_linear_that_reads_a_norm() -> None:
    """Under autocast each linear reading a norm's fp32 output casts its own bf16 copy: two in a
    fused layer, sequential or parallel (one norm, read by QKV and up), five with separate gated
    projections (q, k, v, gate, up), the three more launched beyond the fused layer's casts."""
    cast = 6 * TOKENS * H  # read fp32, write bf16
    fused = _plan({"norm": "rmsnorm", "gated_mlp": True})
    separate = _plan({"norm": "rmsnorm", "gated_mlp": True, "separate_projections": True})
    block = _plan({"parallel_block": True})
    assert [norm_output_readers(p.model) for p in (fused, separate, block)] == [2, 5, 2]
    assert norm_cast_bytes(fused) == pytest.approx(2 * cast)
    assert norm_cast_bytes(separate) == pytest.approx(5 * cast)
    assert norm_cast_bytes(block) == pytest.approx(2 * cast)  # one norm, two readers
    # the backward: each reader's input gradient cast up, each branch's output gradient down
    for plan, more, grad_casts in ((fused, 0, 4), (separate, 3, 7), (block, 0, 4)):
        kernels = layer_kernels(plan)
        (forward,) = (k for k in kernels.forward if k.name == "norm_output_cast")
        (backward,) = (k for k in kernels.backward_input if k.name == "norm_grad_cast")
        assert forward.extra_launches == backward.extra_launches == more
        assert backward.bytes == pytest.approx(grad_casts * cast)
    # eager autocast: each of the three extra partial input gradients added in fp32 by a kernel
    # of its own, 12 bytes per element (two of h for q, k, v; one for gate and up)
    (sums,) = (k for k in layer_kernels(separate).backward_input if k.name == "projection_grad_sum")
    assert sums.bytes == pytest.approx(12 * 3 * TOKENS * H)
    plain_separate = _plan({"separate_projections": True})  # a plain MLP: one up projection
    assert norm_output_readers(plain_separate.model) == 4


def test_biased_linears_reduce_their_output_gradients() -> None:
    """2 bytes per output element of QKV (3h), projection (h), up (f) and down (h)."""
    (kernel,) = bias_grad_kernels(_plan({"linear_bias": True}))
    assert kernel.bytes == pytest.approx(BIAS_GRAD_BYTES * TOKENS * (3 * H + H + F + H))
    assert bias_grad_kernels(_plan({"linear_bias": False})) == ()


def test_eager_attention_copies_its_output_back_to_token_major() -> None:
    assert attention_layout_bytes(_plan()) == EAGER_ATTENTION_LAYOUT_BYTES * TOKENS * H
    assert attention_layout_bytes(_plan(stack="compile")) == 0.0
    layer = layer_kernels(_plan())
    assert [k.name for k in layer.forward].count("attention_layout") == 1
    assert [k.name for k in layer.backward_input].count("attention_layout") == 1


def test_an_unfused_rmsnorm_moves_nine_passes_of_bytes() -> None:
    rms = {"norm": "rmsnorm"}
    fused = elementwise_forward_bytes(_plan(rms, mixed_precision="bf16_weights"))
    unfused = elementwise_forward_bytes(
        _plan(rms, mixed_precision="bf16_weights", fused_norm=False)
    )
    assert unfused - fused == pytest.approx(2 * (UNFUSED_RMSNORM_BYTES - 4) * TOKENS * H)
    # LayerNorm and the compiled stack are one kernel whatever the key says
    layer = {"mixed_precision": "bf16_weights", "fused_norm": False}
    assert elementwise_forward_bytes(_plan(**layer)) == elementwise_forward_bytes(
        _plan(mixed_precision="bf16_weights")
    )


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        ("torch 1963fc8 (2024-12-23), torchao eab345c, torchtitan 9dec370 (2024-12-26)", False),
        ("torch 2.9.0 (2025-10-15)", None),
        ("torchtitan 9dec370 (2024-12-26)", None),
    ],
)
def test_runs_on_a_torch_before_the_fused_rmsnorm_are_unfused(versions: str, expected: Any) -> None:
    assert parse_fused_norm({"source": {"versions": versions}}) is expected


def test_split_projections_concatenate_their_gradients() -> None:
    """Eager: the QKV output (3h wide here) and a gated up projection (2f); compiled: QKV only;
    Megatron: none."""
    gated = {"gated_mlp": True, "norm": "rmsnorm", "position_embedding": "rope"}
    assert split_grad_bytes(_plan(gated)) == EAGER_SPLIT_GRAD_BYTES * TOKENS * (3 * H + 2 * F)
    assert split_grad_bytes(_plan()) == EAGER_SPLIT_GRAD_BYTES * TOKENS * 3 * H
    assert (
        split_grad_bytes(_plan(gated, stack="compile")) == EAGER_SPLIT_GRAD_BYTES * TOKENS * 3 * H
    )
    assert split_grad_bytes(_plan(gated, stack="megatron")) == 0.0


def test_a_fused_attention_backward_reads_do_and_o_and_converts_dq() -> None:
    """10 bytes per query element: dot(dO, O) reads both (4), the fp32 dQ becomes bf16 (6)."""
    for stack in ("eager", "compile", "megatron"):
        backward = layer_kernels(_plan(stack=stack)).backward_input
        aux = [k for k in backward if k.name == "attention_backward_aux"]
        assert [k.bytes for k in aux] == [FUSED_ATTENTION_BACKWARD_AUX_BYTES * TOKENS * H]
    unfused = layer_kernels(_plan(flash_attention=False)).backward_input
    assert not [k for k in unfused if k.name == "attention_backward_aux"]


def _memory(micro: int = 1, **training: Any) -> dict[str, float]:
    from schedules.memory import memory_per_gpu

    raw = {
        "model": {"name": "m", "num_layers": 2, "hidden_size": H, "num_heads": 16,
                  "ffn_hidden_size": F, "vocab_size": 32000, "seq_len": 1024},
        "cluster": {"node": {"base": "dgx-h100", "num_gpus": 1}, "num_nodes": 1},
        "training": {"micro_batch_size": 2, "global_batch_size": 2 * micro,
                     "mixed_precision": "autocast", **training},
    }  # fmt: skip
    return memory_per_gpu(resolve_plan(load_plan(raw), 1), hbm_bytes=80e9)


def test_an_autocast_loop_keeps_fp32_weights_and_two_moments() -> None:
    """16 bytes per parameter (4 + 4 + 8) and autocast's bf16 copies (2) while accumulating;
    with one micro-batch the gradients are not alive at the forward's peak."""
    from schedules.params import total_params
    from schedules.plan import ModelConfig

    model = ModelConfig(name="m", num_layers=2, hidden_size=H, num_heads=16, ffn_hidden_size=F,
                        vocab_size=32000, seq_len=1024)  # fmt: skip
    params = total_params(model)
    accumulating = _memory(micro=2)
    assert accumulating["weights"] == pytest.approx(4 * params)
    assert accumulating["gradients"] == pytest.approx(4 * params)
    assert accumulating["optimizer"] == pytest.approx(8 * params)
    assert accumulating["buffers"] == pytest.approx(2 * params)  # casts; no DDP bucket on 1 GPU
    one = _memory(micro=1)
    freed = one["activations"] + one["logits"] + 2 * params
    assert one["gradients"] == pytest.approx(max(0.0, 4 * params - freed))
    bf16 = _memory(micro=2, mixed_precision="bf16_weights")
    assert (bf16["weights"], bf16["optimizer"]) == (
        pytest.approx(2 * params),
        pytest.approx(12 * params),
    )


def test_the_fp32_residual_stream_is_saved_at_four_bytes() -> None:
    """Two residual-stream tensors per layer saved 2 bytes wider under autocast; and what
    ``commbench --step``'s own model keeps beyond separate projections (autocast is its loop:
    ``schedules.memory.eager_saved_bytes``): without grouped-query attention V's view keeps the
    QKV output (h + 2h) beside the new Q and K (2h) and the output's copy (h), 3h more than the
    3h counted; two layers."""
    autocast, bf16 = _memory(micro=2), _memory(micro=2, mixed_precision="bf16_weights")
    residual, fused_qkv = 2 * 2 * 2 * TOKENS * H, 2 * 2 * 3 * TOKENS * H
    assert autocast["activations"] - bf16["activations"] == pytest.approx(residual + fused_qkv)


def test_dropout_on_unfused_attention_runs_its_own_kernels() -> None:
    """Megatron's unfused attention drops out the b x heads x s x s probabilities: 5 bytes per
    score forward (read 2, write 2, a 1-byte mask) and 5 backward (gradient and mask in, one
    gradient out); each residual add that drops out its branch writes the mask too (1 byte
    per element). A fused attention drops out inside its kernel: only the masks of the adds."""
    from schedules.kernels import DROPOUT_BYTES, DROPOUT_MASK_BYTES

    scores = 2 * 16 * 1024 * 1024  # micro-batch 2, 16 heads, 1024 x 1024
    plain = layer_kernels(_plan(stack="megatron", flash_attention=False))
    dropped = layer_kernels(_plan({"dropout": True}, stack="megatron", flash_attention=False))
    assert DROPOUT_BYTES == 5 and DROPOUT_MASK_BYTES == 1
    for phase, name in (
        ("forward", "attention_dropout"),
        ("backward_input", "attention_dropout_backward"),
    ):
        assert [k.bytes for k in getattr(dropped, phase) if k.name == name] == [5 * scores]
        assert not [k for k in getattr(plain, phase) if k.name == name]
    assert (
        elementwise_forward_bytes(_plan({"dropout": True}, stack="megatron"))
        - elementwise_forward_bytes(_plan(stack="megatron"))
        == 2 * TOKENS * H
    )
    fused = layer_kernels(_plan({"dropout": True}, stack="megatron"))
    assert not [k for k in fused.forward if "dropout" in k.name]


def test_korthikanti_selective_recompute_overhead_is_the_attention_core_with_dropout() -> None:
    """Korthikanti et al. 2022, Table 4 (22B on 8 A100, one layer): selective recomputation
    adds 1.3 ms to the backward (11.9 -> 13.2 ms; 11.8 -> 13.1 with sequence parallelism), the
    attention core's forward run again. The model's core forward on the isolated A100 curves
    takes 1.25 ms with the probabilities' dropout and 0.83 ms without it."""
    from schedules.kernels import attention_core_kernels
    from sim.compute.compute_model import ComputeModel
    from topologies.hardware import GPUS
    from vocab.compute_calibration import ComputeCalibration

    raw = {
        "model": {"name": "22B", "num_layers": 48, "hidden_size": 6144, "num_heads": 64,
                  "ffn_hidden_size": 24576, "vocab_size": 51200, "seq_len": 2048,
                  "norm": "layernorm", "gated_mlp": False, "position_embedding": "learned",
                  "linear_bias": True, "dropout": True},
        "cluster": {"node": "dgx-a100", "num_nodes": 1},
        "parallel": {"tp": 8, "sequence_parallel": True, "recompute": "selective"},
        "training": {"micro_batch_size": 4, "global_batch_size": 4, "precision": "fp16",
                     "flash_attention": False, "stack": "megatron"},
    }  # fmt: skip
    compute = ComputeModel(GPUS["a100-sxm-80gb"], ComputeCalibration(in_step_slowdown=0.0))
    with_dropout = compute.price(attention_core_kernels(resolve_plan(load_plan(raw), 8))[0])
    raw["model"]["dropout"] = False
    without = compute.price(attention_core_kernels(resolve_plan(load_plan(raw), 8))[0])
    assert with_dropout == pytest.approx(1.3e-3, rel=0.05)
    assert without < 0.7 * 1.3e-3


def _tp_plan(stack: str = "compile", precision: str = "bf16", **parallel: Any) -> Any:
    """A layer on 8 GPUs at TP 8 with sequence parallelism (micro-batch 2, 1024 tokens)."""
    raw = {
        "model": {"name": "m", "num_layers": 2, "hidden_size": H, "num_heads": 16,
                  "ffn_hidden_size": F, "vocab_size": 32000, "seq_len": 1024},
        "cluster": {"node": "dgx-h100", "num_nodes": 1},
        "parallel": {"tp": 8, "sequence_parallel": True, **parallel},
        "training": {"micro_batch_size": 2, "global_batch_size": 2, "stack": stack,
                     "precision": precision},
    }  # fmt: skip
    return resolve_plan(load_plan(raw), 8)


def test_dtensor_sequence_parallel_collectives_copy_what_they_gather() -> None:
    """DTensor gathers and scatters (b, s, h) on the sequence, dim 1, where NCCL works on dim 0:
    each all-gather's output and each reduce-scatter's input is copied by chunk + cat, read and
    written whole (M = 2 b s h bytes): forward 2 + 2, backward 2 + 2, the per-op recompute's two
    re-gathers, a full recompute's 2 + 1; float8 TP gathers float8 (M / 2). None on the Megatron
    stack (sequence-first) or under asynchronous TP."""
    from schedules.kernels import dtensor_sequence_copies, tp_gather_bytes

    m = 2 * 2 * 1024 * H  # 2 bytes x micro-batch 2 x 1024 tokens x hidden

    def copies(plan: Any, phase: str) -> list[float]:
        return [k.bytes for k in getattr(layer_kernels(plan), phase) if "sequence_copy" in k.name]

    plain = _tp_plan()
    assert dtensor_sequence_copies(plain) and tp_gather_bytes(plain) == m
    assert copies(plain, "forward") == [2 * 4 * m] and copies(plain, "backward_input") == [8 * m]
    assert copies(_tp_plan(recompute="op"), "recompute") == [2 * 2 * m]
    # a full recompute reruns the forward's but the MLP output's reduce-scatter (PyTorch's
    # checkpoint does not rerun it): 2 gathers + 1 scatter
    assert copies(_tp_plan(recompute="full"), "recompute") == [2 * 3 * m]
    float8 = _tp_plan(precision="fp8")
    assert tp_gather_bytes(float8) == m / 2
    assert copies(float8, "forward") == [2 * (2 * m / 2 + 2 * m)]
    for other in (_tp_plan("megatron"), _tp_plan(tp_comm_overlap=True)):
        assert not dtensor_sequence_copies(other)
        assert copies(other, "forward") == [] and copies(other, "backward_input") == []


def test_transformer_engine_fp8_gathers_fp8_on_the_wire() -> None:
    """Megatron with TE FP8 and sequence parallelism: the norm writes the QKV and MLP inputs in
    FP8 into the gather and the row-parallel linears gather their output gradients in FP8
    (M / 2); in bf16, or without sequence parallelism (all-reduces), the 16-bit message."""
    from schedules.kernels import tp_gather_bytes

    m = 2 * 2 * 1024 * H
    assert tp_gather_bytes(_tp_plan("megatron", precision="fp8")) == m / 2
    assert tp_gather_bytes(_tp_plan("megatron")) == m
    assert tp_gather_bytes(_tp_plan("megatron", precision="fp8", sequence_parallel=False)) == m


def test_float8_tp_gathers_float8_on_the_wire() -> None:
    """The forward's all-gathers (and the backward's, and the full recompute's) take the gather
    size; the reduce-scatters keep the 16-bit message."""
    from schedules.actions import CommStep
    from schedules.tp_steps import LinearShares, tp_backward_steps, tp_forward_steps

    forward = tp_forward_steps(
        forward_s=1.0, num_layers=2, tp_bytes=100.0, tp=8, sequence_parallel=True, gather_bytes=50.0
    )
    sizes = {s.op: s.size_bytes for s in forward if isinstance(s, CommStep)}
    assert sizes == {"all_gather": 50.0, "reduce_scatter": 100.0}
    backward = tp_backward_steps(
        backward_input_s=1.0, backward_weight_s=1.0, recompute_s=1.0, num_layers=2,
        tp_bytes=100.0, shares=LinearShares(qkv=0.2, fc1=0.5), tp=8, sequence_parallel=True,
        full_recompute=True, dtensor=True, gather_bytes=50.0,
    )  # fmt: skip
    gathers = [s.size_bytes for s in backward if isinstance(s, CommStep) and s.op == "all_gather"]
    scatters = [s.size_bytes for s in backward if isinstance(s, CommStep) and s.op != "all_gather"]
    assert gathers and set(gathers) == {50.0} and set(scatters) == {100.0}
    # asynchronous TP's backward (the overlapped placement) gathers float8 too
    overlapped = tp_backward_steps(
        backward_input_s=1.0, backward_weight_s=1.0, recompute_s=0.0, num_layers=2,
        tp_bytes=100.0, shares=LinearShares(qkv=0.2, fc1=0.5), tp=8, sequence_parallel=True,
        gather_bytes=50.0,
    )  # fmt: skip
    sizes = {(s.name, s.size_bytes) for s in overlapped if isinstance(s, CommStep)}
    assert {size for name, size in sizes if name.startswith("AG")} == {50.0}
    assert {size for name, size in sizes if not name.startswith("AG")} == {100.0}


def test_megatron_optimizer_step_passes_beyond_adam() -> None:
    """Megatron's mixed-precision step reads every fp32 main gradient for the norm, reads the
    fp32 master to write the 16-bit weight, with fp16 unscales the main gradients (read +
    write), and clears the local gradient buffer; a 16-bit buffer is first cast to fp32 main
    gradients (read 2, write 4), which Adam then reads (4, not the 2 it is priced at). Not on
    the PyTorch stacks, nor for ZeRO or FSDP (their own optimizers)."""
    from schedules.optimizer_passes import megatron_step_bytes

    megatron = _plan(stack="megatron")
    fp16 = _plan(stack="megatron", precision="fp16")
    fp32_buffer = {"optimizer_params": 100.0, "params": 800.0, "grad_bytes": 4.0}
    assert megatron_step_bytes(megatron, **fp32_buffer) == (4 + 4) * 100 + 4 * 800
    assert megatron_step_bytes(fp16, **fp32_buffer) == (4 + 4 + 8) * 100 + 4 * 800
    half_buffer = {"optimizer_params": 100.0, "params": 100.0, "grad_bytes": 2.0}
    assert megatron_step_bytes(fp16, **half_buffer) == (4 + 4 + (2 + 4 + 2) + 8) * 100 + 2 * 100
    assert megatron_step_bytes(_plan(stack="compile"), **fp32_buffer) == 0.0
    raw = {
        "model": {"name": "m", "num_layers": 2, "hidden_size": H, "num_heads": 16,
                  "ffn_hidden_size": F, "vocab_size": 32000, "seq_len": 1024},
        "cluster": {"node": "dgx-h100", "num_nodes": 1},
        "parallel": {"data_parallel": "zero3"},
        "training": {"micro_batch_size": 2, "global_batch_size": 16, "stack": "megatron"},
    }  # fmt: skip
    assert megatron_step_bytes(resolve_plan(load_plan(raw), 8), **fp32_buffer) == 0.0


def test_separate_projections_run_a_gemm_each_and_sum_their_input_gradients() -> None:
    """torchtitan's wq, wk, wv and w1, w3 at TP 8 (hidden H, 16 heads of H / 16, kv = 16 heads
    here: the model's default; gated MLP of width F), 2 x 1024 tokens gathered: the forward and
    the weight gradients split the fused GEMM's output width, the input gradients its reduction,
    the same FLOPs in all; each extra partial input gradient (2 for q, k, v, 1 for w1, w3) is
    read once more (2 bytes per element of tokens x H); no split-backward concatenation."""
    from schedules.kernels import split_grad_bytes

    fused = layer_kernels(_tp_plan())
    plan = _tp_plan()
    model = dataclasses.replace(plan.model, separate_projections=True)
    plan = dataclasses.replace(plan, model=model)
    split = layer_kernels(plan)
    tokens, kv = 2 * 1024, plan.model.kv_size

    def dims(phase: tuple[Any, ...], name: str) -> list[tuple[float, ...]]:
        return [k.dims for k in phase if k.name == name and k.kind == "gemm"]

    q, k = (tokens, H / 8, H), (tokens, kv / 8, H)
    assert dims(split.forward, "qkv") == [q, k, k]
    assert dims(split.forward, "fc1") == [(tokens, F / 8, H)] * 2
    assert dims(split.backward_input, "qkv_dgrad")[1] == (tokens, H, kv / 8)
    assert dims(split.backward_weight, "fc1_wgrad") == [(H, F / 8, tokens)] * 2
    assert dims(fused.forward, "qkv") == [(tokens, (H + 2 * kv) / 8, H)]

    def flops(phase: tuple[Any, ...]) -> float:
        return sum(k.flops for k in phase if k.kind == "gemm")

    for phase in ("forward", "backward_input", "backward_weight"):
        assert flops(getattr(split, phase)) == pytest.approx(flops(getattr(fused, phase)))
    sums = [k.bytes for k in split.backward_input if k.name == "projection_grad_sum"]
    assert sums == [2 * (2 + 1) * tokens * H]
    assert split_grad_bytes(plan) == 0 and split_grad_bytes(_tp_plan()) > 0


QWEN = {"norm": "rmsnorm", "position_embedding": "rope", "gated_mlp": True, "num_kv_heads": 4,
        "head_dim": 128, "qk_norm": True}  # fmt: skip
"""16 query heads of 128 (a d = 2048) and 4 key/value heads (k d = 512) on h = 1024."""


def _elementwise(kernels: tuple[Any, ...], name: str) -> Any:
    return next(k for k in kernels if k.name == name)


def test_the_eager_qk_norm_under_autocast_runs_the_composite() -> None:
    """Eager over fp32 weights: the query and key norms move 40 bytes per element forward and
    108 backward and launch 16 and 34 kernels per layer (``EAGER_QK_NORM``); compiled or with
    bf16 weights the fused norm's bytes and no extra launches."""
    elements = TOKENS * (16 * 128 + 4 * 128)
    eager = _plan(QWEN, stack="eager")
    plain = _plan({**QWEN, "qk_norm": False}, stack="eager")
    assert composite_qk_norm(eager) and not composite_qk_norm(plain)
    added = elementwise_forward_bytes(eager) - elementwise_forward_bytes(plain)
    assert added == 40 * elements
    kernels, without = layer_kernels(eager), layer_kernels(plain)
    forward, forward_plain = (_elementwise(k.forward, "elementwise") for k in (kernels, without))
    assert forward.extra_launches - forward_plain.extra_launches == 16
    backward, backward_plain = (
        _elementwise(k.backward_input, "elementwise_backward") for k in (kernels, without)
    )
    assert backward.bytes - backward_plain.bytes == pytest.approx(108 * elements)
    assert backward.extra_launches - backward_plain.extra_launches == 34
    compiled = _plan(QWEN, stack="compile")  # Inductor's fused norm over the fp32 stream: 6
    bf16_weights = _plan(QWEN, stack="eager", mixed_precision="bf16_weights")  # fused: 4
    for other, fused_bytes in ((compiled, 6), (bf16_weights, 4)):
        assert not composite_qk_norm(other)
        norm_bytes = elementwise_forward_bytes(other) - elementwise_forward_bytes(
            dataclasses.replace(other, model=dataclasses.replace(other.model, qk_norm=False))
        )
        assert norm_bytes == fused_bytes * elements
        backward = _elementwise(layer_kernels(other).backward_input, "elementwise_backward")
        assert backward.bytes == 2 * elementwise_forward_bytes(other)
