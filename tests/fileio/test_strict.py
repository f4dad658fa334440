"""Strict reading: duplicate keys, alias bombs, deep nesting, capped echoes, validated records."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import refdata
from fileio.strict import MAX_ERROR_CHARS, cap_line, load_json, load_yaml, shorten
from sim.cli.main import main
from vocab.readers import read_results

PLAN = """\
model:
  {name: m, num_layers: 2, hidden_size: 256, num_heads: 4, ffn_hidden_size: 1024, seq_len: 256,
   vocab_size: 1024}
cluster: {node: dgx-h100, num_nodes: 1}
training: {global_batch_size: 8, micro_batch_size: 1}
parallel: {tp: 2}
training: {global_batch_size: 16, micro_batch_size: 1}
"""


def test_a_key_given_twice_names_the_key_and_both_lines() -> None:
    with pytest.raises(ValueError) as info:
        load_yaml(PLAN, name="plan.yaml")
    assert str(info.value) == "plan.yaml: key 'training' given twice (lines 5 and 7)"
    with pytest.raises(ValueError, match="key 'a' given twice in one JSON object"):
        load_json('{"a": 1, "b": {"c": 2}, "a": 3}', name="x.json")
    assert load_yaml("a: {b: 1}\nc: {b: 2}\n") == {"a": {"b": 1}, "c": {"b": 2}}  # not a clash


def test_a_plan_with_two_training_blocks_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN)
    assert main(["plan", str(plan)]) == 2
    assert "key 'training' given twice (lines 5 and 7)" in capsys.readouterr().err


def test_a_billion_laughs_is_refused_before_it_expands() -> None:
    lines = ["a: &a [x, x, x, x, x, x, x, x, x, x]"]
    for level in range(1, 9):
        prev, name = chr(96 + level), chr(97 + level)
        lines.append(f"{name}: &{name} [" + ", ".join([f"*{prev}"] * 10) + "]")
    with pytest.raises(ValueError, match="aliases expand to more than 1,000,000 values"):
        load_yaml("\n".join(lines), name="bomb.yaml")
    assert load_yaml("a: &x [1, 2]\nb: *x\n") == {"a": [1, 2], "b": [1, 2]}


def test_deep_nesting_is_one_error_not_a_recursion_crash() -> None:
    with pytest.raises(ValueError, match="nested"):
        load_yaml("[" * 5000 + "]" * 5000, name="deep.yaml")
    with pytest.raises(ValueError, match="nested"):
        load_json("[" * 200_000 + "]" * 200_000, name="deep.json")
    with pytest.raises(ValueError, match="NaN is not a JSON number"):
        load_json('{"x": NaN}', name="n.json")


def test_echoed_values_are_capped() -> None:
    assert shorten("x" * 3_000_000) == "'" + "x" * 59 + "... (3,000,000 characters)"
    assert shorten(list(range(300_000))) == "[0, 1, 2, 3, ...]"
    assert shorten(7) == "7"
    assert cap_line("y" * 9000) == "y" * MAX_ERROR_CHARS + "... (9,000 characters)"


@pytest.mark.parametrize(
    ("key", "value"),
    # under the 1 MiB a plan may have; a bigger file is refused for its size (test_bad_input)
    [("model.num_layers", "9" * 900_000), ("parallel.schedule", list(range(100_000)))],
)
def test_a_huge_value_gives_a_short_error(
    key: str, value: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    section, name = key.split(".")
    raw: dict[str, Any] = {
        "model": {
            "name": "m", "num_layers": 2, "hidden_size": 256, "num_heads": 4,
            "ffn_hidden_size": 1024, "seq_len": 256, "vocab_size": 1024,
        },
        "cluster": {"node": "dgx-h100"},
        "parallel": {},
        "training": {"global_batch_size": 8, "micro_batch_size": 1},
    }  # fmt: skip
    raw[section][name] = value
    plan = tmp_path / "plan.yaml"
    plan.write_text(json.dumps(raw))  # JSON is YAML
    assert main(["plan", str(plan)]) == 2
    err = capsys.readouterr().err
    assert len(err) < MAX_ERROR_CHARS + 60 and key in err


GOOD = {
    "op": "all_reduce", "size_bytes": 1024, "count": 256, "dtype": "float32", "world_size": 4,
    "num_nodes": 1, "in_place": False, "time_us": 10.0, "algbw_gbps": 0.1, "busbw_gbps": 0.15,
    "num_wrong": 0, "redop": "sum", "root": -1, "time_min_us": 9.0, "time_median_us": 10.0,
    "time_p99_us": 12.0, "num_iters": 20, "algo": None, "source": "measured",
}  # fmt: skip


def _write_result(tmp_path: Path, **changes: Any) -> Path:
    path = tmp_path / "run.json"
    text = json.dumps({"schema": "commbench/1", "results": [{**GOOD, **changes}]})
    path.write_text(text.replace('"__nan__"', "NaN"))
    return path


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("time_min_us", "__nan__", "NaN is not a JSON number"),
        ("time_p99_us", "x", "time_p99_us='x' must be a number"),
        ("num_iters", -1, "num_iters=-1 must be >= 1"),
        ("in_place", "yes", "in_place='yes' must be true or false"),
        ("dtype", None, "dtype=None is required"),
        ("dtype", "float7", "dtype='float7' must be one of"),
        ("num_wrong", 1.5, "num_wrong=1.5 must be an integer"),
        ("source", "guessed", "source='guessed' must be one of measured"),
        ("busbw_gbps", 1e400, "Infinity is not a JSON number"),
    ],
)
def test_every_record_field_is_checked(
    field: str, value: Any, message: str, tmp_path: Path
) -> None:
    assert read_results(_write_result(tmp_path))[0].num_iters == 20
    with pytest.raises(ValueError, match=r"result 0|JSON number") as info:
        read_results(_write_result(tmp_path, **{field: value}))
    assert message in str(info.value)


def test_a_log_that_does_not_name_its_collective_takes_op(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "in.txt"
    log.write_bytes((refdata.NCCL_DIR / "h100_8gpu_all_reduce_ring.txt").read_bytes())
    out = tmp_path / "cal.json"
    assert main(["calibrate", str(log), "--topology", "dgx-h100", "-o", str(out)]) == 2
    assert "name it with --op" in capsys.readouterr().err
    assert main(["calibrate", str(log), "--topology", "dgx-h100", "--op", "all_reduce",
                 "-o", str(out)]) == 0  # fmt: skip
    records = read_results(log, op="all_reduce")
    assert {r.world_size for r in records} == {8}  # busbw / algbw = 2 (n - 1) / n = 1.75
    assert json.loads(out.read_text())["schema"].startswith("commsim-calibration")


def test_a_document_read_twice_is_parsed_once_and_each_caller_gets_its_own_copy() -> None:
    from fileio.strict import _parse_yaml

    text = "parallel: {tp: 2, pipeline_layers: [3, 5]}\n"
    _parse_yaml.cache_clear()
    first = load_yaml(text, name="plan.yaml")
    first["parallel"]["pipeline_layers"].append(9)
    second = load_yaml(text, name="plan.yaml")
    assert second == {"parallel": {"tp": 2, "pipeline_layers": [3, 5]}}
    assert _parse_yaml.cache_info().hits == 1
    with pytest.raises(ValueError, match="given twice"):  # errors are raised every time
        load_yaml("a: 1\na: 2\n", name="d.yaml")
    with pytest.raises(ValueError, match="given twice"):
        load_yaml("a: 1\na: 2\n", name="d.yaml")


@pytest.mark.parametrize(
    ("text", "shown", "value"),
    [
        ("n: 016", "'016'", 14),
        ("n: -012", "'-012'", -10),
        ("n: 1:30", "'1:30'", 90),
        ("n: 1:30.5", "'1:30.5'", 90.5),
    ],
)
def test_octal_and_base_60_integers_are_refused_naming_the_value(
    text: str, shown: str, value: float
) -> None:
    """YAML 1.1 reads ``016`` as 14 and ``1:30`` as 90; a config means neither."""
    with pytest.raises(
        ValueError, match=rf"plan.yaml: {shown} \(line 1\) reads as {value} in YAML"
    ):
        load_yaml(text, name="plan.yaml")
    assert load_yaml("n: 0\nm: 10\nh: 0x10\nu: 1_000\ns: '016'", name="plan.yaml") == {
        "n": 0, "m": 10, "h": 16, "u": 1000, "s": "016",
    }  # fmt: skip
