"""DeepSpeed ZeRO-3 programs: fetch/prefetch/release, gradient buckets, step end, helpers."""

from __future__ import annotations

import dataclasses
import doctest

import pytest
import simpy

import schedules.zero3_fetch
import schedules.zero3_program
import schedules.zero3_spec
from schedules.actions import Collective, CommStep, Compute, ComputeStep, MarkStep, Program
from schedules.params import layer_params_per_gpu, norm_params
from schedules.plan import ModelConfig
from schedules.zero3_fetch import fetch_trace, zero3_buffer_bytes
from schedules.zero3_program import zero3_program
from schedules.zero3_spec import Submodule, Zero3Rank, layer_submodules, split_recipe
from sim.replay.engine import Engine
from tests.model_configs import LLAMA3_70B, gpt
from tests.sim.replay.test_engine import UnitComm

SIZES = {"a": 10.0, "b": 20.0, "c": 30.0}
"""Elements of the three modules of each layer of the tiny model."""


def tiny(**overrides: object) -> Zero3Rank:
    """2 layers x 3 modules (10, 20, 30 elements), 2 micro-batches, nothing kept or prefetched."""
    submodules = tuple(
        Submodule(
            name=f"L{layer}.{name}",
            num_params=numel,
            forward=(ComputeStep(name="fwd", duration_s=1.0),),
            backward=(ComputeStep(name="bwd", duration_s=2.0),),
        )
        for layer in range(2)
        for name, numel in SIZES.items()
    )
    fields: dict[str, object] = dict(
        rank=0,
        num_microbatches=2,
        submodules=submodules,
        groups={"dp": (0, 1), "mp": (0, 2)},
        prefetch_bucket_elems=0,
        max_reuse_distance=0,
        persistence_threshold=0,
        reduce_bucket_elems=50,
    )
    return Zero3Rank(**{**fields, **overrides})  # type: ignore[arg-type]


def collectives(program: Program) -> list[str]:
    return [a.name for a in program.actions if isinstance(a, Collective)]


def index(program: Program) -> dict[str, int]:
    return {a.name: i for i, a in enumerate(program.actions)}


def test_without_prefetch_each_module_is_gathered_before_use_and_buckets_flush_early() -> None:
    program = zero3_program(tiny())
    modules = [f"L{layer}.{name}" for layer in range(2) for name in SIZES]

    def micro_batch(mb: int) -> list[str]:
        # backward gradients 30, 20 | 10, 30 | 20, 10: a bucket is reduced before it would
        # pass 50 elements, the rest at the end of the backward
        return [
            *(f"AG F{mb} {m}" for m in modules),
            f"AG B{mb} L1.c", f"AG B{mb} L1.b", f"AG B{mb} L1.a", f"RS B{mb} bucket0",
            f"AG B{mb} L0.c", f"AG B{mb} L0.b", f"RS B{mb} bucket1",
            f"AG B{mb} L0.a", f"RS B{mb} bucket2",
        ]  # fmt: skip

    assert collectives(program) == micro_batch(0) + micro_batch(1)
    sizes = [a.size_bytes for a in program.actions if isinstance(a, Collective)][:15]
    assert sizes[:6] == [20.0, 40.0, 60.0, 20.0, 40.0, 60.0]  # 2 bytes per element
    reduces = [a.size_bytes for a in program.actions if a.name.startswith("RS B0")]
    assert reduces == [100.0, 80.0, 60.0]
    at = index(program)
    assert program.actions[at["F0 L0.b fwd"]].deps == (at["AG F0 L0.b"],)
    assert at["F0 L0.a fwd"] < at["AG F0 L0.b"]
    assert program.actions[at["AG F0 L0.b"]].deps == ()  # overlap_comm: its own stream
    # bucket 0 holds L1.c and L1.b: it waits for B0 L1.b, not for L1.a that overflowed it
    assert program.actions[at["RS B0 bucket0"]].deps == (at["B0 L1.b bwd"],)
    # the epilogue synchronizes the host: the next micro-batch waits for the last bucket
    assert program.actions[at["F1 L0.a fwd"]].deps == (at["RS B0 bucket2"], at["AG F1 L0.a"])
    assert program.actions[at["AG F1 L0.a"]].deps == (at["B0 L0.a bwd"], at["RS B0 bucket2"])
    assert [a.name for a in program.actions[-1:]] == ["optimizer"]


def test_reuse_distance_keeps_the_last_forward_modules_for_the_backward() -> None:
    # L1.c is used again right away (0 elements between), L1.b after 2*30, L1.a after 2*50,
    # L0.c after 2*60: with 120 the last three stay gathered
    program = zero3_program(tiny(max_reuse_distance=120, num_microbatches=1))
    gathers = [n for n in collectives(program) if n.startswith("AG B0")]
    assert gathers == ["AG B0 L0.c", "AG B0 L0.b", "AG B0 L0.a"]
    kept = collectives(zero3_program(tiny(max_reuse_distance=10**9)))
    assert not [n for n in kept if n.startswith("AG B")]


def test_prefetch_window_walks_the_trace_into_the_backward() -> None:
    program = zero3_program(tiny(prefetch_bucket_elems=25, num_microbatches=1))
    assert collectives(program) == [
        "AG F0 L0.a",
        "AG F0 L0.a prefetch L0.b+L0.c",  # walks 20, then 30: stops at 50 >= 25
        "AG F0 L0.b prefetch L1.a+L1.b",
        "AG F0 L0.c prefetch L1.c",
        "AG F0 L1.a prefetch L0.c",  # past the backward's L1.c, L1.b, L1.a: in flight or kept
        "AG F0 L1.b prefetch L0.a+L0.b",
        "AG B0 L1.c",  # the walk saw its backward use at step 6 = its release step: freed
        "RS B0 bucket0",
        "RS B0 bucket1",
        "RS B0 bucket2",
    ]
    at = index(program)
    prefetch = at["AG F0 L0.a prefetch L0.b+L0.c"]
    assert prefetch < at["F0 L0.a fwd"] < at["F0 L0.b fwd"]
    assert program.actions[at["F0 L0.b fwd"]].deps == (prefetch,)
    assert program.actions[at["B0 L0.c bwd"]].deps == (at["AG F0 L1.a prefetch L0.c"],)
    # the walk passed the backward uses of L1.*: they are not released after the forward
    live = [f.live_numel for f in fetch_trace(tiny(prefetch_bucket_elems=25))]
    assert live[:7] == [60.0, 80.0, 90.0, 90.0, 120.0, 120.0, 120.0]


def test_max_live_parameters_caps_the_prefetch_budget() -> None:
    spec = tiny(prefetch_bucket_elems=10**9, max_live_parameters=40, num_microbatches=1)
    names = collectives(zero3_program(spec))
    # L0.a gathered (10 live): the walk may take 30 more, stops after L0.b + L0.c (50)
    assert names[:2] == ["AG F0 L0.a", "AG F0 L0.a prefetch L0.b+L0.c"]
    # at L0.b 50 are live: no budget; at L0.c 30 (L0.b freed): 10 more
    assert names[2] == "AG F0 L0.c prefetch L1.a"
    unlimited = collectives(zero3_program(dataclasses.replace(spec, max_live_parameters=10**9)))
    assert unlimited[:2] == ["AG F0 L0.a", "AG F0 L0.a prefetch L0.b+L0.c+L1.a+L1.b+L1.c"]


def test_recomputed_forward_fetches_again_before_its_backward() -> None:
    # layer 1 is checkpointed; within 60 elements of trace L1.* forward -> recompute is kept,
    # recompute -> backward only for L1.c (L1.b: 30 + 30 in between, L1.a: 100)
    spec = tiny(recompute_blocks=((3, 6),), max_reuse_distance=60, num_microbatches=1)
    program = zero3_program(spec)
    computes = [a.name for a in program.actions if isinstance(a, Compute)]
    assert computes[5:12] == ["F0 L1.c fwd", "R0 L1.a fwd", "R0 L1.b fwd", "R0 L1.c fwd",
                              "B0 L1.c bwd", "B0 L1.b bwd", "B0 L1.a bwd"]  # fmt: skip
    assert collectives(program)[6:] == [
        "AG B0 L1.b", "AG B0 L1.a", "RS B0 bucket0",
        "AG B0 L0.c", "AG B0 L0.b", "RS B0 bucket1", "AG B0 L0.a", "RS B0 bucket2",
    ]  # fmt: skip
    forgetful = collectives(zero3_program(dataclasses.replace(spec, max_reuse_distance=0)))
    assert forgetful[6:9] == ["AG R0 L1.a", "AG R0 L1.b", "AG R0 L1.c"]
    with pytest.raises(ValueError, match="recompute_blocks"):
        tiny(recompute_blocks=((3, 6), (2, 4)))


def test_persistent_tensors_are_never_fetched_and_regathered_after_the_step() -> None:
    program = zero3_program(tiny(persistence_threshold=10))
    assert not [n for n in collectives(program) if "L0.a" in n or "L1.a" in n]
    final = [a for a in program.actions if isinstance(a, Collective)][-1]
    assert (final.name, final.repeat, final.size_bytes, final.phase) == (
        "AG persistent 2x10", 2, 20.0, "optimizer")  # fmt: skip
    at = index(program)
    assert final.deps == (at["optimizer"],)
    assert program.actions[-1] == Compute(
        name="params gathered", duration_s=0.0, kind="optimizer", deps=(len(program.actions) - 2,)
    )
    # their gradients are still reduced: 30+20 | 10+30 | 20+10 as without persistence
    assert [a.size_bytes for a in program.actions if a.name.startswith("RS B0")] == [
        100.0, 80.0, 60.0]  # fmt: skip


def test_without_overlap_comm_the_compute_waits_for_each_reduce_and_gathers_wait_for_compute() -> (
    None
):
    program = zero3_program(tiny(overlap_comm=False, num_microbatches=1))
    at = index(program)
    rs = at["RS B0 bucket0"]
    assert program.actions[rs].deps == (at["B0 L1.a bwd"],)  # issued on the compute stream
    assert program.actions[at["B0 L0.c bwd"]].deps == (rs, at["AG B0 L0.c"])
    assert program.actions[at["AG F0 L0.b"]].deps == (at["F0 L0.a fwd"],)
    overlapped = zero3_program(tiny(num_microbatches=1))
    at = index(overlapped)
    assert overlapped.actions[at["B0 L0.c bwd"]].deps == (at["AG B0 L0.c"],)


def test_host_waits_for_the_bucket_three_back_before_reducing_another() -> None:
    program = zero3_program(tiny(reduce_bucket_elems=1, num_microbatches=1))
    at = index(program)
    reduces = [f"RS B0 bucket{n}" for n in range(6)]
    assert [n for n in collectives(program) if n.startswith("RS")] == reduces
    # bucket 3 is reduced at L0.b's gradient hook; the next compute waits for bucket 0
    assert program.actions[at["B0 L0.a bwd"]].deps == (at["RS B0 bucket0"], at["AG B0 L0.a"])


def test_grad_norm_all_reduces_follow_deepspeed_dp_then_model_parallel() -> None:
    program = zero3_program(tiny(grad_norm_groups=("dp", "mp"), num_norm_groups=2))
    norms = [a for a in program.actions if isinstance(a, Collective) and "norm" in a.name]
    assert [(a.name, a.group, a.size_bytes) for a in norms] == [
        ("AR grad norm dp g0", "dp", 8.0),
        ("AR grad norm mp g0", "mp", 8.0),
        ("AR grad norm dp g1", "dp", 8.0),
        ("AR grad norm mp g1", "mp", 8.0),
    ]
    at = index(program)
    # each norm all-reduce is synchronous: after the backward, the last bucket and the previous
    assert norms[1].deps == (at["B1 L0.a bwd"], at["RS B1 bucket2"], at["AR grad norm dp g0"])
    assert program.actions[at["optimizer"]].deps == (
        at["RS B1 bucket2"], *(at[a.name] for a in norms))  # fmt: skip
    assert not [n for n in collectives(zero3_program(tiny())) if "norm" in n]
    with pytest.raises(ValueError, match="world"):
        tiny(grad_norm_groups=("world",))


def test_sync_per_weight_gathers_each_tensor_after_a_device_sync() -> None:
    sub = Submodule(
        name="fc",
        num_params=30.0,
        tensors=(20.0, 10.0),
        forward=(ComputeStep(name="fwd", duration_s=1.0),),
        backward=(ComputeStep(name="bwd", duration_s=1.0),),
    )
    spec = tiny(submodules=(sub, dataclasses.replace(sub, name="out")), fetch="sync_per_weight",
                prefetch_bucket_elems=10**9, num_microbatches=1)  # fmt: skip
    program = zero3_program(spec)
    assert collectives(program)[:4] == [
        "AG F0 fc w0",
        "AG F0 fc w1",
        "AG F0 out w0",
        "AG F0 out w1",
    ]
    at = index(program)
    assert program.actions[at["AG F0 fc w1"]].deps == (at["AG F0 fc w0"],)
    assert program.actions[at["AG F0 out w0"]].deps == (at["AG F0 fc w1"], at["F0 fc fwd"])
    assert program.actions[at["F0 out fwd"]].deps == (at["AG F0 out w0"], at["AG F0 out w1"])


def step_s(spec: Zero3Rank) -> float:
    """Replayed step time of a 2-rank data-parallel group running ``spec``."""
    programs = [zero3_program(dataclasses.replace(spec, rank=r)) for r in (0, 1)]
    env = simpy.Environment()
    timeline = Engine(env, UnitComm(env), programs).run()
    return max(s.end_s for s in timeline.spans)


def test_with_cpu_bound_hooks_prefetch_hides_the_gathers() -> None:
    base = tiny(param_bytes=0.01, grad_bytes=1e-6, groups={"dp": (0, 1)}, num_microbatches=1,
                host_ahead=False)  # fmt: skip
    # without prefetch every module waits for its own gather (0.1, 0.2, 0.3 s), twice per layer
    assert step_s(base) == pytest.approx(6 * 1.0 + 6 * 2.0 + 4 * (0.1 + 0.2 + 0.3), abs=1e-3)
    prefetched = step_s(dataclasses.replace(base, prefetch_bucket_elems=25))
    assert prefetched < 18.0 + 0.1 + 0.2 + 0.3 + 0.3
    # a host ahead of the GPU streams the gathers back to back without any prefetch
    assert step_s(dataclasses.replace(base, host_ahead=True)) < step_s(base)


def test_split_recipe_cuts_compute_and_keeps_collectives_in_place() -> None:
    ar = CommStep(name="AR", group="tp", op="all_reduce", size_bytes=8.0)
    steps = (ComputeStep(name="fwd", duration_s=3.0), ar, MarkStep(index=0),
             ComputeStep(name="tail", duration_s=1.0))  # fmt: skip
    parts = split_recipe(steps, (0.25, 0.5, 0.25))
    assert parts == [
        (ComputeStep(name="fwd", duration_s=1.0),),
        (ComputeStep(name="fwd", duration_s=2.0), ar, MarkStep(index=0)),
        (ComputeStep(name="tail", duration_s=1.0),),
    ]
    flat = [s for part in split_recipe(steps, (0.1, 0.0, 0.6, 0.3)) for s in part]
    assert sum(s.duration_s for s in flat if isinstance(s, ComputeStep)) == pytest.approx(4.0)
    assert [s for s in flat if not isinstance(s, ComputeStep)] == [ar, MarkStep(index=0)]
    assert split_recipe((ar,), (0.5, 0.5)) == [(ar,), ()]
    with pytest.raises(ValueError, match="sum to 1"):
        split_recipe(steps, (0.5, 0.4))


@pytest.mark.parametrize("model", [gpt(4, 1024, 16), LLAMA3_70B], ids=["gpt", "llama"])
@pytest.mark.parametrize("tp", [1, 2, 8])
@pytest.mark.parametrize("fused", [False, True])
def test_layer_submodules_sum_to_layer_params_per_gpu(
    model: ModelConfig, tp: int, fused: bool
) -> None:
    modules = layer_submodules(
        hidden=model.hidden_size,
        ffn=model.ffn_hidden_size,
        kv_size=model.kv_size,
        gated=model.gated_mlp,
        bias=model.linear_bias,
        norm_params=norm_params(model),
        tp=tp,
        fused=fused,
    )
    total = sum(sum(tensors) for _, tensors in modules)
    assert total == pytest.approx(layer_params_per_gpu(model, tp), rel=1e-12)
    expected = 6 if fused else (9 if model.gated_mlp else 8)
    assert len(modules) == expected


def test_megatron_gpt_layer_has_weights_and_biases_by_module() -> None:
    modules = dict(layer_submodules(hidden=8, ffn=32, kv_size=8, gated=False, bias=True,
                                    norm_params=16, tp=2, fused=True))  # fmt: skip
    assert modules == {
        "input_norm": (8.0, 8.0),
        "qkv": (96.0, 12.0),
        "dense": (32.0, 8.0),  # row-parallel bias replicated
        "post_attn_norm": (8.0, 8.0),
        "fc1": (128.0, 16.0),
        "fc2": (128.0, 8.0),
    }


def test_buffer_bytes_of_the_tiny_model() -> None:
    buffers = zero3_buffer_bytes(tiny(prefetch_bucket_elems=25, persistence_threshold=10))
    assert buffers == {
        "ipg_bucket": 100.0,
        "reduce_scatter_copy": 100.0,
        "live_params": 2.0 * 100.0,  # L0.b+L0.c, then L1.b+L1.c prefetched (a's persistent)
        "persistent_params": 40.0,
        "grad_partition": 120.0 / 2 * 2.0,
        "step_fp32_grad": 60.0 * 6.0,
    }


def test_docstring_examples_run() -> None:
    for module in (schedules.zero3_spec, schedules.zero3_fetch, schedules.zero3_program):
        assert doctest.testmod(module).failed == 0, module.__name__


def test_bad_specs_raise() -> None:
    with pytest.raises(ValueError, match="fetch"):
        tiny(fetch="eager")
    with pytest.raises(ValueError, match="dp"):
        tiny(groups={})
    with pytest.raises(ValueError, match="sum to"):
        Submodule(name="x", num_params=5.0, tensors=(1.0, 2.0), forward=(), backward=())


def test_v03_host_loops_run_per_rank_before_and_after_each_gather_and_per_gradient() -> None:
    # one module with one 10-element weight, dp of 4 ranks; per rank 0.1 s of view loop and
    # 0.2 s of copies: views 0.4 s, copy-out 0.8 s, each gradient's loops 1.2 s
    sub = Submodule(
        name="fc",
        num_params=10.0,
        forward=(ComputeStep(name="fwd", duration_s=1.0),),
        backward=(ComputeStep(name="bwd", duration_s=2.0),),
    )
    spec = tiny(submodules=(sub,), fetch="sync_per_weight", num_microbatches=1,
                groups={"dp": (0, 1, 2, 3)}, host_loop_s=0.1, host_copy_s=0.2,
                max_reuse_distance=10**9, param_bytes=1e-9, grad_bytes=1e-9)  # fmt: skip
    program = zero3_program(spec)
    host = [(a.name, a.duration_s) for a in program.actions
            if isinstance(a, Compute) and a.stream == "host"]  # fmt: skip
    assert host == [("host AG F0 fc w0 views", pytest.approx(0.4)),
                    ("host AG F0 fc w0 copy-out", pytest.approx(0.8)),
                    ("host RS B0 bucket0 p0", pytest.approx(1.2))]  # fmt: skip
    assert collectives(program) == ["AG F0 fc w0", "RS B0 bucket0 p0"]
    programs = [zero3_program(dataclasses.replace(spec, rank=r)) for r in range(4)]
    env = simpy.Environment()
    timeline = Engine(env, UnitComm(env), programs).run()
    spans = {s.name: (s.start_s, s.end_s) for s in timeline.spans if s.rank == 0}
    # views 0-0.4, gather issued at 0.4 (free), copy-out 0.4-1.2, forward 1.2-2.2; nothing
    # syncs the host before the backward (the weight stays gathered), so it reaches the gradient
    # hook at once and its loops run beside the forward and backward (1.2-2.4 < 4.2)
    assert spans["F0 fc fwd"] == pytest.approx((1.2, 2.2))
    assert spans["host RS B0 bucket0 p0"] == pytest.approx((1.2, 2.4))
    assert spans["B0 fc bwd"] == pytest.approx((2.2, 4.2))
    assert spans["RS B0 bucket0 p0"][0] == pytest.approx(4.2, abs=1e-6)
    assert timeline.ranks[0].exposed_comm_s["host"] == pytest.approx(1.2)


def test_current_deepspeed_spends_no_modelled_host_time() -> None:
    spec = tiny(host_loop_s=0.1, host_copy_s=0.2)  # prefetch mode: the loops do not exist
    program = zero3_program(spec)
    assert not [a for a in program.actions if isinstance(a, Compute) and a.stream == "host"]
    with pytest.raises(ValueError, match="host_loop_s"):
        tiny(host_loop_s=-1.0)
