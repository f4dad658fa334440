"""``commbench --compute``: measure GEMM and attention throughput, fit a compute calibration.

Times ``torch.matmul`` over square and transformer-like (m, n, k) shapes, causal
``scaled_dot_product_attention`` forward and backward over sequence lengths, and a large copy
for the memory bandwidth, on the local device (CUDA events on a GPU, ``time.perf_counter`` on
CPU). Like nccl-tests, each figure is the time of ``iters`` back-to-back calls divided by
``iters``. The fitted curves (``vocab.compute_calibration.fit_kernel``) go to a JSON file that
``commsim plan --compute-calibration`` reads.

    commbench --compute --device cuda --dtype bf16 --output compute_h100.json
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from comm_bench.compute_inputs import (
    UsageError,
    allocating,
    check_flags,
    check_memory,
    parse_ints,
    parse_shapes,
)
from fileio.output import OutputError, check_output
from vocab.compute_calibration import (
    ComputeCalibration,
    KernelFit,
    fit_kernel,
    save_compute_calibration,
)

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
"""dtype names accepted by --dtype (fp8 uses torch._scaled_mm and needs a CUDA GPU with FP8)."""
GPU_DEFAULTS: dict[str, Any] = {
    "sizes": "512,1024,2048,4096,8192,16384",
    "shapes": "8192x4096x4096,8192x12288x4096,8192x4096x16384,8192x28672x8192,8192x8192x28672",
    "seq_lens": "512,1024,2048,4096,8192",
    "heads": 16,
    "head_dim": 128,
    "iters": 20,
    "warmup": 5,
}
CPU_DEFAULTS: dict[str, Any] = {
    "sizes": "64,128,256",
    "shapes": "256x128x64,128x512x128",
    "seq_lens": "64,128,256",
    "heads": 2,
    "head_dim": 32,
    "iters": 3,
    "warmup": 1,
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """The ``commbench --compute`` flags."""
    parser = _Parser(prog="commbench --compute", description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    parser.add_argument("--dtype", default=None, help="bf16|fp16|fp32|fp8 (default bf16 on GPU)")
    parser.add_argument("--sizes", default=None, help="square GEMM sizes, e.g. 1024,4096")
    parser.add_argument("--shapes", default=None, help="GEMM shapes MxNxK, comma separated")
    parser.add_argument("--seq-lens", default=None, help="attention sequence lengths")
    parser.add_argument("--heads", type=int, default=None, help="attention heads")
    parser.add_argument("--head-dim", type=int, default=None, help="attention head dimension")
    parser.add_argument("--batch", type=int, default=1, help="attention batch size")
    parser.add_argument("--no-attention", action="store_true", help="skip attention")
    parser.add_argument("--iters", type=int, default=None, help="timed iterations per shape")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up iterations")
    parser.add_argument("--repeats", type=int, default=3, help="timed loops, fastest kept")
    parser.add_argument(
        "--threads", type=int, default=1, help="CPU threads (default 1: one core per rank)"
    )
    parser.add_argument(
        "--gpu", default=None, help="catalogue GPU key to record (default: detected; '': any GPU)"
    )
    parser.add_argument(
        "--adam-params",
        type=int,
        default=1 << 24,
        help="parameters of the CPU Adam step measured on the host (0: skip)",
    )
    parser.add_argument(
        "--adam-threads",
        type=int,
        default=None,
        help="threads of the CPU Adam step (default: every core, as DeepSpeedCPUAdam)",
    )
    parser.add_argument("--output", "-o", default=None, help="write the calibration JSON here")
    return parser


def resolve_device(name: str) -> torch.device:
    """auto: cuda when available, else cpu; cuda without a GPU is a usage error."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available")
    return torch.device(name)


def detect_gpu_key(device: torch.device) -> str:
    """Catalogue key of the local device from its name ('' if unknown)."""
    if device.type == "cpu":
        return "cpu"
    name = torch.cuda.get_device_name(device).upper()
    for marker, key in (("H200", "h200"), ("H100 PCIE", "h100-pcie"), ("H100", "h100-sxm")):
        if marker in name:
            return key
    if "A100" in name:
        return "a100-sxm-40gb" if "40GB" in name else "a100-sxm-80gb"
    return ""


def time_per_call_s(
    call: Callable[[], Any], *, iters: int, warmup: int, repeats: int, device: torch.device
) -> float:
    """Seconds per call: the fastest of ``repeats`` loops of ``iters`` back-to-back calls.

    Each loop's time is divided by ``iters`` (nccl-tests' figure); the minimum over loops keeps
    a busy host from inflating the curve (the usual ``timeit`` practice).
    """
    for _ in range(warmup):
        call()
    return min(_loop_s(call, iters=iters, device=device) for _ in range(repeats))


def _loop_s(call: Callable[[], Any], *, iters: int, device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    begin = time.perf_counter()
    for _ in range(iters):
        call()
    return (time.perf_counter() - begin) / iters


def _gemm_call(m: int, n: int, k: int, dtype: str, device: torch.device) -> Callable[[], Any]:
    generator = torch.Generator(device="cpu").manual_seed(0)
    a = torch.randn(m, k, generator=generator).to(device)
    b = torch.randn(n, k, generator=generator).to(device)
    if dtype == "fp8":
        if not hasattr(torch, "_scaled_mm") or device.type != "cuda":
            raise UsageError("--dtype fp8 needs a CUDA GPU with FP8 support (torch._scaled_mm)")
        a8, b8 = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn).t()
        scale = torch.ones((), device=device)
        out_dtype = torch.bfloat16
        return lambda: torch._scaled_mm(a8, b8, scale_a=scale, scale_b=scale, out_dtype=out_dtype)
    a16, b16 = a.to(TORCH_DTYPES[dtype]), b.to(TORCH_DTYPES[dtype]).t()
    out = torch.empty(m, n, dtype=TORCH_DTYPES[dtype], device=device)
    return lambda: torch.matmul(a16, b16, out=out)


def measure_gemms(
    shapes: Sequence[tuple[int, int, int]], dtype: str, device: torch.device, **timing: int
) -> list[dict[str, Any]]:
    """One sample per (m, n, k): 2mnk FLOPs and the mean seconds per matmul."""
    samples = []
    for m, n, k in shapes:
        with allocating(f"the GEMM {m}x{n}x{k}"):
            seconds = time_per_call_s(_gemm_call(m, n, k, dtype, device), device=device, **timing)
        samples.append(
            {
                "kind": "gemm",
                "dtype": dtype,
                "dims": [m, n, k],
                "flops": 2.0 * m * n * k,
                "time_s": seconds,
            }
        )
    return samples


def _attention_sample(kind: str, dtype: str, seq: int, flops: float, time_s: float) -> dict:
    return {"kind": kind, "dtype": dtype, "dims": [seq, seq], "flops": flops, "time_s": time_s}


def measure_attention(
    seq_lens: Sequence[int],
    *,
    batch: int,
    heads: int,
    head_dim: int,
    dtype: str,
    device: torch.device,
    **timing: int,
) -> list[dict[str, Any]]:
    """Causal SDPA per sequence length: the forward, and the backward alone.

    The backward re-runs one recorded graph (``retain_graph=True``), so it is timed by itself
    rather than as a difference of two noisy figures. FLOPs: 4 b a s^2 d / 2 forward (causal),
    2.5x that backward (FlashAttention's count: it recomputes QK^T).
    """
    name = "bf16" if dtype == "fp8" else dtype
    generator = torch.Generator(device="cpu").manual_seed(0)
    samples = []
    for seq in seq_lens:
        shape = (batch, heads, seq, head_dim)
        with allocating(f"attention at --seq-lens {seq}"):
            forward_s, backward_s = _attention_times_s(shape, name, device, generator, timing)
        flops = 4.0 * batch * heads * seq * seq * head_dim * 0.5
        samples.append(_attention_sample("attention_forward", name, seq, flops, forward_s))
        samples.append(_attention_sample("attention_backward", name, seq, 2.5 * flops, backward_s))
    return samples


def _attention_times_s(
    shape: tuple[int, int, int, int],
    dtype: str,
    device: torch.device,
    generator: torch.Generator,
    timing: dict[str, int],
) -> tuple[float, float]:
    """Seconds of one causal SDPA forward and of its backward alone, on (b, a, s, d) tensors."""
    q, k, v, grad = (
        torch.randn(shape, generator=generator).to(device, TORCH_DTYPES[dtype]) for _ in range(4)
    )
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward() -> Any:
        with torch.no_grad():
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def backward() -> Any:
        return torch.autograd.grad(out, (q, k, v), grad, retain_graph=True)

    forward_s = time_per_call_s(forward, device=device, **timing)
    return forward_s, time_per_call_s(backward, device=device, **timing)


def measure_memory_bandwidth(device: torch.device, **timing: int) -> float:
    """Bytes per second of a large device-to-device copy (read + write)."""
    num_bytes = (1 << 30) if device.type == "cuda" else (64 << 20)
    source = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    target = torch.empty_like(source)
    seconds = time_per_call_s(lambda: target.copy_(source), device=device, **timing)
    return 2.0 * num_bytes / seconds


def fit_samples(samples: Sequence[dict[str, Any]]) -> dict[str, dict[str, KernelFit]]:
    """dtype -> kind -> curve fitted to that group of samples."""
    groups: dict[tuple[str, str], list[tuple[Sequence[float], float, float]]] = {}
    for sample in samples:
        key = (sample["dtype"], sample["kind"])
        groups.setdefault(key, []).append((sample["dims"], sample["flops"], sample["time_s"]))
    kernels: dict[str, dict[str, KernelFit]] = {}
    for (dtype, kind), group in sorted(groups.items()):
        kernels.setdefault(dtype, {})[kind] = fit_kernel(group)
    return kernels


def _print_table(
    samples: Sequence[dict[str, Any]], kernels: dict[str, dict[str, KernelFit]]
) -> None:
    print(f"# {'kind':<19} {'dtype':>5} {'dims':>22} {'time(us)':>11} {'TFLOP/s':>9} {'fit':>9}")
    for sample in samples:
        fit = kernels[sample["dtype"]][sample["kind"]]
        dims = "x".join(str(d) for d in sample["dims"])
        rate = sample["flops"] / sample["time_s"] / 1e12
        predicted = sample["flops"] / fit.time_s(sample["flops"], sample["dims"]) / 1e12
        print(
            f"  {sample['kind']:<19} {sample['dtype']:>5} {dims:>22} "
            f"{sample['time_s'] * 1e6:>11.1f} {rate:>9.3f} {predicted:>9.3f}"
        )
    for dtype, kinds in kernels.items():
        for kind, fit in kinds.items():
            print(
                f"# fit {kind} {dtype}: max {fit.max_flops_per_s / 1e12:.3f} TFLOP/s, "
                f"dim_half {fit.dim_half:.1f}, latency {fit.latency_s * 1e6:.2f} us"
            )


def run(args: argparse.Namespace) -> ComputeCalibration:
    """Measure, fit and (with --output) write the calibration; returns it."""
    device = resolve_device(args.device)
    check_flags(args)
    if device.type == "cpu":
        torch.set_num_threads(args.threads)
    defaults = GPU_DEFAULTS if device.type == "cuda" else CPU_DEFAULTS
    dtype = args.dtype or ("bf16" if device.type == "cuda" else "fp32")
    if dtype not in (*TORCH_DTYPES, "fp8"):
        raise UsageError(f"--dtype {dtype!r} is not one of bf16, fp16, fp32, fp8")
    timing = {
        "iters": args.iters if args.iters is not None else int(defaults["iters"]),
        "warmup": args.warmup if args.warmup is not None else int(defaults["warmup"]),
        "repeats": args.repeats,
    }
    target = None
    if args.output:
        target = check_output(args.output, formats=(".json",), option="--output")
    sizes = parse_ints("--sizes", args.sizes or str(defaults["sizes"]))
    shapes = parse_shapes(args.shapes or str(defaults["shapes"]))
    seq_lens = (
        [] if args.no_attention else parse_ints("--seq-lens", args.seq_lens or defaults["seq_lens"])
    )
    attention = {
        "batch": args.batch,
        "heads": args.heads if args.heads is not None else int(defaults["heads"]),
        "head_dim": args.head_dim if args.head_dim is not None else int(defaults["head_dim"]),
    }
    check_memory(
        device,
        dtype,
        sizes=sizes,
        shapes=shapes,
        seq_lens=seq_lens,
        attention=attention,
        adam_params=args.adam_params,
    )
    samples = measure_gemms([(s, s, s) for s in sizes] + shapes, dtype, device, **timing)
    if seq_lens:
        samples += measure_attention(seq_lens, dtype=dtype, device=device, **attention, **timing)
    kernels = fit_samples(samples)
    _print_table(samples, kernels)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    calibration = ComputeCalibration(
        device=name or device.type,
        gpu=args.gpu if args.gpu is not None else detect_gpu_key(device),
        kernels=kernels,
        memory_bandwidth_bytes_per_s=measure_memory_bandwidth(device, **timing),
        measurements=tuple(samples),
        cpu_adam_params_per_s=_host_adam(args, timing),
    )
    if target is not None:
        save_compute_calibration(calibration, target)
        if not target.is_stdout:
            print(f"# wrote {target.name}")
    return calibration


def _host_adam(args: argparse.Namespace, timing: dict[str, int]) -> float | None:
    """The host's CPU Adam rate (``--adam-params 0``: not measured), printed as it is taken."""
    if args.adam_params == 0:
        return None
    threads = args.adam_threads if args.adam_threads is not None else os.cpu_count() or 1
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with allocating(f"--adam-params {args.adam_params}"):
            step_s, impl = measure_cpu_adam(args.adam_params, **timing)
    finally:
        torch.set_num_threads(saved)
    rate = args.adam_params / step_s
    print(
        f"# cpu adam: {args.adam_params:,} fp32 params, {threads} threads, {impl}: "
        f"{step_s * 1e3:.2f} ms per step, {rate / 1e9:.3f} Gparam/s "
        f"({rate * 28 / 1e9:.1f} GB/s of 28 B/param)"
    )
    return rate


def measure_cpu_adam(num_params: int, **timing: int) -> tuple[float, str]:
    """Seconds of one Adam step over ``num_params`` fp32 parameters on the CPU, and which
    implementation ran: torch's fused CPU AdamW (vectorised and threaded, as DeepSpeedCPUAdam;
    torch >= 2.4), else its foreach one. Each step reads the parameter, gradient and both moments
    and writes back three: 28 bytes per parameter, memory-bound."""
    param = torch.nn.Parameter(torch.zeros(num_params, dtype=torch.float32))
    param.grad = torch.full_like(param, 1e-3)
    try:
        optimizer = torch.optim.AdamW([param], lr=1e-4, fused=True)
        optimizer.step()
        impl = "torch.optim.AdamW(fused=True)"
    except (RuntimeError, ValueError):
        optimizer = torch.optim.AdamW([param], lr=1e-4, foreach=True)
        impl = "torch.optim.AdamW(foreach=True)"
    cpu = torch.device("cpu")
    return time_per_call_s(optimizer.step, device=cpu, **timing), impl


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``commbench --compute``; returns the exit code (2 on bad flags)."""
    try:
        args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
        run(args)
    except (UsageError, OutputError) as error:
        print(f"commbench --compute: error: {error}", file=sys.stderr)
        return 2
    except OSError as error:
        print(f"commbench --compute: error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
