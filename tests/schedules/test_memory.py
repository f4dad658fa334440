"""Memory per GPU: Adam's 16 bytes per parameter, sharded per data-parallel kind; activations."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schedules import memory
from schedules.arithmetic import (
    layer_activation_bytes,
    layer_params_per_gpu,
    logits_bytes,
    stage_params_per_gpu,
    total_params,
)
from schedules.plan import (
    ClusterConfig,
    ModelConfig,
    ParallelConfig,
    Plan,
    TrainingConfig,
)
from schedules.resolve import resolve_plan

SMALL = ModelConfig(
    name="small",
    num_layers=8,
    hidden_size=1024,
    num_heads=16,
    num_kv_heads=4,
    ffn_hidden_size=4096,
    vocab_size=32000,
    seq_len=2048,
)
GIB = 2**30
EAGER_EXTRA = 2 * (2 * (1024 - 256) + 4096) * 2048
"""What a layer of SMALL keeps on the eager stack beyond the fused count, one micro-batch of 2048
tokens, bf16: K and V repeated from 4 to 16 heads, and silu(gate)."""


def make_plan(
    world_size: int, *, global_batch_size: int = 64, precision: str = "bf16", **parallel: object
) -> Plan:
    """A resolved plan of the small model; a torch DDP one keeps bf16 weights with fp32 master
    copies (mixed-precision Adam: 2 + 2 + 12 bytes per parameter)."""
    ddp = parallel.get("data_parallel", "ddp") == "ddp"
    plan = Plan(
        model=SMALL,
        cluster=ClusterConfig(node="dgx-h100"),
        parallel=ParallelConfig(**parallel),  # type: ignore[arg-type]
        training=TrainingConfig(
            micro_batch_size=1,
            global_batch_size=global_batch_size,
            precision=precision,
            mixed_precision="bf16_weights" if ddp else None,
        ),
    )
    return resolve_plan(plan, world_size)


def state_bytes(plan: Plan) -> float:
    """Weights + gradients + optimizer state per GPU (stage 0)."""
    stage = memory.stage_memory_bytes(plan, 0, gpus_per_node=8)
    return stage["weights"] + stage["gradients"] + stage["optimizer"]


def test_adam_is_16_bytes_per_parameter_without_sharding() -> None:
    plan = make_plan(1)
    assert state_bytes(plan) == 16 * total_params(SMALL)


@pytest.mark.parametrize(
    ("kind", "bytes_per_param"),
    [
        ("ddp", 16.0),
        ("zero1", 2 + 2 + 12 / 8),
        ("zero2", 2 + (2 + 12) / 8),
        ("zero3", 16 / 8),
        ("fsdp", 16 / 8),
        ("distributed_optimizer", 2 + 4 + 12 / 8),  # Megatron docs: 6 + 12/d with fp32 grads
    ],
)
def test_sharding_per_data_parallel_kind(kind: str, bytes_per_param: float) -> None:
    plan = make_plan(8, data_parallel=kind)
    assert state_bytes(plan) == pytest.approx(bytes_per_param * total_params(SMALL))


def test_hsdp_shards_over_the_node_and_cp_counts_as_replica() -> None:
    hsdp = make_plan(32, data_parallel="hsdp")
    assert state_bytes(hsdp) == pytest.approx(16 / 8 * total_params(SMALL))
    explicit = make_plan(32, data_parallel="hsdp", hsdp_shard_size=4)
    assert state_bytes(explicit) == pytest.approx(16 / 4 * total_params(SMALL))
    with pytest.raises(ValueError, match="needs gpus_per_node"):
        memory.memory_per_gpu(hsdp, hbm_bytes=80 * GIB)
    zero3_cp = make_plan(8, cp=2, data_parallel="zero3")
    assert state_bytes(zero3_cp) == pytest.approx(16 / 8 * total_params(SMALL))


def test_activations_under_1f1b_gpipe_and_interleaved() -> None:
    per_layer = layer_activation_bytes(SMALL, 1, flash_attention=True) + EAGER_EXTRA
    one_f_one_b = make_plan(4, pp=4, global_batch_size=8)
    # Rank 0 holds min(p, m) = 4 micro-batches of its 2 layers.
    assert memory.activation_bytes(one_f_one_b, 0) == pytest.approx(4 * 2 * per_layer)
    assert memory.activation_bytes(one_f_one_b, 2) == pytest.approx(2 * 2 * per_layer)
    gpipe = make_plan(4, pp=4, schedule="gpipe", global_batch_size=8)
    assert memory.activation_bytes(gpipe, 0) == pytest.approx(8 * 2 * per_layer)
    interleaved = make_plan(4, pp=4, vpp=2, schedule="interleaved", global_batch_size=8)
    # 2(p-1) + (v-1)p + 1 = 11 chunks of 1 layer.
    assert memory.activation_bytes(interleaved, 0) == pytest.approx(11 * per_layer)


def test_last_stage_head_and_logits() -> None:
    plan = make_plan(2, pp=2, global_batch_size=8)
    tokens_h = 2048 * 1024
    head = 2 * tokens_h + 2 * tokens_h  # final-norm input + LM-head input
    per_layer = layer_activation_bytes(SMALL, 1, flash_attention=True) + EAGER_EXTRA
    assert memory.activation_bytes(plan, 1) == pytest.approx(4 * per_layer + head)
    stage = memory.stage_memory_bytes(plan, 1)
    # eager backward: saved fp32 log-softmax, its dense fp32 gradient and the fp32 input
    # gradient: 12 bytes per element (fused stacks: 10, the bf16 logits + fp32 upcast + softmax)
    assert (
        stage["logits"] == logits_bytes(SMALL, 1, tp=1, cp=1, per_element=12) == 12 * 2048 * 32000
    )
    assert logits_bytes(SMALL, 1, tp=1, cp=1) == 10 * 2048 * 32000
    assert memory.stage_memory_bytes(plan, 0)["logits"] == 0.0


def test_buffers_per_data_parallel_kind() -> None:
    ddp = make_plan(8)
    assert memory.transient_buffer_bytes(ddp, 0) == 2 * stage_params_per_gpu(ddp, 0)
    view = make_plan(8, ddp_gradient_as_bucket_view=True)
    assert memory.transient_buffer_bytes(view, 0) == 0.0
    fsdp = make_plan(8, data_parallel="fsdp")
    layer = layer_params_per_gpu(SMALL, 1)
    assert memory.transient_buffer_bytes(fsdp, 0) == 2 * layer * 2 + layer * 2
    zero2 = make_plan(8, data_parallel="zero2", zero_overlap_comm=True)
    assert memory.transient_buffer_bytes(zero2, 0) == 2 * 500_000_000 * 2
    megatron = make_plan(8, data_parallel="distributed_optimizer")
    assert memory.transient_buffer_bytes(megatron, 0) == 0.0


def test_total_is_the_sum_and_worst_stage_wins() -> None:
    plan = make_plan(4, pp=4, global_batch_size=8)
    result = memory.memory_per_gpu(plan, hbm_bytes=80 * GIB)
    assert result["total"] == pytest.approx(sum(result[k] for k in memory.COMPONENTS))
    totals = [memory.stage_memory_bytes(plan, s)["total"] for s in range(4)]
    assert result["total"] == max(totals)


def test_fits_in_memory_is_a_result_not_an_error() -> None:
    big = dataclasses.replace(SMALL, num_layers=80, hidden_size=8192, num_heads=64, num_kv_heads=8)
    plan = Plan(
        model=big,
        cluster=ClusterConfig(node="dgx-h100"),
        parallel=ParallelConfig(),
        training=TrainingConfig(micro_batch_size=1, global_batch_size=8),
    )
    resolved = resolve_plan(plan, 8)
    assert not memory.fits_in_memory(resolved, hbm_bytes=80 * GIB)
    assert memory.fits_in_memory(make_plan(8, data_parallel="fsdp"), hbm_bytes=80 * GIB)
    with pytest.raises(ValueError, match="hbm_bytes must be > 0"):
        memory.memory_per_gpu(resolved, hbm_bytes=0)


@settings(max_examples=40, deadline=None)
@given(
    tp=st.sampled_from([1, 2, 4]),
    pp=st.sampled_from([1, 2, 4]),
    dp=st.sampled_from([1, 2, 8]),
    recompute=st.sampled_from(["none", "selective", "full"]),
)
def test_more_sharding_never_needs_more_state(tp: int, pp: int, dp: int, recompute: str) -> None:
    def state(kind: str) -> float:
        plan = make_plan(tp * pp * dp, tp=tp, pp=pp, data_parallel=kind, recompute=recompute)
        return state_bytes(plan)

    ddp, zero1 = state("ddp"), state("zero1")
    assert ddp >= zero1 > 0
    if pp > 1:  # DeepSpeed refuses ZeRO-2/3 under pipelining
        with pytest.raises(ValueError, match="incompatible with pipeline parallelism"):
            state("zero2")
        return
    zero2, zero3 = state("zero2"), state("zero3")
    assert zero1 >= zero2 >= zero3 > 0
    assert zero3 == pytest.approx(ddp / dp)


@settings(max_examples=40, deadline=None)
@given(tp=st.sampled_from([1, 2, 4, 8]), b=st.integers(1, 8), cp=st.sampled_from([1, 2, 4]))
def test_recompute_and_sequence_parallel_only_save_memory(tp: int, b: int, cp: int) -> None:
    def per_layer(recompute: str, sp: bool) -> float:
        return layer_activation_bytes(
            SMALL, b, tp=tp, cp=cp, sequence_parallel=sp, recompute=recompute
        )

    for sp in (False, True):
        assert per_layer("none", sp) >= per_layer("selective", sp) >= per_layer("full", sp) > 0
    for mode in ("none", "selective", "full"):
        assert per_layer(mode, True) <= per_layer(mode, False)


@pytest.mark.parametrize("reshard", [False, True])
def test_pipelined_fsdp_keeps_the_stage_unsharded_through_the_step(reshard: bool) -> None:
    plan = make_plan(8, pp=2, data_parallel="fsdp", fsdp_reshard_after_forward=reshard)
    layer, stage = layer_params_per_gpu(SMALL, 1), stage_params_per_gpu(plan, 0)
    result = memory.stage_memory_bytes(plan, 0)
    # bf16 parameters gathered once + gradients accumulated unsharded until REDUCE_GRAD, in
    # FSDP2's default reduce dtype (fp32); one unit's reduce-scatter input in fp32
    assert result["fsdp_unsharded"] == stage * (2 + 4)
    assert result["buffers"] == layer * 4
    assert result["weights"] == stage * 2 / 4  # dp = 8 / pp
    bf16 = make_plan(8, pp=2, data_parallel="fsdp", fsdp_reduce_dtype="bf16")
    assert memory.stage_memory_bytes(bf16, 0)["fsdp_unsharded"] == stage * (2 + 2)


def test_fsdp_without_pipelining_keeps_its_root_or_head_unit_unsharded() -> None:
    h, v = SMALL.hidden_size, SMALL.vocab_size
    layer = layer_params_per_gpu(SMALL, 1)
    fsdp1 = memory.stage_memory_bytes(make_plan(8, data_parallel="fsdp"), 0)
    root = 2 * v * h + h  # embedding, LM head, final norm: never resharded after forward
    assert fsdp1["fsdp_unsharded"] == root * (2 + 2)
    assert fsdp1["buffers"] == 2 * layer * 2 + layer * 2  # 2 gathered layers + 1 layer's grads
    fsdp2 = memory.stage_memory_bytes(make_plan(8, data_parallel="fsdp2"), 0)
    head = v * h + h  # [norm, output]: params + bf16 grads, then grads + their fp32 copy
    assert fsdp2["fsdp_unsharded"] == head * max(2 + 2, 2 + 4)
    assert fsdp2["buffers"] == 2 * layer * 2 + layer * (2 + 4)
    unlimited = make_plan(8, data_parallel="fsdp", fsdp_limit_all_gathers=False)
    assert memory.stage_memory_bytes(unlimited, 0)["buffers"] == 8 * layer * 2 + layer * 2
    zero3 = memory.stage_memory_bytes(make_plan(8, data_parallel="zero3"), 0)
    assert zero3["fsdp_unsharded"] == 0


def test_full_recompute_holds_one_layer_in_full_and_fp8_caches_weights() -> None:
    plan = make_plan(1, recompute="full", global_batch_size=1)
    inputs = layer_activation_bytes(SMALL, 1, recompute="full", flash_attention=True)
    whole = layer_activation_bytes(SMALL, 1, recompute="none", flash_attention=True)
    head = 2 * 2048 * 1024 * 2  # final-norm input + LM-head input
    # the layer being recomputed keeps everything, the eager stack's extra tensors included
    assert memory.activation_bytes(plan, 0) == pytest.approx(
        8 * inputs + whole + EAGER_EXTRA + head
    )
    assert memory.stage_memory_bytes(plan, 0)["fp8_weights"] == 0
    fp8 = make_plan(1, precision="fp8", global_batch_size=1)
    assert (
        memory.stage_memory_bytes(fp8, 0)["fp8_weights"] == 8 * layer_params_per_gpu(SMALL, 1) * 2
    )


def test_per_op_recompute_saves_every_other_matmul_output_of_llama3_8b() -> None:
    """torchtitan's per-op policy on Llama 3 8B (h 4096, kv 1024, f 14336, 32 heads), TP 1:
    per token it keeps the block input (4096), wq, wv, w1 and w2 outputs (4096 + 1024 + 14336 +
    4096), the attention output (4096) and the fp32 log-sum-exp (32 heads x 4 bytes), all bf16
    but the last; it reruns wk, wo and w3: 2 x 4096 x (1024 + 4096 + 14336) FLOPs per token."""
    from schedules.flops import recompute_flops
    from schedules.model_presets import resolve_model_preset
    from schedules.plan import ModelConfig

    model = ModelConfig(**resolve_model_preset("llama3-8b"))
    tokens = model.seq_len
    saved = layer_activation_bytes(model, 1, recompute="op", flash_attention=True)
    assert saved == 2 * tokens * (4096 + 4096 + 1024 + 14336 + 4096 + 4096) + 4 * 32 * tokens
    assert recompute_flops(model, 1, recompute="op", causal=True) == 2 * tokens * 4096 * (
        1024 + 4096 + 14336
    )
    for sp in (False, True):
        per_layer = {
            mode: layer_activation_bytes(
                model, 1, tp=8, sequence_parallel=sp, recompute=mode, flash_attention=True
            )
            for mode in ("none", "selective", "op", "full")
        }
        assert per_layer["selective"] > per_layer["op"] > per_layer["full"]
    plain = dataclasses.replace(model, mlp_activation="gelu")  # w2 is not rerun: early stop
    assert recompute_flops(plain, 1, recompute="op", causal=True) == 2 * tokens * 4096 * (
        1024 + 4096
    )


def test_the_eager_stack_keeps_repeated_kv_the_output_copy_and_the_activation() -> None:
    """Per layer and micro-batch, bf16 elements per token: 2 (h - kd) repeated K/V, h more for
    the attention output under commbench's rotary (rope under autocast), f for silu(gate);
    selective recompute keeps the last only, full and per-op none; inside the TP region and
    per CP shard; none compiled or on Megatron; an MoE layer's routed and shared experts."""
    plan = make_plan(1, global_batch_size=1)
    assert memory.eager_saved_bytes(plan) == EAGER_EXTRA
    autocast = dataclasses.replace(
        plan, training=dataclasses.replace(plan.training, mixed_precision="autocast")
    )
    # commbench's model (one QKV projection split into views, rope writing new Q and K in
    # heads-first order): 3h - 2kd = 2 (h - kd) + the output's copy h
    assert memory.eager_saved_bytes(autocast) == 2 * (2 * 768 + 1024 + 4096) * 2048

    def autocast_with(**model: object) -> Plan:
        return dataclasses.replace(autocast, model=dataclasses.replace(SMALL, **model))

    mha = autocast_with(num_kv_heads=16)  # V's view keeps the QKV output: 2h + kd = 3h
    assert memory.eager_saved_bytes(mha) == 2 * (3 * 1024 + 4096) * 2048
    learned = autocast_with(position_embedding="learned")  # Q's view keeps it: 2h
    assert memory.eager_saved_bytes(learned) == 2 * (2 * 1024 + 4096) * 2048
    plain = autocast_with(position_embedding="learned", num_kv_heads=16)  # views only: 0
    assert memory.eager_saved_bytes(plain) == 2 * 4096 * 2048
    checkpointed = dataclasses.replace(
        autocast, parallel=dataclasses.replace(autocast.parallel, recompute="selective")
    )  # the checkpoint holds the new Q and K and V's view: h + kd, and silu(gate)
    assert memory.eager_saved_bytes(checkpointed) == 2 * (1024 + 256 + 4096) * 2048
    selective = make_plan(1, recompute="selective", global_batch_size=1)
    assert memory.eager_saved_bytes(selective) == 2 * 4096 * 2048
    for mode in ("full", "op"):
        assert memory.eager_saved_bytes(make_plan(1, recompute=mode, global_batch_size=1)) == 0
    assert memory.eager_saved_bytes(selective, recompute="none") == EAGER_EXTRA
    sharded = make_plan(8, tp=4, cp=2, global_batch_size=1)
    assert memory.eager_saved_bytes(sharded) == pytest.approx(EAGER_EXTRA / 4 / 2)
    gpt = dataclasses.replace(SMALL, num_kv_heads=16, gated_mlp=False, position_embedding="learned")
    assert memory.eager_saved_bytes(dataclasses.replace(autocast, model=gpt)) == 0.0
    for stack in ("compile", "megatron"):
        other = dataclasses.replace(plan, training=dataclasses.replace(plan.training, stack=stack))
        assert memory.eager_saved_bytes(other) == 0.0
    moe = dataclasses.replace(SMALL, num_experts=8, moe_top_k=2, moe_ffn_hidden_size=1024)
    routed = memory.eager_saved_bytes(dataclasses.replace(plan, model=moe), moe_layer=True)
    assert routed == 2 * (2 * 768 * 2048 + 2 * 2048 * 1024)  # two expert copies per token
    shared = dataclasses.replace(moe, moe_shared_expert_ffn_hidden_size=512)
    both = memory.eager_saved_bytes(dataclasses.replace(plan, model=shared), moe_layer=True)
    assert both == routed + 2 * 2048 * 512  # and every token's shared expert
    none = memory.activation_bytes(plan, 0)
    fused = layer_activation_bytes(SMALL, 1, flash_attention=True, recompute="none")
    kept = layer_activation_bytes(SMALL, 1, flash_attention=True, recompute="selective")
    assert none - memory.activation_bytes(selective, 0) == pytest.approx(
        8 * (fused + EAGER_EXTRA - kept - 2 * 4096 * 2048)
    )


def _saved_bytes_of_one_layer(raw_model: dict, recompute: str) -> tuple[float, float]:
    """(bytes autograd saves for one layer of ``commbench --step``'s model under CPU autocast,
    counted with saved-tensor hooks; ``memory.eager_saved_bytes`` of the same plan)."""
    import warnings

    import torch

    from comm_bench.step_model import build_model
    from schedules.plan import load_plan
    from schedules.resolve import resolve_plan

    raw = {
        "model": {"name": "m", "num_layers": 1, "hidden_size": 256, "num_heads": 8,
                  "ffn_hidden_size": 512, "vocab_size": 128, "seq_len": 64, "norm": "layernorm",
                  **raw_model},
        "cluster": {"node": {"base": "dgx-h100", "num_gpus": 1}},
        "parallel": {"recompute": recompute},
        "training": {"micro_batch_size": 2, "global_batch_size": 2,
                     "mixed_precision": "autocast", "stack": "eager"},
    }  # fmt: skip
    plan = resolve_plan(load_plan(raw), 1)
    model = build_model(plan.model, num_layers=1, recompute=recompute)
    layer = model.layers[0]
    x = torch.randn(2, 64, 256, requires_grad=True)
    kept: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with (
            torch.autocast("cpu", torch.bfloat16),
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
        ):
            layer(x, model.get_buffer("cos"), model.get_buffer("sin"))
    skip = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    skip.add(x.untyped_storage().data_ptr())
    return sum(n for ptr, n in kept.items() if ptr not in skip), memory.eager_saved_bytes(plan)


@pytest.mark.parametrize("rope", [True, False])
@pytest.mark.parametrize("kv_heads", [8, 2])
@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_separate_projections_keep_what_the_loop_keeps(
    rope: bool, kv_heads: int, recompute: str
) -> None:
    """Against the fused model, what one layer of the loop with separate projections keeps more
    (or less), as saved-tensor hooks count it, is what ``eager_saved_bytes`` adds: under autocast
    each of the five linears reading a norm keeps its own bf16 copy of the input (three more
    than the fused two), and each view SDPA keeps keeps only its own projection's output."""
    model = {"num_kv_heads": kv_heads, "position_embedding": "rope" if rope else "learned"}
    fused, fused_modelled = _saved_bytes_of_one_layer(model, recompute)
    separate, separate_modelled = _saved_bytes_of_one_layer(
        {**model, "separate_projections": True}, recompute
    )
    assert separate - fused == separate_modelled - fused_modelled
    # by hand, per token (h = 256, kd = 32 x kv_heads; bf16): three more input copies, 3 x 512,
    # less the fused output the views kept beyond their own projections
    kd = 32 * kv_heads
    dropped = {  # elements per token the fused QKV output kept that the separate ones do not
        (True, 8, "none"): 256 + kd, (True, 2, "none"): 0, (False, 8, "none"): 0,
        (False, 2, "none"): 2 * kd, (True, 8, "selective"): 256 + kd,
        (True, 2, "selective"): 256 + kd, (False, 8, "selective"): 0, (False, 2, "selective"): 0,
    }[(rope, kv_heads, recompute)]  # fmt: skip
    assert (separate - fused) / 128 == 3 * 512 - 2 * dropped
