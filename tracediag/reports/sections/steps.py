"""Engine steps per rank: marker, phase, T, step time (GPU span, else host duration), collectives, attention."""

from __future__ import annotations

from tracediag.reports.sections import Section
from tracediag.rules._kernels import prepare

STEPS_SQL = """
SELECT s.rank, s.step_id, s.name, s.marker_source, s.phase, s.phase_source, s.T, s.t_source, s.ts_ns,
       a.step_ns, s.dur_ns AS host_dur_ns, s.gpu_end_ns - s.gpu_ts_ns AS gpu_span_ns, s.kernel_count,
       a.gpu_idle_ns, a.attention_ns + a.attention_fallback_ns AS attention_ns,
       count(c.op) FILTER (WHERE c.op = 'all_reduce') AS all_reduces,
       count(c.op) AS collectives, sum(c.dur_ns) AS collective_ns
FROM steps s
LEFT JOIN step_activity a USING (rank, step_id)
LEFT JOIN collectives c USING (rank, step_id)
GROUP BY ALL ORDER BY s.rank, s.step_id"""


def build(ctx) -> Section | None:
    prepare(ctx)
    rows = ctx.rows(STEPS_SQL)
    if not rows:
        return None
    return Section(
        id="steps",
        step=6,
        title="Engine steps",
        tables={"steps per rank": rows},
        notes=(
            "Steps come from the first marker kind present on each rank (see README). Step time is the GPU span "
            "of the kernels the step launched, or the host duration on a CPU-only trace.",
        ),
        queries={"steps per rank": " ".join(STEPS_SQL.split())},
    )
