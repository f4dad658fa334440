"""What-ifs: a straggler, a degraded or failed NIC, a second job, against hand calculations."""

from __future__ import annotations

import dataclasses
import json

import pytest

from schedules.plan import load_plan
from schedules.whatif import WhatIf, parse_flags, parse_whatif
from sim.network.comm_model import CommModel
from sim.replay.simulate import compare_whatif, plan_topology, simulate_plan
from sim.replay.whatif import degraded_topology

GPT_13B = {
    "name": "gpt-13b", "num_layers": 40, "hidden_size": 5120, "num_heads": 40,
    "ffn_hidden_size": 20480, "vocab_size": 51200, "seq_len": 2048, "gated_mlp": False,
    "tied_embeddings": True, "position_embedding": "learned", "norm": "layernorm",
    "linear_bias": True,
}  # fmt: skip


def _plan(nodes: int, *, tp: int, pp: int, global_batch: int, **whatif):
    """GPT 13B on ``nodes`` DGX A100 (HDR), DDP: a plan of 8 x ``nodes`` GPUs."""
    return load_plan(
        {
            "model": GPT_13B,
            "cluster": {"node": "dgx-a100", "num_nodes": nodes, "fabric": "ib-hdr"},
            "parallel": {"tp": tp, "pp": pp, "recompute": "full", "data_parallel": "ddp"},
            "training": {
                "micro_batch_size": 1,
                "global_batch_size": global_batch,
                "precision": "bf16",
                "stack": "megatron",
            },
            **({"whatif": whatif} if whatif else {}),
        }
    )


def _with(plan, *flags: str):
    return dataclasses.replace(plan, whatif=parse_flags(flags))


def test_a_straggler_delays_a_1024_gpu_step_by_its_extra_kernel_time() -> None:
    """Compute-bound (4 micro-batches per rank): every rank waits in the DP all-reduces for the
    straggler, so the step grows by its extra kernel time, slowdown x (its kernels, without the
    overlap slowdown), less at most the DP tail the others no longer queue behind."""
    plan = _plan(128, tp=8, pp=1, global_batch=4096)
    base = simulate_plan(plan)
    slow = simulate_plan(_with(plan, "slow_gpu=77:0.2"))
    b = base.breakdown
    kernels = b.compute_s - b.overlap_slowdown_s + b.optimizer_s
    delta = slow.step_time_s - base.step_time_s
    assert 0.2 * kernels - b.exposed_comm_s["dp"] <= delta <= 0.2 * kernels + 1e-9
    assert delta > 0.9 * 0.2 * kernels
    assert slow.num_simulated_ranks == 4  # the straggler's tp and dp classes, not 1,024 ranks
    assert slow.extra["whatif"]["singled_out_ranks"] == [77]


def test_a_nic_at_half_rate_stretches_its_groups_all_reduces_by_their_bandwidth_term() -> None:
    """Communication-bound (one micro-batch): the step ends with the DP all-reduce queue of the
    group of rank 77 (tp rank 5, one GPU per node), whose ring now moves at half the NIC rate.
    Hand calculation: each bucket takes its latency plus twice its bandwidth term, so the queue
    and the step grow by the sum of the closed-form differences, about the queue itself."""
    plan = _plan(128, tp=8, pp=1, global_batch=1024)
    half = _with(plan, "nic=77:0.5")
    base, slow = simulate_plan(plan), simulate_plan(half)
    group = tuple(range(5, 1024, 8))
    buckets = [s.size_bytes for s in base.spans if s.rank == 0 and s.stream == "dp"]
    topology = plan_topology(plan)
    normal = CommModel(__import__("simpy").Environment(), topology)
    degraded = CommModel(
        __import__("simpy").Environment(), degraded_topology(topology, half.whatif)
    )
    before = sum(normal.estimate_s("all_reduce", group, b) for b in buckets)
    after = sum(degraded.estimate_s("all_reduce", group, b) for b in buckets)
    largest = max(buckets)
    ratio = degraded.estimate_s("all_reduce", group, largest) / normal.estimate_s(
        "all_reduce", group, largest
    )
    assert 1.8 < ratio <= 2.0  # bandwidth-bound: twice the time, less the latency's share
    assert slow.step_time_s - base.step_time_s == pytest.approx(after - before, rel=0.01)


def test_a_failed_nic_shares_a_peers_and_a_second_job_everywhere_halves_every_nic() -> None:
    """A NIC down puts two GPUs on one NIC (half its rate each): the same step as the NIC at
    half rate. A second job taking half of every NIC leaves every rank alike (folded as usual)
    and halves every DP ring's rate: here, the same all-reduce queue growth as one slow NIC,
    since every DP group already waited for its slowest member."""
    plan = _plan(128, tp=8, pp=1, global_batch=1024)
    half = simulate_plan(_with(plan, "nic=77:0.5"))
    down = simulate_plan(_with(plan, "nic=77:down"))
    everywhere = simulate_plan(_with(plan, "second_job=0-127:0.5"))
    assert down.step_time_s == pytest.approx(half.step_time_s, rel=1e-6)
    assert down.extra["whatif"]["singled_out_ranks"] == [77, 78]
    assert everywhere.num_simulated_ranks == 1  # nothing singled out: one rank stands for all
    assert everywhere.step_time_s == pytest.approx(half.step_time_s, rel=0.01)


@pytest.mark.parametrize(
    "flag", ["slow_gpu=5:0.3", "nic=9:0.25", "nic=9:down", "slow_node=1:0.1", "second_job=0-1:0.5"]
)
def test_folding_by_classes_gives_the_step_of_every_rank_simulated(flag: str) -> None:
    plan = _with(_plan(4, tp=2, pp=2, global_batch=64), flag)
    folded = simulate_plan(plan)
    every = simulate_plan(plan, fold=False)
    assert folded.num_simulated_ranks < every.num_simulated_ranks == 32
    assert folded.step_time_s == pytest.approx(every.step_time_s, rel=1e-9)


def test_each_rank_is_compared_with_its_own_pipeline_stage() -> None:
    """With pipeline stages the plain step's ranks differ: a what-if that changes nothing
    (a NIC at its full rate) must report every rank unchanged, stage by stage."""
    plan = _with(_plan(4, tp=2, pp=2, global_batch=64), "nic=9:1.0")
    compared = compare_whatif(plan, simulate_plan(plan))
    assert compared["delta_s"] == 0.0
    for row in compared["changes_by_rank"].values():
        assert row["compute_s"] == row["optimizer_s"] == row["bubble_s"] == 0.0
        assert all(w == 0.0 for w in row["waits_s"].values())
    slow = _with(_plan(4, tp=2, pp=2, global_batch=64), "slow_gpu=5:0.2")
    rows = compare_whatif(slow, simulate_plan(slow))["changes_by_rank"]
    assert rows["5"]["compute_s"] > 0  # its own kernels, against its own stage's rank


def test_two_failed_nics_of_a_server_give_one_step_in_either_order() -> None:
    plan = _plan(4, tp=2, pp=2, global_batch=64)
    one = simulate_plan(_with(plan, "nic=2:down", "nic=1:down")).step_time_s
    other = simulate_plan(_with(plan, "nic=1:down", "nic=2:down")).step_time_s
    assert one == pytest.approx(other, rel=1e-12)
    every = [f"nic={r}:down" for r in range(8, 16)]
    with pytest.raises(ValueError, match="no working NIC left"):
        simulate_plan(_with(plan, *every))


def test_the_comparison_says_who_waited_for_whom() -> None:
    plan = _with(_plan(4, tp=8, pp=1, global_batch=128), "slow_gpu=3:0.5")
    result = simulate_plan(plan)
    compared = compare_whatif(plan, result)
    rows = compared["changes_by_rank"]
    assert rows["3"]["singled_out"] and rows["3"]["compute_s"] > 0
    bystander = next(r for r, row in rows.items() if not row["singled_out"])
    # rank 0 shares rank 3's TP group (tp ranks 0-7 on server 0): it waits there
    assert max(rows[bystander]["waits_s"], key=rows[bystander]["waits_s"].get) == "tp"
    assert compared["delta_s"] == pytest.approx(
        result.step_time_s - compared["without_step_time_s"]
    )
    json.dumps(compared)


def test_an_expert_imbalance_what_if_slows_an_moe_plan_as_the_models_own_imbalance() -> None:
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    plan = load_plan(root / "examples" / "mixtral-8x7b-ep8-64xh100.yaml")
    hot = simulate_plan(_with(plan, "moe_imbalance=2"))
    same = simulate_plan(
        dataclasses.replace(plan, model=dataclasses.replace(plan.model, moe_imbalance=2.0))
    )
    assert hot.step_time_s == pytest.approx(same.step_time_s, rel=1e-12)
    assert hot.step_time_s > simulate_plan(plan).step_time_s
    with pytest.raises(ValueError, match="the model has no experts"):
        simulate_plan(_with(_plan(1, tp=8, pp=1, global_batch=64), "moe_imbalance=2"))


def _two_leaves():
    """Two DGX H100 on a fat tree of radix-16 switches, NICs in order: server 0 on leaf0,
    server 1 on leaf1, eight spines between them."""
    from topologies.config import cluster_from_mapping

    fabric = {"base": "ib-ndr", "radix": 16, "rail_optimized": False}
    return cluster_from_mapping({"node": "dgx-h100", "num_nodes": 2, "fabric": fabric}, where="t")


def _flow_s(topology, op="send_recv", ranks=(0, 8), size=1 << 30) -> float:
    import simpy

    env = simpy.Environment()
    env.run(CommModel(env, topology, fidelity="flow").run(op, ranks, size))
    return env.now


def test_the_analytical_model_slows_the_groups_whose_rail_flows_cross_a_degraded_link() -> None:
    """Under the analytical model a group moves at its slowest rail flow (local GPU c of one
    server to local GPU c of the next): GPU 0 -> GPU 8 crosses leaf0 -> spine7, so at half that
    link's rate the pair's network rate halves (47 -> 23.5 GB/s) and down it is re-routed at the
    full rate; a pair whose routes avoid the link keeps it. A step whose data-parallel pairs are
    (c, 8 + c): the pairs crossing the link run as slowly as pair (0, 8) with GPU 0's NIC at half
    rate, so the step is the NIC what-if's, to the last digit; folded, it is the unfolded step."""
    from sim.network.algorithms import placement_of

    topology = _two_leaves()
    link = ("leaf0", "spine7")
    half = degraded_topology(topology, parse_flags(["link=leaf0-spine7:0.5"]))
    down = degraded_topology(topology, parse_flags(["link=leaf0-spine7:down"]))

    def rate(top, ranks) -> float:
        return placement_of(top, ranks).net_bandwidth_bytes_per_s

    assert rate(topology, [0, 8]) == pytest.approx(47e9)
    assert rate(half, [0, 8]) == pytest.approx(23.5e9)
    assert rate(down, [0, 8]) == pytest.approx(47e9)
    for c in range(8):
        crosses = any(
            e in (link, link[::-1]) for e in topology.path(c, 8 + c) + topology.path(8 + c, c)
        )
        assert rate(half, [c, 8 + c]) == pytest.approx(23.5e9 if crosses else 47e9), c
    assert rate(half, list(range(16))) == pytest.approx(23.5e9)  # its ring holds 0 -> 8

    plan = dataclasses.replace(_plan(2, tp=8, pp=1, global_batch=16), whatif=parse_flags([]))
    slow = simulate_plan(_with(plan, "link=leaf0-spine7:0.5"), topology=topology)
    nic = simulate_plan(_with(plan, "nic=0:0.5"), topology=topology)
    assert slow.step_time_s == pytest.approx(nic.step_time_s, rel=1e-12)
    assert slow.step_time_s > simulate_plan(plan, topology=topology).step_time_s
    unfolded = simulate_plan(_with(plan, "link=leaf0-spine7:0.5"), topology=topology, fold=False)
    assert slow.num_simulated_ranks < unfolded.num_simulated_ranks == 16
    assert slow.step_time_s == pytest.approx(unfolded.step_time_s, rel=1e-12)
    rerouted = simulate_plan(_with(plan, "link=leaf0-spine7:down"), topology=topology)
    assert rerouted.step_time_s == pytest.approx(
        simulate_plan(plan, topology=topology).step_time_s, rel=1e-12
    )


def test_a_link_what_if_folds_by_every_group_a_rank_talks_in() -> None:
    """Four servers, TP 2 and four pipeline stages: a rank's pipeline neighbours and tied
    embeddings cross servers, so its pipeline pairs' shares, not only its dp group's, decide its
    class; folded, the step is the unfolded one to the last digit for each of the fabric's
    leaf-spine links at half rate (before: 11 of 32 differed, one by 5%). With GPU 0's NIC at
    half rate too, a link its routes do not cross changes nothing: the NIC is counted once."""
    from topologies.config import cluster_from_mapping

    fabric = {"base": "ib-ndr", "radix": 16, "rail_optimized": False}
    topology = cluster_from_mapping(
        {"node": "dgx-h100", "num_nodes": 4, "fabric": fabric}, where="t"
    )
    plan = load_plan(
        {
            "model": {**GPT_13B, "num_layers": 8},
            "cluster": {"node": "dgx-h100", "num_nodes": 4, "fabric": "ib-ndr"},
            "parallel": {"recompute": "full", "data_parallel": "ddp", "tp": 2, "pp": 4},
            "training": {"micro_batch_size": 1, "global_batch_size": 16, "precision": "bf16",
                         "stack": "megatron"},
        }
    )  # fmt: skip
    links = [(u, v) for u, v in topology.graph.edges if u.startswith("leaf") and "spine" in v]
    plain = simulate_plan(plan, topology=topology).step_time_s
    changed = 0
    for u, v in links:
        flags = f"link={u}-{v}:0.5"
        folded = simulate_plan(_with(plan, flags), topology=topology)
        every = simulate_plan(_with(plan, flags), topology=topology, fold=False)
        assert folded.step_time_s == pytest.approx(every.step_time_s, rel=1e-12), flags
        changed += folded.step_time_s > plain
    assert changed > 0
    two = _two_leaves()
    base = dataclasses.replace(_plan(2, tp=8, pp=1, global_batch=16), whatif=parse_flags([]))
    nic = simulate_plan(_with(base, "nic=0:0.5"), topology=two).step_time_s
    both = simulate_plan(_with(base, "nic=0:0.5", "link=leaf0-spine5:0.5"), topology=two)
    routes = {e for c in range(8) for e in two.path(c, 8 + c) + two.path(8 + c, c)}
    assert not {("leaf0", "spine5"), ("spine5", "leaf0")} & routes
    assert both.step_time_s == pytest.approx(nic, rel=1e-12)


def test_a_switch_link_at_half_rate_halves_the_flows_through_it_and_down_reroutes() -> None:
    """GPU 0 -> GPU 8 crosses leaf0 -> spine7 -> leaf1 (a 47 GB/s path). That uplink at half its
    rate doubles the transfer's byte time (latency + S / 23.5 GB/s); down, the fabric routes
    through another spine at the full rate."""
    topology = _two_leaves()
    path = topology.path(0, 8)
    assert ("leaf0", "spine7") in path

    def byte_time(top) -> float:  # seconds per GiB: the latency cancels
        return _flow_s(top, size=2 << 30) - _flow_s(top, size=1 << 30)

    base = _flow_s(topology)
    assert byte_time(topology) == pytest.approx((1 << 30) / 47e9, rel=1e-6)
    half = degraded_topology(topology, parse_flags(["link=leaf0-spine7:0.5"]))
    assert byte_time(half) == pytest.approx(2 * byte_time(topology), rel=1e-9)
    down = degraded_topology(topology, parse_flags(["link=leaf0-spine7:down"]))
    assert ("leaf0", "spine7") not in down.path(0, 8)
    assert _flow_s(down) == pytest.approx(base, rel=1e-12)
    # the whole step; a link between leaves does not exist
    plan = dataclasses.replace(_plan(2, tp=8, pp=1, global_batch=16), whatif=parse_flags([]))
    with pytest.raises(ValueError, match="is not a switch of this cluster's fabric"):
        simulate_plan(_with(plan, "link=leaf0-spine99:0.5"), topology=topology, fidelity="flow")
    with pytest.raises(ValueError, match="leaf0-leaf1: those switches are not linked"):
        simulate_plan(_with(plan, "link=leaf0-leaf1:0.5"), topology=topology, fidelity="flow")
    slow = simulate_plan(_with(plan, "link=leaf0-spine7:0.5"), topology=topology, fidelity="flow")
    assert slow.num_simulated_ranks == 16  # a link's load is every rank's routes: none folded
    plain = simulate_plan(plan, topology=topology, fidelity="flow", fold=False)
    assert slow.step_time_s >= plain.step_time_s


@pytest.mark.parametrize(
    ("fabric", "nodes", "link"),
    [
        ({"radix": 16}, 2, "leaf0-spine7"),
        ({"radix": 16}, 2, "leaf1-spine0"),
        ({"radix": 8, "tiers": 3}, 4, "leaf0-pod0/agg0"),
        ({"radix": 8, "tiers": 3}, 4, "pod0/agg0-core0.0"),
        ({"radix": 8, "tiers": 3}, 4, "pod1/agg2-core2.1"),
    ],
)
def test_a_link_taken_down_leaves_every_route_and_none_through_it(fabric, nodes, link) -> None:
    from topologies.config import cluster_from_mapping

    spec = {"base": "ib-ndr", "rail_optimized": False, **fabric}
    topology = cluster_from_mapping(
        {"node": "dgx-h100", "num_nodes": nodes, "fabric": spec}, where="t"
    )
    down = degraded_topology(topology, parse_flags([f"link={link}:down"]))
    a, b = link.split("-")
    pairs = [(s, d) for s in range(down.num_gpus) for d in range(down.num_gpus) if s != d]
    routes = [down.path(s, d, key) for s, d in pairs for key in range(3)]  # every pair routes
    assert all(routes) and not any((a, b) in r or (b, a) in r for r in routes)
    # the intact fabric's routes are untouched where they did not cross the link
    kept = [topology.path(s, d, 0) for s in range(8) for d in range(8, 16)]
    assert [r for r in kept if (a, b) not in r and (b, a) not in r] == [
        down.path(s, d, 0)
        for s in range(8)
        for d in range(8, 16)
        if (a, b) not in topology.path(s, d, 0) and (b, a) not in topology.path(s, d, 0)
    ]


def _mixtral():
    from pathlib import Path

    return load_plan(
        Path(__file__).resolve().parents[3] / "examples" / "mixtral-8x7b-ep8-64xh100.yaml"
    )


def test_a_per_layer_expert_imbalance_slows_only_the_stage_that_holds_the_layer() -> None:
    """Mixtral 8x7B on 4 pipeline stages of 8 layers: the same factor on every layer is the
    model-wide what-if, to the last digit; a hot layer 3 (stage 0) adds to stage 0's kernels what
    that one layer's extra expert work costs (its forward and backward at 3x against 1x, times
    the micro-batches: linear in the factor, so the stage prices its eight layers at their mean),
    and the other stages only wait for it."""
    from schedules.plan import num_microbatches
    from schedules.resolve import resolve_plan
    from sim.compute.compute_model import ComputeModel

    plan = _mixtral()
    every = ",".join(f"{layer}:1.5" for layer in range(plan.model.num_layers))
    per_layer = simulate_plan(_with(plan, f"moe_imbalance={every}"))
    model_wide = simulate_plan(_with(plan, "moe_imbalance=1.5"))
    assert per_layer.step_time_s == model_wide.step_time_s
    assert per_layer.memory_gib == model_wide.memory_gib

    hot = _with(plan, "moe_imbalance=3:3.0")
    compared = compare_whatif(hot, simulate_plan(hot))
    rows = compared["changes_by_rank"]
    assert [rows[r]["compute_s"] for r in ("16", "32", "48")] == [0.0, 0.0, 0.0]
    assert compared["delta_s"] > 0
    topology = plan_topology(plan)
    resolved = resolve_plan(plan, topology.num_gpus)
    compute = ComputeModel(topology.gpu_spec(0))

    def layer_s(hottest: float) -> float:
        model = dataclasses.replace(resolved.model, moe_imbalance=hottest)
        t = compute.moe_layer_times(dataclasses.replace(resolved, model=model))
        return t.forward_s + t.recompute_s + t.backward_input_s + t.backward_weight_s

    expected = (layer_s(3.0) - layer_s(1.0)) * num_microbatches(resolved)
    assert rows["0"]["compute_s"] == pytest.approx(expected, rel=0.05)


def test_a_per_layer_imbalance_names_a_layer_that_is_not_an_moe_layer() -> None:
    with pytest.raises(ValueError, match="layer 40 is not an MoE layer of the model"):
        simulate_plan(_with(_mixtral(), "moe_imbalance=40:2"))
    with pytest.raises(ValueError, match=r"moe_imbalance\[3\]=9: at most the number of experts"):
        simulate_plan(_with(_mixtral(), "moe_imbalance=3:9"))
    with pytest.raises(ValueError, match="the model has no experts"):
        simulate_plan(_with(_plan(1, tp=8, pp=1, global_batch=64), "moe_imbalance=1:2"))


def test_the_plan_section_and_the_flags_read_alike() -> None:
    section = parse_whatif(
        {
            "slow_gpus": [{"rank": 5, "slowdown": 0.2}],
            "nics": [{"rank": 17, "fraction": 0}],
            "second_job": [{"nodes": [0, 1], "share": 0.3}],
            "slow_nodes": [{"node": 3, "slowdown": 0.1}],
            "links": [{"between": ["leaf0", "spine7"], "fraction": 0}],
            "moe_imbalance": 1.5,
        }
    )
    flags = parse_flags(
        [
            "slow_gpu=5:0.2",
            "slow_node=3:0.1",
            "nic=17:down",
            "second_job=0-1:0.3",
            "link=leaf0-spine7:down",
            "moe_imbalance=1.5",
        ]
    )
    assert section == flags
    assert parse_whatif(section.to_dict()) == section
    layers = parse_whatif({"moe_imbalance": {7: 1.5, 3: 2.0}})
    assert layers == parse_flags(["moe_imbalance=3:2,7:1.5"])
    assert layers.moe_layer_imbalance == ((3, 2.0), (7, 1.5))
    assert parse_whatif(json.loads(json.dumps(layers.to_dict()))) == layers  # string keys
    assert not WhatIf() and section


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"slow_gpus": [{"rank": 5, "slowdown": -0.2}]}, "slowdown must be in (0, 100]"),
        ({"slow_gpus": [{"rank": -1, "slowdown": 0.2}]}, "rank must be an integer >= 0"),
        ({"nics": [{"rank": 1, "fraction": 1.5}]}, "fraction must be in [0, 1]"),
        ({"second_job": [{"nodes": [], "share": 0.3}]}, "nodes must be a non-empty list"),
        ({"second_job": [{"nodes": [0], "share": 1}]}, "share must be in (0, 1)"),
        ({"stragglers": []}, "unknown key 'whatif.stragglers'"),
        ({"nics": [{"rank": 1}]}, "missing key fraction"),
        ({"moe_imbalance": 0.5}, "whatif.moe_imbalance must be a number >= 1"),
        ({"moe_imbalance": {}}, "a number or a non-empty mapping of layer: factor"),
        ({"links": [{"between": ["leaf0"], "fraction": 0.5}]}, "must name two different switches"),
        (
            {
                "links": [
                    {"between": ["leaf0", "spine7"], "fraction": 0},
                    {"between": ["spine7", "leaf0"], "fraction": 0.5},
                ]
            },
            "whatif link spine7-leaf0 given twice",
        ),
        ({"links": [{"between": ["a", "b"], "fraction": -1}]}, "fraction must be in [0, 1]"),
        ({"moe_imbalance": {"a": 2}}, "whatif.moe_imbalance.layer must be an integer >= 0"),
        ({"moe_imbalance": {3: 0.5}}, "whatif.moe_imbalance[3] must be a number >= 1"),
        (
            {"second_job": [{"nodes": [0], "share": 0.5, "busy": 0.3}]},
            "whatif.second_job[0].busy needs period_ms",
        ),
        (
            {"second_job": [{"nodes": [0], "share": 0.5, "period_ms": 0}]},
            "whatif.second_job[0].period_ms must be >= 0.001, got 0",
        ),
        (
            {"second_job": [{"nodes": [0], "share": 0.5, "period_ms": 100, "busy": 1.5}]},
            "whatif.second_job[0].busy must be in (0, 1]",
        ),
        (
            {"second_job": [{"nodes": [0], "share": 0.5, "period_ms": 100, "offset_ms": 100}]},
            "whatif.second_job[0].offset_ms must be in [0, period_ms), got 100",
        ),
        (
            {"second_job": [{"nodes": [0], "share": 0.5, "period": 100}]},
            "unknown key 'period'; keys: nodes, share, period_ms, busy, offset_ms",
        ),
    ],
)
def test_a_bad_whatif_names_the_key_and_value(raw, message) -> None:
    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        parse_whatif(raw)


@pytest.mark.parametrize(
    ("flag", "message", "nodes"),
    [
        ("slow_gpu=5000:0.2", "whatif rank 5000: the cluster has ranks 0..31", 4),
        ("slow_node=9:0.2", "whatif server 9: the cluster has servers 0..3", 4),
        ("nic=3:down", "this plan runs on one server", 1),
        ("second_job=0:0.5", "this plan runs on one server", 1),
    ],
)
def test_a_whatif_outside_the_cluster_is_refused(flag: str, message: str, nodes: int) -> None:
    with pytest.raises(ValueError, match=message):
        simulate_plan(_with(_plan(nodes, tp=8, pp=1, global_batch=128), flag))


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("second_job=5-2:0.3", "servers '5-2': give FIRST-LAST with FIRST <= LAST"),
        ("second_job=0-99999999999:0.3", "at most 65,536 servers"),
        ("moe_imbalance=abc", "must be a number >= 1 (1: balanced), got 'abc'"),
        ("slow_gpu=3", "expected slow_gpu=WHO:AMOUNT"),
        ("second_job=0-3:0.5:200", "expected second_job=NODES:SHARE, NODES:SHARE:PERIOD_MS"),
        ("second_job=0-3:0.5:0.0001:0.5", "period_ms must be >= 0.001, got 0.0001"),
        ("nic=3:up", "expected nic=RANK:FRACTION or nic=RANK:down (e.g. nic=17:0.5), got '3'"),
    ],
)
def test_a_bad_whatif_flag_names_itself(flag: str, message: str) -> None:
    with pytest.raises(ValueError, match=__import__("re").escape(message)):
        parse_flags([flag])


def test_a_bursty_second_job_reads_alike_from_the_plan_and_the_flags() -> None:
    section = parse_whatif(
        {"second_job": [{"nodes": [0, 1], "share": 0.5, "period_ms": 200, "busy": 0.3,
                         "offset_ms": 50}]}
    )  # fmt: skip
    assert section == parse_flags(["second_job=0-1:0.5:200:0.3:50"])
    assert parse_whatif(section.to_dict()) == section
    job = section.second_job[0]
    assert job.bursty and job.period_s == pytest.approx(0.2)
    # on from 50 to 110 ms of every 200 ms
    assert [job.on_at(t) for t in (0.0, 0.06, 0.109, 0.111, 0.26)] == [
        False, True, True, False, True
    ]  # fmt: skip
    assert job.next_change_s(0.0) == pytest.approx(0.05)
    assert job.next_change_s(0.06) == pytest.approx(0.11)
    assert job.next_change_s(0.2) == pytest.approx(0.25)
    assert "30% of every 200 ms from 50 ms" in section.describe()[0]


class _Paces:
    """Closed-form times by state: 1 s with the NICs free, 2 s while the job holds them."""

    def __call__(self, state: frozenset) -> object:
        return lambda op, ranks, size: 2.0 if state else 1.0


@pytest.mark.parametrize(
    ("start", "repeat", "expected"),
    [
        # from 0: on for 0.5 s at half pace (0.25 done), off 0.5 s (0.75), on: 0.25 more takes
        # 0.5 s -> 1.5 s
        (0.0, 1, 1.5),
        # from 0.5: off 0.5 s (0.5 done), on 0.5 s (0.75), off: 0.25 more -> 1.25 s
        (0.5, 1, 1.25),
        # ten calls from 0: 0.75 of a call per period, 13 periods (9.75), 0.25 more at half
        # pace -> 13.5 s
        (0.0, 10, 13.5),
    ],
)
def test_a_collective_advances_at_the_pace_of_each_burst(start, repeat, expected) -> None:
    import simpy

    from sim.replay.whatif import BurstyRunner

    env = simpy.Environment()
    env.run(until=start) if start else None
    job = parse_flags(["second_job=0:0.5:1000:0.5"]).second_job[0]
    runner = BurstyRunner(env, [job], _Paces())  # type: ignore[arg-type]
    assert runner.duration_s("all_reduce", (0, 8), 1.0, repeat) == pytest.approx(expected)


def test_a_burst_edge_in_floating_point_opens_the_right_phase() -> None:
    """A 700 ms period busy 10%: on from 700 to 770 ms. From 768.91 ms a call takes 1.09 ms
    at the busy pace (0.07 s a call: 0.01557 of it), the rest at the free pace (0.035 s):
    35.545 ms in all (770 ms is not a round number in binary)."""
    import simpy

    from sim.replay.whatif import BurstyRunner

    class Paces:
        def __call__(self, state: frozenset) -> object:
            return lambda op, ranks, size: 0.07 if state else 0.035

    env = simpy.Environment()
    env.run(until=0.76891)
    job = parse_flags(["second_job=0:0.5:700:0.1"]).second_job[0]
    runner = BurstyRunner(env, [job], Paces())  # type: ignore[arg-type]
    assert runner.duration_s("all_reduce", (0, 8), 1.0) == pytest.approx(0.035545, rel=1e-9)


def test_ranks_under_a_burst_and_under_a_steady_job_are_not_folded_together() -> None:
    """Server 0's job bursts only after the step, server 1's holds 90% throughout: the step is
    server 1's alone, folded or not."""
    plan = _with(
        _plan(4, tp=8, pp=2, global_batch=64),
        "second_job=0:0.9:100000:0.5:50000",
        "second_job=1:0.9",
    )
    alone = simulate_plan(_with(_plan(4, tp=8, pp=2, global_batch=64), "second_job=1:0.9"))
    folded = simulate_plan(plan)
    assert folded.step_time_s == pytest.approx(alone.step_time_s, rel=1e-9)
    assert folded.step_time_s == pytest.approx(simulate_plan(plan, fold=False).step_time_s)


def test_several_jobs_in_bursts_need_periods_of_a_millisecond() -> None:
    plan = _plan(4, tp=8, pp=1, global_batch=32)
    with pytest.raises(ValueError, match="with 2 jobs in bursts each needs period_ms >= 1"):
        simulate_plan(_with(plan, "second_job=0:0.5:0.5:0.5", "second_job=1:0.5:10:0.5"))


def test_a_second_jobs_bursts_slow_the_step_between_none_and_all_the_time() -> None:
    """DP all-reduces across 128 servers: bursts of half of every NIC slow the step less than
    the job holding them throughout; bursts much shorter than the collectives give each the
    harmonic mean of its two paces, a third of the steady job's extra time where the rings are
    NIC-bound (1 / (0.5 / 2 + 0.5 / 1) = 4/3 of the free time, against 2x); a burst covering
    the step is the steady job, one starting after it none."""
    plan = _plan(128, tp=8, pp=1, global_batch=128)
    free = simulate_plan(plan).step_time_s
    steady = simulate_plan(_with(plan, "second_job=0-127:0.5")).step_time_s
    assert steady > free
    every = simulate_plan(_with(plan, "second_job=0-127:0.5:100:1")).step_time_s
    assert every == steady  # busy 1: steady
    fine = simulate_plan(_with(plan, "second_job=0-127:0.5:0.01:0.5")).step_time_s
    assert 0.25 < (fine - free) / (steady - free) < 0.4
    covering = simulate_plan(_with(plan, "second_job=0-127:0.5:1000000:0.5")).step_time_s
    assert covering == pytest.approx(steady, rel=1e-9)
    later = simulate_plan(_with(plan, "second_job=0-127:0.5:1000000:0.5:500000")).step_time_s
    assert later == pytest.approx(free, rel=1e-9)


def test_the_flow_model_re_rates_the_nic_links_at_each_burst_edge() -> None:
    """Under the flow model the bursts set the NIC links' capacities as they come and go: a
    job holding them throughout (busy 1, or one burst covering the step) is the steady job, one
    whose burst starts after the step is none, and bursts in between fall between the two."""
    plan = _plan(4, tp=8, pp=1, global_batch=32)
    free = simulate_plan(plan, fidelity="flow").step_time_s
    steady = simulate_plan(_with(plan, "second_job=0-3:0.5"), fidelity="flow").step_time_s
    assert steady > free

    def step(flag: str) -> float:
        return simulate_plan(_with(plan, flag), fidelity="flow").step_time_s

    assert step("second_job=0-3:0.5:100:1") == steady
    assert step("second_job=0-3:0.5:1000000:0.5") == pytest.approx(steady, rel=1e-9)
    assert step("second_job=0-3:0.5:1000000:0.5:500000") == pytest.approx(free, rel=1e-9)
    assert free < step("second_job=0-3:0.5:10:0.5") < steady
    with pytest.raises(ValueError, match="bursts need period_ms >= 1 there"):
        step("second_job=0-3:0.5:0.1:0.5")
