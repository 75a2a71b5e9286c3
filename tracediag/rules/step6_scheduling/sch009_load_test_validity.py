"""SCH009 Load-test validity.

Hypothesis: a benchmark only measures capacity under independent arrivals if it sends requests at a set
rate regardless of how fast the server answers (open loop). A closed-loop or capped test (fixed
concurrency N) measures ≈ N / mean latency: when the server slows down the client slows down too, and
the waiting moves into the client's queue where the server never sees it. An infinite rate sends
everything at t = 0 and measures a drain. Errors and timeouts dropped from the denominator make the
numbers look better than what users got.

Formula: closed loop: throughput ≈ N / mean E2E; achieved send rate = (n − 1) / (last start − first start)
vs the requested rate (needs per-request start times); without start times, the completion rate
completed / duration (computed when the result lacks request_throughput) is a lower bound of the send rate
— at ≥ 95 % of the requested rate the client kept up, below it the test cannot tell the client's lag from
the server's (SCH003); failed requests F of N = completed + failed must stay in every rate and attainment
denominator. Capacity walk: this is checked first — an invalid load test invalidates the serving
measurements that SCH003, SCH004, SCH008 and SCH010 read.

Evidence: the `vllm bench serve` result's request_rate, max_concurrency, burstiness, completed, failed,
duration, request throughput, mean E2E, max concurrent requests, and start_times when saved.

What to do: rerun open loop (finite --request-rate, --burstiness 1 for Poisson, no --max-concurrency
unless production caps concurrency — then report client queueing too), several independent runs, and
count failures as misses (SCH010).
"""

from __future__ import annotations

import math

from tracediag.analyses.serving import bench_evidence, bench_runs, bench_stat, finite, run_label
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="SCH009",
    step=6,
    title="The load test measured open-loop arrivals without dropping errors",
    enabled_by=("--bench",),
)
# Capacity walk (load generator first): SCH009 is linked as the possible cause of SCH002-SCH004, SCH006-SCH008
# and SCH010 findings, never downstream of them.
SEND_RATE_TOLERANCE = 0.95  # achieved / requested send rate below this is a finding
FORMULA = "closed loop: X ≈ N / mean E2E; achieved send rate = (n − 1) / (t_last − t_first) vs requested λ"


def _send_rate(ctx: Context, r: dict) -> tuple[float | None, int]:
    row = ctx.rows(
        "SELECT count(start_s) AS n, min(start_s) AS t0, max(start_s) AS t1 FROM bench_requests "
        "WHERE input_id = ? AND run = ?",
        [r["input_id"], r["run"]],
    )[0]
    if row["n"] and row["n"] > 1 and row["t1"] > row["t0"]:
        return (row["n"] - 1) / (row["t1"] - row["t0"]), row["n"]
    return None, row["n"] or 0


def check(ctx: Context) -> Check:
    runs = bench_runs(ctx)
    if not runs:
        return not_applicable(RULE, "missing benchmark results: pass a `vllm bench serve` result with --bench")
    table, problems = [], []
    for r in runs:
        rate, cap, failed, completed = r["request_rate_rps"], r["max_concurrency"], r["failed"], r["completed"]
        mean_e2e_ms = bench_stat(ctx, r["input_id"], r["run"], "e2el", "mean")
        achieved, _ = _send_rate(ctx, r)
        throughput = r["request_throughput_rps"]
        if throughput is None and completed is not None and r["duration_s"]:
            throughput = completed / r["duration_s"]  # the result lacks it: completed / duration
        completion_bound = throughput if achieved is None else None
        issues = []
        if cap:
            closed = cap / (mean_e2e_ms / 1000) if mean_e2e_ms else None
            issues.append(
                (
                    "concurrency cap",
                    f"--max-concurrency {cap}: the client holds requests beyond {cap} in flight; throughput "
                    + (
                        f"≈ N / mean E2E = {cap} / {mean_e2e_ms / 1000:.2f} s = {closed:.2f} req/s "
                        + (f"(measured {throughput:.2f})" if throughput is not None else "")
                        if closed
                        else "follows the server's latency"
                    )
                    + ", and waiting before the cap is invisible to the server",
                )
            )
        if rate is not None and math.isinf(rate):
            issues.append(
                (
                    "infinite rate",
                    f"request rate inf: all {r['num_prompts'] or completed} requests sent at t = 0 — a burst that "
                    "measures a drain, not capacity under independent arrivals",
                )
            )
        if achieved is not None and rate is not None and math.isfinite(rate) and achieved < SEND_RATE_TOLERANCE * rate:
            issues.append(
                (
                    "send rate below requested",
                    f"achieved send rate {achieved:.2f} req/s < {SEND_RATE_TOLERANCE:.0%} of the requested {rate:g}",
                )
            )
        if failed and completed is not None:
            issues.append(
                (
                    "errors dropped",
                    f"{failed} of {completed + failed} requests failed: vLLM's request throughput and goodput count "
                    "only completed requests — failures must stay in the denominator",
                )
            )
        row = {
            "run": run_label(r),
            "request_rate_rps": finite(rate),
            "burstiness": r["burstiness"],
            "max_concurrency": cap,
            "completed": completed,
            "failed": failed,
            "duration_s": r["duration_s"],
            "request_throughput_rps": throughput,
            "completion_rate_lower_bound_rps": completion_bound,
            "mean_e2el_ms": mean_e2e_ms,
            "max_concurrent_requests": r["max_concurrent_requests"],
            "achieved_send_rate_rps": achieved,
            "send_window_s": (r["num_prompts"] / rate) if rate and math.isfinite(rate) and r["num_prompts"] else None,
            "issues": [k for k, _ in issues] or None,
        }
        table.append(row)
        problems += [(r, k, why, row) for k, why in issues]
    values = {
        "runs": len(runs),
        "runs_with_issues": len({id(p[0]) for p in problems}),
        "send_rate_tolerance": SEND_RATE_TOLERANCE,
        "start_times_available": any(t["achieved_send_rate_rps"] is not None for t in table),
    }
    if not problems:
        r = runs[0]
        t = table[0]
        rate = r["request_rate_rps"]
        bound = t["completion_rate_lower_bound_rps"]
        if t["achieved_send_rate_rps"] is not None:
            send_txt = f", achieved send rate {t['achieved_send_rate_rps']:.2f} req/s"
        elif bound is not None and rate and math.isfinite(rate) and bound >= SEND_RATE_TOLERANCE * rate:
            how = (
                f"completed / duration = {r['completed']} / {r['duration_s']:.1f} s"
                if r["completed"] is not None and r["duration_s"]
                else "the request throughput"
            )
            send_txt = f", send rate ≥ {how} = {bound:.3f} req/s (≥ {SEND_RATE_TOLERANCE:.0%} of {rate:g})"
        elif bound is not None and rate and math.isfinite(rate):
            send_txt = (
                f"; send rate not checkable: completed / duration = {bound:.3f} req/s is below {rate:g} req/s, which "
                "a slow server (SCH003) or a slow client both explain — save start_times (--save-detailed)"
            )
        else:
            send_txt = " (send rate not checkable: no start_times and no completion count)"
        values["achieved_rate_rps"] = t["achieved_send_rate_rps"] if t["achieved_send_rate_rps"] is not None else bound
        note = (
            f"; completion throughput {t['request_throughput_rps']:.2f} req/s is below the rate because the "
            f"run drained for {t['duration_s'] - t['send_window_s']:.1f} s after the {t['send_window_s']:.0f} s "
            "send window"
            if t["send_window_s"]
            and t["duration_s"]
            and t["duration_s"] > t["send_window_s"]
            and t["request_throughput_rps"] is not None
            else ""
        )
        values |= {"request_rate_rps": finite(r["request_rate_rps"]), "failed": r["failed"]}
        return passed(
            RULE,
            confidence="medium" if not values["start_times_available"] else "high",
            formula=FORMULA,
            values=values,
            table=table,
            substituted=f"{run_label(r)}: open loop, no concurrency cap, {r['failed'] or 0} failed{note}",
            evidence=[bench_evidence(r, value=finite(r["request_rate_rps"]))],
            title=(
                (f"Open-loop test at {rate:g} req/s" if rate is not None else "Open-loop test (rate not a number)")
                + (f" (burstiness {r['burstiness']:g})" if r["burstiness"] is not None else "")
                + ", no concurrency cap, "
                + ("no failures" if r["failed"] == 0 else "failures unknown (the result does not count them)")
                + send_txt
            ),
        )
    r, kind, why, row = problems[0]
    values |= {
        "issue": kind,
        "request_rate_rps": finite(r["request_rate_rps"]),
        "max_concurrency": r["max_concurrency"],
        "failed": r["failed"],
        "completed": r["completed"],
    }
    return finding(
        RULE,
        severity="warning",
        confidence="high",
        impact=values["runs_with_issues"] / len(runs),
        formula=FORMULA,
        values=values,
        table=table,
        substituted=f"{run_label(r)}: {why}",
        evidence=[bench_evidence(p[0], issue=p[1], detail=p[2]) for p in problems][: ctx.settings.max_evidence],
        title=f"Load test not valid for capacity: {why}",
        next_check=(
            "Rerun open loop: a finite --request-rate with --burstiness 1 (Poisson), no --max-concurrency unless "
            "production caps concurrency (then report client queueing), --save-detailed, several independent runs; "
            "count failures as misses (SCH010)."
        ),
    )
