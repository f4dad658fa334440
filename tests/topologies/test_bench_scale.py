"""Speed at scale (skipped by default; run with ``pytest --benchmark-only``)."""

from topologies.presets import build_cluster


def test_build_16k_gpu_cluster(benchmark):
    topo = benchmark.pedantic(
        build_cluster, args=("dgx-h100", 2048, "ib-ndr"), rounds=1, iterations=1
    )
    assert topo.num_gpus == 16_384 and topo.fabric is not None and topo.fabric.num_tiers == 3


def test_path_queries_16k(benchmark):
    topo = build_cluster("dgx-h100", 2048, "ib-ndr")
    pairs = [(i, 16_383 - i) for i in range(0, 8192, 8)]

    def query():
        return [topo.path(a, b) for a, b in pairs]

    paths = benchmark(query)
    assert all(len(p) == 10 for p in paths[:4])
