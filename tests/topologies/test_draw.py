"""Drawings: a PNG is written, small clusters in full, large ones summarised."""

import matplotlib.image

from topologies.draw import _natural, draw_topology
from topologies.presets import build_cluster


def test_draws_a_preset_png(tmp_path):
    path = tmp_path / "dgx.png"
    draw_topology(build_cluster("dgx-h100"), path)
    image = matplotlib.image.imread(path)
    assert image.shape[0] > 400 and image.shape[1] > 600
    assert image[..., :3].std() > 0.05  # not a blank canvas


def test_large_cluster_is_summarised(tmp_path):
    path = tmp_path / "big.png"
    draw_topology(build_cluster("dgx-h100", num_nodes=64, fabric="ib-ndr"), path, max_servers=2)
    assert path.stat().st_size > 10_000


def test_natural_order():
    assert sorted(["leaf10", "leaf2", "leaf1"], key=_natural) == ["leaf1", "leaf2", "leaf10"]
