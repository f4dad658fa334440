"""Offload on the replay: PCIe shares off the topology, CPU Adam, NVMe, the 13B examples
(DeepSpeed ZeRO-3, FSDP2), FSDP1 and FSDP2 CPU offload end to end."""

from pathlib import Path

import pytest
import simpy

from schedules.plan import load_plan
from schedules.resolve import resolve_plan
from sim.output.offload_report import offload_lines
from sim.replay.offload import (
    COPY_LATENCY_S,
    HostCopyRunner,
    copy_time_s,
    host_rates,
    offload_replay,
    pcie_bytes_per_s,
)
from sim.replay.simulate import simulate_plan
from topologies.presets import build_cluster
from vocab.compute_calibration import ComputeCalibration

EXAMPLE = Path(__file__).parents[3] / "examples" / "llama2-13b-offload-8xh100.yaml"
PARAMS_13B = 13_015_864_320  # Llama 2 13B (schedules.params)


def plan_of(kind="zero3", node="dgx-h100", micro_batch_size=2, **parallel):
    raw = {
        "model": {"preset": "llama2-13b"},
        "cluster": {"node": node},
        "parallel": {"data_parallel": kind, **parallel},
        "training": {"micro_batch_size": micro_batch_size, "global_batch_size": 16},
    }
    return load_plan(raw)


def test_two_gpus_behind_one_switch_share_its_uplink():
    topology = build_cluster("dgx-h100")
    # Gen5 x16 at NCCL's 48 GB/s effective; 2 GPUs per switch (4 switches, 8 GPUs).
    assert pcie_bytes_per_s(topology, 0) == pytest.approx(24e9)
    one = build_cluster("dgx-h100", gpus_per_node=4)  # one GPU per switch
    assert pcie_bytes_per_s(one, 0) == pytest.approx(48e9)


def test_host_rates_from_the_catalogue():
    topology = build_cluster("dgx-h100")
    plan = resolve_plan(plan_of(offload_optimizer="nvme", offload_pin_memory=True), 8)
    rates = host_rates(topology, plan)
    assert rates.adam_bytes_per_s == pytest.approx(2 * 307.2e9 * 0.75 / 8)
    assert rates.nvme_read_bytes_per_s == pytest.approx(8 * 7.0e9 / 8)
    assert rates.nvme_write_bytes_per_s == pytest.approx(8 * 3.8e9 / 8)
    pageable = host_rates(topology, resolve_plan(plan_of(offload_optimizer="cpu"), 8))
    assert pageable.d2h_bytes_per_s == pytest.approx(12e9)
    assert copy_time_s(rates, "d2h", 24e9) == pytest.approx(1.0 + COPY_LATENCY_S)


def test_measured_adam_rate_replaces_the_catalogue():
    topology = build_cluster("dgx-h100")
    plan = resolve_plan(plan_of(offload_optimizer="cpu"), 8)
    measured = ComputeCalibration(cpu_adam_params_per_s=8e9)
    rates = host_rates(topology, plan, calibration=measured)
    assert rates.adam_bytes_per_s == pytest.approx(8e9 * 28 / 8)
    replay = offload_replay(plan, topology, calibration=measured)
    # bf16: 28 B/param of CPU Adam on P/8 parameters at 1e9 params/s per rank.
    assert replay.optimizer_s[0] == pytest.approx(PARAMS_13B / 8 / 1e9, rel=1e-6)


def test_runner_times_copies_and_passes_collectives_on():
    env = simpy.Environment()
    seen = []

    class Inner:
        def run(self, op, ranks, size_bytes):
            seen.append(op)
            return env.timeout(1.0)

    rates = host_rates(build_cluster("dgx-h100"), resolve_plan(plan_of(), 8))
    runner = HostCopyRunner(env, Inner(), rates)
    runner.run("h2d", (0,), 24e9)
    runner.run("all_gather", (0, 1), 1e6)
    assert seen == ["all_gather"]


def test_example_fits_only_with_offload_and_reports_the_host_side():
    offloaded = simulate_plan(load_plan(EXAMPLE))
    assert offloaded.fits_in_memory
    summary = offloaded.offload
    part = PARAMS_13B / 8
    # ZeRO-3: bit16 slice to the host and back per bucket, fp32 slice at the boundary; the
    # updated bit16 partition to the GPU after the step.
    assert summary["pcie_d2h_bytes_per_gpu"] == pytest.approx(6 * part, rel=1e-9)
    assert summary["pcie_h2d_bytes_per_gpu"] == pytest.approx(4 * part, rel=1e-9)
    assert summary["cpu_optimizer_s"] == pytest.approx(part * 28 / (2 * 230.4e9 / 8))
    memory = summary["host_memory_bytes_per_node"]
    assert memory["total"] == pytest.approx(8 * 18 * part)  # 16 fp32 + 2 bit16 grads
    assert summary["host_fits"] is True
    plain = simulate_plan(plan_of())
    assert not plain.fits_in_memory and not plain.offload
    assert "offload" in offloaded.to_json() and "offload" not in plain.to_json()


def test_zero2_copies_follow_their_buckets():
    result = simulate_plan(plan_of("zero2", offload_optimizer="cpu", zero_overlap_comm=True))
    spans = [s for s in result.spans if s.rank == 0]
    reduces = [s for s in spans if s.stream == "dp" and "bucket" in s.name]
    copies = [s for s in spans if s.stream == "d2h"]
    assert len(copies) == len(reduces) > 1
    for reduce, copy in zip(reduces, copies, strict=True):
        assert copy.start_s >= reduce.end_s  # the slice leaves once its bucket is reduced
    assert sum(s.size_bytes for s in copies) == pytest.approx(4 * PARAMS_13B / 8, rel=1e-9)


def test_nvme_needs_drives_and_a_cpu_model():
    with pytest.raises(ValueError, match="cpu_model"):
        simulate_plan(plan_of(node="pcie-h100", offload_optimizer="cpu"))


FSDP2_EXAMPLE = EXAMPLE.with_name("llama2-13b-fsdp2-offload-8xh100.yaml")
EMBED_13B = 32000 * 5120
HEAD_13B = EMBED_13B + 5120  # torchtitan's [norm, output] unit


def test_fsdp2_example_fits_only_with_offload_and_moves_every_shard():
    offloaded = simulate_plan(load_plan(FSDP2_EXAMPLE))
    plain = simulate_plan(plan_of("fsdp", fsdp_version=2))
    assert offloaded.fits_in_memory and not plain.fits_in_memory
    assert offloaded.memory_gib["total"] < plain.memory_gib["total"] - 20
    summary = offloaded.offload
    assert summary["framework"] == "FSDP2 CPUOffloadPolicy(pin_memory=True)"
    # every unit's fp32 shard comes in before its forward and its backward all-gather, except
    # [norm, output], kept unsharded after forward; every fp32 gradient shard goes out once
    h2d = 4 * (2 * PARAMS_13B - HEAD_13B) / 8
    assert summary["pcie_h2d_bytes_per_gpu"] == pytest.approx(h2d, rel=1e-12)
    assert summary["pcie_d2h_bytes_per_gpu"] == pytest.approx(4 * PARAMS_13B / 8, rel=1e-12)
    # torch.optim AdamW over the rank's shard on the CPU: 28 bytes per parameter at its share
    # of the two sockets' sustained bandwidth
    assert summary["cpu_optimizer_s"] == pytest.approx(PARAMS_13B / 8 * 28 / (2 * 230.4e9 / 8))
    assert summary["host_memory_bytes_per_node"]["total"] == pytest.approx(16 * PARAMS_13B)
    assert offloaded.step_time_s > plain.step_time_s + summary["cpu_optimizer_s"] * 0.99
    assert "offload" in offloaded.to_json()


def test_fsdp2_copies_wait_for_their_collectives_and_the_cpu_step_for_the_last_copy():
    result = simulate_plan(load_plan(FSDP2_EXAMPLE))
    spans = {s.name: s for s in result.spans if s.rank == 0}
    gathers = [s for s in spans.values() if s.name.startswith("AG ")]
    reduces = [s for s in spans.values() if s.name.startswith("RS ")]
    assert len(gathers) == 2 * 42 - 1 and len(reduces) == 42  # embed, 40 layers, head
    for gather in gathers:
        assert gather.start_s >= spans[f"h2d {gather.name[3:]}"].end_s
    for reduce in reduces:
        assert spans[f"d2h {reduce.name[3:]}"].start_s >= reduce.end_s
    copies = [s for s in spans.values() if s.stream == "d2h"]
    assert spans["optimizer"].start_s >= max(s.end_s for s in copies)
    assert spans["optimizer"].end_s - spans["optimizer"].start_s == pytest.approx(
        result.offload["cpu_optimizer_s"]
    )


def test_fsdp1_offload_replays_and_its_cpu_step_follows_a_measured_rate():
    measured = ComputeCalibration(cpu_adam_params_per_s=8e9)
    result = simulate_plan(plan_of("fsdp", offload_param="cpu"), compute_calibration=measured)
    summary = result.offload
    assert summary["framework"] == "FSDP1 CPUOffload(offload_params=True)"
    # FSDP1's root (embedding, norm, head) stays gathered after forward
    h2d = 4 * (2 * PARAMS_13B - EMBED_13B - HEAD_13B) / 8
    assert summary["pcie_h2d_bytes_per_gpu"] == pytest.approx(h2d, rel=1e-12)
    assert summary["cpu_optimizer_s"] == pytest.approx(PARAMS_13B / 8 / 1e9, rel=1e-9)
    with pytest.raises(ValueError, match="no_sync is not modelled"):
        simulate_plan(plan_of("fsdp", offload_param="cpu", micro_batch_size=1))


def test_fsdp2_accumulation_adds_on_the_cpu_and_pageable_copies_cost_more():
    pinned = simulate_plan(plan_of("fsdp", fsdp_version=2, offload_param="cpu", micro_batch_size=1))
    # micro-batch 1 adds its fp32 shards into the CPU gradients: 12 bytes per element
    adam_bytes_per_s = 2 * 230.4e9 / 8
    add_s = PARAMS_13B / 8 * 12 / adam_bytes_per_s
    assert pinned.offload["cpu_grad_accumulate_s"] == pytest.approx(add_s, rel=1e-9)
    assert pinned.offload["pcie_d2h_bytes_per_gpu"] == pytest.approx(8 * PARAMS_13B / 8)
    lines = offload_lines(pinned.offload)
    assert lines[0].startswith("Offload (FSDP2 CPUOffloadPolicy(pin_memory=True): ")
    assert any(line.startswith("  CPU gradient accumulation 339.0 ms") for line in lines)
    pageable = simulate_plan(
        plan_of("fsdp", fsdp_version=2, offload_param="cpu", offload_pin_memory=False)
    )
    assert pageable.offload["pcie_d2h_bytes_per_s_per_gpu"] == pytest.approx(12e9)
    plain = simulate_plan(plan_of("fsdp", fsdp_version=2, offload_param="cpu"))
    assert pageable.step_time_s > plain.step_time_s
