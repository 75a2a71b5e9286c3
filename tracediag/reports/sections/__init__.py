"""Report sections: data tables (and optional inline SVG charts) behind the findings.

A section module has `build(ctx) -> Section | None` (None: nothing to show for these inputs). Sections
are data, like checks: findings.json carries their tables in full. report.html draws a section's charts in
the walk step it belongs to (or, with `place="overview"`, under "Where the time goes" right after the
findings) and its tables among the detail tables at the end, with the generic partial
`sections/_generic.html` (or the section's own template): long tables are cut to the slowest or most
unusual rows, and `queries` gives, per table caption, the SQL that returns every row from trace.duckdb.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Literal

from tracediag.interrupt import checkpoint

SECTION_BUILDERS = (
    "tracediag.reports.sections.overview",
    "tracediag.reports.sections.steps",
    "tracediag.reports.sections.collectives",
    "tracediag.reports.sections.comm",
    "tracediag.reports.sections.kernels",
    "tracediag.reports.sections.roofline",
    "tracediag.reports.sections.moe",
    "tracediag.reports.sections.phases",
    "tracediag.reports.sections.serving",
)


@dataclass(frozen=True)
class Section:
    id: str  # stable key in findings.json "sections"
    step: int  # walk step it is shown under (1-6)
    title: str
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # caption -> rows (raw values)
    notes: tuple[str, ...] = ()  # plain-text lines shown above the tables
    svgs: tuple[str, ...] = ()  # inline SVG charts built by our code (all text in them XML-escaped)
    template: str | None = None  # custom partial under templates/sections/, else the generic one
    queries: dict[str, str] = field(default_factory=dict)  # caption -> SQL giving all of that table's rows
    place: Literal["walk", "overview"] = "walk"  # where report.html draws the charts

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "step": self.step, "notes": list(self.notes), "tables": self.tables}


def build_sections(ctx, extra: tuple[str, ...] | list[str] = ()) -> list[Section]:
    out = []
    with ctx.memoized():  # sections share queries with each other (and with the rules, in one analysis)
        for name in (*SECTION_BUILDERS, *(e for e in extra if e not in SECTION_BUILDERS)):
            checkpoint()
            section = importlib.import_module(name).build(ctx)
            if section is not None:
                out.append(section)
    return out
