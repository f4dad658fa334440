"""Measure on one GPU the kernel effects the compute model prices as mechanisms.

Each part times real kernels with CUDA events and writes what it saw to one JSON file:

- ``gemm_alignment``: bf16 GEMMs of a language-model head (tokens x hidden x vocab) in the three
  layouts a linear layer runs (forward, input gradient, weight gradient), with the vocabulary a
  multiple of 64, of 2 only, and odd; the rate of each.
- ``attention_head_dim``: causal fused attention (torch SDPA, flash and cuDNN backends) at one
  width and sequence length with head dimensions 64, 80, 96 and 128, forward and backward.
- ``fused_adamw``: ``torch.optim.AdamW(fused=True)`` over fp32 parameters shaped like a model's,
  as bytes per second (28 bytes per parameter: read parameter, gradient and two moments, write
  parameter and moments).
- ``memory_kernels``: the memory-bound kernels of an autocast training step, each at a weight's
  and an activation's size: the casts autocast runs (fp32 to bf16 and back), the fp32 + bf16
  residual add, in-place fp32 accumulation, bf16 adds, zero fills, fp32 LayerNorm and bf16
  RMSNorm forward, bf16 GeLU; bytes per second at the bytes the compute model counts.
- ``sustained``: one 8192^3 bf16 GEMM back to back for ``--sustained-s`` seconds, rate per second,
  with the SM clock, power and temperature ``nvidia-smi`` reports each second.
- ``cp_ring``: one rank's side of torch's context-parallel ring attention (``context_parallel``,
  load-balanced, ``allgather`` rotater, fp32 merge), forward and backward, run by torch's own
  ``_templated_ring_attention`` under a fake process group of CP 2, 4 and 8 (the exchanges cost
  nothing; every kernel of the rank runs), next to plain causal SDPA on the same local tokens
  (CP 1) and to each round's attention call alone.
- ``float8_gemm``: ``torch._scaled_mm`` with tensor-wise and row-wise scales, with and without
  fast accumulation, next to the bf16 GEMM, at the linear layers of Llama 3 8B and of 70B and
  405B under TP 8, in the forward, input-gradient and weight-gradient shapes.
- ``cross_entropy``: the loss over bf16 logits, forward and backward, at language-model
  vocabularies: Megatron-Core's unfused ``VocabParallelCrossEntropy`` on one rank (its passes
  as ``megatron/core/tensor_parallel/cross_entropy.py`` writes them: an fp32 copy, the max, an
  in-place subtraction, exp and division, the sum; backward an in-place product and the copy's
  gradient cast back) and PyTorch's ``F.cross_entropy(logits.float())``; bytes per second at
  ``CROSS_ENTROPY_IMPLS``' bytes per logit.
- ``qk_norm``: ``nn.RMSNorm(head_dim)`` over a (batch, seq, heads, head_dim) bf16 projection,
  with fp32 weights under autocast (the reference loop) and with bf16 weights, forward and
  backward: milliseconds and kernels launched (profiler).

    python tools/kernel_probe.py --output probe.json [--sustained-s 40]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import time
from collections.abc import Callable
from typing import Any

import torch


def timed_ms(fn: Callable[[], Any], *, iters: int = 20, warmup: int = 3) -> float:
    """Median milliseconds of ``fn`` over ``iters`` runs timed with CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def gemm_alignment() -> list[dict[str, Any]]:
    """Head GEMMs (tokens 4096, hidden 2560) at vocabularies 50304, 50258, 50257 and 32000/32001."""
    rows = []
    for tokens, hidden, vocab in (
        (4096, 2560, 50304), (4096, 2560, 50258), (4096, 2560, 50257),
        (8192, 4096, 32000), (8192, 4096, 32001),
    ):  # fmt: skip
        x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(vocab, hidden, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16)
        flops = 2.0 * tokens * hidden * vocab
        for layout, fn in (
            ("forward", lambda x=x, w=w: x @ w.t()),
            ("input_grad", lambda dy=dy, w=w: dy @ w),
            ("weight_grad", lambda dy=dy, x=x: dy.t() @ x),
        ):
            ms = timed_ms(fn)
            rows.append({"tokens": tokens, "hidden": hidden, "vocab": vocab, "layout": layout,
                         "ms": ms, "tflops": flops / ms / 1e9})  # fmt: skip
        del x, w, dy
    return rows


def attention_head_dim() -> list[dict[str, Any]]:
    """Causal SDPA at width 2560, sequence 2048, batch 2, per head dimension and backend."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    sdpa = torch.nn.functional.scaled_dot_product_attention
    rows = []
    batch, seq, width = 2, 2048, 2560
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION):
        for head_dim in (64, 80, 96, 128):
            heads = width // head_dim
            shape = (batch, heads, seq, head_dim)
            q, k, v = (
                torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                for _ in range(3)
            )
            flops = 4.0 * batch * heads * seq * seq * head_dim / 2  # causal: half the square
            try:
                with sdpa_kernel(backend):
                    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                    grad = torch.randn_like(out)
                    fwd = timed_ms(lambda q=q, k=k, v=v: sdpa(q, k, v, is_causal=True))
                    both = timed_ms(
                        lambda q=q, k=k, v=v, g=grad: torch.autograd.grad(
                            sdpa(q, k, v, is_causal=True), (q, k, v), g
                        )
                    )
            except RuntimeError as error:
                failed = {"backend": backend.name, "head_dim": head_dim, "error": str(error)[:200]}
                rows.append(failed)
                continue
            rows.append({"backend": backend.name, "head_dim": head_dim, "heads": heads,
                         "forward_ms": fwd, "backward_ms": both - fwd,
                         "forward_tflops": flops / fwd / 1e9,
                         "backward_tflops": 2.5 * flops / (both - fwd) / 1e9})  # fmt: skip
    return rows


def _llama_shapes(hidden: int, ffn: int, kv: int, layers: int, vocab: int) -> list[tuple[int, ...]]:
    per_layer = [(hidden,), (hidden + 2 * kv, hidden), (hidden, hidden), (hidden,),
                 (2 * ffn, hidden), (hidden, ffn)]  # fmt: skip
    return [(vocab, hidden)] + per_layer * layers + [(hidden,), (vocab, hidden)]


def fused_adamw() -> list[dict[str, Any]]:
    """Fused and foreach AdamW over fp32 parameters of a 1B and a 0.2B Llama-style model."""
    rows = []
    for name, shapes in (
        ("llama-h2048-l16-v128256", _llama_shapes(2048, 8192, 512, 16, 128256)),
        ("llama-h1024-l8-v32000", _llama_shapes(1024, 4096, 1024, 8, 32000)),
    ):
        params = [torch.nn.Parameter(torch.randn(s, device="cuda")) for s in shapes]
        for p in params:
            p.grad = torch.randn_like(p)
        count = sum(p.numel() for p in params)
        for impl in ("fused", "foreach"):
            opt = torch.optim.AdamW(params, lr=1e-4, **{impl: True})
            ms = timed_ms(opt.step, iters=10)
            rows.append({"model": name, "impl": impl, "params": count, "tensors": len(params),
                         "ms": ms, "gb_per_s_at_28_bytes": 28.0 * count / ms / 1e6})  # fmt: skip
            del opt
        del params
    return rows


def _memory_rows(shape: tuple[int, ...]) -> list[dict[str, Any]]:
    bf16, fp32 = torch.bfloat16, torch.float32
    n = 1
    for dim in shape:
        n *= dim
    x32 = torch.randn(shape, device="cuda", dtype=fp32)
    y32 = torch.randn(shape, device="cuda", dtype=fp32)
    x16 = torch.randn(shape, device="cuda", dtype=bf16)
    y16 = torch.randn(shape, device="cuda", dtype=bf16)
    layer_norm = torch.nn.LayerNorm(shape[-1], device="cuda")
    rms_norm = torch.nn.RMSNorm(shape[-1], device="cuda", dtype=bf16)
    cases: list[tuple[str, Callable[[], Any], int]] = [
        ("cast fp32->bf16", lambda: x32.to(bf16), 6),
        ("cast bf16->fp32", lambda: x16.to(fp32), 6),
        ("add fp32+bf16->fp32", lambda: x32 + x16, 10),
        ("add_ fp32 in place", lambda: x32.add_(y32), 12),
        ("add bf16", lambda: x16 + y16, 6),
        ("zero fill fp32", lambda: y32.zero_(), 4),
        ("layer_norm fp32", lambda: layer_norm(x32), 8),
        ("rms_norm bf16", lambda: rms_norm(x16), 4),
        ("gelu bf16", lambda: torch.nn.functional.gelu(x16), 4),
    ]
    rows = []
    for name, fn, per_element in cases:
        with torch.no_grad():
            ms = timed_ms(fn)
        rows.append({"kernel": name, "shape": list(shape), "bytes_per_element": per_element,
                     "ms": ms, "gb_per_s": per_element * n / ms / 1e6})  # fmt: skip
    return rows


def memory_kernels() -> list[dict[str, Any]]:
    """Memory-bound kernels of an autocast step at a weight's size (2048 x 8192) and an
    activation's (4 x 2048 x 2048 and 8 x 2048 x 4096), with the bytes each reads and writes."""
    return [row for shape in ((2048, 8192), (4, 2048, 2048), (8, 2048, 4096))
            for row in _memory_rows(shape)]  # fmt: skip


def sustained(seconds: float) -> dict[str, Any]:
    """An 8192^3 bf16 GEMM back to back: rate per second, clocks, power and temperature."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    smi = subprocess.Popen(
        ["nvidia-smi", "--format=csv,noheader", "-lms", "1000",
         "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    rates = []
    begin = time.perf_counter()
    while time.perf_counter() - begin < seconds:
        count, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 1.0:
            for _ in range(10):
                a @ b
            torch.cuda.synchronize()
            count += 10
        rates.append(2.0 * n**3 * count / (time.perf_counter() - t0) / 1e12)
    smi.terminate()
    samples = smi.communicate(timeout=10)[0].strip().splitlines()
    return {"tflops_per_second": rates, "nvidia_smi": samples}


def _ring_module() -> Any:
    """torch's context-parallel attention module (its path moved between releases)."""
    try:
        from torch.distributed.tensor.experimental._context_parallel import _attention
    except ImportError:  # torch before the move
        from torch.distributed.tensor.experimental import _attention  # type: ignore[no-redef]
    return _attention


def _flash_rates(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool
) -> dict[str, float]:
    """Milliseconds of one flash attention call and of its backward."""
    aten = torch.ops.aten
    out, lse, cq, ck, mq, mk, seed, offset, _ = aten._scaled_dot_product_flash_attention(
        q, k, v, is_causal=causal
    )
    grad = torch.randn_like(out)

    def forward() -> Any:
        return aten._scaled_dot_product_flash_attention(q, k, v, is_causal=causal)

    def backward() -> Any:
        return aten._scaled_dot_product_flash_attention_backward(
            grad, q, k, v, out, lse, cq, ck, mq, mk, 0.0, causal, seed, offset
        )

    return {
        "forward_ms": timed_ms(forward, iters=5, warmup=1),
        "backward_ms": timed_ms(backward, iters=5, warmup=1),
    }


def _ring_rates(
    ring: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cp: int, rank: int
) -> dict[str, float]:
    """Milliseconds of rank ``rank``'s ring forward and backward at degree ``cp`` (fake group)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    aten = torch.ops.aten
    dist.init_process_group("fake", rank=rank, world_size=cp, store=FakeStore())
    group = dist.group.WORLD
    op = aten._scaled_dot_product_flash_attention
    try:
        out, lse, cq, ck, mq, mk, seed, offset, *_ = ring._templated_ring_attention(
            group, 2, op, q, k, v, is_causal=True
        )
        grad = torch.randn_like(out)

        def forward() -> Any:
            return ring._templated_ring_attention(group, 2, op, q, k, v, is_causal=True)

        def backward() -> Any:
            return ring._templated_ring_attention_backward(
                group, 2, aten._scaled_dot_product_flash_attention_backward.default,
                grad_out=grad, grad_out_name="grad_out", query=q, key=k, value=v, out=out,
                logsumexp=lse, is_causal=True, cum_seq_q=cq, cum_seq_k=ck, max_q=mq, max_k=mk,
                dropout_p=0.0, philox_seed=seed, philox_offset=offset, scale=None,
            )  # fmt: skip

        return {
            "forward_ms": timed_ms(forward, iters=3, warmup=1),
            "backward_ms": timed_ms(backward, iters=3, warmup=1),
        }
    finally:
        dist.destroy_process_group()


def cp_ring(local_seq: int = 32768, head_dim: int = 128) -> list[dict[str, Any]]:
    """One rank of torch's CP ring (fake process group) at CP 1, 2, 4, 8, per local head count."""
    ring = _ring_module()
    rows: list[dict[str, Any]] = []
    half = local_seq // 2
    for heads in (32, 16):
        # torchtitan's layout: (batch, seq, heads, dim) transposed to (batch, heads, seq, dim)
        shape = (1, local_seq, heads, head_dim)
        q, k, v = (
            torch.randn(shape, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
            for _ in range(3)
        )
        base = {"heads": heads, "local_seq": local_seq}
        for name, qq, kk, vv, causal in (
            ("causal_local", q, k, v, True),
            ("all_q_half_kv", q, k[:, :, :half], v[:, :, :half], False),
            ("half_q_all_kv", q[:, :, half:], k, v, False),
        ):
            rates = _flash_rates(qq.contiguous(), kk.contiguous(), vv.contiguous(), causal)
            rows.append({"part": "call", **base, "call": name, **rates})
        for cp in (1, 2, 4, 8):
            for rank in sorted({0, cp - 1}):
                # forward FLOPs of one rank (every rank alike); the backward's are 2.5x
                flops = 2.0 * cp * local_seq**2 * heads * head_dim
                rates = (
                    _flash_rates(q, k, v, True) if cp == 1 else _ring_rates(ring, q, k, v, cp, rank)
                )
                row = {"part": "ring", **base, "cp": cp, "rank": rank, "forward_flops": flops}
                rows.append({**row, **rates})
                print(rows[-1], flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return rows


FLOAT8_LINEARS = {
    "8b": ((4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336)),
    "70b_tp8": ((1024, 8192), (128, 8192), (3584, 8192), (8192, 3584), (8192, 1024)),
    "405b_tp8": ((2048, 16384), (6656, 16384), (16384, 6656), (16384, 2048)),
}
"""(out_features, in_features) of each linear per GPU: wq, wk/wv, w1/w3, w2 (and wo under TP)."""


def _scaled_mm_ms(m: int, n: int, k: int, scaling: str, fast: bool) -> float:
    """``torch._scaled_mm`` of (m, k) by (k, n) e4m3 operands, bf16 out."""
    a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()  # column-major
    if scaling == "rowwise":
        sa = torch.ones(m, 1, device="cuda")
        sb = torch.ones(1, n, device="cuda")
    else:
        sa = torch.ones((), device="cuda")
        sb = torch.ones((), device="cuda")
    gemm = functools.partial(
        torch._scaled_mm, a, b, sa, sb, out_dtype=torch.bfloat16, use_fast_accum=fast
    )
    return timed_ms(gemm, iters=10)


def float8_gemm(tokens: int = 8192) -> list[dict[str, Any]]:
    """Each linear's three GEMMs in bf16 and in float8 with each scaling and accumulation."""
    rows = []
    for model, linears in FLOAT8_LINEARS.items():
        for out_features, in_features in linears:
            for layout, (m, n, k) in (
                ("forward", (tokens, out_features, in_features)),
                ("input_grad", (tokens, in_features, out_features)),
                ("weight_grad", (out_features, in_features, tokens)),
            ):
                a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16).t()
                row: dict[str, Any] = {"model": model, "layout": layout, "m": m, "n": n, "k": k}
                row["bf16_ms"] = timed_ms(functools.partial(torch.mm, a, b), iters=10)
                for scaling in ("tensorwise", "rowwise"):
                    for fast in (True, False):
                        key = f"{scaling}_{'fast' if fast else 'exact'}_ms"
                        try:
                            row[key] = _scaled_mm_ms(m, n, k, scaling, fast)
                        except RuntimeError as error:  # a layout the kernel refuses
                            row[key] = None
                            row[key.replace("_ms", "_error")] = str(error).splitlines()[0]
                row["tflops_bf16"] = 2.0 * m * n * k / row["bf16_ms"] / 1e9
                rows.append(row)
                del a, b
    return rows


class _MegatronCrossEntropy(torch.autograd.Function):
    """Megatron-Core's ``_VocabParallelCrossEntropy`` on one rank (its all-reduces are over one
    rank: nothing), pass for pass."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        logits_max = torch.max(logits, dim=-1)[0]
        logits -= logits_max.unsqueeze(dim=-1)
        logits_2d = logits.view(-1, logits.size(-1))
        arange_1d = torch.arange(logits_2d.size(0), device=logits.device)
        predicted = logits_2d[arange_1d, target.view(-1)].clone().view_as(target)
        torch.exp(logits, out=logits)
        sum_exp = logits.sum(dim=-1)
        loss = torch.log(sum_exp) - predicted
        logits.div_(sum_exp.unsqueeze(dim=-1))
        ctx.save_for_backward(logits, target)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor, None]:
        softmax, target = ctx.saved_tensors
        grad_2d = softmax.view(-1, softmax.size(-1))
        arange_1d = torch.arange(grad_2d.size(0), device=softmax.device)
        grad_2d[arange_1d, target.view(-1)] -= 1.0
        softmax.mul_(grad_output.unsqueeze(dim=-1))
        return softmax, None


def _megatron_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return _MegatronCrossEntropy.apply(logits, target)


def _torch_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cross_entropy(logits.float(), target, reduction="none")


CROSS_ENTROPY_IMPLS = {
    "megatron_unfused": (_megatron_loss, 38, 14),
    "torch_float": (_torch_loss, 16, 8),
}
"""Each loss, with the bytes per logit its forward and backward move: Megatron-Core's counted
from its code; PyTorch's a nominal count (the bf16 read and fp32 write of the cast, the
log-softmax's read and write; the backward's gradient) for comparing rates, not a count of
every pass its kernels make."""


def _cross_entropy_row(impl: str, tokens: int, vocab: int) -> dict[str, Any]:
    loss_fn, forward_bytes, backward_bytes = CROSS_ENTROPY_IMPLS[impl]
    logits = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16)
    target = torch.randint(0, vocab, (tokens,), device="cuda")

    def forward() -> torch.Tensor:
        return loss_fn(logits.detach().requires_grad_(), target)

    forward_ms = timed_ms(forward, iters=10)
    backward_ms = timed_ms(lambda: forward().sum().backward(), iters=10) - forward_ms
    logit_count = tokens * vocab
    return {"impl": impl, "tokens": tokens, "vocab": vocab, "forward_ms": forward_ms,
            "backward_ms": backward_ms, "bytes_per_logit": [forward_bytes, backward_bytes],
            "forward_gb_per_s": forward_bytes * logit_count / forward_ms / 1e6,
            "backward_gb_per_s": backward_bytes * logit_count / backward_ms / 1e6}  # fmt: skip


def cross_entropy() -> list[dict[str, Any]]:
    """The loss's forward and backward over bf16 logits of tokens x vocabulary (per TP rank)."""
    rows = []
    for tokens, vocab in ((8192, 151936), (8192, 75968), (4096, 128256), (8192, 50304)):
        for impl in CROSS_ENTROPY_IMPLS:
            rows.append(_cross_entropy_row(impl, tokens, vocab))
            torch.cuda.empty_cache()
    return rows


def _kernels_launched(fn: Callable[[], Any]) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]


def _qk_norm_row(shape: tuple[int, ...], weights: str) -> dict[str, Any]:
    autocast = weights == "fp32_autocast"
    dtype = torch.float32 if autocast else torch.bfloat16
    norm = torch.nn.RMSNorm(shape[-1], device="cuda", dtype=dtype)
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    def forward() -> torch.Tensor:
        with torch.autocast("cuda", torch.bfloat16, enabled=autocast):
            return norm(x)

    y = forward()
    forward_kernels = _kernels_launched(forward)
    backward_kernels = _kernels_launched(lambda: y.backward(grad, retain_graph=True))

    def forward_and_backward() -> None:
        x.grad = norm.weight.grad = None  # no accumulation into the previous run's gradients
        forward().backward(grad)

    forward_ms = timed_ms(forward)
    backward_ms = timed_ms(forward_and_backward) - forward_ms
    return {"shape": list(shape), "weights": weights, "forward_ms": forward_ms,
            "backward_ms": backward_ms, "forward_kernels": forward_kernels,
            "backward_kernels": backward_kernels}  # fmt: skip


def qk_norm() -> list[dict[str, Any]]:
    """RMSNorm over each head of a bf16 projection: fp32 weights under autocast, bf16 weights."""
    return [
        _qk_norm_row(shape, weights)
        for shape in ((4, 2048, 16, 128), (1, 4096, 64, 128))
        for weights in ("fp32_autocast", "bf16")
    ]


PARTS = (
    "gemm_alignment", "attention_head_dim", "fused_adamw", "memory_kernels", "sustained",
    "cp_ring", "float8_gemm", "cross_entropy", "qk_norm",
)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True)
    parser.add_argument("--sustained-s", type=float, default=40.0)
    parser.add_argument("--parts", default=",".join(PARTS), help="comma-separated parts to run")
    args = parser.parse_args()
    wanted = args.parts.split(",")
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
    }
    for name, part in (
        ("gemm_alignment", gemm_alignment),
        ("attention_head_dim", attention_head_dim),
        ("fused_adamw", fused_adamw),
        ("memory_kernels", memory_kernels),
        ("sustained", lambda: sustained(args.sustained_s)),
        ("cp_ring", cp_ring),
        ("float8_gemm", float8_gemm),
        ("cross_entropy", cross_entropy),
        ("qk_norm", qk_norm),
    ):
        if name not in wanted:
            continue
        t0 = time.perf_counter()
        result[name] = part()
        print(f"{name}: {time.perf_counter() - t0:.1f} s", flush=True)
        with open(args.output, "w") as handle:
            json.dump(result, handle, indent=1)


if __name__ == "__main__":
    main()
