"""Results files are complete after every add and never half-written."""

from __future__ import annotations

import json
import os
import threading

import pytest

from fileio.output import OutputError
from vocab.readers import read_results
from vocab.records import SCHEMA, Record
from vocab.writer import ResultsWriter, csv_path, default_output_path


def _record(size: int) -> Record:
    return Record(
        op="all_reduce",
        size_bytes=size,
        count=size // 4,
        dtype="float32",
        world_size=2,
        num_nodes=1,
        in_place=False,
        time_us=10.0,
        algbw_gbps=size / 1e4,
        busbw_gbps=size / 1e4,
        num_wrong=0,
        redop="sum",
    )


def test_each_add_rewrites_json_and_csv(tmp_path):
    path = tmp_path / "run.json"
    writer = ResultsWriter(path, env={"world_size": 2}, config={"iters": 3})
    assert json.loads(path.read_text())["results"] == []
    writer.add([_record(1024)])
    writer.add([_record(2048)])
    document = json.loads(path.read_text())
    assert document["schema"] == SCHEMA and document["env"] == {"world_size": 2}
    assert [r.size_bytes for r in read_results(path)] == [1024, 2048]
    assert read_results(csv_path(path)) == read_results(path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["run.csv", "run.json"]


def test_a_named_output_in_a_missing_folder_is_refused(tmp_path):
    with pytest.raises(OutputError, match="does not exist"):
        ResultsWriter(tmp_path / "deep" / "run.json", env={}, config={})
    assert list(tmp_path.iterdir()) == []


def test_a_device_output_gets_no_csv_twin(tmp_path):
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()), daemon=True)
    reader.start()
    writer = ResultsWriter(fifo, env={}, config={})
    reader.join(timeout=30)
    assert writer.csv_target is None and b'"commbench/1"' in received[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe.json"]


def test_default_path_is_timestamped_and_unique(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    first = default_output_path(["all_gather"], now=0.0)
    assert first.parts[:2] == ("results", "commbench") and first.name.startswith(
        "commbench-all_gather-"
    )
    assert first.parent.is_dir()  # the default folder is made for the user
    first.write_text("{}")
    assert default_output_path(["all_gather"], now=0.0) != first
    assert "7ops" in default_output_path(["a"] * 7, now=0.0).name
