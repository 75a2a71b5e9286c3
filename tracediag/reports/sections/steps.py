"""Engine steps per rank: marker, phase, T, host and GPU time, collectives."""

from __future__ import annotations

from tracediag.reports.sections import Section


def build(ctx) -> Section | None:
    rows = ctx.rows("""
        SELECT s.rank, s.step_id, s.name, s.marker_source, s.phase, s.T, s.t_source, s.ts_ns, s.dur_ns,
               s.gpu_end_ns - s.gpu_ts_ns AS gpu_span_ns, s.kernel_count,
               count(c.op) FILTER (WHERE c.op = 'all_reduce') AS all_reduces,
               count(c.op) AS collectives, sum(c.dur_ns) AS collective_ns
        FROM steps s LEFT JOIN collectives c USING (rank, step_id)
        GROUP BY ALL ORDER BY s.rank, s.step_id""")
    if not rows:
        return None
    notes = ["Steps come from the first marker kind present on each rank (see README)."]
    unparsed = ctx.rows(
        "SELECT name, sum(occurrences) AS n FROM step_annotations_unparsed GROUP BY name ORDER BY n DESC"
    )
    if unparsed:
        total = sum(u["n"] for u in unparsed)
        names = ", ".join(f"{u['name']} ×{u['n']}" for u in unparsed[:5])
        notes.append(f"{total} step-like annotations not understood (no form of the step grammar matches): {names}")
    return Section(id="steps", step=6, title="Engine steps", tables={"steps per rank": rows}, notes=tuple(notes))
