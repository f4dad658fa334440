"""The search's Pareto plot: titled with the model and cluster, the GPU's HBM drawn."""

from __future__ import annotations

from sim.output.pareto import pareto_figure, pareto_figure_bytes
from sim.search.run import Row


def _row(name: str, tokens: float, memory: float) -> Row:
    return Row(name=name, step_time_s=1.0, tokens_per_s=tokens, mfu=0.5, memory_gib=memory,
               exposed_comm_s=0.0, bottleneck="compute")  # fmt: skip


def test_the_plot_names_model_and_cluster_and_draws_the_hbm() -> None:
    rows = [_row("tp1-ddp", 100.0, 70.0), _row("tp2-fsdp2", 90.0, 30.0)]
    title = "llama3-8b on 16 x h100-sxm (2 x dgx-h100)"
    fig = pareto_figure(rows, rows, title=title, hbm_gib=80.0, headroom=0.9)
    ax = fig.axes[0]
    assert ax.get_title() == f"{title}: throughput against memory"
    vertical = [line for line in ax.get_lines() if len(set(line.get_xdata())) == 1]
    assert sorted(line.get_xdata()[0] for line in vertical) == [72.0, 80.0]
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "HBM (80 GiB)" in legend and "search limit (90% of HBM)" in legend
    assert pareto_figure_bytes(rows, rows, "png", title=title, hbm_gib=80.0).startswith(b"\x89PNG")
