"""SCH003 Queue growth.

Hypothesis: when requests arrive faster than the engine completes them, no stable queue exists: the
number of waiting requests (and their queue time) rises for as long as the load lasts. Tuning kernels
does not fix that; lowering the arrival rate or adding replicas does.

Formula: Mann-Kendall trend test of the Waiting series over the window, one-sided for an increase,
significance level α = 0.05: S = Σ_{i<j} sign(w_j − w_i), computed in O(n log n); p = P(S' ≥ S) under
"no trend" (exact permutation distribution for n ≤ 10 without ties or n ≤ 7 with ties, else the
tie-corrected normal approximation); slope = Theil-Sen median pairwise slope (requests/s; over all pairs up
to 200,000 pairs, else the median of 200,000 seeded random pairs, said so in the table). A finding needs
p < α and slope > 0 — a trend over the window, not one large sample — and a rise that matters: the Sen rise over the
window (slope × window) above max(2 requests, 10 % of the median running batch) for request counts; one request
stuck in the queue (0 → 1) is SCH011's, not growth. At least 4 samples per series; each server run of a log is its
own window (a restart empties the queue). Engines print whole seconds: the samples of one printed second (SGLang
logs a batch line every few steps) are ordered by their position in the file, the j-th of m at s + j/m. A queue
that stayed 0 is a pass however few samples show it.

Evidence: per series (a log's stats lines of one engine: V0 Pending, V1 Waiting; or the
vllm:num_requests_waiting gauge of timed scrapes; and the mean queue time per scrape interval from the
vllm:request_queue_time_seconds histogram): n, window, first/last/max waiting, S, p, Sen and
least-squares slopes; example lines at the start, peak and end.

What to do: compare the arrival rate with the completion rate; lower the request rate, add replicas or
shed load before tuning kernels, then re-measure inside a window where the queue is stable.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracediag.analyses.serving import (
    MIN_TREND_POINTS,
    SIGNIFICANCE,
    Series,
    log_series,
    metric_series,
    series_evidence,
)
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model.servingmath import Trend, mann_kendall, queue_rise_threshold, spread_ties

RULE = RuleMeta(
    id="SCH003",
    step=6,
    title="Waiting requests and queue time are not rising over the window",
    may_be_downstream_of=("SCH009", "SCH011", "SCH013"),
    enabled_by=("--log", "--metrics"),
)
FORMULA = (
    "Mann-Kendall S = Σ_{i<j} sign(w_j − w_i); finding when p(S' ≥ S) < α = 0.05, Sen slope > 0 and "
    "rise = slope·window > max(2, 0.1·median running)"
)


def _queue_time_series(ctx: Context) -> list[Series]:
    """Mean queue time per scrape interval: Δsum / Δcount of the queue-time histogram, in seconds."""
    sums = {(s.input_id, s.engine): s for s in metric_series(ctx, "queue_time_seconds", "sum")}
    out = []
    for s_cnt in metric_series(ctx, "queue_time_seconds", "count"):
        s_sum = sums.get((s_cnt.input_id, s_cnt.engine))
        if s_sum is None or len(s_sum) != len(s_cnt) or len(s_cnt) < 2:
            continue
        dn = np.diff(np.nan_to_num(s_cnt.v.astype(float)))
        ds = np.diff(np.nan_to_num(s_sum.v.astype(float)))
        keep = np.nonzero((dn > 0) & ~np.isnan(s_cnt.t[1:].astype(float)))[0] + 1
        if len(keep):
            cols = {k: a[keep] for k, a in s_cnt.cols.items()}
            cols["value"] = ds[keep - 1] / dn[keep - 1]
            out.append(Series("metrics", s_cnt.input_id, s_cnt.path, s_cnt.engine, None, cols))
    return out


def _slope(v: float | None) -> str:
    return "undefined (all samples at one time)" if v is None else f"{v:+.3g}/s"


def _ends(s: Series) -> list[int]:
    idx = s.valid()
    return [int(idx[0]), int(idx[-1])] if len(idx) else []


def _row(s: Series, what: str, t: Trend | None, xs: list[float], ys: list[float]) -> dict:
    return {
        "series": s.label,
        "source": "log stats lines" if s.source == "log" else "metrics scrapes",
        "quantity": what,
        "n": len(ys),
        "window_s": round(xs[-1] - xs[0], 3) if xs else None,
        "first": ys[0] if ys else None,
        "last": ys[-1] if ys else None,
        "max": max(ys) if ys else None,
        "S": t.s if t else None,
        "p_increase": round(t.p_increase, 6) if t else None,
        "p_decrease": round(t.p_decrease, 6) if t else None,
        "test": f"Mann-Kendall ({t.method})" if t else f"not tested: fewer than {MIN_TREND_POINTS} samples",
        "sen_slope_per_s": round(t.sen_slope, 6) if t and t.sen_slope is not None else None,
        "sen_method": t.sen_method if t else None,
        "ols_slope_per_s": round(t.ols_slope, 6) if t and t.ols_slope is not None else None,
    }


def _running_median(s: Series, running: dict[tuple, Series]) -> float | None:
    """The median running batch beside a queue series: the same log lines' Running, or the same scrape's gauge."""
    if s.source == "log":
        a = s.cols.get("running")
    else:
        r = running.get((s.input_id, s.engine))
        a = r.v if r is not None else None
    if a is None:
        return None
    v = a.astype(float)
    v = v[~np.isnan(v)]
    return float(np.median(v)) if len(v) else None


def _span(seconds: float) -> str:
    """A window's length as the log can show it (whole seconds, or a fraction of one for same-second samples)."""
    return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"


def _xy(s: Series) -> tuple[list[float], list[float]]:
    xs, ys = s.xy()
    return (spread_ties(xs) if s.source == "log" else xs), ys


@dataclass(frozen=True)
class QueueMeasure:
    """SCH003's numbers: every queue series' trend test, and the waiting series whose rise is too small to matter."""

    candidates: list[tuple[Series, str]]
    running: dict[tuple, Series]
    table: list[dict]
    tested: list[tuple]  # (series, quantity, trend, xs, ys)
    small: list[tuple]  # (series, quantity, trend, xs, ys, Sen rise, rise threshold)


def measure(ctx: Context) -> QueueMeasure | str:
    """Every number SCH003 judges by, or the reason (a string) it does not apply."""
    candidates = [(s, "waiting requests") for s in log_series(ctx, "waiting", ("running",))]
    candidates += [(s, "waiting requests") for s in metric_series(ctx, "requests_waiting")]
    candidates += [(s, "mean queue time (s)") for s in _queue_time_series(ctx)]
    if not candidates:
        return "missing queue series: no vLLM stats lines (Waiting/Pending) and no timed /metrics scrapes"
    running = {(s.input_id, s.engine): s for s in metric_series(ctx, "requests_running")}
    table, tested, small = [], [], []
    for s, what in candidates:
        xs, ys = _xy(s)
        t = mann_kendall(xs, ys, SIGNIFICANCE) if len(ys) >= MIN_TREND_POINTS else None
        row = _row(s, what, t, xs, ys)
        if t is not None and what == "waiting requests":
            rise = (t.sen_slope or 0.0) * (xs[-1] - xs[0])
            threshold = queue_rise_threshold(_running_median(s, running))
            row |= {"sen_rise": round(rise, 3), "rise_threshold": round(threshold, 3)}
            if t.increasing and rise <= threshold:
                small.append((s, what, t, xs, ys, rise, threshold))
        table.append(row)
        if t is not None:
            tested.append((s, what, t, xs, ys))
    return QueueMeasure(candidates, running, table, tested, small)


def _end_evidence(s: Series) -> list[dict]:
    return [series_evidence(s, s.point(i), "sample", value=s.point(i)["value"]) for i in _ends(s)]


def _judge_untested(ms: QueueMeasure) -> Check:
    """No series long enough for a trend test: a queue that is 0 wherever seen passes, anything else is n/a."""
    candidates = ms.candidates
    longest = max(len(s.xy()[1]) for s, _ in candidates)
    zero = [(s, what) for s, what in candidates if s.xy()[1] and all(v == 0 for v in s.xy()[1])]
    if zero and len(zero) == sum(1 for s, _ in candidates if s.xy()[1]):
        s, what = max(zero, key=lambda x: len(x[0].xy()[1]))
        xs, ys = _xy(s)
        n_zero = sum(len(z.xy()[1]) for z, _ in zero)
        return passed(
            RULE,
            confidence="low",
            title=(
                f"No queue: {what} stayed 0 in all {n_zero} samples of {len(zero)} series"
                if len(zero) > 1
                else f"No queue: {what} 0 in the one sample"
                if len(ys) == 1
                else f"No queue: {what} stayed 0 in all {len(ys)} samples ({_span(xs[-1] - xs[0])})"
            ),
            formula=FORMULA,
            substituted=f"{s.label}: waiting = 0 in every sample; no trend to test",
            values={"alpha": SIGNIFICANCE, "series_tested": 0, "n": n_zero, "series": len(zero)},
            table=ms.table,
            evidence=_end_evidence(s),
        )
    return not_applicable(
        RULE,
        f"missing a queue time series of at least {MIN_TREND_POINTS} samples (longest has {longest}): "
        "a trend needs a window, not one sample; scrape /metrics with `tracediag scrape` or pass a longer log",
    )


def _judge_small_rise(ms: QueueMeasure, values: dict) -> Check:
    s, _what, t, xs, ys, rise, threshold = min(ms.small, key=lambda x: x[2].p_increase)
    values |= {
        "S": t.s,
        "p_increase": t.p_increase,
        "sen_slope_per_s": t.sen_slope,
        "n": t.n,
        "sen_rise": rise,
        "rise_threshold": threshold,
    }
    return passed(
        RULE,
        confidence="medium",
        title=(
            f"Queue rose only {ys[0]:g} → {ys[-1]:g} (Sen rise {rise:.2g} ≤ {threshold:.2g}, the least growth "
            f"that matters beside the running batch): not arrivals outpacing completions; a request stuck in the "
            "queue is SCH011's"
        ),
        formula=FORMULA,
        substituted=(
            f"{s.label}: n = {t.n}, p = {t.p_increase:.4g}, Sen slope = {_slope(t.sen_slope)} × "
            f"{xs[-1] - xs[0]:.3g} s = {rise:.3g} ≤ max(2, 0.1 × median running) = {threshold:.3g}"
        ),
        values=values,
        table=ms.table,
        evidence=_end_evidence(s),
    )


def _judge_no_growth(ms: QueueMeasure, values: dict) -> Check:
    s, what, t, xs, ys = max(ms.tested, key=lambda x: x[2].n)
    if all(v == 0 for v in ys):
        title = f"No queue: {what} stayed 0 over {_span(xs[-1] - xs[0])} ({t.n} samples)"
    elif t.decreasing:
        title = (
            f"Queue draining: {what} fell {ys[0]:g} → {ys[-1]:g} over {_span(xs[-1] - xs[0])} "
            f"(Sen slope {_slope(t.sen_slope)}, Mann-Kendall p = {t.p_decrease:.3g} for a decrease)"
        )
    else:
        title = (
            f"No significant queue growth: Mann-Kendall p = {t.p_increase:.3g} ≥ α = {SIGNIFICANCE} over {t.n} samples"
        )
    values |= {"S": t.s, "p_increase": t.p_increase, "sen_slope_per_s": t.sen_slope, "n": t.n}
    return passed(
        RULE,
        confidence="high" if t.n >= 8 else "medium",
        title=title,
        formula=FORMULA,
        substituted=f"{s.label}: n = {t.n}, S = {t.s}, p = {t.p_increase:.4g}, Sen slope = {_slope(t.sen_slope)}",
        values=values,
        table=ms.table,
        evidence=_end_evidence(s),
    )


def _judge_growing(ms: QueueMeasure, values: dict, growing: list[tuple]) -> Check:
    s, what, t, xs, ys = min(growing, key=lambda x: x[2].p_increase)
    idx = s.valid()
    first, last = s.point(int(idx[0])), s.point(int(idx[-1]))
    peak = s.point(int(idx[int(np.argmax(s.v[idx].astype(float)))]))
    values |= {
        "series": s.label,
        "quantity": what,
        "n": t.n,
        "window_s": xs[-1] - xs[0],
        "S": t.s,
        "p_increase": t.p_increase,
        "test": f"Mann-Kendall, one-sided, {t.method}",
        "sen_slope_per_s": t.sen_slope,
        "sen_method": t.sen_method,
        "ols_slope_per_s": t.ols_slope,
        "first": ys[0],
        "last": ys[-1],
        "max": max(ys),
    }
    rise_txt = ""
    if what == "waiting requests":
        rise = (t.sen_slope or 0.0) * (xs[-1] - xs[0])
        threshold = queue_rise_threshold(_running_median(s, ms.running))
        values |= {"sen_rise": rise, "rise_threshold": threshold}
        rise_txt = f"; rise = {rise:.3g} > max(2, 0.1 × median running) = {threshold:.3g}"
    return finding(
        RULE,
        severity="error" if ys[-1] > 0 and t.p_increase < SIGNIFICANCE / 5 else "warning",
        confidence="high" if t.n >= 8 else "medium",
        impact=min(1.0, len(growing) / len(ms.tested)),
        impact_basis="engines tested (every request after the rise waits in their queue)",
        title=(
            f"Queue growing: {what} rise {ys[0]:g} → {ys[-1]:g} over {_span(xs[-1] - xs[0])} "
            f"({_slope(t.sen_slope)}, Mann-Kendall p = {t.p_increase:.2g} < α = {SIGNIFICANCE}): "
            "arrivals outpace completions"
        ),
        formula=FORMULA,
        substituted=(
            f"{s.label}: n = {t.n}, S = {t.s}, p = {t.p_increase:.4g} < {SIGNIFICANCE}, "
            f"Sen slope = {_slope(t.sen_slope)} (least squares {_slope(t.ols_slope)}){rise_txt}"
        ),
        values=values,
        table=ms.table,
        evidence=[
            series_evidence(s, p, label, value=p["value"])
            for label, p in (("start", first), ("peak", peak), ("end", last))
        ],
        next_check=(
            "No stable queue exists: compare the arrival rate with the completion rate; lower the request rate "
            "or add replicas before tuning kernels, then measure again in a window where Waiting is flat."
        ),
    )


def judge(ms: QueueMeasure) -> Check:
    """Status, severity and words from SCH003's trend tests."""
    if not ms.tested:
        return _judge_untested(ms)
    tiny = {id(x[0]) for x in ms.small}
    growing = [x for x in ms.tested if x[2].increasing and id(x[0]) not in tiny]
    values = {"alpha": SIGNIFICANCE, "series_tested": len(ms.tested), "series_growing": len(growing)}
    if not growing and ms.small:
        return _judge_small_rise(ms, values)
    if not growing:
        return _judge_no_growth(ms, values)
    return _judge_growing(ms, values, growing)


def check(ctx: Context) -> Check:
    ms = measure(ctx)
    if isinstance(ms, str):
        return not_applicable(RULE, ms)
    return judge(ms)
