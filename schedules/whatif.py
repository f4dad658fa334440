"""What-ifs of a plan: a slow GPU or server, a NIC at a fraction of its rate or down, a second job.

A plan's optional ``whatif:`` section (or ``commsim plan --whatif KEY=VALUE``, repeatable) asks
how the step changes when the cluster is not perfect::

    whatif:
      slow_gpus:  [{rank: 5, slowdown: 0.2}]      # rank 5's kernels take 1.2x as long
      slow_nodes: [{node: 3, slowdown: 0.1}]      # every GPU of server 3 (0-based) 1.1x
      nics:       [{rank: 17, fraction: 0.5}]     # the NIC rank 17 sends through at half rate;
                                                  # fraction 0: down (its GPUs use a peer's NIC)
      second_job: [{nodes: [0, 1], share: 0.3}]   # another job's traffic takes 30% of these
                                                  # servers' NIC bandwidth, both directions
      # or in bursts: 30% of every 200 ms (its all-reduce each step), the first from 50 ms
      # second_job: [{nodes: [0, 1], share: 0.5, period_ms: 200, busy: 0.3, offset_ms: 50}]
      # or as its own collectives: a 512 MiB all-reduce over servers 0-3 every 200 ms, which
      # shares their NICs fairly with this job while it runs (share and busy follow from it)
      # second_job: [{nodes: [0, 1, 2, 3], op: all_reduce, size_mib: 512, period_ms: 200}]
      links: [{between: [leaf0, spine7], fraction: 0.5}]  # one switch-to-switch link at half
                                                  # its rate, both directions (0: down, traffic
                                                  # re-routed)

      moe_imbalance: 1.5                          # the busiest expert of every MoE layer
                                                  # gets 1.5x the mean tokens
      # or per layer (0-based model order; the other MoE layers keep model.moe_imbalance):
      # moe_imbalance: {3: 2.0, 7: 1.5}

On the command line: ``--whatif slow_gpu=5:0.2``, ``slow_node=3:0.1``, ``nic=17:0.5``,
``nic=17:down``, ``second_job=0-1:0.3`` (nodes as ``a-b`` or ``a,b,c``; in bursts
``second_job=0-1:0.5:200:0.3[:50]``: share, period in ms, busy fraction, offset in ms; as
collectives ``second_job=0-3:all_reduce:512:200[:50]``: op, size in MiB, period in ms, offset in
ms),
``link=leaf0-spine7:0.5``, ``link=leaf0-spine7:down``, ``moe_imbalance=1.5``
or per layer ``moe_imbalance=3:2.0,7:1.5``.
How each is simulated: ``sim.replay.whatif``. Values are checked here; ranks and nodes against
the cluster there.

    whatif = parse_whatif({"slow_gpus": [{"rank": 5, "slowdown": 0.2}]})
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from fileio.strict import did_you_mean, shorten

MAX_SLOWDOWN = 100.0
"""Largest slowdown accepted (101x the kernel time): beyond it the what-if is a dead GPU."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowGpu:
    """One GPU whose kernels run ``1 + slowdown`` times as long (thermal, power, a bad part)."""

    rank: int
    slowdown: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowNode:
    """Every GPU of one server ``1 + slowdown`` times as slow."""

    node: int
    slowdown: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Nic:
    """The NIC ``rank`` sends through, at ``fraction`` of its rate (0: down)."""

    rank: int
    fraction: float


@dataclass(frozen=True, slots=True, kw_only=True)
class SecondJob:
    """Another job whose traffic takes ``share`` of the NIC bandwidth of ``nodes``: the whole
    step, or in bursts of ``busy`` of every ``period_s`` from ``offset_s`` (a data-parallel job's
    gradient traffic once per step of its own)."""

    nodes: tuple[int, ...]
    share: float
    period_s: float | None = None
    """Its traffic repeats every ``period_s`` (None: steady)."""
    busy: float = 1.0
    """Fraction of each period it holds the NICs (its first burst starts at ``offset_s``)."""
    offset_s: float = 0.0
    """Start of its first burst, from the start of the step."""
    op: str | None = None
    """The collective the job runs once every ``period_s`` over all GPUs of ``nodes`` (None:
    ``share`` and ``busy`` given). Its ``share`` is then ``COLLECTIVE_JOB_SHARE`` and its
    ``busy`` follows from the collective's time (``sim.replay.whatif.collective_jobs``)."""
    size_bytes: float = 0.0
    """Bytes of each of its collectives (with ``op``)."""
    collective_s: float | None = None
    """One of its collectives alone on the network, once priced (with ``op``)."""
    flow_by_flow: bool = False
    """Under the flow model: its collectives' flows share the links with this job's one by one
    (``sim.replay.flowing_jobs.start_flowing_jobs``) instead of a share and bursts."""

    @property
    def bursty(self) -> bool:
        """Whether its traffic comes and goes within the step."""
        return self.period_s is not None and self.busy < 1.0

    def on_at(self, time_s: float) -> bool:
        """Whether it holds the NICs at ``time_s``."""
        if not self.bursty:
            return True
        assert self.period_s is not None
        into = (time_s - self.offset_s) % self.period_s
        return into < self.busy * self.period_s

    def next_change_s(self, time_s: float) -> float:
        """The first time after ``time_s`` at which it starts or stops (inf: steady)."""
        if not self.bursty:
            return math.inf
        assert self.period_s is not None
        start = self.offset_s + math.floor((time_s - self.offset_s) / self.period_s) * self.period_s
        for edge in (start, start + self.busy * self.period_s, start + self.period_s):
            if edge > time_s:
                return edge
        return start + self.period_s + self.busy * self.period_s


@dataclass(frozen=True, slots=True, kw_only=True)
class SwitchLink:
    """The link between two fabric switches (named leaf0, spine7, pod1/agg3, core2.5), at
    ``fraction`` of its rate both ways (0: down)."""

    between: tuple[str, str]
    fraction: float


@dataclass(frozen=True, slots=True, kw_only=True)
class WhatIf:
    """Everything a plan asks to change; empty: the cluster as built."""

    slow_gpus: tuple[SlowGpu, ...] = ()
    slow_nodes: tuple[SlowNode, ...] = ()
    nics: tuple[Nic, ...] = ()
    second_job: tuple[SecondJob, ...] = ()
    links: tuple[SwitchLink, ...] = ()
    moe_imbalance: float | None = None
    """The busiest expert's tokens over the mean, in every MoE layer (replaces the model's)."""
    moe_layer_imbalance: tuple[tuple[int, float], ...] = ()
    """(layer, factor) pairs: the busiest expert's tokens over the mean in those MoE layers
    (0-based, model order); the other MoE layers keep the model's. Exclusive with
    ``moe_imbalance``; a ``--whatif moe_imbalance=...`` flag replaces either."""

    def __post_init__(self) -> None:
        seen: set[frozenset[str]] = set()
        for link in self.links:
            pair = frozenset(link.between)
            if pair in seen:
                a, b = link.between
                raise ValueError(f"whatif link {a}-{b} given twice")
            seen.add(pair)
        if self.moe_imbalance is not None and self.moe_layer_imbalance:
            raise ValueError(
                "whatif moe_imbalance: give one factor for every MoE layer or a mapping of "
                "layer: factor, not both"
            )

    def __bool__(self) -> bool:
        return bool(
            self.slow_gpus or self.slow_nodes or self.nics or self.second_job or self.links
            or self.moe_imbalance is not None or self.moe_layer_imbalance
        )  # fmt: skip

    def describe(self) -> list[str]:
        """One line per change, as the report prints it."""
        lines = [f"GPU rank {g.rank} {g.slowdown:.0%} slower" for g in self.slow_gpus]
        lines += [f"server {n.node} {n.slowdown:.0%} slower" for n in self.slow_nodes]
        lines += [
            f"NIC of rank {n.rank} down (its GPUs send through a peer's NIC)"
            if n.fraction == 0
            else f"NIC of rank {n.rank} at {n.fraction:.0%} of its rate"
            for n in self.nics
        ]
        lines += [
            _collective_job_text(j)
            if j.op is not None
            else f"a second job takes {j.share:.0%} of the NICs of server(s) {_ranges(j.nodes)}"
            + _burst_text(j)
            for j in self.second_job
        ]
        lines += [
            f"link {a}-{b} down (traffic re-routed)"
            if link.fraction == 0
            else f"link {a}-{b} at {link.fraction:.0%} of its rate"
            for link in self.links
            for a, b in (link.between,)
        ]
        if self.moe_imbalance is not None:
            lines.append(
                f"the busiest expert of every MoE layer gets {self.moe_imbalance:g}x the mean "
                "tokens"
            )
        lines += [
            f"the busiest expert of MoE layer {layer} gets {factor:g}x the mean tokens"
            for layer, factor in self.moe_layer_imbalance
        ]
        return lines

    def to_dict(self) -> dict[str, Any]:
        """The section as ``parse_whatif`` reads it back."""
        out: dict[str, Any] = {}
        if self.slow_gpus:
            out["slow_gpus"] = [{"rank": g.rank, "slowdown": g.slowdown} for g in self.slow_gpus]
        if self.slow_nodes:
            out["slow_nodes"] = [{"node": n.node, "slowdown": n.slowdown} for n in self.slow_nodes]
        if self.nics:
            out["nics"] = [{"rank": n.rank, "fraction": n.fraction} for n in self.nics]
        if self.second_job:
            out["second_job"] = [_job_dict(j) for j in self.second_job]
        if self.links:
            out["links"] = [
                {"between": list(link.between), "fraction": link.fraction} for link in self.links
            ]
        if self.moe_imbalance is not None:
            out["moe_imbalance"] = self.moe_imbalance
        elif self.moe_layer_imbalance:
            out["moe_imbalance"] = dict(self.moe_layer_imbalance)
        return out


def _burst_text(job: SecondJob) -> str:
    if not job.bursty:
        return ""
    assert job.period_s is not None
    return f", {job.busy:.0%} of every {job.period_s * 1e3:g} ms" + (
        f" from {job.offset_s * 1e3:g} ms" if job.offset_s else ""
    )


def _collective_job_text(job: SecondJob) -> str:
    assert job.period_s is not None
    text = (
        f"a second job runs {job.op} of {_size_text(job.size_bytes)} over server(s) "
        f"{_ranges(job.nodes)} every {job.period_s * 1e3:g} ms"
        + (f" from {job.offset_s * 1e3:g} ms" if job.offset_s else "")
    )
    if job.flow_by_flow:
        alone = f" ({job.collective_s * 1e3:.3g} ms alone)" if job.collective_s else ""
        return text + f"{alone}: its flows share the links with this job's, flow by flow"
    if job.collective_s is None:
        return text + f", at {job.share:.0%} of their NICs while it runs"
    return text + (
        f" ({job.collective_s * 1e3:.3g} ms alone): {job.share:.0%} of their NICs for "
        f"{job.busy:.0%} of the time"
    )


def _size_text(size_bytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size_bytes >= scale:
            return f"{size_bytes / scale:g} {unit}"
    return f"{size_bytes:g} B"


def _job_dict(job: SecondJob) -> dict[str, Any]:
    if job.op is not None:
        assert job.period_s is not None
        entry: dict[str, Any] = {
            "nodes": list(job.nodes),
            "op": job.op,
            "size_mib": job.size_bytes / MIB,
            "period_ms": job.period_s * 1e3,
        }
        if job.offset_s:
            entry["offset_ms"] = job.offset_s * 1e3
        return entry
    out: dict[str, Any] = {"nodes": list(job.nodes), "share": job.share}
    if job.period_s is not None:
        out["period_ms"] = job.period_s * 1e3
        out["busy"] = job.busy
        if job.offset_s:
            out["offset_ms"] = job.offset_s * 1e3
    return out


_ENTRY_KEYS = {
    "slow_gpus": ("rank", "slowdown"),
    "slow_nodes": ("node", "slowdown"),
    "nics": ("rank", "fraction"),
    "second_job": ("nodes", "share"),
    "links": ("between", "fraction"),
}


def parse_whatif(raw: Any) -> WhatIf:
    """The ``whatif:`` section; ValueError naming the key and value of the first problem."""
    if raw is None:
        return WhatIf()
    if not isinstance(raw, Mapping):
        raise ValueError(f"plan section 'whatif' must be a mapping, got {shorten(raw)}")
    found: dict[str, Any] = {}
    for key, entries in raw.items():
        if key == "moe_imbalance":
            if isinstance(entries, Mapping):
                found["moe_layer_imbalance"] = _layer_imbalance("whatif.moe_imbalance", entries)
            else:
                found[key] = _imbalance("whatif.moe_imbalance", entries)
            continue
        if key not in _ENTRY_KEYS:
            raise ValueError(
                f"unknown key {shorten('whatif.' + str(key))} in plan"
                f"{did_you_mean(str(key), (*_ENTRY_KEYS, 'moe_imbalance'))}; "
                f"valid keys: {', '.join(_ENTRY_KEYS)}, moe_imbalance"
            )
        if not isinstance(entries, list):
            raise ValueError(f"whatif.{key} must be a list of mappings, got {shorten(entries)}")
        found[key] = tuple(_entry(f"whatif.{key}[{i}]", key, e) for i, e in enumerate(entries))
    return WhatIf(**found)


def _imbalance(where: str, value: Any) -> float:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value < 1.0:
        raise ValueError(f"{where} must be a number >= 1 (1: balanced), got {shorten(value)}")
    return float(value)


def _layer_imbalance(where: str, raw: Mapping[Any, Any]) -> tuple[tuple[int, float], ...]:
    """{layer: factor} as sorted (layer, factor) pairs; ValueError naming the bad entry."""
    if not raw:
        raise ValueError(f"{where} must be a number or a non-empty mapping of layer: factor")
    pairs = []
    for layer, factor in raw.items():
        digits = isinstance(layer, str) and layer.isdigit()  # JSON keys are strings
        index = _index(where, "layer", int(layer) if digits else layer)
        pairs.append((index, _imbalance(f"{where}[{index}]", factor)))
    return tuple(sorted(pairs))


_OPTIONAL_KEYS = {"second_job": ("period_ms", "busy", "offset_ms")}
"""Keys an entry may leave out."""
_COLLECTIVE_JOB_KEYS = ("nodes", "op", "size_mib", "period_ms")
"""A second job given as its collectives (``offset_ms`` optional)."""
COLLECTIVE_JOB_OPS = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "broadcast",
    "reduce",
)
"""The collectives a second job may run over its servers' GPUs (nccl-tests' names, such as
``allreduce``, are read as these): ``vocab.collectives.OPS`` but the point-to-point one, spelled
out because ``schedules`` imports nothing from ``vocab`` (a test keeps the two alike)."""
MIB = 1 << 20
MAX_COLLECTIVE_JOB_MIB = float(1 << 30)
"""Largest collective a second job may run (1 PiB: far beyond any GPU's memory)."""
COLLECTIVE_JOB_SHARE = 0.5
"""The part of a NIC a second job's collective takes while it runs: NCCL's flows of two jobs
through one NIC share it fairly (max-min), so each gets half; the job's collective then takes
``1 / COLLECTIVE_JOB_SHARE`` times as long as alone (``sim.replay.whatif.collective_jobs``)."""


def _entry(where: str, key: str, raw: Any) -> Any:
    fields: tuple[str, ...] = _ENTRY_KEYS[key]
    if key == "second_job" and isinstance(raw, Mapping) and "op" in raw:
        fields = _COLLECTIVE_JOB_KEYS
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where} must be a mapping with keys {', '.join(fields)}")
    optional = ("offset_ms",) if fields is _COLLECTIVE_JOB_KEYS else _OPTIONAL_KEYS.get(key, ())
    allowed = (*fields, *optional)
    unknown = [k for k in raw if k not in allowed]
    missing = [k for k in fields if k not in raw]
    if unknown or missing:
        what = f"unknown key {shorten(unknown[0])}" if unknown else f"missing key {missing[0]}"
        raise ValueError(f"{where}: {what}; keys: {', '.join(allowed)}")
    if key == "slow_gpus":
        return SlowGpu(rank=_index(where, "rank", raw["rank"]), slowdown=_slowdown(where, raw))
    if key == "slow_nodes":
        return SlowNode(node=_index(where, "node", raw["node"]), slowdown=_slowdown(where, raw))
    if key == "nics":
        fraction = _number(where, "fraction", raw["fraction"])
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"{where}.fraction must be in [0, 1] (0: down), got {fraction:g}")
        return Nic(rank=_index(where, "rank", raw["rank"]), fraction=fraction)
    if key == "links":
        fraction = _number(where, "fraction", raw["fraction"])
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"{where}.fraction must be in [0, 1] (0: down), got {fraction:g}")
        ends = raw["between"]
        if (
            not isinstance(ends, list | tuple)
            or len(ends) != 2
            or not all(isinstance(e, str) and e for e in ends)
            or ends[0] == ends[1]
        ):
            raise ValueError(
                f"{where}.between must name two different switches (e.g. [leaf0, spine7]), "
                f"got {shorten(ends)}"
            )
        return SwitchLink(between=(ends[0], ends[1]), fraction=fraction)
    nodes = raw["nodes"]
    if not isinstance(nodes, list) or not nodes:
        raise ValueError(f"{where}.nodes must be a non-empty list of server indices")
    indices = tuple(sorted({_index(where, "nodes", n) for n in nodes}))
    if fields is _COLLECTIVE_JOB_KEYS:
        return _collective_job(where, indices, raw)
    share = _number(where, "share", raw["share"])
    if not 0.0 < share < 1.0:
        raise ValueError(f"{where}.share must be in (0, 1), got {share:g}")
    return SecondJob(nodes=indices, share=share, **_bursts(where, raw))


def _collective_job(where: str, nodes: tuple[int, ...], raw: Mapping[str, Any]) -> SecondJob:
    """A second job given as ``op`` of ``size`` over ``nodes`` every ``period_ms``."""
    names = {name.replace("_", ""): name for name in COLLECTIVE_JOB_OPS}
    given = raw["op"]
    op = names.get(given.strip().lower().replace("_", "")) if isinstance(given, str) else None
    if op is None:
        raise ValueError(
            f"{where}.op must be a collective over the servers' GPUs "
            f"({', '.join(COLLECTIVE_JOB_OPS)}), got {shorten(given)}"
        )
    if len(nodes) < 2:
        raise ValueError(
            f"{where}: a collective over server {nodes[0]} alone never leaves it (no NIC); "
            "give two servers or more"
        )
    size_mib = _number(where, "size_mib", raw["size_mib"])
    if not 0 < size_mib <= MAX_COLLECTIVE_JOB_MIB:
        raise ValueError(
            f"{where}.size_mib must be in (0, {MAX_COLLECTIVE_JOB_MIB:g}] (1 PiB), got {size_mib:g}"
        )
    bursts = _bursts(where, {k: raw[k] for k in ("period_ms", "offset_ms") if k in raw})
    return SecondJob(
        nodes=nodes, share=COLLECTIVE_JOB_SHARE, op=op, size_bytes=size_mib * MIB, **bursts
    )


MIN_BURST_PERIOD_MS = 0.001
"""Shortest burst period accepted (1 us: far below any collective, far above the clock's
grain over a step)."""


def _bursts(where: str, raw: Mapping[str, Any]) -> dict[str, Any]:
    """A second job's ``period_ms``, ``busy`` and ``offset_ms`` as ``SecondJob`` fields."""
    if "period_ms" not in raw:
        given = [k for k in ("busy", "offset_ms") if k in raw]
        if given:
            raise ValueError(f"{where}.{given[0]} needs period_ms (the bursts' period)")
        return {}
    period = _number(where, "period_ms", raw["period_ms"])
    if period < MIN_BURST_PERIOD_MS:
        raise ValueError(f"{where}.period_ms must be >= {MIN_BURST_PERIOD_MS:g}, got {period:g}")
    busy = _number(where, "busy", raw["busy"]) if "busy" in raw else 1.0
    if not 0.0 < busy <= 1.0:
        raise ValueError(f"{where}.busy must be in (0, 1] (1: the whole step), got {busy:g}")
    offset = _number(where, "offset_ms", raw["offset_ms"]) if "offset_ms" in raw else 0.0
    if not 0.0 <= offset < period:
        raise ValueError(f"{where}.offset_ms must be in [0, period_ms), got {offset:g}")
    return {"period_s": period / 1e3, "busy": busy, "offset_s": offset / 1e3}


def _index(where: str, name: str, value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{where}.{name} must be an integer >= 0, got {shorten(value)}")
    return value


def _number(where: str, name: str, value: Any) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
        raise ValueError(f"{where}.{name} must be a finite number, got {shorten(value)}")
    return float(value)


def _slowdown(where: str, raw: Mapping[str, Any]) -> float:
    slowdown = _number(where, "slowdown", raw["slowdown"])
    if not 0.0 < slowdown <= MAX_SLOWDOWN:
        raise ValueError(
            f"{where}.slowdown must be in (0, {MAX_SLOWDOWN:g}] (0.2: 20% slower), got {slowdown:g}"
        )
    return slowdown


_FLAGS = {
    "slow_gpu": "slow_gpus",
    "slow_node": "slow_nodes",
    "nic": "nics",
    "second_job": "second_job",
    "link": "links",
    "moe_imbalance": "moe_imbalance",
}


def parse_flags(texts: Iterable[str], base: WhatIf | None = None) -> WhatIf:
    """``--whatif KEY=VALUE`` flags added to ``base`` (the plan's section)."""
    whatif = base or WhatIf()
    for text in texts:
        key, sep, value = text.partition("=")
        key = key.strip()
        if not sep or key not in _FLAGS:
            raise ValueError(
                f"--whatif {shorten(text)}: expected KEY=VALUE with KEY one of "
                f"{', '.join(_FLAGS)}{did_you_mean(key, _FLAGS)} (e.g. slow_gpu=5:0.2)"
            )
        if key == "moe_imbalance":
            where = f"--whatif {shorten(text)}"
            if ":" in value:
                layers: dict[Any, Any] = {}
                for item in value.split(","):
                    layer, _, factor = item.partition(":")
                    try:
                        index, share = int(layer), float(factor)
                    except ValueError:
                        raise ValueError(
                            f"{where}: expected moe_imbalance=LAYER:FACTOR[,LAYER:FACTOR...] "
                            f"(e.g. 3:2.0,7:1.5), got {item!r}"
                        ) from None
                    if index in layers:
                        raise ValueError(f"{where}: layer {index} given twice")
                    layers[index] = share
                pairs = _layer_imbalance(where, layers)
                whatif = replace(whatif, moe_imbalance=None, moe_layer_imbalance=pairs)
                continue
            try:
                number: Any = float(value)
            except ValueError:
                number = value
            whatif = replace(
                whatif, moe_imbalance=_imbalance(where, number), moe_layer_imbalance=()
            )
            continue
        target, _, amount = value.partition(":")
        if not target or not amount:
            raise ValueError(f"--whatif {shorten(text)}: expected {key}=WHO:AMOUNT")
        where = f"--whatif {shorten(text)}"
        section = _FLAGS[key]
        try:
            if key == "second_job" and amount.split(":")[0].strip()[:1].isalpha():
                raw: dict[str, Any] = {"nodes": _nodes(target), **_collective_flag(where, amount)}
            elif key == "second_job":
                raw = {"nodes": _nodes(target), **_burst_flag(where, amount)}
            elif key == "link":
                fraction = 0.0 if amount.strip() == "down" else float(amount)
                first, dash, second = target.partition("-")
                raw = {
                    "between": [first.strip(), second.strip()] if dash else [target],
                    "fraction": fraction,
                }
            elif key == "nic":
                fraction = 0.0 if amount.strip() == "down" else float(amount)
                raw = {"rank": int(target), "fraction": fraction}
            else:
                name = "rank" if key == "slow_gpu" else "node"
                raw = {name: int(target), "slowdown": float(amount)}
        except ValueError as error:
            if str(error).startswith("servers "):
                raise ValueError(f"{where}: {error}") from None
            if key == "link":
                raise ValueError(
                    f"{where}: expected link=SWITCH-SWITCH:FRACTION or link=SWITCH-SWITCH:down, "
                    f"got the fraction {amount!r}"
                ) from None
            if key == "second_job" and target:
                raise ValueError(
                    f"{where}: expected second_job=NODES:SHARE, "
                    f"NODES:SHARE:PERIOD_MS:BUSY[:OFFSET_MS] (e.g. 0-3:0.5:200:0.3) or "
                    f"NODES:OP:SIZE_MIB:PERIOD_MS[:OFFSET_MS] (e.g. 0-3:all_reduce:512:200), got "
                    f"{amount!r} after the servers"
                ) from None
            if key == "nic":
                raise ValueError(
                    f"{where}: expected nic=RANK:FRACTION or nic=RANK:down (e.g. nic=17:0.5), "
                    f"got {target!r} and {amount!r}"
                ) from None
            raise ValueError(f"{where}: {target!r} and {amount!r} must be numbers") from None
        entries: tuple[Any, ...] = (*getattr(whatif, section), _entry(where, section, raw))
        whatif = replace(whatif, **{section: entries})  # type: ignore[arg-type]
    return whatif


def _burst_flag(where: str, amount: str) -> dict[str, Any]:
    """``SHARE[:PERIOD_MS:BUSY[:OFFSET_MS]]`` as the entry's keys."""
    parts = amount.split(":")
    if len(parts) not in (1, 3, 4):
        raise ValueError(f"{where}: {len(parts)} numbers")
    values = [float(p) for p in parts]
    keys = ("share", "period_ms", "busy", "offset_ms")
    return dict(zip(keys, values, strict=False))


def _collective_flag(where: str, amount: str) -> dict[str, Any]:
    """``OP:SIZE_MIB:PERIOD_MS[:OFFSET_MS]`` as the entry's keys."""
    parts = [p.strip() for p in amount.split(":")]
    if len(parts) not in (3, 4):
        raise ValueError(f"{where}: {len(parts)} fields")
    raw: dict[str, Any] = {
        "op": parts[0],
        "size_mib": float(parts[1]),
        "period_ms": float(parts[2]),
    }
    if len(parts) == 4:
        raw["offset_ms"] = float(parts[3])
    return raw


def _ranges(values: tuple[int, ...]) -> str:
    """``0-3, 7`` for (0, 1, 2, 3, 7)."""
    runs: list[list[int]] = []
    for v in sorted(values):
        if runs and v == runs[-1][1] + 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


MAX_SERVERS = 1 << 16
"""Most servers a ``second_job`` range may name (more than any cluster this project builds)."""


def _nodes(text: str) -> list[int]:
    """``0-3`` or ``0,2,5``; ValueError for a reversed or oversized range."""
    nodes: list[int] = []
    for part in text.split(","):
        low, dash, high = part.partition("-")
        if not dash:
            nodes.append(int(low))
            continue
        first, last = int(low), int(high)
        if last < first or last - first >= MAX_SERVERS:
            raise ValueError(f"servers {part!r}: give FIRST-LAST with FIRST <= LAST, at most "
                             f"{MAX_SERVERS:,} servers")  # fmt: skip
        nodes += range(first, last + 1)
    return nodes
