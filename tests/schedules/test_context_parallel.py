"""torch's ring attention on one GPU: its rounds, kernels and exchanges, hand-counted on a tiny
layer (h 8, 2 heads of 4, 1 KV head, s 16, b 1): E = b (s/cp) h elements per tensor, R = E/4."""

from __future__ import annotations

import re
from typing import Any

import pytest

from schedules.context_parallel import (
    AttentionCall,
    RingExchange,
    RingWork,
    ring_attention,
    ring_buffer_bytes,
)
from schedules.kernels import layer_kernels
from schedules.messages import cp_grad_message_bytes, cp_kv_message_bytes
from schedules.plan import Plan, load_plan
from schedules.resolve import resolve_plan

TINY = {
    "name": "tiny", "num_layers": 2, "hidden_size": 8, "num_heads": 2, "num_kv_heads": 1,
    "ffn_hidden_size": 16, "vocab_size": 32, "seq_len": 16,
}  # fmt: skip


def tiny_plan(cp: int, **parallel: Any) -> Plan:
    training = {"micro_batch_size": 1, "global_batch_size": 1}
    stack = parallel.pop("stack", None)
    if stack:
        training["stack"] = stack
    mapping = {
        "model": TINY,
        "cluster": {"node": "dgx-h100"},
        "parallel": {"cp": cp, "data_parallel": "fsdp2", **parallel},
        "training": training,
    }
    return resolve_plan(load_plan(mapping), cp)


def exchanges(steps: tuple[Any, ...]) -> list[tuple[str, str, float, bool]]:
    return [(s.name, s.op, s.size_bytes, s.overlap) for s in steps if isinstance(s, RingExchange)]


def calls(steps: tuple[Any, ...]) -> list[AttentionCall]:
    return [c for s in steps if isinstance(s, RingWork) for c in s.attention]


def test_cp2_runs_a_causal_round_then_a_half_block_round() -> None:
    ring = ring_attention(tiny_plan(2), "eager")
    # s/cp = 8 local queries; round 1 takes the first 4-token chunk of the visiting K/V
    half = [
        AttentionCall(seq_q=8, seq_kv=8, causal=True),
        AttentionCall(seq_q=8, seq_kv=4, causal=False),
    ]
    assert calls(ring.forward) == half
    assert calls(ring.backward) == half


def test_cp4_runs_one_kernel_per_round_with_the_flops_of_one_causal_call() -> None:
    plan = tiny_plan(4)
    kernels = layer_kernels(plan)
    forward = [k for k in kernels.forward if k.kind == "attention_forward"]
    backward = [k for k in kernels.backward_input if k.kind == "attention_backward"]
    assert [k.dims for k in forward] == [(4, 4), (4, 2), (4, 2), (4, 2)]
    assert len(backward) == 4
    # 4 b a (s/cp) s d / 2 = 4 * 2 * 4 * 16 * 4 / 2 = 1024, as the one causal s/cp x s call
    assert [k.flops for k in forward] == [256.0] * 4
    assert sum(k.flops for k in backward) == 2.5 * 1024


def test_forward_kernels_of_a_cp2_layer_in_order() -> None:
    names = [k.name for k in layer_kernels(tiny_plan(2)).forward]
    assert names == [
        "qkv", "proj", "fc1", "fc2",
        "cp_kv_contiguous", "cp_kv_cat", "attention", "cp_first_cast",
        "attention", "cp_merge", "cp_final_cast", "attention_layout", "elementwise",
    ]  # fmt: skip


def test_memory_passes_of_the_eager_ring() -> None:
    ring = ring_attention(tiny_plan(2), "eager")
    e, r = 8 * 8, 8 * 2  # E = 1 x 8 tokens x 8; R = 8 tokens x 2 heads
    forward = {
        name: size for s in ring.forward if isinstance(s, RingWork) for name, size in s.passes
    }
    assert forward == {
        "kv_contiguous": 8 * e, "kv_cat": 8 * e, "first_cast": 6 * e,
        "merge": 38 * e + 52 * r, "final_cast": 6 * e,
    }  # fmt: skip
    backward = [p for s in ring.backward if isinstance(s, RingWork) for p in s.passes]
    assert backward == [
        ("grad_zeros", 12 * e), ("kv_contiguous", 8 * e), ("kv_cat", 8 * e),
        ("first_accumulate", 46 * e), ("accumulate", 52 * e), ("final_cast", 18 * e),
    ]  # fmt: skip


def test_compile_fuses_the_merge() -> None:
    ring = ring_attention(tiny_plan(2, stack="compile"), "compile")
    passes = [p for s in ring.forward if isinstance(s, RingWork) for p in s.passes]
    assert passes == [("kv_cat", 8 * 64), ("merge", 10 * 64 + 12 * 16), ("final_cast", 6 * 64)]


def test_k_and_v_travel_expanded_to_every_head_and_their_gradients_in_fp32() -> None:
    model = tiny_plan(2).model
    assert cp_kv_message_bytes(model, 1, tp=1, cp=2) == 2 * 2 * 8 * 4  # kd = 4
    assert cp_kv_message_bytes(model, 1, tp=1, cp=2, repeat_kv=True) == 2 * 2 * 8 * 8  # 4E
    assert cp_grad_message_bytes(model, 1, tp=1, cp=2) == 2 * 4 * 8 * 8


def test_allgather_gathers_once_per_pass_and_dkv_moves_every_round() -> None:
    ring = ring_attention(tiny_plan(4), "eager")
    kv, dkv = 4 * 32, 8 * 32  # E = 4 tokens x 8
    assert exchanges(ring.forward) == [("kv all_gather", "all_gather", 4 * kv, True)]
    assert exchanges(ring.backward) == [
        ("kv all_gather", "all_gather", 4 * kv, True),
        ("dkv send_recv 0", "send_recv", dkv, True),
        ("dkv send_recv 1", "send_recv", dkv, True),
        ("dkv send_recv 2", "send_recv", dkv, True),
        ("dkv send_recv 3", "send_recv", dkv, False),  # the layer's backward waits for the last
    ]


def test_alltoall_sends_the_next_block_before_each_round_but_the_last() -> None:
    ring = ring_attention(tiny_plan(4, cp_rotate_method="alltoall"), "eager")
    assert [s.name for s in ring.forward] == [
        "ring kv", "kv send_recv 1", "ring 0",
        "ring 1 kv", "kv send_recv 2", "ring 1",
        "ring 2 kv", "kv send_recv 3", "ring 2",
        "ring 3",
    ]  # fmt: skip
    assert {size for _, _, size, _ in exchanges(ring.forward)} == {4 * 32}
    sends = [name for name, *_ in exchanges(ring.backward)]
    assert sends == [
        "kv send_recv 1", "dkv send_recv 0", "kv send_recv 2", "dkv send_recv 1",
        "kv send_recv 3", "dkv send_recv 2", "dkv send_recv 3",
    ]  # fmt: skip


def test_ring_working_set() -> None:
    e, kv, dkv = 64, 256, 512
    assert ring_buffer_bytes(tiny_plan(2), "eager") == 2 * kv + 12 * e + 2 * dkv + 6 * e
    alltoall = tiny_plan(4, cp_rotate_method="alltoall")
    # alltoall keeps this block and the next instead of all four
    assert ring_buffer_bytes(alltoall, "eager") == 2 * 128 + 12 * 32 + 2 * 256 + 6 * 32
    assert ring_buffer_bytes(tiny_plan(2, stack="megatron"), "megatron") == 0.0


def test_megatron_keeps_one_fused_call_over_all_keys() -> None:
    kernels = layer_kernels(tiny_plan(2, stack="megatron"))
    attention = [k for k in kernels.forward if k.kind == "attention_forward"]
    assert [k.dims for k in attention] == [(8, 16)]


@pytest.mark.parametrize(
    ("parallel", "training", "message"),
    [
        ({"cp": 2, "cp_rotate_method": "alltoall"}, {"stack": "megatron"},
         "parallel.cp_rotate_method=alltoall applies to torch's context_parallel"),
        ({"cp": 1, "cp_rotate_method": "allgather"}, {},
         "parallel.cp_rotate_method=allgather applies to torch's context_parallel"),
        ({"cp": 2}, {"flash_attention": False},
         "training.flash_attention=false with cp=2: torch's context_parallel runs only"),
        ({"cp": 2}, {"repeat_kv": False},
         "training.repeat_kv=false with cp=2: torch's context-parallel ring is priced as"),
    ],
)  # fmt: skip
def test_bad_context_parallel_settings(
    parallel: dict[str, Any], training: dict[str, Any], message: str
) -> None:
    mapping = {
        "model": TINY,
        "cluster": {"node": "dgx-h100"},
        "parallel": parallel,
        "training": {"micro_batch_size": 1, "global_batch_size": 2, **training},
    }
    with pytest.raises(ValueError, match=re.escape(message)):
        resolve_plan(load_plan(mapping), 2)


def test_a_bad_rotate_method_lists_the_choices() -> None:
    mapping = {
        "model": TINY,
        "cluster": {"node": "dgx-h100"},
        "parallel": {"cp": 2, "cp_rotate_method": "ring"},
        "training": {"micro_batch_size": 1, "global_batch_size": 1},
    }
    with pytest.raises(
        ValueError,
        match=re.escape("parallel.cp_rotate_method='ring' is not one of allgather, alltoall"),
    ):
        load_plan(mapping)


def test_a_compiled_ring_waits_for_every_exchange_where_it_is_issued() -> None:
    """Traced functional collectives are waited for at once (torch's ``_maybe_wrap_tensor``),
    and Inductor keeps that order: no exchange of a compiled ring runs beside a round."""
    kv, dkv = 4 * 32, 8 * 32
    for method in ("allgather", "alltoall"):
        ring = ring_attention(tiny_plan(4, stack="compile", cp_rotate_method=method), "compile")
        assert [overlap for *_, overlap in exchanges(ring.forward)] == [False] * (
            1 if method == "allgather" else 3
        )
        assert not any(overlap for *_, overlap in exchanges(ring.backward))
    ring = ring_attention(tiny_plan(4, stack="compile"), "compile")
    assert exchanges(ring.forward) == [("kv all_gather", "all_gather", 4 * kv, False)]
    assert exchanges(ring.backward)[1] == ("dkv send_recv 0", "send_recv", dkv, False)


def test_a_compiled_allgather_ring_drops_the_later_rounds_concatenations() -> None:
    """After the one all-gather nothing reads a round's K/V concatenation: eager still runs
    it, the compiled graph drops it; with ``alltoall`` it is the buffer sent, so it stays."""

    def cats(stack: str, method: str = "allgather") -> tuple[int, int]:
        plan = tiny_plan(4, stack=stack, cp_rotate_method=method)
        ring = ring_attention(plan, stack)
        count = [
            sum(name == "kv_cat" for s in steps if isinstance(s, RingWork) for name, _ in s.passes)
            for steps in (ring.forward, ring.backward)
        ]
        return count[0], count[1]

    assert cats("eager") == (3, 3)  # before the gather, then rounds 1 and 2
    assert cats("compile") == (1, 1)  # the gathered one only
    assert cats("compile", "alltoall") == (3, 3)  # every sent block: "ring kv", rounds 1-2
