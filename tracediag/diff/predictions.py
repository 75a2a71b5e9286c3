"""Predictions checked: where a rule of the earlier run printed what a change would buy, the later run's diff puts
the predicted and the measured change side by side and says whether the measurement is within the prediction —
or that the model was wrong, and where to look.

- KRN002 (Amdahl): only attention changes, so a step becomes `step − attention + attention'`; the step speed-up is
  `1 / ((1 − f) + f/s)` with `f` = attention / step of the earlier run and `s` the attention speed-up measured.
  Within: the later step is within 10 % of the earlier step of that prediction; confounded: the rest of the step
  changed more than attention did, so the prediction cannot be told apart.
- KRN004 (4-bit weights): decode reads shrink `S_read = (W + B·K) / (W4 + B·K)`, an upper bound on the decode step's
  speed-up. Exercised when the later run reads about the 4-bit weights (its W nearer the earlier W4 than the
  earlier W); within: the measured decode step speed-up (medians) is at most `S_read` (+10 %).

Both rest on step times, so they are not checked on windows without step markers (a window is not a step). The
other rules that price a fix (KRN005's floor, KRN012's buyable time) are named as not checked.
- COL003 (TP=1 projection): a TP=p step costs `2L·α − c(1 − 1/p) − den·T` more than at TP=1, so a later run at
  TP=1 is predicted at the earlier step minus that. Within: 10 % of the earlier step; else the model was wrong, and
  the diff says by how much and where to look (the collectives' measured share against 2L·α, the estimated a).
"""

from __future__ import annotations

from typing import Any

from tracediag.measures import fmt_measure
from tracediag.runs import RunData

PREDICTION_TOL = 0.10  # a measurement within 10 % (of the earlier step) of the prediction is "within" it
UNCHANGED = 0.05  # attention per step within 5 %: the prediction is not exercised
NOT_CHECKED = {
    "KRN005": "its decode floor is not checked by diff yet (it needs the same model, GPU and bandwidth on both)",
    "KRN012": "its buyable time is not checked by diff yet",
}


def _ms(v: float) -> str:
    return fmt_measure(v, "ns")


def _signed(v: float) -> str:
    return ("+" if v > 0 else "−") + _ms(abs(v))


def _predicting(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Checks that ran (finding or pass) with their values, by rule."""
    return {c["rule"]: c for c in doc.get("checks") or [] if c.get("status") in ("finding", "pass") and c.get("values")}


def _row(rule: str, phase: str | None, status: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"rule": rule, "phase": phase, "status": status, "text": text} | extra


def _krn002(b: dict[str, Any], a: dict[str, Any]) -> list[dict[str, Any]]:
    bt = {t["phase"]: t for t in b.get("table") or []}
    at = {t["phase"]: t for t in a.get("table") or []}
    rows = []
    for phase in [p for p in bt if p in at]:
        x, y = bt[phase], at[phase]
        if not (x.get("steps") and y.get("steps") and x.get("attention_ns") and y.get("attention_ns")):
            continue
        att_b, att_a = x["attention_ns"] / x["steps"], y["attention_ns"] / y["steps"]
        step_b, step_a = x["step_ns"] / x["steps"], y["step_ns"] / y["steps"]
        f, s = att_b / step_b, att_b / att_a
        attention = f"attention per {phase} step {_ms(att_b)} → {_ms(att_a)}"
        if abs(att_a / att_b - 1) < UNCHANGED:
            bound = f"≤ {x.get('speedup_bound_s2', 0):.3f}× for a 2× faster kernel"
            text = f"KRN002 ({phase}): {attention}: unchanged, so its Amdahl bound ({bound}) is not tested"
            rows.append(_row("KRN002", phase, "not exercised", text))
            continue
        predicted = step_b - att_b + att_a  # Amdahl: the rest of the step unchanged
        other = step_a - predicted  # what the rest of the step did
        how = f"{s:.2f}× faster" if s >= 1 else f"{1 / s:.2f}× slower"
        head = (
            f"KRN002 ({phase}, means per step): {attention} ({how}); Amdahl with f = {f:.1%} predicts a step of "
            f"{_ms(predicted)} ({step_b / predicted:.3f}×), measured {_ms(step_b)} → {_ms(step_a)} "
            f"({step_b / step_a:.3f}×)"
        )
        if abs(other) <= PREDICTION_TOL * step_b:
            status, verdict = "within", f"within {PREDICTION_TOL:.0%} of the prediction"
        elif abs(other) > abs(att_a - att_b):
            status = "confounded"
            verdict = (
                f"other work changed more than attention ({_signed(other)} against {_signed(att_a - att_b)} per "
                "step): the prediction cannot be told apart — look at the kernel-family time"
            )
        else:
            status = "beyond"
            verdict = (
                f"beyond the prediction by {_signed(other)} per step: the step did not follow its attention — "
                "attention is not all on the step's critical path as f assumes (overlap), or other work moved with it"
            )
        rows.append(
            _row(
                "KRN002",
                phase,
                status,
                f"{head}: {verdict}",
                formula="step' = step − attention + attention' ⇔ speed-up 1 / ((1 − f) + f/s)",
                predicted={"step_ns": predicted, "speedup": step_b / predicted, "f": f, "s": s},
                measured={"step_ns_before": step_b, "step_ns_after": step_a, "speedup": step_b / step_a},
            )
        )
    return rows


def _decode_median(run: RunData) -> float | None:
    return ((run.measures.get("phase_step_ns") or {}).get("decode") or {}).get("median")


def _krn004(b: dict[str, Any], a: dict[str, Any], before: RunData, after: RunData) -> list[dict[str, Any]]:
    vb, va = b["values"], a["values"]
    wb, w4, sr, wa = vb.get("W_bytes"), vb.get("W4_bytes"), vb.get("S_read_median"), va.get("W_bytes")
    if not (wb and w4 and sr and wa) or vb.get("verdict") == "already_4bit":
        return []
    reads = f"weights read per decode step {wb:,} → {wa:,} B (4-bit priced at {w4:,} B)"
    if abs(wa - w4) >= abs(wa - wb):
        why = f"the later run does not read 4-bit weights ({va.get('W_counted_as')}), so its {sr:.2f}× is not tested"
        return [_row("KRN004", "decode", "not exercised", f"KRN004 (decode): {reads}: {why}")]
    db, da = _decode_median(before), _decode_median(after)
    if not db or not da:
        return [_row("KRN004", "decode", "not checked", f"KRN004 (decode): {reads}, but a side has no decode steps")]
    measured = db / da
    within = measured <= sr * (1 + PREDICTION_TOL)
    head = (
        f"KRN004 (decode): {reads}; it predicted decode reads {sr:.2f}× smaller, at most that speed-up; measured "
        f"decode step (median) {_ms(db)} → {_ms(da)} ({measured:.2f}×)"
    )
    if within:
        far = " (far below it: the decode step is not bound by reading weights here; see KRN005)"
        verdict = "within the prediction" + (far if measured < sr / 2 else "")
    else:
        verdict = (
            "faster than the reads allow: other work changed too, or the byte model overcounts the earlier run's "
            "weights — look at KRN004's values.weight_groups"
        )
    return [
        _row(
            "KRN004",
            "decode",
            "within" if within else "beyond",
            f"{head}: {verdict}",
            formula="S_read = (W + B·K) / (W4 + B·K) ≥ decode step speed-up",
            predicted={"speedup_at_most": sr, "W4_bytes": w4},
            measured={"W_bytes_after": wa, "step_ns_before": db, "step_ns_after": da, "speedup": measured},
        )
    ]


def _tp(run: RunData) -> int | None:
    tp = run.doc.get("tp")
    return tp.get("p") if isinstance(tp, dict) else tp


def _col003(b: dict[str, Any], before: RunData, after: RunData) -> list[dict[str, Any]]:
    """COL003's TP=1 projection: at TP=p a step costs 2L·α − c(1 − 1/p) − den·T more than at TP=1 (the per-token
    model with the GEMM's fixed part c), so the TP=1 step is predicted at step_p − that."""
    v = b["values"]
    need = ("alpha_us", "calls_per_step", "c_saved_by_tp_ms_per_step", "breakeven_denominator_s", "median_T", "p")
    if any(v.get(k) is None for k in need):
        return []
    phase = v.get("steps_compared") or "decode"
    p_after = _tp(after)
    if p_after != 1:
        why = f"the later run is at TP={p_after}, so its TP=1 projection is not tested"
        return [_row("COL003", phase, "not exercised", f"COL003 ({phase}): {why}")]
    sb = ((before.measures.get("phase_step_ns") or {}).get(phase) or {}).get("median")
    sa = ((after.measures.get("phase_step_ns") or {}).get(phase) or {}).get("median")
    if not sb or not sa:
        return [_row("COL003", phase, "not checked", f"COL003 ({phase}): a side has no {phase} steps")]
    comm = v["calls_per_step"] * v["alpha_us"] * 1e3  # 2L·α, ns per step
    extra = comm - v["c_saved_by_tp_ms_per_step"] * 1e6 - v["breakeven_denominator_s"] * 1e9 * v["median_T"]
    predicted = sb - extra
    other = sa - predicted
    head = (
        f"COL003 ({phase}): TP={v['p']} → 1; it predicted a TP=1 step of {_ms(predicted)} ({_ms(sb)} − (2L·α "
        f"{_ms(comm)} − c(1 − 1/p) {_ms(v['c_saved_by_tp_ms_per_step'] * 1e6)} − den·T)), measured {_ms(sa)} (median)"
    )
    if abs(other) <= PREDICTION_TOL * sb:
        status, verdict = "within", f"within {PREDICTION_TOL:.0%} of the prediction"
    else:
        status = "beyond"
        share = ((before.measures.get("communication_share") or {}).get(phase) or {}).get("value")
        measured = f"; the collectives took {share:.1%} of the TP={v['p']} step" if share is not None else ""
        verdict = (
            f"the model was wrong by {_signed(other)} per step{measured} against 2L·α = {_ms(comm)} in the model "
            f"(α = {v['alpha_us']:g} µs, the median call time): look at the collective time per step and its "
            "waiting (COL005), and at a"
            + (" (estimated: pass the TP=1 run as --tp1-baseline)" if v.get("a_is_estimate") else "")
        )
    return [
        _row(
            "COL003",
            phase,
            status,
            f"{head}: {verdict}",
            formula="step_1 = step_p − (2L·α − c(1 − 1/p) − den·T)",
            predicted={"step_ns": predicted, "saving_ns": extra},
            measured={"step_ns_before": sb, "step_ns_after": sa},
        )
    ]


def predictions(before: RunData, after: RunData, marked_steps: bool) -> list[dict[str, Any]]:
    """[{rule, phase, status, text, formula?, predicted?, measured?}] for every prediction the earlier run printed;
    status: within, beyond, confounded (other work changed more than what the prediction is about), not exercised
    (what it is about did not change), not checked."""
    b, a = _predicting(before.doc), _predicting(after.doc)
    out: list[dict[str, Any]] = []
    for rule in ("KRN002", "KRN004", "COL003"):
        if rule not in b:
            continue
        if rule not in a and rule != "COL003":  # COL003 cannot run at TP=1, where its projection is checked
            out.append(_row(rule, None, "not checked", f"{rule}: its rule did not run on the later run"))
        elif not marked_steps:
            out.append(
                _row(rule, None, "not checked", f"{rule}: no step markers on both runs (a window is not a step)")
            )
        elif rule == "KRN002":
            out += _krn002(b[rule], a[rule])
        elif rule == "KRN004":
            out += _krn004(b[rule], a[rule], before, after)
        else:
            out += _col003(b[rule], before, after)
    for rule, why in NOT_CHECKED.items():
        if rule in b and b[rule]["status"] == "finding":
            out.append(_row(rule, None, "not checked", f"{rule}: {why}"))
    return out
