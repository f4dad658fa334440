"""simulate_plan end to end: closed forms on one GPU, result consistency, determinism, errors."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from schedules.arithmetic import model_flops_per_step, stage_params_per_gpu
from schedules.kernels import master_copy_bytes
from schedules.plan import load_plan, num_microbatches
from schedules.resolve import resolve_plan
from sim.compute.compute_model import ComputeModel
from sim.replay.simulate import simulate_plan
from topologies.presets import build_cluster
from vocab.compute_calibration import ComputeCalibration

MODEL = {
    "name": "tiny-llama",
    "num_layers": 8,
    "hidden_size": 1024,
    "num_heads": 16,
    "num_kv_heads": 4,
    "ffn_hidden_size": 2816,
    "vocab_size": 32000,
    "seq_len": 1024,
}


def plan_of(parallel: dict[str, Any], *, nodes: int = 1, gbs: int = 16) -> Any:
    return load_plan(
        {
            "model": MODEL,
            "cluster": {"node": "dgx-h100", "num_nodes": nodes},
            "parallel": parallel,
            "training": {"micro_batch_size": 1, "global_batch_size": gbs},
        }
    )


def test_one_gpu_step_is_the_sum_of_its_kernels() -> None:
    topology = build_cluster("dgx-h100", gpus_per_node=1)
    plan = resolve_plan(plan_of({}, gbs=4), 1)
    free_launches = ComputeCalibration(host_s_per_launch=0.0)
    result = simulate_plan(plan, topology=topology, compute_calibration=free_launches)
    # one GPU: no multi-GPU in-step slowdown
    compute = ComputeModel(topology.gpu_spec(0), free_launches, distributed=False)
    layer, embed, head = (
        compute.layer_times(plan),
        compute.embedding_times(plan),
        compute.head_times(plan),
    )
    per_microbatch = (
        8 * (layer.forward_s + layer.backward_s)
        + embed.forward_s + embed.backward_s + head.forward_s + head.backward_s
    )  # fmt: skip
    params = stage_params_per_gpu(plan, 0)
    # bf16 weights (the default): Adam, then the copies to and from the fp32 master weights
    optimizer_s = compute.optimizer_step_s(params, grad_bytes_per_param=2)
    optimizer_s += compute.memory_time_s(master_copy_bytes(plan, params), "copy")
    assert result.breakdown.optimizer_s == pytest.approx(optimizer_s, rel=1e-12)
    assert result.step_time_s == pytest.approx(4 * per_microbatch + optimizer_s, rel=1e-12)
    assert result.breakdown.compute_s == pytest.approx(4 * per_microbatch, rel=1e-12)
    assert result.breakdown.exposed_comm_s == {}
    assert result.breakdown.bubble_s == pytest.approx(0.0, abs=1e-12)
    assert result.num_gpus == result.num_simulated_ranks == 1


def test_a_small_model_on_one_gpu_waits_for_its_host() -> None:
    topology = build_cluster("dgx-h100", gpus_per_node=1)
    plan = resolve_plan(plan_of({}, gbs=4), 1)
    result = simulate_plan(plan, topology=topology)
    compute = ComputeModel(topology.gpu_spec(0), distributed=False)
    layer, embed, head = (
        compute.layer_times(plan),
        compute.embedding_times(plan),
        compute.head_times(plan),
    )
    launches = sum(
        8 * (t.forward_launch_s + t.backward_input_launch_s + t.backward_weight_launch_s)
        if t is layer
        else t.forward_launch_s + t.backward_input_launch_s + t.backward_weight_launch_s
        for t in (layer, embed, head)
    )
    # launch-bound: the host launches 4 micro-batches, then the optimizer runs
    assert result.step_time_s == pytest.approx(4 * launches + result.breakdown.optimizer_s)
    assert result.breakdown.host_s > result.breakdown.compute_s
    assert result.bottleneck.startswith("host")


def test_cuda_graphs_launch_each_layer_pass_once() -> None:
    """The same launch-bound step with the layers in CUDA graphs: each layer's forward and
    backward cost the host one launch; the embedding and head launch kernel by kernel."""
    topology = build_cluster("dgx-h100", gpus_per_node=1)
    eager = resolve_plan(plan_of({}, gbs=4), 1)
    graphed = dataclasses.replace(
        eager, training=dataclasses.replace(eager.training, cuda_graphs=True)
    )
    compute = ComputeModel(topology.gpu_spec(0), distributed=False)
    layer = compute.layer_times(graphed)
    one = compute.host_s_per_launch
    assert (layer.forward_launch_s, layer.backward_input_launch_s) == (one, one)
    # one graph for the backward: its weight gradients (and any recompute) inside it
    assert layer.backward_weight_launch_s == 0.0 and layer.recompute_launch_s == 0.0
    assert compute.layer_times(eager).forward_launch_s > 10 * one  # 17 launches: kernels
    assert compute.head_times(graphed) == compute.head_times(eager)
    before = simulate_plan(eager, topology=topology)
    after = simulate_plan(graphed, topology=topology)
    assert after.breakdown.host_s < 0.5 * before.breakdown.host_s
    assert after.step_time_s < before.step_time_s
    assert "layers in CUDA graphs" in after.basis["compute"]
    # a captured layer keeps its temporaries: 20% more activation memory (NeMo's measurement)
    from schedules.memory import _head_bytes, activation_bytes

    layers = activation_bytes(eager, 0) - _head_bytes(eager, 0)  # the LM head is not captured
    assert activation_bytes(graphed, 0) - activation_bytes(eager, 0) == pytest.approx(0.2 * layers)
    assert layers > 0


def test_result_figures_are_consistent() -> None:
    plan = plan_of({"tp": 2, "pp": 2, "data_parallel": "distributed_optimizer"}, nodes=2)
    result = simulate_plan(plan)
    resolved = resolve_plan(plan, 16)
    step = result.step_time_s
    flops, definition = model_flops_per_step(resolved)
    assert result.tokens_per_s == pytest.approx(16 * 1024 / step)
    assert result.tflops_per_gpu == pytest.approx(flops / step / 16 / 1e12)
    assert result.mfu == pytest.approx(result.tflops_per_gpu * 1e12 / 989.4e12)
    assert result.flops_definition == definition
    bd = result.breakdown
    total = bd.compute_s + bd.optimizer_s + bd.bubble_s + bd.host_s
    total += sum(bd.exposed_comm_s.values())
    assert total == pytest.approx(step)
    assert set(bd.exposed_comm_s) <= {"tp", "pp", "dp"}
    assert result.num_simulated_ranks == 2  # one per pipeline stage
    assert result.extra["num_microbatches"] == num_microbatches(resolved) == 4
    hbm_bytes = build_cluster("dgx-h100").gpu_spec(0).hbm_bytes
    assert result.fits_in_memory == (result.memory_gib["total"] * 2**30 <= hbm_bytes)
    json = result.to_json()
    assert json["step_time_s"] == step and json["num_gpus"] == 16


def test_pipeline_parallelism_adds_a_bubble_and_tensor_parallelism_exposes_tp() -> None:
    pp = simulate_plan(plan_of({"pp": 4, "data_parallel": "ddp"}, gbs=8))
    # Every stage waits for the step-end gradient-norm all-reduce, so the last stage (LM head,
    # largest optimizer step) finishes last; it idles while the pipeline fills and drains.
    assert pp.extra["critical_rank"] == 6
    assert pp.breakdown.bubble_s > 0.05 * pp.step_time_s
    tp = simulate_plan(plan_of({"tp": 4}, gbs=8))
    assert tp.breakdown.exposed_comm_s["tp"] > 0
    assert tp.breakdown.bubble_s < 0.05 * tp.step_time_s


def test_more_microbatches_shrink_the_bubble_fraction() -> None:
    few = simulate_plan(plan_of({"pp": 4, "data_parallel": "ddp"}, gbs=8))
    many = simulate_plan(plan_of({"pp": 4, "data_parallel": "ddp"}, gbs=64))
    assert many.breakdown.bubble_s / many.step_time_s < few.breakdown.bubble_s / few.step_time_s


def test_simulation_is_deterministic_bit_for_bit() -> None:
    plan = plan_of({"tp": 2, "pp": 2, "schedule": "interleaved", "vpp": 2}, nodes=2)
    first, second = simulate_plan(plan), simulate_plan(plan)
    assert first.to_json() == second.to_json()
    assert first.spans == second.spans


def test_fsdp_with_pipelining_gathers_once_and_reduces_after_the_last_backward() -> None:
    parallel = {"tp": 2, "pp": 2, "data_parallel": "fsdp", "fsdp_reshard_after_forward": False}
    result = simulate_plan(plan_of(parallel))
    dp = [s.name for s in result.spans if s.rank == 0 and s.stream == "dp"]
    # stage 0 of 4 layers per stage: root + 4 unit gathers in F0, 1 root + 4 unit RS at the end
    assert [n.split()[0] for n in dp] == ["AG"] * 5 + ["RS"] * 5
    assert dp[0] == "AG root F0" and dp[-1] == "RS u3 c0"
    assert result.breakdown.exposed_comm_s["dp"] > 0.0


def _tp_spans(result: Any, rank: int) -> list[Any]:
    return [s for s in result.spans if s.rank == rank and s.group == "tp"]


def test_megatron_tp_comm_overlap_gathers_output_gradients_beside_their_dgrad_gemms() -> None:
    raw = {
        "model": MODEL,
        "cluster": {"node": "dgx-h100", "num_nodes": 1},
        "parallel": {"tp": 4, "sequence_parallel": True, "tp_comm_overlap": True},
        "training": {"micro_batch_size": 1, "global_batch_size": 2, "stack": "megatron"},
    }
    result = simulate_plan(load_plan(raw))
    compute = {s.name: s for s in result.spans if s.rank == 0 and s.stream == "compute"}
    gathers = [s for s in _tp_spans(result, 0) if " AG grad " in s.name]
    # Transformer Engine's proj_dgrad and fc2_dgrad ring exchanges: one gather per row-parallel
    # linear, each starting with the dgrad GEMM it feeds (one micro-batch per rank at DP 2)
    assert sorted(s.name.split()[-1] for s in gathers) == ["fc2", "proj"]
    for gather in gathers:
        gemm = compute[gather.name.replace("AG grad", "dgrad")]
        assert gemm.start_s == pytest.approx(gather.start_s, abs=1e-12)
    # without it the gathers block: nothing computes while they run
    plain = simulate_plan(
        load_plan({**raw, "parallel": {**raw["parallel"], "tp_comm_overlap": False}})
    )
    blocking = [s for s in _tp_spans(plain, 0) if s.name.endswith(" AG grad")]
    assert len(blocking) == 1 and blocking[0].end_s > blocking[0].start_s
    assert plain.breakdown.exposed_comm_s["tp"] > result.breakdown.exposed_comm_s["tp"]


@pytest.mark.parametrize("recompute", ["none", "op"])
def test_pytorch_tp_exposes_every_collective_megatron_hides_the_dgrad_ones(recompute: str) -> None:
    def run(stack: str, overlap: bool = False) -> Any:
        parallel = {"tp": 4, "sequence_parallel": True, "recompute": recompute}
        raw = {
            "model": MODEL,
            "cluster": {"node": "dgx-h100", "num_nodes": 1},
            "parallel": {**parallel, "tp_comm_overlap": overlap},
            "training": {"micro_batch_size": 1, "global_batch_size": 2, "stack": stack},
        }
        return simulate_plan(load_plan(raw))

    eager, megatron = run("eager"), run("megatron")
    # torch.compile without async TP runs the same DTensor collectives, all blocking
    compiled = run("compile")
    assert compiled.breakdown.exposed_comm_s["tp"] == pytest.approx(
        sum(s.end_s - s.start_s for s in _tp_spans(compiled, 0)), rel=1e-6
    )
    # asynchronous TP (tp_comm_overlap, an Inductor pass) overlaps them under torch.compile
    async_tp = run("compile", overlap=True)
    async_busy = sum(s.end_s - s.start_s for s in _tp_spans(async_tp, 0))
    assert async_tp.breakdown.exposed_comm_s["tp"] < 0.95 * async_busy
    busy = {
        name: sum(s.end_s - s.start_s for s in _tp_spans(result, 0))
        for name, result in (("eager", eager), ("megatron", megatron))
    }
    # forward 2 AG + 2 RS per layer both ways; backward: DTensor 2 AG (gradients) + 2 RS (dgrad),
    # with per-op recompute the 2 input all-gathers again, which Megatron runs in every backward
    if recompute == "op":
        assert busy["eager"] == pytest.approx(busy["megatron"], rel=1e-9)
    else:
        assert busy["eager"] < 0.9 * busy["megatron"]
    # nothing runs beside a DTensor collective; Megatron hides its dgrad ones behind GEMMs
    assert eager.breakdown.exposed_comm_s["tp"] == pytest.approx(busy["eager"], rel=1e-6)
    assert megatron.breakdown.exposed_comm_s["tp"] < 0.95 * busy["megatron"]


def _layer_recipes(parallel: dict[str, Any], stack: str = "megatron", **model: Any) -> Any:
    from sim.replay.recipes import layer_recipes, step_costs

    raw = {
        "model": {**MODEL, **model},
        "cluster": {"node": "dgx-h100", "num_nodes": 2},
        "parallel": {"tp": 4, "sequence_parallel": True, **parallel},
        "training": {"micro_batch_size": 1, "global_batch_size": 16, "stack": stack},
    }
    plan = resolve_plan(load_plan(raw), 16)
    costs = step_costs(plan, ComputeModel(plan_gpu(plan)))
    return plan, costs, layer_recipes(plan, costs, 4, 4 if model.get("num_experts") else 0)


def plan_gpu(plan: Any) -> Any:
    from topologies.hardware import GPUS

    return GPUS["h100-sxm"]


def _comms(steps: Any, op: str) -> list[Any]:
    from schedules.actions import CommStep

    return [s for s in steps if isinstance(s, CommStep) and s.op == op and s.group == "tp"]


def test_transformer_engine_userbuffers_only_on_the_megatron_stack() -> None:
    # Megatron: the ring exchanges are on the copy engines; PyTorch's asynchronous TP is not
    _, _, megatron = _layer_recipes({"tp_comm_overlap": True})
    gathers = _comms(megatron["F"], "all_gather") + [
        s for s in _comms(megatron["B"], "all_gather") if s.name.startswith("AG grad")
    ]
    assert len(gathers) == 4 and all(s.sm_free for s in gathers)
    # the backward's bulk re-gathers run userbuffers kernels on SMs
    bulk = [s for s in _comms(megatron["B"], "all_gather") if s.name.startswith("AG input")]
    assert len(bulk) == 2 and not any(s.sm_free for s in bulk)
    _, _, compiled = _layer_recipes({"tp_comm_overlap": True}, stack="compile")
    assert not any(s.sm_free for key in ("F", "B") for s in _comms(compiled[key], "all_gather"))
    assert not any("last piece" in s.name for s in _comms(compiled["F"], "reduce_scatter"))
    assert any("last piece" in s.name for s in _comms(megatron["F"], "reduce_scatter"))


@pytest.mark.parametrize("num_experts", [0, 8])
def test_a_fully_recomputed_layer_gathers_before_its_first_forward_gemms(num_experts: int) -> None:
    # TE turns the gathers' userbuffers off without autograd (Megatron's checkpoint forward)
    moe = {"num_experts": num_experts, "moe_top_k": 2} if num_experts else {}
    extra = {"ep": 2, "data_parallel": "distributed_optimizer"} if num_experts else {}
    overlap = {"tp_comm_overlap": True, **extra}
    _, _, full = _layer_recipes({**overlap, "recompute": "full"}, **moe)
    _, _, kept = _layer_recipes(overlap, **moe)
    assert _comms(full["F"], "all_gather") and not any(
        s.overlap for s in _comms(full["F"], "all_gather")
    )
    assert all(s.overlap for s in _comms(kept["F"], "all_gather"))
    # the rerun in the backward pairs them again
    rerun = [s for s in _comms(full["B"], "all_gather") if not s.name.startswith("AG")]
    assert rerun and all(s.overlap for s in rerun)


def test_an_moe_layers_tp_windows_are_its_attention_gemms() -> None:
    from schedules.actions import ComputeStep

    moe = {"num_experts": 8, "moe_top_k": 2}
    _, costs, recipes = _layer_recipes(
        {"tp_comm_overlap": True, "ep": 2, "data_parallel": "distributed_optimizer"}, **moe
    )
    dense_qkv = costs.shares.qkv * costs.layer.backward_weight_s
    windows = [s for s in recipes["B"] if isinstance(s, ComputeStep) and s.name == "wgrad qkv"]
    # 4 MoE layers: their QKV GEMMs are a dense layer's, not a dense share of the MoE layer's
    # weight-gradient time (which holds the experts' GEMMs)
    assert [w.duration_s for w in windows] == pytest.approx([4 * dense_qkv])
    assert costs.moe_layer is not None
    dense_share_of_moe = costs.shares.qkv * costs.moe_layer.backward_weight_s
    assert 4 * dense_share_of_moe != pytest.approx(4 * dense_qkv, rel=0.05)


def test_megatron_cp_exchange_runs_beside_the_attention_compute() -> None:
    from schedules.actions import CommStep, ComputeStep

    _, _, recipes = _layer_recipes({"tp_comm_overlap": True, "cp": 2}, seq_len=4096)
    for key, rest in (("F", "fwd"), ("B", "bwd")):
        steps = recipes[key]
        at = next(i for i, s in enumerate(steps) if isinstance(s, CommStep) and s.group == "cp")
        assert steps[at].overlap
        assert isinstance(steps[at + 1], ComputeStep) and steps[at + 1].name == rest
