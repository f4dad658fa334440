"""The human-readable report of one simulated training step (``commsim plan`` without ``--json``).

It echoes what was simulated (model, world size, parallel degrees, schedule, micro-batches), then
the answer: step time, throughput, model TFLOP/s per GPU and MFU with the FLOP definition named,
memory per GPU by component and whether it fits, and where the step's time goes on the critical
rank (compute, exposed communication per process group, pipeline bubble, optimizer). Without a
pipeline (pp=1) there is no schedule to echo and the idle time is called what it is: waiting.
Figures are SI inside; GiB, ms, TFLOP/s and percent only here, at the edge.

    print(format_report(result, plan, gpu=topology.gpu_spec(0), fidelity="analytical"))
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from schedules.memory import ALLOCATOR_RESERVE
from schedules.moe import chance_load
from schedules.moe_kernels import megatron_moe
from schedules.optimizer_states import fp8_params, master_bytes_per_param, optimizer_bytes_per_param
from schedules.params import active_params, total_params
from sim.output.offload_report import offload_lines
from sim.replay.result import PlanResult

if TYPE_CHECKING:
    from schedules.plan import ClusterConfig, ParallelConfig, Plan
    from topologies.hardware import GPUSpec

GIB_BYTES = 2**30
"""Bytes per GiB, the unit of ``PlanResult.memory_gib``."""

_LABEL_WIDTH = 28


def format_report(result: PlanResult, plan: Plan, *, gpu: GPUSpec, fidelity: str) -> str:
    """The full text report: plan echo, headline figures, memory, time breakdown."""
    sections = (
        plan_echo_lines(result, plan, gpu=gpu, fidelity=fidelity),
        headline_lines(result, plan, gpu=gpu),
        memory_lines(result, hbm_bytes=gpu.hbm_bytes),
        *([offload_lines(result.offload)] if result.offload else []),
        breakdown_lines(
            result, critical=_critical_rank(result, plan), pipeline=plan.parallel.pp > 1
        ),
    )
    return "\n\n".join("\n".join(lines) for lines in sections) + "\n"


def plan_echo_lines(result: PlanResult, plan: Plan, *, gpu: GPUSpec, fidelity: str) -> list[str]:
    """What was simulated: model, cluster, parallel degrees, schedule and batch."""
    model, cluster, par, train = plan.model, plan.cluster, plan.parallel, plan.training
    num_microbatches = result.extra.get("num_microbatches") or _microbatches(plan)
    tokens = train.global_batch_size * model.seq_len
    folded = "folded" if result.num_simulated_ranks < result.num_gpus else "unfolded"
    shape = ", parallel block" if model.parallel_block else ""
    if 0 < model.attention_window < model.seq_len:
        shape += f", attention window {model.attention_window}"
    if model.multi_latent:  # DeepSeek's latent attention: its latents and head widths
        query = f"q latent {model.q_lora_rank}, " if model.q_lora_rank else ""
        shape += (
            f", latent attention ({query}kv latent {model.kv_lora_rank}, heads "
            f"{model.head_dim}+{model.qk_rope_head_dim}/{model.value_head_dim})"
        )
    if model.mtp_num_layers:
        shape += f", {model.mtp_num_layers} multi-token-prediction depth"
        shape += "s" if model.mtp_num_layers > 1 else ""
    return [
        f"Plan: {model.name} ({model.num_layers} layers, hidden {model.hidden_size}, "
        f"seq {model.seq_len}{shape}) on {result.num_gpus} x {gpu.name}",
        _row("  cluster", cluster_line(cluster)),
        _row(
            "  parallel",
            f"tp={par.tp} pp={par.pp} cp={par.cp} dp={par.dp} vpp={par.vpp}, "
            f"data_parallel {par.data_parallel}{_optimizer_state(plan)}",
        ),
        _row(
            "  schedule",
            f"{par.schedule if par.pp > 1 else 'no pipeline (pp=1)'}, "
            f"sequence_parallel {_on_off(par.sequence_parallel)}, recompute {par.recompute}"
            f"{_modules(par)}",
        ),
        _row(
            "  batch",
            f"{num_microbatches} micro-batches of {train.micro_batch_size} per step, "
            f"global batch {train.global_batch_size} ({tokens:,} tokens), {train.precision}"
            f"{', FP8 weights' if fp8_params(plan) else ''}",
        ),
        *experts_lines(plan),
        _row(
            "  simulated",
            f"{result.num_simulated_ranks} of {result.num_gpus} ranks ({folded}), "
            f"{fidelity} network",
        ),
    ]


def _optimizer_state(plan: Plan) -> str:
    """What Megatron's distributed optimizer keeps where a knob moves it from fp32 gradients and
    12 bytes of Adam state per parameter (``schedules.optimizer_states``); "" otherwise."""
    par = plan.parallel
    parts = []
    if not par.grad_reduce_in_fp32:
        parts.append("bf16 gradients")
    if par.use_precision_aware_optimizer:
        parts.append(
            f"Adam state {optimizer_bytes_per_param(plan)} B per parameter: moments "
            f"{par.exp_avg_dtype}/{par.exp_avg_sq_dtype}, master {master_bytes_per_param(plan)} B"
        )
    return f" ({'; '.join(parts)})" if parts else ""


def _hottest(plan: Plan) -> str:
    """The busiest expert's share as the step runs it: the what-if's, else the model's."""
    whatif = plan.whatif
    if whatif.moe_layer_imbalance:
        layers = ", ".join(f"layer {i} {f:g}x" for i, f in whatif.moe_layer_imbalance)
        return f"{plan.model.moe_imbalance:g}x the mean ({layers}: what-if)"
    if whatif.moe_imbalance is not None:
        return f"{whatif.moe_imbalance:g}x the mean (what-if)"
    return f"{plan.model.moe_imbalance:g}x the mean"


def _chance(plan: Plan) -> str:
    """What chance alone gives the busiest GPU of an expert-parallel group (``chance_load``)."""
    if plan.parallel.ep <= 1:
        return ""
    return (
        f"; by chance alone the busiest of the {plan.parallel.ep} expert-parallel GPUs gets "
        f"{chance_load(plan):.3f}x the mean tokens per micro-batch"
    )


def _fusions(plan: Plan) -> str:
    """Megatron-Core's MoE fusions as the replay prices them, and whether each layer's dispatch
    synchronises the host (``sim.replay.recipes.moe_sync_s``)."""
    par, parts = plan.parallel, []
    if megatron_moe(plan):
        if par.moe_token_dispatcher == "alltoall":
            parts.append(f"permutation {'fused' if par.moe_permute_fusion else 'unfused'}")
        parts.append(f"router {'fused' if par.moe_router_fusion else 'unfused'}")
    dropless = plan.model.moe_capacity_factor is None
    if dropless and (megatron_moe(plan) or par.ep > 1):
        parts.append("a host sync per layer's forward")
    return f" ({', '.join(parts)})" if parts else ""


def _modules(par: ParallelConfig) -> str:
    """`` (mla_up_proj, mlp)``: the modules selective recompute reruns where the plan lists
    them (Megatron-Core's ``--recompute-modules``); nothing for its default."""
    if par.recompute != "selective" or par.recompute_modules is None:
        return ""
    return f" ({', '.join(par.recompute_modules) or 'no module'})"


def experts_lines(plan: Plan) -> list[str]:
    """For an MoE model: experts, routing and expert parallelism; nothing for a dense one."""
    model, par = plan.model, plan.parallel
    if not model.num_experts:
        return []
    shared = ", shared experts" if model.moe_shared_expert_ffn_hidden_size else ""
    capacity = model.moe_capacity_factor
    dropping = "dropless" if capacity is None else f"capacity factor {capacity:g} (padded)"
    exchange = f"{par.moe_token_dispatcher} dispatcher"  # Megatron-Core's
    if not megatron_moe(plan):  # PyTorch expert parallelism (torchtitan's token dispatch)
        exchange = "tokens by " + ("all-to-all" if par.moe_token_dispatcher == "alltoall" else
                                   "all-gather")  # fmt: skip
    return [
        _row(
            "  experts",
            f"{model.num_experts} routed (top-{model.moe_top_k}){shared}, ep={par.ep} "
            f"etp={par.expert_tp}, {exchange}{_fusions(plan)}, "
            f"{dropping}, busiest expert {_hottest(plan)}{_chance(plan)}",
        ),
        _row(
            "  parameters",
            f"{total_params(model) / 1e9:,.1f}B, {active_params(model) / 1e9:,.1f}B active per "
            "token (MFU counts these)",
        ),
    ]


def cluster_line(cluster: ClusterConfig) -> str:
    """``32 x dgx-h100, ib-ndr`` (``, NCCL 2.26.2`` when the plan names a release), or the
    cluster file's name."""
    if cluster.file:
        return f"from {cluster.file}"
    node = cluster.node
    name = node.get("name", "custom node") if isinstance(node, Mapping) else node
    fabric = f", {cluster.fabric}" if cluster.fabric else ""
    oversubscribed = (
        f" ({cluster.oversubscription:g}:1 oversubscribed)" if cluster.oversubscription > 1 else ""
    )
    release = f", NCCL {cluster.nccl_version}" if cluster.nccl_version else ""
    return f"{cluster.num_nodes} x {name}{fabric}{oversubscribed}{release}"


def headline_lines(result: PlanResult, plan: Plan, *, gpu: GPUSpec) -> list[str]:
    """Step time, throughput, TFLOP/s per GPU and MFU with the FLOP definition."""
    precision = plan.training.precision
    peak_tflops = gpu.peak_flops_per_s.get(precision, float("nan")) / 1e12
    tokens_per_gpu = result.tokens_per_s / result.num_gpus if result.num_gpus else float("nan")
    return [
        _row("Step time", format_duration(result.step_time_s)),
        _row("Throughput", f"{result.tokens_per_s:,.0f} tokens/s ({tokens_per_gpu:,.0f} per GPU)"),
        _row(
            "Model FLOP/s per GPU",
            f"{result.tflops_per_gpu:.1f} TFLOP/s, MFU {result.mfu:.1%} "
            f"of {peak_tflops:,.0f} TFLOP/s dense {precision}",
        ),
        _row("Hardware FLOP/s", f"HFU {result.hfu:.1%} (model FLOPs plus recomputation)"),
        _row("FLOP definition", result.flops_definition),
        _row("Memory per GPU", fit_verdict(result, hbm_bytes=gpu.hbm_bytes)),
        _row("Bottleneck", result.bottleneck),
        _row("Compute basis", result.basis.get("compute", "")),
        _row("Network basis", result.basis.get("network", "")),
        *([_row("Host basis", result.basis["host"])] if result.basis.get("host") else []),
    ]


def memory_lines(result: PlanResult, *, hbm_bytes: float) -> list[str]:
    """Memory per GPU by component in GiB, then the total against HBM and the verdict."""
    hbm_gib = hbm_bytes / GIB_BYTES
    components = {k: v for k, v in result.memory_gib.items() if k not in ("total", "reserved")}
    total_gib = result.memory_gib.get("total", sum(components.values()))
    lines = ["Memory per GPU (GiB, worst pipeline stage)"]
    lines += [_row(f"  {name}", f"{gib:8.2f}") for name, gib in components.items()]
    lines.append(_row("  total (live)", f"{total_gib:8.2f}"))
    reserved_gib = result.memory_gib.get("reserved", total_gib)
    lines.append(
        _row(
            "  reserved",
            f"{reserved_gib:8.2f} of {hbm_gib:.2f} GiB HBM (caching allocator "
            f"+{ALLOCATOR_RESERVE:.0%}, measured)",
        )
    )
    lines.append(_row("  verdict", fit_verdict(result, hbm_bytes=hbm_bytes)))
    return lines


def fit_verdict(result: PlanResult, *, hbm_bytes: float) -> str:
    """``fits (N GiB free)`` or a loud ``DOES NOT FIT`` with the total and the HBM size."""
    hbm_gib = hbm_bytes / GIB_BYTES
    total_gib = result.memory_gib.get("reserved", result.memory_gib.get("total", float("nan")))
    if result.fits_in_memory:
        return f"fits ({hbm_gib - total_gib:.2f} GiB free)"
    over = f", {total_gib - hbm_gib:.2f} GiB over" if total_gib > hbm_gib else ""
    return (
        f"DOES NOT FIT: needs {total_gib:.2f} GiB of {hbm_gib:.2f} GiB HBM{over} "
        "(the step time assumes it would fit)"
    )


def breakdown_lines(
    result: PlanResult, *, critical: str = "the critical rank", pipeline: bool = True
) -> list[str]:
    """Where the step's time goes on the critical rank, in ms and percent of the step.

    The idle time not explained by communication (``Breakdown.bubble_s``) is the pipeline bubble
    when there is a ``pipeline``; without one (pp=1) it is the rank waiting on the others.
    """
    bd = result.breakdown
    rows: list[tuple[str, float]] = [("compute", bd.compute_s)]
    rows += [(f"exposed comm {group}", t) for group, t in sorted(bd.exposed_comm_s.items())]
    rows += [("host (launches, framework loops)", bd.host_s)] if bd.host_s else []
    idle = "pipeline bubble" if pipeline else "idle / waiting"
    rows += [(idle, bd.bubble_s), ("optimizer", bd.optimizer_s)]
    accounted_s = sum(t for _, t in rows)
    slowed = (
        [("  (compute slowed by overlap)", bd.overlap_slowdown_s)] if bd.overlap_slowdown_s else []
    )
    if bd.in_step_slowdown_s:
        slowed.append(("  (in-step slowdown, fitted)", bd.in_step_slowdown_s))
    step_s = result.step_time_s
    lines = [
        f"Step breakdown on {critical}",
        f"{'':<{_LABEL_WIDTH}}{'ms':>12}{'% of step':>11}",
    ]
    lines += [_breakdown_row(f"  {name}", t, step_s) for name, t in rows]
    lines += [_breakdown_row(name, t, step_s) for name, t in slowed]
    # Show any remainder instead of hiding it: the rows should add up to the step.
    if abs(step_s - accounted_s) > 1e-6 * max(step_s, 1e-12):
        lines.append(_breakdown_row("  other / unaccounted", step_s - accounted_s, step_s))
    lines.append(_breakdown_row("  step", step_s, step_s))
    return lines


def rank_coords(rank: int, plan: Plan) -> dict[str, int]:
    """Coordinates (tp, cp, dp, pp) of a global rank in the replay's rank layout."""
    from schedules.layout import layout_of

    return layout_of(plan).coords(rank)


def pipeline_stage(rank: int, plan: Plan) -> int:
    """Pipeline stage of a global rank."""
    return rank_coords(rank, plan)["pp"]


def rank_title(rank: int, plan: Plan) -> str:
    """``rank N (pp stage s)``, with the context-parallel rank too when cp > 1."""
    coords = rank_coords(rank, plan)
    cp = f", cp rank {coords['cp']}" if plan.parallel.cp > 1 else ""
    return f"rank {rank} (pp stage {coords['pp']}{cp})"


def format_duration(time_s: float) -> str:
    """Seconds as ``12.346 s`` from one second up, else milliseconds as ``23.691 ms``."""
    return f"{time_s:.3f} s" if time_s >= 1.0 else f"{time_s * 1e3:.3f} ms"


def _breakdown_row(label: str, time_s: float, step_s: float) -> str:
    share = time_s / step_s if step_s > 0 else float("nan")
    return f"{label:<{_LABEL_WIDTH}}{time_s * 1e3:12.3f}{share:11.1%}"


def _row(label: str, value: str) -> str:
    return f"{label:<{_LABEL_WIDTH}}{value}"


def _critical_rank(result: PlanResult, plan: Plan) -> str:
    rank = result.extra.get("critical_rank")
    if rank is None:
        return "the critical rank"
    return f"{rank_title(int(rank), plan)}, the critical rank (last to finish)"


def _on_off(flag: bool) -> str:
    return "on" if flag else "off"


def _microbatches(plan: Any) -> int:
    from schedules.plan import num_microbatches

    return num_microbatches(plan)
