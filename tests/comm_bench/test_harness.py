"""Real gloo runs of every op through the spawner: results, #wrong, skips, corrupted data."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import pytest
import torch

from comm_bench.launch import free_port
from vocab.collectives import OPS, get
from vocab.readers import read_results
from vocab.records import FIELD_NAMES, SCHEMA

SMALL = ["-b", "64", "-e", "4K", "-f", "8", "-n", "3", "-w", "1"]
RANK_LOOP = (
    "import sys; from comm_bench.harness import run_rank; "
    "from comm_bench.options import parse_options; sys.exit(run_rank(parse_options(sys.argv[1:])))"
)
"""One rank's benchmark loop without the command's checks (the launcher's variables set)."""


@pytest.mark.parametrize(
    ("world", "dtype", "redop"),
    [(2, "float32", "sum"), (3, "bfloat16", "prod"), (4, "half", "avg"), (3, "int8", "max")],
)
def test_every_op_is_exact_on_real_gloo_worlds(commbench, world, dtype, redop):
    run = commbench(["--ops", "all", "--nprocs", str(world), "-d", dtype, "-o", redop, *SMALL])
    assert run.returncode == 0, run.stderr
    records = read_results(run.output)
    assert {r.op for r in records} == set(OPS)
    assert {r.world_size for r in records} == {world}
    for r in records:
        undefined = r.in_place and r.op in ("all_to_all", "send_recv")
        assert r.num_wrong == (None if undefined else 0), r
        assert r.redop == (redop if get(r.op).prints_redop else "none")
    assert run.stdout.count("# Out of bounds values : 0 OK") == len(OPS)


def test_results_json_and_csv_follow_the_schema(commbench):
    run = commbench(["--ops", "all_gather,reduce_scatter", "--nprocs", "2", *SMALL])
    assert run.returncode == 0, run.stderr
    document = run.document()
    assert document["schema"] == SCHEMA
    assert document["env"]["world_size"] == 2 and document["env"]["backend"] == "gloo"
    assert document["config"]["ops"] == ["all_gather", "reduce_scatter"]
    rows = document["results"]
    # sizes 64, 512, 4096 for two ops, each out-of-place and in-place
    assert len(rows) == 12 and all(tuple(row) == FIELD_NAMES for row in rows)
    first = rows[0]
    assert (first["op"], first["size_bytes"], first["count"], first["in_place"]) == (
        "all_gather",
        64,
        8,
        False,
    )
    assert first["busbw_gbps"] == pytest.approx(first["algbw_gbps"] * 0.5)
    assert first["algbw_gbps"] == pytest.approx(64 / (first["time_us"] * 1e3))
    assert first["time_min_us"] <= first["time_median_us"] <= first["time_p99_us"]
    with open(run.output.with_suffix(".csv")) as handle:
        table = list(csv.DictReader(handle))
    assert tuple(table[0]) == FIELD_NAMES and len(table) == 12
    assert read_results(run.output.with_suffix(".csv")) == read_results(run.output)


def test_stdout_table_reads_back_as_the_same_numbers(commbench, tmp_path):
    run = commbench(["--ops", "broadcast", "--nprocs", "2", "-r", "1", *SMALL])
    assert run.returncode == 0, run.stderr
    log = tmp_path / "stdout.txt"
    log.write_text(run.stdout)
    from_log, from_json = read_results(log), read_results(run.output)
    assert [(r.size_bytes, r.root, r.in_place) for r in from_log] == [
        (r.size_bytes, r.root, r.in_place) for r in from_json
    ]
    assert [round(r.busbw_gbps, 2) for r in from_json] == [r.busbw_gbps for r in from_log]
    assert {r.root for r in from_json} == {1}


def test_an_op_the_backend_cannot_run_is_skipped_with_a_note(commbench):
    run = commbench(
        ["--ops", "all_reduce,broadcast", "--nprocs", "2", "-d", "int32", "-o", "avg", *SMALL]
    )
    assert run.returncode == 0, run.stderr
    assert "# all_reduce: skipped, backend gloo cannot run it" in run.stdout
    assert {r.op for r in read_results(run.output)} == {"broadcast"}


def test_nothing_measured_is_an_error_not_an_empty_success(tmp_path):
    """Every op skipped by the probe: exit 4 and one line naming why; on main this exited 0 with
    an empty results file. The command refuses gloo's integer avg before any rank starts
    (``options.validate_for_backend``), so the rank loop is run here by itself, as rank 0 of a
    one-rank world, to show the probe's safety net behind that check."""
    output = tmp_path / "run.json"
    argv = ["--ops", "all_reduce", "-d", "int32", "-o", "avg", *SMALL, "--backend", "gloo"]
    env = dict(
        os.environ,
        RANK="0",
        WORLD_SIZE="1",
        LOCAL_RANK="0",
        LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
    )
    run = subprocess.run(
        [sys.executable, "-c", RANK_LOOP, *argv, "--output", str(output)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
    )
    assert run.returncode == 4, run.stderr
    assert (
        run.stderr.strip()
        .splitlines()[-1]
        .startswith("commbench: error: nothing was measured: backend gloo cannot run all_reduce (")
    )
    assert run.stderr.strip().endswith("with -d int32 -o avg")


def test_corrupted_results_are_counted_and_fail_the_run(commbench):
    run = commbench(
        ["--ops", "all_reduce,send_recv", "--nprocs", "2", *SMALL],
        env={"COMMBENCH_CORRUPT_RANK": "1"},
    )
    assert run.returncode == 1
    assert "FAILED" in run.stdout
    records = read_results(run.output)
    # rank 1 alters one element of each result it checks: one wrong element per checked block
    checked = [r for r in records if r.num_wrong is not None]
    assert checked and all(r.num_wrong == 1 for r in checked)


def test_wrong_elements_are_those_of_the_first_failing_pass(commbench):
    # nccl-tests' BenchTime: each -c pass's count replaces the last and the first failing pass
    # ends the checks; rank 1 alters one element per pass, so 1, not 3
    run = commbench(
        ["--ops", "all_reduce", "--nprocs", "2", "-c", "3", *SMALL],
        env={"COMMBENCH_CORRUPT_RANK": "1"},
    )
    assert run.returncode == 1
    assert {r.num_wrong for r in read_results(run.output)} == {1}


def test_each_op_is_framed_as_one_nccl_tests_binary(commbench):
    run = commbench(["--ops", "all_gather,all_reduce", "--nprocs", "2", *SMALL])
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    # util.cu writeDeviceReport: version, banner, then the run's parameters
    assert lines[1] == "# Collective test starting: all_gather_perf"
    assert lines[2].startswith("# nThread 1 nGpus 1 minBytes 64 maxBytes 4096 step: 8(factor)")
    assert lines[2].endswith(" graph: 0 unalign: 0")
    # writeResultFooter and finalizeFooter after each test, the next banner after them
    concluded = lines.index("# Collective test concluded: all_gather_perf")
    assert lines[concluded - 2].startswith("# Avg bus bandwidth    : ")
    assert lines[concluded - 1 : concluded + 3] == [
        "#",
        "# Collective test concluded: all_gather_perf",
        "#",
        "# Collective test starting: all_reduce_perf",
    ]
    assert "# Collective test concluded: all_reduce_perf" in lines


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nccl_path_on_the_gpus_present(commbench):
    gpus = torch.cuda.device_count()
    run = commbench(["--ops", "all", "--backend", "nccl", "--nprocs", str(gpus), *SMALL])
    assert run.returncode == 0, run.stderr
    records = read_results(run.output)
    assert {r.world_size for r in records} == {gpus}
    assert all(r.num_wrong in (0, None) for r in records)
    assert run.document()["env"]["nccl_version"]
