"""diff.json and diff.html (autoescaped, self-contained) from a `diff_runs` document."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
import orjson

from tracediag.measures import fmt_measure
from tracediag.reports.html import fmt

_ENV = jinja2.Environment(
    loader=jinja2.PackageLoader("tracediag.reports", "templates"),
    autoescape=True,  # kernel names, paths and titles are untrusted text
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)


def diff_json(d: dict[str, Any]) -> bytes:
    return orjson.dumps(d, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str) + b"\n"


def _chg(v: float | None, kind: str) -> dict[str, str]:
    """Display and CSS class of a change: 'rel' (%), 'share' (points), 'count'."""
    if v is None:
        return {"text": "—", "cls": ""}
    if kind == "rel":
        text = f"{v * 100:+.1f}%"
    elif kind == "share":
        text = f"{v * 100:+.1f} pts"
    else:
        text = f"{v:+g}"
    cls = "up" if v > 0 else "down" if v < 0 else ""
    return {"text": text, "cls": cls}


def _table(cols: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    return {"cols": cols, "rows": rows}


def render_diff_html(d: dict[str, Any]) -> str:
    ms = lambda v: fmt_measure(v, "ns")  # noqa: E731
    share = lambda v: fmt_measure(v, "share")  # noqa: E731
    byt = lambda v: fmt_measure(v, "bytes")  # noqa: E731
    tables = [
        (
            "Step time per phase and T bucket (median)",
            _table(
                ["phase", "T", "before", "after", "change", "steps before", "steps after"],
                [
                    [r["phase"], r["T_bucket"], ms(r["before_median_ns"]), ms(r["after_median_ns"]),
                     _chg(r["change"], "rel"), fmt(r["before_steps"]), fmt(r["after_steps"])]
                    for r in d["step_time"]
                ],
            ),
        ),
        (
            "Communication share of step time",
            _table(
                ["phase", "before", "after", "change"],
                [[r["phase"], share(r["before"]), share(r["after"]), _chg(r["change"], "share")]
                 for r in d["communication_share"]],
            ),
        ),
        (
            "Attention share of step time",
            _table(
                ["phase", "before", "after", "change"],
                [[r["phase"], share(r["before"]), share(r["after"]), _chg(r["change"], "share")]
                 for r in d["attention_share"]],
            ),
        ),
        (
            "Collectives per step (median calls)",
            _table(
                ["phase", "op", "before", "after", "change", "range before", "range after"],
                [[r["phase"], r["op"], fmt(r["before"]), fmt(r["after"]), _chg(r["change"], "count"),
                  fmt(r["before_range"]), fmt(r["after_range"])] for r in d["collectives_per_step"]],
            ),
        ),
        (
            "Payload per call, per op and dtype (mean bytes of this rank's input buffer)",
            _table(
                ["op, dtype", "calls before", "calls after", "before", "after", "change"],
                [[r["key"], fmt(r["before_calls"]), fmt(r["after_calls"]), byt(r["before_mean_bytes"]),
                  byt(r["after_mean_bytes"]), _chg(r["change"], "rel")]
                 for r in d["payload_per_call"] + d["payload_by_dtype"]],
            ),
        ),
        (
            "Kernel-family time",
            _table(
                ["class", "family", "before total", "after total", "before / step", "after / step",
                 "calls before", "calls after", "mean before", "mean after", "share before", "share after",
                 "change"],
                [[r["klass"], r["family"], ms(r["before_total_ns"]), ms(r["after_total_ns"]),
                  ms(r["before_per_step_ns"]), ms(r["after_per_step_ns"]), fmt(r["before_calls"]),
                  fmt(r["after_calls"]), ms(r["before_mean_ns"]), ms(r["after_mean_ns"]), share(r["before_share"]),
                  share(r["after_share"]),
                  _chg(r["change"], "rel") if r["change"] is not None else {"text": r["change_basis"], "cls": ""}]
                 for r in d["kernel_family_time"]],
            ),
        ),
        (
            "Dispatch per phase (family with the most time)",
            _table(
                ["group", "phase", "before", "after", "share before", "share after", "families before",
                 "families after"],
                [[r["group"], r["phase"], r["before"] or "—", r["after"] or "—", share(r["before_share"]),
                  share(r["after_share"]), fmt(r["before_families_ns"]), fmt(r["after_families_ns"])]
                 for r in d["dispatch"]],
            ),
        ),
    ]  # fmt: skip
    fd = d["findings"]
    sev = {
        "added": lambda f: ("—", f["severity"]),
        "removed": lambda f: (f["severity"], "—"),
        "changed": lambda f: (f["before_severity"], f["severity"]),
        "unchanged": lambda f: (f["severity"], f["severity"]),
    }
    finding_rows = [[kind, f["id"], *sev[kind](f), f["title"]] for kind in sev for f in fd[kind]]
    for _, t in tables:
        t["rows"] = [[c if isinstance(c, dict) else {"text": str(c), "cls": ""} for c in row] for row in t["rows"]]
    return _ENV.get_template("diff.html").render(
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        tool=d["tool"],
        before=d["before"],
        after=d["after"],
        headlines=d["headlines"],
        notes=d["notes"],
        tables=tables,
        findings=finding_rows,
    )


def write_diff(d: dict[str, Any], out_dir: Path) -> list[Path]:
    from tracediag.output import write_atomic

    out_dir = Path(out_dir)
    paths = [out_dir / "diff.json", out_dir / "diff.html"]
    write_atomic(paths[0], diff_json(d))
    write_atomic(paths[1], render_diff_html(d).encode("utf-8"))
    return paths
