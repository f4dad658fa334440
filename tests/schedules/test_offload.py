"""Offload keys, GPU memory drop, host bytes and host copies, against hand-computed values."""

import pytest

from schedules.data_parallel.registry import offload_of
from schedules.memory import memory_per_gpu, state_bytes_per_param
from schedules.offload import (
    Offload,
    RankOffload,
    fetch_copies,
    grad_copies,
    host_bytes,
    nvme_step_s,
    step_copies,
)
from schedules.plan import load_plan
from schedules.resolve import resolve_plan

GIB = 2**30


def plan_of(kind="zero2", b=2, **parallel):
    raw = {
        "model": {"preset": "llama2-13b"},
        "cluster": {"node": "dgx-h100"},
        "parallel": {"data_parallel": kind, **parallel},
        "training": {"micro_batch_size": b, "global_batch_size": 8 * b},
    }
    return resolve_plan(load_plan(raw), 8)


def test_gpu_states_drop_as_deepspeed_says():
    # ZeRO-Offload keeps only the bit16 parameters on the GPU (ZeRO-2: 2 + 14/8 -> 2 bytes).
    assert state_bytes_per_param(plan_of("zero2")) == {
        "weights": 2.0,
        "gradients": 2 / 8,
        "optimizer": 12 / 8,
    }
    offloaded = state_bytes_per_param(plan_of("zero2", offload_optimizer="cpu"))
    assert offloaded == {"weights": 2.0, "gradients": 0.0, "optimizer": 0.0}
    # ZeRO-1 reduces only at the boundary: its full bit16 gradients stay.
    zero1 = state_bytes_per_param(plan_of("zero1", offload_optimizer="cpu"))
    assert zero1 == {"weights": 2.0, "gradients": 2.0, "optimizer": 0.0}
    infinity = state_bytes_per_param(
        plan_of("zero3", offload_optimizer="nvme", offload_param="cpu")
    )
    assert infinity == {"weights": 0.0, "gradients": 0.0, "optimizer": 0.0}


def test_13b_on_8_gpus_fits_only_with_offload():
    hbm = 80 * GIB
    assert memory_per_gpu(plan_of("zero3"), hbm_bytes=hbm)["total"] > hbm
    for device in ("cpu", "nvme"):
        plan = plan_of("zero3", offload_optimizer=device)
        assert memory_per_gpu(plan, hbm_bytes=hbm)["total"] < hbm


def test_host_bytes_of_zero_offload():
    plan = plan_of("zero2", offload_optimizer="cpu")
    out = host_bytes(offload_of(plan.parallel), plan, params=8e9, shards=8, num_micro=1)
    largest = 32000 * 5120  # the embedding, bit16 staging buffer
    assert out == {
        "fp32_params": 4e9,
        "fp32_grads": 4e9,
        "optimizer": 8e9,
        "bit16": 0.0,
        "buffers": largest * 2,
    }
    accumulated = host_bytes(offload_of(plan.parallel), plan, params=8e9, shards=8, num_micro=4)
    assert accumulated["bit16"] == 2e9
    plain = plan_of("zero2")
    nothing = host_bytes(offload_of(plain.parallel), plain, params=8e9, shards=8, num_micro=1)
    assert set(nothing.values()) == {0.0}


def _offload(kind, optimizer="cpu", param="none"):
    stage = {"zero1": 1, "zero2": 2, "zero3": 3}.get(kind, 0)
    return Offload(zero_stage=stage, optimizer=optimizer, param=param, pin_memory=True)


def test_gradient_copies_per_bucket():
    bucket = dict(reduced_bytes=1e9, grad_bytes=2.0, shards=8)  # 5e8 elements, 6.25e7 each
    zero2 = _offload("zero2")
    assert grad_copies(zero2, microbatch=0, num_micro=1, **bucket) == (("d2h", 2.5e8),)
    assert grad_copies(zero2, microbatch=0, num_micro=2, **bucket) == (("d2h", 1.25e8),)
    last = grad_copies(zero2, microbatch=1, num_micro=2, **bucket)
    assert last == (("h2d", 1.25e8), ("d2h", 2.5e8))
    zero3 = _offload("zero3", "nvme")
    assert grad_copies(zero3, microbatch=0, num_micro=1, **bucket) == (
        ("d2h", 1.25e8),
        ("h2d", 1.25e8),
        ("d2h", 2.5e8),
        ("nvme_write", 2.5e8),
    )
    assert grad_copies(_offload("zero3", "none", "cpu"), microbatch=0, num_micro=1, **bucket) == ()


def test_fetch_and_step_copies():
    infinity = _offload("zero3", "cpu", "nvme")
    assert fetch_copies(infinity, gathered_bytes=8e8, shards=8) == (
        ("nvme_read", 1e8),
        ("h2d", 1e8),
    )
    assert step_copies(infinity, params=8e9, shards=8) == (("nvme_write", 2e9),)
    assert step_copies(_offload("zero2"), params=8e9, shards=8) == (("h2d", 4e9),)
    assert step_copies(_offload("zero3"), params=8e9, shards=8) == (("h2d", 2e9),)
    fsdp = _offload("fsdp", "cpu", "cpu")
    assert fetch_copies(fsdp, gathered_bytes=8e8, shards=8) == (("h2d", 2e8),)  # fp32 shard
    assert step_copies(fsdp, params=8e9, shards=8) == ()  # the CPU shards are updated in place


def test_fsdp_gradient_copies_are_fp32_and_fsdp2_adds_later_microbatches_on_the_host():
    # 1e9 bytes reduced in fp32 over 8 shards: 3.125e7 elements, copied as fp32
    bucket = dict(reduced_bytes=1e9, grad_bytes=4.0, shards=8)
    fsdp1 = Offload(zero_stage=0, optimizer="cpu", param="cpu", pin_memory=True)
    assert grad_copies(fsdp1, microbatch=0, num_micro=1, **bucket) == (("d2h", 1.25e8),)
    fsdp2 = Offload(zero_stage=0, optimizer="cpu", param="cpu", pin_memory=True, fsdp2=True)
    assert grad_copies(fsdp2, microbatch=0, num_micro=2, **bucket) == (("d2h", 1.25e8),)
    bf16 = {**bucket, "reduced_bytes": 5e8, "grad_bytes": 2.0}  # same elements, cast to fp32
    assert grad_copies(fsdp2, microbatch=1, num_micro=2, **bf16) == (
        ("d2h", 1.25e8),
        ("cpu_add", 3.125e7 * 12),
    )


def test_fsdp2_copies_block_the_host_as_foreach_reduce_says():
    def blocks(pin, microbatch, fsdp2=True):
        offload = Offload(zero_stage=0, optimizer="cpu", param="cpu", pin_memory=pin, fsdp2=fsdp2)
        rank = RankOffload(offload=offload, shards=8, grad_bytes=4.0, num_micro=2, params=1e9)
        return rank.blocks_host(microbatch)

    assert not blocks(True, 0)  # pinned, no CPU gradient yet: non_blocking
    assert blocks(True, 1) and blocks(False, 0)  # accumulating, or pageable
    assert not blocks(True, 1, fsdp2=False)  # FSDP1 (one micro-batch only) never blocks
    assert offload_of(plan_of("fsdp", fsdp_version=2, offload_param="cpu").parallel).fsdp2


def test_nvme_step_overlap():
    offload = _offload("zero3", "nvme")
    assert nvme_step_s(offload, read_s=3.0, cpu_s=1.0, write_s=2.0) == 6.0
    both = Offload(
        zero_stage=3,
        optimizer="nvme",
        param="none",
        pin_memory=True,
        pipeline_read=True,
        pipeline_write=True,
    )
    assert nvme_step_s(both, read_s=3.0, cpu_s=1.0, write_s=2.0) == 3.0


def test_framework_defaults():
    assert offload_of(plan_of("zero2").parallel) is None
    assert not offload_of(plan_of("zero2", offload_optimizer="cpu").parallel).pin_memory
    assert offload_of(plan_of("fsdp", offload_param="cpu").parallel).pin_memory


@pytest.mark.parametrize(
    ("parallel", "message"),
    [
        (
            {"data_parallel": "ddp", "offload_optimizer": "cpu"},
            "parallel.offload_optimizer='cpu' needs data_parallel zero1 | zero2 | zero3 | fsdp "
            "| hsdp",
        ),
        ({"data_parallel": "zero2", "offload_optimizer": "nvme"}, "needs data_parallel zero3"),
        ({"data_parallel": "zero1", "offload_param": "cpu"}, "only in stage 3"),
        ({"data_parallel": "fsdp", "offload_optimizer": "cpu"}, "offload_param='cpu'"),
        (
            {"data_parallel": "fsdp", "offload_param": "cpu", "offload_pin_memory": False},
            "FSDP1's CPUOffload(offload_params=True) always pins",
        ),
        ({"data_parallel": "zero3", "offload_pipeline_read": True}, "needs parallel.offload"),
        (
            {"data_parallel": "zero3", "offload_optimizer": "cpu", "offload_pipeline_read": True},
            "offload_optimizer='nvme'",
        ),
        ({"data_parallel": "zero3", "offload_optimizer": "disk"}, "none, cpu, nvme"),
    ],
)
def test_bad_offload_keys_are_one_line_errors(parallel, message):
    raw = {
        "model": {"preset": "llama2-13b"},
        "cluster": {"node": "dgx-h100"},
        "parallel": parallel,
        "training": {"micro_batch_size": 1, "global_batch_size": 8},
    }
    with pytest.raises(ValueError) as error:
        resolve_plan(load_plan(raw), 8)
    text = str(error.value)
    assert message in text and "\n" not in text
