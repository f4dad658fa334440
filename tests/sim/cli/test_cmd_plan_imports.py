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
    assert "commsim: warning: config.json: model.seq_len=8192 is max_position_embeddings" in err
    assert "commsim: warning: llama3_8b.toml:" in err
    assert len(err.splitlines()) == 2  # one line per importer
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
    assert step == flags and "config.json: model.seq_len=8192 is max_position_embeddings" in err
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


DS_OFFLOAD = {
    "train_batch_size": 64, "train_micro_batch_size_per_gpu": 1,
    "gradient_accumulation_steps": "auto", "bf16": {"enabled": True},
    "zero_optimization": {
        "stage": 3, "overlap_comm": True,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "offload_param": {"device": "cpu", "pin_memory": True},
    },
}  # fmt: skip
"""The issue's ZeRO-3 config: optimizer and parameters offloaded, the batch fixed."""


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict, str]:
    assert main([*argv, "--json"]) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def test_deepspeed_offload_is_carried_and_fits_as_the_same_plan_written_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """HF + DeepSpeed with offload on 4 DGX H100: the offload reaches the plan (on main it was
    dropped and the plan needed 100 GiB), as when the same offload is written in a plan."""
    ds = tmp_path / "ds.json"
    ds.write_text(json.dumps(DS_OFFLOAD))
    imported, err = _json(
        ["plan", "--model", str(HF), "--deepspeed", str(ds), "--cluster", "dgx-h100:4"], capsys
    )
    written = tmp_path / "written.yaml"
    offload = {"offload_optimizer": "cpu", "offload_param": "cpu", "offload_pin_memory": True}
    written.write_text(
        yaml.safe_dump(
            {
                "model": {"preset": "llama3-8b", "seq_len": 8192},
                "cluster": {"node": "dgx-h100", "num_nodes": 4},
                "parallel": {"data_parallel": "zero3", "zero_overlap_comm": True, **offload},
                "training": {"micro_batch_size": 1, "global_batch_size": 64},
            }
        )
    )
    plan, _ = _json(["plan", str(written)], capsys)
    assert imported["fits_in_memory"] and plan["fits_in_memory"]
    assert imported["memory_gib"] == plan["memory_gib"]
    assert imported["step_time_s"] == plan["step_time_s"]
    # one line per importer; the batch is fixed, so 'auto' accumulation steps are not mentioned
    assert err.splitlines() == [
        "commsim: warning: config.json: model.seq_len=8192 is max_position_embeddings, the "
        "longest context the model supports; training usually runs shorter sequences: override "
        "model.seq_len; 10 keys ignored that change nothing a step costs",
    ]


def test_plan_file_keys_win_over_imported_ones(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``model: {seq_len: 4096}`` beside ``import:``, or in the base file of the flags, wins
    over the HF config's 8192, and the warning asking for it is not shown."""
    (tmp_path / "ds.json").write_text(json.dumps(DS_OFFLOAD))
    beside = tmp_path / "beside.yaml"
    beside.write_text(
        yaml.safe_dump(
            {
                "import": {"model": str(HF), "deepspeed": "ds.json"},
                "model": {"seq_len": 4096},
                "cluster": {"node": "dgx-h100", "num_nodes": 4},
            }
        )
    )
    assert main(["plan", str(beside)]) == 0
    captured = capsys.readouterr()
    assert "Plan: Meta-Llama-3-8B (32 layers, hidden 4096, seq 4096)" in captured.out
    assert "max_position_embeddings" not in captured.err
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({"model": {"seq_len": 4096}, "parallel": {"tp": 2}}))
    argv = ["plan", str(base), "--model", str(HF), "--deepspeed", str(tmp_path / "ds.json"),
            "--cluster", "dgx-h100:4"]  # fmt: skip
    result, _ = _json(argv, capsys)
    assert "seq 4096" in (main(argv) == 0 and capsys.readouterr().out)
    assert result["step_time_s"] > 0


def test_batch_flags_and_set_on_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A plan without a ``training`` section runs with --global-batch; --micro-batch, --seq-len
    and --set win over the file; YAML scalars; unknown keys get a "did you mean"."""
    flags = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100:2"]
    assert main(flags) == 2
    assert "give --global-batch B" in capsys.readouterr().err
    assert main([*flags, "--global-batch", "32", "--micro-batch", "2", "--seq-len", "2048"]) == 0
    out = capsys.readouterr().out
    assert "seq 2048" in out and "1 micro-batches of 2 per step, global batch 32" in out
    path = tmp_path / "plan.yaml"
    training = {"micro_batch_size": 1, "global_batch_size": 8}
    document = {"model": "llama3-8b", "cluster": {"node": "dgx-h100"}, "training": training}
    path.write_text(yaml.safe_dump(document))
    sets = ["--set", "parallel.tp=2", "--set", "parallel.sequence_parallel=true",
            "--set", "model.seq_len=1024", "--set", "name=set-plan"]  # fmt: skip
    exported = tmp_path / "out.yaml"
    assert main(["plan", str(path), *sets, "--export-plan", str(exported)]) == 0
    plan = yaml.safe_load(exported.read_text())
    assert (plan["parallel"]["tp"], plan["parallel"]["sequence_parallel"]) == (2, True)
    assert (plan["model"]["seq_len"], plan["name"]) == (1024, "set-plan")
    capsys.readouterr()
    assert main(["plan", str(path), "--set", "parallel.tpp=2"]) == 2
    assert capsys.readouterr().err.strip() == (
        "commsim: error: --set 'parallel.tpp': not a plan key (did you mean 'parallel.tp' or "
        "'parallel.pp' or 'parallel.vpp'?)"
    )
    assert main(["plan", str(path), "--set", "parallel.tp"]) == 2
    assert "expected SECTION.KEY=VALUE" in capsys.readouterr().err
    assert main(["plan", str(path), "--set", "parallel.tp=two"]) == 2
    assert "parallel.tp must be int, got 'two'" in capsys.readouterr().err


def test_torchtitan_minus_one_shard_degree_from_the_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``data_parallel_shard_degree = -1`` on dgx-h100:8: FSDP over 64 ranks, global batch
    local_batch_size x 64 (on main: missing key 'training.global_batch_size')."""
    result, err = _json(["plan", "--torchtitan", str(TITAN), "--cluster", "dgx-h100:8"], capsys)
    assert "global_batch_size" not in err
    out = tmp_path / "p.yaml"
    assert main(["plan", "--torchtitan", str(TITAN), "--cluster", "dgx-h100:8",
                 "--export-plan", str(out)]) == 0  # fmt: skip
    plan = yaml.safe_load(out.read_text())
    assert (plan["training"]["global_batch_size"], plan["parallel"]["dp"]) == (64, 64)
    assert result["step_time_s"] > 0


def test_old_torchtitan_toml_with_degrees_under_training_is_read_as_tp8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Degrees under [training] (torchtitan before v0.1) are TP8, not silently tp=1 dp=64."""
    toml = tmp_path / "old.toml"
    toml.write_text(
        '[model]\nname = "llama3"\nflavor = "70B"\n[training]\nbatch_size = 8\n'
        "seq_len = 4096\ndata_parallel_shard_degree = -1\ntensor_parallel_degree = 8\n"
    )
    out = tmp_path / "p.yaml"
    assert main(["plan", "--torchtitan", str(toml), "--cluster", "dgx-h100:8",
                 "--export-plan", str(out)]) == 0  # fmt: skip
    plan = yaml.safe_load(out.read_text())
    assert (plan["parallel"]["tp"], plan["parallel"]["dp"]) == (8, 8)
    assert "read as [parallelism]" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["plan"], ["search"], ["fit", "--step-time", "1.0"]])
def test_set_is_on_every_command_that_takes_a_plan(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--set`` reaches the plan of plan, search and fit: a key that is not one is refused,
    with the nearest names, before anything is simulated."""
    path = tmp_path / "plan.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": "llama3-8b",
                "cluster": {"node": "dgx-h100"},
                "training": {"micro_batch_size": 1, "global_batch_size": 8},
            }
        )
    )
    argv = [command[0], str(path), *command[1:], "--set", "training.global_batch=16"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == (
        "commsim: error: --set 'training.global_batch': not a plan key (did you mean "
        "'training.global_batch_size'?)"
    )


def test_megatron_takes_a_file_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch", "64"]
    assert main([*base, "--megatron", "--tensor-model-parallel-size 2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--megatron takes a file, not the arguments themselves" in err
    (tmp_path / "args").mkdir()
    assert main([*base, "--megatron", str(tmp_path / "args")]) == 2
    assert "--megatron file" in capsys.readouterr().err
    args = tmp_path / "args.txt"
    args.write_text("--tensor-model-parallel-size 2\n")
    assert main([*base, "--megatron", str(args)]) == 0
    assert "tp=2" in capsys.readouterr().out


def test_a_plan_that_fails_is_one_line_without_the_warnings_before_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The micro-batch warning waits for a plan that loads: a misspelt preset is its error
    alone."""
    assert (
        main(["plan", "--model", "llama3-8bb", "--cluster", "dgx-h100", "--global-batch", "8"]) == 2
    )
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "model preset 'llama3-8bb' is unknown" in err
    assert (
        main(["plan", "--model", "llama3-8b", "--cluster", "dgx-h100", "--global-batch", "8"]) == 0
    )
    assert "warning: training.micro_batch_size not given" in capsys.readouterr().err
