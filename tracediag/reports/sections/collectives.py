"""Collective calls per rank, op and dtype: counts, payload bytes, time."""

from __future__ import annotations

from tracediag.reports.sections import Section


def build(ctx) -> Section | None:
    rows = ctx.rows("""
        SELECT rank, op, dtype, group_size, count(*) AS calls, count(payload_bytes) AS sized_calls,
               min(payload_bytes) AS min_payload_bytes, max(payload_bytes) AS max_payload_bytes,
               sum(payload_bytes) AS total_payload_bytes, sum(dur_ns) AS total_ns,
               any_value(evidence) AS size_from, count(kernel_name) AS with_kernel
        FROM collectives GROUP BY ALL ORDER BY rank, calls DESC, op, dtype, group_size""")
    if not rows:
        return None
    layout = getattr(ctx, "layout", None)
    notes = tuple(
        f"{g.kind} group {g.description or g.name or '(unnamed)'} ({g.size or '?'} ranks): {g.evidence}"
        for g in (layout.groups if layout else ())
    )
    return Section(
        id="collectives",
        step=3,
        title="Collectives per rank",
        tables={"per rank, op and dtype": rows},
        queries={"per rank, op and dtype": "SELECT * FROM collectives ORDER BY rank, call_id  -- one row per call"},
        notes=notes,
    )
