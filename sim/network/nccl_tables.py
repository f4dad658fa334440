"""NCCL's tuning constants, copied once from its source: what every other module reads.

Read from NVIDIA/nccl at commit 5067397 (2026-06-11, version 2.30.7, ``makefiles/version.mk``):
``src/graph/tuning.cc`` (``ncclTunerConstantsDefaults``, ``nvlsEfficiency``,
``treeCorrectionFactor``, ``getNetOverhead``), ``src/graph/search.cc`` (the speed arrays the
graph search walks, ``ncclTopoDupChannels``), ``src/include/device.h`` and ``comm.h`` (thread
counts, thresholds, arities). Times are microseconds and bandwidths GB/s, as in NCCL; the tables
are indexed by our algorithm names and NCCL's protocol order (LL, LL128, Simple).

Earlier releases' tables and the tuner rules that changed since 2.18 are ``TunerRelease``
entries (``RELEASES``, ``tuner_release``), read at NVIDIA/nccl's tags.

    NET_US["ring"][PROTOCOLS.index("simple")]  # 14.0 us per inter-node ring step
    tuner_release("2.26.2").net["nvlstree"]  # (0.0, 0.0, 14.0): 20.9 since 2.28.9
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

from topologies.nccl_release import nccl_release

NCCL_VERSION = "2.30.7 (NVIDIA/nccl 5067397)"
"""The NCCL source these tables were read from."""

PROTOCOLS = ("ll", "ll128", "simple")
"""NCCL's protocols in its enum order (``NCCL_PROTO_LL``, ``_LL128``, ``_SIMPLE``)."""

NCCL_ALGORITHMS = ("tree", "ring", "collnet_direct", "collnet_chain", "nvls", "nvlstree")
"""NCCL's algorithms under our names, in its enum order (``NCCL_ALGO_TREE`` ... ``NVLS_TREE``);
PAT (``NCCL_ALGO_PAT``, all_gather/reduce_scatter with one GPU per node) is not modelled."""

NCCL_NAMES = {
    "tree": "Tree", "ring": "Ring", "collnet_direct": "CollnetDirect",
    "collnet_chain": "CollnetChain", "nvls": "NVLS", "nvlstree": "NVLSTree",
}  # fmt: skip
"""``NCCL_ALGO`` spelling of each algorithm (``ncclAlgoStr``)."""

BASE_US = {
    "tree": (6.8, 14.0, 8.4), "ring": (6.6, 14.0, 8.4), "collnet_direct": (0.0, 0.0, 0.0),
    "collnet_chain": (0.0, 0.0, 0.0), "nvls": (0.0, 0.0, 0.0), "nvlstree": (0.0, 0.0, 0.0),
}  # fmt: skip
"""``baseLatencies[algo][proto]``: fixed cost of one call."""

NVLINK_US = {
    "tree": (0.6, 1.25, 4.0), "ring": (0.6, 1.9, 3.4), "collnet_direct": (0.0, 0.0, 3.7),
    "collnet_chain": (0.0, 0.0, 2.8), "nvls": (0.0, 0.0, 25.0), "nvlstree": (0.0, 0.0, 25.0),
}  # fmt: skip
"""``hwLatencies[NCCL_HW_NVLINK][algo][proto]``: per intra-node step over NVLink."""

PCI_US = {
    "tree": (1.0, 1.9, 4.0), "ring": (1.0, 2.5, 5.7), "collnet_direct": (0.0, 0.0, 3.7),
    "collnet_chain": (0.0, 0.0, 2.8), "nvls": (0.0, 0.0, 0.0), "nvlstree": (0.0, 0.0, 0.0),
}  # fmt: skip
"""``hwLatencies[NCCL_HW_PCI][algo][proto]``: per intra-node step over PCIe."""

NET_US = {
    "tree": (5.0, 8.5, 14.0), "ring": (2.7, 4.0, 14.0), "collnet_direct": (0.0, 0.0, 31.0),
    "collnet_chain": (0.0, 0.0, 30.0), "nvls": (0.0, 0.0, 18.0), "nvlstree": (0.0, 0.0, 20.9),
}  # fmt: skip
"""``hwLatencies[NCCL_HW_NET][algo][proto]``: per inter-node step."""

ARCHS = ("volta", "ampere", "hopper", "blackwell")
"""GPU generations of NCCL's per-compute-capability tables (``NCCL_*_COMPCAP_IDX``)."""

LL_MAX_GBPS = {
    "volta": (39.0, 39.0, 20.4), "ampere": (87.7, 22.5, 19.0),
    "hopper": (141.0, 45.0, 35.0), "blackwell": (282.0, 90.0, 70.0),
}  # fmt: skip
"""``llMaxBws[index1][index2]``: index1 is the GPU generation on one node and the CPU vendor on
several (row 0 Intel, row 1 AMD: the volta and ampere rows); index2 is 1, 2, > 2 nodes."""

PER_CH_RING_LL128_GBPS = {
    "volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
    "hopper": (36.7, 36.7, 36.7), "blackwell": (40.0, 40.0, 40.0),
}  # fmt: skip
"""``perChMaxRingLL128Bws[arch][1, 2, > 2 nodes]``."""

PER_CH_TREE_LL128_GBPS = {
    "volta": (20.0, 20.0, 20.0), "ampere": (20.0, 20.0, 20.0),
    "hopper": (36.7, 36.7, 29.0), "blackwell": (55.6, 31.67, 20.0),
}  # fmt: skip
"""``perChMaxTreeLL128Bws[arch][1, 2, > 2 nodes]``."""

PER_CH_TREE_GBPS = {
    "volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
    "hopper": (38.7, 41.4, 36.0), "blackwell": (70.0, 42.8, 24.0),
}  # fmt: skip
"""``perChMaxTreeBws[arch][1, 2, > 2 nodes]``."""

PER_CH_NVLSTREE_GBPS = {
    "volta": (26.5, 18.5, 10.0), "ampere": (24.0, 23.6, 17.8),
    "hopper": (0.0, 57.7, 45.5), "blackwell": (0.0, 96.0, 80.0),
}  # fmt: skip
"""``perChMaxNVLSTreeBws[arch][1, 2, > 2 nodes]``."""

NVLS_EFFICIENCY = {"volta": 0.0, "ampere": 0.0, "hopper": 0.85, "blackwell": 0.74}
"""``nvlsEfficiency[arch]``: NCCL's NVLS busbw per unit of its graph's intra bandwidth."""

LL_FACTOR = 0.5
"""Ring/LL busbw factor: 4 B of data per 8-byte line (tuning.cc ``busBw * .5``)."""
LL128_FACTOR = 0.92
"""Ring/LL128 busbw factor (tuning.cc ``0.92 /*120.0/128.0*/``)."""
TREE_AR_FACTOR = 0.92
"""Tree all_reduce busbw factor (tuning.cc ``busBw * .92``)."""
TREE_LL_FACTOR = 1.0 / 3.8
"""Tree/LL busbw factor (tuning.cc ``busBw * 1.0 / 3.8``)."""
TREE_LL128_FACTOR = (7.0 / 9.0, 120.0 / 128.0)
"""Tree/LL128 busbw factor on one node and on several (tuning.cc)."""
COLLNET_SM90_FACTOR = 0.85
"""CollNetDirect all_reduce busbw factor on compute capability >= 9.0 (tuning.cc)."""
COLLNET_ARITY_US = 0.4
"""CollNetDirect "arity serialization latency" per extra local rank, per direction (tuning.cc)."""
RING_PLATEAU = (1.9, 1.4)
"""Ring/Simple all_reduce latency multiplier on several nodes: before Ampere, from Ampere on
(``ncclTopoGetAlgoTime``, "plateau effect of ring")."""
NET_OVERHEAD_US = {"intel": 1.0, "amd": 2.0}
"""``getNetOverhead``: per-step proxy cost of multi-node rings (x3 for Simple), by CPU vendor."""

TREE_CORRECTION = (
    (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9, 1.0, 1.0,
     1.0, 1.0, 1.0),
    (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9, .9, .9, 1.0,
     1.0, 1.0),
    (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7, .8, .9, .9,
     .9),
)  # fmt: skip
"""``treeCorrectionFactor[proto][log2(bytes / 64)]``, 64 B .. 1 GiB (``tree_correction``): Tree
all_reduce bandwidth at mid sizes ("Trees are not perfectly sticking to the model for medium
sizes")."""

SPEEDS_INTRA = {
    "pre_hopper": (40.0, 30.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0, 3.0),
    "hopper": (60.0, 50.0, 40.0, 30.0, 24.0, 20.0, 15.0, 12.0, 11.0, 6.0, 3.0),
    "blackwell": (90.0, 80.0, 70.0, 60.0, 50.0, 45.0, 40.0, 30.0, 24.0, 20.0, 19.0, 18.0),
}  # fmt: skip
"""Per-channel speeds (GB/s) the graph search tries on one node (search.cc ``speedArrayIntra``,
``sm90SpeedArrayIntra``, ``sm100SpeedArrayIntra``)."""

SPEEDS_INTER = {
    "pre_hopper": (48.0, 30.0, 28.0, 24.0, 20.0, 18.0, 15.0, 12.0, 10.0, 9.0, 7.0, 6.0, 5.0, 4.0,
                   3.0, 2.4, 1.2, 0.24, 0.12),
    "hopper": (48.0, 45.0, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0, 12.0, 6.0, 3.0, 2.4,
               1.2, 0.24, 0.12),
    "blackwell": (96.0, 86.0, 80.0, 48.0, 45.1, 42.0, 40.0, 30.0, 24.0, 22.0, 20.0, 17.5, 15.0,
                  12.0, 6.0, 3.0, 2.4, 1.2, 0.24, 0.12),
}  # fmt: skip
"""Per-channel speeds (GB/s) the graph search tries across nodes (search.cc ``speedArrayInter``,
``sm90SpeedArrayInter``, ``sm100SpeedArrayInter``)."""

MAX_RING_CHANNELS = 32
"""Most channels of a ring or tree graph (init.cc: ``maxChannels = MAXCHANNELS / 2``, 64 / 2)."""
MAX_DIRECT_ARITY = 7
"""``NCCL_MAX_DIRECT_ARITY``: CollNet algorithms need at most 8 local ranks."""
MAX_NVLS_ARITY = 32
"""``NCCL_MAX_NVLS_ARITY``: NVLS reduce_scatter/all_gather need at most 32 local ranks."""
NVLS_CHANNELS_SM90 = 16
"""``NVLS_NCHANNELS_SM90``: CTAs NVLS runs with on Hopper (transport/nvls.cc)."""
NVLS_CHANNELS_SM100 = {"one_node": 24, "nodes": 32}
"""``NVLS_NCHANNELS_SM100_NVL`` within one NVLink domain, ``NVLS_NCHANNELS_SM100`` across nodes:
Blackwell's NVLS CTAs before ``ncclNvlsTreeSm100Tuning`` (``sim.network.protocols.nvls_tuning``)
retunes a multi-node job."""

NVLS_CHUNK_BYTES = 128 * 1024
"""``NCCL_NVLS_CHUNKSIZE`` default (transport/nvls.cc): the largest NVLS chunk."""
NVLSTREE_MAX_CHUNK_BYTES_4_NODES = 64 * 1024
"""``nvlsTreeMaxChunkSize`` on 4 or more nodes (``ncclNvlsTuning``; the NVLS chunk below)."""
NVLS_CHUNK_STEPS = ((64, 65536), (8, 32768), (2, 16384))
"""NVLS chunk shrinking (enqueue.cc ``calcCollChunking``): below ``k x ops x chunk`` bytes a
chunk above ``c`` becomes ``c`` (ops = channels x heads), in this order."""
NVLSTREE_CHUNK_STEPS = ((32, 262144), (16, 131072), (4, 65536), (1, 32768))
"""NVLSTree chunk shrinking, as ``NVLS_CHUNK_STEPS``."""


def shrunk_chunk(
    size_bytes: float, ops: int, chunk: int, steps: tuple[tuple[int, int], ...]
) -> int:
    """The chunk NCCL moves ``size_bytes`` in: ``chunk`` shrunk by ``steps`` (enqueue.cc)."""
    for times, smaller in steps:
        if size_bytes < times * ops * chunk and chunk > smaller:
            chunk = smaller
    return chunk


THREADS = {"ll": 512, "ll128": 640, "simple": 512}
"""Threads per channel of Ring/Tree (``NCCL_LL_MAX_NTHREADS``, ``NCCL_LL128_MAX_NTHREADS``,
``NCCL_SIMPLE_MAX_NTHREADS``)."""
THREAD_THRESHOLD = {"ll": 8, "ll128": 8, "simple": 64}
"""Bytes per thread before NCCL adds a channel (``NCCL_*_THREAD_THRESHOLD``; Ring/LL x nRanks)."""

BUFFER_BYTES = {"ll": 512 * 1024, "ll128": 120 * 640 * 8 * 8, "simple": 1 << 22}
"""Default per-channel buffer of each protocol: LL 8 lines x 512 threads x 8 steps x 16 B,
LL128 120 B x 640 threads x 8 steps x 8, Simple ``DEFAULT_BUFFSIZE`` 4 MiB."""
NCCL_STEPS = 8
"""``NCCL_STEPS``: slots per buffer; one slot is the pipeline's start-up chunk."""


def node_index(num_nodes: int) -> int:
    """NCCL's ``index2``: 0 for one node, 1 for two, 2 for more."""
    return 0 if num_nodes <= 1 else 1 if num_nodes == 2 else 2


def ll_max_gbps(arch: str, num_nodes: int, cpu_amd: bool, nccl_version: str = "") -> float:
    """``llMaxBw``: by GPU generation on one node, by CPU vendor (Intel row 0, AMD row 1) on more
    (``nccl_version``: that release's one-node Hopper figure, ``tuner_release``).

    An unknown generation has no cap on one node (inf).
    """
    if num_nodes <= 1:
        if arch == "hopper":
            return tuner_release(nccl_version).ll_max_hopper_one_node
        return LL_MAX_GBPS[arch][0] if arch in LL_MAX_GBPS else math.inf
    return LL_MAX_GBPS["ampere" if cpu_amd else "volta"][node_index(num_nodes)]


Row = dict[str, tuple[float, float, float]]


@dataclass(frozen=True, slots=True, kw_only=True)
class TunerRelease:
    """What one NCCL release's tuner does differently from 2.30.7's (``src/graph/tuning.cc`` at
    its tag): its latency tables (``baseLat``, ``hwLat``), its one-node Hopper ``llMaxBw``, and
    the bandwidth rules that changed since 2.18.3. The graph search, the other per-channel
    maxima and the thresholds are 2.30.7's."""

    release: str
    """The first release these rules are from."""
    base: Row
    """``baseLat[algo][proto]``."""
    nvlink: Row
    """``hwLat[NCCL_HW_NVLINK]``."""
    pci: Row
    """``hwLat[NCCL_HW_PCI]``."""
    net: Row
    """``hwLat[NCCL_HW_NET]``."""
    ll_max_hopper_one_node: float
    """``llMaxBws[HOPPER][0]``."""
    ring_ll_quarter: bool = False
    """Ring/LL's busbw is a quarter of the graph's (a third for all_gather, reduce_scatter and
    broadcast on one node) instead of half: up to 2.20."""
    ring_ll128_one_ppn: float = 0.92
    """Ring/LL128's factor with one rank per node (0.7 up to 2.22)."""
    ppn1_tree_net: bool = True
    """With one rank per node every algorithm pays Tree's NET latency (from 2.23: "latencies are
    fully exposed")."""
    ring_all_reduce_2n_net_steps: bool = False
    """Ring all_reduce's latency counts 2 nNodes network steps, not 2 (nNodes - 1): up to 2.22."""
    nvls_ratio_every_op: bool = False
    """NVLS all_gather / reduce_scatter also take the x5/6 algbw ratio: up to 2.22 (from 2.23
    only all_reduce does)."""
    nvls_bandwidth: str = "efficiency"
    """How NVLS and NVLSTree get their bandwidth: ``graph`` (up to 2.28.2: ``min(bwIntra,
    bwInter)``, NVLSTree ``min(bwIntra, bwInter / 2 on > 2 nodes)``, algbw x 5/6 (all_reduce only
    from 2.23: ``nvls_ratio_every_op``); 2.27 gives
    NVLS all_gather and reduce_scatter ``min(bwIntra (ppn-1)/ppn, 0.9 bwInter)``) or
    ``efficiency`` (2.28.3 on: ``nvlsEfficiency``, the per-channel NVLSTree cap, algbw x
    nRanks / nSteps)."""
    nvls_gather_ppn: bool = False
    """2.27's NVLS all_gather / reduce_scatter rule (``nvls_bandwidth`` ``graph`` only)."""
    blackwell_nvlstree_correction: bool = True
    """Blackwell's NVLSTree all_reduce times take ``treeCorrectionFactor`` on x86 hosts: from
    2.29.2."""


def _edit(row: Row, **cells: tuple[float, float, float]) -> Row:
    return {**row, **cells}


_LATEST = TunerRelease(
    release="2.29.2", base=BASE_US, nvlink=NVLINK_US, pci=PCI_US, net=NET_US,
    ll_max_hopper_one_node=LL_MAX_GBPS["hopper"][0],
)  # fmt: skip
_R2_28_9 = replace(_LATEST, release="2.28.9", blackwell_nvlstree_correction=False)
_R2_28_3 = replace(_R2_28_9, release="2.28.3", net=_edit(NET_US, nvlstree=(0.0, 0.0, 14.0)))
_R2_27 = replace(_R2_28_3, release="2.27.3", nvls_bandwidth="graph", nvls_gather_ppn=True)
_R2_23 = replace(_R2_27, release="2.23.4", nvls_gather_ppn=False)
_R2_21 = replace(
    _R2_23,
    release="2.21.5",
    base=_edit(BASE_US, tree=(6.8, 14.0, 0.0)),
    nvlink=_edit(NVLINK_US, tree=(0.6, 1.25, 28.0)),
    pci=_edit(PCI_US, tree=(1.0, 1.9, 28.0)),
    net=_edit(_R2_23.net, tree=(5.0, 8.5, 28.0)),
    ring_ll128_one_ppn=0.7,
    ppn1_tree_net=False,
    ring_all_reduce_2n_net_steps=True,
    nvls_ratio_every_op=True,
)
_R2_19 = replace(
    _R2_21,
    release="2.19.1",
    nvlink=_edit(_R2_21.nvlink, nvls=(0.0, 0.0, 23.0), nvlstree=(0.0, 0.0, 23.0)),
    ll_max_hopper_one_node=LL_MAX_GBPS["ampere"][0],
    ring_ll_quarter=True,
)
_R2_18_3 = replace(
    _R2_19,
    release="2.18.3",
    nvlink=_edit(_R2_19.nvlink, tree=(0.6, 1.25, 4.0)),
    pci=_edit(_R2_19.pci, tree=(1.0, 1.9, 6.0)),
    net=_edit(_R2_19.net, tree=(5.0, 8.5, 14.0), nvlstree=(0.0, 0.0, 19.0)),
)
_R2_18_1 = replace(_R2_18_3, release="2.18.1", nvlink=_R2_19.nvlink, pci=_R2_19.pci, net=_edit(
    _R2_19.net, nvlstree=(0.0, 0.0, 19.0)))  # fmt: skip
RELEASES: tuple[tuple[tuple[int, int, int], TunerRelease], ...] = (
    ((0, 0, 0), _R2_18_1),
    ((2, 18, 3), _R2_18_3),
    ((2, 19, 0), _R2_19),
    ((2, 21, 0), _R2_21),
    ((2, 23, 0), _R2_23),
    ((2, 27, 0), _R2_27),
    ((2, 28, 3), _R2_28_3),
    ((2, 28, 9), _R2_28_9),
    ((2, 29, 2), _LATEST),
)
"""Each release's rules, from the first release that shipped them (NVIDIA/nccl's tags,
``src/graph/tuning.cc``); every release up to the next listed one runs the same:

- up to 2.18.2 (2.18.1's tables: Tree/Simple 28 us per step on every link, 0 base; NVLSTree 19 us
  per network step); releases before 2.18.1 are approximated by them (their Tree/Simple is the
  same; their other base and NVLink LL latencies, network overhead and caps are not carried), and
  2.18's own NVLS / NVLSTree bandwidth rules and its Ring-only all_gather / reduce_scatter are
  not carried either (2.19's are);
- 2.18.3: Tree/Simple 4 / 6 / 14 us per NVLink / PCI / network step;
- 2.19.1: Tree/Simple 28 again; NVLS 23 us per NVLink step (2.18 charged 23 us as a base: the same
  on one node; 2.18's CollNet rows and its per-node NVLSTree formula are not carried);
- 2.21.5: NVLS 25 us; Hopper's one-node LL cap 141 GB/s (87.7, Ampere's, before); Ring/LL at
  half the graph's busbw (a quarter before);
- 2.23.4: Tree/Simple 8.4 us base and 4 / 4 / 14 us per step; Ring/LL128 0.92 with one rank per
  node (0.7 before); one rank per node pays Tree's network latency; Ring all_reduce's latency
  counts 2 (nNodes - 1) network steps (2 nNodes before); NVLS all_gather / reduce_scatter keep
  their busbw (x5/6 before);
- 2.27.3: NVLS all_gather / reduce_scatter bandwidth from the local ranks;
- 2.28.3: NVLS and NVLSTree bandwidth from ``nvlsEfficiency`` and the per-channel caps;
- 2.28.9: NVLSTree 20.9 us per network step (14 before);
- 2.29.2: Blackwell's NVLSTree all_reduce times corrected (``treeCorrectionFactor``) on x86
  hosts."""

DEFAULT_NCCL_VERSION = "2.30.7"
"""The release an empty ``nccl_version`` means (``NCCL_VERSION``)."""


@functools.lru_cache(maxsize=64)
def tuner_release(nccl_version: str = "") -> TunerRelease:
    """The rules of the release ``nccl_version`` names (empty: ``DEFAULT_NCCL_VERSION``; later
    releases than it: its rules)."""
    version = nccl_release(nccl_version or DEFAULT_NCCL_VERSION)
    chosen = RELEASES[0][1]
    for first, tables in RELEASES:
        if version >= first:
            chosen = tables
    return chosen


def per_channel(table: dict[str, tuple[float, float, float]], arch: str, num_nodes: int) -> float:
    """A per-channel cap for ``arch`` and the node count (inf for an unknown generation)."""
    return table[arch][node_index(num_nodes)] if arch in table else math.inf


def channel_cap(channels: int, per_channel_gbps: float) -> float:
    """``nChannels x perChMax...``; inf when either is unknown (no channels, no table row)."""
    if channels <= 0 or not math.isfinite(per_channel_gbps):
        return math.inf
    return channels * per_channel_gbps


def tree_correction(proto: str, size_bytes: float, limit: int = 23) -> float:
    """``treeCorrectionFactor[proto][log2i(bytes >> 6)]`` for ``logSize < limit``, else 1: NCCL
    corrects Tree all_reduce to logSize 22 (64 B .. 512 MiB) and Blackwell's NVLSTree to 23."""
    log_size = int(size_bytes) >> 6
    index = log_size.bit_length() - 1
    if not 0 <= index < limit:
        return 1.0
    return TREE_CORRECTION[PROTOCOLS.index(proto)][index]
