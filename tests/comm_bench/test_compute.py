"""``commbench --compute`` on CPU: it measures, fits and writes a calibration sim can read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from comm_bench import compute
from sim.compute.compute_model import ComputeModel
from topologies.hardware import GPUS
from vocab.compute_calibration import load_compute_calibration

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--device", "cpu", "--sizes", "32,64", "--shapes", "64x32x16", "--iters", "2"]
TINY += ["--warmup", "0", "--seq-lens", "32,64", "--heads", "2", "--head-dim", "16"]


def test_compute_benchmark_writes_a_valid_calibration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "compute.json"
    assert compute.main([*TINY, "--output", str(output)]) == 0
    printed = capsys.readouterr().out
    assert "# fit gemm fp32" in printed and f"# wrote {output}" in printed
    calibration = load_compute_calibration(output)
    assert calibration.gpu == "cpu"
    assert set(calibration.kernels["fp32"]) == {"gemm", "attention_forward", "attention_backward"}
    assert len(calibration.measurements) == 3 + 2 * 2
    assert calibration.memory_bandwidth_bytes_per_s and calibration.memory_bandwidth_bytes_per_s > 0
    for sample in calibration.measurements:
        assert sample["time_s"] > 0 and sample["flops"] > 0
    gemm = calibration.kernels["fp32"]["gemm"]
    model = ComputeModel(GPUS["cpu"], calibration)
    assert model.gemm_time_s(64, 64, 64, "fp32") >= gemm.time_s(2 * 64**3, (64, 64, 64))


def test_gemm_only_run_without_output(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--device", "cpu", "--sizes", "16", "--shapes", "16x16x32", "--no-attention"]
    assert compute.main([*args, "--iters", "1", "--warmup", "0"]) == 0
    assert "attention" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sizes", "abc"], "--sizes: expected comma-separated integers"),
        (["--shapes", "1x2"], "--shapes: '1x2' is not MxNxK"),
        (["--dtype", "int8"], "--dtype 'int8' is not one of"),
        (["--iters", "0"], "--iters must be >= 1, got 0"),
        (["--repeats", "0"], "--repeats must be >= 1, got 0"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (["--dtype", "fp8"], "--dtype fp8 needs a CUDA GPU"),
    ],
)
def test_bad_flags_print_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert compute.main(["--device", "cpu", "--no-attention", "--sizes", "8", *argv]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and message in error


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a host without CUDA")
def test_cuda_without_gpu_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert compute.main(["--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err


def test_commbench_cli_and_module_entry_points(tmp_path: Path) -> None:
    from comm_bench import cli

    output = tmp_path / "via_cli.json"
    assert cli.main(["--compute", *TINY, "--no-attention", "-o", str(output)]) == 0
    assert load_compute_calibration(output).kernels["fp32"]["gemm"].max_flops_per_s > 0
    result = subprocess.run(
        [sys.executable, "-m", "comm_bench.compute", "--sizes", "abc"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2 and "expected comma-separated integers" in result.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_gpu_bf16_curve(tmp_path: Path) -> None:
    output = tmp_path / "gpu.json"
    argv = ["--device", "cuda", "--sizes", "1024,4096", "--shapes", "4096x4096x1024"]
    assert compute.main([*argv, "--seq-lens", "1024,2048", "--output", str(output)]) == 0
    fit = load_compute_calibration(output).kernels["bf16"]["gemm"]
    assert fit.max_flops_per_s > 1e13


def test_an_unwritable_output_is_refused_before_measuring(tmp_path, capsys):
    from comm_bench.compute import main

    missing_dir = tmp_path / "nope" / "c.json"
    assert main(["--device", "cpu", "--output", str(missing_dir)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["--device", "cpu", "--output", str(tmp_path / "c.txt")]) == 2
    assert "the extension '.txt' is not one this output writes" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def _refused(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """Run ``commbench --compute argv -o tmp/c.json``; assert exit 2, one line, nothing written,
    and return the message after ``error: ``."""
    output = tmp_path / "c.json"
    assert compute.main(["--device", "cpu", "--adam-params", "0", *argv, "-o", str(output)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert captured.err.count("\n") == 1 and captured.err.startswith("commbench --compute: error: ")
    assert not output.exists() and list(tmp_path.iterdir()) == []
    return captured.err.removeprefix("commbench --compute: error: ").rstrip("\n")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--batch=-1"], "--batch must be >= 1, got -1"),
        (["--batch", "0"], "--batch must be >= 1, got 0"),
        (["--heads=-1"], "--heads must be >= 1, got -1"),
        (["--heads", "0"], "--heads must be >= 1, got 0"),  # was: the default, silently
        (["--head-dim=-4"], "--head-dim must be >= 1, got -4"),
        (["--head-dim", "0"], "--head-dim must be >= 1, got 0"),  # was: no attention, silently
        (["--warmup=-1"], "--warmup must be >= 0, got -1"),
        (["--adam-params=-1"], "--adam-params must be >= 0, got -1"),
        (["--adam-threads", "0"], "--adam-threads must be >= 1, got 0"),
        (["--gpu", "z100"], "unknown --gpu 'z100'; valid: " + ", ".join(sorted(GPUS))),
        (["--gpu", "h100"], "unknown --gpu 'h100' (did you mean 'h200' or 'h100-sxm'?); valid: "),
    ],
)
def test_bad_counts_and_an_unknown_gpu_are_refused_before_measuring(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _refused(argv, tmp_path, capsys).startswith(message)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sizes", "10000000000"], "--sizes 10000000000: its tensors need 1,734.7 EiB"),
        (
            ["--seq-lens", "10000000000"],
            "--seq-lens 10000000000 (batch 1, 2 heads of 32): its tensors need 21.0 TiB",
        ),
        (
            ["--shapes", "100000000x100000000x100000000", "--no-attention"],
            "--shapes 100000000x100000000x100000000: its tensors need 177.6 PiB",
        ),
        (
            ["--adam-params", "100000000000000", "--sizes", "64", "--no-attention"],
            "--adam-params 100000000000000: its tensors need 1.4 PiB",
        ),
    ],
)
def test_sizes_beyond_the_devices_memory_are_refused_before_measuring(
    argv: list[str],
    message: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("comm_bench.memory.ram_bytes", lambda: 16 << 30)
    assert _refused(argv, tmp_path, capsys) == (
        f"{message}, more than the 16.0 GiB of RAM of this machine"
    )


def test_an_allocation_torch_refuses_is_one_line_naming_the_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The safety net behind the estimate: a 1e10 x 1e10 tensor overflows torch's byte count,
    so it fails at once without allocating anything."""
    monkeypatch.setattr("comm_bench.compute_inputs.shortfall", lambda *args, **kwargs: None)
    message = _refused(["--sizes", "10000000000", "--no-attention"], tmp_path, capsys)
    assert message == (
        "the GEMM 10000000000x10000000000x10000000000: torch could not allocate its tensors "
        "(too large for the memory free now)"
    )
