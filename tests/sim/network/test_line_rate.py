"""Property: no calibration makes the model move bytes faster than the hardware's line rate.

Whatever the measurements say (here: synthetic ones up to 3x faster than the links allow), the
fitted efficiency stays <= 1, so on every fabric and algorithm (in-network reduction included)
the busiest link never carries its bytes faster than its nominal line rate.
"""

from __future__ import annotations

import functools

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.network.algorithms import choose, placement_of
from sim.network.analytical import CommParams, available_algorithms, cost_terms
from sim.network.fitting import fit_calibration
from sim.network.nccl_tables import NCCL_ALGORITHMS
from topologies.hardware import LINKS
from topologies.presets import build_cluster
from vocab.collectives import get
from vocab.records import Record

CLUSTERS = (
    ("dgx-h100", 1, None),
    ("dgx-h100", 2, "ib-ndr-sharp-collnet"),
    ("p5-h100", 4, "efa-p5"),
    ("a3-mega-h100", 2, "gcp-a3-mega"),
    ("nd-h100-v5", 2, "azure-ndr"),
    ("dgx-a100", 2, "ib-hdr"),
)
SIZES = [1 << k for k in range(16, 34, 3)]


@functools.lru_cache(maxsize=16)
def _cluster(node: str, nodes: int, fabric: str | None):
    return build_cluster(node, nodes, fabric)


def _records(op, algo, layout, truth, nodes):
    records = []
    for size in SIZES:
        size = get(op).counts(size, 4, layout.num_ranks).size_bytes
        protocol = choose(op, layout, size, algo)[1]
        time_s = cost_terms(op, algo, layout, size, protocol).time_s(truth, size)
        records.append(Record(
            op=op, size_bytes=size, count=size // 4, dtype="float32", world_size=layout.num_ranks,
            num_nodes=nodes, in_place=False, time_us=time_s * 1e6, algbw_gbps=0.0,
            busbw_gbps=0.0, algo=algo,
        ))  # fmt: skip
    return records


@settings(max_examples=24, deadline=None)
@given(
    cluster=st.sampled_from(CLUSTERS),
    op=st.sampled_from(["all_reduce", "all_gather", "reduce_scatter"]),
    efficiency=st.floats(0.3, 3.0),
    data=st.data(),
)
def test_no_calibration_puts_a_link_above_its_line_rate(cluster, op, efficiency, data):
    node, nodes, fabric = cluster
    topology = _cluster(node, nodes, fabric)
    layout = placement_of(topology, range(topology.num_gpus))
    usable = [a for a in available_algorithms(op, layout) if a in NCCL_ALGORITHMS]
    algo = data.draw(st.sampled_from(usable))
    truth = CommParams(
        base_latency_s=10e-6, intra_step_latency_s=0.0, inter_step_latency_s=0.0,
        efficiency_max=efficiency, half_size_bytes=0.0,
    )  # fmt: skip
    records = _records(op, algo, layout, truth, nodes)
    calibration, _ = fit_calibration(records, lambda *_: topology, topology_name=node)
    (params,) = calibration.params.values()
    assert 0 < params.efficiency_max <= 1.0
    spec = topology.node
    assert spec is not None
    keys = [k for k in (spec.nvlink, spec.nic if nodes > 1 else None) if k is not None]
    # Bytes / bandwidth seconds <= nominal rate  <=>  seconds >= time at the effective rate
    # x effective / nominal; the strictest ratio of the links involved bounds them all.
    ratio = max(
        LINKS[k].effective_bandwidth_bytes_per_s / LINKS[k].nominal_bandwidth_bytes_per_s
        for k in keys
    )
    for record in records:
        protocol = choose(op, layout, record.size_bytes, algo)[1]
        terms = cost_terms(op, algo, layout, record.size_bytes, protocol)
        _, _, bandwidth_s = terms.split_s(params, record.size_bytes)
        assert bandwidth_s >= terms.bandwidth_time_s * ratio * (1 - 1e-12)
