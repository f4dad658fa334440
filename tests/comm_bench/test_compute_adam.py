"""The CPU Adam measurement of ``commbench --compute`` and its place in the calibration."""

import pytest

torch = pytest.importorskip("torch")

from comm_bench.compute import main, measure_cpu_adam  # noqa: E402
from vocab.compute_calibration import (  # noqa: E402
    ComputeCalibration,
    load_compute_calibration,
)


def test_cpu_adam_step_is_timed():
    seconds, impl = measure_cpu_adam(1 << 12, iters=2, warmup=1, repeats=1)
    assert seconds > 0
    assert impl.startswith("torch.optim.AdamW(")


def test_calibration_carries_the_adam_rate(tmp_path, capsys):
    out = tmp_path / "cpu.json"
    argv = ["--device", "cpu", "--no-attention", "--sizes", "16", "--shapes", "16x16x16"]
    assert main([*argv, "--adam-params", "4096", "--adam-threads", "1", "-o", str(out)]) == 0
    assert "# cpu adam: 4,096 fp32 params, 1 threads" in capsys.readouterr().out
    calibration = load_compute_calibration(out)
    assert calibration.cpu_adam_params_per_s > 0
    assert ComputeCalibration.from_json(calibration.to_json()) == calibration


def test_bad_adam_flags_and_values():
    assert main(["--device", "cpu", "--adam-params", "-1"]) == 2
    with pytest.raises(ValueError, match="cpu_adam_params_per_s"):
        ComputeCalibration(cpu_adam_params_per_s=-5.0)
