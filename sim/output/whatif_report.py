"""The what-if section of ``commsim plan``'s report: the step with and without, and who waited.

The plan's changes, the step time against the same plan without them, then per listed rank what
changed against a rank of the plain step: the singled-out ranks' own compute (a slow GPU) and
waits, and the ranks that were not singled out but waited longer, on which process groups (the
groups they share with the culprits). The culprits are also marked in the timeline's rank titles
(``culprit_titles``).

    print("\\n".join(whatif_lines(result)))
"""

from __future__ import annotations

from sim.output.report import format_duration
from sim.replay.result import PlanResult

MAX_ROWS = 6
"""Ranks listed in the text report (the JSON has them all)."""
NOISE_SHARE = 1e-3
"""Changes smaller than this share of the step time's change (or a microsecond) are not
printed."""


def whatif_lines(result: PlanResult) -> list[str]:
    """The report section (empty when the plan has no what-if)."""
    info = result.extra.get("whatif")
    if not info:
        return []
    lines = ["What-if:", *(f"  {change}" for change in info["changes"])]
    step_ms = result.step_time_s * 1e3
    for job in info.get("second_job_flows", ()):
        runs = job["runs_ms"]
        took = [end - start for start, end in runs if end <= step_ms]
        cut = len(runs) - len(took)
        if runs:
            each = f", {min(took):.3g}-{max(took):.3g} ms each" if took else ""
            more = " (one more still running at the step's end)" if cut else ""
            lines.append(
                f"  the second job's {job['op']} over server(s) "
                f"{','.join(map(str, job['nodes']))} ran {len(took)} time(s) in the step"
                f"{each}{more}; {job['collective_alone_ms']:.3g} ms alone"
            )
    compared = info.get("compared")
    if compared is None:
        return lines
    delta = compared["delta_s"]
    lines.append(
        f"  step {format_duration(result.step_time_s)}, without the what-if "
        f"{format_duration(compared['without_step_time_s'])}: {_signed(delta)} "
        f"({compared['delta_pct']:+.1f}%)"
    )
    noise = max(1e-6, NOISE_SHARE * abs(delta))
    rows = compared["changes_by_rank"]
    culprits = [r for r, row in rows.items() if row["singled_out"]]  # listed culprits first
    others = sorted(
        (r for r, row in rows.items() if not row["singled_out"]),
        key=lambda r: -abs(sum(rows[r]["waits_s"].values())),
    )
    shown = culprits[: MAX_ROWS // 2] + others[: MAX_ROWS - min(len(culprits), MAX_ROWS // 2)]
    for rank in shown:
        row = rows[rank]
        role = "singled out" if row["singled_out"] else "not singled out"
        parts = []
        if abs(row["compute_s"]) > noise:
            parts.append(f"computes {_signed(row['compute_s'])}")
        waits = {g: w for g, w in row["waits_s"].items() if abs(w) > noise}
        parts += [f"waits {_signed(w)} on {g}" for g, w in sorted(waits.items(), key=_largest)]
        if abs(row.get("optimizer_s", 0.0)) > noise:
            parts.append(f"optimizer {_signed(row['optimizer_s'])} (with its waits)")
        for label in ("bubble", "host"):
            if abs(row[f"{label}_s"]) > noise:
                parts.append(f"{label} {_signed(row[f'{label}_s'])}")
        lines.append(f"  rank {rank} ({role}): {', '.join(parts) or 'unchanged'}")
    if len(rows) > len(shown):
        lines.append(f"  ({len(rows) - len(shown)} more ranks in the JSON result)")
    return lines


def culprit_titles(result: PlanResult, titles: dict[int, str]) -> dict[int, str]:
    """Rank titles with the singled-out ranks marked, for the timeline and the trace."""
    info = result.extra.get("whatif")
    if not info:
        return titles
    marked = set(info["singled_out_ranks"])
    return {r: f"{t} [what-if]" if r in marked else t for r, t in titles.items()}


def _largest(item: tuple[str, float]) -> float:
    return -abs(item[1])


def _signed(seconds: float) -> str:
    sign = "+" if seconds >= 0 else "-"
    return sign + format_duration(abs(seconds))
