"""diff.json and diff.html (autoescaped, self-contained) from a `diff_runs` document."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from markupsafe import Markup

from tracediag.diff.compare import HEADLINE_REL
from tracediag.reports import svg, units
from tracediag.reports.html import fmt
from tracediag.reports.templating import environment


def diff_json(d: dict[str, Any]) -> bytes:
    return orjson.dumps(d, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str) + b"\n"


def _chg(v: float | None, kind: str, noise: float = 0.0) -> dict[str, str]:
    """Display and CSS class of a change: 'rel' (%), 'share' (points), 'count', 'roofline' (points of % of
    roofline: up is better). A change within `noise` is not coloured."""
    if v is None:
        return {"text": "—", "cls": ""}
    if kind == "rel":
        text = f"{v * 100:+.1f}%"
    elif kind == "share":
        text = f"{v * 100:+.1f} pts"
    elif kind == "roofline":
        text = f"{v:+.1f} pts"
    else:
        text = f"{v:+g}"
    if abs(v) <= noise:
        return {"text": text, "cls": ""}
    if kind == "roofline":
        return {"text": text, "cls": "better" if v > 0 else "worse"}
    cls = "up" if v > 0 else "down" if v < 0 else ""
    return {"text": text, "cls": cls}


def _table(cols: list[str], rows: list[list[Any]]) -> dict[str, Any]:
    return {"cols": cols, "rows": rows}


TOP_FAMILIES = 10  # kernel families drawn in the before/after chart (by the larger of the two totals)


def charts(d: dict[str, Any]) -> list[str]:
    """Before/after bars: step time per phase and T bucket, communication and attention share, collectives per
    step, and the kernel families with the most time."""
    out = [
        svg.paired_bars(
            "Median step time per phase and T bucket",
            [(f"{r['phase']} {r['T_bucket']}", r["before_median_ns"], r["after_median_ns"]) for r in d["step_time"]],
            vfmt=units.duration,
        ),
        svg.paired_bars(
            "Share of step time in collectives and in attention",
            [(f"communication, {r['phase']}", r["before"], r["after"]) for r in d["communication_share"]]
            + [(f"attention, {r['phase']}", r["before"], r["after"]) for r in d["attention_share"]],
            vfmt=units.percent,
        ),
        svg.paired_bars(
            "Collective calls per step (median)",
            [(f"{r['op']}, {r['phase']}", r["before"], r["after"]) for r in d["collectives_per_step"]],
            vfmt=svg.plain,
        ),
    ]
    fams = sorted(d["kernel_family_time"], key=lambda r: -max(r["before_total_ns"] or 0, r["after_total_ns"] or 0))[
        :TOP_FAMILIES
    ]
    out.append(
        svg.paired_bars(
            f"Kernel-family time in total (top {len(fams)})",
            [(f"{r['klass']}/{r['family']}", r["before_total_ns"], r["after_total_ns"]) for r in fams],
            vfmt=units.duration,
        )
    )
    return [c for c in out if c]


def _model_text(m: dict[str, Any]) -> str:
    dims = " ".join(f"{k}={m[k]}" for k in ("L", "H", "I", "h", "H_kv", "D") if m.get(k) is not None)
    return f"{m.get('architecture') or 'model'} {dims} {m.get('dtype') or ''} (config hash {m['config_hash']})"


def _layout_text(x: dict[str, Any]) -> str:
    groups = ", ".join(f"{k}={v}" for k, v in x["groups"].items() if k != "TP")
    world = f" of world size {x['world_size']}" if x.get("world_size") else ""
    return (
        f"TP={x['tp'] if x['tp'] is not None else '?'}"
        + (f", {groups}" if groups else "")
        + (f"; {x['ranks']} rank file(s){world}")
    )


def _shapes_text(x: dict[str, Any]) -> str:
    return (
        ", ".join(
            f"{p} {share * 100:.0f}% (median T {fmt(x['T_median'].get(p))})" for p, share in x["phase_mix"].items()
        )
        + f" of {x['steps']} steps"
    )


def _workload_text(x: dict[str, Any]) -> str:
    if x["source"] == "benchmark results":
        runs = []
        for r in x["runs"]:
            rate = r["request_rate_rps"]
            rate_text = "—" if rate is None else ("inf" if rate == float("inf") else f"{rate:g}")
            cap = r["max_concurrency"] if r["max_concurrency"] is not None else "no cap"
            runs.append(
                f"{rate_text} req/s, concurrency {cap}, {fmt(r['num_prompts'])} requests, mean input "
                f"{fmt(r['mean_input_len'])} / output {fmt(r['mean_output_len'])} tokens"
            )
        return "benchmark: " + "; ".join(runs)
    return (
        f"stats lines: median running {fmt(x['running_median'])}, waiting {fmt(x['waiting_median'])}, "
        f"generation {fmt(x['gen_tput_tok_s_mean'])} tokens/s"
    )


def _fitness_text(x: dict[str, Any]) -> str:
    reason = x.get("reason") or ""
    if reason.startswith(f"{x['status']}:"):  # fitness.why opens with its class
        return reason
    return f"{x['status']}" + (f": {reason}" if reason else "")


FINGERPRINT_ROWS = (
    ("model", "model", _model_text),
    ("layout", "parallel layout", _layout_text),
    ("gpu", "GPU", lambda x: ", ".join(x)),
    ("engine", "engine", lambda x: f"{x['name']} {x['version'] or ''} ({x['source']})"),
    ("step_shapes", "step shapes", _shapes_text),
    ("workload", "serving load", _workload_text),
    ("fitness", "trace fitness", lambda x: _fitness_text(x)),
)


def fingerprint_rows(d: dict[str, Any]) -> list[list[str]]:
    """[aspect, before, after, verdict] per fingerprint aspect; the verdict says why an aspect was not checked."""
    comp, fps = d["comparability"], d["fingerprints"]
    status = {a["aspect"]: a for a in comp.get("aspects") or []}
    rows = []
    for key, label, text in FINGERPRINT_ROWS:
        b, a = fps["before"].get(key), fps["after"].get(key)
        s = status.get(key) or {"status": "not checked" if b is None or a is None else "same", "why": None}
        word = {"differs": "differs (comparable)"}.get(s["status"], s["status"])
        verdict = f"{word}: {s['why']}" if s.get("why") else word
        rows.append([label, "—" if b is None else text(b), "—" if a is None else text(a), verdict])
    return rows


def _efficiency_table(e: dict[str, Any]) -> dict[str, Any]:
    pct = lambda v: "—" if v is None else f"{v:.1f}%"  # noqa: E731
    return _table(
        ["op", "phase", "before % of roofline", "after % of roofline", "change", "kernel time before",
         "kernel time after", "shapes before", "shapes after", "in common", "no roofline because"],
        [[r["op"], r["phase"], pct(r["before_pct"]), pct(r["after_pct"]), _chg(r["change_points"], "roofline"),
          units.duration(r["before_kernel_ns"]), units.duration(r["after_kernel_ns"]), fmt(r["before_shapes"]),
          fmt(r["after_shapes"]), fmt(r["common_shapes"]), {"text": r["why_none"] or "", "cls": "text"}]
         for r in e.get("rows") or []],
    )  # fmt: skip


# what a kernel family's change is computed on (diff.compare._basis)
BASIS_WORDS = {"per_step_ns": "per step", "mean_ns": "per call (calls captured differ)", "total_ns": "total"}

_CHANGE_WORDS = {
    "added": "new",
    "fixed": "fixed",
    "no_longer_evaluated": "no longer evaluated",
    "changed": "changed",
    "unchanged": "unchanged",
}


def _comparison_tables(d: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The report's before/after tables (step time, shares, collectives, payloads, kernel families, dispatch),
    each (title, table) with its cells formatted and the changes classed."""
    ms = units.duration
    share = units.percent
    byt = units.size
    return [
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
                 "compared", "change"],
                [[r["klass"], r["family"], ms(r["before_total_ns"]), ms(r["after_total_ns"]),
                  ms(r["before_per_step_ns"]), ms(r["after_per_step_ns"]), fmt(r["before_calls"]),
                  fmt(r["after_calls"]), ms(r["before_mean_ns"]), ms(r["after_mean_ns"]), share(r["before_share"]),
                  share(r["after_share"]), BASIS_WORDS.get(r["change_basis"], r["change_basis"]),
                  _chg(r["change"], "rel", noise=HEADLINE_REL) if r["change"] is not None
                  else {"text": r["change_basis"], "cls": ""}]
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


def _finding_rows(fd: dict[str, list[dict[str, Any]]]) -> list[list[Any]]:
    """One row per finding that was added, fixed, changed, no longer evaluated or unchanged: its severity before
    and after, its title and what the change means."""
    sev = {
        "added": lambda f: ("—", f["severity"]),
        "fixed": lambda f: (f["severity"], "—"),
        "no_longer_evaluated": lambda f: (f["severity"], "—"),
        "changed": lambda f: (f["before_severity"], f["severity"]),
        "unchanged": lambda f: (f["severity"], f["severity"]),
    }

    def note(kind: str, f: dict[str, Any]) -> str:
        if kind == "fixed":
            return "the rule ran after and " + ("passed" if f["after_status"] == "pass" else "found other things")
        if kind == "no_longer_evaluated":
            reason = f["after_reason"]
            return f"after: not applicable — {reason}" if reason else f"after: {f['after_status']}"
        if kind == "added" and f.get("before_status") not in ("pass", "finding", None):
            return "its rule did not run before" + (f" ({f['before_reason']})" if f.get("before_reason") else "")
        return ""

    return [
        [_CHANGE_WORDS[kind], f["id"], *sev[kind](f), f["title"], note(kind, f)]
        for kind in sev
        for f in fd.get(kind, [])
    ]


def render_diff_html(d: dict[str, Any]) -> str:
    tables = _comparison_tables(d)
    efficiency = _efficiency_table(d.get("efficiency") or {})
    finding_rows = _finding_rows(d["findings"])
    for _, t in [*tables, ("efficiency", efficiency)]:
        t["rows"] = [[c if isinstance(c, dict) else {"text": str(c), "cls": ""} for c in row] for row in t["rows"]]
    template = environment().get_template("diff.html")
    return template.render(
        generated=datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        tool=d["tool"],
        before=d["before"],
        after=d["after"],
        headlines=d["headlines"],
        notes=d["notes"],
        comparability=d["comparability"],
        fingerprint=fingerprint_rows(d),
        compared=d["comparability"]["comparable"] or d["comparability"]["forced"],
        tables=tables,
        efficiency=d.get("efficiency"),
        efficiency_table=efficiency,
        findings=finding_rows,
        predictions=d.get("predictions") or [],
        charts=[Markup(c) for c in charts(d)],  # built by tracediag with every label XML-escaped
    )


def terminal_lines(d: dict[str, Any]) -> list[str]:
    """The terminal summary of a diff, one line per headline (CI logs: never wrapped)."""
    comp = d["comparability"]
    lines = [
        f"tracediag diff: {d['before']['path']} → {d['after']['path']}",
        f"  {comp.get('summary') or comp['verdict']}",
    ]
    if not comp["comparable"] and not comp["forced"]:
        body = ["no change is reported (pass --force-compare to compare anyway)"]
    else:
        body = d["headlines"] or ["no change beyond the thresholds (see the tables)"]
    eff = d.get("efficiency") or {}
    if eff.get("rows") and not (comp["comparable"] or comp["forced"]):
        body.append(f"per-op efficiency, comparable across GPUs: {eff['basis']}")
    if eff.get("rows"):
        body += eff["headlines"]
    elif eff.get("note"):
        body.append(eff["note"])
    return lines + [f"  {line}" for line in body]


def write_diff(d: dict[str, Any], out_dir: Path) -> list[Path]:
    from tracediag.files import write_atomic

    out_dir = Path(out_dir)
    paths = [out_dir / "diff.json", out_dir / "diff.html"]
    write_atomic(paths[0], diff_json(d))
    write_atomic(paths[1], render_diff_html(d).encode("utf-8"))
    return paths
