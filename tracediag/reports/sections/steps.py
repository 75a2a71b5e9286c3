"""Engine steps per rank: marker, phase, T, host duration, step time (GPU span, else host duration),
collectives, attention (tracediag.analyses.per_rank, which tracediag.measures reads too)."""

from __future__ import annotations

from tracediag.analyses.per_rank import steps_sql
from tracediag.reports.sections import Section


def build(ctx) -> Section | None:
    sql = steps_sql(ctx)
    rows = ctx.rows(sql)
    if not rows:
        return None
    notes = [
        "Steps come from the first marker kind present on each rank (see README). Duration is the host range "
        "of the step's marker; step time is the GPU span of the kernels the step launched, or the host "
        "duration on a CPU-only trace."
    ]
    unparsed = ctx.rows(
        "SELECT name, sum(occurrences) AS n FROM step_annotations_unparsed GROUP BY name ORDER BY n DESC"
    )
    if unparsed:
        total = sum(u["n"] for u in unparsed)
        names = ", ".join(f"{u['name']} ×{u['n']}" for u in unparsed[:5])
        notes.append(f"{total} step-like annotations not understood (no form of the step grammar matches): {names}")
    return Section(
        id="steps",
        step=6,
        title="Engine steps",
        tables={"steps per rank": rows},
        notes=tuple(notes),
        queries={"steps per rank": " ".join(sql.split())},
    )
