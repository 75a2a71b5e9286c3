"""report.html: one self-contained page (inline CSS, no scripts, no network), autoescaped.

Display values are prepared here so the template only loops and prints.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import jinja2
import orjson
from markupsafe import Markup

from tracediag.findings import WALK_STEPS

# The method and rule reference of the project (docs/ in the repository); the report is read away from any
# checkout (attached to a ticket), so it links to the published copy.
DOCS_URL = "https://github.com/tracediag/tracediag/blob/main/docs/"

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("tracediag.reports", "templates"),
    autoescape=True,  # kernel names, annotation names and paths are untrusted text
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def fmt(v: Any) -> str:
    """Numbers with thousands separators and sensible precision; structures as compact JSON."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 1:
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.1f}"
        return f"{v:.3g}"
    if isinstance(v, (list, dict, tuple, set)):
        return orjson.dumps(v, default=list, option=orjson.OPT_NON_STR_KEYS).decode()
    return str(v)


def _ts_us(ns: Any) -> str:
    # Chrome/Kineto JSON writes µs: show the value a user can search for in the trace file.
    return f"{ns / 1000:.3f}" if isinstance(ns, int) else "—"


def _table(rows: list[dict[str, Any]], ts_keys: tuple[str, ...] = ("ts_ns",), limit: int = 500) -> dict[str, Any]:
    if not rows:
        return {"cols": [], "rows": [], "truncated": False}
    cols = list(rows[0].keys())
    shown = []
    for r in rows[:limit]:
        shown.append(
            [(_ts_us(r.get(c)) + " µs") if c in ts_keys and r.get(c) is not None else fmt(r.get(c)) for c in cols]
        )
    return {
        "cols": [("ts (µs, as in trace)" if c in ts_keys else c) for c in cols],
        "rows": shown,
        "truncated": len(rows) > limit,
    }


def _check_view(c: dict[str, Any]) -> dict[str, Any]:
    optional = ("severity", "confidence", "formula", "substituted", "next_check", "reason")
    return {
        **{k: None for k in optional},
        **c,
        "impact_pct": f"{c['impact'] * 100:.0f}%" if c.get("impact") is not None else None,
        "values_view": [(k, fmt(v)) for k, v in c.get("values", {}).items()],
        "evidence_view": _table(c.get("evidence", [])),
        "table_view": _table(c.get("table", []), limit=200),
        "downstream_of": c.get("downstream_of", []),
        "step_name": WALK_STEPS.get(c["step"], str(c["step"])),
    }


def render_html(report) -> str:
    d = report.to_dict()
    checks = [_check_view(c) for c in d["checks"]]
    sections = [
        {
            "id": s.id,
            "step": s.step,
            "title": s.title,
            "notes": s.notes,
            "template": s.template or "_generic.html",
            "svgs": [Markup(svg) for svg in s.svgs],  # built by tracediag with every label XML-escaped
            "tables_view": [
                (caption, _table(rows, ts_keys=("ts_ns", "gpu_ts_ns"))) for caption, rows in s.tables.items()
            ],
        }
        for s in report.sections
    ]
    walk = []
    for step, name in WALK_STEPS.items():
        walk.append(
            {
                "step": step,
                "name": name,
                "checks": [c for c in checks if c["step"] == step],
                "sections": [s for s in sections if s["step"] == step],
            }
        )
    model = d["model"]
    return _ENV.get_template("report.html").render(
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        tool=d["tool"],
        inputs=d["inputs"],
        model=model,
        model_view=[(k, fmt(v)) for k, v in model.items() if k not in ("notes",)] if model else [],
        tp=d["tp"],
        cost_model=d["cost_model"],
        findings=[c for c in checks if c["status"] == "finding"],
        counts={s: sum(1 for c in checks if c["status"] == s) for s in ("finding", "pass", "not_applicable")},
        walk=walk,
        method_url=DOCS_URL + "method.md",
        rules_url=DOCS_URL + "rules.md",
    )
