"""``simulate_plan``: one training step of a plan on a cluster, as a ``PlanResult``.

It resolves the plan on its cluster, replays the step (``sim.replay.step_replay`` on the SimPy
engine with the network model ``sim.network.comm_model.CommModel`` and the compute model
``sim.compute.compute_model.ComputeModel``), and assembles the answer: step time (the latest rank),
tokens/s, model TFLOP/s per GPU and MFU (FLOPs as ``schedules.arithmetic.model_flops_per_step``
defines them, against the GPU's dense peak for the plan's precision), the memory per GPU of the
worst stage, and the breakdown of the critical rank: compute, exposed communication per group,
optimizer, and the remaining idle time as the pipeline bubble.

    result = simulate_plan(load_plan("plan.yaml"))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import simpy

from schedules.arithmetic import model_flops_per_step
from schedules.flops import hardware_flops_per_step
from schedules.kernels import kernel_stack
from schedules.memory import reserved_bytes
from schedules.moe import load_factor
from schedules.params import active_params, total_params
from schedules.plan import Plan, num_microbatches
from schedules.resolve import resolve_plan
from schedules.stacks import stack_source
from schedules.step import describe_step
from sim.compute.compute_model import ComputeModel
from sim.network.calibration import Calibration
from sim.network.comm_model import CommModel
from sim.replay.basis import bottleneck, compute_basis, network_basis
from sim.replay.engine import ClosedFormRunner, Timeline
from sim.replay.offload import offload_replay, offload_summary
from sim.replay.result import Breakdown, PlanResult
from sim.replay.step_replay import replay_plan
from topologies.config import load_cluster
from topologies.topology import Topology
from vocab.compute_calibration import ComputeCalibration

GIB = 2**30
"""Bytes per GiB (memory figures)."""


def plan_topology(plan: Plan) -> Topology:
    """The plan's cluster (a relative cluster file is read beside the plan file)."""
    source = plan.cluster.source()
    if isinstance(source, str) and plan.base_dir:
        source = str(Path(plan.base_dir) / source)
    return load_cluster(source)


def breakdown_of(timeline: Timeline, rank: int | None = None) -> Breakdown:
    """Where the step went on ``rank`` (default: the critical rank, the last to finish)."""
    chosen = timeline.critical_rank if rank is None else rank
    times = timeline.ranks[chosen]
    step_s = timeline.step_time_s
    exposed = dict(times.exposed_comm_s)
    host_s = exposed.pop("host", 0.0)
    bubble_s = step_s - times.compute_s - times.optimizer_s - sum(exposed.values()) - host_s
    return Breakdown(
        compute_s=times.compute_s,
        exposed_comm_s=exposed,
        bubble_s=max(bubble_s, 0.0),
        optimizer_s=times.optimizer_s,
        overlap_slowdown_s=times.overlap_slowdown_s,
        host_s=host_s,
    )


def _peak_flops_per_s(plan: Plan, topology: Topology) -> float:
    peaks = topology.gpu_spec(0).peak_flops_per_s
    precision = plan.training.precision
    if precision not in peaks:
        raise ValueError(
            f"GPU {topology.gpu_spec(0).name} has no {precision} peak; it has {', '.join(peaks)}"
        )
    return float(peaks[precision])


def simulate_plan(
    plan: Plan,
    *,
    topology: Topology | None = None,
    comm_calibration: Calibration | None = None,
    compute_calibration: ComputeCalibration | None = None,
    fidelity: str = "analytical",
    fold: bool = True,
) -> PlanResult:
    """Simulate one steady-state training step of ``plan`` (resolved here on its cluster)."""
    topology = plan_topology(plan) if topology is None else topology
    plan = resolve_plan(plan, topology.num_gpus)
    step = describe_step(plan, gpus_per_node=topology.gpus_per_node)
    gpu = topology.gpu_spec(0)
    env = simpy.Environment()
    comm = CommModel(env, topology, fidelity=fidelity, calibration=comm_calibration)
    compute = ComputeModel(gpu, compute_calibration, distributed=topology.num_gpus > 1)
    runner = ClosedFormRunner(env, comm.estimate_s) if comm.network is None else comm
    host = offload_replay(plan, topology, calibration=compute_calibration)
    timeline = replay_plan(step, env=env, comm=runner, compute=compute, fold=fold, host=host)
    step_s = timeline.step_time_s
    flops, definition = model_flops_per_step(plan)
    tflops_per_gpu = flops / step_s / topology.num_gpus / 1e12
    memory = step.memory
    tokens = plan.training.global_batch_size * plan.model.seq_len
    peak = _peak_flops_per_s(plan, topology)
    hardware = hardware_flops_per_step(plan) / step_s / topology.num_gpus
    breakdown = breakdown_of(timeline)
    memory = {**memory, "reserved": reserved_bytes(memory["total"])}
    fits = memory["reserved"] <= gpu.hbm_bytes
    stack = kernel_stack(plan)
    return PlanResult(
        step_time_s=step_s,
        tokens_per_s=tokens / step_s,
        tflops_per_gpu=tflops_per_gpu,
        mfu=tflops_per_gpu * 1e12 / peak,
        hfu=hardware / peak,
        flops_definition=definition,
        memory_gib={k: v / GIB for k, v in memory.items()},
        fits_in_memory=fits,
        breakdown=breakdown,
        basis={
            "compute": compute_basis(compute, stack, stack_source(plan)),
            "network": network_basis(comm_calibration),
            "stack": stack,
        },
        bottleneck=bottleneck(breakdown, step_s, fits=fits, pipeline=plan.parallel.pp > 1),
        num_gpus=topology.num_gpus,
        num_simulated_ranks=len(timeline.ranks),
        spans=timeline.spans,
        offload={}
        if host is None
        else offload_summary(plan, topology, host, timeline.spans, timeline.critical_rank),
        extra={
            "num_microbatches": num_microbatches(plan),
            "critical_rank": timeline.critical_rank,
            "fidelity": fidelity,
            "folded": fold,
            **moe_summary(plan),
        },
    )


def moe_summary(plan: Plan) -> dict[str, Any]:
    """Parameters and routing of an MoE plan for the JSON result (empty for a dense model)."""
    model, par = plan.model, plan.parallel
    if not model.num_experts:
        return {}
    return {
        "params": total_params(model),
        "active_params": active_params(model),
        "moe": {
            "num_experts": model.num_experts,
            "top_k": model.moe_top_k,
            "ep": par.ep,
            "etp": par.expert_tp,
            "dispatcher": par.moe_token_dispatcher,
            "imbalance": model.moe_imbalance,
            "busiest_gpu_load": load_factor(model, par),
        },
    }
