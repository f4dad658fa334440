"""``commbench --step PLAN.yaml``: time a real training step of the plan's model on this device.

Builds the plan's transformer in plain PyTorch (``comm_bench.step_model``) with as many layers as
fit the device (or ``--layers``; a slice of the model is said so), its micro-batch, sequence
length and recompute, eager or ``torch.compile``d, and runs accumulated steps as an eager training
loop does: per micro-batch a forward (fp32 loss) and a backward, then fused AdamW on fp32 master
weights (bf16 autocast on a GPU, fp32 on CPU) and ``zero_grad``. Each phase is timed with CUDA
events on a GPU and ``time.perf_counter`` on CPU (tiny shapes there, so CI runs the same code).
One more step runs under ``torch.profiler``: every kernel (CPU: every ATen operator, self time) is
classified (``vocab.kernel_classes``) and the device's idle time inside the step is reported:
launch- and CPU-bound time that no kernel-throughput benchmark sees. ``commsim plan
--compute-calibration`` reads the JSON and fits the compute model to it
(``sim.replay.step_fit``).

    commbench --step examples/llama3-8b-ddp-8xh100.yaml --layers 4 --output step_h100.json

``--trace-out TRACE.json[.gz]`` also writes the profiled step's Chrome trace (shapes recorded),
which ``commsim fit PLAN --trace`` reads like any user's torch.profiler trace.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gzip
import json
import platform
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from comm_bench.compute import detect_gpu_key, resolve_device
from comm_bench.compute_inputs import UsageError, check_counts
from comm_bench.memory import available_ram_bytes
from comm_bench.step_model import batch_of, build_model, check_buildable
from fileio.output import Target, check_output, write_bytes, write_text
from schedules.activations import layer_activation_bytes, logits_bytes
from schedules.memory import eager_saved_bytes
from schedules.params import embedding_params, layer_params, lm_head_params
from schedules.plan import Plan, load_plan, plan_to_dict
from schedules.resolve import resolve_plan
from topologies.config import load_cluster
from topologies.hardware import GPUS
from vocab.compute_calibration import LAUNCH_BOUND_IDLE, STEP_SCHEMA
from vocab.kernel_classes import CLASSES, busy_time_s, classify, kernel_gap_s

STATE_BYTES_PER_PARAM = 16
"""fp32 master weights and gradients, AdamW's two fp32 moments."""
MEMORY_HEADROOM = 0.80
"""Fraction of the device's free memory a default-sized slice may plan to use."""
DEFAULTS = {"cuda": {"steps": 5, "warmup": 3}, "cpu": {"steps": 2, "warmup": 1}}
CPU_FLOPS_PER_S = 1e11
"""What one CPU core sustains in fp32 matmuls (``commbench --compute --device cpu`` measured
0.10 TFLOP/s on this project's VM): the basis of the run-time estimate."""
CPU_MAX_MINUTES = 30.0
"""A CPU run estimated longer than this is refused before it starts (``--max-minutes``)."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """The ``commbench --step`` flags."""
    parser = _Parser(prog="commbench --step", description=__doc__.splitlines()[0])
    parser.add_argument("plan", type=Path, metavar="PLAN.yaml", help="plan file (its model:)")
    parser.add_argument("--layers", type=int, default=None, help="layers to build (default: fit)")
    parser.add_argument("--microbatches", type=int, default=1, help="micro-batches per step")
    parser.add_argument("--steps", type=int, default=None, help="timed steps")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default=None)
    parser.add_argument(
        "--compile",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="torch.compile the model (default: as the plan's training.stack says)",
    )
    parser.add_argument("--no-profile", action="store_true", help="skip the profiled step")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads")
    parser.add_argument(
        "--max-minutes",
        type=float,
        default=CPU_MAX_MINUTES,
        help="refuse a CPU run estimated to take longer (default %(default)s)",
    )
    parser.add_argument("--output", "-o", default=None, help="write the measurement JSON here")
    parser.add_argument(
        "--trace-out",
        default=None,
        metavar="TRACE.json[.gz]",
        help="write the profiled step's Chrome trace here (shapes recorded; commsim fit --trace "
        "reads it)",
    )
    return parser


def slice_layers(plan: Plan, free_bytes: float, *, compiled: bool = False) -> int:
    """Layers whose weights, optimizer state and one micro-batch's activations fit, in the loop
    that runs them (one GPU, autocast, eager or ``compiled``)."""
    model, training = plan.model, plan.training
    recompute = plan.parallel.recompute
    fixed = float(embedding_params(model) + lm_head_params(model)) * STATE_BYTES_PER_PARAM
    fixed += logits_bytes(model, training.micro_batch_size, tp=1, cp=1)
    per_layer = layer_params(model) * STATE_BYTES_PER_PARAM + layer_activation_bytes(
        model, training.micro_batch_size, recompute=recompute, flash_attention=True
    )
    loop = load_plan(measured_plan(plan, num_layers=1, microbatches=1, compiled=compiled))
    per_layer += eager_saved_bytes(loop)
    budget = free_bytes * MEMORY_HEADROOM - fixed
    return max(1, min(model.num_layers, int(budget // per_layer)))


def _check_cpu_work(
    plan: Plan, layers: int, microbatches: int, num_steps: int, max_minutes: float
) -> None:
    """Refuse, before building anything, a CPU run that would take longer than ``max_minutes``."""
    model = plan.model
    params = (
        layers * layer_params(model) + lm_head_params(model) + model.vocab_size * model.hidden_size
    )
    tokens = plan.training.micro_batch_size * model.seq_len * microbatches * num_steps
    minutes = 6.0 * params * tokens / CPU_FLOPS_PER_S / 60.0
    if minutes > max_minutes:
        raise UsageError(
            f"{layers} layer(s) of {model.name} at {model.seq_len} tokens would take about "
            f"{minutes:,.0f} min on this CPU (estimate at {CPU_FLOPS_PER_S / 1e12:g} TFLOP/s); "
            f"use --layers, a smaller plan, or --max-minutes {minutes:.0f}"
        )


def measured_plan(
    plan: Plan, *, num_layers: int, microbatches: int, compiled: bool, gpu: str = ""
) -> dict[str, Any]:
    """The plan as measured: one device (``gpu``, a catalogue key, when the plan's node names
    another), the slice's layers, the step's batch, and the loop that ran: PyTorch's own autocast
    loop, compiled whole (loss included) or eager, whatever stack and weights the plan names."""
    model = dataclasses.replace(plan.model, num_layers=num_layers)
    training = dataclasses.replace(
        plan.training,
        global_batch_size=plan.training.micro_batch_size * microbatches,
        precision="bf16",
        stack="compile" if compiled else "eager",
        compile_loss=None,
        mixed_precision="autocast",
    )
    parallel = {"recompute": plan.parallel.recompute}
    as_dict = plan_to_dict(dataclasses.replace(plan, model=model, training=training))
    node = plan.cluster.node
    one_gpu = {**node, "num_gpus": 1} if isinstance(node, dict) else {"base": node, "num_gpus": 1}
    if gpu in GPUS:
        one_gpu["gpu"] = gpu
    cluster = {"node": one_gpu, "num_nodes": 1}
    return {**as_dict, "parallel": parallel, "cluster": cluster}


class _Clock:
    """Wall time of device work: CUDA events on a GPU, perf_counter on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.pairs: list[tuple[str, Any, Any]] = []

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start: Any
        end: Any
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
        else:
            start = time.perf_counter()
            yield
            end = time.perf_counter()
        self.pairs.append((name, start, end))

    def totals_s(self) -> dict[str, list[float]]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        out: dict[str, list[float]] = {}
        for name, start, end in self.pairs:
            seconds = start.elapsed_time(end) / 1e3 if self.device.type == "cuda" else end - start
            out.setdefault(name, []).append(seconds)
        self.pairs.clear()
        return out


def _step_fn(model: torch.nn.Module, optimizer: Any, batch: tuple, *, microbatches: int,
             autocast: bool, device: torch.device) -> Callable[[_Clock | None], None]:  # fmt: skip
    def step(clock: _Clock | None) -> None:
        timed = clock.phase if clock is not None else (lambda _: contextlib.nullcontext())
        with timed("step"):
            for _ in range(microbatches):
                with (
                    timed("forward"),
                    torch.autocast(device.type, torch.bfloat16, enabled=autocast),
                ):
                    loss = model(*batch) / microbatches
                with timed("backward"):
                    loss.backward()
            with timed("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)

    return step


def profile_step(
    step: Callable[[Any], None], device: torch.device, trace_out: Target | None = None
) -> dict[str, Any]:
    """Per-class time of one step, its kernels and the device's idle time in it; with
    ``trace_out`` the step's Chrome trace is written there too, with input shapes recorded (the
    shapes add host time to the profiled step, not to its kernels)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    with profile(activities=activities, record_shapes=trace_out is not None) as prof:
        begin = time.perf_counter()  # inside: the profiler's own start and stop are not the step's
        step(None)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall_s = time.perf_counter() - begin
    classes = dict.fromkeys(CLASSES, 0.0)
    if device.type == "cuda":
        # GPU-side annotations (the optimizer's ``Optimizer.step#...``) span kernels: not work
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA" and not _annotation(e)]
        intervals = [(e.time_range.start / 1e6, e.time_range.end / 1e6) for e in kernels]
        for event, (start, end) in zip(kernels, intervals, strict=True):
            classes[classify(event.name)] += end - start
        busy_s, count = busy_time_s(intervals), len(kernels)
        gap_s = kernel_gap_s(intervals)
    else:
        ops = [e for e in prof.key_averages() if e.key.startswith("aten::")]
        for op in ops:
            classes[classify(op.key)] += op.self_cpu_time_total / 1e6
        busy_s, count = sum(classes.values()), sum(op.count for op in ops)
        gap_s = 0.0  # CPU operators run back to back on the host
    if trace_out is not None:
        write_bytes(trace_out, chrome_trace_bytes(prof, gzipped=trace_out.name.endswith(".gz")))
    return {
        "classes_s": classes,
        "busy_s": busy_s,
        "idle_s": max(0.0, wall_s - busy_s),
        "wall_s": wall_s,
        "num_kernels": count,
        "kernel_gap_s": gap_s,
    }


GPU_ANNOTATIONS = ("Optimizer.", "ProfilerStep#")
"""Names of GPU-side ranges the profiler records around kernels (``Optimizer.step#AdamW.step``):
torch 2.11 lists them as CUDA events without ``is_user_annotation`` set."""


def _annotation(event: Any) -> bool:
    """Whether a CUDA profiler event is a range around kernels rather than a kernel."""
    return bool(getattr(event, "is_user_annotation", False)) or event.name.startswith(
        GPU_ANNOTATIONS
    )


def chrome_trace_bytes(prof: Any, *, gzipped: bool) -> bytes:
    """The profile as Chrome trace JSON (``export_chrome_trace``, which writes only to a path:
    a temporary one, so the real output goes through ``fileio.output``), gzipped if asked."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        data = path.read_bytes()
    return gzip.compress(data, mtime=0) if gzipped else data


COUNT_FLAGS = (
    ("--steps", "steps", 1),
    ("--warmup", "warmup", 0),
    ("--microbatches", "microbatches", 1),
    ("--threads", "threads", 1),
    ("--layers", "layers", 1),
)
"""Integer flags, their ``argparse`` names and least values (a default of None is not checked)."""


def check_flags(args: argparse.Namespace) -> None:
    """Raise ``UsageError`` naming the first flag out of range and its value."""
    check_counts(args, COUNT_FLAGS)
    if not args.max_minutes > 0:  # nan too
        raise UsageError(f"--max-minutes must be > 0, got {args.max_minutes:g}")


def check_plan(plan: Plan, layers: int | None) -> None:
    """Refuse a plan that ``commsim plan`` refuses on its own cluster (degrees that do not divide
    its world, a batch that does not split...), and more ``layers`` than its model has: what is
    measured is a slice of that plan."""
    if layers is not None and layers > plan.model.num_layers:
        raise UsageError(
            f"--layers {layers}: the plan's model {plan.model.name} has "
            f"{plan.model.num_layers} layers"
        )
    source = plan.cluster.source()
    if isinstance(source, str) and plan.base_dir:  # a cluster file beside the plan, as commsim
        source = str(Path(plan.base_dir) / source)
    resolve_plan(plan, load_cluster(source).num_gpus)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Measure; print the summary; with --output write the JSON; returns the measurement."""
    device = resolve_device(args.device)
    kind = device.type
    steps = args.steps if args.steps is not None else DEFAULTS[kind]["steps"]
    warmup = args.warmup if args.warmup is not None else DEFAULTS[kind]["warmup"]
    check_flags(args)
    target = (
        check_output(args.output, formats=(".json",), option="--output", inputs=(args.plan,))
        if args.output
        else None
    )
    trace_target = None
    if args.trace_out:
        if args.no_profile:
            raise UsageError("--trace-out needs the profiled step: drop --no-profile")
        trace_target = check_output(args.trace_out, formats=(".json", ".gz"), option="--trace-out",
                                    inputs=(args.plan, args.output))  # fmt: skip
        if target is not None and target.path is not None and target.path == trace_target.path:
            raise UsageError("--output and --trace-out name the same file")
    if not args.plan.is_file():
        raise FileNotFoundError(f"plan file not found: {args.plan}")
    plan = load_plan(args.plan)
    check_buildable(plan.model)
    check_plan(plan, args.layers)
    if kind == "cpu":
        torch.set_num_threads(args.threads)
    layers = args.layers
    compiled = wants_compile(plan.training.stack, args.compile)
    if layers is None:  # on a GPU what fits it; on CPU the plan's model, if it fits the RAM
        free = torch.cuda.mem_get_info(device)[0] if kind == "cuda" else available_ram_bytes()
        fitting = slice_layers(plan, free, compiled=compiled) if free is not None else None
        layers = plan.model.num_layers if fitting is None else fitting
    if kind == "cpu":
        _check_cpu_work(plan, layers, args.microbatches, steps + warmup + 1, args.max_minutes)
    dtype = args.dtype or ("bf16" if kind == "cuda" else "fp32")
    torch.manual_seed(0)
    model = build_model(
        plan.model,
        num_layers=layers,
        recompute=plan.parallel.recompute,
        repeat_kv=plan.training.repeat_kv,
    )
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=kind == "cuda")
    runnable: torch.nn.Module = torch.compile(model) if compiled else model  # type: ignore[assignment]
    batch = batch_of(plan.model, plan.training.micro_batch_size, device)
    step = _step_fn(runnable, optimizer, batch, microbatches=args.microbatches,
                    autocast=dtype == "bf16", device=device)  # fmt: skip
    for _ in range(warmup):
        step(None)
    if kind == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    clock = _Clock(device)
    for _ in range(steps):
        step(clock)
    totals = clock.totals_s()
    timings = {name: sum(values) / len(values) for name, values in totals.items()}
    result: dict[str, Any] = {
        "schema": STEP_SCHEMA,
        "device": torch.cuda.get_device_name(device) if kind == "cuda" else platform.processor(),
        "gpu": detect_gpu_key(device),
        "torch": torch.__version__,
        "dtype": dtype,
        "compiled": compiled,
        "source_plan": str(args.plan),
        "model_layers": plan.model.num_layers,
        "measured_layers": layers,
        "microbatches": args.microbatches,
        "plan": measured_plan(
            plan,
            num_layers=layers,
            microbatches=args.microbatches,
            compiled=compiled,
            gpu=detect_gpu_key(device),
        ),
        "timings_s": timings,
        "steps": steps,
    }
    if kind == "cuda":
        result["memory"] = peak_memory(device)
    if not args.no_profile:
        result["profile"] = profile_step(step, device, trace_target)
    if target is not None:
        write_text(target, json.dumps(result, indent=2, sort_keys=True) + "\n")
    print(summary(result), end="")
    return result


def peak_memory(device: torch.device) -> dict[str, Any]:
    """Peak bytes of the timed steps: live tensors (``max_memory_allocated``) and what the
    caching allocator held from the device (``max_memory_reserved``: what "will it fit" is about),
    with the allocator's settings (``PYTORCH_CUDA_ALLOC_CONF``)."""
    import os

    return {
        "max_allocated_bytes": float(torch.cuda.max_memory_allocated(device)),
        "max_reserved_bytes": float(torch.cuda.max_memory_reserved(device)),
        "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    }


def wants_compile(stack: str | None, flag: bool | None) -> bool:
    """``--compile`` / ``--no-compile`` when given, else whether the plan's stack compiles."""
    return stack == "compile" if flag is None else flag


def summary(result: dict[str, Any]) -> str:
    """The measurement as text: what ran, phase times, the profile by class."""
    timings = result["timings_s"]
    layers, total = result["measured_layers"], result["model_layers"]
    lines = [
        f"# commbench --step {result['source_plan']}: {result['device'] or 'cpu'} "
        f"({result['gpu'] or 'unknown'}), torch {result['torch']}, {result['dtype']}"
        f"{', compiled' if result['compiled'] else ', eager'}",
        f"# {layers} of {total} layers"
        + (" (a slice of the model: what fits this device)" if layers < total else "")
        + f", {result['microbatches']} micro-batch(es) per step, {result['steps']} timed steps",
        f"  {'phase':<12} {'ms':>12}",
    ]
    for name in ("forward", "backward", "optimizer", "step"):
        if name in timings:
            lines.append(f"  {name:<12} {timings[name] * 1e3:>12.3f}")
    memory = result.get("memory")
    if memory:
        lines.append(
            f"# peak memory: {memory['max_allocated_bytes'] / 2**30:.2f} GiB allocated, "
            f"{memory['max_reserved_bytes'] / 2**30:.2f} GiB reserved by the caching allocator"
        )
    profile = result.get("profile")
    if profile:
        lines.append(f"# profiled step: {profile['num_kernels']} kernels, by class")
        wall = profile["wall_s"] or 1.0
        for name, seconds in profile["classes_s"].items():
            if seconds > 0:
                lines.append(f"  {name:<12} {seconds * 1e3:>12.3f} {seconds / wall:>7.1%}")
        lines.append(
            f"  {'idle':<12} {profile['idle_s'] * 1e3:>12.3f} {profile['idle_s'] / wall:>7.1%}"
        )
        kernels = profile["num_kernels"] or 1
        step = timings.get("step") or wall
        idle = max(0.0, 1.0 - profile["busy_s"] / step)
        lines.append(
            f"# unprofiled step: {step / kernels * 1e6:.1f} us per kernel launched, the device "
            f"idle {idle:.1%} of it (launch-bound from {LAUNCH_BOUND_IDLE:.0%}: a step "
            "calibration then fits the host's time per launch; the profiled step's idle share "
            "also holds the profiler's own host time)"
        )
        if profile.get("kernel_gap_s"):
            lines.append(
                f"# gap between kernels {profile['kernel_gap_s'] * 1e6:.2f} us (the GPU's own, "
                "while the host is ahead)"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """Entry point of ``commbench --step``; bad input is one line and exit code 2."""
    import sys

    import yaml

    try:
        run(build_parser().parse_args(argv))
    except torch.OutOfMemoryError:
        print(
            "commbench: error: the device ran out of memory: measure fewer --layers or a smaller "
            "micro-batch",
            file=sys.stderr,
        )
        return 2
    except (UsageError, ValueError, OSError, yaml.YAMLError) as exc:
        message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        if isinstance(exc, yaml.YAMLError):
            message = f"{getattr(exc, 'problem', None) or message} (malformed YAML plan)"
        print(f"commbench: error: {message}", file=sys.stderr)
        return 2
    return 0
