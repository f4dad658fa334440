"""``commsim search``: every valid layout, pruned by memory, simulated and ranked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from sim.cli.main import main
from sim.search.run import Row, pareto_front
from tests.sim.cli.test_cmd_plan import TINY_PLAN, _write_plan

SPACE = ["--tp", "1,2", "--pp", "1,2", "--data-parallel", "ddp,fsdp2,zero3",
         "--micro-batch", "1", "--recompute", "none,full", "--no-interleaved"]  # fmt: skip


def _row(name: str, tokens: float, memory: float) -> Row:
    return Row(name=name, step_time_s=1.0, tokens_per_s=tokens, mfu=0.5, memory_gib=memory,
               exposed_comm_s=0.0, bottleneck="compute")  # fmt: skip


def test_the_pareto_front_keeps_layouts_nothing_beats_on_both() -> None:
    rows = [_row("a", 100, 10), _row("b", 90, 20), _row("c", 150, 30), _row("d", 150, 40)]
    assert [r.name for r in pareto_front(rows)] == ["a", "c"]


def test_search_ranks_every_valid_layout_and_writes_the_best_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _write_plan(tmp_path, TINY_PLAN)
    out = {k: tmp_path / f"s.{k}" for k in ("json", "csv", "yaml", "png")}
    files = ["--json", out["json"], "--csv", out["csv"], "--best-plan", out["yaml"],
             "--plot", out["png"]]  # fmt: skip
    argv = ["search", str(plan), *SPACE, "--top", "3", *map(str, files)]
    assert main(argv) == 0
    captured = capsys.readouterr()
    text = captured.out.splitlines()
    progress = captured.err.splitlines()  # not a terminal: a line per 10% of the simulations
    assert len(progress) == 10 and progress[-1].startswith("simulating: 100% (10/10 layouts, ")
    # 2 tp x 2 pp x 3 kinds x 2 recompute = 24 tried; ZeRO-3 under PP is refused (2 x 2); every
    # layout fits without recompute, so its full-recompute twin is dominated (10)
    assert text[0] == (
        "# 24 layouts tried, 10 simulated; not simulated: 10 dominated (fits with less "
        "recompute), 4 refused (data_parallel=zero3 cannot run under pipeline parallelism ...)"
    )
    assert len(text) == 2 + 3
    rows = json.loads(out["json"].read_text())["rows"]
    assert len(rows) == 10
    speeds = [r["tokens_per_s"] for r in rows]
    assert speeds == sorted(speeds, reverse=True)
    assert out["csv"].read_text().count("\n") == 11 and out["png"].stat().st_size > 0
    best = yaml.safe_load(out["yaml"].read_text())
    best_file = tmp_path / "best.yaml"
    best_file.write_text(yaml.safe_dump(best))
    assert main(["plan", str(best_file), "--json"]) == 0
    replayed = json.loads(capsys.readouterr().out)
    assert replayed["step_time_s"] == pytest.approx(rows[0]["step_time_s"], rel=1e-9)


def test_no_layout_left_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = _write_plan(tmp_path, TINY_PLAN)
    argv = ["search", str(plan), *SPACE, "--headroom", "0.0001"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == (
        "commsim: error: no layout of the 24 tried is valid and fits (20 over the memory "
        "headroom, 4 refused (data_parallel=zero3 cannot run under pipeline parallelism ...))\n"
    )
    assert main(["search", str(plan), "--headroom", "1.5"]) == 2
    assert "--headroom must be in (0, 1], got 1.5" in capsys.readouterr().err


def test_search_from_flags_reports_days_and_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["search", "--model", "llama3-8b", "--cluster", "dgx-h100", "--nodes", "1",
            "--global-batch", "16", "--seq-len", "1024", "--tp", "8", "--pp", "1",
            "--data-parallel", "ddp", "--micro-batch", "1", "--recompute", "full",
            "--tokens", "1e9", "--price", "2.5", "--json", str(tmp_path / "s.json")]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    best = json.loads((tmp_path / "s.json").read_text())["rows"][0]["tokens_per_s"]
    hours = 1e9 / best / 3600
    assert lines[-1] == (
        f"# 1e+09 tokens with the best layout: {hours / 24:,.1f} days on 8 GPUs "
        f"({hours * 8:,.0f} GPU-hours, {hours * 8 * 2.5:,.0f} at 2.5 per GPU-hour)"
    )
    assert main(["search", "--model", "llama3-8b"]) == 2
    assert "give a PLAN.yaml, or --cluster, --global-batch" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--nodes", "4"], "--nodes: give either a PLAN.yaml or these flags, not both"),
        (["--price", "2"], "--price needs --tokens"),
        (["--tokens", "nan"], "--tokens must be a positive number, got nan"),
        (["--tokens", "0"], "--tokens must be a positive number, got 0.0"),
    ],
)
def test_contradictory_or_bad_flags_are_refused_before_searching(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    plan = _write_plan(tmp_path, TINY_PLAN)
    assert main(["search", str(plan), *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_repeated_values_and_equal_layouts_are_simulated_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = _write_plan(tmp_path, TINY_PLAN)
    out = tmp_path / "s.json"
    argv = ["search", str(plan), "--tp", "2,2", "--pp", "2", "--data-parallel", "fsdp,fsdp2",
            "--micro-batch", "1", "--recompute", "none", "--no-interleaved",
            "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    names = [r["layout"] for r in json.loads(out.read_text())["rows"]]
    assert names == ["tp2 pp2 dp2 fsdp2 mbs1 none 1f1b"]  # fsdp under PP is FSDP2
    assert "1 the same layout as another" in capsys.readouterr().out


def test_moe_layouts_try_expert_parallelism_that_divides_the_experts() -> None:
    from schedules.plan import load_plan
    from sim.search.space import SearchSpace, candidate_layouts

    def plan_of(experts: int) -> object:
        model = {
            "name": "m", "num_layers": 4, "hidden_size": 256, "num_heads": 4,
            "ffn_hidden_size": 512, "vocab_size": 1000, "seq_len": 128, "num_experts": experts,
        }  # fmt: skip
        return load_plan(
            {
                "model": model,
                "cluster": {"node": "dgx-h100", "num_nodes": 2},
                "training": {"micro_batch_size": 1, "global_batch_size": 64},
            }
        )

    space = SearchSpace(tp=(1, 2), pp=(1,), micro_batch_size=(1,), recompute=("none",))
    moe = candidate_layouts(plan_of(8), gpus_per_node=8, world_size=16, space=space)
    pairs = {(x["parallel"]["tp"], x["parallel"]["ep"]) for x in moe}
    # ep divides the 8 experts; tp x ep divides the 16 GPUs of the stage
    assert pairs == {(t, e) for t in (1, 2) for e in (1, 2, 4, 8)}
    assert {x["parallel"]["data_parallel"] for x in moe} == {
        "ddp",
        "zero1",
        "distributed_optimizer",
        "fsdp2",  # torchtitan's FSDP2; ZeRO-3 does not run MoE layers here
    }
    dense = candidate_layouts(plan_of(0), gpus_per_node=8, world_size=16, space=space)
    assert all("ep" not in x["parallel"] for x in dense)


def test_a_cluster_file_named_relative_to_the_plan_is_found_from_elsewhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "plans"
    folder.mkdir()
    (folder / "cluster.yaml").write_text(yaml.safe_dump({"node": "dgx-h100", "num_nodes": 1}))
    plan = _write_plan(folder, {**TINY_PLAN, "cluster": {"file": "cluster.yaml"}})
    monkeypatch.chdir(tmp_path)
    argv = ["search", str(plan), "--tp", "2", "--pp", "2", "--data-parallel", "ddp",
            "--micro-batch", "1", "--recompute", "none", "--no-interleaved"]  # fmt: skip
    assert main(argv) == 0
    assert "1 simulated" in capsys.readouterr().out


KINDS = "ddp, zero1, zero2, zero3, fsdp, hsdp, distributed_optimizer, fsdp2"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--data-parallel", "ddp,fsdpp"],
         f"--data-parallel 'fsdpp' is not one of {KINDS} (did you mean 'fsdp' or 'fsdp2'?)"),
        (["--data-parallel", ""],
         "argument --data-parallel: expected comma-separated names, got ''"),
        (["--recompute", "ful"],
         "--recompute 'ful' is not one of none, selective, op, full (did you mean 'full'?)"),
        (["--tp", "2,,4"],
         "argument --tp: expected comma-separated integers >= 1, got '2,,4' (an empty item)"),
        (["--micro-batch", "1,"],
         "argument --micro-batch: expected comma-separated integers >= 1, got '1,' "
         "(an empty item)"),
        (["--ep", "3"], "--ep 3: the model has no experts (tiny is dense; --ep is for MoE models)"),
        (["--tp", "3"], "no layout to try: --tp 3 does not divide the 8 GPUs of the cluster"),
        (["--cp", "3"], "no layout to try: --cp 3 does not divide the 8 GPUs of the cluster"),
        (["--tp", "16"], "no layout to try: --tp 16 exceeds the 8 GPUs of the cluster"),
        (["--tp", "3,5"],
         "no layout to try: --tp 3,5 has no value that divides the 8 GPUs of the cluster"),
        (["--tp", "4", "--cp", "4", "--pp", "1,2"],
         "no layout to try: no tp x pp x cp of tp 4, pp 1,2, cp 4 divides the 8 GPUs of the "
         "cluster"),
        (["--top", "0"], "--top must be >= 1, got 0"),
        (["-j", "0"], "--jobs must be >= 1, got 0"),
        (["--max-pp", "-1"], "--max-pp must be >= 1, got -1"),
        (["--max-layouts", "0"], "--max-layouts must be >= 1, got 0"),
    ],
)  # fmt: skip
def test_a_bad_space_is_one_line_naming_the_flag_and_value(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    plan = _write_plan(tmp_path, TINY_PLAN)
    out = tmp_path / "rows.json"
    assert main(["search", str(plan), *extra, "--json", str(out)]) == 2
    assert capsys.readouterr().err == f"commsim: error: {message}\n"
    assert not out.exists()


def test_no_layout_names_the_experts_of_an_moe_model() -> None:
    from sim.search.space import why_no_layout

    degrees = {"tp": (2,), "pp": (1,), "cp": (1,), "ep": (8,)}
    assert why_no_layout(degrees, 8) == (
        "no layout to try: no tp x pp x cp of tp 2, pp 1, cp 1, ep 8 divides the 8 GPUs of the "
        "cluster (and tp x ep the GPUs of a pipeline stage)"
    )
