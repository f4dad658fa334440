"""Timeline plot of a simulated step: a few ranks' compute and communication lanes over time.

One representative rank per pipeline stage (at most ``MAX_RANKS``, evenly spaced stages when
there are more) gets a compute lane and a thin lane per communication stream it used (tp, dp,
pp, ...). Forward, backward, weight-gradient, recompute, embedding/head, FSDP copy-out and
optimizer work and each stream's communication have their own colour, named in the legend with
what the stream carries (``LANE_MEANINGS``); time is in milliseconds.

The step is drawn in ``COLUMNS`` time columns, about one pixel each. A lane whose spans are all
wider than a column draws them as bars; a lane with narrower ones (512 recomputes of 1 ms in a
27 s step) draws, in each column, the share of the column each category fills, stacked from the
lane's foot: a column that is 2% recompute is 2% purple, not a painted-over backward. A lane
whose spans add up to less than a column is not drawn, and the legend lists it with its time.
Matplotlib's object API with the Agg canvas is used, so no display and no global pyplot state
are involved.

    png = figure_bytes(timeline_figure(result.spans, ranks=[0, 8], rank_titles=titles), "png")
"""

from __future__ import annotations

import io
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from sim.output.trace import stream_ids
from sim.replay.result import Span

if TYPE_CHECKING:  # matplotlib and numpy load when a figure is drawn, not for every plan
    import numpy as np
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

MAX_RANKS = 8
"""Most ranks drawn; more pipeline stages are sampled evenly (first and last included)."""

COMPUTE_COLORS = {
    "forward": "#4c72b0",
    "backward": "#dd8452",
    "weight grad": "#55a868",
    "recompute": "#8172b3",
    "embedding/head fwd": "#a1c9f4",
    "embedding/head bwd": "#ffb482",
    "copy-out": "#bab0ac",
    "other compute": "#937860",
    "optimizer": "#da8bc3",
    "host": "#8c8c8c",
}
"""Colour per compute category (see ``compute_category``), in legend order."""

COMM_COLORS = {
    "tp": "#c44e52",
    "pp": "#ccb974",
    "dp": "#64b5cd",
    "cp": "#8c564b",
    "hsdp": "#17becf",
}
"""Colour per communication stream; other streams get ``OTHER_COMM_COLOR``."""

OTHER_COMM_COLOR = "#7f7f7f"
"""Colour of communication on streams not in ``COMM_COLORS``."""

LANE_MEANINGS = {
    "tp": "tensor-parallel collectives",
    "sp": "sequence-parallel collectives",
    "cp": "context-parallel K/V exchange",
    "ep": "expert-parallel token all-to-all",
    "etp": "expert tensor-parallel collectives",
    "edp": "expert data-parallel (gradients; FSDP2: parameters too)",
    "tpep": "token exchange over expert-TP x EP",
    "pp": "pipeline sends and receives",
    "dp": "data-parallel gradients and parameter gathers",
    "dpcp": "gradients over DP x CP",
    "dp_shard": "HSDP shard-group collectives",
    "dp_replicate": "HSDP replica all-reduce",
    "hsdp": "HSDP replica all-reduce",
    "embd": "tied-embedding gradient all-reduce (first and last stage)",
    "mp": "gradient-norm all-reduce over TP x PP (Megatron's model-parallel group)",
    "world": "gradient-norm all-reduce over every rank",
    "h2d": "offload copies to the GPU",
    "d2h": "offload copies to the host",
    "nvme": "NVMe swaps of offloaded state",
    "host": "kernel launches and framework loops",
}
"""What each communication lane carries, said in the legend (``mp comm`` is not self-evident)."""

COLUMNS = 1500
"""Time columns of a lane: about one pixel each at the figure's width and 150 dpi."""

_PASS_LABEL = re.compile(r"(?P<kind>Bi|B|W|F)\d+(\.c\d+)?")
"""A pipeline pass label as ``schedules.pipeline.Pass`` writes it: ``F3``, ``Bi3``, ``B3.c1``."""
_PASS_CATEGORY = {"F": "forward", "B": "backward", "Bi": "backward", "W": "weight grad"}
_EMBEDDING_HEAD_UNITS = frozenset({"embed", "head"})
_MAX_LABELLED_SPANS = 600
_MAX_SEAMED_SPANS = 400
_LABEL_MIN_FRACTION = 0.012
_THIN_FRACTION = 0.002
_THIN_OUTLINE_PT = 1.0
_COMPUTE_HEIGHT = 0.8
_COMM_HEIGHT = 0.45


def span_category(span: Span) -> str | None:
    """Legend category of a span, or ``None`` for spans not drawn (waits)."""
    if span.kind == "wait":
        return None
    if span.kind in ("optimizer", "host"):
        return span.kind
    if span.kind in ("collective", "p2p"):
        return f"{span.stream} comm"
    return compute_category(span.name)


def compute_category(name: str) -> str:
    """Legend category of a compute span from its name, as the replay writes it.

    Names are a pass label then the step (``F3 fwd``, ``B3.c1 recompute``, ``W3 wgrad``), with
    an FSDP unit between them (``B3 u5 bwd``, ``F0 embed embed``), or a step of its own
    (``copy-out L3 mb0``). Recompute wins over the pass (it runs inside ``B``); embedding and
    LM-head work is told apart from the layers' forward and backward.

    >>> [compute_category(n) for n in ("B7 recompute", "F0 embed", "B3 head bwd", "W2 wgrad")]
    ['recompute', 'embedding/head fwd', 'embedding/head bwd', 'weight grad']
    """
    words = name.split()
    if "recompute" in words:
        return "recompute"
    if words and words[0] == "copy-out":
        return "copy-out"
    label = _PASS_LABEL.fullmatch(words[0]) if words else None
    if label is None:
        return "other compute"
    kind = _PASS_CATEGORY[label["kind"]]
    if _EMBEDDING_HEAD_UNITS.intersection(words[1:]):
        return "embedding/head fwd" if kind == "forward" else "embedding/head bwd"
    return kind


def category_color(category: str) -> str:
    """Colour of a legend category."""
    if category in COMPUTE_COLORS:
        return COMPUTE_COLORS[category]
    return COMM_COLORS.get(category.removesuffix(" comm"), OTHER_COMM_COLOR)


def representative_ranks(
    spans: Iterable[Span], stage_of: Callable[[int], int], *, max_ranks: int = MAX_RANKS
) -> list[int]:
    """The lowest simulated rank of each pipeline stage, sampled down to ``max_ranks`` stages."""
    first_rank: dict[int, int] = {}
    for rank in sorted({s.rank for s in spans}):
        first_rank.setdefault(stage_of(rank), rank)
    stages = sorted(first_rank)
    if len(stages) > max_ranks > 1:
        picks = sorted({round(i * (len(stages) - 1) / (max_ranks - 1)) for i in range(max_ranks)})
        stages = [stages[i] for i in picks]
    return [first_rank[stage] for stage in stages[:max_ranks]]


def timeline_figure(
    spans: Iterable[Span],
    *,
    ranks: Sequence[int],
    rank_titles: Mapping[int, str] | None = None,
    title: str = "",
) -> Figure:
    """A figure with a compute lane and one lane per communication stream for each rank."""
    by_lane: dict[tuple[int, str], list[Span]] = defaultdict(list)
    wanted = set(ranks)
    for span in spans:
        if span.rank in wanted and span_category(span) is not None:
            by_lane[(span.rank, "compute" if _on_compute_lane(span) else span.stream)].append(span)
    end_ms = max((s.end_s for v in by_lane.values() for s in v), default=0.0) * 1e3
    column_ms = end_ms / COLUMNS
    hidden = _under_a_column(by_lane, column_ms)
    lanes = [lane for lane in _lane_order(by_lane, ranks) if lane not in hidden]
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    fig = Figure(figsize=(14, 1.2 + 0.32 * len(lanes)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    categories: set[str] = set()
    num_compute_spans = sum(len(v) for k, v in by_lane.items() if k[1] == "compute")
    for y, lane in enumerate(lanes):
        compute = lane[1] == "compute"
        if compute and y > 0:
            ax.axhline(y - 0.5, color="0.5", linewidth=0.8)
        if any(0 < s.duration_s * 1e3 < column_ms for s in by_lane[lane]):
            categories |= _draw_shares(ax, y, by_lane[lane], compute=compute, end_ms=end_ms)
        else:
            thin_ms = _THIN_FRACTION * end_ms
            categories |= _draw_lane(ax, y, by_lane[lane], compute=compute, thin_ms=thin_ms)
        if compute and num_compute_spans <= _MAX_LABELLED_SPANS:
            _label_spans(ax, y, by_lane[lane], min_width_ms=_LABEL_MIN_FRACTION * end_ms)
    titles = rank_titles or {}
    ax.set_yticks(range(len(lanes)), [_lane_label(lane, titles) for lane in lanes], fontsize=8)
    ax.set_ylim(len(lanes) - 0.4, -0.6)
    ax.set_xlabel("time (ms)")
    ax.set_xlim(left=0.0)
    ax.grid(axis="x", linewidth=0.3, alpha=0.6)
    ax.set_title(title or "Simulated step timeline", fontsize=10)
    handles = [
        Patch(color=category_color(c), label=legend_label(c)) for c in _legend_order(categories)
    ]
    if hidden:
        handles.append(Patch(color="none", label=_hidden_note(hidden)))
    # Below the plot, so the lanes keep the figure's width (a column a pixel).
    fig.legend(handles=handles, loc="outside lower center", ncols=3, fontsize=8, frameon=False)
    return fig


def legend_label(category: str) -> str:
    """A category as the legend names it: a communication lane with what it carries."""
    stream = category.removesuffix(" comm")
    meaning = LANE_MEANINGS.get(stream) if stream != category else None
    return f"{category}: {meaning}" if meaning else category


def column_shares(
    spans: Iterable[Span], *, end_ms: float, num_columns: int = COLUMNS
) -> dict[str, np.ndarray]:
    """Per category, the share of each of ``num_columns`` equal columns of [0, ``end_ms``]
    that its spans cover (0 to 1; overlapping spans of one category are capped at 1).

    The time a category has covered by t is the sum over its spans of the part before t:
    ``sum(t - start for start < t) - sum(t - end for end < t)``, read at the column edges from
    sorted starts and ends, so a lane of 100k spans costs two sorts.
    """
    import numpy as np

    edges_ms = np.linspace(0.0, end_ms, num_columns + 1)
    by_category: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for span in spans:
        by_category[str(span_category(span))].append((span.start_s * 1e3, span.end_s * 1e3))
    shares = {}
    for category, ranges in by_category.items():
        starts, ends = (np.sort(np.array(side)) for side in zip(*ranges, strict=True))
        covered = _covered_before(edges_ms, starts) - _covered_before(edges_ms, ends)
        width_ms = end_ms / num_columns if end_ms > 0 else 1.0
        shares[category] = np.clip(np.diff(covered) / width_ms, 0.0, 1.0)
    return shares


def _covered_before(edges: np.ndarray, points: np.ndarray) -> np.ndarray:
    """``sum(max(0, edge - p) for p in points)`` at every edge (``points`` sorted)."""
    import numpy as np

    count = np.searchsorted(points, edges, side="left")
    prefix = np.concatenate(([0.0], np.cumsum(points)))
    return count * edges - prefix[count]


def _draw_shares(ax: Axes, y: int, spans: list[Span], *, compute: bool, end_ms: float) -> set[str]:
    """Draw a crowded lane column by column: each category's share of the column, stacked
    from the lane's foot in legend order (shares summing past 1 are scaled down to fit)."""
    import numpy as np

    height = _COMPUTE_HEIGHT if compute else _COMM_HEIGHT
    shares = column_shares(spans, end_ms=end_ms)
    order = _legend_order(set(shares))
    total = np.maximum(sum(shares.values()), 1.0)
    edges_ms = np.linspace(0.0, end_ms, COLUMNS + 1)
    foot = y + height / 2  # the y axis points down: the foot of a lane is its larger y
    below = np.zeros(COLUMNS)
    for category in order:
        share = shares[category] / total
        low, high = foot - height * below, foot - height * (below + share)
        ax.fill_between(
            edges_ms, np.append(low, low[-1]), np.append(high, high[-1]), step="post",
            color=category_color(category), linewidth=0, zorder=2.0,
        )  # fmt: skip
        below = below + share
    return set(shares)


def _under_a_column(
    by_lane: Mapping[tuple[int, str], list[Span]], column_ms: float
) -> dict[tuple[int, str], float]:
    """Communication lanes whose spans add up to less than one column: lane -> their ms."""
    hidden = {}
    for lane, spans in by_lane.items():
        busy_ms = sum(s.duration_s for s in spans) * 1e3
        if lane[1] != "compute" and busy_ms < column_ms:
            hidden[lane] = busy_ms
    return hidden


def _hidden_note(hidden: Mapping[tuple[int, str], float]) -> str:
    """The legend's line for the lanes left out, each stream once with its longest time."""
    longest: dict[str, float] = {}
    for (_, stream), busy_ms in hidden.items():
        longest[stream] = max(longest.get(stream, 0.0), busy_ms)
    named = ", ".join(f"{stream} comm ({ms:.2g} ms)" for stream, ms in longest.items())
    return f"not drawn, under a pixel: {named}"


def figure_bytes(fig: Figure, image_format: str = "png") -> bytes:
    """The rendered figure (png, svg or pdf) as bytes, so callers can write it atomically."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format=image_format, dpi=150)
    return buffer.getvalue()


def _on_compute_lane(span: Span) -> bool:
    return span.kind not in ("collective", "p2p", "host")


def _lane_order(
    by_lane: Mapping[tuple[int, str], list[Span]], ranks: Sequence[int]
) -> list[tuple[int, str]]:
    lanes = []
    for rank in ranks:
        streams = list(stream_ids(s for r, s in by_lane if r == rank and s != "compute"))
        lanes += [(rank, "compute"), *((rank, s) for s in streams)]
    return lanes


def _draw_lane(ax: Axes, y: int, spans: list[Span], *, compute: bool, thin_ms: float) -> set[str]:
    """Draw one lane's spans, one ``broken_barh`` per category; returns the categories drawn.

    Spans narrower than ``thin_ms`` (a selective recompute, an embedding backward) get an
    outline of their own colour, about two pixels wide, so they stay visible at full-step scale.
    """
    height = _COMPUTE_HEIGHT if compute else _COMM_HEIGHT
    # White seams separate adjacent compute passes; thin bars (comm, crowded lanes) would vanish.
    seams = compute and len(spans) <= _MAX_SEAMED_SPANS
    bars: dict[tuple[str, bool], list[tuple[float, float]]] = defaultdict(list)
    for span in sorted(spans, key=lambda s: (s.start_s, s.end_s, s.name)):
        width_ms = span.duration_s * 1e3
        thin = compute and 0 < width_ms < thin_ms  # zero-length markers stay invisible
        bars[(str(span_category(span)), thin)].append((span.start_s * 1e3, width_ms))
    for (category, thin), ranges in sorted(bars.items()):
        color = category_color(category)
        ax.broken_barh(
            ranges,
            (y - height / 2, height),
            facecolors=color,
            edgecolor=color if thin else ("white" if seams else "none"),
            linewidth=_THIN_OUTLINE_PT if thin else 0.3,
            zorder=2.1 if thin else 2.0,
        )
    return {category for category, _ in bars}


def _label_spans(ax: Axes, y: int, spans: list[Span], *, min_width_ms: float) -> None:
    """Write the pass label (``F3`` of ``F3.c0`` or ``F3 fwd``) inside bars wide enough for it."""
    for span in spans:
        width_ms = span.duration_s * 1e3
        text = re.split(r"[.\s]", span.name, maxsplit=1)[0]
        if width_ms >= min_width_ms * max(1.0, len(text) / 3):
            x_ms = span.start_s * 1e3 + width_ms / 2
            ax.text(
                x_ms, y, text, ha="center", va="center", fontsize=6, color="white", clip_on=True
            )


def _lane_label(lane: tuple[int, str], titles: Mapping[int, str]) -> str:
    rank, stream = lane
    if stream == "compute":
        return titles.get(rank, f"rank {rank}")
    return "host thread" if stream == "host" else f"{stream} comm"


def _legend_order(categories: set[str]) -> list[str]:
    compute = [c for c in COMPUTE_COLORS if c in categories]
    comm = stream_ids(c.removesuffix(" comm") for c in categories.difference(compute))
    return compute + [f"{stream} comm" for stream in comm]
