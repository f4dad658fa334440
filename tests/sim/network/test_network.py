"""Max-min fair flow network: exact timelines on tiny cases, fairness, properties."""

from __future__ import annotations

import math

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.network.flow import FlowNetwork, max_min_rates

L1, L2, L3 = ("a", "b"), ("b", "c"), ("c", "d")


def _run(capacities, transfers):
    """Start (paths, size, latency, start_s) transfers; return their completion times."""
    env = simpy.Environment()
    net = FlowNetwork(env, capacities)
    done: dict[int, float] = {}

    def starter(index, paths, size, latency, start):
        yield env.timeout(start)
        yield net.transfer(paths, size, latency_s=latency)
        done[index] = env.now

    for index, (paths, size, latency, start) in enumerate(transfers):
        env.process(starter(index, paths, size, latency, start))
    env.run()
    return [done[i] for i in range(len(transfers))]


def test_two_flows_on_one_link_share_it_equally():
    times = _run({L1: 1e9}, [([(L1,)], 1e9, 0.0, 0.0), ([(L1,)], 1e9, 0.0, 0.0)])
    assert times == [2.0, 2.0]


def test_a_flow_limited_elsewhere_leaves_its_share_to_the_other():
    # A crosses L1 (1 GB/s) and L2 (0.25 GB/s); B only L1: A gets 0.25, B the remaining 0.75.
    assert max_min_rates({0: {L1: 1, L2: 1}, 1: {L1: 1}}, {L1: 1.0, L2: 0.25}) == {0: 0.25, 1: 0.75}
    times = _run(
        {L1: 1e9, L2: 0.25e9}, [([(L1, L2)], 0.25e9, 0.0, 0.0), ([(L1,)], 0.75e9, 0.0, 0.0)]
    )
    assert times == pytest.approx([1.0, 1.0], rel=1e-12)


def test_rates_are_recomputed_when_a_flow_starts_and_ends():
    # A alone for 0.5 s (0.5 GB done), then both at 0.5 GB/s: A ends at 1.5, B alone to 2.0.
    times = _run({L1: 1e9}, [([(L1,)], 1e9, 0.0, 0.0), ([(L1,)], 1e9, 0.0, 0.5)])
    assert times == pytest.approx([1.5, 2.0], rel=1e-12)


def test_a_capacity_change_re_rates_the_flows_on_the_link_from_then_on():
    # 1 GB at 1 GB/s; at 0.5 s the link drops to 0.25 GB/s: 0.5 GB left takes 2 s more; the
    # flow on L2 alone is untouched
    env = simpy.Environment()
    net = FlowNetwork(env, {L1: 1e9, L2: 1e9})
    first, second = net.transfer([(L1,)], 1e9), net.transfer([(L2,)], 1e9)
    ends: dict[str, float] = {}
    first.callbacks.append(lambda _: ends.setdefault("L1", env.now))
    second.callbacks.append(lambda _: ends.setdefault("L2", env.now))

    def drop():
        yield env.timeout(0.5)
        net.set_capacities({L1: 0.25e9, L2: 1e9})

    env.process(drop())
    env.run()
    assert ends == pytest.approx({"L1": 2.5, "L2": 1.0}, rel=1e-12)
    with pytest.raises(ValueError, match="must have a capacity > 0"):
        net.set_capacities({L1: 0.0})
    with pytest.raises(ValueError, match="is not in the network"):
        net.set_capacities({("x", "y"): 1.0})


def test_latency_comes_before_the_bytes():
    assert _run({L1: 2e9}, [([(L1,)], 1e9, 0.25, 0.0)]) == [0.75]


def test_lockstep_paths_crossing_one_link_twice_count_twice():
    # One transfer whose two paths both use L1 moves at half the link rate.
    assert _run({L1: 1e9, L2: 1e9}, [([(L1,), (L1, L2)], 1e9, 0.0, 0.0)]) == [2.0]


def test_zero_bytes_take_only_the_latency():
    assert _run({L1: 1e9}, [([(L1,)], 0.0, 3e-6, 0.0)]) == [3e-6]


def test_rate_cap_acts_as_a_private_link():
    env = simpy.Environment()
    net = FlowNetwork(env, {L1: 1e9})
    event = net.transfer([(L1,)], 1e9, max_rate_bytes_per_s=0.5e9)
    env.run(event)
    assert env.now == 2.0


def test_disjoint_flows_do_not_disturb_each_other():
    times = _run({L1: 1e9, L3: 1e9}, [([(L1,)], 1e9, 0.0, 0.0), ([(L3,)], 2e9, 0.0, 0.5)])
    assert times == [1.0, 2.5]


def test_bad_input_is_rejected():
    env = simpy.Environment()
    with pytest.raises(ValueError, match="capacity"):
        FlowNetwork(env, {L1: 0.0})
    net = FlowNetwork(env, {L1: 1.0})
    with pytest.raises(ValueError, match="not in the network"):
        net.transfer([(L2,)], 1.0)
    with pytest.raises(ValueError, match=">= 0"):
        net.transfer([(L1,)], -1.0)


LINKS = [("n", i) for i in range(5)]
flows_strategy = st.lists(
    st.tuples(
        st.lists(st.sampled_from(LINKS), min_size=1, max_size=3, unique=True),
        st.floats(1e3, 1e9),
        st.floats(0.0, 1e-3),
        st.floats(0.0, 1e-2),
    ),
    min_size=1,
    max_size=8,
)
caps_strategy = st.lists(st.floats(1e8, 1e10), min_size=5, max_size=5)


def _scenario(caps, flows, scale=1.0):
    capacities = {link: c * scale for link, c in zip(LINKS, caps, strict=True)}
    transfers = [([tuple(path)], size, lat, start) for path, size, lat, start in flows]
    return capacities, transfers


@settings(max_examples=40, deadline=None)
@given(caps_strategy, flows_strategy)
def test_max_min_rates_are_feasible_and_every_flow_has_a_saturated_bottleneck(caps, flows):
    capacity = dict(zip(LINKS, caps, strict=True))
    usage = {i: dict.fromkeys(path, 1) for i, (path, *_rest) in enumerate(flows)}
    rates = max_min_rates(usage, capacity)
    load = dict.fromkeys(LINKS, 0.0)
    for i, links in usage.items():
        for link in links:
            load[link] += rates[i]
    for link in LINKS:
        assert load[link] <= capacity[link] * (1 + 1e-9)
    for i, links in usage.items():
        # Max-min: some link of the flow is full and no flow on it gets more.
        assert any(
            load[link] >= capacity[link] * (1 - 1e-9)
            and all(rates[j] <= rates[i] * (1 + 1e-9) for j in usage if link in usage[j])
            for link in links
        )


@settings(max_examples=30, deadline=None)
@given(caps_strategy, flows_strategy)
def test_bytes_are_conserved_and_no_flow_beats_its_bottleneck(caps, flows):
    capacities, transfers = _scenario(caps, flows)
    times = _run(capacities, transfers)
    for (paths, size, latency, start), end in zip(transfers, times, strict=True):
        fastest = size / min(capacities[link] for link in paths[0])
        assert end >= start + latency + fastest * (1 - 1e-9)
    # Some link is always saturated, so the network moves >= the smallest capacity per second.
    used = {link for paths, *_ in transfers for link in paths[0]}
    total_bytes = sum(size for _, size, *_ in transfers)
    last_start = max(start + latency for _, _, latency, start in transfers)
    bound = last_start + total_bytes / min(capacities[link] for link in used)
    assert max(times) <= bound * (1 + 1e-9)


@settings(max_examples=30, deadline=None)
@given(caps_strategy, flows_strategy, st.floats(1.0, 8.0))
def test_more_bandwidth_is_never_slower_and_runs_repeat(caps, flows, scale):
    capacities, transfers = _scenario(caps, flows)
    faster, _ = _scenario(caps, flows, scale)
    base = _run(capacities, transfers)
    assert _run(capacities, transfers) == base  # bit for bit
    for slow, quick in zip(base, _run(faster, transfers), strict=True):
        assert quick <= slow * (1 + 1e-9) or math.isclose(quick, slow)
