"""``commsim presets`` and what a new user meets first: the help, "did you mean", whole lists."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from schedules.model_presets import MODEL_PRESETS
from sim.cli.main import main
from topologies.fabrics import FABRIC_PRESETS
from topologies.hardware import CPUS, GPUS
from topologies.nodes import NODE_PRESETS


def test_presets_lists_every_model_node_fabric_gpu_and_cpu(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["presets"]) == 0
    out = capsys.readouterr().out
    for table, names in (("models", MODEL_PRESETS), ("nodes", NODE_PRESETS),
                         ("fabrics", FABRIC_PRESETS), ("gpus", GPUS), ("cpus", CPUS)):  # fmt: skip
        assert f"\n{table} (" in f"\n{out}"
        for name in names:
            assert f"  {name} " in out, name
    assert "  llama3-8b                32    4096      32/8  128256   8192      8.0B" in out
    assert "  mixtral-8x7b             32    4096      32/8   32000  32768   47B/13B" in out
    assert main(["presets", "fabrics"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "fabrics (plan cluster.fabric, --fabric NAME)"
    # SHARP switches, and NCCL's CollNet on only where the preset says so; one column per field
    sharp = {line.split()[0]: line.split("ib ", 1)[1].strip() for line in lines if "SHARP" in line}
    assert sharp == {
        "ib-ndr-sharp": "rail-optimized, SHARP",
        "ib-ndr-sharp-collnet": "rail-optimized, SHARP, CollNet",
    }
    rows = [line for line in lines if line.startswith("  ib-ndr")]
    columns = {row.index(" ib-ndr ", 2 + len(row.split()[0])) for row in rows}
    assert len(columns) == 1  # the link column lines up under the longest name


def test_help_is_written_for_users(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "one sub-command per module" not in out  # the developer's docstring of main.py
    assert "Simulate GPU training steps and collectives before renting the GPUs" in out
    assert "commsim plan --model llama3-8b --cluster dgx-h100:2 --global-batch 64" in out
    assert "presets" in out


def test_a_typo_gets_did_you_mean_and_the_whole_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = {"model": "llama3-8b", "cluster": {"node": "dgx-h100"}, "parallel": {"tpp": 2},
            "training": {"micro_batch_size": 1, "global_batch_size": 8}}  # fmt: skip
    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(plan))
    assert main(["plan", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "commsim: error: unknown key 'parallel.tpp' in plan (did you mean 'tp' or 'pp'?); "
        "valid keys: tp, pp, "
    )
    assert "characters)" not in err and err.rstrip().endswith("cp_rotate_method")
    assert (
        main(["plan", "--model", "llama3-8", "--cluster", "dgx-h100", "--global-batch", "8"]) == 2
    )
    err = capsys.readouterr().err
    assert "model preset 'llama3-8' is unknown (did you mean 'llama3-8b'" in err
    assert "characters)" not in err and "megatron-gpt-1t (commsim presets)" in err
    assert (
        main(["plan", "--model", "llama3-8b", "--cluster", "dgx-h10", "--global-batch", "8"]) == 2
    )
    assert (
        "unknown cluster.node preset 'dgx-h10' (did you mean 'dgx-h100'" in capsys.readouterr().err
    )


def test_a_missing_measured_file_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "nosuch.json", "--topology", "dgx-h100"]) == 2
    assert capsys.readouterr().err == "commsim: error: measured results not found: nosuch.json\n"
