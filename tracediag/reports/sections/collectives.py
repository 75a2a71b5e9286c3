"""Collective calls per rank, op and dtype: counts, payload bytes, time."""

from __future__ import annotations

from tracediag.analyses.per_rank import collectives_per_rank
from tracediag.reports.sections import Section


def build(ctx) -> Section | None:
    rows = collectives_per_rank(ctx)
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
