"""The timeline plot: ranks chosen per pipeline stage, colours per category, a real PNG."""

from __future__ import annotations

import io

import matplotlib.image
import numpy as np

from sim.output.timeline import (
    COMPUTE_COLORS,
    category_color,
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
    assert category("step", kind="optimizer") == "optimizer"
    assert category("AG(unit 5)", kind="collective", stream="dp") == "dp comm"
    assert category("wait tp", kind="wait") is None
    assert category_color("forward") == COMPUTE_COLORS["forward"]
    assert category_color("tp comm") != category_color("dp comm")


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
