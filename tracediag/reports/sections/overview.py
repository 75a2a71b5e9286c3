"""Where the time goes: the time breakdown per phase, the step timeline per rank, collective waiting per rank.

Drawn right after the findings (place="overview"). Built from the derived tables every rule reads
(step_activity, collectives), so the charts and the findings rest on the same numbers.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from tracediag.analyses.kernels import PHASES, unphased_name
from tracediag.reports import svg, units
from tracediag.reports.sections import Section

PHASE_LABEL = {"prefill": "prefill", "decode": "decode", "mixed": "mixed", None: "unphased"}

# Per rank-step: step time and the time of each kind of work inside it. Collectives come from the
# collectives table (their GPU time, or the worker's time for gloo: waiting included).
BREAKDOWN_SQL = """
WITH comm AS (
    SELECT rank, step_id, sum(dur_ns) AS comm_ns FROM collectives WHERE step_id IS NOT NULL GROUP BY ALL
)
SELECT a.rank, a.step_id, a.phase, a.T, a.source, a.step_ns, s.ts_ns,
       a.attention_ns + a.attention_fallback_ns AS attention_ns,
       coalesce(k.work_ns, 0) - a.attention_ns - a.attention_fallback_ns - a.collective_ns AS compute_ns,
       coalesce(c.comm_ns, a.collective_ns, 0) AS comm_ns,
       coalesce(a.gpu_idle_ns, 0) AS idle_ns
FROM step_activity a
JOIN steps s USING (rank, step_id)
LEFT JOIN comm c USING (rank, step_id)
LEFT JOIN (SELECT rank, step_id, sum(time_ns) AS work_ns FROM kernel_steps WHERE step_id IS NOT NULL
           AND klass NOT IN ('memcpy', 'memset') GROUP BY ALL) k USING (rank, step_id)
ORDER BY a.rank, a.step_id
"""

PARTS = ("compute", "attention", "communication", "GPU idle", "host and other")


def breakdown(rows: list[dict[str, Any]], unphased: str = PHASE_LABEL[None]) -> list[dict[str, Any]]:
    """Per phase: step time and its split into compute, attention, communication, GPU idle and the rest.

    Work that overlaps (a collective on its own stream, gloo's worker thread) can add up to more than the
    step time; the parts are then scaled down together to the step time and `overlap_scaled` says so.
    """
    out = []
    for ph in [*PHASES, None]:
        rs = [r for r in rows if r["phase"] == ph and r["step_ns"]]
        if not rs:
            continue
        step = sum(r["step_ns"] for r in rs)
        parts = {
            "compute": sum(max(0, r["compute_ns"] or 0) for r in rs),
            "attention": sum(r["attention_ns"] or 0 for r in rs),
            "communication": sum(r["comm_ns"] or 0 for r in rs),
            "GPU idle": sum(r["idle_ns"] or 0 for r in rs),
        }
        used = sum(parts.values())
        scale = step / used if used > step else 1.0
        parts = {k: v * scale for k, v in parts.items()}
        parts["host and other"] = max(0.0, step - sum(parts.values()))
        out.append(
            {
                "phase": PHASE_LABEL.get(ph, ph) if ph else unphased,
                "rank_steps": len(rs),
                "step_time_ns": step,
                **{f"{k.replace(' ', '_')}_share": (v / step if step else None) for k, v in parts.items()},
                "overlap_scaled": scale < 1.0,
            }
        )
    return out


def _ms(v: float) -> str:
    return units.duration(v * 1e6)


def _seconds_axis(span_ns: float):
    """(scale to axis units, axis label, tick formatter) for a time axis over `span_ns`."""
    if span_ns >= 2e9:
        return 1e9, "time since the trace start (s)", svg.plain
    return 1e6, "time since the trace start (ms)", svg.plain


def _timeline(rows: list[dict[str, Any]], t0: int) -> list[str]:
    span = max(r["ts_ns"] for r in rows) - t0
    scale, xlabel, xfmt = _seconds_axis(span)
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    tips: dict[str, list[str]] = defaultdict(list)
    for r in rows:
        name = f"rank {r['rank']}"
        series[name].append(((r["ts_ns"] - t0) / scale, r["step_ns"] / 1e6))
        tips[name].append(
            f"rank {r['rank']} step {r['step_id']} ({PHASE_LABEL.get(r['phase'], r['phase'])}"
            + (f", T = {r['T']}" if r["T"] is not None else "")
            + f"): {units.duration(r['step_ns'])}"
        )
    charts = [
        svg.scatter(
            "Step time per rank over the trace",
            xlabel,
            "step time (ms)",
            dict(series),
            connect=True,
            xfmt=xfmt,
            tips=dict(tips),
        )
    ]
    ts = [r for r in rows if r["T"] is not None and r["rank"] == rows[0]["rank"]]
    if ts and len({r["T"] for r in ts}) > 1:
        by_phase: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for r in ts:
            by_phase[PHASE_LABEL.get(r["phase"], r["phase"])].append(((r["ts_ns"] - t0) / scale, float(r["T"])))
        charts.append(
            svg.scatter(f"Tokens per step (T), rank {rows[0]['rank']}", xlabel, "T (tokens)", dict(by_phase), xfmt=xfmt)
        )
    return charts


def _waiting(ctx) -> tuple[str | None, list[dict[str, Any]]]:
    from tracediag.analyses.stragglers import matched_summary, rank_table

    if (ctx.scalar("SELECT count(DISTINCT rank) FROM collectives") or 0) < 2:
        return None, []
    matched = matched_summary(ctx)
    if not matched:
        return None, []
    table = rank_table(ctx)
    rows = [
        (f"rank {t['rank']}", [("waiting for the last rank", t["waiting_ns"]),
                               ("rest of the call", max(0, t["collective_ns"] - t["waiting_ns"]))])
        for t in table
    ]  # fmt: skip
    chart = svg.stacked_bars(
        f"Collective time per rank ({matched['sets']} calls matched across ranks)",
        rows,
        total_fmt=units.duration,
        unit_note="share of each rank's collective time; the total at the end of each bar",
    )
    return chart, table


def build(ctx) -> Section | None:
    rows = ctx.rows(BREAKDOWN_SQL)
    if not rows:
        return None
    split = breakdown(rows, unphased_name(ctx))
    charts = []
    if split:
        charts.append(
            svg.stacked_bars(
                "Where step time goes, per phase",
                [
                    (r["phase"], [(k, (r[f"{k.replace(' ', '_')}_share"] or 0) * r["step_time_ns"]) for k in PARTS])
                    for r in split
                ],
                total_fmt=units.duration,
                unit_note="share of the phase's summed step time (all ranks); the total at the end of each bar",
            )
        )
    t0 = ctx.scalar("SELECT min(trace_start_ns) FROM inputs WHERE trace_start_ns IS NOT NULL")
    timed = [r for r in rows if r["step_ns"] is not None and r["ts_ns"] is not None]
    if timed and t0 is not None and len(timed) > 1:
        charts += _timeline(timed, t0)
    wait_chart, wait_table = _waiting(ctx)
    if wait_chart:
        charts.append(wait_chart)
    source = rows[0]["source"]
    notes = [
        "Compute and attention: "
        + ("GPU kernel time" if source == "gpu_kernel" else "CPU op time (no GPU kernels in the trace)")
        + "; communication: the collectives' time in the step"
        + (" (gloo: the worker thread's time, waiting included)" if source != "gpu_kernel" else "")
        + "; host and other: the step time none of these cover."
    ]
    if any(r["overlap_scaled"] for r in split):
        notes.append(
            "In some phases the parts overlap (communication on its own stream or thread) and add up to more "
            "than the step time: they are drawn scaled down together to the step time."
        )
    tables = {"time breakdown per phase": split}
    if wait_table:
        tables["collective time and waiting per rank"] = wait_table
    return Section(
        id="overview",
        step=6,
        title="Where the time goes",
        tables=tables,
        notes=tuple(notes),
        svgs=tuple(c for c in charts if c),
        place="overview",
    )
