"""Inputs found by fuzzing that used to crash, hang or be accepted: each is one line, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from sim.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
BASE: dict[str, Any] = {
    "model": {
        "name": "m", "num_layers": 2, "hidden_size": 256, "num_heads": 4,
        "ffn_hidden_size": 1024, "seq_len": 256, "vocab_size": 1024,
    },
    "cluster": {"node": "dgx-h100", "num_nodes": 1},
    "parallel": {"tp": 2},
    "training": {"global_batch_size": 8, "micro_batch_size": 1},
}  # fmt: skip


def _plan(tmp_path: Path, section: str, key: str, value: Any) -> Path:
    raw = json.loads(json.dumps(BASE))
    raw[section][key] = value
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("model", "seq_len", 10**30, "model.seq_len=1,000,000,000,000,000,000,000,000,000,000 is"),
        ("model", "hidden_size", 10**36, "larger than any model this simulates"),
        ("model", "mlp_activation", ["a"], "model.mlp_activation must be str, got ['a'] (list)"),
        ("cluster", "node", {"base": [1]}, "unknown cluster.node.base preset [1]"),
        ("training", "global_batch_size", 2**63, "at most 65,536 are simulated"),
        ("cluster", "num_nodes", 10**30, "clusters of up to 131,072 GPUs"),
    ],
)
def test_plan_values_that_used_to_crash_or_hang(
    section: str, key: str, value: Any, message: str, tmp_path: Path, capsys: Any
) -> None:
    assert main(["plan", str(_plan(tmp_path, section, key, value))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_a_bogus_default_fabric_is_named(tmp_path: Path, capsys: Any) -> None:
    raw = json.loads(json.dumps(BASE))
    raw["cluster"] = {"node": {"base": "dgx-h100", "default_fabric": "bogus"}, "num_nodes": 2}
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["plan", str(path)]) == 2
    assert "default_fabric 'bogus'; valid: ib-hdr, ib-ndr, roce-400g" in capsys.readouterr().err


def test_calibration_files_with_nonsense_are_refused(tmp_path: Path, capsys: Any) -> None:
    network = json.loads((ROOT / "results" / "localhost" / "calibration.json").read_text())
    network["fitted_from"] = 5
    bad_network = tmp_path / "net.json"
    bad_network.write_text(json.dumps(network))
    assert main(["collective", "--topology", "localhost", "--calibration", str(bad_network)]) == 2
    assert "'fitted_from' must be a JSON object, got 5" in capsys.readouterr().err
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(BASE))
    for change, message in (
        ({"memory_bandwidth_bytes_per_s": 0}, "memory_bandwidth_bytes_per_s must be a finite"),
        ({"kernels": {"bf16": {"gemm": {"max_flops_per_s": 1e15, "dim_half": 1e400}}}}, "inf"),
    ):
        compute = {"schema": "commsim-compute/1", "device": "x", "gpu": "h100-sxm", **change}
        path = tmp_path / "compute.json"
        path.write_text(json.dumps(compute).replace("Infinity", "1e400"))
        assert main(["plan", str(plan), "--compute-calibration", str(path)]) == 2
        assert message in capsys.readouterr().err


def _commbench(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "comm_bench", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
        check=False,
    )


def test_a_launcher_environment_that_makes_no_sense_is_refused() -> None:
    env = {"RANK": "5", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}
    run = _commbench(["--backend", "gloo"], env)
    assert run.returncode == 2
    assert run.stderr == "commbench: error: environment RANK=5 is not a rank of WORLD_SIZE=2\n"


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs /proc")
def test_an_output_in_an_unwritable_folder_is_refused_before_spawning() -> None:
    run = _commbench(["--backend", "gloo", "--nprocs", "2", "--output", "/proc/x.json"], {})
    assert run.returncode == 2
    assert (
        run.stderr
        == "commbench: error: --output '/proc/x.json': cannot write in the folder '/proc'\n"
    )
