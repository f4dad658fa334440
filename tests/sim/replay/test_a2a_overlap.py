"""Megatron-Core's expert-parallel all-to-all overlap (``overlap_moe_expert_parallel_comm``):
the combined 1F1B orders, the combined pass's recipe, memory, refusals and the importer."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from schedules.actions import CommStep, ComputeStep, HostStep
from schedules.importers import from_megatron_args
from schedules.memory import _head_bytes, activation_bytes
from schedules.pipeline import max_in_flight, passes_per_kind
from schedules.pipeline_schedules.a2a_overlap import combined_1f1b, combined_in_flight_chunks
from schedules.pipeline_schedules.interleaved import interleaved
from schedules.plan import load_plan
from schedules.resolve import resolve_plan
from schedules.step import describe_step
from sim.compute.compute_model import ComputeModel
from sim.replay.combined import combined_recipe, split_at
from sim.replay.recipes import step_costs
from sim.replay.simulate import simulate_plan
from sim.replay.step_replay import _chunk_work
from topologies.hardware import GPUS

MOE = {
    "name": "moe", "num_layers": 4, "hidden_size": 4096, "num_heads": 32, "num_kv_heads": 8,
    "ffn_hidden_size": 14336, "vocab_size": 32000, "seq_len": 4096, "num_experts": 16,
    "moe_top_k": 4, "moe_ffn_hidden_size": 2048, "moe_first_dense_layers": 1,
}  # fmt: skip
"""One dense layer, then three MoE layers."""


def _dict(overlap: bool, **parallel: Any) -> dict[str, Any]:
    return {
        "model": MOE,
        "cluster": {"node": "dgx-h100", "num_nodes": 2},
        "parallel": {
            "ep": 16,
            "data_parallel": "distributed_optimizer",
            "overlap_moe_expert_parallel_comm": overlap,
            **parallel,
        },
        "training": {"micro_batch_size": 1, "global_batch_size": 64, "stack": "megatron"},
    }


def _plan(overlap: bool, **parallel: Any) -> Any:
    return resolve_plan(load_plan(_dict(overlap, **parallel)), 16)


def test_orders_without_pipelining() -> None:
    """The first forward alone, each backward with the next forward, the last backward alone
    (``combined_1f1b_schedule_for_no_pipelining``)."""
    assert [str(x) for x in combined_1f1b(1, 4, 1)[0]] == ["F0", "F1+B0", "F2+B1", "F3+B2", "B3"]
    assert [str(x) for x in combined_1f1b(1, 1, 1)[0]] == ["F0", "B0"]


def test_interleaved_orders_run_one_more_warmup_forward() -> None:
    """p = 2, m = 4, v = 2: Megatron's table (0,0) (1,0) (0,1) (1,1) (2,0) (3,0) (2,1) (3,1);
    rank 1 warms up 2 (p - r - 1) + (v - 1) p + 1 = 3 forwards, then F(k + 3) with B(k), the
    backward's chunk reversed."""
    rank1 = [str(x) for x in combined_1f1b(2, 4, 2)[1]]
    assert rank1 == [
        "F0", "F1", "F0.c1",
        "F1.c1+B0.c1", "F2+B1.c1", "F3+B0", "F2.c1+B1", "F3.c1+B2.c1",
        "B3.c1", "B2", "B3",
    ]  # fmt: skip
    for p, m, v in ((2, 4, 2), (4, 8, 2), (4, 16, 4), (2, 2, 3)):
        orders = combined_1f1b(p, m, v)
        plain = interleaved(p, m, v)
        for r, (order, base) in enumerate(zip(orders, plain, strict=True)):
            assert passes_per_kind(order) == passes_per_kind(base)
            expected = combined_in_flight_chunks(pp=p, vpp=v, stage=r, num_micro=m)
            assert max_in_flight(order) == expected == min(max_in_flight(base) + 1, m * v)


def test_memory_holds_one_more_layer() -> None:
    """The extra warmup forward's chunk is held as the first combined pass starts, which then
    frees the backward's layers as it adds the forward's: at its peak one layer more than the
    schedule it replaces (here 4 layers of one micro-batch, then 5)."""
    plain, overlapped = _plan(False), _plan(True)
    layers_plain = activation_bytes(plain, 0) - _head_bytes(plain, 0)
    layers_overlapped = activation_bytes(overlapped, 0) - _head_bytes(overlapped, 0)
    assert layers_overlapped == pytest.approx(layers_plain * 5 / 4)


def _compute_s(steps: tuple[Any, ...]) -> float:
    return sum(s.duration_s for s in steps if isinstance(s, ComputeStep))


def test_the_combined_pass_runs_both_passes_compute_and_overlaps_each_all_to_all() -> None:
    plan = _plan(True)
    costs = step_costs(plan, ComputeModel(GPUS["h100-sxm"]))
    step = describe_step(plan, gpus_per_node=8)
    chunk = step.stages[0].chunks[0]
    steps = combined_recipe(plan, costs, costs, chunk, chunk)
    work = _chunk_work(step, costs, chunk)
    assert _compute_s(steps) == pytest.approx(_compute_s(work.forward) + _compute_s(work.backward))
    a2a = [s for s in steps if isinstance(s, CommStep) and s.op == "all_to_all"]
    assert len(a2a) == 4 * 3 and all(s.overlap for s in a2a)  # 3 MoE layers, 2 each way
    # pairs: forward layer i with the backward's i-th from the end (Megatron's layer order)
    kinds = [
        ("C:" if isinstance(s, CommStep) else "H:" if isinstance(s, HostStep) else "P:") + s.name
        for s in steps
    ]
    first = kinds.index("C:moe combine bwd")
    assert kinds[first - 1 : first + 16] == [
        "P:b head bwd",
        # the forward's dense layer 0 with the backward's MoE layer 3
        "C:moe combine bwd",  # beside the forward's attention
        "P:f attention",
        "P:b mlp",  # the backward's experts (after its combine)
        "C:moe dispatch bwd",  # beside the forward's dense MLP
        "P:f mlp",
        "P:b attention",
        # MoE layer 1 with MoE layer 2: every all-to-all beside the other pass's compute
        "C:moe combine bwd",
        "P:f attention",
        "C:moe counts all_gather",  # the dispatch's token counts (the host waits on them
        "C:moe dispatch",  # once the backward's experts are queued) ... beside those experts
        "P:b mlp",
        "C:moe dispatch bwd",  # beside the forward's experts
        "P:f mlp",
        "C:moe combine",  # beside the backward's attention
        "P:b attention",
        "C:moe combine bwd",
    ]


def test_split_at_keeps_time_and_launches() -> None:
    steps = (
        ComputeStep(name="a", duration_s=1.0, launch_s=0.1),
        CommStep(name="x", group="tp", op="all_gather", size_bytes=8.0),
        ComputeStep(name="b", duration_s=3.0, launch_s=0.3),
    )
    head, tail = split_at(steps, 2.0)
    assert _compute_s(head) == pytest.approx(2.0) and _compute_s(tail) == pytest.approx(2.0)
    assert [type(s).__name__ for s in head] == ["ComputeStep", "CommStep", "ComputeStep"]
    assert sum(s.launch_s for s in (*head, *tail) if isinstance(s, ComputeStep)) == (
        pytest.approx(0.4)
    )


def test_overlap_hides_all_to_all_time() -> None:
    plain = simulate_plan(load_plan(_dict(False)))
    overlapped = simulate_plan(load_plan(_dict(True)))
    ep_plain = plain.breakdown.exposed_comm_s["ep"]
    ep_overlapped = overlapped.breakdown.exposed_comm_s["ep"]
    assert ep_plain > 0 and ep_overlapped < 0.5 * ep_plain
    assert overlapped.step_time_s < plain.step_time_s
    assert overlapped.breakdown.overlap_slowdown_s > plain.breakdown.overlap_slowdown_s


def test_interleaved_pipeline_runs() -> None:
    over = {"pp": 2, "vpp": 2, "schedule": "interleaved", "ep": 8}
    plain = simulate_plan(load_plan(_dict(False, **over)))
    overlapped = simulate_plan(load_plan(_dict(True, **over)))
    assert overlapped.breakdown.exposed_comm_s["ep"] < plain.breakdown.exposed_comm_s["ep"]


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"pp": 2, "ep": 8}, "interleaved schedule"),
        ({"recompute": "full"}, "full"),
        ({"ep": 1}, "ep > 1"),
        ({"moe_token_dispatcher": "allgather"}, "alltoall"),
        ({"data_parallel": "fsdp2"}, "with data_parallel fsdp is not modelled"),
    ],
)
def test_refusals(over: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _plan(True, **over)


def test_refused_on_another_stack_and_with_two_prediction_depths() -> None:
    plan = _dict(True)
    plan["training"]["stack"] = "eager"
    with pytest.raises(ValueError, match="stack eager"):
        resolve_plan(load_plan(plan), 16)
    plan = _dict(True)
    plan["model"] = {**MOE, "mtp_num_layers": 2}
    with pytest.raises(ValueError, match="at most one"):
        resolve_plan(load_plan(plan), 16)


def test_megatron_importer_reads_the_flag(tmp_path: Path) -> None:
    args = tmp_path / "args.txt"
    args.write_text(
        "--num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 128 "
        "--max-position-embeddings 128 --micro-batch-size 1 --global-batch-size 8 "
        "--num-experts 8 --expert-model-parallel-size 4 --moe-token-dispatcher-type alltoall "
        "--overlap-moe-expert-parallel-comm --delay-wgrad-compute\n"
    )
    parallel = from_megatron_args(args).sections["parallel"]
    assert parallel["overlap_moe_expert_parallel_comm"] is parallel["delay_wgrad_compute"] is True


def _combined(plan: Any) -> tuple[Any, ...]:
    costs = step_costs(plan, ComputeModel(GPUS["h100-sxm"]))
    chunk = describe_step(plan, gpus_per_node=8).stages[0].chunks[0]
    return combined_recipe(plan, costs, costs, chunk, chunk)


def test_a_prediction_depth_pairs_as_one_more_layer() -> None:
    """Megatron builds the depth's schedule plan as a layer's: its all-to-alls are hidden too."""
    plan = load_plan(_dict(True))
    depth = resolve_plan(load_plan({**_dict(True), "model": {**MOE, "mtp_num_layers": 1}}), 16)
    steps = _combined(depth)
    a2a = [s for s in steps if isinstance(s, CommStep) and s.op == "all_to_all"]
    assert len(a2a) == 4 * 4 and all(s.overlap for s in a2a)  # 3 MoE layers + the depth's
    names = [s.name for s in steps if isinstance(s, ComputeStep)]
    # backward: the main head, then the depth's, before its layer (paired with the forward's
    # first layer), its projection with its attention; forward: its projection with its
    # attention in the last pair, its head after its layer, then the main head
    assert names[:5] == ["f embed", "b head bwd", "b head bwd", "f attention", "b mlp"]
    assert names[6] == "b mtp attention" and "f mtp attention" in names[-8:]
    assert names[-3:] == ["f head", "f head", "b embed bwd"]
    assert _compute_s(steps) > _compute_s(_combined(resolve_plan(plan, 16)))


def test_expert_tensor_parallel_collectives_stay() -> None:
    plan = _plan(True, tp=2, sequence_parallel=True, etp=2, ep=8)
    steps = _combined(plan)
    etp = [s.op for s in steps if isinstance(s, CommStep) and s.group == "etp"]
    assert etp == ["all_gather", "reduce_scatter"] * (2 * 3)  # each MoE layer, both passes


def test_delayed_weight_gradients_run_beside_the_dispatch_backward() -> None:
    """With ``delay_wgrad_compute`` the backward's expert half hands its input gradient to the
    dispatch's backward all-to-all first; its weight gradients join the forward's expert half,
    beside that all-to-all. The compute is the same."""
    plain, delayed = _plan(True), _plan(True, delay_wgrad_compute=True)
    steps, delayed_steps = _combined(plain), _combined(delayed)
    assert _compute_s(delayed_steps) == pytest.approx(_compute_s(steps))
    names = [s.name for s in delayed_steps]
    i = names.index("moe dispatch bwd", names.index("moe dispatch"))
    assert names[i + 1] == "b mlp dW, f mlp"
    costs = step_costs(delayed, ComputeModel(GPUS["h100-sxm"]))
    assert costs.moe_halves is not None
    _, experts = costs.moe_halves
    weight_share = experts.backward_weight_s / (experts.backward_s + experts.recompute_s)
    before = delayed_steps[i - 1]
    whole = next(
        s for s in steps[i - 1 : i + 1] if isinstance(s, ComputeStep) and s.name == "b mlp"
    )
    assert before.duration_s == pytest.approx(whole.duration_s * (1 - weight_share))
    with pytest.raises(ValueError, match="needs overlap_moe_expert_parallel_comm"):
        _plan(False, delay_wgrad_compute=True)
