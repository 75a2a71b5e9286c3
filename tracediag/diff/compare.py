"""What changed between two runs: per-phase step time, shares, kernel-family time, collectives, payloads,
dispatch per phase and findings, with the headlines worth printing — once the runs' fingerprints say they
can be compared (diff/comparability.py); runs that cannot are described, not compared, unless forced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tracediag.diff.comparability import comparability
from tracediag.diff.efficiency import efficiency_diff
from tracediag.diff.fingerprint import fingerprint
from tracediag.diff.predictions import predictions
from tracediag.gate.outcome import finding_id
from tracediag.measures import fmt_measure
from tracediag.reports.html import fmt
from tracediag.reports.units import percent
from tracediag.runs import RunData
from tracediag.version import __version__

DIFF_SCHEMA_ID = "tracediag/diff-v1"


PHASE_ORDER = {"prefill": 0, "mixed": 1, "decode": 2, "unphased": 3, "outside steps": 4}


# Changes worth a headline (the tables hold everything).
HEADLINE_REL = 0.05  # step time, payload, family time: ±5 %


HEADLINE_SHARE = 0.02  # communication / attention share: ±2 points


HEADLINE_MIN_FAMILY_SHARE = 0.01  # families under 1 % of the time on both sides are not headlined


DISPATCH_MIN_SHARE = 0.05  # a family appearing/disappearing in a phase with less than 5 % is not a dispatch change


def _rel(before: float | None, after: float | None) -> float | None:
    if before is None or after is None:
        return None
    if before == 0:
        return 0.0 if after == 0 else None
    return after / before - 1


def _abs(before: float | None, after: float | None) -> float | None:
    return None if before is None or after is None else after - before


def _phase_key(phase: str) -> tuple:
    return (PHASE_ORDER.get(phase, 9), phase)


def _side(run: RunData) -> dict[str, Any]:
    d = run.doc
    model = d.get("model") or {}
    return {
        "path": run.label,
        "kind": run.kind,
        "measures_source": run.measures.get("source"),
        "time_basis": run.measures.get("time_basis"),
        "tp": d.get("tp"),
        "model": {k: model.get(k) for k in ("path", "L", "H", "H_kv", "dtype")} if model else None,
        "inputs": [{"path": i.get("path"), "format": i.get("format"), "ranks": i.get("ranks")} for i in d["inputs"]],
        "device": next((i.get("device") for i in d["inputs"] if i.get("device")), None),
        "findings": len(d.get("findings", [])),
    }


def _pairs(b: dict, a: dict, name: str, order: Callable[[str], Any] | None = None) -> list[tuple[str, Any, Any]]:
    """(key, before, after) for every key of measure `name` on either side (None where a side lacks it),
    sorted by `order` when one is given."""
    bs, as_ = b.get(name, {}), a.get(name, {})
    keys = set(bs) | set(as_)
    return [(key, bs.get(key), as_.get(key)) for key in (keys if order is None else sorted(keys, key=order))]


def _step_time(b: dict, a: dict) -> list[dict[str, Any]]:
    rows = []
    for _, x, y in _pairs(b, a, "step_time_ns"):
        m = x or y
        rows.append(
            {
                "phase": m["phase"],
                "T_bucket": m["T_bucket"],
                "before_median_ns": x and x["median"],
                "after_median_ns": y and y["median"],
                "change": _rel(x and x["median"], y and y["median"]),
                "before_steps": x and x["steps"],
                "after_steps": y and y["steps"],
            }
        )
    return sorted(rows, key=lambda r: (_phase_key(r["phase"]), r["T_bucket"]))


def _shares(b: dict, a: dict, name: str) -> list[dict[str, Any]]:
    rows = []
    for phase, x, y in _pairs(b, a, name, order=_phase_key):
        x, y = (x or {}).get("value"), (y or {}).get("value")
        rows.append({"phase": phase, "before": x, "after": y, "change": _abs(x, y)})
    return rows


def _collectives(b: dict, a: dict) -> list[dict[str, Any]]:
    rows = []
    for _, x, y in _pairs(b, a, "collectives_per_step"):
        m = x or y
        rows.append(
            {
                "phase": m["phase"],
                "op": m["op"],
                "before": x and x["median"],
                "after": y and y["median"],
                "change": _abs(x and x["median"], y and y["median"]),
                "before_range": x and [x["min"], x["max"]],
                "after_range": y and [y["min"], y["max"]],
            }
        )
    return sorted(rows, key=lambda r: (_phase_key(r["phase"]), r["op"] == "all", r["op"]))


def _payloads(b: dict, a: dict, name: str) -> list[dict[str, Any]]:
    rows = []
    for key, x, y in _pairs(b, a, name, order=str):  # by key text
        x, y = x or {}, y or {}
        rows.append(
            {
                "key": key,
                "before_calls": x.get("calls", 0),
                "after_calls": y.get("calls", 0),
                "before_mean_bytes": x.get("mean_bytes"),
                "after_mean_bytes": y.get("mean_bytes"),
                "change": _rel(x.get("mean_bytes"), y.get("mean_bytes")),
                "before_dtypes": x.get("dtypes", []),
                "after_dtypes": y.get("dtypes", []),
            }
        )
    return rows


def _basis(x: dict, y: dict) -> str:
    """What a family's time is compared on: per step when both windows hold marked steps (the work per step);
    else per call when the windows hold different call counts (a window that captured fewer calls is not less
    time per unit of work); else the totals."""
    if x.get("per_step_ns") is not None and y.get("per_step_ns") is not None:
        return "per_step_ns"
    if x.get("calls") and y.get("calls") and x["calls"] != y["calls"]:
        return "mean_ns"
    return "total_ns"


def _families(b: dict, a: dict) -> list[dict[str, Any]]:
    rows = []
    for _, x, y in _pairs(b, a, "kernel_family_time"):
        x, y = x or {}, y or {}
        m = x or y
        basis = _basis(x, y) if x and y else ("new" if y else "gone")
        rows.append(
            {
                "klass": m["klass"],
                "family": m["family"],
                "before_total_ns": x.get("total_ns"),
                "after_total_ns": y.get("total_ns"),
                "before_per_step_ns": x.get("per_step_ns"),
                "after_per_step_ns": y.get("per_step_ns"),
                "before_calls": x.get("calls"),
                "after_calls": y.get("calls"),
                "before_calls_per_step": x.get("calls_per_step"),
                "after_calls_per_step": y.get("calls_per_step"),
                "before_mean_ns": x.get("mean_ns"),
                "after_mean_ns": y.get("mean_ns"),
                "before_share": x.get("share"),
                "after_share": y.get("share"),
                "change": _rel(x.get(basis), y.get(basis)) if x and y else None,
                "change_basis": basis,
                "total_change": _rel(x.get("total_ns"), y.get("total_ns")) if x and y else None,
                "per_call_change": _rel(x.get("mean_ns"), y.get("mean_ns")) if x and y else None,
            }
        )
    return sorted(rows, key=lambda r: -max(r["before_total_ns"] or 0, r["after_total_ns"] or 0))


def _dispatch(b: dict, a: dict) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    bd, ad = b.get("dispatch", {}), a.get("dispatch", {})
    rows, changes = [], []
    for group in sorted(set(bd) | set(ad)):
        phases = set(bd.get(group, {})) | set(ad.get(group, {}))
        for phase in sorted(phases, key=_phase_key):
            x, y = bd.get(group, {}).get(phase), ad.get(group, {}).get(phase)
            row = {
                "group": group,
                "phase": phase,
                "before": x and x["family"],
                "after": y and y["family"],
                "before_share": x and x["share"],
                "after_share": y and y["share"],
                "before_families_ns": x and x["families_ns"],
                "after_families_ns": y and y["families_ns"],
            }
            rows.append(row)
            if x and y and x["family"] != y["family"]:
                changes.append(row | {"what": f"{group} ({phase}): {x['family']} → {y['family']}"})
            elif x and y:
                tb, ta = sum(x["families_ns"].values()) or 1, sum(y["families_ns"].values()) or 1
                for fam in sorted(set(x["families_ns"]) ^ set(y["families_ns"])):
                    share = (y["families_ns"].get(fam, 0) / ta) or (x["families_ns"].get(fam, 0) / tb)
                    if share >= DISPATCH_MIN_SHARE:
                        verb = "appears" if fam in y["families_ns"] else "disappears"
                        changes.append(row | {"what": f"{group} ({phase}): {fam} {verb} ({share * 100:.0f}% of time)"})
    return rows, changes


def _findings(before: dict, after: dict) -> dict[str, list[dict[str, Any]]]:
    """Findings added, removed, changed and unchanged between the runs.

    A finding that is gone is **fixed** only when the after run evaluated its rule (the rule passed, or found
    something else); when the rule was not applicable there, or not run, the finding is **no longer
    evaluated**: nothing says it went away. Likewise a new finding says whether its rule ran before.
    """

    def by_id(doc):
        return {finding_id(c): c for c in doc.get("checks", []) if c.get("status") == "finding"}

    def status_by_rule(doc):
        return {c["rule"]: c for c in doc.get("checks", [])}

    b, a = by_id(before), by_id(after)
    b_rules, a_rules = status_by_rule(before), status_by_rule(after)

    def brief(c):
        return {k: c.get(k) for k in ("rule", "severity", "title", "impact")} | {"id": finding_id(c)}

    def other_side(c, rules):
        o = rules.get(c["rule"])
        status = o["status"] if o else "not run"
        return {"status": status, "reason": o.get("reason") if o and status == "not_applicable" else None}

    changed = []
    for fid in sorted(set(a) & set(b)):
        x, y = b[fid], a[fid]
        if x.get("severity") != y.get("severity") or x.get("impact") != y.get("impact"):
            changed.append(
                brief(y)
                | {"before_severity": x.get("severity"), "before_impact": x.get("impact"), "before_title": x["title"]}
            )
    removed = []
    for f in sorted(set(b) - set(a)):
        side = other_side(b[f], a_rules)
        removed.append(brief(b[f]) | {"after_status": side["status"], "after_reason": side["reason"]})
    added = []
    for f in sorted(set(a) - set(b)):
        side = other_side(a[f], b_rules)
        added.append(brief(a[f]) | {"before_status": side["status"], "before_reason": side["reason"]})
    return {
        "added": added,
        "removed": removed,
        "fixed": [r for r in removed if r["after_status"] in ("pass", "finding")],
        "no_longer_evaluated": [r for r in removed if r["after_status"] not in ("pass", "finding")],
        "changed": changed,
        "unchanged": [brief(a[f]) for f in sorted(set(a) & set(b)) if f not in {c["id"] for c in changed}],
    }


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def headlines(d: dict[str, Any]) -> list[str]:
    """The changes worth reading first, each with its numbers; first what differs between the runs themselves."""
    out = []
    comp = d["comparability"]
    if comp["forced"]:
        out.append(f"compared anyway (--force-compare), although {comp['verdict']}")
    for x in comp["differences"]:
        if not x["invalidates"]:
            out.append(f"runs differ (does not invalidate the comparison): {x['what']}")
    for f in d["findings"]["added"]:
        ran = "" if f.get("before_status") in ("pass", "finding", None) else " (its rule did not run before)"
        out.append(f"finding added{ran}: {f['id']} ({f['severity']}) {f['title']}")
    for f in d["findings"]["fixed"]:
        how = "passes" if f["after_status"] == "pass" else "reports other findings"
        out.append(f"fixed: {f['id']} ({f['severity']}) {f['title']} — the rule ran after and {how}")
    for f in d["findings"]["no_longer_evaluated"]:
        why = f"not applicable: {f['after_reason']}" if f["after_reason"] else f["after_status"]
        out.append(f"no longer evaluated: {f['id']} ({f['severity']}) {f['title']} — after: {why}")
    for f in d["findings"]["changed"]:
        if f["before_severity"] != f["severity"]:
            what = f"{f['before_severity']} → {f['severity']}"
        else:
            what = f"{f['severity']}, impact {percent(f['before_impact'])} → {percent(f['impact'])}"
        out.append(f"finding changed: {f['id']} {what}: {f['title']}")
    for p in d["predictions"]:
        if p["status"] in ("within", "beyond", "confounded"):
            out.append(f"prediction checked: {p['text']}")
    for c in d["dispatch_changes"]:
        out.append(f"dispatch: {c['what']}")
    for r in d["collectives_per_step"]:
        if r["change"]:
            out.append(f"{r['op']} calls per {r['phase']} step: {r['before']:g} → {r['after']:g} ({r['change']:+g})")
    for r in d["payload_by_dtype"]:
        op, dtype = r["key"].split(",", 1)
        if not r["before_calls"] or not r["after_calls"]:
            out.append(
                f"{op} {dtype} calls: {r['before_calls']} → {r['after_calls']}"
                + (f" (mean {fmt_measure(r['after_mean_bytes'], 'bytes')})" if r["after_calls"] else "")
            )
    for r in d["payload_per_call"]:
        if r["change"] is not None and abs(r["change"]) >= HEADLINE_REL:
            out.append(
                f"{r['key']} payload per call: {fmt_measure(r['before_mean_bytes'], 'bytes')} → "
                f"{fmt_measure(r['after_mean_bytes'], 'bytes')} ({_pct(r['change'])}); dtypes "
                f"{', '.join(r['before_dtypes'])} → {', '.join(r['after_dtypes'])}"
            )
    for r in d["step_time"]:
        if r["change"] is not None and abs(r["change"]) >= HEADLINE_REL:
            out.append(
                f"{r['phase']} step time ({r['T_bucket']}, median): {fmt_measure(r['before_median_ns'], 'ns')} → "
                f"{fmt_measure(r['after_median_ns'], 'ns')} ({_pct(r['change'])})"
            )
    for name, label in (("communication_share", "communication share"), ("attention_share", "attention share")):
        for r in d[name]:
            if r["change"] is not None and abs(r["change"]) >= HEADLINE_SHARE:
                out.append(
                    f"{label} of {r['phase']} steps: {fmt_measure(r['before'], 'share')} → "
                    f"{fmt_measure(r['after'], 'share')} ({r['change'] * 100:+.1f} points)"
                )
    for r in d["kernel_family_time"]:
        line = _family_headline(r)
        if line:
            out.append(line)
    return out


FAMILY_REL = 2 * HEADLINE_REL  # a kernel family's time: ±10 %


def _family_headline(r: dict[str, Any]) -> str | None:
    """A family's change on its basis (per step, per call, total); a total that moved only because the windows
    captured another number of calls at the same time per call is said as such, not as a change of time."""
    if max(r["before_share"] or 0, r["after_share"] or 0) < HEADLINE_MIN_FAMILY_SHARE:
        return None
    name = f"{r['klass']}/{r['family']}"
    ms = lambda v: fmt_measure(v, "ns")  # noqa: E731
    if r["change_basis"] in ("new", "gone"):
        t = r["after_total_ns"] if r["change_basis"] == "new" else r["before_total_ns"]
        return f"{name} time: {r['change_basis']} ({ms(t)} in total)"
    calls = f"{fmt(r['before_calls'])} → {fmt(r['after_calls'])}"
    totals = f"total {ms(r['before_total_ns'])} → {ms(r['after_total_ns'])}"
    c = r["change"]
    if r["change_basis"] == "mean_ns":
        fewer = "fewer" if r["after_calls"] < r["before_calls"] else "more"
        if abs(c) < HEADLINE_REL:
            if abs(r["total_change"] or 0) < FAMILY_REL:
                return None
            return (
                f"{name}: {fewer} calls captured ({calls}) at the same {ms(r['before_mean_ns'])} per call "
                f"({ms(r['before_mean_ns'])} → {ms(r['after_mean_ns'])}, {_pct(c)}); {totals} "
                f"({_pct(r['total_change'])}) follows the call count, not the kernels"
            )
        if abs(c) < FAMILY_REL and abs(r["total_change"] or 0) < FAMILY_REL:
            return None
        return (
            f"{name} time per call: {ms(r['before_mean_ns'])} → {ms(r['after_mean_ns'])} ({_pct(c)}); {fewer} "
            f"calls captured ({calls}), {totals} ({_pct(r['total_change'])})"
        )
    if c is None or abs(c) < FAMILY_REL:
        return None
    basis = "per step" if r["change_basis"] == "per_step_ns" else "in total"
    per_step = ""
    if r["change_basis"] == "per_step_ns":
        per_step = f" ({fmt(r['before_calls_per_step'])} → {fmt(r['after_calls_per_step'])} per step)"
    return (
        f"{name} time {basis}: {ms(r['before_' + r['change_basis']])} → {ms(r['after_' + r['change_basis']])} "
        f"({_pct(c)}); {calls} calls{per_step}, mean {ms(r['before_mean_ns'])} → {ms(r['after_mean_ns'])} per call"
    )


STORE_MEASURES = ("kernel_family_time", "dispatch", "attention_share")


COMPARED = ("step_time", "communication_share", "attention_share", "kernel_family_time", "collectives_per_step",
            "payload_per_call", "payload_by_dtype", "dispatch", "dispatch_changes", "predictions")  # fmt: skip
FINDING_CHANGES = ("added", "removed", "fixed", "no_longer_evaluated", "changed", "unchanged")


def _not_compared(comp: dict[str, Any]) -> dict[str, Any]:
    """The comparison sections of runs that cannot be compared: empty, with the reason as the note."""
    return {k: [] for k in COMPARED} | {
        "findings": {k: [] for k in FINDING_CHANGES},
        "notes": [f"{comp['verdict']}: no change is reported (diff --force-compare compares them anyway)"],
        "headlines": [],
    }


def diff_runs(before: RunData, after: RunData, force_compare: bool = False) -> dict[str, Any]:
    """The diff document (diff.json): both runs, their fingerprints and comparability verdict, and — when they
    can be compared, or `force_compare` — what changed."""
    fps = {"before": fingerprint(before), "after": fingerprint(after)}
    comp = comparability(fps["before"], fps["after"], force=force_compare)
    head = {
        "schema": DIFF_SCHEMA_ID,
        "tool": {"name": "tracediag", "version": __version__},
        "before": _side(before),
        "after": _side(after),
        "comparability": comp,
        "fingerprints": fps,
    }
    head["efficiency"] = efficiency_diff(before, after, comp, force=force_compare)
    if not comp["comparable"] and not force_compare:
        return head | _not_compared(comp)
    b, a = dict(before.measures), dict(after.measures)
    notes = []
    missing = [r.label for r in (before, after) if "kernel_family_time" not in r.measures]
    if missing:
        # Comparing with nothing would call every family "new": leave these out and say why.
        for m in (a, b):
            for k in STORE_MEASURES:
                m.pop(k, None)
        notes.append(
            "kernel-family time, dispatch and attention share need the store (trace.duckdb beside "
            f"findings.json, or the traces): not available for {', '.join(missing)}"
        )
    dispatch, dispatch_changes = _dispatch(b, a)
    d = head | {
        "step_time": _step_time(b, a),
        "communication_share": _shares(b, a, "communication_share"),
        "attention_share": _shares(b, a, "attention_share"),
        "kernel_family_time": _families(b, a),
        "collectives_per_step": _collectives(b, a),
        "payload_per_call": _payloads(b, a, "payload_per_call"),
        "payload_by_dtype": _payloads(b, a, "payload_by_dtype"),
        "dispatch": dispatch,
        "dispatch_changes": dispatch_changes,
        "findings": _findings(before.doc, after.doc),
        "predictions": predictions(before, after, marked_steps=all(f["step_shapes"] for f in fps.values())),
        "notes": notes,
    }
    d["headlines"] = headlines(d)
    return d
