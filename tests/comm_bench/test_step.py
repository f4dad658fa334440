"""``commbench --step`` on CPU: a real (tiny) training step, timed, profiled and written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from comm_bench import cli
from comm_bench.step_model import build_model
from schedules.params import total_params
from schedules.plan import load_plan
from schedules.resolve import resolve_plan

PLAN = {
    "model": {
        "name": "tiny", "num_layers": 3, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 2,
        "ffn_hidden_size": 128, "vocab_size": 256, "seq_len": 32,
    },
    "cluster": {"node": "localhost", "num_nodes": 1},
    "parallel": {"recompute": "selective"},
    "training": {"micro_batch_size": 2, "global_batch_size": 8},
}  # fmt: skip


LATENT = {
    "num_kv_heads": 4, "head_dim": 16, "kv_lora_rank": 8, "q_lora_rank": 12,
    "qk_rope_head_dim": 4, "v_head_dim": 12,
}  # fmt: skip
"""Multi-head latent attention on the tiny model: 4 heads of 16 + 4 rotary channels, values 12."""


def _plan(tmp_path: Path, **model: object) -> Path:
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump({**PLAN, "model": {**PLAN["model"], **model}}))
    return path


@pytest.mark.parametrize(
    "model",
    [
        {},
        {"mlp_activation": "gelu", "norm": "layernorm", "linear_bias": True},
        {"position_embedding": "learned", "tied_embeddings": True},
        {"head_dim": 24, "qk_norm": True},  # Qwen3: 4 heads of 24 on h = 64
        {"separate_projections": True, "linear_bias": True},
        {"separate_projections": True, "mlp_activation": "gelu"},
        {"parallel_block": True, "norm": "layernorm"},
        LATENT,
        {**LATENT, "q_lora_rank": 0, "linear_bias": True},  # the query projected directly
        {**LATENT, "norm": "layernorm"},  # the latents' norms of the model's kind
    ],
)
def test_the_torch_model_has_the_plans_parameter_count(tmp_path: Path, model: dict) -> None:
    plan = load_plan(_plan(tmp_path, **model))
    built = build_model(plan.model, num_layers=3, recompute="none")
    assert sum(p.numel() for p in built.parameters()) == total_params(plan.model)


@pytest.mark.parametrize("positions", ["rope", "none"])
def test_grouped_heads_handed_to_sdpa_give_the_repeated_result(
    tmp_path: Path, positions: str
) -> None:
    plan = load_plan(_plan(tmp_path, position_embedding=positions))  # 4 query, 2 K/V heads
    assert plan.model.num_kv_heads < plan.model.num_heads
    torch.manual_seed(0)
    repeated = build_model(plan.model, num_layers=2, recompute="none")
    torch.manual_seed(0)
    grouped = build_model(plan.model, num_layers=2, recompute="none", repeat_kv=False)
    tokens, labels = torch.randint(0, 256, (2, 32)), torch.randint(0, 256, (2, 32))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        loss = grouped(tokens, labels)
    ops = {event.key for event in prof.key_averages()}
    assert "aten::repeat_interleave" not in ops
    assert torch.allclose(loss, repeated(tokens, labels), rtol=1e-5, atol=1e-6)


def test_heads_set_apart_from_h_run_at_their_width(tmp_path: Path) -> None:
    plan = load_plan(_plan(tmp_path, head_dim=24, qk_norm=True))
    built = build_model(plan.model, num_layers=1, recompute="none")
    attention = built.layers[0].attention
    assert attention.qkv.weight.shape == (4 * 24 + 2 * 2 * 24, 64)  # a*d + 2 * kv*d rows
    assert attention.out.weight.shape == (64, 4 * 24)
    assert attention.q_norm.weight.shape == (24,)
    tokens, labels = torch.randint(0, 256, (2, 32)), torch.randint(0, 256, (2, 32))
    built(tokens, labels).backward()
    assert attention.q_norm.weight.grad is not None  # on the path of the loss


@pytest.mark.parametrize(
    ("key", "value"),
    [("num_experts", 4), ("attention_window", 8), ("dropout", True), ("mtp_num_layers", 1)],
)
def test_what_the_loop_does_not_build_is_refused_with_one_line(
    tmp_path: Path, capsys, key: str, value: object
) -> None:
    argv = ["--step", str(_plan(tmp_path, **{key: value})), "--device", "cpu", "--steps", "1"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"model.{key}={value}" in err and "commbench --step does not build" in err


def test_latent_attention_runs_at_its_widths(tmp_path: Path, capsys) -> None:
    plan = load_plan(_plan(tmp_path, **LATENT))
    built = build_model(plan.model, num_layers=1, recompute="selective")
    attention = built.layers[0].attention
    assert attention.q_up.weight.shape == (4 * (16 + 4), 12)
    assert attention.kv_down.weight.shape == (8 + 4, 64)
    assert attention.kv_up.weight.shape == (4 * (16 + 12), 8)
    assert attention.out.weight.shape == (64, 4 * 12)
    tokens, labels = torch.randint(0, 256, (2, 32)), torch.randint(0, 256, (2, 32))
    built(tokens, labels).backward()
    assert attention.kv_norm.weight.grad is not None  # the latent norm is on the loss's path
    argv = ["--step", str(_plan(tmp_path, **LATENT)), "--layers", "1", "--steps", "1",
            "--warmup", "0", "--device", "cpu", "-o", str(tmp_path / "step.json")]  # fmt: skip
    assert cli.main(argv) == 0
    result = json.loads((tmp_path / "step.json").read_text())
    assert result["plan"]["model"]["kv_lora_rank"] == 8 and result["timings_s"]["step"] > 0


def test_a_step_is_timed_profiled_and_written(tmp_path: Path, capsys) -> None:
    out = tmp_path / "step.json"
    argv = ["--step", str(_plan(tmp_path)), "--layers", "2", "--microbatches", "2",
            "--steps", "1", "--warmup", "0", "--device", "cpu", "-o", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "# 2 of 3 layers (a slice of the model: what fits this device)" in text
    result = json.loads(out.read_text())
    assert result["schema"] == "commbench-step/1" and result["gpu"] == "cpu"
    timings = result["timings_s"]
    assert timings["step"] >= 2 * (timings["forward"] + timings["backward"]) * 0.5 > 0
    classes = result["profile"]["classes_s"]
    assert classes["gemm"] > 0 and classes["attention"] > 0 and classes["optimizer"] > 0
    assert result["profile"]["num_kernels"] > 10
    # the idle share printed is the unprofiled step's: 1 - the profiled kernels' busy time / step
    idle = max(0.0, 1.0 - result["profile"]["busy_s"] / timings["step"])
    per_kernel = timings["step"] / result["profile"]["num_kernels"] * 1e6
    assert (
        f"# unprofiled step: {per_kernel:.1f} us per kernel launched, the device idle {idle:.1%}"
        in text
    )
    # the measured plan is one device, the slice, the step's batch: it resolves on one GPU
    measured = resolve_plan(load_plan(result["plan"]), 1)
    assert measured.model.num_layers == 2
    assert (measured.training.global_batch_size, measured.parallel.recompute) == (4, "selective")


def test_trace_out_writes_the_profiled_steps_trace(tmp_path: Path) -> None:
    from vocab.trace_summary import read_step

    trace = tmp_path / "trace.json.gz"
    argv = ["--step", str(_plan(tmp_path)), "--layers", "2", "--microbatches", "2", "--steps",
            "1", "--warmup", "0", "--device", "cpu", "--trace-out", str(trace)]  # fmt: skip
    assert cli.main(argv) == 0
    step = read_step(trace, device="cpu")  # a CPU trace: its ATen operators are the work
    assert step.marker == "optimizer steps" and step.phases_s["backward"] > 0
    assert step.gemm_shapes  # shapes recorded
    assert cli.main([*argv[:-2], "--no-profile", "--trace-out", str(trace)]) == 2


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--layers", "0"], "--layers must be >= 1, got 0"),
        (["--steps", "0"], "--steps must be >= 1, got 0"),
        (["--warmup=-1"], "--warmup must be >= 0, got -1"),
        (["--microbatches", "0"], "--microbatches must be >= 1, got 0"),
        (["--device", "tpu"], "argument --device: invalid choice: 'tpu'"),
        (["--layers", "99"], "--layers 99: the plan's model tiny has 3 layers"),
        (["--max-minutes", "nan"], "--max-minutes must be > 0, got nan"),
        (["--max-minutes=-1"], "--max-minutes must be > 0, got -1"),
        (["--max-minutes", "0"], "--max-minutes must be > 0, got 0"),
    ],
)
def test_bad_flags_are_one_line_and_write_nothing(
    tmp_path: Path, capsys, extra: list[str], message: str
) -> None:
    out = tmp_path / "step.json"
    argv = ["--step", str(_plan(tmp_path)), "--device", "cpu", "-o", str(out), *extra]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("commbench: error: ") and message in err and err.count("\n") == 1
    assert "Traceback" not in err and not out.exists()


def test_a_plan_its_own_cluster_cannot_run_is_refused_as_commsim_does(
    tmp_path: Path, capsys
) -> None:
    """tp=3 does not divide the localhost cluster's 2 ranks: ``commsim plan`` refuses the plan,
    and so does the step that would measure a slice of it."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump({**PLAN, "parallel": {"recompute": "selective", "tp": 3}}))
    out = tmp_path / "step.json"
    assert cli.main(["--step", str(plan), "--device", "cpu", "--steps", "1", "-o", str(out)]) == 2
    assert capsys.readouterr().err == (
        "commbench: error: world size 2 is not divisible by tp*cp*pp = 3 (tp=3, cp=1, pp=1)\n"
    )
    assert not out.exists()


def test_a_missing_plan_is_one_line(tmp_path: Path, capsys) -> None:
    assert cli.main(["--step", str(tmp_path / "absent.yaml"), "--device", "cpu"]) == 2
    assert "plan file not found" in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_gpu_steps_trace_reads_back_as_its_profile(tmp_path: Path) -> None:
    from vocab.trace_summary import read_step

    out, trace = tmp_path / "step.json", tmp_path / "trace.json"
    argv = ["--step", str(_plan(tmp_path)), "--device", "cuda", "--microbatches", "2", "-o",
            str(out), "--trace-out", str(trace)]  # fmt: skip
    assert cli.main(argv) == 0
    profile = json.loads(out.read_text())["profile"]
    step = read_step(trace)
    assert step.num_kernels == profile["num_kernels"]
    # the trace writes microseconds with 3 decimals: a nanosecond off per kernel at most
    traced = sum(step.classes_s.values())
    assert traced == pytest.approx(sum(profile["classes_s"].values()), abs=1e-9 * step.num_kernels)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_step_on_the_gpu(tmp_path: Path) -> None:
    out = tmp_path / "step.json"
    assert cli.main(["--step", str(_plan(tmp_path)), "--device", "cuda", "-o", str(out)]) == 0
    profile = json.loads(out.read_text())["profile"]
    assert profile["classes_s"]["gemm"] > 0 and profile["busy_s"] > 0


def test_a_cpu_run_that_would_take_too_long_is_refused_first(tmp_path: Path, capsys) -> None:
    big = _plan(tmp_path, num_layers=32, hidden_size=4096, num_heads=32, num_kv_heads=8,
                ffn_hidden_size=14336, vocab_size=128256, seq_len=8192)  # fmt: skip
    out = tmp_path / "step.json"
    argv = ["--step", str(big), "--layers", "1", "--device", "cpu", "-o", str(out)]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "would take about" in err and "--max-minutes" in err and err.count("\n") == 1
    assert not out.exists()


def test_a_malformed_plan_or_an_output_over_it_is_one_line(tmp_path: Path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("model: [\n")
    assert cli.main(["--step", str(bad), "--device", "cpu"]) == 2
    assert capsys.readouterr().err.endswith("(malformed YAML plan)\n")
    plan = _plan(tmp_path)
    assert cli.main(["--step", str(plan), "--device", "cpu", "-o", str(plan)]) == 2
    assert "is also an input" in capsys.readouterr().err
    assert "model:" in plan.read_text()


def _backward_matmuls(recompute: str, tmp_path: Path) -> tuple[int, list[torch.Tensor]]:
    """Matmuls run by one backward of a 2-layer model, and the weight gradients."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        calls = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default):
                Count.calls += 1
            return func(*args, **(kwargs or {}))

    plan = load_plan(_plan(tmp_path))
    torch.manual_seed(0)
    model = build_model(plan.model, num_layers=2, recompute=recompute)
    tokens = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    loss = model(tokens, tokens)
    with Count():
        loss.backward()
    return Count.calls, [p.grad for p in model.parameters() if p.grad is not None]


def test_op_recompute_reruns_every_other_matmul_and_keeps_the_gradients(tmp_path: Path) -> None:
    """Per layer the forward runs 4 matmuls (QKV, output, up, down). The recompute stops once
    what the backward needs is back, so down (whose output only feeds the residual add) is never
    rerun: full recompute reruns 3, the per-op policy only the output projection (QKV and up are
    saved), none reruns none."""
    none, reference = _backward_matmuls("none", tmp_path)
    op, grads = _backward_matmuls("op", tmp_path)
    full, _ = _backward_matmuls("full", tmp_path)
    assert (op - none, full - none) == (2 * 1, 2 * 3)
    for got, want in zip(grads, reference, strict=True):
        torch.testing.assert_close(got, want)


def test_the_plan_stack_decides_compilation_unless_a_flag_does() -> None:
    from comm_bench.step import build_parser, wants_compile

    assert build_parser().parse_args(["plan.yaml"]).compile is None
    assert build_parser().parse_args(["plan.yaml", "--no-compile"]).compile is False
    assert wants_compile("compile", None) and not wants_compile("eager", None)
    assert not wants_compile(None, None)
    assert not wants_compile("compile", False) and wants_compile("eager", True)


def test_the_measured_plan_names_the_loop_that_ran(tmp_path: Path) -> None:
    """``--compile`` on an eager plan records ``stack: compile``; ``--no-compile`` on a compiled
    plan (with its loss kept eager) records ``eager``; the weights are always autocast's, the
    loop this command runs, whatever the plan said."""
    from comm_bench.step import measured_plan

    eager = load_plan(_plan(tmp_path))
    recorded = measured_plan(eager, num_layers=2, microbatches=3, compiled=True)
    assert recorded["training"]["stack"] == "compile"
    assert load_plan(recorded).training.global_batch_size == 6
    compiled = load_plan({**PLAN, "training": {**PLAN["training"], "stack": "compile",
                                               "compile_loss": False}})  # fmt: skip
    recorded = measured_plan(compiled, num_layers=2, microbatches=1, compiled=False)
    assert recorded["training"]["stack"] == "eager"
    assert load_plan(recorded).training.compile_loss is None
    bf16 = load_plan({**PLAN, "training": {**PLAN["training"], "mixed_precision": "bf16_weights"}})
    recorded = measured_plan(bf16, num_layers=2, microbatches=1, compiled=False)
    assert load_plan(recorded).training.mixed_precision == "autocast"
    # grouped heads handed to SDPA: kept when compiled (the compiled stack prices no repeat)
    grouped = load_plan({**PLAN, "training": {**PLAN["training"], "repeat_kv": False}})
    recorded = measured_plan(grouped, num_layers=2, microbatches=1, compiled=True)
    assert load_plan(recorded).training.repeat_kv is False


def test_the_measured_plan_names_the_gpu_that_ran(tmp_path: Path) -> None:
    """A plan written for one GPU but run on another records the one that ran (a CPU run: the
    catalogue's ``cpu``); an unknown device keeps the plan's node."""
    from comm_bench.step import measured_plan

    plan = load_plan(_plan(tmp_path))
    recorded = measured_plan(plan, num_layers=2, microbatches=1, compiled=False, gpu="h200")
    assert load_plan(recorded).cluster.node["gpu"] == "h200"
    cpu = measured_plan(plan, num_layers=2, microbatches=1, compiled=False, gpu="cpu")
    assert cpu["cluster"]["node"]["gpu"] == "cpu"
    kept = measured_plan(plan, num_layers=2, microbatches=1, compiled=False, gpu="")
    assert "gpu" not in kept["cluster"]["node"]
