"""The timeline plot: ranks chosen per pipeline stage, colours per category, a real PNG."""

from __future__ import annotations

import io

import matplotlib.image
import numpy as np

from sim.output.timeline import (
    COMPUTE_COLORS,
    category_color,
    compute_category,
    figure_bytes,
    representative_ranks,
    span_category,
    timeline_figure,
)
from sim.replay.result import Span


def _pipeline_spans(num_stages: int = 2, num_microbatches: int = 3) -> list[Span]:
    """GPipe-like spans with unit forward (1 ms), 2 ms backward, a TP collective and a PP send."""
    spans = []
    for stage in range(num_stages):
        rank = stage * 4
        for mb in range(num_microbatches):
            f0 = (stage + mb) * 1e-3
            spans.append(_span(rank, "compute", f"F{mb}.c0", "compute", f0, f0 + 1e-3))
            spans.append(_span(rank, "tp", f"AR F{mb}", "collective", f0 + 8e-4, f0 + 1e-3))
            b0 = (num_stages + num_microbatches + 2 * mb + (num_stages - stage)) * 1e-3
            spans.append(_span(rank, "compute", f"B{mb}.c0", "compute", b0, b0 + 2e-3))
            spans.append(_span(rank, "pp", f"send F{mb}", "p2p", f0 + 1e-3, f0 + 1.1e-3))
        spans.append(_span(rank, "dp", "AR grads", "collective", 0.015, 0.017))
        spans.append(_span(rank, "compute", "optimizer", "optimizer", 0.017, 0.018))
    return spans


def _span(rank: int, stream: str, name: str, kind: str, start_s: float, end_s: float) -> Span:
    return Span(rank=rank, stream=stream, name=name, kind=kind, start_s=start_s, end_s=end_s)


def test_span_categories() -> None:
    def category(name: str, kind: str = "compute", stream: str = "compute") -> str | None:
        return span_category(_span(0, stream, name, kind, 0.0, 1.0))

    assert category("F3.c0") == "forward"
    assert category("B3.c1") == "backward"
    assert category("Bi3.c0") == "backward"
    assert category("W3.c0") == "weight grad"
    assert category("embedding") == "other compute"
    assert category("params gathered", kind="optimizer") == "optimizer"
    assert category("step", kind="optimizer") == "optimizer"
    assert category("AG(unit 5)", kind="collective", stream="dp") == "dp comm"
    assert category("wait tp", kind="wait") is None
    assert category_color("forward") == COMPUTE_COLORS["forward"]
    assert category_color("tp comm") != category_color("dp comm")


# Compute span names the replay writes (schedules/actions.py ProgramBuilder.run_steps: the pass
# label, the FSDP unit if any, then the step; schedules/fsdp2_program.py copy-out), each with the
# category it must be drawn as.
REPLAY_COMPUTE_NAMES = {
    "F3 fwd": "forward",
    "F3.c1 fwd": "forward",
    "F0 u5 fwd": "forward",
    "F0 L5 fwd": "forward",
    "B7 recompute": "recompute",
    "B7.c1 recompute": "recompute",
    "B0 u3 recompute": "recompute",
    "B3 bwd": "backward",
    "B3 dgrad qkv": "backward",
    "B3 wgrad fc1": "backward",
    "B3 L2 wgrad qkv": "backward",
    "Bi3 bwd": "backward",
    "Bi3 dgrad fc1": "backward",
    "W3 wgrad": "weight grad",
    "W3.c1 wgrad": "weight grad",
    "F0 embed": "embedding/head fwd",
    "F0 embed embed": "embedding/head fwd",
    "F3 head": "embedding/head fwd",
    "F3.c1 head": "embedding/head fwd",
    "F0 head head": "embedding/head fwd",
    "B3 head bwd": "embedding/head bwd",
    "B3.c1 head bwd": "embedding/head bwd",
    "Bi3 head bwd": "embedding/head bwd",
    "B3 embed bwd": "embedding/head bwd",
    "B0 embed embed bwd": "embedding/head bwd",
    "B0 head head bwd": "embedding/head bwd",
    "copy-out L3 mb0": "copy-out",
    "copy-out embed mb0 bwd": "copy-out",
    "optimizer": "other compute",
}


def test_compute_category_of_replay_span_names() -> None:
    assert {name: compute_category(name) for name in REPLAY_COMPUTE_NAMES} == REPLAY_COMPUTE_NAMES
    # Every category has its own colour, so the legend tells them apart.
    categories = set(REPLAY_COMPUTE_NAMES.values())
    assert categories <= set(COMPUTE_COLORS)
    assert len({category_color(c) for c in COMPUTE_COLORS}) == len(COMPUTE_COLORS)


def test_communication_span_names_are_drawn_per_stream() -> None:
    for name, stream in (
        ("AG u3 mb0", "dp"),
        ("RS L3 mb0", "dp"),
        ("AR grad norm", "world"),
        ("B3 reduce_scatter dgrad qkv", "tp"),
        ("F3 embed reduce_scatter", "tp"),
    ):
        span = _span(0, stream, name, "collective", 0.0, 1.0)
        assert span_category(span) == f"{stream} comm"
    assert span_category(_span(0, "pp", "send F3 0->1", "p2p", 0.0, 1.0)) == "pp comm"


def _recompute_spans() -> list[Span]:
    """One rank, 100 ms: forward, embedding, a 20 us recompute right before its backward, head."""
    return [
        _span(0, "compute", "F0 embed", "compute", 0.0, 0.001),
        _span(0, "compute", "F0 fwd", "compute", 0.001, 0.040),
        _span(0, "compute", "F0 head", "compute", 0.040, 0.045),
        _span(0, "compute", "B0 head bwd", "compute", 0.045, 0.055),
        _span(0, "compute", "B0 recompute", "compute", 0.055, 0.05502),
        _span(0, "compute", "B0 bwd", "compute", 0.05502, 0.099),
        _span(0, "compute", "B0 embed bwd", "compute", 0.099, 0.100),
    ]


def test_recompute_and_embedding_head_have_their_own_legend_entries() -> None:
    ax = timeline_figure(_recompute_spans(), ranks=[0]).axes[0]
    legend_box = ax.get_legend()
    assert legend_box is not None
    legend = [t.get_text() for t in legend_box.get_texts()]
    assert legend == [
        "forward",
        "backward",
        "recompute",
        "embedding/head fwd",
        "embedding/head bwd",
    ]


def test_thin_recompute_is_drawn_wider_than_its_duration() -> None:
    """A 20 us recompute in a 100 ms step is under a pixel: it gets an outline of its colour."""
    png = figure_bytes(timeline_figure(_recompute_spans(), ranks=[0]), "png")
    image = (matplotlib.image.imread(io.BytesIO(png))[..., :3] * 255).astype(int)
    plot_area = image[:, : image.shape[1] * 3 // 4]  # the legend, with its swatch, is right of it
    recompute_rgb = np.array([0x81, 0x72, 0xB3])
    columns = np.where(np.all(np.abs(plot_area - recompute_rgb) < 3, axis=-1).any(axis=0))[0]
    assert len(columns) >= 2


def test_representative_ranks_one_per_stage_sampled_evenly() -> None:
    spans = [_span(r, "compute", "F0", "compute", 0.0, 1.0) for r in range(0, 64, 2)]
    stage_of = lambda rank: rank // 4  # noqa: E731  16 stages of 4 ranks, ranks 0, 2 simulated
    assert representative_ranks(spans[:4], stage_of) == [0, 4]
    # 16 stages sampled to 8: stage indices round(i * 15 / 7) = 0, 2, 4, 6, 9, 11, 13, 15.
    assert representative_ranks(spans, stage_of) == [0, 8, 16, 24, 36, 44, 52, 60]
    assert representative_ranks(spans, stage_of, max_ranks=1) == [0]


def test_timeline_lanes_and_legend() -> None:
    fig = timeline_figure(_pipeline_spans(), ranks=[0, 4], rank_titles={0: "rank 0 (pp stage 0)"})
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [
        "rank 0 (pp stage 0)",
        "tp comm",
        "pp comm",
        "dp comm",
        "rank 4",
        "tp comm",
        "pp comm",
        "dp comm",
    ]
    legend_box = ax.get_legend()
    assert legend_box is not None
    legend = [t.get_text() for t in legend_box.get_texts()]
    assert legend == ["forward", "backward", "optimizer", "tp comm", "pp comm", "dp comm"]
    assert ax.get_xlabel() == "time (ms)"
    assert ax.get_xlim()[1] >= 18.0  # the optimizer ends at 18 ms


def test_timeline_png_is_written_and_not_blank() -> None:
    png = figure_bytes(timeline_figure(_pipeline_spans(), ranks=[0, 4]), "png")
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    image = matplotlib.image.imread(io.BytesIO(png))
    height, width = image.shape[:2]
    assert width > 1000 and height > 300
    # Many distinct colours: bars of several categories were drawn, not just axes.
    colours = np.unique((image[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 50
    forward_rgb = np.array([0x4C, 0x72, 0xB0])
    assert np.any(np.all(np.abs((image[..., :3] * 255) - forward_rgb) < 2, axis=-1))


def test_svg_output() -> None:
    svg = figure_bytes(timeline_figure(_pipeline_spans(), ranks=[0]), "svg")
    assert b"<svg" in svg[:500]
