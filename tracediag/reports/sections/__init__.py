"""Report sections: data tables (and optional inline SVG charts) shown in the walk step they belong to.

A section module has `build(ctx) -> Section | None` (None: nothing to show for these inputs). Sections
are data, like checks: findings.json carries their tables; report.html renders them after the checks of
their walk step with the generic partial `sections/_generic.html` (or the section's own template).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

SECTION_BUILDERS = (
    "tracediag.reports.sections.steps",
    "tracediag.reports.sections.collectives",
    "tracediag.reports.sections.comm",
    "tracediag.reports.sections.kernels",
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

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "step": self.step, "notes": list(self.notes), "tables": self.tables}


def build_sections(ctx, extra: tuple[str, ...] | list[str] = ()) -> list[Section]:
    out = []
    for name in (*SECTION_BUILDERS, *(e for e in extra if e not in SECTION_BUILDERS)):
        section = importlib.import_module(name).build(ctx)
        if section is not None:
            out.append(section)
    return out
