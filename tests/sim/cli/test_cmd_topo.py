"""``commsim topo``: smoke tests through the real dispatcher."""

import json
import subprocess
import sys

import matplotlib.image

from sim.cli.main import main


def test_single_dgx_h100(capsys):
    assert main(["topo", "dgx-h100"]) == 0
    out = capsys.readouterr().out
    assert "GPUs: 8 (1 server(s) x 8 h100-sxm" in out
    assert "NVLink             450.0       370.8" in out
    assert "1 NIC per GPU (ib-ndr, 50 GB/s)" in out
    assert "intra-node  0 -> 1: 2 (nvlink-nvlink)" in out


def test_cluster_and_oversubscription(capsys):
    assert main(["topo", "dgx-h100", "--nodes", "128", "--fabric", "ib-ndr", "--json"]) == 0
    full = json.loads(capsys.readouterr().out)
    assert full["gpus"] == 1024
    assert full["bisection_gbps"]["nominal"] == 25_600.0
    assert full["per_gpu_gbps"]["network"]["nominal_gbps"] == 50.0
    assert set(full["hops"]) == {"intra-node", "same leaf", "via spine"}
    assert full["hops"]["via spine"]["hops"] == 8
    args = ["topo", "dgx-h100", "--nodes", "128", "--fabric", "ib-ndr", "--oversubscription", "2"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "bisection       12,800.0" in out
    assert "oversubscription: leaf 2.00:1 (leaf ports 32 down / 16 up)" in out


def test_three_tier_reports_core_hops(capsys):
    assert main(["topo", "dgx-h100", "--nodes", "300", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["fabric"]["tiers"] == 3
    assert summary["hops"]["via core"]["hops"] == 10


def test_draw_writes_png(tmp_path, capsys):
    png = tmp_path / "t.png"
    assert main(["topo", "dgx-h100", "--nodes", "16", "--draw", str(png)]) == 0
    assert f"drawing written to {png}" in capsys.readouterr().out
    assert matplotlib.image.imread(png).shape[1] > 600


def test_yaml_file_and_localhost(tmp_path, capsys):
    cluster = tmp_path / "c.yaml"
    cluster.write_text("node: localhost\n")
    assert main(["topo", str(cluster), "--gpus-per-node", "4"]) == 0
    out = capsys.readouterr().out
    assert "GPUs: 4 (1 server(s) x 4 cpu" in out and "loopback" in out


def test_bad_input_is_one_line_exit_2(tmp_path, capsys):
    typo = tmp_path / "typo.yaml"
    typo.write_text("node: dgx-h100\nnum_nodse: 2\n")
    assert main(["topo", str(typo)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "unknown key 'num_nodse'" in err
    assert main(["topo", "dgx-h100", "--fabric", "myrinet"]) == 2
    assert (
        "error: unknown cluster.fabric preset 'myrinet'; valid: azure-ndr, efa-p4d, efa-p5"
        in capsys.readouterr().err
    )
    assert main(["topo", "missing.yaml"]) == 2


def test_no_torch_import():
    code = (
        "import sys\n"
        "from sim.cli.main import main\n"
        "main(['topo', 'localhost'])\n"
        "print('torch' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip().splitlines()[-1] == "False"


def test_malformed_cluster_yaml_is_one_line_with_file_and_line(tmp_path, capsys):
    from sim.cli.main import main

    path = tmp_path / "broken.yaml"
    path.write_text("node: [dgx-h100\n")
    assert main(["topo", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("commsim: error: malformed input:") and err.count("\n") == 1
    assert f"{path}, line 2, column 1" in err


def test_cloud_and_sharp_fabrics_are_described(capsys):
    assert main(["topo", "p5-h100", "--nodes", "4"]) == 0
    out = capsys.readouterr().out
    assert "1 NIC per GPU (efa-p5, 4 lanes of 12.5 GB/s)" in out
    assert "in-network reduction: no" in out
    assert "aws-ofi-nccl over EFA; plugin-reported latency 75 us" in out
    assert "per-message latency: 75 us per inter-node step (+3 us Simple)" in out
    sharp = "ib-ndr-sharp-collnet"
    assert main(["topo", "dgx-h100", "--nodes", "4", "--fabric", sharp, "--json"]) == 0
    fabric = json.loads(capsys.readouterr().out)["fabric"]
    assert fabric["sharp"] is True and fabric["collnet"] is True and fabric["tuner"] == "nccl"
    assert fabric["step_latency_us"] is None and fabric["plugin_latency_us"] == 0.0
    assert main(["topo", "dgx-h100", "--nodes", "2", "--fabric", sharp]) == 0
    assert "in-network reduction: yes (SHARP switches, NCCL_COLLNET_ENABLE=1" in (
        capsys.readouterr().out
    )
    assert main(["topo", "dgx-h100", "--nodes", "2", "--fabric", "ib-ndr-sharp"]) == 0
    assert "in-network reduction: no (SHARP switches, but NCCL's CollNet is off" in (
        capsys.readouterr().out
    )
