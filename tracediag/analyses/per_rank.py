"""Per-rank tables of a run, as findings.json carries them: the engine steps (marker, phase, T, durations, step
activity, collectives) and the collective calls per op and dtype. The report's steps and collectives sections
show them; tracediag.measures reads them from a store for baselines and diffs (step time per phase and T bucket,
communication share, calls per step)."""

from __future__ import annotations

from tracediag.context import Context
from tracediag.store import has_table

STEPS_SQL = """
SELECT s.rank, s.step_id, s.name, s.marker_source, s.phase, s.phase_source, s.T, s.t_source, s.ts_ns, s.dur_ns,
       a.step_ns, a.gpu_idle_ns, a.attention_ns + a.attention_fallback_ns AS attention_ns,
       s.gpu_end_ns - s.gpu_ts_ns AS gpu_span_ns, s.kernel_count,
       count(c.op) FILTER (WHERE c.op = 'all_reduce') AS all_reduces,
       count(c.op) AS collectives, sum(c.dur_ns) AS collective_ns
FROM steps s LEFT JOIN step_activity a USING (rank, step_id)
LEFT JOIN collectives c USING (rank, step_id)
GROUP BY ALL ORDER BY s.rank, s.step_id"""
# the same on a store from before step_activity existed (a trace.duckdb of an older version, read by measures)
STEPS_NO_ACTIVITY_SQL = """
SELECT s.rank, s.step_id, s.name, s.marker_source, s.phase, s.phase_source, s.T, s.t_source, s.ts_ns, s.dur_ns,
       NULL::BIGINT AS step_ns, NULL::BIGINT AS gpu_idle_ns, NULL::BIGINT AS attention_ns,
       s.gpu_end_ns - s.gpu_ts_ns AS gpu_span_ns, s.kernel_count,
       count(c.op) FILTER (WHERE c.op = 'all_reduce') AS all_reduces,
       count(c.op) AS collectives, sum(c.dur_ns) AS collective_ns
FROM steps s
LEFT JOIN collectives c USING (rank, step_id)
GROUP BY ALL ORDER BY s.rank, s.step_id"""


def steps_sql(ctx: Context) -> str:
    """The query of the steps table: with the step activity columns, or NULL ones on a store without
    step_activity (every store this version writes has it)."""
    return STEPS_SQL if has_table(ctx.con, "step_activity") else STEPS_NO_ACTIVITY_SQL


def steps_per_rank(ctx: Context) -> list[dict]:
    return ctx.rows(steps_sql(ctx))


def collectives_per_rank(ctx: Context) -> list[dict]:
    """Collective calls per rank, op, dtype and group size: counts, payload bytes, time."""
    return ctx.rows("""
        SELECT rank, op, dtype, group_size, count(*) AS calls, count(payload_bytes) AS sized_calls,
               min(payload_bytes) AS min_payload_bytes, max(payload_bytes) AS max_payload_bytes,
               sum(payload_bytes) AS total_payload_bytes, sum(dur_ns) AS total_ns,
               any_value(evidence) AS size_from, count(kernel_name) AS with_kernel
        FROM collectives GROUP BY ALL ORDER BY rank, calls DESC, op, dtype, group_size""")
