"""Where a search or a sweep runs: in this process, local worker processes, or Ray tasks."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from schedules.plan import load_plan
from sim.cli.main import main
from sim.search.run import run_calls, simulate_layouts
from sim.search.sweep import simulate_scenario, with_deltas

PLAN = {
    "name": "small",
    "model": {
        "name": "small", "num_layers": 4, "hidden_size": 1024, "num_heads": 16,
        "ffn_hidden_size": 4096, "vocab_size": 32000, "seq_len": 1024,
    },
    "cluster": {"node": "dgx-h100", "num_nodes": 2, "fabric": "ib-ndr"},
    "parallel": {"tp": 2, "pp": 1},
    "training": {"micro_batch_size": 1, "global_batch_size": 64},
}  # fmt: skip


def _plans() -> list:
    plan = load_plan(PLAN)
    return [
        dataclasses.replace(
            plan, name=f"tp{tp}", parallel=dataclasses.replace(plan.parallel, tp=tp)
        )
        for tp in (1, 2, 4)
    ]


def test_worker_processes_give_the_rows_of_one_process() -> None:
    plans = _plans()
    assert simulate_layouts(plans, jobs=2) == simulate_layouts(plans, jobs=1)


def test_a_sweep_row_compares_each_scenario_with_the_plan_as_planned() -> None:
    plan = load_plan(PLAN)
    rows = with_deltas(
        run_calls(
            [(simulate_scenario, (plan, flags)) for flags in ((), ("slow_gpu=3:0.5",))], jobs=1
        )
    )
    planned, slow = rows
    assert planned["scenario"] == "as planned" and planned["delta_pct"] == 0.0
    assert slow["scenario"] == "slow_gpu=3:0.5" and slow["delta_pct"] > 0
    assert slow["simulated_ranks"] > planned["simulated_ranks"] == 1


def test_commsim_sweep_prints_every_plan_and_scenario(tmp_path, capsys) -> None:
    import yaml

    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(PLAN))
    out = tmp_path / "rows.csv"
    code = main(["sweep", str(path), "--whatif", "slow_gpu=3:0.5;nic=9:down", "--csv", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    assert "as planned" in text and "slow_gpu=3:0.5; nic=9:down" in text
    assert out.read_text().splitlines()[0].startswith("plan,scenario,step_time_s,delta_pct")


def test_a_bad_scenario_is_refused_before_any_simulation(tmp_path, capsys) -> None:
    import yaml

    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(PLAN))
    assert main(["sweep", str(path), "--whatif", "slow_gpu=3"]) == 2
    assert "expected slow_gpu=WHO:AMOUNT" in capsys.readouterr().err
    # a switch the cluster does not have, or a rank it does not have
    assert main(["sweep", str(path), "--whatif", "link=leaf0-spine999:0.5"]) == 2
    assert "'spine999' is not a switch of this cluster's fabric" in capsys.readouterr().err
    assert main(["sweep", str(path), "--whatif", "slow_gpu=99:0.5"]) == 2
    assert "whatif rank 99: the cluster has ranks 0..15" in capsys.readouterr().err
    # a link with a second job given as its collectives is checked and simulated
    both = "link=leaf0-spine1:0.5;second_job=0-1:all_reduce:64:100"
    assert main(["sweep", str(path), "--whatif", both]) == 0, capsys.readouterr().err


def test_ray_missing_says_how_to_install_it(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ValueError, match=r"pip install 'commbench\[ray\]'"):
        simulate_layouts(_plans()[:1], ray_address="local")


def test_a_local_ray_instance_ranks_as_local_processes() -> None:
    ray = pytest.importorskip("ray")
    plans = _plans()
    try:
        rows = simulate_layouts(plans, ray_address="local")
    finally:
        ray.shutdown()
    assert rows == simulate_layouts(plans, jobs=2)


@pytest.mark.parametrize(
    ("scenarios", "message"),
    [
        ([";;"], "--whatif ';;': an empty scenario"),
        ([""], "--whatif '': an empty scenario"),
        (["slow_gpu=3:0.5", "slow_gpu=3:0.5;"], "--whatif 'slow_gpu=3:0.5;': the same scenario"),
    ],
)
def test_an_empty_or_repeated_scenario_is_refused(tmp_path, capsys, scenarios, message) -> None:
    import yaml

    path = tmp_path / "plan.yaml"
    path.write_text(yaml.safe_dump(PLAN))
    out = tmp_path / "rows.csv"
    whatifs = [arg for scenario in scenarios for arg in ("--whatif", scenario)]
    assert main(["sweep", str(path), *whatifs, "--csv", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"commsim: error: {message}") and err.count("\n") == 1
    assert not out.exists()


def test_an_invalid_plan_among_several_is_named(tmp_path, capsys) -> None:
    import yaml

    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text(yaml.safe_dump(PLAN))
    bad.write_text(yaml.safe_dump({**PLAN, "parallel": {"tp": 3, "pp": 1, "dp": 4}}))
    out = tmp_path / "rows.json"
    assert main(["sweep", str(good), str(bad), "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"commsim: error: {bad}: world size 16 != tp*cp*pp*dp = 12 (tp=3, cp=1, pp=1, dp=4)\n"
    )
    assert not out.exists()
