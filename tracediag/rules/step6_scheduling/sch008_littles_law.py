"""SCH008 Little's law.

Hypothesis: inside a window that starts and ends in the same state, the mean number of requests in the
system equals the arrival rate times the mean time in system (L = λ·W), whatever the arrival process.
Two independent measurements of the two sides that disagree mean lost or retried requests, a wrong
window, streaming connections not closed, or counters and gauges that do not describe the same requests.

Formula: L̄ (sampled Running + Waiting) vs λ·W, ratio = L̄ / (λ·W); agreement within a factor 2 (the
gauges are samples, not time averages). Sources: (a) timed /metrics scrapes: L̄ = mean of
num_requests_running + num_requests_waiting, λ = Δ request_success / Δt, W = Δ e2e_request_latency_sum /
Δ count; (b) a `vllm bench serve` run and the server log of the same run: L̄ = mean Running + Waiting of the
stats lines inside the run's window [date − duration, date], λ·W = completed / duration × mean E2E.

Evidence: the samples inside the window, the counters or benchmark values used.

What to do: on a mismatch, check for requests the server never finished (aborts, client timeouts,
streams left open), retries, and whether the window holds the whole run; then recheck SCH003.
"""

from __future__ import annotations

from datetime import datetime

from tracediag.analyses.serving import (
    bench_runs,
    bench_stat,
    input_paths,
    log_evidence,
    metric_evidence,
    metric_series,
    run_label,
    short,
)
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model.servingmath import littles_law_l

RULE = RuleMeta(
    id="SCH008",
    step=6,
    title="Requests in system = arrival rate × time in system (Little's law)",
    may_be_downstream_of=("SCH009", "SCH011"),
    enabled_by=("--metrics", "--bench", "--log"),
)
FACTOR = 2.0
MIN_SAMPLES = 2
FORMULA = "L̄ = λ·W: ratio = mean(Running + Waiting) / (λ · mean time in system), agreement within ×2"


def _metrics_windows(ctx: Context) -> list[dict]:
    out = []
    running = {(s.input_id, s.engine): s for s in metric_series(ctx, "requests_running")}
    waiting = {(s.input_id, s.engine): s for s in metric_series(ctx, "requests_waiting")}
    success = {(s.input_id, s.engine): s for s in metric_series(ctx, "request_success")}
    e2e_sum = {(s.input_id, s.engine): s for s in metric_series(ctx, "e2e_latency_seconds", "sum")}
    e2e_cnt = {(s.input_id, s.engine): s for s in metric_series(ctx, "e2e_latency_seconds", "count")}
    for key, run_s in running.items():
        if key not in waiting or key not in success or key not in e2e_sum or key not in e2e_cnt:
            continue
        pts = [p for p in run_s.points if p["t_s"] is not None]
        if len(pts) < max(MIN_SAMPLES, 2):
            continue
        w_by = {p["scrape"]: p["value"] for p in waiting[key].points}
        ls = [(p["value"] or 0) + (w_by.get(p["scrape"]) or 0) for p in pts]
        s_pts, c_pts, e_pts = success[key].points, e2e_cnt[key].points, e2e_sum[key].points
        dt = s_pts[-1]["t_s"] - s_pts[0]["t_s"] if s_pts[-1]["t_s"] is not None and s_pts[0]["t_s"] is not None else 0
        dn = (s_pts[-1]["value"] or 0) - (s_pts[0]["value"] or 0)
        dc = (c_pts[-1]["value"] or 0) - (c_pts[0]["value"] or 0)
        ds = (e_pts[-1]["value"] or 0) - (e_pts[0]["value"] or 0)
        if dt <= 0 or dn <= 0 or dc <= 0:
            continue
        lam, w = dn / dt, ds / dc
        out.append(
            {
                "window": f"{run_s.label}, {len(pts)} scrapes over {dt:.0f} s",
                "source": "metrics",
                "samples": len(pts),
                "L_mean": sum(ls) / len(ls),
                "lambda_rps": lam,
                "W_s": w,
                "evidence": [metric_evidence(run_s.path, p, "scrape", running_plus_waiting=v) for p, v in zip(pts, ls)],
            }
        )
    return out


def _bench_log_windows(ctx: Context) -> list[dict]:
    runs = [r for r in bench_runs(ctx) if r["date"] and r["duration_s"] and r["completed"]]
    if not runs:  # no benchmark run to place: the stats lines (10^5 rows in a day's log) are not read
        return []
    paths = input_paths(ctx)
    stats = ctx.rows("SELECT input_id, line, ts_text, t_s, running, waiting FROM serving_stats ORDER BY input_id, t_s")
    out = []
    for r in runs:
        try:
            end = datetime.strptime(r["date"], "%Y%m%d-%H%M%S")
        except ValueError:
            continue
        start_s = end.timestamp() - r["duration_s"]
        inside = []
        for s in stats:
            try:
                t = datetime.strptime(f"{end.year}-{s['ts_text']}", "%Y-%m-%d %H:%M:%S").timestamp()
            except ValueError:
                continue
            if start_s <= t <= end.timestamp():
                inside.append(s)
        mean_e2e_ms = bench_stat(ctx, r["input_id"], r["run"], "e2el", "mean")
        if len(inside) < MIN_SAMPLES or not mean_e2e_ms:
            continue
        ls = [(s["running"] or 0) + (s["waiting"] or 0) for s in inside]
        log_path = paths.get(inside[0]["input_id"], "?")
        out.append(
            {
                "window": f"{run_label(r)} × {short(log_path)} ({len(inside)} stats lines in the "
                f"{r['duration_s']:.1f} s run ending {r['date']})",
                "source": "benchmark + server log",
                "samples": len(inside),
                "L_mean": sum(ls) / len(ls),
                "lambda_rps": r["completed"] / r["duration_s"],
                "W_s": mean_e2e_ms / 1000,
                "evidence": [
                    log_evidence(log_path, s, "stats line in the run window", running_plus_waiting=v)
                    for s, v in zip(inside, ls)
                ],
            }
        )
    return out


def check(ctx: Context) -> Check:
    windows = _metrics_windows(ctx) + _bench_log_windows(ctx)
    if not windows:
        return not_applicable(
            RULE,
            "missing two independent measurements of one window: timed /metrics scrapes with running/waiting "
            "gauges, request_success and e2e latency counters, or a benchmark run plus the server log covering it",
        )
    table = []
    for w in windows:
        w["lambda_W"] = littles_law_l(w["lambda_rps"], w["W_s"])
        w["ratio"] = w["L_mean"] / w["lambda_W"] if w["lambda_W"] else None
        table.append({k: v for k, v in w.items() if k != "evidence"})
    bad = [w for w in windows if w["ratio"] is not None and not (1 / FACTOR <= w["ratio"] <= FACTOR)]
    w = (bad or windows)[0]
    values = {
        "window": w["window"],
        "source": w["source"],
        "samples": w["samples"],
        "L_mean": round(w["L_mean"], 4),
        "lambda_rps": round(w["lambda_rps"], 4),
        "W_s": round(w["W_s"], 4),
        "lambda_W": round(w["lambda_W"], 4),
        "ratio": round(w["ratio"], 4) if w["ratio"] is not None else None,
        "tolerance_factor": FACTOR,
    }
    substituted = (
        f"{w['window']}: L̄ = {w['L_mean']:.2f}; λ·W = {w['lambda_rps']:.3f}/s × {w['W_s']:.3f} s = "
        f"{w['lambda_W']:.2f}; ratio {w['ratio']:.3f}"
    )
    evidence = w["evidence"][: ctx.settings.max_evidence]
    conf = "medium" if w["samples"] >= 5 else "low"
    if not bad:
        return passed(
            RULE,
            confidence=conf,
            formula=FORMULA,
            substituted=substituted,
            values=values,
            table=table,
            evidence=evidence,
            title=(
                f"Little's law holds within ×{FACTOR:g}: L̄ = {w['L_mean']:.1f} vs λ·W = {w['lambda_W']:.1f} "
                f"(ratio {w['ratio']:.2f}, {w['samples']} samples)"
            ),
        )
    return finding(
        RULE,
        severity="warning",
        confidence=conf,
        impact=min(1.0, abs(1 - w["ratio"])),
        formula=FORMULA,
        substituted=substituted,
        values=values,
        table=table,
        evidence=evidence,
        title=(
            f"Little's law mismatch: L̄ = {w['L_mean']:.1f} requests in system but λ·W = {w['lambda_W']:.1f} "
            f"(ratio {w['ratio']:.2f})"
        ),
        next_check=(
            "Look for requests that never finish (aborted or timed-out clients, streams left open), retries, and "
            "a window that cuts runs; then recheck queue growth (SCH003)."
        ),
    )
