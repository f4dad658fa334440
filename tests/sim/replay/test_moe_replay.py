"""MoE plans replayed: token dispatch per layer and pass, expert-TP gathers, expert gradients on
the expert-data-parallel group, and routing imbalance slowing the step."""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any

import pytest

from schedules.actions import Collective, Compute
from schedules.moe import dispatch_bytes
from schedules.moe_kernels import moe_layer_kernels
from schedules.params import moe_layer_params_per_gpu
from schedules.plan import load_plan, num_microbatches
from schedules.resolve import resolve_plan
from schedules.step import describe_step
from sim.compute.compute_model import SMALL_KERNEL_S, ComputeModel, launch_loop
from sim.replay.recipes import moe_shares, step_costs
from sim.replay.simulate import simulate_plan
from sim.replay.step_replay import build_programs
from topologies.hardware import GPUS

MODEL = {
    "name": "moe", "num_layers": 4, "hidden_size": 1024, "num_heads": 16, "num_kv_heads": 4,
    "ffn_hidden_size": 2816, "vocab_size": 32000, "seq_len": 1024, "num_experts": 8,
    "moe_top_k": 2, "moe_ffn_hidden_size": 1408,
}  # fmt: skip


def plan_of(parallel: dict[str, Any], **model: Any) -> Any:
    return load_plan(
        {
            "model": {**MODEL, **model},
            "cluster": {"node": "dgx-h100", "num_nodes": 2},
            "parallel": {"data_parallel": "distributed_optimizer", **parallel},
            "training": {"micro_batch_size": 1, "global_batch_size": 32},
        }
    )


def collectives(parallel: dict[str, Any], **model: Any) -> tuple[Any, list[Collective]]:
    plan = resolve_plan(plan_of(parallel, **model), 16)
    program = build_programs(describe_step(plan, gpus_per_node=8), ComputeModel(GPUS["h100-sxm"]))[
        0
    ]
    return plan, [a for a in program.actions if isinstance(a, Collective)]


def calls(actions: list[Collective], group: str, op: str) -> int:
    return sum(a.repeat for a in actions if a.group == group and a.op == op)


def test_each_moe_layer_dispatches_and_combines_in_forward_and_backward() -> None:
    plan, actions = collectives({"ep": 8})
    m = num_microbatches(plan)
    # 4 MoE layers x (dispatch + combine) x (forward + backward) per micro-batch
    assert calls(actions, "ep", "all_to_all") == 4 * 2 * 2 * m
    sizes = {a.size_bytes for a in actions if a.group == "ep"}
    # 1,024 tokens per GPU, top 2 of 8 experts, one per GPU: 2,048 copies on average, variance
    # 8 x 1024 x 2 x 1/8 x 7/8 x 6/7 = 1536; the busiest of 8 GPUs 1.4236 sigma above
    chance = 1 + 1.4236 * 1536**0.5 / 2048
    assert sizes == {dispatch_bytes(plan)}
    assert dispatch_bytes(plan) == pytest.approx(1024 * 2 * 1024 * 2.0 * chance, rel=1e-5)
    assert len(next(a for a in actions if a.group == "ep").ranks) == 8


def test_full_recompute_dispatches_again_in_the_backward() -> None:
    plan, actions = collectives({"ep": 8, "recompute": "full"})
    assert calls(actions, "ep", "all_to_all") == 4 * 2 * 3 * num_microbatches(plan)


def test_expert_tensor_parallel_gathers_the_dispatched_tokens() -> None:
    plan, actions = collectives({"ep": 4, "tp": 2, "sequence_parallel": True})
    m = num_microbatches(plan)
    assert calls(actions, "etp", "all_gather") == 4 * 2 * m
    assert calls(actions, "etp", "reduce_scatter") == 4 * 2 * m
    # without shared experts an MoE layer keeps only the attention's TP collectives: all-gathers
    # forward 1, backward 2 (output-gradient gather, QKV input re-gather) per layer, where a
    # dense layer has 2 + 4; plus the LM head's gather once per micro-batch
    assert calls(actions, "tp", "all_gather") == (4 * (1 + 2) + 1) * m
    gather = collectives({"ep": 4, "tp": 2, "sequence_parallel": True, "etp": 1})[1]
    assert calls(gather, "etp", "all_gather") == 0


def test_expert_gradients_reduce_on_the_expert_data_parallel_group() -> None:
    _, actions = collectives({"ep": 8})
    edp = [a for a in actions if a.group == "edp" and a.op == "reduce_scatter"]
    dp = [a for a in actions if a.group == "dp" and a.op == "reduce_scatter"]
    assert edp and dp
    assert len(edp[0].ranks) == 2 and len(dp[0].ranks) == 16
    expert_params = 4 * 8 / 8 * 3 * 1024 * 1408  # 4 layers, 1 expert per GPU, 3 matrices
    assert sum(a.size_bytes for a in edp) == pytest.approx(expert_params * 4)  # fp32 main grads


def test_imbalance_slows_the_step_and_shows_as_exposed_all_to_all() -> None:
    steps, exposed = [], []
    for imbalance in (1.0, 1.5, 2.0):
        result = simulate_plan(plan_of({"ep": 8}, moe_imbalance=imbalance))
        steps.append(result.step_time_s)
        exposed.append(result.breakdown.exposed_comm_s["ep"])
    assert steps[0] < steps[1] < steps[2]
    assert 0 < exposed[0] < exposed[1] < exposed[2]


def test_dense_layers_of_a_moe_model_do_not_dispatch() -> None:
    plan, actions = collectives({"ep": 8}, moe_first_dense_layers=1, moe_layer_freq=2)
    # layers 1 and 3 route
    assert calls(actions, "ep", "all_to_all") == 2 * 2 * 2 * num_microbatches(plan)
    assert Counter(a.group for a in actions)["ep"] > 0


def test_interleaved_chunks_hold_their_own_moe_layers() -> None:
    from schedules.params import stage_params_per_gpu
    from schedules.step import chunk_params

    parallel = {"ep": 4, "pp": 2, "vpp": 2, "schedule": "interleaved"}
    plan = resolve_plan(plan_of(parallel, moe_first_dense_layers=1, moe_layer_freq=2), 16)
    # virtual stages chunk * pp + rank hold layers 0, 1, 2, 3; MoE layers are 1 and 3
    sizes = [[chunk_params(plan, s, c) for c in range(2)] for s in range(2)]
    moe_extra = 8 / 4 * 3 * 1024 * 1408 + 8 * 1024 - 3 * 1024 * 2816  # experts + router - MLP
    assert sizes[1][0] - sizes[0][1] == pytest.approx(moe_extra)  # layer 1 (MoE) - layer 2
    for stage in range(2):
        assert sum(sizes[stage]) == pytest.approx(stage_params_per_gpu(plan, stage))


@pytest.mark.parametrize("shared_ffn", [0, 2816])
def test_moe_layer_tp_windows_are_its_attention_and_shared_expert_gemms(shared_ffn: int) -> None:
    # the windows a Megatron MoE layer's TP collectives run beside: the attention linears' time
    # (a dense layer's), the shared expert's (a dense MLP's by width), none for routed experts
    plan = resolve_plan(
        plan_of(
            {"tp": 2, "sequence_parallel": True, "ep": 4, "tp_comm_overlap": True},
            moe_shared_expert_ffn_hidden_size=shared_ffn,
        ),
        16,
    )
    costs = step_costs(plan, ComputeModel(GPUS["h100-sxm"]))
    assert costs.moe_layer is not None
    moe_wgrad, dense_wgrad = costs.moe_layer.backward_weight_s, costs.layer.backward_weight_s
    shares = moe_shares(plan, costs)
    for name in ("qkv", "proj"):
        window = getattr(shares, name) * moe_wgrad
        assert window == pytest.approx(getattr(costs.shares, name) * dense_wgrad)
    for name in ("fc1", "fc2"):
        window = getattr(shares, name) * moe_wgrad
        assert window == pytest.approx(
            getattr(costs.shares, name) * dense_wgrad * shared_ffn / 2816
        )
    assert shares.forward == ()


def _moe_kernels(parallel: dict[str, Any], **training: Any) -> Any:
    plan = load_plan(
        {
            "model": MODEL,
            "cluster": {"node": "dgx-h100", "num_nodes": 2},
            "parallel": parallel,
            "training": {"micro_batch_size": 1, "global_batch_size": 32, **training},
        }
    )
    return moe_layer_kernels(plan)


@pytest.mark.parametrize(
    ("fusion", "forward", "backward"),
    [
        # 1,024 tokens x top 2 x hidden 1,024 = 2 Mi copies, 1 Mi tokens:
        (False, 18 * 2**21 + 2 * 2**20, 18 * 2**21 + 12 * 2**20),  # gathers, sorts, atomics
        (True, 4 * 2**21 + 4 * 2**20, 4 * 2**21 + 4 * 2**20),  # Transformer Engine's fused
    ],
)
def test_megatron_moe_bytes_follow_its_fusion(
    fusion: bool, forward: float, backward: float
) -> None:
    kernels = _moe_kernels(
        {"ep": 8, "data_parallel": "distributed_optimizer", "moe_permute_fusion": fusion}
    )
    assert [k.bytes for k in kernels.forward if k.name == "permute"] == [forward]
    assert [k.bytes for k in kernels.backward_input if k.name == "permute_backward"] == [backward]


@pytest.mark.parametrize(("fusion", "forward", "backward"), [(False, 34, 14), (True, 16, 7)])
def test_megatron_router_runs_its_small_kernels(fusion: bool, forward: int, backward: int) -> None:
    kernels = _moe_kernels(
        {"ep": 8, "data_parallel": "distributed_optimizer", "moe_router_fusion": fusion}
    )
    router = next(k for k in kernels.forward if k.name == "router")
    dgrad = next(k for k in kernels.backward_input if k.name == "router_dgrad")
    assert (router.small_kernels, router.extra_launches) == (forward, forward)
    assert (dgrad.small_kernels, dgrad.extra_launches) == (backward, backward)
    gemm_s = ComputeModel(GPUS["h100-sxm"]).kernel_time_s(
        dataclasses.replace(router, small_kernels=0.0)
    )
    model = ComputeModel(GPUS["h100-sxm"])
    assert model.kernel_time_s(router) == pytest.approx(
        gemm_s + forward * SMALL_KERNEL_S * model.time_factor
    )


def test_pytorch_stacks_keep_the_plain_permutation_copies() -> None:
    kernels = _moe_kernels({"ep": 8, "data_parallel": "fsdp"}, stack="compile")
    names = {k.name for k in (*kernels.forward, *kernels.backward_input)}
    assert not {"permute", "permute_backward"} & names
    assert all(k.small_kernels == 0 for k in (*kernels.forward, *kernels.backward_input))


def test_megatron_allgather_dispatcher_keeps_the_plain_permutation_but_not_the_router() -> None:
    parallel = {
        "ep": 4,
        "tp": 2,
        "sequence_parallel": True,
        "data_parallel": "distributed_optimizer",
    }
    plain = _moe_kernels({**parallel, "moe_token_dispatcher": "allgather"})
    alltoall = _moe_kernels(parallel)
    assert not [k for k in plain.forward if k.name == "permute"]
    assert [k for k in alltoall.forward if k.name == "permute"]
    elementwise = {p: next(k.bytes for k in kernels.forward if k.name == "elementwise")
                   for p, kernels in (("plain", plain), ("alltoall", alltoall))}  # fmt: skip
    # the plain copies: 2 passes x read + write x 2 bytes x 512 tokens (1,024 over SP 2) x top 2
    # x 1,024 hidden
    assert elementwise["plain"] - elementwise["alltoall"] == pytest.approx(8 * 512 * 2 * 1024)
    assert next(k for k in plain.forward if k.name == "router").small_kernels == 34


@pytest.mark.parametrize(("recompute", "passes"), [("none", 1), ("full", 2)])
@pytest.mark.parametrize(("parallel", "group"), [({"ep": 8}, 8), ({"ep": 4, "tp": 2}, 4)])
def test_megatron_dispatch_gathers_counts_and_syncs_per_forward(
    recompute: str, passes: int, parallel: dict[str, Any], group: int
) -> None:
    sp = {"sequence_parallel": True} if parallel.get("tp", 1) > 1 else {}
    plan = resolve_plan(plan_of({**parallel, **sp, "etp": 1, "recompute": recompute}), 16)
    compute = ComputeModel(GPUS["h100-sxm"])
    program = build_programs(describe_step(plan, gpus_per_node=8), compute)[0]
    m = num_microbatches(plan)
    actions = [a for a in program.actions if isinstance(a, Collective)]
    # 4 MoE layers x every forward (the recomputed one too) x micro-batches: 8 experts' int64
    # counts from each GPU of expert-TP x EP (etp 1: the ep GPUs, whatever the TP)
    assert calls(actions, "tpep", "all_gather") == 4 * passes * m
    assert {a.size_bytes for a in actions if a.group == "tpep"} == {8 * 8 * group}
    syncs = [a for a in program.actions if isinstance(a, Compute) and a.stream == "host"]
    one = compute.host_s_per_launch * compute.launches_per_kernel("megatron")
    assert sum(a.duration_s for a in syncs) == pytest.approx(4 * passes * m * one)
    assert all(a.name.endswith("moe sync") for a in syncs)


def test_allgather_dispatcher_syncs_after_its_gather() -> None:
    plan = resolve_plan(
        plan_of({"ep": 4, "tp": 2, "sequence_parallel": True, "moe_token_dispatcher": "allgather"}),
        16,
    )
    program = build_programs(describe_step(plan, gpus_per_node=8), ComputeModel(GPUS["h100-sxm"]))[
        0
    ]
    actions = program.actions
    syncs = [i for i, a in enumerate(actions) if isinstance(a, Compute) and a.stream == "host"]
    assert len(syncs) == num_microbatches(plan)  # one host step per forward pass (4 layers)
    for i in syncs:  # after the pass's token gather, before its reduce-scatter
        gather = max(d for d in actions[i].deps if isinstance(actions[d], Collective))
        assert actions[gather].name.endswith("moe all_gather")
        scatter = next(a for a in actions[i:] if isinstance(a, Collective))
        assert scatter.name.endswith("moe reduce_scatter") and i in scatter.deps
    assert not [a for a in actions if isinstance(a, Collective) and "counts" in a.name]


def test_a_capacity_factor_runs_without_the_sync() -> None:
    plan = resolve_plan(plan_of({"ep": 8}, moe_capacity_factor=1.25), 16)
    program = build_programs(describe_step(plan, gpus_per_node=8), ComputeModel(GPUS["h100-sxm"]))[
        0
    ]
    assert not [a for a in program.actions if isinstance(a, Compute) and a.stream == "host"]
    assert not [a for a in program.actions if isinstance(a, Collective) and a.group == "tpep"]


@pytest.mark.parametrize("dispatcher", ["alltoall", "allgather"])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_moe_breakdown_adds_up_with_the_sync(dispatcher: str, recompute: str) -> None:
    parallel = {"ep": 8, "moe_token_dispatcher": dispatcher, "recompute": recompute}
    result = simulate_plan(plan_of(parallel))
    bd = result.breakdown
    total = bd.compute_s + bd.optimizer_s + bd.bubble_s + bd.host_s
    assert total + sum(bd.exposed_comm_s.values()) == pytest.approx(result.step_time_s)
    assert bd.host_s > 0  # the synchronisation's wait for the host's next launch
    if dispatcher == "alltoall":  # the counts gather is charged to its group, not to the host
        assert bd.exposed_comm_s.get("tpep", 0.0) > 0


@pytest.mark.parametrize(("ep", "syncs"), [(8, 1), (1, 0)])
def test_torchtitan_expert_parallelism_exchanges_counts_and_syncs(ep: int, syncs: int) -> None:
    plan = load_plan(
        {
            "model": MODEL,
            "cluster": {"node": "dgx-h100", "num_nodes": 2},
            "parallel": {"ep": ep, "data_parallel": "ddp"},
            "training": {"micro_batch_size": 1, "global_batch_size": 32, "stack": "compile"},
        }
    )
    compute = ComputeModel(GPUS["h100-sxm"])
    program = build_programs(describe_step(resolve_plan(plan, 16), gpus_per_node=8), compute)[0]
    m = num_microbatches(resolve_plan(plan, 16))
    counts = [a for a in program.actions if isinstance(a, Collective) and "counts" in a.name]
    # one float32 count per expert (8) to every EP peer, per MoE layer's forward (4 layers)
    assert sum(a.repeat for a in counts) == 4 * m * syncs
    assert {(a.group, a.op, a.size_bytes) for a in counts} == (
        {("ep", "all_to_all", 4 * 8)} if syncs else set()
    )
    hosts = [a for a in program.actions if isinstance(a, Compute) and a.stream == "host"]
    one = compute.host_s_per_launch * compute.launches_per_kernel(launch_loop(plan))
    assert sum(a.duration_s for a in hosts) == pytest.approx(4 * m * syncs * one)


@pytest.mark.parametrize(
    ("parallel", "model", "shown"),
    [
        ({"ep": 8, "moe_permute_fusion": True}, {},
         "alltoall dispatcher (permutation fused, router unfused, a host sync per layer's "
         "forward), dropless"),
        ({"ep": 4, "tp": 2, "sequence_parallel": True, "moe_token_dispatcher": "allgather"},
         {"moe_capacity_factor": 1.5},
         "allgather dispatcher (router unfused), capacity factor 1.5 (padded)"),
        ({"ep": 8, "data_parallel": "fsdp2"}, {},
         "ep=8 etp=1, tokens by all-to-all (a host sync per layer's forward), dropless"),
    ],
)  # fmt: skip
def test_report_names_the_moe_mechanisms_it_prices(
    parallel: dict[str, Any], model: dict[str, Any], shown: str
) -> None:
    from sim.output.report import experts_lines

    (line, _) = experts_lines(plan_of(parallel, **model))
    assert shown in line


def fsdp2_program(ep: int, **model: Any) -> tuple[Any, list[Any]]:
    plan = resolve_plan(
        load_plan(
            {
                "model": {**MODEL, **model},
                "cluster": {"node": "dgx-h100", "num_nodes": 2},
                "parallel": {"ep": ep, "data_parallel": "fsdp2"},
                "training": {"micro_batch_size": 1, "global_batch_size": 32, "stack": "compile"},
            }
        ),
        16,
    )
    compute = ComputeModel(GPUS["h100-sxm"])
    return plan, build_programs(describe_step(plan, gpus_per_node=8), compute)[0].actions


def test_fsdp2_gathers_and_reduces_routed_experts_over_their_own_group() -> None:
    """torchtitan's FSDP2 with EP 8 on 16 GPUs: each MoE layer's routed experts (its 1 of 8,
    3 x 1,024 x 1,408 parameters) are all-gathered over edp (2 GPUs) after the rest of the layer
    (over all 16), on the same stream, before forward and again before backward, and their fp32
    gradients reduce-scattered over edp after the rest's."""
    plan, actions = fsdp2_program(8)
    m = num_microbatches(plan)
    experts = 3 * 1024 * 1408
    edp = [a for a in actions if isinstance(a, Collective) and a.group == "edp"]
    assert {(a.op, a.size_bytes) for a in edp} == {
        ("all_gather", experts * 2),
        ("reduce_scatter", experts * 4),
    }
    assert sum(a.op == "all_gather" for a in edp) == 4 * 2 * m
    assert sum(a.op == "reduce_scatter" for a in edp) == 4 * m
    assert len(edp[0].ranks) == 2
    rest = moe_layer_params_per_gpu(plan.model, plan.parallel) - experts
    for action in actions:
        if isinstance(action, Collective) and action.group == "edp":
            (before,) = action.deps  # the rest of the same layer, on the same stream
            assert before == actions.index(action) - 1
            dense = actions[before]
            assert (dense.group, dense.op) == ("dp", action.op)
            assert dense.name == action.name.replace(" experts", "")
            per_param = 2 if action.op == "all_gather" else 4
            assert dense.size_bytes == pytest.approx(rest * per_param)
            assert len(dense.ranks) == 16


def test_fsdp2_without_expert_parallelism_gathers_each_moe_layer_whole() -> None:
    plan, actions = fsdp2_program(1)
    assert not [a for a in actions if isinstance(a, Collective) and a.group == "edp"]
    gathers = {a.size_bytes for a in actions if isinstance(a, Collective) and "AG L" in a.name}
    assert gathers == {moe_layer_params_per_gpu(plan.model, plan.parallel) * 2}


@pytest.mark.parametrize("ep", [8, 1])
def test_fsdp2_gathers_queue_on_one_stream_two_copy_outs_back(ep: int) -> None:
    """With or without EP (torchtitan's explicit prefetch changes only when the host issues an
    all-gather) a layer's all-gather waits for the copy-out two layers back, and under EP for
    the previous layer's expert all-gather on the same stream."""
    _, actions = fsdp2_program(ep)
    names = {a.name: i for i, a in enumerate(actions)}
    gather = actions[names["AG L3 mb0"]]
    assert names["copy-out L1 mb0"] in gather.deps
    assert names["copy-out L2 mb0"] not in gather.deps
    assert (names.get("AG L2 experts mb0") in gather.deps) == (ep > 1)


def test_fsdp2_moe_step_adds_up_and_folds_exactly() -> None:
    plan, _ = fsdp2_program(8)
    folded = simulate_plan(plan)
    unfolded = simulate_plan(plan, fold=False)
    assert folded.step_time_s == pytest.approx(unfolded.step_time_s, rel=1e-9)
    bd = folded.breakdown
    total = bd.compute_s + bd.optimizer_s + bd.bubble_s + bd.host_s
    assert total + sum(bd.exposed_comm_s.values()) == pytest.approx(folded.step_time_s)
    assert bd.host_s > 0  # torchtitan's token dispatch synchronises with the host


def test_fsdp2_prices_each_moe_layer_at_its_own_imbalance() -> None:
    """A what-if that makes layer 2 hot changes that layer's unit only: its token dispatch grows
    and the step with it; the same factor on every layer is the model-wide figure."""
    from schedules.whatif import parse_flags

    plan, _ = fsdp2_program(8, seq_len=8192)  # compute-bound: the host is not the pace
    compute = ComputeModel(GPUS["h100-sxm"])

    def dispatches(p: Any, layer: str) -> set[float]:
        program = build_programs(describe_step(p, gpus_per_node=8), compute)[0]
        return {
            a.size_bytes
            for a in program.actions
            if isinstance(a, Collective) and a.group == "ep" and f" {layer} " in f" {a.name} "
        }

    hot = dataclasses.replace(plan, whatif=parse_flags(["moe_imbalance=2:3.0"]))
    assert max(dispatches(hot, "L2")) > max(dispatches(plan, "L2"))
    assert dispatches(hot, "L1") == dispatches(plan, "L1")
    assert simulate_plan(hot).step_time_s > simulate_plan(plan).step_time_s
    every = ",".join(f"{layer}:1.5" for layer in range(4))
    per_layer = dataclasses.replace(plan, whatif=parse_flags([f"moe_imbalance={every}"]))
    wide = dataclasses.replace(plan, whatif=parse_flags(["moe_imbalance=1.5"]))
    assert simulate_plan(per_layer).step_time_s == pytest.approx(simulate_plan(wide).step_time_s)


def test_fsdp2_under_pipelining_gathers_every_moe_parameter_once_per_stage() -> None:
    """FSDP2 units inside torch.distributed.pipelining, the first layer dense: each stage's first
    forward gathers its whole share, the MoE units' rest over all 16 GPUs of the stage's group
    and their experts over edp, the root and the dense layer as before; the experts' gradients
    are reduce-scattered over edp once per step (REDUCE_GRAD)."""
    plan = resolve_plan(
        load_plan(
            {
                "model": {**MODEL, "moe_first_dense_layers": 1},
                "cluster": {"node": "dgx-h100", "num_nodes": 4},
                "parallel": {"pp": 2, "ep": 8, "data_parallel": "fsdp2"},
                "training": {"micro_batch_size": 1, "global_batch_size": 32, "stack": "compile"},
            }
        ),
        32,
    )
    step = describe_step(plan, gpus_per_node=8)
    compute = ComputeModel(GPUS["h100-sxm"])
    experts = 3 * 1024 * 1408
    for program in build_programs(step, compute, ranks=(0, 16)):
        stage = 0 if program.rank == 0 else 1
        gathers = [
            a for a in program.actions if isinstance(a, Collective) and a.op == "all_gather"
            and a.name.endswith(" F0")
        ]  # fmt: skip
        assert sum(a.size_bytes for a in gathers) == pytest.approx(step.stages[stage].params * 2)
        edp = [a for a in gathers if a.group == "edp"]
        assert {a.size_bytes for a in edp} == {experts * 2}
        assert len(edp) == step.stages[stage].chunks[0].num_moe_layers
        scatters = [
            a for a in program.actions
            if isinstance(a, Collective) and a.op == "reduce_scatter" and a.group == "edp"
        ]  # fmt: skip
        assert [a.size_bytes for a in scatters] == [experts * 4] * len(edp)
    folded = simulate_plan(plan)
    assert folded.step_time_s == pytest.approx(simulate_plan(plan, fold=False).step_time_s)


def test_fsdp2_under_pipelining_queues_expert_collectives_on_the_streams() -> None:
    """One all-gather stream and one reduce-scatter stream: each unit's collectives follow the
    previous unit's experts'; before the send (``fsdp_pp_reduce: before_send``) the compute
    stream waits for the previous FSDP group's reduce-scatter, an MoE unit's experts' last."""
    plan = resolve_plan(
        load_plan(
            {
                "model": MODEL,
                "cluster": {"node": "dgx-h100", "num_nodes": 4},
                "parallel": {"pp": 2, "ep": 8, "data_parallel": "fsdp2",
                             "fsdp_pp_reduce": "before_send"},
                "training": {"micro_batch_size": 1, "global_batch_size": 32, "stack": "compile"},
            }
        ),
        32,
    )  # fmt: skip
    compute = ComputeModel(GPUS["h100-sxm"])
    (program,) = build_programs(describe_step(plan, gpus_per_node=8), compute, ranks=(16,))
    actions = program.actions
    index = {a.name: i for i, a in enumerate(actions)}
    assert index["AG u0 experts F0"] in actions[index["AG u1 F0"]].deps
    assert index["RS u0 c0 experts"] in actions[index["RS u1 c0"]].deps
    assert actions[index["wait RS u0 c0"]].deps == (index["RS u0 c0 experts"],)
