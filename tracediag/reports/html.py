"""report.html: one self-contained page (inline CSS and SVG, no scripts, nothing fetched), autoescaped.

The page reads top-down the way an on-call engineer asks: the verdict (what most likely limits the run, what
it costs, what to check next, how many rules could run), the findings ranked by impact with their possible
consequences folded under them, where the time goes, the troubleshooting walk, then the detail tables —
summaries and the slowest or most unusual rows, the rest one SQL query away in trace.duckdb.

Display values are prepared here (units, labels, cut names) so the templates only loop and print.
"""

from __future__ import annotations

import statistics
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup

from tracediag.findings import WALK_STEPS, fold
from tracediag.reports import units
from tracediag.reports.templating import environment
from tracediag.reports.units import cell, ellipsize, ellipsize_path, label, value_text

# The method and rule reference of the project (docs/ in the repository); the report is read away from any
# checkout (attached to a ticket), so it links to the published copy.
DOCS_URL = "https://github.com/tracediag/tracediag/blob/main/docs/"

SECTION_ROWS = 24  # rows of a detail table shown in the page; the rest are in findings.json / trace.duckdb
CHECK_ROWS = 12  # rows of a finding's per-rank/per-step table shown
TITLE_CHARS = 400  # a finding title longer than this is cut (full on hover and in findings.json)
TIME_KEYS = ("step_ns", "dur_ns", "host_dur_ns", "median_step_ns", "time_ns", "total_ns", "collective_ns")


def fmt(v: Any) -> str:
    """A value without a known unit, in words: numbers with separators, structures as 'key: value; ...'."""
    if v is None:
        return "—"
    if isinstance(v, (list, tuple, set, dict)):
        return value_text("", list(v) if isinstance(v, set) else v)
    return units.number(v)


# --- tables -------------------------------------------------------------------------------------------------


def _time_key(rows: list[dict[str, Any]]) -> str | None:
    keys = rows[0].keys()
    return next((k for k in TIME_KEYS if k in keys and any(isinstance(r.get(k), (int, float)) for r in rows)), None)


def select_rows(rows: list[dict[str, Any]], limit: int) -> tuple[list[dict[str, Any]], str | None]:
    """At most `limit` rows worth reading, and how they were chosen (None: all rows).

    Rows with a phase and a time: per phase the rows furthest from that phase's median time (the slowest and
    the most unusual), each with its deviation in a 'vs phase median' column, in their original order. Rows
    with a time only: the slowest. Otherwise the first rows.
    """
    if len(rows) <= limit:
        return rows, None
    tk = _time_key(rows)
    if tk and "phase" in rows[0]:
        by_phase: dict[Any, list[int]] = {}
        for i, r in enumerate(rows):
            if isinstance(r.get(tk), (int, float)):
                by_phase.setdefault(r.get("phase"), []).append(i)
        per = max(2, limit // max(1, len(by_phase)))
        keep: dict[int, float | None] = {}
        for idx in by_phase.values():
            med = statistics.median(rows[i][tk] for i in idx)
            far = sorted(idx, key=lambda i: (-abs(rows[i][tk] - med), -rows[i][tk]))[:per]
            for i in far:
                keep[i] = (rows[i][tk] / med - 1) if med else None
        chosen = [rows[i] | {"vs_phase_median_share": keep[i]} for i in sorted(keep)]
        return chosen, f"per phase, the {per} {label(tk)} values furthest from the phase median"
    if tk:
        top = sorted(range(len(rows)), key=lambda i: -(rows[i].get(tk) or 0))[:limit]
        return [rows[i] for i in sorted(top)], f"the {limit} largest {label(tk)} values"
    return rows[:limit], f"the first {limit}"


def table_view(
    rows: list[dict[str, Any]], *, limit: int = SECTION_ROWS, t0: int | None = None, query: str | None = None
) -> dict[str, Any]:
    """Columns with labels in words, cells in units; rows cut to `limit` with the way they were chosen."""
    if not rows:
        return {"cols": [], "rows": [], "total": 0, "shown": 0, "chosen": None, "query": query}
    shown, chosen = select_rows(rows, limit)
    cols: list[str] = []
    for r in shown:
        cols += [k for k in r if k not in cols]
    cols = [k for k in cols if any(r.get(k) is not None for r in shown)]  # a column empty in every row says nothing
    return {
        "cols": [{"text": label(k), "title": k} for k in cols],
        "rows": [[cell(k, r.get(k), t0) for k in cols] for r in shown],
        "total": len(rows),
        "shown": len(shown),
        "chosen": chosen,
        "query": query,
    }


# --- checks -------------------------------------------------------------------------------------------------


def _title(text: str) -> dict[str, Any]:
    shown, full = ellipsize(text or "", TITLE_CHARS)
    return {"text": shown, "full": full}


def check_view(c: dict[str, Any], t0: int | None) -> dict[str, Any]:
    sev = c.get("severity")
    return {
        "rule": c["rule"],
        "anchor": f"rule-{c['rule']}",
        "status": c["status"],
        "severity": sev,
        "rule_severity": c.get("rule_severity"),
        "title": _title(c["title"]),
        "reason": c.get("reason"),
        "confidence": c.get("confidence"),
        "impact": units.percent(c["impact"]) if c.get("impact") is not None else None,
        "impact_basis": c.get("impact_basis"),
        "step": c["step"],
        "step_name": WALK_STEPS.get(c["step"], str(c["step"])),
        "formula": c.get("formula"),
        "substituted": c.get("substituted"),
        "next_check": c.get("next_check"),
        "downstream_of": c.get("downstream_of", []),
        "value_rows": [
            {"label": label(k), "key": k, "text": ellipsize(value_text(k, v, t0), 300)[0]}
            for k, v in (c.get("values") or {}).items()
        ],
        "evidence": table_view(c.get("evidence") or [], limit=CHECK_ROWS, t0=t0),
        "table": table_view(c.get("table") or [], limit=CHECK_ROWS, t0=t0),
    }


# --- the page -----------------------------------------------------------------------------------------------


def _trace_start(inputs: list[dict[str, Any]]) -> int | None:
    starts = [i["trace_start_ns"] for i in inputs if isinstance(i.get("trace_start_ns"), int)]
    return min(starts) if starts else None


def _summary(d: dict[str, Any]) -> str:
    inputs = d["inputs"]
    ranks = sorted({r for i in inputs for r in i.get("ranks") or []})
    formats = sorted({i.get("format") or "?" for i in inputs})
    parts = [f"{len(inputs)} input file{'s' if len(inputs) != 1 else ''} ({', '.join(formats)})"]
    if ranks:
        parts.append(f"rank{'s' if len(ranks) > 1 else ''} {_ranks_text(ranks)}")
    tp = d.get("tp")
    parts.append(f"p = {tp['p']} ({tp['source']})" if tp else "TP degree unknown")
    model = d.get("model")
    parts.append(f"model {ellipsize_path(str(model.get('path')), 60)[0]}" if model else "no model config")
    ends = [i["trace_end_ns"] for i in inputs if isinstance(i.get("trace_end_ns"), int)]
    t0 = _trace_start(inputs)
    if ends and t0 is not None:
        parts.append(f"{units.duration(max(ends) - t0)} of trace")
    return " · ".join(parts)


def _ranks_text(ranks: list[int]) -> str:
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}–{ranks[-1]}"
    return ", ".join(str(r) for r in ranks)


def _gist(text: str, limit: int = 110) -> str:
    """The start of a title, cut at a clause or word boundary: 'TP=2 is slower than TP=1 for 100% of decode steps…'"""
    if len(text) <= limit:
        return text
    head = text[:limit]
    for sep in (":", ";", " —", ","):
        i = head.rfind(sep)
        if i > limit // 3:
            return head[:i] + "…"
    return head[: head.rfind(" ")] + "…" if " " in head else head + "…"


def _verdict_view(v: dict[str, Any], titles: dict[str, str]) -> dict[str, Any]:
    cov = v["coverage"]
    return {
        **{k: None for k in ("rule", "severity", "confidence", "cost", "next_check", "undetermined")},
        **v,
        "headline": _title(v["headline"]),
        "explains": [{"rule": r, "title": _gist(titles.get(r, ""))} for r in v.get("explains", [])],
        "also": [a | {"title": _gist(a["title"], 160)} for a in v.get("also", [])],
        "largest_effect": (v["largest_effect"] | {"title": _gist(v["largest_effect"]["title"], 160)})
        if v.get("largest_effect")
        else None,
        "second": (v["second"] | {"title": _gist(v["second"]["title"], 160)}) if v.get("second") else None,
        "caveats": [c | {"title": _gist(c["title"], 200)} for c in v.get("caveats", [])],
        "coverage": cov,
        "enable": [{"input": g["input"], "rules": g["rules"]} for g in cov["enable"]],
    }


FITNESS_LABEL = {
    "steady": "steady",
    "clipped": "steady, clipped at its edges",
    "cpu_only": "a CPU trace",
    "startup_only": "start-up only (unfit)",
    "startup_dominated": "mostly start-up (unfit)",
    "graph_capture": "a graph capture (unfit)",
    "sampled": "sampled (unfit)",
    "gpu_stripped": "GPU events stripped (unfit)",
    "too_short": "too short (unfit)",
}


def fitness_view(f: dict[str, Any] | None) -> dict[str, Any] | None:
    """The window line of the header: its class, why, the segments (summed over ranks) and what to re-capture."""
    if not f:
        return None
    ranks = f.get("ranks") or []

    def total(key: str) -> int | None:
        vals = [r[key] for r in ranks if r.get(key) is not None]
        return sum(vals) if vals else None

    segments = [
        (name, units.duration(total(key)))
        for name, key in (("start-up", "startup_ns"), ("steady", "steady_ns"), ("profiler stop", "stop_ns"))
        if total(key) is not None
    ]
    label = FITNESS_LABEL.get(f["class"], f["class"])
    return {
        "cls": f["class"],
        "fit": f["fit"],
        # the label leads unless the reason already starts with it ("sampled: the CPU ops' external ids ...")
        "lead": None if f["why"].startswith(label.removesuffix(" (unfit)")) else label,
        "why": f["why"],
        "segments": segments,
        "recapture": f.get("recapture"),
        "domain": _domain_line(f.get("domain")),
        "graph_replay": _replay_line(f.get("graph_replay")),
        "host_side": (f.get("host_side") or {}).get("why"),
    }


def _replay_line(g: dict[str, Any] | None) -> str | None:
    """The graph-replay line: the unattributed share, and the capturing ops that hold the most replayed time."""
    if not g:
        return None
    ops = ", ".join(f"{o['op']} {units.duration(o['time_ns'])}" for o in (g.get("by_op") or [])[:5])
    return g["why"] + (f"; by capturing op: {ops}" if ops else "")


def _domain_line(d: dict[str, Any] | None) -> str | None:
    """'LLM inference (24 attention kernels, …; 1 inference-engine step annotations)' for the header."""
    if not d:
        return None
    return f"{d['label']} ({d['workload_why']}; {d['mode_why']})"


def _section_view(s, t0: int | None) -> dict[str, Any]:
    queries = getattr(s, "queries", {}) or {}
    return {
        "id": s.id,
        "step": s.step,
        "title": s.title,
        "notes": s.notes,
        "place": getattr(s, "place", "walk"),
        "template": s.template or "_generic.html",
        "svgs": [Markup(svg) for svg in s.svgs],  # built by tracediag with every label XML-escaped
        "tables_view": [
            (caption, table_view(rows, t0=t0, query=queries.get(caption))) for caption, rows in s.tables.items()
        ],
    }


def report_view(report) -> dict[str, Any]:
    """Everything the template prints, prepared."""
    d = report.to_dict()
    t0 = _trace_start(d["inputs"])
    by_rule = {c["rule"]: c for c in d["checks"]}
    views = {c["rule"]: check_view(c, t0) for c in d["checks"]}
    causes = [
        {"cause": views[cause["rule"]], "consequences": [views[k["rule"]] for k in consequences]}
        for cause, consequences in fold([c for c in d["checks"] if c["status"] == "finding"])
    ]
    sections = [_section_view(s, t0) for s in report.sections]
    walk = [
        {
            "step": step,
            "name": name,
            "checks": [views[c["rule"]] for c in d["checks"] if c["step"] == step],
            "sections": [s for s in sections if s["step"] == step and s["place"] == "walk"],
        }
        for step, name in WALK_STEPS.items()
    ]
    overview = [s for s in sections if s["place"] == "overview"]
    details = [s for s in sections if s["place"] == "walk" and s["tables_view"]]
    counts = {s: sum(1 for c in d["checks"] if c["status"] == s) for s in ("finding", "pass", "not_applicable")}
    model = d["model"]
    return {
        "generated": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "tool": d["tool"],
        "summary": _summary(d),
        "fitness": fitness_view(d.get("fitness")),
        "verdict": _verdict_view(d["verdict"], {r: c["title"] for r, c in by_rule.items()}),
        "cost_model": d["cost_model"],
        "causes": causes,
        "counts": counts,
        "walk": walk,
        "overview": overview,
        "details": details,
        "inputs": [
            {
                "path": ellipsize_path(str(i.get("path")), 80),
                "format": i.get("format"),
                "profiler": i.get("profiler"),
                "ranks": _ranks_text(i.get("ranks") or []) or "—",
                "rank_source": i.get("rank_source"),
                "world_size": i.get("world_size"),
                "backend": i.get("backend"),
                "device": i.get("device"),
                "counts": {k: units.number(v) for k, v in (i.get("counts") or {}).items()},
            }
            for i in d["inputs"]
        ],
        "t0": units.trace_us(t0) if t0 is not None else None,
        "tp": d["tp"],
        "model": model,
        "model_path": ellipsize_path(str(model.get("path")), 80)[0] if model else None,
        "model_view": [(label(k), value_text(k, v)) for k, v in model.items() if k not in ("notes", "path")]
        if model
        else [],
        "method_url": DOCS_URL + "method.md",
        "rules_url": DOCS_URL + "rules.md",
    }


def render_html(report) -> str:
    return environment().get_template("report.html").render(**report_view(report))


def fragment_view(d: dict[str, Any]) -> dict[str, Any]:
    """The verdict and the ranked findings of a findings.json document."""
    t0 = _trace_start(d.get("inputs") or [])
    titles = {c["rule"]: c["title"] for c in d["checks"]}
    from tracediag.findings import verdict as build_verdict

    rows = []
    for cause, consequences in fold([c for c in d["checks"] if c["status"] == "finding"]):
        for depth, c in [(0, cause), *((1, k) for k in consequences)]:
            view = check_view(c, t0)
            rows.append({"depth": depth, **view})
    return {
        "summary": _summary(d),
        "fitness": fitness_view(d.get("fitness")),
        "verdict": _verdict_view(d.get("verdict") or build_verdict(d["checks"], fitness=d.get("fitness")), titles),
        "rows": rows,
        "cost_model": d.get("cost_model") or {},
    }


def render_fragment(report_or_doc) -> str:
    """The verdict and the ranked findings as an HTML fragment with scoped styles (Jupyter `_repr_html_`)."""
    d = report_or_doc if isinstance(report_or_doc, dict) else report_or_doc.to_dict()
    return environment().get_template("fragment.html").render(**fragment_view(d))
