"""Inputs found by fuzzing that used to crash, hang or be accepted: each is one line, exit 2."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
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
        (
            "model",
            "mlp_activation",
            ["a"],
            "model.mlp_activation must be one of gelu, relu, swiglu, geglu, got ['a'] (list)",
        ),
        ("cluster", "node", {"base": [1]}, "unknown cluster.node.base preset [1]"),
        ("training", "global_batch_size", 2**63, "at most 65,536 are simulated"),
        ("cluster", "num_nodes", 10**30, "clusters of up to 131,072 GPUs"),
        ("model", "attention_window", -1, "model.attention_window must be >= 0"),
        ("model", "parallel_block", "yes", "model.parallel_block"),
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
    assert (
        "default_fabric 'bogus'; valid: azure-ndr, efa-p4d, efa-p5, gcp-a3-high, gcp-a3-mega"
        in (capsys.readouterr().err)
    )


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
        ({"memory_bandwidth_bytes_per_s": 0}, "memory_bandwidth_bytes_per_s=0; must be a number"),
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


# --- choice-valued plan keys ------------------------------------------------------------------

CHOICES = {
    "model.mlp_activation": "gelu, relu, swiglu, geglu",
    "model.position_embedding": "rope, learned, none",
    "model.norm": "rmsnorm, layernorm",
    "parallel.schedule": "1f1b, interleaved, gpipe, zb-h1",
    "parallel.recompute": "none, selective, op, full",
    "parallel.data_parallel": "ddp, zero1, zero2, zero3, fsdp, hsdp, distributed_optimizer, fsdp2",
    "parallel.fsdp_backward_prefetch": "backward_pre, backward_post, none",
    "parallel.fsdp_reduce_dtype": "fp32, bf16 or null",
    "training.precision": "bf16, fp16, fp8",
    "training.attention_backend": "cudnn, flash2",
}


@pytest.mark.parametrize(("key", "choices"), sorted(CHOICES.items()))
@pytest.mark.parametrize(
    ("value", "shown"),
    [(True, "True (bool)"), (1, "1 (int)"), (["a"], "['a'] (list)"), ({"a": 1}, "{'a': 1} (dict)")],
)
def test_a_choice_of_the_wrong_type_lists_the_choices(
    key: str, choices: str, value: Any, shown: str, tmp_path: Path, capsys: Any
) -> None:
    """``recompute: true`` used to say only "must be str"."""
    section, name = key.split(".")
    assert main(["plan", str(_plan(tmp_path, section, name, value))]) == 2
    expected = f"commsim: error: {key} must be one of {choices}, got {shown}\n"
    assert capsys.readouterr().err == expected


def _choice_fields() -> dict[str, str]:
    """Every plan key whose value is checked against a fixed set, found by giving each text key
    a value no set has: the check's message lists the choices."""
    from schedules import plan as plan_module

    found = {}
    for section, cls in plan_module._SECTIONS.items():
        for field in dataclasses.fields(cls):
            raw = json.loads(json.dumps(BASE))
            raw[section][field.name] = "no-such-choice"
            try:
                plan_module.load_plan(raw)
            except ValueError as error:
                _, sep, choices = str(error).partition("'no-such-choice' is not one of ")
                if sep:
                    found[f"{section}.{field.name}"] = choices
    return found


def test_every_choice_key_lists_its_choices_on_a_type_error(tmp_path: Path, capsys: Any) -> None:
    """Also the choice keys added after this test was written."""
    found = _choice_fields()
    assert set(CHOICES) <= set(found)
    for key, choices in found.items():
        section, name = key.split(".")
        assert main(["plan", str(_plan(tmp_path, section, name, True))]) == 2
        err = capsys.readouterr().err
        assert f"{key} must be one of {choices}" in err and err.endswith(", got True (bool)\n")


# --- more values the fuzz test found ----------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("cluster", "oversubscription", float("nan"), "cluster.oversubscription must be a finite"),
        ("parallel", "ddp_bucket_mb", float("nan"), "parallel.ddp_bucket_mb must be a finite"),
        ("parallel", "ddp_bucket_mb", float("inf"), "parallel.ddp_bucket_mb must be a finite"),
        ("parallel", "ddp_bucket_mb", 10**400, "parallel.ddp_bucket_mb must be a finite"),
        ("cluster", "node", {"base": "dgx-h100", "nics_per_node": 2**63}, "at most 128"),
        ("cluster", "node", {"base": "dgx-h100", "num_cpus": 2**63}, "node.num_cpus=9223372036"),
        ("cluster", "node", {"base": "dgx-h100", "name": ["x"]}, "node.name=['x']; must be text"),
        ("parallel", "bogus", 1, "unknown key 'parallel.bogus'"),
    ],
)
def test_plan_values_the_fuzz_test_found(
    section: str, key: str, value: Any, message: str, tmp_path: Path, capsys: Any
) -> None:
    """nan/inf used to be accepted or crash; 2**63 NICs or sockets ran out of memory."""
    assert main(["plan", str(_plan(tmp_path, section, key, value))]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: &x [*x]\n", "a YAML alias refers to a collection that contains it (line 1)"),
        ("node: dgx-h100\nnum_nodes: 2\nfabric: {base: ib-ndr, radix: 9223372036854775808}\n",
         "fabric.radix=9223372036854775808; must be an even integer >= 2 (at most 512"),
        ("node: dgx-h100\nnum_nodes: 2\nfabric: {base: ib-ndr, tiers: true}\n",
         "fabric.tiers=True; valid: 1, 2, 3"),
    ],
)  # fmt: skip
def test_cluster_files_that_used_to_hang(
    text: str, message: str, tmp_path: Path, capsys: Any
) -> None:
    """A self-containing alias or a radix of 2**63 ran until memory was gone."""
    path = tmp_path / "cluster.yaml"
    path.write_text(text)
    assert main(["topo", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def _endless_device(folder: Path) -> Path:
    """A private character device that reads zeros forever (the memory driver, 1:5)."""
    node = folder / "endless"
    try:
        os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(1, 5))
    except (PermissionError, OSError, AttributeError):
        pytest.skip("making a device node needs privileges this machine does not grant")
    return node


def test_input_files_that_never_end_or_never_come_are_refused(
    tmp_path: Path, capsys: Any, monkeypatch: Any
) -> None:
    """An endless device used to be read until memory ran out; a FIFO without a writer blocked."""
    monkeypatch.chdir(tmp_path)
    endless = _endless_device(Path())
    assert main(["topo", str(endless)]) == 2
    assert f"cluster file '{endless}' is larger than 1,048,576 bytes" in capsys.readouterr().err
    args = ["collective", "--topology", "localhost", "--calibration", str(endless)]
    assert main(args) == 2
    assert f"network calibration '{endless}' is larger than" in capsys.readouterr().err
    fifo = tmp_path / "cluster.yaml"
    os.mkfifo(fifo)
    assert main(["topo", str(fifo)]) == 2
    assert "expected a mapping" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"shape": 1e300, "half_size_bytes": 1e6}, "shape=1e+300; must be a number from 0.001"),
        ({"efficiency_max": 5e-324}, "efficiency_max=5e-324; must be a number from 1e-06 to 1\n"),
        ({"base_latency_s": 1e300}, "base_latency_s=1e+300; must be a number from 0 to 60"),
        ({"fit": {"num_points": "x"}}, "'fit' must be an object with num_points, mape"),
        ({"fit": {"num_points": "x", "mape": 1, "min_size_bytes": 0, "max_size_bytes": 0}},
         "fit.num_points='x'; must be an integer >= 0"),
    ],
)  # fmt: skip
def test_network_calibration_numbers_are_bounded(
    entry: dict[str, Any], message: str, tmp_path: Path, capsys: Any
) -> None:
    """shape 1e300 overflowed, 1e300 s latencies printed 300-digit times, a text num_points
    crashed the fallback lookup."""
    network = json.loads((ROOT / "results" / "localhost" / "calibration.json").read_text())
    for params in network["params"].values():
        params.update(entry)
    path = tmp_path / "net.json"
    path.write_text(json.dumps(network))
    assert main(["collective", "--topology", "dgx-h100", "--calibration", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"efficiency": {"gemm": "0.5"}}, "efficiency gemm='0.5' invalid"),
        ({"efficiency": {"gemm": True}}, "efficiency gemm=True invalid"),
        ({"efficiency": {"gemm": 1e-300}}, "with values in [0.001, 1.5]"),
        ({"kernels": {"bf16": {"gemm": {"max_flops_per_s": 5e-324, "dim_half": 1}}}},
         "kernels.bf16.gemm.max_flops_per_s=5e-324; must be a number from 1e+06 to 1e+18"),
        ({"measurements": "abc"}, "measurements must be a list of objects, got 'abc'"),
        ({"gpu": 5}, "gpu must be text, got 5"),
    ],
)  # fmt: skip
def test_compute_calibration_values_are_checked(
    change: dict[str, Any], message: str, tmp_path: Path, capsys: Any
) -> None:
    """Text and booleans used to be read as numbers; a tiny rate gave an infinite step."""
    plan = tmp_path / "plan.yaml"
    plan.write_text(yaml.safe_dump(BASE))
    path = tmp_path / "compute.json"
    path.write_text(json.dumps({"schema": "commsim-compute/1", "gpu": "h100-sxm", **change}))
    assert main(["plan", str(plan), "--compute-calibration", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_outputs_the_system_cannot_look_at_are_one_line(tmp_path: Path, capsys: Any) -> None:
    """A name over the file system's limit or a loop of links used to end in a traceback."""
    loop = tmp_path / "loop.json"
    loop.symlink_to(loop)
    for output, message in ((loop, "a loop of symbolic links"), ("x" * 300 + ".json", "too long")):
        args = ["collective", "--topology", "localhost", "-b", "1K", "-e", "1K"]
        assert main([*args, "--output", str(output)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("commsim: error: --output ") and message in err
        assert err.count("\n") == 1


def test_a_commbench_sweep_of_billions_of_sizes_is_refused() -> None:
    """``-f 1 -i 1 -e 16G`` used to list 17 billion sizes (MemoryError)."""
    from comm_bench.options import parse_options

    with pytest.raises(ValueError, match="gives more than 10,000 sizes; use a larger step"):
        parse_options(["-b", "0", "-e", "16G", "-f", "1", "-i", "1"])


def test_both_commands_refuse_an_output_in_a_missing_folder(tmp_path: Path, capsys: Any) -> None:
    """Neither creates the folder: the same line names it, exit 2, nothing written."""
    output = tmp_path / "missing" / "run.json"
    args = ["collective", "--topology", "localhost", "-b", "1K", "-e", "1K", "--output"]
    assert main([*args, str(output)]) == 2
    expected = f"--output '{output}': the folder '{output.parent}' does not exist\n"
    assert capsys.readouterr().err == f"commsim: error: {expected}"
    run = _commbench(["--backend", "gloo", "--nprocs", "2", "--output", str(output)], {})
    assert (run.returncode, run.stderr) == (2, f"commbench: error: {expected}")
    assert not output.parent.exists()


BUSBW_HEADER = "op,num_nodes,gpus_per_node,size_bytes,busbw_gbps\n"
GOOD_ROWS = "all_reduce,1,8,2048,100\nall_reduce,1,8,4096,100\nall_reduce,1,8,8192,100\n"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("all_reduce,1,8,-1024,100", "row 1: size_bytes='-1024' must be a whole number > 0"),
        ("all_reduce,1,8,0,100", "row 1: size_bytes='0' must be a whole number > 0"),
        ("all_reduce,1,8,inf,100", "row 1: size_bytes='inf' must be a whole number > 0"),
        ("all_reduce,1,8,1024,inf", "row 1: busbw_gbps='inf' must be a finite number > 0"),
        ("all_reduce,1,8,1024,nan", "row 1: busbw_gbps='nan' must be a finite number > 0"),
        ("all_reduce,1,8,1024,0", "row 1: busbw_gbps='0' must be a finite number > 0"),
        ("all_reduce,1,1,1024,100", "row 1: all_reduce on 1 GPU has no bus bandwidth"),
        ("all_reduce,1,8,1024", "row 1: expected the 5 fields op, num_nodes, gpus_per_node"),
        ("all_reduce,1,8,1024,100,7", "row 1: expected the 5 fields"),
        ("all_reduce,1,8,1e35,100", "row 1: size_bytes=1e35 is over 1,125,899,906,842,624"),
        ("all_reduce,1,8,x,100", "row 1: size_bytes='x' is not a number"),
    ],
)  # fmt: skip
def test_busbw_tables_with_impossible_rows(
    row: str, message: str, tmp_path: Path, capsys: Any
) -> None:
    """On main: ZeroDivisionError (a zero, negative or infinite size or time, one GPU) and
    TypeError (a missing field) tracebacks, or nan MAPEs."""
    table = tmp_path / "busbw.csv"
    table.write_text(BUSBW_HEADER + row + "\n" + GOOD_ROWS)
    assert main(["compare", str(table), "--topology", "dgx-h100"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err and "Traceback" not in err


def _commbench_rows(tmp_path: Path) -> list[dict[str, Any]]:
    from vocab.readers import read_results

    records = read_results(ROOT / "results" / "localhost" / "commbench_gloo_4ranks.json")
    return [r.to_dict() for r in records[:4]]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("size_bytes", 0, "size_bytes=0 must be in 1..1,125,899,906,842,624"),
        ("time_us", 0.0, "time_us=0.0 must be > 0 and at most 3.6e+09 (an hour)"),
        ("time_us", 1e300, "time_us=1e+300 must be > 0 and at most"),
        ("root", 99, "root=99 is not a rank of a 4-rank world"),
    ],
)
def test_measured_records_are_checked_for_what_physics_allows(
    field: str, value: Any, message: str, tmp_path: Path, capsys: Any
) -> None:
    rows = _commbench_rows(tmp_path)
    rows[1][field] = value
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"schema": "commbench/1", "results": rows}))
    assert main(["compare", str(path), "--topology", "localhost"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


def test_commbench_csv_with_a_garbled_flag_or_an_extra_field(tmp_path: Path, capsys: Any) -> None:
    text = (ROOT / "results" / "localhost" / "commbench_gloo_4ranks.csv").read_text().splitlines()
    header, first, rest = text[0], text[1], text[2:6]
    flag = first.split(",").index("False") if "False" in first.split(",") else None
    fields = first.split(",")
    assert flag is not None
    fields[flag] = "maybe"
    busbw = header.split(",").index("busbw_gbps")
    not_a_number = first.split(",")
    not_a_number[busbw] = "nan"
    for bad, message in ((",".join(fields), "in_place='maybe' must be true or false"),
                         (first + ",7", "more fields than the header's"),
                         (",".join(not_a_number), "busbw_gbps=nan must be finite")):  # fmt: skip
        path = tmp_path / "run.csv"
        path.write_text("\n".join([header, bad, *rest]) + "\n")
        assert main(["compare", str(path), "--topology", "localhost"]) == 2
        assert message in capsys.readouterr().err


def test_a_log_where_no_rank_ran_is_refused(tmp_path: Path, capsys: Any) -> None:
    log = (ROOT / "refdata" / "nccl" / "h100_8gpu_all_reduce_ring.txt").read_text()
    path = tmp_path / "all_reduce.txt"
    path.write_text("nranks 0\n" + log)
    assert main(["compare", str(path), "--topology", "dgx-h100"]) == 2
    assert "line 1: nranks 0: no rank ran" in capsys.readouterr().err


def test_oversized_plans_are_refused_before_anything_is_built(tmp_path: Path, capsys: Any) -> None:
    """A plan file of 700k keys took 85 s and a GB to refuse; pp 1024 x 1024 layers reached
    5.6 GB: both are refused in about a second now."""
    import time

    huge = tmp_path / "huge.yaml"
    huge.write_text(yaml.safe_dump(BASE) + "".join(f"k{i}: {i}\n" for i in range(150_000)))
    start = time.monotonic()
    assert main(["plan", str(huge)]) == 2
    assert "is larger than 1,048,576 bytes" in capsys.readouterr().err
    raw = json.loads(json.dumps(BASE))
    raw["model"]["num_layers"] = 1024
    raw["cluster"]["num_nodes"] = 128
    raw["parallel"] = {"pp": 1024}
    raw["training"] = {"global_batch_size": 1024, "micro_batch_size": 1}
    deep = tmp_path / "deep.yaml"
    deep.write_text(yaml.safe_dump(raw))
    assert main(["plan", str(deep)]) == 2
    assert "1,048,576 layer passes per step; at most 131,072" in capsys.readouterr().err
    assert time.monotonic() - start < 10.0  # seconds on a loaded 2-core box, not minutes


def test_nonsense_calibrations_and_sizes(tmp_path: Path, capsys: Any) -> None:
    network = json.loads((ROOT / "results" / "localhost" / "calibration.json").read_text())
    changes = (({"bogus": 1}, "unknown calibration key 'bogus'"),
               ({"topology": [1]}, "calibration 'topology' must be a name"))  # fmt: skip
    for change, message in changes:
        path = tmp_path / "cal.json"
        path.write_text(json.dumps({**network, **change}))
        assert main(["collective", "--topology", "localhost", "--calibration", str(path)]) == 2
        assert message in capsys.readouterr().err
    assert main(["collective", "--topology", "dgx-h100", "-b", "１K", "-e", "2K"]) == 2
    assert "bad size '１K'" in capsys.readouterr().err
    local = ROOT / "results" / "localhost" / "calibration.json"
    argv = ["collective", "--topology", "dgx-h100", "--calibration", str(local)]
    assert main([*argv, "-b", "1K", "-e", "1K"]) == 0
    assert "fitted on another intra-node fabric ('localhost'" in capsys.readouterr().err
