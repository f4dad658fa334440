"""The data-parallel registry: one kind per framework, facts against the frameworks' own
numbers (ZeRO paper Sec. 3.1, torch DDP's and Megatron's bucket rules), checks with the
offending values."""

from __future__ import annotations

import dataclasses

import pytest

from schedules.buckets import MIB
from schedules.data_parallel.registry import (
    DATA_PARALLEL,
    check_data_parallel,
    data_parallel_kind,
    kinds_where,
    owners_of,
    replica_group_size,
)
from schedules.memory import state_bytes_per_param
from schedules.plan import DATA_PARALLEL_KINDS, ParallelConfig, load_plan
from schedules.resolve import resolve_plan


def plan_of(kind: str, world: int = 8, **parallel: object):
    raw = {
        "model": {"preset": "llama2-13b"},
        "cluster": {"node": "dgx-h100"},
        "parallel": {"data_parallel": kind, **parallel},
        "training": {"micro_batch_size": 1, "global_batch_size": world},
    }
    return resolve_plan(load_plan(raw), world)


def test_the_registry_holds_exactly_the_plan_choices_in_order() -> None:
    assert tuple(DATA_PARALLEL) == DATA_PARALLEL_KINDS
    assert all(kind.name == name for name, kind in DATA_PARALLEL.items())


def test_every_knob_is_a_parallel_field_owned_as_the_frameworks_have_it() -> None:
    fields = {f.name for f in dataclasses.fields(ParallelConfig)}
    for kind in DATA_PARALLEL.values():
        assert set(kind.knobs) <= fields, kind.name
    assert owners_of("ddp_bucket_mb") == ("ddp",)
    assert owners_of("zero_overlap_comm") == ("zero1", "zero2", "zero3")
    assert owners_of("zero_fetch") == ("zero3",)
    assert owners_of("fsdp_version") == ("fsdp", "hsdp")
    assert owners_of("hsdp_shard_size") == ("hsdp",)
    assert owners_of("overlap_param_gather") == ("distributed_optimizer",)
    assert owners_of("overlap_grad_reduce") == ()  # Megatron's and DDP's: everyone's knob


# bytes per parameter over 8 GPUs: weights, gradients, Adam (K = 12, ZeRO paper Sec. 3.1)
@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("ddp", {"weights": 2.0, "gradients": 2.0, "optimizer": 12.0}),
        ("zero1", {"weights": 2.0, "gradients": 2.0, "optimizer": 1.5}),
        ("zero2", {"weights": 2.0, "gradients": 0.25, "optimizer": 1.5}),
        ("zero3", {"weights": 0.25, "gradients": 0.25, "optimizer": 1.5}),
        ("fsdp", {"weights": 0.25, "gradients": 0.25, "optimizer": 1.5}),
        ("distributed_optimizer", {"weights": 2.0, "gradients": 4.0, "optimizer": 1.5}),
    ],
)
def test_state_bytes_follow_what_each_kind_shards(kind: str, expected: dict) -> None:
    assert state_bytes_per_param(plan_of(kind)) == expected


def test_ddp_under_autocast_keeps_fp32_weights_and_two_moments() -> None:
    raw = {
        "model": {"preset": "llama2-13b"},
        "cluster": {"node": "dgx-h100"},
        "parallel": {"data_parallel": "ddp"},
        "training": {"micro_batch_size": 1, "global_batch_size": 8,
                     "mixed_precision": "autocast"},
    }  # fmt: skip
    expected = {"weights": 4.0, "gradients": 4.0, "optimizer": 8.0}
    assert state_bytes_per_param(resolve_plan(load_plan(raw), 8)) == expected


def test_hsdp_shards_within_its_group_and_fsdp_over_everyone() -> None:
    hsdp = plan_of("hsdp", world=16, hsdp_shard_size=4)
    assert replica_group_size(hsdp) == 4
    assert state_bytes_per_param(hsdp)["optimizer"] == 12 / 4
    assert replica_group_size(plan_of("fsdp", world=16)) == 16
    node_wide = plan_of("hsdp", world=16, tp=2)  # shard size 0: a node's 8 GPUs / tp
    assert replica_group_size(node_wide, gpus_per_node=8) == 4
    with pytest.raises(ValueError, match="needs gpus_per_node"):
        replica_group_size(node_wide)


def test_buckets_as_each_framework_forms_them() -> None:
    ddp = DATA_PARALLEL["ddp"].buckets
    assert ddp is not None
    parallel = ParallelConfig(data_parallel="ddp")  # 25 MiB after a first 1 MiB bucket
    assert ddp(parallel, 0, 0, 60 * MIB) == (1 * MIB, 25 * MIB, 25 * MIB, 9 * MIB)
    megatron = DATA_PARALLEL["distributed_optimizer"].buckets
    assert megatron is not None
    wide = ParallelConfig(data_parallel="distributed_optimizer", dp=64)  # max(40M, 64M) elems
    assert megatron(wide, 0, 0, 600e6) == (256e6, 256e6, 88e6)  # fp32 gradients
    assert megatron(wide, 1, 0, 600e6) == (600e6,)  # later stages: one bucket
    zero = DATA_PARALLEL["zero2"].buckets
    assert zero is not None
    small = ParallelConfig(data_parallel="zero2", zero_bucket_elems=100)
    assert zero(small, 0, 0, 500.0) == (200.0, 200.0, 100.0)  # bf16 elements


def test_facts_that_replace_name_comparisons() -> None:
    assert kinds_where("gathers_units") == ("zero3", "fsdp", "hsdp")
    assert kinds_where("moe") == ("ddp", "zero1", "zero2", "fsdp", "distributed_optimizer")
    assert kinds_where("torch_fsdp") == ("fsdp", "hsdp")
    assert [k for k, v in DATA_PARALLEL.items() if v.check_offload] == [
        "zero1",
        "zero2",
        "zero3",
        "fsdp",
        "hsdp",
    ]
    assert {k: v.program for k, v in DATA_PARALLEL.items() if v.program != "pipeline"} == {
        "zero3": "zero3",
        "fsdp": "fsdp",
        "hsdp": "fsdp",
    }
    assert data_parallel_kind("distributed_optimizer").default_stack == "megatron"
    fsdp = ParallelConfig(data_parallel="fsdp", fsdp_version=2)
    assert data_parallel_kind(fsdp).short_name(fsdp) == "fsdp2"
    assert data_parallel_kind(fsdp).reduce_bytes_per_param(fsdp) == 4.0  # FSDP2: fp32 reduce
    with pytest.raises(ValueError, match="'nosuch' is not one of ddp, zero1"):
        data_parallel_kind("nosuch")


def test_checks_name_the_kind_and_the_values() -> None:
    with pytest.raises(ValueError, match=r"ddp_bucket_mb=50\.0 applies only to data_parallel ddp"):
        check_data_parallel(ParallelConfig(data_parallel="zero1", ddp_bucket_mb=50.0), 8)
    with pytest.raises(ValueError, match="data_parallel=zero2 cannot run under pipeline"):
        check_data_parallel(ParallelConfig(data_parallel="zero2", pp=2), 4)
    with pytest.raises(ValueError, match="hsdp_shard_size=3 must divide dp=8"):
        check_data_parallel(ParallelConfig(data_parallel="hsdp", hsdp_shard_size=3), 8)
    check_data_parallel(ParallelConfig(data_parallel="zero1", pp=2), 4)  # ZeRO-1 pipelines
