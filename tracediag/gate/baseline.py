"""Baseline comparison: key measures of the run against the baseline's, each within its tolerance; a
regression beyond it is a finding (rule id `BASELINE`) with before, after, the change and example steps.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from tracediag.findings import Check
from tracediag.gate.config import CheckConfig, Tolerances
from tracediag.gate.outcome import BASELINE_RULE, Outcome, OutcomeStatus, at_or_above
from tracediag.measures import WHOLE_TRACE, fmt_measure, t_bucket
from tracediag.store.readback import open_read_back


@dataclass(frozen=True)
class KeyMeasure:
    key: str  # stable: "step_time[decode,T=2]"
    kind: str  # tolerance field name
    label: str  # in words
    value: float
    unit: str  # "ns", "share", "calls", "bytes"
    context: dict[str, Any]


KIND_LABEL = {
    "step_time": ("Step time", "ns", True, 6),
    "communication_share": ("Communication share of step time", "share", False, 3),
    "attention_share": ("Attention share of step time", "share", False, 5),
    "collectives_per_step": ("Collectives per step", "calls", False, 3),
    "payload_per_call": ("Payload per call", "bytes", True, 3),
}  # kind -> (label, unit, relative tolerance?, walk step)


def measure_label(kind: str, ctx: dict[str, Any]) -> str:
    phase = ctx.get("phase", "")
    if kind == "step_time":
        return f"{phase} step time ({ctx['T_bucket']}, median)"
    if kind in ("communication_share", "attention_share"):
        return f"{kind.split('_')[0]} share of {phase} step time"
    if kind == "collectives_per_step":
        op = "collective calls (all ops)" if ctx["op"] == "all" else f"{ctx['op']} calls"
        return f"{op} per {phase} step (median)"
    return f"{ctx['op']} payload per call (mean)"


def key_measures(m: dict[str, Any]) -> dict[str, KeyMeasure]:
    out: dict[str, KeyMeasure] = {}

    def add(kind: str, sub: str, value: Any, ctx: dict[str, Any]) -> None:
        if value is None:
            return
        _, unit, _, _ = KIND_LABEL[kind]
        out[f"{kind}[{sub}]"] = KeyMeasure(f"{kind}[{sub}]", kind, measure_label(kind, ctx), float(value), unit, ctx)

    for sub, s in m.get("step_time_ns", {}).items():
        add("step_time", sub, s["median"], {"phase": s["phase"], "T_bucket": s["T_bucket"], "steps": s["steps"]})
    for phase, s in m.get("communication_share", {}).items():
        add("communication_share", phase, s["value"], {"phase": phase, "steps": s["steps"]})
    for phase, s in m.get("attention_share", {}).items():
        add("attention_share", phase, s["value"], {"phase": phase})
    for sub, s in m.get("collectives_per_step", {}).items():
        add("collectives_per_step", sub, s["median"], {"phase": s["phase"], "op": s["op"], "steps": s["steps"]})
    for op, s in m.get("payload_per_call", {}).items():
        add("payload_per_call", op, s["mean_bytes"], {"op": op, "dtypes": s["dtypes"], "sized_calls": s["sized_calls"]})
    return out


@dataclass(frozen=True)
class MeasureChange:
    key: str
    kind: str
    label: str
    unit: str
    before: float | None
    after: float | None
    change: float | None  # relative (after/before − 1) or absolute (after − before), per kind
    relative: bool
    tolerance: float
    regressed: bool
    context: dict[str, Any]

    def words(self) -> str:
        b, a = fmt_measure(self.before, self.unit), fmt_measure(self.after, self.unit)
        if self.change is None:
            return f"{self.label}: {b} → {a}"
        if self.relative:
            ch, tol = f"{self.change * 100:+.1f}%", f"{self.tolerance * 100:g}%"
        elif self.unit == "share":
            ch, tol = f"{self.change * 100:+.1f} points", f"{self.tolerance * 100:g} points"
        else:
            ch, tol = f"{self.change:+g}", f"{self.tolerance:g}"
        return f"{self.label}: {b} → {a} ({ch}, tolerance {tol})"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def compare_measures(before: dict[str, Any], after: dict[str, Any], tol: Tolerances) -> list[MeasureChange]:
    """Every key measure of `after`, with the baseline's value and whether it regressed beyond tolerance."""
    b, a = key_measures(before), key_measures(after)
    out = []
    for key in sorted(set(a) | set(b)):
        ma, mb = a.get(key), b.get(key)
        m = ma or mb
        _, _, relative, _ = KIND_LABEL[m.kind]
        t = getattr(tol, m.kind)
        change = None
        if ma and mb:
            if relative:
                change = (ma.value / mb.value - 1) if mb.value else (0.0 if ma.value == 0 else None)
            else:
                change = ma.value - mb.value
        out.append(
            MeasureChange(
                key=key,
                kind=m.kind,
                label=m.label,
                unit=m.unit,
                before=mb.value if mb else None,
                after=ma.value if ma else None,
                change=change,
                relative=relative,
                tolerance=t,
                regressed=change is not None and change > t + 1e-12,
                context=m.context,
            )
        )
    return out


def _regression_evidence(con: duckdb.DuckDBPyConnection | None, ch: MeasureChange, limit: int) -> list[dict]:
    """Example steps (or calls) behind a regressed measure, so the report and trace can point at them."""
    if con is None:
        return []
    ctx = ch.context
    if ch.kind == "payload_per_call":
        return [
            {
                "rank": r[0],
                "step": r[1],
                "ts_ns": r[2],
                "dur_ns": r[3],
                "name": r[4],
                "payload_bytes": r[5],
                "dtype": r[6],
            }
            for r in con.execute(
                "SELECT rank, step_id, ts_ns, dur_ns, call_name, payload_bytes, dtype FROM collectives "
                "WHERE op = ? AND payload_bytes IS NOT NULL ORDER BY payload_bytes DESC, rank, ts_ns LIMIT ?",
                [ctx["op"], limit],
            ).fetchall()
        ]
    rows = con.execute(
        "SELECT rank, step_id, ts_ns, dur_ns, name, phase, T FROM steps "
        "WHERE coalesce(phase, 'unphased') = ? AND marker_source <> ? "
        "ORDER BY dur_ns DESC",
        [ctx["phase"], WHOLE_TRACE],
    ).fetchall()
    if ch.kind == "step_time":
        rows = [r for r in rows if t_bucket(r[6]) == ctx["T_bucket"]]
    return [
        {"rank": r[0], "step": r[1], "ts_ns": r[2], "dur_ns": r[3], "name": r[4], "phase": r[5], "T": r[6]}
        for r in rows[:limit]
    ]


def judge_baseline(
    changes: list[MeasureChange],
    cfg: CheckConfig,
    baseline_label: str,
    db_path: Path | None,
) -> list[Outcome]:
    con = open_read_back(db_path) if db_path and Path(db_path).is_file() else None  # data, not code
    out = []
    try:
        for ch in changes:
            name = ch.label
            if ch.before is None or ch.after is None:
                where = "the baseline" if ch.before is None else "this run"
                out.append(
                    Outcome(
                        "baseline", f"{BASELINE_RULE}:{ch.key}", BASELINE_RULE, None, name, "skipped", f"not in {where}"
                    )
                )
                continue
            if not ch.regressed:
                out.append(
                    Outcome("baseline", f"{BASELINE_RULE}:{ch.key}", BASELINE_RULE, None, name, "pass", ch.words())
                )
                continue
            _, unit, relative, step = KIND_LABEL[ch.kind]
            title = f"{ch.words()} — regressed against the baseline"
            chk = Check(
                rule=BASELINE_RULE,
                step=step,
                status="finding",
                title=title,
                severity=cfg.regression_severity,
                confidence="medium" if ch.kind == "step_time" else "high",
                impact=min(1.0, abs(ch.change)) if relative else min(1.0, abs(ch.change) / max(ch.before, 1.0)),
                formula="change = after / before − 1" if relative else "change = after − before",
                substituted=(
                    f"{ch.after:g} / {ch.before:g} − 1 = {ch.change:+.4f} > {ch.tolerance:g}"
                    if relative
                    else f"{ch.after:g} − {ch.before:g} = {ch.change:+g} > {ch.tolerance:g}"
                ),
                values={
                    "key": ch.key,
                    "measure": ch.label,
                    "unit": unit,
                    "before": ch.before,
                    "after": ch.after,
                    "change": ch.change,
                    "tolerance": ch.tolerance,
                    "baseline": baseline_label,
                    **{k: v for k, v in ch.context.items() if k not in ("phase", "op")},
                    **({"phase": ch.context["phase"]} if "phase" in ch.context else {}),
                    **({"op": ch.context["op"]} if "op" in ch.context else {}),
                },
                evidence=_regression_evidence(con, ch, cfg.settings.max_evidence),
                next_check=(
                    "Diff the two runs (tracediag diff BASELINE RUN) to see which kernel family, collective or "
                    "dispatch changed."
                ),
            ).to_dict()
            status: OutcomeStatus = "fail" if at_or_above(cfg.regression_severity, cfg.fail_on) else "finding"
            out.append(
                Outcome(
                    "baseline",
                    f"{BASELINE_RULE}:{ch.key}",
                    BASELINE_RULE,
                    step,
                    name,
                    status,
                    title,
                    cfg.regression_severity,
                    "new",
                    chk,
                )
            )
    finally:
        if con is not None:
            con.close()
    return out
