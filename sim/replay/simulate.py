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

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import simpy

from schedules.arithmetic import model_flops_per_step
from schedules.flops import hardware_flops_per_step
from schedules.kernels import kernel_stack
from schedules.memory import reserved_bytes
from schedules.moe import is_moe_layer, load_factor
from schedules.params import active_params, total_params
from schedules.plan import Plan, num_microbatches
from schedules.resolve import resolve_plan
from schedules.stacks import stack_source
from schedules.step import StepDescription, describe_step
from schedules.whatif import SecondJob, WhatIf
from sim.compute.compute_model import ComputeModel, launch_loop
from sim.network.calibration import Calibration
from sim.network.comm_model import CommModel
from sim.replay.basis import bottleneck, compute_basis, host_basis, network_basis
from sim.replay.engine import ClosedFormRunner, Timeline
from sim.replay.flowing_jobs import start_flowing_jobs
from sim.replay.folding import representative_of
from sim.replay.offload import offload_replay, offload_summary
from sim.replay.result import Breakdown, PlanResult
from sim.replay.step_replay import replay_plan
from sim.replay.whatif import (
    bursty_jobs,
    bursty_runner,
    calm_topology,
    check_whatif,
    collective_jobs,
    culprits,
    degraded_topology,
    link_signatures,
    signatures,
    slowdowns,
    special_ranks,
    toggle_bursts,
    whatif_ranks,
)
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


def breakdown_of(
    timeline: Timeline, rank: int | None = None, *, in_step_slowdown: float = 0.0
) -> Breakdown:
    """Where the step went on ``rank`` (default: the critical rank, the last to finish); the
    compute model's ``in_step_slowdown`` sizes its share of the compute time."""
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
        in_step_slowdown_s=times.kernel_s * in_step_slowdown / (1.0 + in_step_slowdown),
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
    rank_breakdowns: bool = False,
) -> PlanResult:
    """Simulate one steady-state training step of ``plan`` (resolved here on its cluster),
    with its what-ifs (``plan.whatif``) applied; ``rank_breakdowns`` also keeps where the step
    went on every simulated rank (``extra["rank_breakdowns"]``)."""
    topology = plan_topology(plan) if topology is None else topology
    plan = with_imbalance(plan)
    plan = resolve_plan(plan, topology.num_gpus)
    step = describe_step(plan, gpus_per_node=topology.gpus_per_node)
    whatif = plan.whatif
    check_whatif(whatif, topology)
    flowing: tuple[SecondJob, ...] = ()
    if any(job.op is not None for job in whatif.second_job):
        alone = CommModel(simpy.Environment(), topology, calibration=comm_calibration)
        whatif = collective_jobs(whatif, topology, alone.estimate_s)
        if fidelity == "flow":  # its collectives' own flows, not a share and bursts
            jobs = tuple(
                dataclasses.replace(j, flow_by_flow=True) if j.op else j for j in whatif.second_job
            )
            whatif = dataclasses.replace(whatif, second_job=jobs)
            flowing = tuple(j for j in jobs if j.flow_by_flow)
            fold = False  # its flows meet every rank's
    simulated = dataclasses.replace(
        whatif, second_job=tuple(j for j in whatif.second_job if not j.flow_by_flow)
    )
    if whatif.links and fidelity == "flow":
        # which ranks' flows cross the link depends on the routes of every rank: none folded
        fold = False
    plain, topology = topology, degraded_topology(topology, simulated)
    signed = signatures(simulated, plain, topology)
    if whatif.links:  # analytical: each group at its rail flows' rate (``fabric_factor``)
        signed = {**signed, **link_signatures(step.layout, topology, signed)}
    special = special_ranks(signed, plain)
    # the GPUs of the servers a flowing job shares, unless it shares every server alike
    shared = {n for job in flowing for n in job.nodes}
    if shared and len(shared) < plain.num_nodes:
        special |= {r for r in range(plain.num_gpus) if plain.node_index(r) in shared}
    gpu = topology.gpu_spec(0)
    env = simpy.Environment()
    bursts = bursty_jobs(simulated)
    # with bursts the flow model starts from the links free of them and re-rates at each edge
    network_topology = (
        calm_topology(plain, simulated) if bursts and fidelity == "flow" else topology
    )
    comm = CommModel(env, network_topology, fidelity=fidelity, calibration=comm_calibration)
    compute = ComputeModel(gpu, compute_calibration, distributed=topology.num_gpus > 1)
    runner = ClosedFormRunner(env, comm.estimate_s) if comm.network is None else comm
    # a second job run flow by flow stops with the step (``finished``), and bursts with it
    finished = env.event() if flowing and comm.network is not None else None
    if bursts and comm.network is not None:
        toggle_bursts(env, comm.network, simulated, plain, stop=finished)
    elif bursts:

        def estimate_on(degraded: Topology) -> Callable[..., float]:
            return CommModel(env, degraded, calibration=comm_calibration).estimate_s

        runner = bursty_runner(env, simulated, plain, estimate_on)
    job_runs = start_flowing_jobs(env, comm, flowing, finished) if finished is not None else []
    host = offload_replay(plan, topology, calibration=compute_calibration)
    ranks = whatif_ranks(step.layout, signed, fold=fold, by_classes=follows_axes(step))
    timeline = replay_plan(
        step, env=env, comm=runner, compute=compute, fold=fold, host=host, ranks=ranks,
        slowdowns=slowdowns(simulated, topology), finished=finished,
    )  # fmt: skip
    step_s = timeline.step_time_s
    flops, definition = model_flops_per_step(plan)
    tflops_per_gpu = flops / step_s / topology.num_gpus / 1e12
    memory = step.memory
    tokens = plan.training.global_batch_size * plan.model.seq_len
    peak = _peak_flops_per_s(plan, topology)
    hardware = hardware_flops_per_step(plan) / step_s / topology.num_gpus
    breakdown = breakdown_of(timeline, in_step_slowdown=compute.in_step_slowdown)
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
            "compute": compute_basis(
                compute, stack, stack_source(plan), cuda_graphs=plan.training.cuda_graphs
            ),
            "network": network_basis(comm_calibration),
            "stack": stack,
            **_host_basis(compute, plan, breakdown, step_s),
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
            **(
                {
                    "whatif": whatif_summary(
                        whatif,
                        special,
                        timeline,
                        culprits(whatif, topology),
                        like=lambda r: representative_of(step.layout, r) if fold else r,
                        in_step_slowdown=compute.in_step_slowdown,
                        job_runs=job_runs,
                    )
                }
                if whatif
                else {}
            ),
            **(
                {
                    "rank_breakdowns": {
                        str(r): _breakdown(timeline, r, compute.in_step_slowdown)
                        for r in timeline.ranks
                    }
                }
                if rank_breakdowns
                else {}
            ),
        },
    )


def _host_basis(
    compute: ComputeModel, plan: Plan, breakdown: Breakdown, step_s: float
) -> dict[str, str]:
    """``{"host": ...}`` when the step waits on its host enough for the launch cost to matter
    (``sim.replay.basis.host_basis``), else nothing."""
    share = breakdown.host_s / step_s if step_s else 0.0
    line = host_basis(compute, launch_loop(plan), share, cuda_graphs=plan.training.cuda_graphs)
    return {"host": line} if line else {}


def with_imbalance(plan: Plan) -> Plan:
    """The plan with its what-if's MoE imbalance in the model (checked against the model); a
    per-layer one is checked and left to the step's chunks (``schedules.moe.mean_hottest``)."""
    imbalance = plan.whatif.moe_imbalance
    per_layer = plan.whatif.moe_layer_imbalance
    if (imbalance is not None or per_layer) and not plan.model.num_experts:
        raise ValueError("whatif moe_imbalance: the model has no experts (model.num_experts)")
    for layer, factor in per_layer:
        if layer >= plan.model.num_layers or not is_moe_layer(plan.model, layer):
            raise ValueError(
                f"whatif moe_imbalance: layer {layer} is not an MoE layer of the model "
                f"({plan.model.num_layers} layers; MoE ones from layer "
                f"{plan.model.moe_first_dense_layers}, every {plan.model.moe_layer_freq})"
            )
        if factor > plan.model.num_experts:
            raise ValueError(
                f"whatif moe_imbalance[{layer}]={factor:g}: at most the number of experts "
                f"({plan.model.num_experts}: every token on one expert)"
            )
    if imbalance is None:
        return plan
    if imbalance > plan.model.num_experts:
        raise ValueError(
            f"whatif moe_imbalance={imbalance:g}: at most the number of experts "
            f"({plan.model.num_experts}: every token on one expert)"
        )
    model = dataclasses.replace(plan.model, moe_imbalance=imbalance)
    return dataclasses.replace(plan, model=model)


def follows_axes(step: StepDescription) -> bool:
    """Whether every process group of the step is a whole tp, cp, dp or pp axis (or a product
    of them), so that a what-if's classes can fold its ranks (``folding.class_ranks``): not with
    expert parallelism or HSDP's shard groups, which slice the dp axis."""
    par = step.plan.parallel
    hsdp = step.kind.gathers_units and step.replica_group_size // par.cp < par.dp
    return par.ep <= 1 and not hsdp


def _breakdown(timeline: Timeline, rank: int, in_step_slowdown: float) -> dict[str, Any]:
    return dataclasses.asdict(breakdown_of(timeline, rank, in_step_slowdown=in_step_slowdown))


def whatif_summary(
    whatif: WhatIf,
    special: set[int],
    timeline: Timeline,
    culprits: list[int],
    *,
    like: Callable[[int], int],
    in_step_slowdown: float = 0.0,
    job_runs: Sequence[Sequence[tuple[float, float]]] = (),
) -> dict[str, Any]:
    """The what-if for the JSON result: its changes, the ranks it singles out (``culprits``
    first: the slowed GPUs and those behind a changed NIC), and where the step went on the
    simulated ranks (culprits, then the other singled-out ones, then the rest; at most
    ``MAX_WHATIF_RANKS``), each with the rank of the plain step it compares with (``like``: its
    representative there)."""
    first = {r: i for i, r in enumerate(culprits)}
    simulated = sorted(
        timeline.ranks, key=lambda r: (r not in first, first.get(r, 0), r not in special, r)
    )
    collective = [
        {
            "nodes": list(job.nodes),
            "op": job.op,
            "share": job.share,
            "busy": job.busy,
            "collective_ms": job.collective_s * 1e3,
        }
        for job in whatif.second_job
        if job.op is not None and job.collective_s is not None and not job.flow_by_flow
    ]
    flowing = [
        {
            "nodes": list(job.nodes),
            "op": job.op,
            "collective_alone_ms": (job.collective_s or 0.0) * 1e3,
            "runs_ms": [[a * 1e3, b * 1e3] for a, b in runs],
        }
        for job, runs in zip(
            [j for j in whatif.second_job if j.flow_by_flow], job_runs, strict=True
        )
    ]
    return {
        **whatif.to_dict(),
        **({"second_job_as_bursts": collective} if collective else {}),
        **({"second_job_flows": flowing} if flowing else {}),
        "changes": whatif.describe(),
        "culprits": culprits,
        "singled_out_ranks": sorted(special),
        "ranks": {
            str(r): {
                "singled_out": r in special,
                "like_rank": like(r),
                **_breakdown(timeline, r, in_step_slowdown),
            }
            for r in simulated[:MAX_WHATIF_RANKS]
        },
    }


MAX_WHATIF_RANKS = 64
"""Most ranks whose breakdown a what-if result lists."""


def compare_whatif(plan: Plan, result: PlanResult, **options: Any) -> dict[str, Any]:
    """The step without ``plan``'s what-ifs (same options as ``simulate_plan``) and what changed:
    the step time, and per listed rank the change of its compute (kernels, with the overlap
    slowdown), its optimizer (with the waits it includes) and its waits per group, against the
    same rank of the plain step (its representative there when folded)."""
    options = {**options, "rank_breakdowns": True}
    flowing = any(job.op is not None for job in plan.whatif.second_job)
    if (plan.whatif.links or flowing) and options.get("fidelity") == "flow":
        options["fold"] = False  # the what-if ran every rank (its flows' routes set the load)
    baseline = simulate_plan(dataclasses.replace(plan, whatif=WhatIf()), **options)
    plain = baseline.extra["rank_breakdowns"]
    ranks = {}
    for rank, row in result.extra["whatif"]["ranks"].items():
        base = plain[str(row["like_rank"])]
        groups = sorted(set(row["exposed_comm_s"]) | set(base["exposed_comm_s"]))
        ranks[rank] = {
            "singled_out": row["singled_out"],
            "compared_with_rank": row["like_rank"],
            "compute_s": row["compute_s"] - base["compute_s"],
            "optimizer_s": row["optimizer_s"] - base["optimizer_s"],
            "waits_s": {
                g: row["exposed_comm_s"].get(g, 0.0) - base["exposed_comm_s"].get(g, 0.0)
                for g in groups
            },
            "bubble_s": row["bubble_s"] - base["bubble_s"],
            "host_s": row["host_s"] - base["host_s"],
        }
    return {
        "without_step_time_s": baseline.step_time_s,
        "delta_s": result.step_time_s - baseline.step_time_s,
        "delta_pct": (result.step_time_s / baseline.step_time_s - 1.0) * 100.0,
        "changes_by_rank": ranks,
    }


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
            "busiest_gpu_load": load_factor(plan),
            **(
                {"imbalance_by_layer": {str(i): f for i, f in plan.whatif.moe_layer_imbalance}}
                if plan.whatif.moe_layer_imbalance
                else {}
            ),
        },
    }
