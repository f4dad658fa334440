"""Program data types and builders: rank layout, TP/SP recipes, pipeline and FSDP programs."""

from __future__ import annotations

from collections import Counter

import pytest

from schedules.actions import (
    ChunkWork,
    Collective,
    CommStep,
    Compute,
    ComputeStep,
    HostStep,
    MarkStep,
    ProgramBuilder,
    Step,
    Transfer,
)
from schedules.data_parallel.registry import DATA_PARALLEL
from schedules.fsdp_program import FsdpRank, FsdpUnits, fsdp_program
from schedules.grad_sync import GradSync
from schedules.layout import Layout
from schedules.pipeline_program import (
    PipelineRank,
    pipeline_program,
    with_marks,
)
from schedules.pipeline_schedules.one_f_one_b import one_f_one_b
from schedules.plan import ParallelConfig
from schedules.tp_steps import LinearShares, tp_backward_steps, tp_forward_steps


def comm_counts(steps: tuple[Step, ...]) -> Counter[str]:
    counts: Counter[str] = Counter()
    for step in steps:
        if isinstance(step, CommStep):
            counts[step.op] += step.repeat
    return counts


def compute_total(steps: tuple[Step, ...]) -> float:
    return sum(s.duration_s for s in steps if isinstance(s, ComputeStep))


def test_layout_is_megatron_tp_cp_dp_pp_order() -> None:
    layout = Layout(tp=2, cp=1, dp=2, pp=2)
    assert layout.world_size == 8
    assert layout.rank(tp=1, dp=1, pp=1) == 1 + 2 * (0 + 1 * (1 + 2 * 1))
    assert layout.coords(7) == {"tp": 1, "cp": 0, "dp": 1, "pp": 1}
    assert layout.group("tp", 5) == (4, 5)
    assert layout.group("dp", 5) == (5, 7)
    assert layout.group("pp", 5) == (1, 5)


def test_hsdp_groups_split_dp_into_shards_and_replicas() -> None:
    layout = Layout(dp=8)
    assert layout.group("dp_shard", 5, shard_size=4) == (4, 5, 6, 7)
    assert layout.group("dp_replicate", 5, shard_size=4) == (1, 5)
    with pytest.raises(ValueError, match="shard size"):
        layout.group("dp_shard", 0, shard_size=3)


def test_hsdp_shard_group_under_cp_takes_every_cp_rank_of_its_members() -> None:
    layout = Layout(tp=2, cp=2, dp=4)  # rank = tp + 2 (cp + 2 dp)
    # rank 5: tp 1, cp 0, dp 1; shard of dp {0, 1} x cp {0, 1}, same tp
    assert layout.group("dpcp_shard", 5, shard_size=2) == (1, 3, 5, 7)
    assert layout.group("dp_shard", 5, shard_size=2) == (1, 5)
    assert layout.group("dp_replicate", 5, shard_size=2) == (5, 13)


def test_tp_forward_counts_match_megatron() -> None:
    plain = tp_forward_steps(forward_s=1.0, num_layers=3, tp_bytes=8.0, tp=2)
    assert comm_counts(plain) == {"all_reduce": 6}
    sp = tp_forward_steps(forward_s=1.0, num_layers=3, tp_bytes=8.0, tp=2, sequence_parallel=True)
    assert comm_counts(sp) == {"all_gather": 6, "reduce_scatter": 6}
    assert compute_total(sp) == 3.0
    assert all(not s.overlap for s in sp if isinstance(s, CommStep))
    assert comm_counts(tp_forward_steps(forward_s=1.0, num_layers=3, tp_bytes=8.0, tp=1)) == {}


def test_overlapped_tp_collectives_hide_only_behind_their_own_gemm() -> None:
    """Under tp_comm_overlap with the forward GEMM shares, each collective runs beside the GEMM
    it is fused with (QKV's input gather, the projection's output scatter, the MLP's gather and
    scatter) and the rest of the layer runs alone: 4 pairs, then the remainder."""
    shares = LinearShares(forward=(0.1, 0.05, 0.3, 0.15))
    steps = tp_forward_steps(
        forward_s=2.0, num_layers=3, tp_bytes=8.0, tp=4, sequence_parallel=True,
        tp_comm_overlap=True, gather_bytes=4.0, shares=shares,
    )  # fmt: skip
    pairs = list(zip(steps[0:8:2], steps[1:8:2], strict=True))
    assert [(c.op, c.size_bytes, c.repeat, c.overlap) for c, _ in pairs] == [
        ("all_gather", 4.0, 3, True),
        ("reduce_scatter", 8.0, 3, True),
        ("all_gather", 4.0, 3, True),
        ("reduce_scatter", 8.0, 3, True),
    ]
    assert [g.duration_s for _, g in pairs] == pytest.approx([0.6, 0.3, 1.8, 0.9])
    assert isinstance(steps[8], ComputeStep) and steps[8].duration_s == pytest.approx(6.0 - 3.6)
    assert compute_total(steps) == pytest.approx(6.0)
    # one pair per layer where the MLP leaves TP (MoE without a shared expert)
    moe = tp_forward_steps(
        forward_s=2.0, num_layers=3, tp_bytes=8.0, tp=4, sequence_parallel=True,
        tp_comm_overlap=True, shares=shares, per_layer=1,
    )  # fmt: skip
    assert comm_counts(moe) == {"all_gather": 3, "reduce_scatter": 3}
    # without the shares: beside the whole layer compute
    whole = tp_forward_steps(
        forward_s=2.0, num_layers=3, tp_bytes=8.0, tp=4, sequence_parallel=True,
        tp_comm_overlap=True,
    )  # fmt: skip
    assert [type(s).__name__ for s in whole] == ["CommStep", "CommStep", "ComputeStep"]


def test_sp_backward_is_four_all_gathers_and_two_reduce_scatters_per_layer() -> None:
    shares = LinearShares(qkv=0.25, fc1=0.5)
    steps = tp_backward_steps(
        backward_input_s=2.0,
        backward_weight_s=2.0,
        recompute_s=0.0,
        num_layers=3,
        tp_bytes=8.0,
        shares=shares,
        tp=4,
        sequence_parallel=True,
    )
    assert comm_counts(steps) == {"all_gather": 12, "reduce_scatter": 6}
    assert compute_total(steps) == pytest.approx(12.0)
    # the dgrad reduce-scatters hide behind the wgrad GEMM windows (qkv: 0.25*2*3 = 1.5 s)
    qkv_rs = next(s for s in steps if isinstance(s, CommStep) and s.name.endswith("dgrad qkv"))
    assert qkv_rs.overlap
    position = steps.index(qkv_rs)
    assert steps[position + 1] == ComputeStep(name="wgrad qkv", duration_s=1.5)


def test_userbuffers_gather_each_output_gradient_beside_its_dgrad_gemm() -> None:
    # Megatron's tp_comm_overlap: TE runs proj_dgrad and fc2_dgrad as ring exchanges
    shares = LinearShares(qkv=0.25, proj=0.125, fc1=0.5, fc2=0.125)
    kwargs = dict(
        backward_input_s=2.0, backward_weight_s=2.0, recompute_s=0.0, num_layers=3,
        tp_bytes=8.0, shares=shares, tp=4, sequence_parallel=True,
    )  # fmt: skip
    plain = tp_backward_steps(**kwargs)  # type: ignore[arg-type]
    fused = tp_backward_steps(**kwargs, userbuffers=True)  # type: ignore[arg-type]
    # the same collectives and the same compute, only placed differently
    assert comm_counts(fused) == comm_counts(plain) == {"all_gather": 12, "reduce_scatter": 6}
    assert compute_total(fused) == pytest.approx(compute_total(plain)) == pytest.approx(12.0)
    assert not any(s.name == "AG grad" for s in fused)
    for name in ("proj", "fc2"):
        gather = next(s for s in fused if s.name == f"AG grad {name}")
        assert isinstance(gather, CommStep) and gather.overlap and gather.repeat == 3
        assert gather.sm_free  # a ring exchange on the copy engines
        # beside its dgrad GEMM (the share of the wgrad time, 0.125 x 2 s x 3 layers = 0.75 s) in
        # tp = 4 pieces, the last after the last piece of the gradient has arrived
        at = fused.index(gather)
        assert fused[at + 1] == ComputeStep(name=f"dgrad {name}", duration_s=0.5625)
        assert fused[at + 2] == ComputeStep(name=f"dgrad {name} last piece", duration_s=0.1875)
    # the rest of the dgrad shrinks by those windows: 6 - 1.5 (qkv, fc1 windows: 4.5) - 1.5
    rest = next(s for s in fused if isinstance(s, ComputeStep) and s.name == "bwd")
    assert rest.duration_s == pytest.approx((6.0 - 4.5 - 1.5) + (6.0 - 4.5))
    # the bulk overlaps run userbuffers kernels on SMs: they slow the compute as NCCL's do
    bulk = [s for s in fused if isinstance(s, CommStep) and not s.name.startswith("AG grad")]
    assert len(bulk) == 4 and not any(s.sm_free for s in bulk)
    # an MoE layer without a shared expert keeps the attention block's gather only
    moe = tp_backward_steps(**{**kwargs, "per_layer": 1}, userbuffers=True)  # type: ignore[arg-type]
    assert [s.name for s in moe if s.name.startswith("AG grad")] == ["AG grad proj"]


def test_userbuffers_full_recompute_reruns_the_forward_with_its_fused_pairs() -> None:
    shares = LinearShares(qkv=0.25, proj=0.125, fc1=0.5, fc2=0.125, forward=(0.2, 0.1, 0.4, 0.1))
    kwargs = dict(
        backward_input_s=2.0, backward_weight_s=2.0, recompute_s=1.0, num_layers=3,
        tp_bytes=8.0, shares=shares, tp=4, sequence_parallel=True, full_recompute=True,
    )  # fmt: skip
    plain = tp_backward_steps(**kwargs)  # type: ignore[arg-type]
    fused = tp_backward_steps(**kwargs, userbuffers=True)  # type: ignore[arg-type]
    # the rerun's scatters each run as two collectives (the pieces beside the GEMM, the last
    # piece after it): 2 x 2 x 3 calls of the same bytes
    assert comm_counts(plain) == {"all_gather": 6 + 12, "reduce_scatter": 6 + 6}
    assert comm_counts(fused) == {"all_gather": 6 + 12, "reduce_scatter": 12 + 6}
    end = next(i for i, s in enumerate(fused) if s.name == "recompute fwd")
    rerun_bytes = sum(
        s.size_bytes * s.repeat
        for s in fused[:end]
        if isinstance(s, CommStep) and s.op == "reduce_scatter"
    )
    assert rerun_bytes == pytest.approx(8.0 * 2 * 3)
    assert compute_total(fused) == pytest.approx(compute_total(plain)) == pytest.approx(15.0)
    # the rerun's QKV gather: a ring exchange beside the QKV GEMM (0.2 x 1 s x 3 = 0.6 s) in 4
    # pieces, then the projection's pipelined scatter (0.1 x 1 s x 3 = 0.3 s in 4 pieces)
    names = [s.name for s in fused[:7]]
    assert names == [
        "all_gather", "recompute fwd gemm 0", "recompute fwd gemm 0 last piece",
        "recompute fwd gemm 1 first piece", "reduce_scatter", "recompute fwd gemm 1",
        "reduce_scatter last piece",
    ]  # fmt: skip
    assert fused[1] == ComputeStep(name="recompute fwd gemm 0", duration_s=pytest.approx(0.45))
    assert fused[3] == ComputeStep(
        name="recompute fwd gemm 1 first piece", duration_s=pytest.approx(0.075)
    )
    assert isinstance(fused[4], CommStep) and fused[4].overlap and not fused[4].sm_free
    assert isinstance(fused[6], CommStep) and not fused[6].overlap  # waited for after the GEMM
    assert fused[6].size_bytes == pytest.approx(8.0 / 4)
    last = [s for s in fused if isinstance(s, ComputeStep) and s.name == "recompute fwd"]
    assert last == [ComputeStep(name="recompute fwd", duration_s=pytest.approx(3.0 * (1 - 0.8)))]
    # without userbuffers the rerun's collectives block after the recompute
    assert plain[0] == ComputeStep(name="recompute", duration_s=3.0)
    assert all(not s.overlap for s in plain[1:3] if isinstance(s, CommStep))


def test_userbuffers_first_forward_of_a_fully_recomputed_layer_gathers_before_its_gemms() -> None:
    # TE's LayerNormLinear turns the userbuffers gather off without autograd (no_grad)
    shares = LinearShares(forward=(0.2, 0.1, 0.4, 0.1))
    kwargs = dict(
        forward_s=1.0, num_layers=3, tp_bytes=8.0, tp=4, sequence_parallel=True,
        tp_comm_overlap=True, shares=shares, pipeline_chunks=4, userbuffers=True,
    )  # fmt: skip
    paired = tp_forward_steps(**kwargs)  # type: ignore[arg-type]
    blocked = tp_forward_steps(**kwargs, blocking_gathers=True)  # type: ignore[arg-type]
    assert comm_counts(blocked) == comm_counts(paired)
    assert compute_total(blocked) == pytest.approx(compute_total(paired)) == pytest.approx(3.0)
    gathers = [s for s in blocked if isinstance(s, CommStep) and s.op == "all_gather"]
    assert len(gathers) == 2 and not any(g.overlap for g in gathers)
    assert blocked[1] == ComputeStep(name="fwd gemm 0", duration_s=pytest.approx(0.6))
    # the scatters keep their userbuffers
    assert any(s.overlap for s in blocked if isinstance(s, CommStep))


def test_backward_without_sp_and_full_recompute_replays_the_forward_collectives() -> None:
    steps = tp_backward_steps(
        backward_input_s=1.0,
        backward_weight_s=1.0,
        recompute_s=0.5,
        num_layers=2,
        tp_bytes=8.0,
        shares=LinearShares(qkv=0.2, fc1=0.4),
        tp=2,
        full_recompute=True,
    )
    assert comm_counts(steps) == {"all_reduce": 4 + 4}
    assert compute_total(steps) == pytest.approx(2 * (1.0 + 1.0 + 0.5))


def test_zero_bubble_split_keeps_the_total_and_blocks_dgrad_collectives() -> None:
    kwargs = dict(
        backward_input_s=1.0,
        backward_weight_s=2.0,
        recompute_s=0.0,
        num_layers=2,
        tp_bytes=8.0,
        shares=LinearShares(qkv=0.2, fc1=0.4),
        tp=2,
    )
    bi = tp_backward_steps(**kwargs, split="input")  # type: ignore[arg-type]
    w = tp_backward_steps(**kwargs, split="weight")  # type: ignore[arg-type]
    assert compute_total(bi) + compute_total(w) == pytest.approx(6.0)
    assert w == (ComputeStep(name="wgrad", duration_s=4.0),)
    assert all(not s.overlap for s in bi if isinstance(s, CommStep))


@pytest.mark.parametrize(
    ("sequence_parallel", "recompute", "expected"),
    [
        (True, "none", {"all_gather": 2 * 3, "reduce_scatter": 2 * 3}),
        # per-op AC saves no norm output: both input all-gathers run again in the backward
        (True, "op", {"all_gather": 4 * 3, "reduce_scatter": 2 * 3}),
        # full AC replays the forward (2 AG + 2 RS), whose gathered inputs the backward then uses
        (True, "full", {"all_gather": 4 * 3, "reduce_scatter": 4 * 3}),
        (False, "none", {"all_reduce": 2 * 3}),
        # without SP, per-op AC reruns the attention output's all-reduce (the MLP norm's input)
        (False, "op", {"all_reduce": 3 * 3}),
        # full AC replays the forward's 2 all-reduces; nothing else is gathered again
        (False, "full", {"all_reduce": 4 * 3}),
    ],
)
def test_dtensor_backward_blocks_on_every_tp_collective(
    sequence_parallel: bool, recompute: str, expected: dict[str, int]
) -> None:
    layers = dict(
        backward_input_s=2.0,
        backward_weight_s=1.0,
        num_layers=3,
        tp_bytes=8.0,
        shares=LinearShares(qkv=0.25, fc1=0.5),
        tp=4,
        sequence_parallel=sequence_parallel,
        dtensor=True,
    )
    steps = tp_backward_steps(
        **layers,  # type: ignore[arg-type]
        recompute_s=0.0 if recompute == "none" else 0.5,
        full_recompute=recompute == "full",
        regather=recompute == "op",
    )
    assert comm_counts(steps) == expected
    assert all(not s.overlap for s in steps if isinstance(s, CommStep))
    recompute_s = 0.0 if recompute == "none" else 3 * 0.5
    assert compute_total(steps) == pytest.approx(3 * (2.0 + 1.0) + recompute_s)
    # the dgrad collective comes after the layer's input and weight gradients (one autograd node)
    last = steps[-1]
    assert isinstance(last, CommStep) and last.name.endswith("dgrad")
    # zero-bubble: the input pass keeps the blocking collectives, the weight pass has none
    bi = tp_backward_steps(**layers, recompute_s=0.0, split="input")  # type: ignore[arg-type]
    assert compute_total(bi) == pytest.approx(3 * 2.0)
    assert sum(comm_counts(bi).values()) == (4 if sequence_parallel else 2) * 3


def test_with_marks_splits_compute_at_bucket_fractions() -> None:
    steps = (ComputeStep(name="bwd", duration_s=3.0), ComputeStep(name="tail", duration_s=1.0))
    marked = with_marks(steps, (1.0, 2.0, 1.0))
    assert marked == (
        ComputeStep(name="bwd", duration_s=1.0),
        MarkStep(index=0),
        ComputeStep(name="bwd", duration_s=2.0),
        MarkStep(index=1),
        ComputeStep(name="tail", duration_s=1.0),
        MarkStep(index=2),
    )


def _grad_sync(kind: str, **knobs: object) -> GradSync:
    spec = DATA_PARALLEL[kind]
    assert spec.grad_sync is not None, kind
    return spec.grad_sync(ParallelConfig(data_parallel=kind, **knobs))  # type: ignore[arg-type]


def test_grad_sync_kinds() -> None:
    assert _grad_sync("ddp") == GradSync(op="all_reduce")
    dist = _grad_sync("distributed_optimizer", overlap_param_gather=True)
    assert (dist.op, dist.param_gather, dist.at_end) == ("reduce_scatter", "overlapped", False)
    assert _grad_sync("distributed_optimizer", overlap_grad_reduce=False).at_end
    zero2 = _grad_sync("zero2")
    assert zero2.every_microbatch and zero2.blocking and zero2.param_gather == "after_step"
    zero1 = _grad_sync("zero1", zero_overlap_comm=True)
    assert zero1.depth_one and not zero1.every_microbatch
    # the kinds that gather units reduce their own gradients: no pipeline grad sync
    assert [k for k, spec in DATA_PARALLEL.items() if spec.grad_sync is None] == [
        "zero3",
        "fsdp",
        "hsdp",
    ]


def unit_work() -> ChunkWork:
    return ChunkWork(
        forward=(ComputeStep(name="fwd", duration_s=1.0),),
        backward=(ComputeStep(name="bwd", duration_s=2.0),),
        grad_buckets_bytes=(1.0,),
    )


def test_pipeline_programs_pair_their_transfers() -> None:
    orders = one_f_one_b(2, 3)
    programs = [
        pipeline_program(
            PipelineRank(rank=r, order=orders[r], chunks=(unit_work(),), stage=r, pp=2,
                         prev_rank=1 - r, next_rank=1 - r, p2p_bytes=4.0)
        )
        for r in range(2)
    ]  # fmt: skip
    sends = {(a.src, a.dst, a.tag) for a in programs[0].actions if isinstance(a, Transfer)}
    recvs = {(a.src, a.dst, a.tag) for a in programs[1].actions if isinstance(a, Transfer)}
    assert sends == recvs
    assert {tag for _, _, tag in sends} == {(k, mb, s) for k, s in (("F", 1), ("B", 0))
                                          for mb in range(3)}  # fmt: skip
    computes = [a.name for a in programs[0].actions if isinstance(a, Compute)]
    assert computes == ["F0 fwd", "F1 fwd", "B0 bwd", "F2 fwd", "B1 bwd", "B2 bwd", "optimizer"]


def fsdp_spec(prefetch: str) -> FsdpRank:
    return FsdpRank(
        rank=0,
        num_microbatches=1,
        units=FsdpUnits(
            num_units=4,
            layer=unit_work(),
            unit_param_bytes=1.0,
            unit_grad_bytes=1.0,
            root_param_bytes=1.0,
            root_grad_bytes=1.0,
        ),
        groups={"dp": (0, 1)},
        backward_prefetch=prefetch,
    )


@pytest.mark.parametrize("prefetch", ["backward_pre", "backward_post"])
def test_fsdp_backward_fifo_order(prefetch: str) -> None:
    program = fsdp_program(fsdp_spec(prefetch))
    fifo = [a.name for a in program.actions if isinstance(a, Collective)]
    forward = ["AG root mb0", "AG u0 mb0", "AG u1 mb0", "AG u2 mb0", "AG u3 mb0"]
    backward = [
        "AG u3 mb0 bwd",  # root pre-backward prefetch: the root itself is not gathered
        "AG u2 mb0 bwd", "RS u3 mb0",
        "AG u1 mb0 bwd", "RS u2 mb0",
        "AG u0 mb0 bwd", "RS u1 mb0",
        "RS u0 mb0", "RS root mb0",
    ]  # fmt: skip
    assert fifo == forward + backward


def test_fsdp_rate_limiter_and_prefetch_dependencies() -> None:
    program = fsdp_program(fsdp_spec("backward_pre"))
    index = {a.name: i for i, a in enumerate(program.actions)}
    forward_u0 = index["F0 u0 fwd"]
    assert program.actions[index["AG u2 mb0"]].deps == (forward_u0,)
    # BACKWARD_PRE: AG(u-1) is issued before B(u), waiting on B(u+2) (the rate limiter)
    assert index["AG u0 mb0 bwd"] < index["B0 u1 bwd"]
    assert program.actions[index["AG u0 mb0 bwd"]].deps == (index["B0 u3 bwd"],)
    post = fsdp_program(fsdp_spec("backward_post"))
    post_index = {a.name: i for i, a in enumerate(post.actions)}
    # BACKWARD_POST: issued after B(u), the limiter makes it wait on B(u + 1)
    assert post_index["B0 u1 bwd"] < post_index["AG u0 mb0 bwd"] < post_index["RS u1 mb0"]
    assert post.actions[post_index["AG u0 mb0 bwd"]].deps == (post_index["B0 u2 bwd"],)


def test_shard_grad_op_gathers_only_in_forward_and_hsdp_adds_an_all_reduce() -> None:
    spec = fsdp_spec("backward_pre")
    keep = fsdp_program(
        FsdpRank(**{**_fields(spec), "reshard_after_forward": False})  # type: ignore[arg-type]
    )
    assert not any(a.name.endswith("bwd") and a.name.startswith("AG") for a in keep.actions)
    hsdp = fsdp_program(
        FsdpRank(**{**_fields(spec), "groups": {"dp": (0, 1), "hsdp": (0, 2)}})  # type: ignore[arg-type]
    )
    all_reduces = [a for a in hsdp.actions if isinstance(a, Collective) and a.group == "hsdp"]
    assert len(all_reduces) == 5
    assert all(a.size_bytes == 0.5 for a in all_reduces)  # the shard: grad bytes / shard size


def _fields(spec: FsdpRank) -> dict[str, object]:
    return {name: getattr(spec, name) for name in FsdpRank.__dataclass_fields__}


def test_host_step_waits_for_the_gpu_and_gates_what_follows() -> None:
    b = ProgramBuilder(rank=0, groups={"ep": (0, 1)})
    waits = b.run_steps(
        "F",
        (
            ComputeStep(name="fwd", duration_s=1.0),
            HostStep(name="sync", duration_s=0.1),
            CommStep(name="a2a", group="ep", op="all_to_all", size_bytes=8.0),
            ComputeStep(name="experts", duration_s=1.0),
        ),
    )
    _fwd, sync, a2a, experts = b.actions
    assert isinstance(sync, Compute) and (sync.stream, sync.deps) == ("host", (0,))
    assert a2a.deps == (0, 1)  # the all-to-all's splits are host values after the sync
    assert experts.deps == (1, 2)
    assert waits == [] and b.last_compute == 3
