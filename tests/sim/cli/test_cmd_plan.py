"""``commsim plan`` end to end: report, JSON, trace, timeline, and every bad-input path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sim.cli.main import main
from sim.inputs.plans import yaml_error_line

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

TINY_PLAN: dict[str, Any] = {
    "model": {
        "name": "tiny",
        "num_layers": 4,
        "hidden_size": 512,
        "num_heads": 8,
        "ffn_hidden_size": 2048,
        "vocab_size": 1000,
        "seq_len": 512,
    },
    "cluster": {"node": "dgx-h100", "num_nodes": 1},
    "parallel": {"tp": 2, "pp": 2, "dp": 2, "schedule": "1f1b", "data_parallel": "ddp"},
    "training": {"micro_batch_size": 1, "global_batch_size": 8, "precision": "bf16"},
}


def _write_plan(tmp_path: Path, plan: dict[str, Any] | str, name: str = "plan.yaml") -> Path:
    path = tmp_path / name
    path.write_text(plan if isinstance(plan, str) else yaml.safe_dump(plan))
    return path


def _with(section: str, **changes: Any) -> dict[str, Any]:
    plan = {key: dict(value) for key, value in TINY_PLAN.items()}
    plan[section].update(changes)
    return plan


def _outputs(tmp_path: Path) -> list[str]:
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    return [
        "--output",
        str(out / "result.json"),
        "--trace",
        str(out / "trace.json"),
        "--timeline",
        str(out / "timeline.png"),
    ]


def _assert_one_line_error(capsys: pytest.CaptureFixture[str], *fragments: str) -> None:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("commsim: error: ")
    for fragment in fragments:
        assert fragment in lines[0]
    assert captured.out == ""


BAD_PLANS: dict[str, tuple[dict[str, Any] | str, list[str]]] = {
    "malformed yaml": ("model: {name: x\nparallel: [1, 2\n", ["malformed YAML", "line"]),
    "unknown key": (_with("parallel", tensor_parallel=2), ["parallel.tensor_parallel"]),
    "unknown section": ({**TINY_PLAN, "optimizer": {}}, ["optimizer"]),
    "missing key": (
        {**TINY_PLAN, "training": {"global_batch_size": 8}},
        ["training.micro_batch_size"],
    ),
    "bad choice": (_with("parallel", schedule="1f2b"), ["parallel.schedule", "1f2b"]),
    "bad type": (_with("parallel", tp="two"), ["parallel.tp", "two"]),
    "tp does not divide heads": (
        {
            **_with("model", num_heads=12, hidden_size=768),
            "parallel": {"tp": 8, "pp": 1, "dp": 1},
        },
        ["model.num_heads=12", "tp=8"],
    ),
    "degrees do not match the world": (
        _with("parallel", tp=2, pp=2, dp=4),
        ["world size 8", "tp=2", "dp=4"],
    ),
    "not a mapping": ("- a\n- b\n", ["mapping"]),
}


@pytest.mark.parametrize("case", sorted(BAD_PLANS))
def test_bad_plan_is_one_line_exit_2_and_no_file(
    case: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan, fragments = BAD_PLANS[case]
    path = _write_plan(tmp_path, plan)
    assert main(["plan", str(path), *_outputs(tmp_path)]) == 2
    _assert_one_line_error(capsys, *fragments)
    assert list((tmp_path / "out").iterdir()) == []


def test_missing_plan_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(tmp_path / "nope.yaml"), *_outputs(tmp_path)]) == 2
    _assert_one_line_error(capsys, "plan file not found", "nope.yaml")
    assert list((tmp_path / "out").iterdir()) == []
    (tmp_path / "folder.yaml").mkdir()
    assert main(["plan", str(tmp_path / "folder.yaml"), *_outputs(tmp_path)]) == 2
    _assert_one_line_error(capsys, "plan file", "is a folder, not a file")


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--trace", "{tmp}/no/such/dir/t.json"], "does not exist"),
        (["--timeline", "{tmp}/plot.jpg2"], "is not one this output writes"),
        (["--output", "{tmp}"], "is a folder"),
        (["--output", "{tmp}/a.json", "--trace", "{tmp}/a.json"], "name the same file"),
        (["--fidelity", "packet"], "invalid choice"),
        (["--output", "{tmp}/plan.yaml"], "is also an input"),
    ],
)
def test_bad_flags_fail_before_simulating(
    flags: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write_plan(tmp_path, TINY_PLAN)
    argv = ["plan", str(path), *(f.format(tmp=tmp_path) for f in flags)]
    assert main(argv) == 2
    _assert_one_line_error(capsys, fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.yaml"]


def test_every_example_plan_resolves_on_its_cluster() -> None:
    from schedules.plan import load_plan
    from schedules.resolve import resolve_plan
    from sim.replay.simulate import plan_topology

    names = sorted(p.name for p in EXAMPLES.glob("*.yaml"))
    assert names == [
        "deepseek-v3-1024xh100.yaml",
        "gpt3-175b-1024xa100.yaml",
        "llama2-13b-fsdp2-offload-8xh100.yaml",
        "llama2-13b-offload-8xh100.yaml",
        "llama3-405b-16k.yaml",
        "llama3-70b-256xh100.yaml",
        "llama3-8b-ddp-8xh100.yaml",
        "mixtral-8x7b-ep8-64xh100.yaml",
        "qwen3-30b-a3b-fsdp2-16xh100.yaml",
        "small-zb.yaml",
    ]
    expected_dp = {
        "deepseek-v3": 64,
        "gpt3-175b": 16,
        "llama2-13b": 8,
        "llama3-405b": 128,
        "llama3-70b": 16,
        "llama3-8b": 8,
        "mixtral-8x7b": 16,
        "qwen3-30b-a3b": 16,
    }
    for name in names:
        plan = load_plan(EXAMPLES / name)
        resolved = resolve_plan(plan, plan_topology(plan).num_gpus)
        assert resolved.parallel.dp == expected_dp.get(plan.model.name, 1), name


def test_yaml_error_line_names_problem_and_position() -> None:
    with pytest.raises(yaml.YAMLError) as info:
        yaml.safe_load("a: 1\nb: [1, 2\n")
    assert (
        yaml_error_line(info.value)
        == "expected ',' or ']', but got '<stream end>' at line 3, column 1"
    )


def test_text_report_of_a_tiny_plan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", str(_write_plan(tmp_path, TINY_PLAN))]) == 0
    out = capsys.readouterr().out
    assert "Plan: tiny (4 layers, hidden 512, seq 512) on 8 x h100-sxm" in out
    assert "tp=2 pp=2 cp=1 dp=2 vpp=1, data_parallel ddp" in out
    assert "4 micro-batches of 1 per step, global batch 8 (4,096 tokens), bf16" in out
    for heading in ("Step time", "Throughput", "MFU", "FLOP definition", "Memory per GPU"):
        assert heading in out
    assert "exposed comm tp" in out and "pipeline bubble" in out


def test_json_output_trace_and_timeline(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_plan(tmp_path, TINY_PLAN)
    assert main(["plan", str(path), "--json", *_outputs(tmp_path)]) == 0
    printed = json.loads(capsys.readouterr().out)
    out = tmp_path / "out"
    assert json.loads((out / "result.json").read_text()) == printed
    assert set(printed) >= {
        "step_time_s",
        "tokens_per_s",
        "tflops_per_gpu",
        "mfu",
        "flops_definition",
        "memory_gib",
        "breakdown",
        "fits_in_memory",
    }
    assert printed["tokens_per_s"] == pytest.approx(8 * 512 / printed["step_time_s"], rel=1e-12)
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert len(names) == printed["num_simulated_ranks"]
    assert {n.split("(")[1] for n in names.values()} == {"pp stage 0)", "pp stage 1)"}
    ends_us = [e["ts"] + e["dur"] for e in events if e["ph"] == "X"]
    flow_ids = sorted(e["id"] for e in events if e["ph"] == "s")
    assert flow_ids and flow_ids == sorted(e["id"] for e in events if e["ph"] == "f")
    assert max(ends_us) == pytest.approx(printed["step_time_s"] * 1e6, abs=0.01)
    png = (out / "timeline.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 20_000
    assert sorted(p.name for p in out.iterdir()) == ["result.json", "timeline.png", "trace.json"]


def test_outputs_are_deterministic(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _write_plan(tmp_path, TINY_PLAN)
    runs = []
    for name in ("a", "b"):
        trace = tmp_path / f"{name}.json"
        assert main(["plan", str(path), "--json", "--trace", str(trace)]) == 0
        runs.append((capsys.readouterr().out, trace.read_bytes()))
    assert runs[0] == runs[1]


def test_plan_that_does_not_fit_is_a_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    big = _with("model", num_layers=8, hidden_size=8192, num_heads=64, ffn_hidden_size=32768)
    big["parallel"] = {"tp": 1, "pp": 1, "data_parallel": "ddp"}
    path = _write_plan(tmp_path, big)
    assert main(["plan", str(path), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["fits_in_memory"] is False
    assert result["memory_gib"]["total"] > 80.0 and result["step_time_s"] > 0
    assert main(["plan", str(path)]) == 0
    assert "DOES NOT FIT" in capsys.readouterr().out


def test_fold_and_fidelity_flags_reach_the_simulation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write_plan(tmp_path, TINY_PLAN)
    assert main(["plan", str(path), "--json", "--no-fold", "--fidelity", "flow"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["num_simulated_ranks"] == result["num_gpus"] == 8
    assert result["extra"]["fidelity"] == "flow" and result["extra"]["folded"] is False


@pytest.mark.parametrize("flag", ["--calibration", "--compute-calibration"])
def test_bad_calibration_files(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write_plan(tmp_path, TINY_PLAN)
    assert main(["plan", str(path), flag, str(tmp_path / "missing.json"), *_outputs(tmp_path)]) == 2
    _assert_one_line_error(capsys, f"{flag} file not found", "missing.json")
    (tmp_path / "folder.json").mkdir()  # a folder is one, not "not found"
    assert main(["plan", str(path), flag, str(tmp_path / "folder.json"), *_outputs(tmp_path)]) == 2
    _assert_one_line_error(capsys, f"{flag} file", "is a folder, not a file")
    (tmp_path / "broken.json").write_text("{not json")
    assert main(["plan", str(path), flag, str(tmp_path / "broken.json"), *_outputs(tmp_path)]) == 2
    _assert_one_line_error(capsys, "broken.json", "JSON")
    assert list((tmp_path / "out").iterdir()) == []


def test_small_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "small.json"
    assert main(["plan", str(EXAMPLES / "small-zb.yaml"), "--trace", str(trace)]) == 0
    assert "zb-h1" in capsys.readouterr().out
    categories = {e.get("cat") for e in json.loads(trace.read_text())["traceEvents"]}
    assert {"compute", "collective", "p2p", "optimizer"} <= categories


def test_absurdly_small_buckets_are_an_error_not_a_hang(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write_plan(tmp_path, _with("parallel", ddp_bucket_mb=1e-6))
    assert main(["plan", str(path), *_outputs(tmp_path)]) == 2
    _assert_one_line_error(capsys, "parallel.ddp_bucket_mb=1e-06", "buckets")
    assert not list((tmp_path / "out").iterdir())


def test_calibration_fitted_on_another_node_is_flagged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    calibration = tmp_path / "cal.json"
    entry = (
        '"params": {"all_reduce/ring/intra": {"base_latency_s": 1e-5, "intra_step_latency_s": 0,'
        ' "inter_step_latency_s": 0, "efficiency_max": 0.9, "half_size_bytes": 0}}'
    )
    calibration.write_text(
        '{"schema": "commsim-calibration/1", "topology": "localhost", ' + entry + "}"
    )
    path = _write_plan(tmp_path, TINY_PLAN)
    assert main(["plan", str(path), "--calibration", str(calibration)]) == 2  # loopback vs NVSwitch
    assert "'localhost': loopback" in capsys.readouterr().err
    calibration.write_text(
        '{"schema": "commsim-calibration/1", "topology": "dgx-a100", ' + entry + "}"
    )
    assert main(["plan", str(path), "--calibration", str(calibration)]) == 0  # NVSwitch too
    err = capsys.readouterr().err
    assert "warning" in err and "'dgx-a100'" in err and "'dgx-h100'" in err
    calibration.write_text(
        '{"schema": "commsim-calibration/1", "topology": "dgx-h100", ' + entry + "}"
    )
    assert main(["plan", str(path), "--calibration", str(calibration)]) == 0
    assert capsys.readouterr().err == ""
    calibration.write_text('{"schema": "commsim-calibration/1", "topology": "dgx-h100"}')
    assert main(["plan", str(path), "--calibration", str(calibration)]) == 2  # fits nothing
    assert "calibration has no fitted entries" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ('{"schema": "commsim-compute/1", "kernels": {"bf16": {"gemm": "x"}}}', "bad compute"),
        ('{"schema": "commsim-compute/1", "kernels": [1]}', "bad compute"),
        ('{"schema": "commsim-compute/1", "efficiency": {"gemm": "x"}}', "'x'"),
        (
            '{"schema": "commsim-compute/1", "kernels": {"fp99": {"gemm": {"max_flops_per_s": 1e12,'
            ' "dim_half": 64}}}}',
            "unknown kernel dtype 'fp99'; valid: bf16, fp16, fp32, tf32, fp8",
        ),
        (
            '{"schema": "commsim-compute/1", "kernels": {"bf16": {"gemm": {"max_flops_per_s": 1e12}'
            "}}}",
            "kernels.bf16.gemm must be an object with max_flops_per_s, dim_half",
        ),
        (
            '{"schema": "commsim-compute/1", "measurements": [{"kind": "gemm"}]}',
            "measurements[0] must have kind, dtype, dims, flops, time_s",
        ),
    ],
)
def test_junk_compute_calibration_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], document: str, message: str
) -> None:
    calibration = tmp_path / "compute.json"
    calibration.write_text(document)
    path = _write_plan(tmp_path, TINY_PLAN)
    assert main(["plan", str(path), "--compute-calibration", str(calibration)]) == 2
    _assert_one_line_error(capsys, "compute.json", message)


def test_a_calibration_of_another_intra_node_fabric_is_refused_unless_forced(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import refdata

    cal = tmp_path / "cal.json"
    table = str(refdata.NCCL_DIR / "h100_8gpu_all_reduce_ring.txt")
    assert main(["calibrate", table, "--topology", "dgx-h100", "-o", str(cal)]) == 0
    capsys.readouterr()
    pcie = _write_plan(tmp_path, _with("cluster", node="pcie-h100"))
    assert main(["plan", str(pcie), "--calibration", str(cal)]) == 2
    err = capsys.readouterr().err
    assert "fitted on another intra-node fabric ('dgx-h100': nvswitch)" in err
    assert "--force-calibration to use it" in err and err.count("\n") == 1
    assert main(["plan", str(pcie), "--calibration", str(cal), "--force-calibration"]) == 0
    assert "commsim: warning: --calibration" in capsys.readouterr().err
