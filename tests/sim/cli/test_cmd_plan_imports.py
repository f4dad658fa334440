"""``commsim plan`` from the configs people already have, merged, warned about, exported."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sim.cli.main import main

FIXTURES = Path(__file__).resolve().parents[2] / "schedules" / "fixtures"
HF = FIXTURES / "Meta-Llama-3-8B" / "config.json"
TITAN = FIXTURES / "llama3_8b.toml"


def _base(tmp_path: Path) -> Path:
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump({"training": {"micro_batch_size": 1, "global_batch_size": 64}}))
    return path


def _step(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[float, str]:
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    return float(json.loads(captured.out)["step_time_s"]), captured.err


def test_hf_config_and_torchtitan_toml_make_a_plan_that_exports_and_reloads(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exported = tmp_path / "understood.yaml"
    argv = ["plan", str(_base(tmp_path)), "--model", str(HF), "--torchtitan", str(TITAN),
            "--cluster", "dgx-h100", "--nodes", "1", "--export-plan", str(exported)]  # fmt: skip
    step, err = _step(argv, capsys)
    assert "commsim: warning: config.json: rope_theta is not modelled (ignored)" in err
    assert "commsim: warning: llama3_8b.toml:" in err
    plan = yaml.safe_load(exported.read_text())
    assert plan["model"]["num_kv_heads"] == 8 and plan["cluster"]["node"] == "dgx-h100"
    assert (plan["parallel"]["data_parallel"], plan["parallel"]["fsdp_version"]) == ("fsdp", 2)
    again, _ = _step(["plan", str(exported)], capsys)
    assert again == step


def test_a_preset_and_cluster_flags_complete_a_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = _base(tmp_path)
    small, _ = _step(["plan", str(base), "--model", "llama3-8b", "--cluster", "dgx-h100"], capsys)
    two, _ = _step(
        ["plan", str(base), "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "2"],
        capsys,
    )
    assert two < small  # twice the GPUs, the same global batch


def test_what_is_still_missing_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["plan", "--model", str(HF), "--cluster", "dgx-h100"]
    assert main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[-1] == ("commsim: error: missing section 'training' in plan") or err[-1].startswith(
        "commsim: error: missing"
    )
    assert main(["plan"]) == 2
    assert "give a PLAN.yaml, or build one with --model" in capsys.readouterr().err


def test_a_plan_file_can_name_the_configs_it_imports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "cfg").mkdir()
    (tmp_path / "cfg" / "config.json").write_text(HF.read_text())
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        yaml.safe_dump(
            {
                "import": {"model": "cfg/config.json"},  # relative to the plan file
                "cluster": {"node": "dgx-h100"},
                "training": {"micro_batch_size": 1, "global_batch_size": 64},
            }
        )
    )
    step, err = _step(["plan", str(plan)], capsys)
    flags, _ = _step(["plan", str(_base(tmp_path)), "--model", str(HF), "--cluster", "dgx-h100:1"],
                     capsys)  # fmt: skip
    assert step == flags and "config.json: rope_theta is not modelled" in err
    plan.write_text(yaml.safe_dump({"import": {"optimizer": "x.json"}}))
    assert main(["plan", str(plan)]) == 2
    assert "plan key 'import' must map model, deepspeed" in capsys.readouterr().err
    assert main(["plan", str(_base(tmp_path)), "--cluster", "dgx-h100:x"]) == 2
    assert "expected NODE or NODE:N" in capsys.readouterr().err


def test_no_output_replaces_a_config_the_plan_imports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "config.json"
    config.write_text(HF.read_text())
    plan = tmp_path / "plan.yaml"
    training = {"micro_batch_size": 1, "global_batch_size": 8}
    document = {"import": {"model": "config.json"}, "cluster": {"node": "dgx-h100"}}
    plan.write_text(yaml.safe_dump({**document, "training": training}))
    assert main(["plan", str(plan), "-o", str(config)]) == 2
    assert "is also an input" in capsys.readouterr().err
    assert config.read_text() == HF.read_text()
