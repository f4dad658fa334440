"""Collectives validated on public nccl-tests results, uncalibrated and leave-one-cluster-out."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from refdata import COLLECTIVES_DIR
from sim.network.compare import compare_records
from sim.validation.collectives import (
    MODES,
    RunEnv,
    busbw_mape,
    fabric_checks,
    load_clusters,
    preset_checks,
    report_json,
    validate_collectives,
)
from topologies.fabrics import FABRIC_PRESETS
from vocab.records import Record

ROOT = Path(__file__).resolve().parents[3]
STORED = ROOT / "results" / "validation" / "collectives.json"
SIZES = [1 << k for k in range(20, 31, 2)]  # 1 MiB .. 1 GiB


def _cluster(folder: Path, name: str, rows: list[tuple[str, int, int, int, float]], **kw) -> None:
    """A cluster folder with one busbw table (op, nodes, gpus per node, size, busbw)."""
    path = folder / name
    path.mkdir(parents=True)
    lines = ["op,num_nodes,gpus_per_node,size_bytes,busbw_gbps"]
    lines += [f"{op},{n},{g},{size},{busbw:.6f}" for op, n, g, size, busbw in rows]
    (path / "table.csv").write_text("\n".join(lines) + "\n")
    doc = {
        "cluster": name, "description": "synthetic", "gpu": "h100-sxm",
        "server": kw.get("server", "dgx-h100"), "fabric": kw.get("fabric"),
        "files": [{"file": "table.csv", "op": "all_reduce", "gpus_per_node": 8,
                   "source": "https://example.org/table", **kw.get("file", {})}],
    }  # fmt: skip
    (path / "cluster.json").write_text(json.dumps(doc))


def _model_busbw(
    nodes: int, fabric: str | None, efficiency: float = 1.0, server: str = "dgx-h100"
) -> list[float]:
    """The model's all_reduce busbw on ``nodes`` servers, per size: uncalibrated, or with every
    link at ``efficiency`` of its rate (latencies unchanged)."""
    from dataclasses import replace

    from sim.network.analytical import ALGORITHMS
    from sim.network.calibration import DEFAULT_PARAMS, Calibration, key
    from topologies.presets import build_cluster

    records = [
        Record(
            op="all_reduce",
            size_bytes=s,
            count=s // 4,
            dtype="float32",
            world_size=8 * nodes,
            num_nodes=nodes,
            in_place=False,
            time_us=1000.0,
            algbw_gbps=1.0,
            busbw_gbps=1.0,
        )
        for s in SIZES
    ]
    topology = build_cluster(server, nodes, fabric if nodes > 1 else None)
    calibration = Calibration(
        params={
            key("all_reduce", algo, scope): replace(DEFAULT_PARAMS[algo], efficiency_max=efficiency)
            for algo in ALGORITHMS
            for scope in ("intra", "inter")
        }
    )
    points = compare_records(records, lambda _n, _g: topology, calibration)
    return [p.simulated_busbw_gbps for p in points]


def test_a_cluster_measured_as_the_model_predicts_scores_zero_uncalibrated(tmp_path) -> None:
    busbw = _model_busbw(1, None)
    _cluster(tmp_path, "a", [("all_reduce", 1, 8, s, b) for s, b in zip(SIZES, busbw, strict=True)])
    results = validate_collectives(load_clusters(tmp_path))
    raw = next(r for r in results if r.mode == "uncalibrated")
    assert len(raw.scored()) == len(SIZES)
    assert busbw_mape(raw.scored()) == pytest.approx(0.0, abs=1e-3)


def test_leave_one_cluster_out_carries_a_machine_efficiency_to_the_held_out_cluster(
    tmp_path,
) -> None:
    """Two nodes whose links both run at 80% of their rate: uncalibrated, each is predicted
    fast, by 1/0.8 - 1 = +25% where bandwidth dominates (1 GiB); fitted on the other one, each
    is predicted within a percent where the other fitted the algorithm NCCL runs (NVLS, 2 MiB
    and up); the 1 MiB ring point, which no cluster has enough ring sizes to fit, stays as
    uncalibrated."""
    busbw = _model_busbw(1, None, efficiency=0.8)
    for name in ("a", "b"):
        rows = [("all_reduce", 1, 8, s, b) for s, b in zip(SIZES, busbw, strict=True)]
        _cluster(tmp_path, name, rows)
    results = validate_collectives(load_clusters(tmp_path))
    for r in results:
        errors = [p.busbw_error_pct for p in r.scored()]
        if r.mode == "uncalibrated":
            assert errors[-1] == pytest.approx(25.0, abs=0.5)
            assert all(0 < e <= 25.0 + 1e-6 for e in errors)
        else:
            fitted = r.scored_calibrated()
            assert [p.algo for p in r.scored() if p not in fitted] == ["ring"]
            assert busbw_mape(fitted) < 1.0, (r.cluster, errors)
            plain = next(u for u in results if u.cluster == r.cluster and u.mode == MODES[0])
            assert r.points[0] == plain.points[0]


def _loco_mape(tmp_path, held_out: str, *, calibrated: bool = True) -> float:
    """Leave-one-cluster-out busbw MAPE of ``held_out``: over its points other clusters
    calibrated (the 1 MiB ring point of these tables has no ring fit to take), or all."""
    results = validate_collectives(load_clusters(tmp_path))
    row = next(r for r in results if r.cluster == held_out and r.mode == MODES[1])
    mape = busbw_mape(row.scored_calibrated() if calibrated else row.scored())
    assert mape is not None
    return mape


def test_one_odd_cluster_does_not_move_what_the_others_agree_on(tmp_path) -> None:
    """Three nodes at 80% of their links' rate and one at 40% (a misconfigured run): held out,
    an 80% node is calibrated on the median of the other three's fits, the 80% one, and is
    predicted within a percent (pooled least squares would land between the two rates)."""
    for name, efficiency in (("a", 0.8), ("b", 0.8), ("c", 0.8), ("d", 0.4)):
        busbw = _model_busbw(1, None, efficiency=efficiency)
        _cluster(
            tmp_path, name, [("all_reduce", 1, 8, s, b) for s, b in zip(SIZES, busbw, strict=True)]
        )
    assert _loco_mape(tmp_path, "a") < 1.0


def test_a_server_is_calibrated_on_servers_of_its_own_generation(tmp_path) -> None:
    """Two A100 nodes at 70% of their links' rate and two H100 nodes at the model's rate: held
    out, an A100 node takes the other A100's fit (within a percent), not the H100s' (which would
    predict it 1/0.7 - 1 = 43% fast)."""
    for name, server, efficiency in (
        ("a100-a", "dgx-a100", 0.7), ("a100-b", "dgx-a100", 0.7),
        ("h100-a", "dgx-h100", 1.0), ("h100-b", "dgx-h100", 1.0),
    ):  # fmt: skip
        busbw = _model_busbw(1, None, efficiency=efficiency, server=server)
        rows = [("all_reduce", 1, 8, s, b) for s, b in zip(SIZES, busbw, strict=True)]
        _cluster(tmp_path, name, rows, server=server)
    assert _loco_mape(tmp_path, "a100-a") < 1.0
    assert _loco_mape(tmp_path, "h100-a") < 1.0


def test_across_servers_only_clusters_on_the_same_fabric_calibrate(tmp_path) -> None:
    """Two InfiniBand clusters whose links run at 80%, and a RoCE cluster measured as the model
    predicts: held out, the RoCE cluster has no other cluster on its fabric, so its presets stand
    (error 0, where the InfiniBand fits would make it 20% slow); an InfiniBand cluster takes the
    other's fit."""
    for name, fabric, efficiency in (
        ("ib-a", "ib-ndr", 0.8),
        ("ib-b", "ib-ndr", 0.8),
        ("roce", "roce-400g", 1.0),
    ):
        busbw = _model_busbw(2, fabric, efficiency=efficiency)
        rows = [("all_reduce", 2, 8, s, b) for s, b in zip(SIZES, busbw, strict=True)]
        _cluster(tmp_path, name, rows, fabric=fabric)
    assert _loco_mape(tmp_path, "roce", calibrated=False) == pytest.approx(0.0, abs=1e-3)
    assert _loco_mape(tmp_path, "ib-a") < 1.0
    rows = {
        r.cluster: r for r in validate_collectives(load_clusters(tmp_path)) if r.mode == MODES[1]
    }
    assert rows["roce"].donors == () and not any(rows["roce"].calibrated)
    assert rows["ib-a"].donors == ("ib-b",) and rows["ib-a"].calibrated[1:] == (True,) * 5


def test_the_fabric_check_scores_only_points_across_servers(tmp_path) -> None:
    one, two = _model_busbw(1, None), _model_busbw(2, "ib-ndr")
    rows = [("all_reduce", 1, 8, s, b) for s, b in zip(SIZES, one, strict=True)]
    rows += [("all_reduce", 2, 8, s, b / 1.1) for s, b in zip(SIZES, two, strict=True)]
    _cluster(tmp_path, "ib", rows, fabric="ib-ndr")
    clusters = load_clusters(tmp_path)
    results = validate_collectives(clusters)
    checks = fabric_checks(results, clusters)
    assert list(checks) == ["ib-ndr"]
    (check,) = checks["ib-ndr"]
    assert check["nodes"] == [2] and check["num_points"] == len(SIZES)
    assert check["mean_busbw_error_pct"] == pytest.approx(10.0, abs=1e-3)
    document = report_json(results, clusters)
    assert document["clusters"]["ib"]["nodes"] == [1, 2]
    assert set(document["summary"]["modes"]) == set(MODES)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"server": "dgx-h1000"}, "server 'dgx-h1000'"),
        ({"fabric": "ib-xdr"}, "fabric 'ib-xdr'"),
        ({"file": {"file": "missing.csv"}}, "file 'missing.csv' not found"),
        ({"file": {"source": " "}}, "no source"),
        ({"file": {"gpus_per_node": 4}}, "says 1 node(s) x 4 GPUs"),
        ({"file": {"colour": "red"}}, "unknown key(s) ['colour']"),
        ({"file": {"channels": 0.5}}, "channels must be an integer in 1..64 (or absent), got 0.5"),
        ({"file": {"channels": 65}}, "channels must be an integer in 1..64 (or absent), got 65"),
        ({"file": {"channels": 0}}, "channels must be an integer in 1..64 (or absent), got 0"),
        ({"file": {"channels": False}}, "channels must be an integer in 1..64 (or absent)"),
        ({"file": {"protocols": ["ll256"]}}, "protocols must be a list of ll, ll128, simple"),
        ({"file": {"algorithms": "ring"}}, "algorithms must be a list of ring, tree"),
        ({"file": {"nccl_version": "2.26"}}, "nccl_version='2.26'; expected a release such as"),
        ({"file": {"nccl_version": 2.26}}, "nccl_version=2.26; expected a release such as"),
    ],
)
def test_a_bad_cluster_description_names_the_problem(tmp_path, change, message) -> None:
    _cluster(tmp_path, "bad", [("all_reduce", 1, 8, 1 << 20, 100.0)], **change)
    with pytest.raises(ValueError, match=re.escape(message)):
        for cluster in load_clusters(tmp_path):
            cluster.records()


def test_a_file_run_under_its_own_nccl_environment_is_simulated_with_it() -> None:
    clusters = {c.name: c for c in load_clusters(COLLECTIVES_DIR)}
    a3 = clusters["gcp-a3-h100"]
    groups = a3.groups()
    envs = [RunEnv(), RunEnv(channels=8), RunEnv(nccl_version="2.18.5")]
    assert {entry.env for entry in a3.files} == set(envs)
    assert sorted(len(records) for records, _ in groups) == sorted(
        len(a3.records(env=env)) for env in envs
    )
    assert sum(len(records) for records, _ in groups) == len(a3.records())
    pinned = a3.topology_for(RunEnv(channels=8))(2, 8)
    assert pinned.fabric is not None and pinned.fabric.spec.channels == 8
    preset = a3.topology_for(RunEnv())(2, 8)
    assert preset.fabric.spec.channels == 12  # the preset's: Google's environment
    # A3 Mega: the GKE demo run set NCCL_PROTO=Simple and NCCL_ALGO=Ring,Tree
    mega = clusters["gcp-a3-mega-h100"]
    demo = RunEnv(protocols=("simple",), algorithms=("ring", "tree"))
    assert demo in {entry.env for entry in mega.files}
    spec = mega.topology_for(demo)(2, 8).fabric.spec
    assert (spec.protocols, spec.algorithms) == (("simple",), ("ring", "tree"))
    assert FABRIC_PRESETS["gcp-a3-mega"].protocols == ("simple", "ll128")
    # the release a file's run printed is the release its topology runs, within a server too
    xe = clusters["ib-ndr-h100-xe9680"]
    (env,) = {entry.env for entry in xe.files}
    assert env.nccl_version == "2.26.2"
    assert xe.topology_for(env)(4, 8).nccl_version == "2.26.2"
    together = clusters["hgx-h100-together"]
    (one_node,) = {entry.env for entry in together.files}
    assert together.topology_for(one_node)(1, 8).nccl_version == "2.26.2"
    assert clusters["ib-ndr-h100-8node-issue309"].topology_for()(8, 8).nccl_version == ""


def test_every_shipped_cluster_loads_with_its_sources() -> None:
    clusters = load_clusters(COLLECTIVES_DIR)
    assert len(clusters) >= 2
    for cluster in clusters:
        records = cluster.records()
        assert records, cluster.name
        assert all(f.source.startswith("https://") for f in cluster.files), cluster.name


def test_the_stored_collective_figures_are_what_the_code_computes() -> None:
    stored = json.loads(STORED.read_text())["summary"]["modes"]
    clusters = load_clusters(COLLECTIVES_DIR)
    now = report_json(validate_collectives(clusters), clusters)["summary"]["modes"]
    for mode in MODES:
        assert now[mode]["num_points"] == stored[mode]["num_points"], mode
        assert now[mode]["busbw_mape_pct"] == pytest.approx(stored[mode]["busbw_mape_pct"]), mode


def test_a_preset_says_what_it_was_checked_against_or_that_it_was_not() -> None:
    checks = preset_checks("a3-mega-h100", "gcp-a3-mega")
    assert checks["fabric_checks"]
    assert all(c["busbw_mape_pct"] >= 0 for c in checks["fabric_checks"])
    unchecked = preset_checks("localhost", None)
    assert unchecked == {"node": [], "fabric_checks": []}


def test_commsim_validate_collectives_prints_each_cluster_and_writes_json(tmp_path, capsys) -> None:
    from sim.cli.main import main

    busbw = _model_busbw(1, None)
    _cluster(tmp_path, "a", [("all_reduce", 1, 8, s, b) for s, b in zip(SIZES, busbw, strict=True)])
    out = tmp_path / "out.json"
    assert main(["validate", "--collectives", str(tmp_path), "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "commsim validate --collectives: 1 clusters" in text
    assert text.count("\n  a ") == 1 and "0.0% +0" in text
    document = json.loads(out.read_text())
    assert document["schema"] == "commsim-collective-validation/1"
    assert {p["mode"] for p in document["points"]} == set(MODES)


def test_commsim_topo_says_unvalidated_where_no_public_table_is_shipped(capsys) -> None:
    from sim.cli.main import main

    assert main(["topo", "nd-h100-v5", "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "fabric azure-ndr: unvalidated across servers (no public measurement shipped)" in out
    assert main(["topo", "p5-h100", "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "fabric efa-p5: " in out and "(in-sample: its tables set some" in out
    assert main(["topo", "a3-ultra-h200", "--nodes", "2"]) == 0
    out = capsys.readouterr().out
    assert "server a3-ultra-h200: unvalidated within one server" in out
