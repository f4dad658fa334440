"""Flag parsing: nccl-tests' letters, binary sizes, the sweep and one-line errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from comm_bench.options import (
    BenchOptions,
    parse_options,
    validate_for_backend,
    validate_for_world,
)


def test_sweeps_by_factor_and_by_step():
    assert parse_options(["-b", "1K", "-e", "16K", "-f", "4"]).sizes() == [1024, 4096, 16384]
    assert parse_options(["-b", "1M", "-e", "3M", "-f", "1", "-i", "1M"]).sizes() == [
        1 << 20,
        2 << 20,
        3 << 20,
    ]


def test_nccl_tests_flags_map_to_fields():
    o = parse_options(
        [
            "--ops",
            "all",
            "-d",
            "half",
            "-o",
            "MAX",
            "-r",
            "1",
            "-a",
            "3",
            "-n",
            "7",
            "-w",
            "0",
            "-c",
            "2",
            "-I",
            "1",
            "--output",
            "x.json",
            "-T",
            "9",
        ]
    )
    assert (o.dtype, o.redop, o.root, o.average, o.iters, o.warmup_iters, o.check_iters) == (
        "float16",
        "max",
        1,
        3,
        7,
        0,
        2,
    )
    assert o.per_iter_columns and o.output == Path("x.json") and o.timeout_s == 9.0
    assert len(o.ops) == 7
    assert BenchOptions().ops == ("all_reduce",) and parse_options([]) == BenchOptions()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-b", "1X"], "bad size '1X'"),
        (["-b", "2M", "-e", "1M"], "-b 2097152 is larger than -e 1048576"),
        (["-d", "float8"], "unknown dtype 'float8'"),
        (["-o", "xor"], "unknown reduction -o 'xor'"),
        (["-a", "5"], "-a must be 0, 1, 2 or 3"),
        (["--ops", "gather"], "unknown op 'gather'"),
        (["--backend", "mpi"], "unknown --backend 'mpi'"),
        (["--output", "x.txt"], "--output must end in .json"),
        (["--op", "sum"], None),  # nccl-tests' long name of -o is accepted, not --ops
        (["--nope"], "unrecognized arguments: --nope"),
        (["-b", "-1K"], "bad size '-1K'"),
        (["-I", "5"], "-I must be 0 or 1, got 5"),
        (["-e", "-16M"], "bad size '-16M'"),
        (["-n", "100000000000"], "-n must be in 1..1,000,000, got 100,000,000,000"),
        (["-w", "2000000"], "-w must be in 0..1,000,000"),
        (["-T", "inf"], "--timeout must be 1 to 86400 seconds, got inf"),
        (["-T", "0.001"], "--timeout must be 1 to 86400 seconds, got 0.001"),
        (["--nprocs", "100000"], "--nprocs 100000: at most"),
        (["-g", "8"], "-g 8: commbench runs only -g 1 (one GPU per process"),
        (["-t", "2"], "-t 2: commbench runs only -t 1"),
        (["-G", "1"], "-G 1: commbench runs only -G 0 (calls are not captured in CUDA graphs)"),
        (["-m", "4"], "-m 4: commbench runs only -m 1"),
        (["-g", "one"], "argument -g/--ngpus: invalid int value: 'one'"),
    ],
)
def test_bad_values_raise_one_line(argv, message):
    if message is None:
        assert parse_options(argv).redop == "sum"
        return
    with pytest.raises(ValueError, match=None) as error:
        parse_options(argv)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_a_pasted_nccl_tests_command_line_runs_as_written():
    # the published p5 command of refdata/collectives/aws-p5-h100 and nccl-tests' defaults
    argv = "-b 8 -e 16G -f 2 -g 1 -c 1 -n 100 -t 1 -m 1 -z 0 -G 0 -C 0 -u 0 -N 1 -p 0 -y 0"
    o = parse_options(argv.split())
    assert (o.min_bytes, o.max_bytes, o.step_factor, o.iters, o.check_iters) == (
        8, 16 << 30, 2, 100, 1,
    )  # fmt: skip
    assert parse_options(["-b", "1.5K", "-e", "0.5M"]).sizes()[:2] == [1536, 3072]


def test_root_must_be_a_rank_for_rooted_ops():
    validate_for_world(parse_options(["--ops", "all_reduce", "-r", "9"]), 4)
    with pytest.raises(ValueError, match="-r 4 is not a rank of a 4-rank world"):
        validate_for_world(parse_options(["--ops", "broadcast", "-r", "4"]), 4)


@pytest.mark.parametrize(
    ("spelling", "dtype"),
    [("bf16", "bfloat16"), ("BF16", "bfloat16"), ("torch.bfloat16", "bfloat16"),
     ("half", "float16"), ("fp16", "float16"), ("float", "float32"), ("fp32", "float32"),
     ("double", "float64"), ("char", "int8"), ("int", "int32"), ("bfloat16", "bfloat16")],
)  # fmt: skip
def test_nccl_tests_dtype_spellings_and_aliases(spelling: str, dtype: str) -> None:
    assert parse_options(["-d", spelling]).dtype == dtype


def test_a_dtype_typo_gets_the_nearest_names() -> None:
    with pytest.raises(ValueError) as error:
        parse_options(["-d", "bfloat"])
    assert str(error.value).startswith(
        "unknown dtype 'bfloat' for -d (did you mean 'float' or 'bfloat16'?); valid: bf16, "
    )


def test_a_world_where_no_op_can_run_is_refused_before_spawning() -> None:
    with pytest.raises(ValueError) as error:
        validate_for_world(parse_options(["--ops", "send_recv"]), 1)
    assert str(error.value) == (
        "nothing to measure: send_recv needs 2 ranks, the world has 1 (--nprocs 2)"
    )
    validate_for_world(parse_options(["--ops", "send_recv,all_reduce"]), 1)  # all_reduce runs


def test_integer_avg_on_gloo_with_nothing_else_to_measure_is_refused() -> None:
    with pytest.raises(ValueError) as error:
        validate_for_backend(
            parse_options(["--ops", "all_reduce,reduce", "-o", "avg", "-d", "int32"]), "gloo"
        )
    assert str(error.value) == (
        "nothing to measure: backend gloo cannot average integers (-o avg -d int32) for "
        "all_reduce, reduce: it divides the sum in place; use a floating-point -d, another -o, "
        "or --backend nccl"
    )
    validate_for_backend(parse_options(["-o", "avg", "-d", "int32"]), "nccl")  # ncclAvg divides
    validate_for_backend(parse_options(["-o", "avg", "-d", "bf16"]), "gloo")  # floats average
    mixed = parse_options(["--ops", "all_reduce,broadcast", "-o", "avg", "-d", "int8"])
    validate_for_backend(mixed, "gloo")  # broadcast runs; all_reduce is skipped with a note
