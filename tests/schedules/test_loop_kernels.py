"""What a plain PyTorch loop adds around the layers: autocast's or the master weights' copies,
gradient accumulation over micro-batches, the dense embedding gradient, the compiled loss, and
the launches of the fused optimizer."""

from __future__ import annotations

import math
from typing import Any

import pytest

from schedules.activations import COMPILED_LOSS_LOGITS_BYTES_PER_ELEMENT
from schedules.arithmetic import stage_params_per_gpu
from schedules.kernels import (
    ELEMENTWISE_BYTES,
    accumulated_fraction,
    eager_gqa_repeat_launches,
    eager_rotary_launches,
    elementwise_forward_bytes,
    embedding_kernels,
    head_kernels,
    layer_kernels,
    master_copy_bytes,
    weight_cast_bytes,
)
from schedules.memory import eager_saved_bytes, memory_per_gpu
from schedules.params import embedding_params_per_gpu, layer_params_per_gpu
from schedules.plan import load_plan
from schedules.resolve import resolve_plan
from schedules.stacks import kernel_stack, stack_source
from sim.cli.main import main
from sim.compute.compute_model import launch_loop, optimizer_launches
from sim.validation.cases import parse_compile_loss

MODEL = {"name": "m", "num_layers": 4, "hidden_size": 1024, "num_heads": 16,
         "ffn_hidden_size": 4096, "vocab_size": 32000, "seq_len": 1024}  # fmt: skip


def _raw(micro: int = 4, parallel: dict[str, Any] | None = None, **training: Any) -> Any:
    return {
        "model": MODEL,
        "cluster": {"node": {"base": "dgx-h100", "num_gpus": 1}, "num_nodes": 1},
        "parallel": parallel or {},
        "training": {"micro_batch_size": 2, "global_batch_size": 2 * micro, **training},
    }


def _plan(micro: int = 4, parallel: dict[str, Any] | None = None, **training: Any) -> Any:
    """A one-GPU plan; a torch DDP one under autocast unless ``mixed_precision`` says else."""
    if not parallel or parallel.get("data_parallel", "ddp") == "ddp":
        training.setdefault("mixed_precision", "autocast")
    return resolve_plan(load_plan(_raw(micro, parallel, **training)), 1)


def _named(kernels: Any, name: str) -> float:
    return sum(k.bytes for k in kernels if k.name == name)


def test_autocast_accumulates_fp32_gradients_after_the_first_micro_batch() -> None:
    plan = _plan(micro=4)
    assert accumulated_fraction(plan) == pytest.approx(3 / 4)
    params = layer_params_per_gpu(plan.model, 1)
    backward = layer_kernels(plan).backward_weight
    # read .grad and the new gradient, write .grad: 3 x 4 bytes, on 3 of 4 micro-batches
    assert _named(backward, "grad_accumulate") == pytest.approx(12 * params * 3 / 4)
    assert _named(layer_kernels(_plan(micro=1)).backward_weight, "grad_accumulate") == 0.0


def _raw_pipelined(micro: int, **parallel: Any) -> dict[str, Any]:
    return {
        "model": MODEL,
        "cluster": {"node": "dgx-h100", "num_nodes": 1},
        "parallel": {"pp": 2, "dp": 4, "data_parallel": "fsdp2", **parallel},
        "training": {"micro_batch_size": 1, "global_batch_size": 4 * micro, "stack": "compile"},
    }


def _pipelined_fsdp(micro: int, **parallel: Any) -> Any:
    return resolve_plan(load_plan(_raw_pipelined(micro, **parallel)), 8)


def test_fsdp2_under_pipelining_keeps_the_unsharded_gradient_in_fp32() -> None:
    """Gradient sync off for all but the last micro-batch: the first casts each unsharded
    bf16 gradient to fp32 (2 + 4 bytes), every later one adds the new one in (4 + 2 + 4)."""
    plan = _pipelined_fsdp(micro=4)
    params = layer_params_per_gpu(plan.model, 1)
    backward = layer_kernels(plan).backward_weight
    assert _named(backward, "grad_accumulate") == pytest.approx((6 + 10 * 3) / 4 * params)
    bf16 = _pipelined_fsdp(micro=4, fsdp_reduce_dtype="bf16")  # autograd adds into .grad
    assert _named(layer_kernels(bf16).backward_weight, "grad_accumulate") == pytest.approx(
        6 * params * 3 / 4
    )
    assert _named(layer_kernels(_pipelined_fsdp(micro=1)).backward_weight, "grad_accumulate") == 0
    one = resolve_plan(load_plan({**_raw_pipelined(1), "parallel": {"pp": 2, "dp": 1,
                                  "data_parallel": "fsdp2"}}), 2)  # fmt: skip
    assert _named(layer_kernels(one).backward_weight, "grad_accumulate") == 0  # nothing sharded
    head = _named(head_kernels(plan).backward_weight, "grad_accumulate")
    assert head == pytest.approx(36 / 4 * MODEL["vocab_size"] * MODEL["hidden_size"])


def test_bf16_weights_drop_autocast_casts_and_copy_to_the_master_weights() -> None:
    autocast, bf16 = _plan(), _plan(mixed_precision="bf16_weights")
    params = layer_params_per_gpu(autocast.model, 1)
    assert weight_cast_bytes(autocast, params) == 12 * params
    assert weight_cast_bytes(bf16, params) == 0.0
    assert _named(layer_kernels(bf16).backward_weight, "grad_accumulate") == pytest.approx(
        6 * params * 3 / 4  # bf16 gradients: 3 x 2 bytes
    )
    total = stage_params_per_gpu(bf16, 0)
    assert master_copy_bytes(bf16, total) == 12 * total  # 2 + 4 in, 4 + 2 back
    assert master_copy_bytes(autocast, total) == 0.0
    assert launch_loop(autocast) == "eager" and launch_loop(bf16) == "eager/bf16_weights"


def test_the_dense_embedding_gradient_is_written_every_micro_batch() -> None:
    plan = _plan()
    table = embedding_params_per_gpu(plan.model, 1)
    kernels = embedding_kernels(plan).backward_weight
    assert _named(kernels, "embedding_grad_fill") == 4 * table  # fp32 under autocast
    bf16 = embedding_kernels(_plan(mixed_precision="bf16_weights")).backward_weight
    assert _named(bf16, "embedding_grad_fill") == 2 * table


def test_the_lm_head_weight_is_cast_by_autocast() -> None:
    plan = _plan()
    head = head_kernels(plan)
    vocab_h = MODEL["vocab_size"] * MODEL["hidden_size"]
    assert _named(head.forward, "lm_head_weight_cast") == 6 * vocab_h  # read 4, write 2
    assert _named(head.backward_weight, "lm_head_grad_cast") == 6 * vocab_h
    assert _named(head.backward_weight, "grad_accumulate") == pytest.approx(12 * vocab_h * 3 / 4)


def test_mixed_precision_belongs_to_torch_ddp_loops() -> None:
    with pytest.raises(ValueError, match="mixed_precision=bf16_weights describes a torch DDP"):
        _plan(parallel={"data_parallel": "fsdp"}, mixed_precision="bf16_weights")
    with pytest.raises(
        ValueError, match="mixed_precision='fp32' is not one of autocast, bf16_weights"
    ):
        _plan(mixed_precision="fp32")


def test_the_eager_torch_loss_upcasts_reads_three_times_and_casts_back() -> None:
    logits = 2 * MODEL["seq_len"] * MODEL["vocab_size"]
    head = head_kernels(_plan())
    forward = {k.name: (k.bytes / logits, k.memory_class) for k in head.forward if k.bytes}
    assert forward["logits_upcast"] == (6, "copy")  # read bf16, write fp32
    assert forward["cross_entropy"] == (16, "loss")  # max, sum-exp, output: 3 reads + 1 write
    backward = {k.name: (k.bytes / logits, k.memory_class) for k in head.backward_input}
    assert backward["cross_entropy_grad_fill"] == (4, "copy")
    assert backward["cross_entropy_backward"] == (16, "loss")
    assert backward["logits_grad_cast"] == (6, "copy")
    loss = ("logits_upcast", "cross_entropy", "cross_entropy_grad_fill",
            "cross_entropy_backward", "logits_grad_cast")  # fmt: skip
    assert sum({**forward, **backward}[name][0] for name in loss) == 48


_HEAD_WORK = ("final_norm", "final_norm_backward", "lm_head", "lm_head_dgrad", "lm_head_wgrad")


@pytest.mark.parametrize(
    ("fusion", "forward", "backward", "small", "peak"),
    [
        # unfused: upcast 2+4, max 4, shift 4+4, exp 4+4, sum 4, divide 4+4; scale 4+4, cast 4+2
        (None, 38, 14, (12, 6), 6),
        ("none", 38, 14, (12, 6), 6),
        # compiled: upcast+max 2+4, shift+exp+sum 4+4, divide 4+4; copy 4+4, scale+cast 4+4+2
        ("native", 22, 18, (3, 1), 10),
        # Triton: online softmax 2, gradient 2+4; scale 4+4, autograd's cast 4+2
        ("te", 8, 14, (4, 2), 6),
        # before 2.18: online softmax 2, gradient over the logits 2+2; scale 2+2
        ("te_inplace", 6, 4, (4, 2), 2),
    ],
)
def test_each_megatron_cross_entropy_moves_its_bytes_per_logit(
    fusion: str | None, forward: int, backward: int, small: tuple[int, int], peak: int
) -> None:
    training = {} if fusion is None else {"cross_entropy_fusion": fusion}
    raw = _raw(parallel={"data_parallel": "distributed_optimizer"}, **training)
    plan = resolve_plan(load_plan(raw), 1)
    logits = 2 * MODEL["seq_len"] * MODEL["vocab_size"]  # 32000 is Megatron-padded already
    head = head_kernels(plan)
    phases = (head.forward, head.backward_input)
    loss = [[k for k in phase if k.name not in _HEAD_WORK] for phase in phases]
    assert [sum(k.bytes for k in phase) / logits for phase in loss] == [forward, backward]
    assert all(k.kind == "memory" and k.memory_class in ("loss", "copy") for k in loss[0])
    assert tuple(sum(k.small_kernels for k in phase) for phase in loss) == small
    assert tuple(sum(k.extra_launches for k in phase) for phase in loss) == small
    assert memory_per_gpu(plan, hbm_bytes=80e9)["logits"] == peak * logits


def test_cross_entropy_fusion_is_megatron_s_and_implies_its_stack() -> None:
    implied = resolve_plan(load_plan(_raw(cross_entropy_fusion="native")), 1)
    assert kernel_stack(implied) == "megatron"
    assert "inferred from cross_entropy_fusion" in stack_source(implied)
    with pytest.raises(ValueError, match=r"cross_entropy_fusion needs training\.stack=megatron"):
        load_plan(_raw(stack="compile", cross_entropy_fusion="te"))
    with pytest.raises(ValueError, match=r"cross_entropy_fusion=.fused. is not one of none"):
        load_plan(_raw(stack="megatron", cross_entropy_fusion="fused"))


def test_a_compiled_loss_reads_the_bf16_logits_and_keeps_no_fp32_copy() -> None:
    eager = _plan(stack="compile", compile_loss=False)
    fused = _plan(stack="compile")
    logits = 2 * MODEL["seq_len"] * MODEL["vocab_size"]
    assert _named(head_kernels(eager).forward, "cross_entropy") == 16 * logits  # torch's eager
    assert _named(head_kernels(eager).forward, "logits_upcast") == 6 * logits
    assert _named(head_kernels(fused).forward, "cross_entropy") == 4 * logits
    assert _named(head_kernels(fused).forward, "logits_upcast") == 0
    assert _named(head_kernels(fused).backward_input, "cross_entropy_backward") == 4 * logits
    eager_mem = memory_per_gpu(eager, hbm_bytes=80e9)["logits"]
    fused_mem = memory_per_gpu(fused, hbm_bytes=80e9)["logits"]
    assert fused_mem == COMPILED_LOSS_LOGITS_BYTES_PER_ELEMENT * logits == 4 * logits
    assert eager_mem == 10 * logits
    with pytest.raises(ValueError, match=r"compile_loss needs training\.stack=compile"):
        _plan(stack="eager", compile_loss=True)


def test_fused_adam_launches_once_per_320_chunks_of_65536() -> None:
    assert optimizer_launches(0) == 0
    assert optimizer_launches(320 * 65536) == 1
    assert optimizer_launches(320 * 65536 + 1) == 2
    assert optimizer_launches(1.498e9) == math.ceil(1.498e9 / 20971520) == 72  # traced: 72


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        ("torch 1963fc8 (2024-12-23), torchtitan 9dec370 (2024-12-26)", False),
        ("torch 38410cf9 (2025-06-14), torchtitan 820504e", None),  # no date: the default
        ("torchtitan e7c0cae (2025-06-13)", None),
        ("torchtitan abc1234 (2024-11-30)", None),
    ],
)
def test_torchtitan_left_the_loss_uncompiled_between_two_commits(
    versions: str, expected: bool | None
) -> None:
    assert parse_compile_loss({"source": {"versions": versions}}) is expected


def test_the_cli_refuses_compile_loss_off_the_compile_stack(tmp_path: Any, capsys: Any) -> None:
    import yaml

    path = tmp_path / "plan.yaml"
    training = {"micro_batch_size": 1, "global_batch_size": 8, "compile_loss": True}
    raw = {"model": MODEL, "cluster": {"node": "dgx-h100", "num_nodes": 1}, "training": training}
    path.write_text(yaml.safe_dump(raw))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert "training.compile_loss needs training.stack=compile, got stack=None" in err
    assert "Traceback" not in err


def test_loss_parallel_holds_its_fp32_intermediates() -> None:
    """torch's loss_parallel (tensor parallel, uncompiled loss): 16 bytes per local logit at the
    backward's peak (saved log-probabilities, zeros, exp, their sum: 4 fp32 tensors)."""
    raw = _raw(parallel={"tp": 2, "data_parallel": "fsdp"}, stack="eager")
    raw["cluster"] = {"node": {"base": "dgx-h100", "num_gpus": 2}, "num_nodes": 1}
    plan = resolve_plan(load_plan(raw), 2)
    local_logits = 2 * MODEL["seq_len"] * MODEL["vocab_size"] / 2
    assert memory_per_gpu(plan, hbm_bytes=80e9)["logits"] == 16 * local_logits
    one = resolve_plan(load_plan({**raw, "parallel": {"data_parallel": "fsdp"}}), 2)
    assert memory_per_gpu(one, hbm_bytes=80e9)["logits"] == 12 * 2 * local_logits  # eager, tp 1


def test_without_loss_parallel_every_rank_holds_the_whole_vocabulary() -> None:
    raw = _raw(parallel={"tp": 2, "data_parallel": "fsdp"}, stack="eager", loss_parallel=False)
    raw["cluster"] = {"node": {"base": "dgx-h100", "num_gpus": 2}, "num_nodes": 1}
    plan = resolve_plan(load_plan(raw), 2)
    logits = 2 * MODEL["seq_len"] * MODEL["vocab_size"]  # not divided by tp
    assert memory_per_gpu(plan, hbm_bytes=80e9)["logits"] == 12 * logits  # the eager loss


_MODEL_KEYS = ("position_embedding", "num_kv_heads")


def _plan_with_model(**keys: Any) -> Any:
    """``_plan`` with some model keys changed (the rest are training keys)."""
    model = {k: v for k, v in keys.items() if k in _MODEL_KEYS}
    training = {k: v for k, v in keys.items() if k not in _MODEL_KEYS}
    raw = _raw(**training)
    raw["model"] = {**MODEL, **model}
    training_section = raw["training"]
    training_section.setdefault("mixed_precision", "autocast")
    return resolve_plan(load_plan(raw), 1)


def test_without_positions_no_rotary_runs_and_no_parameter_is_added() -> None:
    rope, nope = _plan(), _plan_with_model(position_embedding="none")
    tokens, q_kv = 2 * MODEL["seq_len"], MODEL["hidden_size"] * 2  # 16 heads of 64, MHA
    # eager rotary: 20 bytes per query and key element (docs: schedules.kernels.ELEMENTWISE_BYTES)
    rotary = elementwise_forward_bytes(rope) - elementwise_forward_bytes(nope)
    assert rotary == pytest.approx(ELEMENTWISE_BYTES["eager"]["rotary"] * tokens * q_kv)
    assert eager_rotary_launches(nope) == {"forward": 0.0, "backward": 0.0}
    assert layer_params_per_gpu(nope.model, 1) == layer_params_per_gpu(rope.model, 1)
    assert embedding_params_per_gpu(nope.model, 1) == embedding_params_per_gpu(rope.model, 1)


def test_grouped_heads_taken_by_the_attention_call_are_not_repeated() -> None:
    gqa = {"num_kv_heads": 4}  # 16 query heads of 64 over 4 K/V heads
    repeated = _plan_with_model(**gqa)
    grouped = _plan_with_model(repeat_kv=False, **gqa)
    tokens, h, kd = 2 * MODEL["seq_len"], MODEL["hidden_size"], MODEL["hidden_size"] // 4
    # repeat_kv reads K and V (kd each) and writes them h wide: 2 x 2 bytes x (kd + h) per token
    expand = elementwise_forward_bytes(repeated) - elementwise_forward_bytes(grouped)
    assert expand == pytest.approx(2 * 2 * tokens * (kd + h))
    assert eager_gqa_repeat_launches(grouped) == {"forward": 0.0, "backward": 0.0}
    assert eager_gqa_repeat_launches(repeated) == {"forward": 2.0, "backward": 2.0}
    # the bf16-weights loop keeps the repeated K and V for SDPA's backward: 2 (h - kd) x 2 bytes
    weights = {"mixed_precision": "bf16_weights"}
    repeated_bf16 = _plan_with_model(**weights, **gqa)
    grouped_bf16 = _plan_with_model(repeat_kv=False, **weights, **gqa)
    saved = eager_saved_bytes(repeated_bf16) - eager_saved_bytes(grouped_bf16)
    assert saved == pytest.approx(2 * (h - kd) * 2 * tokens)
    with pytest.raises(ValueError, match=r"repeat_kv=false needs training\.flash_attention"):
        load_plan(_raw(flash_attention=False, repeat_kv=False))
    # the other stacks price no repeat, with or without it
    compiled = {"stack": "compile", "num_kv_heads": 4}
    assert elementwise_forward_bytes(_plan_with_model(**compiled)) == pytest.approx(
        elementwise_forward_bytes(_plan_with_model(repeat_kv=False, **compiled))
    )
