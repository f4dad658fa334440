"""The timeline plot: ranks chosen per pipeline stage, colours per category, a real PNG."""

from __future__ import annotations

import io
from typing import Any

import matplotlib.image
import numpy as np

from sim.output.timeline import (
    COLUMNS,
    COMPUTE_COLORS,
    category_color,
    column_shares,
    compute_category,
    figure_bytes,
    legend_label,
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


def _legend(fig: Any) -> list[str]:
    (legend_box,) = fig.legends  # below the plot, so the lanes keep the figure's width
    return [t.get_text() for t in legend_box.get_texts()]


def test_recompute_and_embedding_head_have_their_own_legend_entries() -> None:
    legend = _legend(timeline_figure(_recompute_spans(), ranks=[0]))
    assert legend == [
        "forward",
        "backward",
        "recompute",
        "embedding/head fwd",
        "embedding/head bwd",
    ]


def _rgb_pixels(fig: Any, rgb: tuple[int, int, int]) -> np.ndarray:
    """Where ``rgb`` is (within antialiasing) inside the plot's axes: a boolean image."""
    image = matplotlib.image.imread(io.BytesIO(figure_bytes(fig, "png")))[..., :3] * 255
    box = fig.axes[0].get_window_extent()  # from the bottom left, at the figure's dpi
    x0, y0, x1, y1 = (round(v * 150 / fig.dpi) for v in (box.x0, box.y0, box.x1, box.y1))
    height = image.shape[0]  # saved at 150 dpi (figure_bytes)
    inside = image[height - y1 + 1 : height - y0 - 1, x0 + 1 : x1 - 1]  # inside the frame
    return np.all(np.abs(inside.astype(int) - np.array(rgb)) < 3, axis=-1)


RECOMPUTE_RGB = (0x81, 0x72, 0xB3)
BACKWARD_RGB = (0xDD, 0x84, 0x52)


def test_thin_recompute_shows_its_share_of_a_column() -> None:
    """A 20 us recompute in a 100 ms step is under a pixel (a column is 67 us): its column is
    drawn 30% recompute (20 of 67 us), the rest the backward beside it. Still visible."""
    recompute = _rgb_pixels(timeline_figure(_recompute_spans(), ranks=[0]), RECOMPUTE_RGB)
    assert recompute.any()
    assert recompute.any(axis=0).sum() <= 2  # one column, a pixel or two wide


def _crowded_spans(num_microbatches: int = 512) -> list[Span]:
    """The issue's interleaved schedule in small: 512 backwards of 52 ms, each after a 1 ms
    recompute (2% of the compute), back to back."""
    spans, t = [], 0.0
    for mb in range(num_microbatches):
        spans.append(_span(0, "compute", f"B{mb} recompute", "compute", t, t + 0.001))
        spans.append(_span(0, "compute", f"B{mb} bwd", "compute", t + 0.001, t + 0.053))
        spans.append(_span(0, "mp", "AR grad norm", "collective", t, t + 1e-6))
        t += 0.053
    return spans


def test_column_shares_are_the_time_each_category_fills() -> None:
    spans = [
        _span(0, "compute", "F0 fwd", "compute", 0.000, 0.0015),  # 0 to 1.5 ms
        _span(0, "compute", "B0 recompute", "compute", 0.0015, 0.002),  # 1.5 to 2 ms
        _span(0, "compute", "B0 bwd", "compute", 0.002, 0.004),  # 2 to 4 ms
    ]
    shares = column_shares(spans, end_ms=4.0, num_columns=4)  # columns of 1 ms
    assert shares["forward"].tolist() == [1.0, 0.5, 0.0, 0.0]
    assert shares["recompute"].tolist() == [0.0, 0.5, 0.0, 0.0]
    assert shares["backward"].tolist() == [0.0, 0.0, 1.0, 1.0]


def test_a_crowded_lane_shows_its_recompute_share_not_a_painted_over_backward() -> None:
    """On main every 1 ms recompute was drawn two pixels wide over its 52 ms backward: the lane
    was mostly purple. Now the purple is about the recompute's 2% of the lane."""
    spans = _crowded_spans()
    shares = column_shares(spans, end_ms=512 * 53.0)
    assert abs(shares["recompute"].mean() - 1 / 53) < 1e-3
    fig = timeline_figure(spans, ranks=[0])
    recompute = _rgb_pixels(fig, RECOMPUTE_RGB).sum()
    backward = _rgb_pixels(fig, BACKWARD_RGB).sum()
    assert 0 < recompute < 0.05 * (recompute + backward)


def test_lanes_under_a_pixel_are_left_out_and_named() -> None:
    """The grad-norm all-reduce (512 x 1 us in a 27 s step) is no lane; the legend says so, and
    says what each drawn communication lane carries."""
    spans = _crowded_spans()
    spans.append(_span(0, "tp", "AG F0", "collective", 0.0, 2.0))
    fig = timeline_figure(spans, ranks=[0])
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels == ["rank 0", "tp comm"]
    assert _legend(fig) == [
        "backward",
        "recompute",
        "tp comm: tensor-parallel collectives",
        "not drawn, under a pixel: mp comm (0.51 ms)",
    ]
    assert legend_label("mp comm") == (
        "mp comm: gradient-norm all-reduce over TP x PP (Megatron's model-parallel group)"
    )
    assert COLUMNS >= 1000


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
    assert _legend(fig) == [
        "forward",
        "backward",
        "optimizer",
        "tp comm: tensor-parallel collectives",
        "pp comm: pipeline sends and receives",
        "dp comm: data-parallel gradients and parameter gathers",
    ]
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
