"""PyTorch's asynchronous TP as Inductor's micro-pipeline pass and symmetric memory run it: which
backward collectives are fused with a GEMM and which stay NCCL's, and the memory passes the fused
ops add, against hand counts."""

from __future__ import annotations

from typing import Any

import pytest

from schedules.actions import CommStep, ComputeStep
from schedules.kernels import ASYNC_TP_SHARD_COPIES, layer_kernels, torch_async_tp
from schedules.plan import load_plan
from schedules.resolve import resolve_plan
from schedules.tp_steps import LinearShares, tp_backward_steps

SHARES = LinearShares(qkv=0.2, k=0.05, proj=0.1, fc1=0.4, fc2=0.3, forward=(0.2, 0.1, 0.4, 0.3))


def _steps(**kw: Any) -> list[tuple[str, Any, bool]]:
    steps = tp_backward_steps(
        backward_input_s=3.0,
        backward_weight_s=2.0,
        num_layers=4,
        tp_bytes=100.0,
        gather_bytes=50.0,
        shares=SHARES,
        tp=8,
        sequence_parallel=True,
        torch_async=True,
        **kw,
    )
    out: list[tuple[str, Any, bool]] = []
    for s in steps:
        if isinstance(s, CommStep):
            out.append((s.name, (s.op, s.size_bytes, s.repeat), s.overlap))
        elif isinstance(s, ComputeStep):
            out.append((s.name, pytest.approx(s.duration_s), False))
    return out


def _gather(comm: str, gemm: str, width: float, size: float = 50.0) -> list[Any]:
    """A fused all-gather on TP 8, 4 layers: 7/8 of its GEMM beside it, the last piece after."""
    return [
        (comm, ("all_gather", size, 4), True),
        (gemm, width * 7 / 8, False),
        (f"{gemm} last piece", width / 8, False),
    ]


def _scatter(comm: str, gemm: str, width: float, size: float = 100.0) -> list[Any]:
    """A fused reduce-scatter on TP 8: its GEMM's first piece alone, the rest beside it."""
    return [
        (f"{gemm} first piece", width / 8, False),
        (comm, ("reduce_scatter", size, 4), True),
        (gemm, width * 7 / 8, False),
    ]


def test_backward_fuses_the_gradient_gathers_and_blocks_on_the_summed_scatters() -> None:
    """Per-op recompute of a gated layer, 4 layers, windows = share x wgrad time x 4: the input
    re-gathers beside the wk and w3 reruns, the projection's and MLP output's gradient gathers
    beside their dgrad GEMMs (each GEMM in 8 pieces, the last one after the last shard), the
    reduce-scatters of the summed input gradients (wq + wk + wv, w1 + w3) on the critical path."""
    assert _steps(recompute_s=1.0, regather=True) == [
        *_gather("AG input k", "gemm input k", 0.05 * 2.0 * 4),
        *_gather("AG input fc1", "gemm input fc1", 0.4 / 2 * 2.0 * 4),  # w3: half of the gate
        ("recompute", 1.0 * 4 - 0.4 - 1.6, False),
        *_gather("AG grad proj", "gemm grad proj", 0.1 * 2.0 * 4),
        *_gather("AG grad fc2", "gemm grad fc2", 0.3 * 2.0 * 4),
        ("bwd", (3.0 + 2.0) * 4 - 0.8 - 2.4, False),
        ("reduce_scatter dgrad", ("reduce_scatter", 100.0, 8), False),
    ]


def test_a_plain_mlp_fuses_its_scatter_and_blocks_on_its_regather() -> None:
    """Without a gate the MLP input gradient is one matmul (fused with its reduce-scatter) and
    per-op recompute reruns no matmul on the MLP input (its re-gather blocks)."""
    assert _steps(recompute_s=1.0, regather=True, gated_mlp=False) == [
        *_gather("AG input k", "gemm input k", 0.4),
        ("AG input fc1", ("all_gather", 50.0, 4), False),
        ("recompute", 4.0 - 0.4, False),
        *_gather("AG grad proj", "gemm grad proj", 0.8),
        *_gather("AG grad fc2", "gemm grad fc2", 2.4),
        *_scatter("RS dgrad fc1", "gemm dgrad fc1", 0.4 * 2.0 * 4),
        ("bwd", 20.0 - 0.8 - 2.4 - 3.2, False),
        ("reduce_scatter dgrad", ("reduce_scatter", 100.0, 4), False),
    ]


def test_attention_only_layers_and_unknown_windows_block() -> None:
    """An MoE layer's attention block alone (per_layer 1) with no GEMM windows: its one
    gradient all-gather and one reduce-scatter both block; the Bi pass has no weight gradient."""
    steps = tp_backward_steps(
        backward_input_s=3.0, backward_weight_s=2.0, num_layers=4, tp_bytes=100.0,
        shares=LinearShares(), tp=8, sequence_parallel=True, torch_async=True, per_layer=1,
        recompute_s=0.0, split="input",
    )  # fmt: skip
    assert [(s.name, getattr(s, "overlap", None)) for s in steps] == [
        ("AG grad proj", False),
        ("bwd", None),
        ("reduce_scatter dgrad", False),
    ]
    assert steps[1].duration_s == pytest.approx(3.0 * 4)  # type: ignore[union-attr]


def test_full_recompute_reruns_the_fused_forward() -> None:
    steps = _steps(recompute_s=1.0, full_recompute=True, regather=True)
    # the forward's four fused pairs (windows: forward shares x recompute time x 4 layers)
    assert steps[:12] == [
        *_gather("all_gather", "recompute fwd gemm 0", 0.2 * 4),
        *_scatter("reduce_scatter", "recompute fwd gemm 1", 0.1 * 4),
        *_gather("all_gather", "recompute fwd gemm 2", 0.4 * 4),
        *_scatter("reduce_scatter", "recompute fwd gemm 3", 0.3 * 4),
    ]
    assert not any(name.startswith("AG input") for name, _, _ in steps)  # the rerun gathers
    computed = sum(v.expected for _, v, overlap in steps if not isinstance(v, tuple))
    assert computed == pytest.approx((1.0 + 3.0 + 2.0) * 4)  # recompute + dgrad + wgrad


def _raw(batch: int, stack: str = "compile", parallel_block: bool = False, **parallel: Any) -> Any:
    return {
        "model": {"name": "m", "num_layers": 2, "hidden_size": 1024, "num_heads": 16,
                  "num_kv_heads": 8, "ffn_hidden_size": 4096, "vocab_size": 32000,
                  "seq_len": 2048, "parallel_block": parallel_block},
        "cluster": {"node": "dgx-h100", "num_nodes": 1},
        "parallel": {"tp": 4, "sequence_parallel": True, "tp_comm_overlap": True, **parallel},
        "training": {"micro_batch_size": batch, "global_batch_size": 2 * batch, "stack": stack},
    }  # fmt: skip


def _plan(batch: int, **parallel: Any) -> Any:
    return resolve_plan(load_plan(_raw(batch, **parallel)), 8)


def _copy(kernels: Any) -> float:
    return sum(k.bytes for k in kernels if k.name == "async_tp_copy")


@pytest.mark.parametrize("batch", [1, 2])
def test_fused_ops_copy_shards_and_reduce_partials(batch: int) -> None:
    """Whole activation S = 2 b s h bytes, t = 4. Forward per layer: 2 gathers x (1 or 2 shard
    copies, read + write, S/t each) + 2 scatters x (read S, write S/t) + with b > 1 the two
    scattered inputs (h and f wide) copied sequence-major. Backward: 2 gradient gathers whose
    gathered tensor the weight gradients read (returned: one shard copy more, into its slot, and
    with b > 1 the whole tensor copied once, read + write S) + 2 chunk + cat copies of the unfused
    reduce-scatters (read + write S); without recompute the forward's 2 gathered inputs are read
    by the weight gradients too: a slot copy and a whole copy each."""
    plan = _plan(batch)
    assert torch_async_tp(plan)
    whole, t, copies = 2.0 * batch * 2048 * 1024, 4, ASYNC_TP_SHARD_COPIES + (batch > 1)
    restride = 2 * whole * (1024 + 4096) / (1024 * t) if batch > 1 else 0.0
    forward = 2 * (2 * copies * whole / t + whole * (1 + 1 / t)) + restride
    kernels = layer_kernels(plan)
    assert _copy(kernels.forward) == pytest.approx(forward)
    # a gather whose tensor is read again: one shard copy more (its slot) and, with more than
    # one sequence (a strided view then), the whole tensor copied once
    relayout = 2 * whole if batch > 1 else 0.0
    returned = 2 * (copies + 1) * whole / t + relayout
    kept = 2 * whole / t + relayout  # the forward's gathered input, read by the weight grads
    assert _copy(kernels.backward_input) == pytest.approx(2 * returned + 2 * 2 * whole + 2 * kept)
    # per-op recompute: both re-gathers fused (wk, w3 rerun on them) and read by the weight
    # gradients of wq, wv and w1; the forward's gathered inputs are not kept
    rerun = layer_kernels(_plan(batch, recompute="op"))
    assert _copy(rerun.recompute) == pytest.approx(2 * returned)
    assert _copy(rerun.backward_input) == pytest.approx(2 * returned + 2 * 2 * whole)
    assert not torch_async_tp(_plan(batch, tp_comm_overlap=False))


def test_async_tp_needs_compile_and_refuses_a_parallel_block() -> None:
    with pytest.raises(ValueError, match="on stack eager is PyTorch's asynchronous TP"):
        resolve_plan(load_plan(_raw(1, stack="eager")), 8)
    with pytest.raises(ValueError, match=r"model\.parallel_block with parallel\.tp_comm_overlap"):
        resolve_plan(load_plan(_raw(1, parallel_block=True)), 8)


def test_moe_layers_block_under_async_tp() -> None:
    """An MoE layer's GEMM windows are not a dense layer's: its TP collectives block, forward,
    rerun and backward."""
    from schedules.actions import CommStep as Comm
    from sim.compute.compute_model import ComputeModel
    from sim.replay.recipes import layer_recipes, step_costs
    from topologies.hardware import GPUS

    raw = _raw(1, recompute="full")
    raw["model"].update(num_experts=4, moe_top_k=2)
    plan = resolve_plan(load_plan(raw), 8)
    recipes = layer_recipes(plan, step_costs(plan, ComputeModel(GPUS["h100-sxm"])), 2, 2)
    tp = [
        s for phase in ("F", "B") for s in recipes[phase] if isinstance(s, Comm) and s.group == "tp"
    ]
    assert tp and not any(s.overlap for s in tp)


def test_pytorch_full_recompute_leaves_out_the_mlp_output_pair() -> None:
    """PyTorch's checkpoint does not rerun the MLP output projection (compiled: its GEMM is not
    in the backward graph) nor its reduce-scatter: three fused pairs, their windows shares of
    the rerun without that GEMM (0.2 / 0.7 of a rerun of 1.0 s, x 4 layers)."""
    steps = _steps(recompute_s=1.0, full_recompute=True, rerun_tail=False)
    assert steps[:10] == [
        *_gather("all_gather", "recompute fwd gemm 0", 0.2 / 0.7 * 4),
        *_scatter("reduce_scatter", "recompute fwd gemm 1", 0.1 / 0.7 * 4),
        *_gather("all_gather", "recompute fwd gemm 2", 0.4 / 0.7 * 4),
        # the three windows fill the rerun: no rest, and the backward follows
        ("AG grad proj", ("all_gather", 50.0, 4), True),
    ]


def test_pytorch_full_recompute_kernels_and_collectives() -> None:
    """Full recompute of a TP 4 layer: Megatron reruns the whole forward; PyTorch eager reruns
    every GEMM but not the MLP output's reduce-scatter (its chunk + cat copy neither: 2 gathers
    and 1 scatter, read + write S each); compiled, not the MLP output's GEMM either."""
    whole = 2.0 * 1 * 2048 * 1024  # S: b s h bf16

    def rerun(stack: str, **parallel: Any) -> Any:
        raw = _raw(1, stack=stack, recompute="full", tp_comm_overlap=False, **parallel)
        plan = resolve_plan(load_plan(raw), 8)
        return layer_kernels(plan)

    megatron = rerun("megatron")
    assert megatron.recompute == megatron.forward
    eager = rerun("eager")
    assert [k.name for k in eager.recompute if k.kind == "gemm"] == ["qkv", "proj", "fc1", "fc2"]
    copies = [k for k in eager.recompute if k.name == "dtensor_sequence_copy"]
    assert sum(k.bytes for k in copies) == pytest.approx(2 * (2 + 1) * whole)
    compiled = rerun("compile")
    assert [k.name for k in compiled.recompute if k.kind == "gemm"] == ["qkv", "proj", "fc1"]
    steps = tp_backward_steps(
        backward_input_s=3.0, backward_weight_s=2.0, recompute_s=1.0, num_layers=4,
        tp_bytes=100.0, shares=SHARES, tp=4, sequence_parallel=True, full_recompute=True,
        dtensor=True, rerun_tail=False,
    )  # fmt: skip
    rerun_ops = [(s.op, s.repeat) for s in steps[1:3] if isinstance(s, CommStep)]
    assert rerun_ops == [("all_gather", 8), ("reduce_scatter", 4)]  # 2 + 1 per layer
