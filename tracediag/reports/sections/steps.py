"""Engine steps per rank: marker, phase, T, host duration, step time (GPU span, else host duration),
collectives, attention. `tracediag.measures` reads this table too (step time per phase and T bucket)."""

from __future__ import annotations

from tracediag.reports.sections import Section
from tracediag.store import has_table

_ACTIVITY = "a.step_ns, a.gpu_idle_ns, a.attention_ns + a.attention_fallback_ns AS attention_ns"
_NO_ACTIVITY = "NULL::BIGINT AS step_ns, NULL::BIGINT AS gpu_idle_ns, NULL::BIGINT AS attention_ns"

STEPS_SQL = """
SELECT s.rank, s.step_id, s.name, s.marker_source, s.phase, s.phase_source, s.T, s.t_source, s.ts_ns, s.dur_ns,
       {activity}, s.gpu_end_ns - s.gpu_ts_ns AS gpu_span_ns, s.kernel_count,
       count(c.op) FILTER (WHERE c.op = 'all_reduce') AS all_reduces,
       count(c.op) AS collectives, sum(c.dur_ns) AS collective_ns
FROM steps s {join}
LEFT JOIN collectives c USING (rank, step_id)
GROUP BY ALL ORDER BY s.rank, s.step_id"""


def build(ctx) -> Section | None:
    # step_activity exists in every store this version writes; a store from before it still gets its steps
    activity = has_table(ctx.con, "step_activity")
    sql = STEPS_SQL.format(
        activity=_ACTIVITY if activity else _NO_ACTIVITY,
        join="LEFT JOIN step_activity a USING (rank, step_id)" if activity else "",
    )
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
