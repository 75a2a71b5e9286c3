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
denominator. A broken test — send rate below the requested rate, errors dropped, or a concurrency cap under a
finite rate that was reached (a client-side queue hiding the waiting) — is a warning that heads the verdict and may
explain the capacity findings (SCH003, SCH008, SCH010, SCH012). A closed loop (a cap with no finite rate behind
it) or an infinite rate is a legitimate measurement at that concurrency: an `info` caveat on every capacity claim
(`qualifies`), shown with them; it never heads the verdict and never explains a finding about the engine or its
configuration (RULEBOOK SCH009). A stream of several tokens per chunk (mean ITL ≥ 1.5 × mean TPOT: the client
times chunks, so ITL ≈ tokens per chunk × TPOT) is a caveat on the ITL-based judgements (SCH002, SCH010).

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
# Capacity walk (load generator first): a broken SCH009 is linked as the possible cause of the capacity findings
# (SCH003, SCH008, SCH010, SCH012), never of a finding about the engine or its configuration.
SEND_RATE_TOLERANCE = 0.95  # achieved / requested send rate below this is a finding
# A broken test misreports what users got and heads the verdict; a closed loop or a burst is a legitimate
# measurement at its concurrency, a caveat on the capacity claims of QUALIFIES (RULEBOOK SCH009)
BROKEN = ("send rate below requested", "errors dropped", "client queue")
QUALIFIES = ("SCH003", "SCH008", "SCH010", "SCH012", "SHP004")
# mean ITL this many times the mean TPOT: tokens arrive several per streamed chunk (vLLM bench serve times chunks:
# ITL ≈ tokens per chunk × TPOT); a token-per-chunk stream has ITL ≈ TPOT (they differ only in weighting: ITL per
# gap, TPOT per request)
CHUNKED_STREAMING = 1.5
QUALIFIES_ITL = ("SCH002", "SCH010")  # what a chunked stream makes unreadable: stalls from gaps, an ITL SLO
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


def _run_issues(ctx: Context, r: dict) -> tuple[dict, list[tuple[str, str]]]:
    """One benchmark run: its table row and its issues (kind, why in words)."""
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
        law = (
            f"≈ N / mean E2E = {cap} / {mean_e2e_ms / 1000:.2f} s = {closed:.2f} req/s "
            + (f"(measured {throughput:.2f})" if throughput is not None else "")
            if closed
            else "follows the server's latency"
        )
        binds = r["max_concurrent_requests"] is not None and r["max_concurrent_requests"] >= cap
        if (
            rate is not None
            and math.isfinite(rate)
            and (binds or (achieved is not None and achieved < SEND_RATE_TOLERANCE * rate))
        ):
            issues.append(
                (
                    "client queue",
                    f"--request-rate {rate:g} with --max-concurrency {cap}, and the cap was reached: arrivals "
                    f"beyond {cap} in flight waited in the client, where no TTFT counts it; throughput {law}",
                )
            )
        else:
            issues.append(
                (
                    "closed loop",
                    f"--max-concurrency {cap}: a closed loop at {cap} in flight, throughput {law} — a valid "
                    "measurement at that concurrency, not capacity under independent arrivals",
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
    itl, tpot = (
        bench_stat(ctx, r["input_id"], r["run"], "itl", "mean"),
        bench_stat(ctx, r["input_id"], r["run"], "tpot", "mean"),
    )
    if itl and tpot and itl >= CHUNKED_STREAMING * tpot:
        issues.append(
            (
                "chunked streaming",
                f"mean ITL {itl:.2f} ms is {itl / tpot:.1f}× mean TPOT {tpot:.2f} ms: the server streams about "
                f"{itl / tpot:.1f} tokens per chunk and the client times chunks, so ITL and its percentiles are "
                "per chunk, not per token — ITL-based judgements (stalls, an ITL SLO) are off; read TPOT",
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
    return row, issues


def check(ctx: Context) -> Check:
    runs = bench_runs(ctx)
    if not runs:
        return not_applicable(RULE, "missing benchmark results: pass a `vllm bench serve` result with --bench")
    table, problems = [], []
    for r in runs:
        row, issues = _run_issues(ctx, r)
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
    broken = [p for p in problems if p[1] in BROKEN]
    if not broken:
        return _caveat(ctx, problems, values, table)
    r, kind, why, _ = broken[0]
    values |= {
        "issue": kind,
        "issues": sorted({p[1] for p in problems}),
        "request_rate_rps": finite(r["request_rate_rps"]),
        "max_concurrency": r["max_concurrency"],
        "failed": r["failed"],
        "completed": r["completed"],
    }
    impact, basis = _broken_impact(broken)
    caveats = [p for p in problems if p[1] not in BROKEN]
    return finding(
        RULE,
        severity="warning",
        confidence="high",
        impact=impact,
        impact_basis=basis,
        formula=FORMULA,
        values=values,
        table=table,
        substituted=f"{run_label(r)}: {why}",
        evidence=[bench_evidence(p[0], issue=p[1], detail=p[2]) for p in problems][: ctx.settings.max_evidence],
        title=f"Load test broken: {why}" + (f" (also: {caveats[0][1]})" if caveats else ""),
        next_check=(
            "Fix the test before reading the server: a client that keeps up with the requested rate (more client "
            "processes, or a lower rate), failures counted as misses in every rate and attainment (SCH010), no "
            "--max-concurrency under a finite rate unless production caps concurrency (then report the client's "
            "queueing time too); --save-detailed, several independent runs."
        ),
    )


def _broken_impact(broken: list[tuple]) -> tuple[float | None, str | None]:
    """The share of requests the broken test misreports: failures dropped from the denominator, or requests not
    sent at the requested rate."""
    for r, kind, _, _row in broken:
        if kind == "errors dropped" and r["completed"] is not None:
            return r["failed"] / (r["completed"] + r["failed"]), "requests (failed, dropped from the denominator)"
    for r, kind, _, row in broken:
        rate, achieved = r["request_rate_rps"], row["achieved_send_rate_rps"]
        if kind == "send rate below requested" and rate and achieved is not None:
            return 1 - achieved / rate, "requests (not sent at the requested rate)"
    return None, None


def _caveat(ctx: Context, problems: list[tuple], values: dict, table: list[dict]) -> Check:
    """A closed loop or a burst at t = 0: a valid measurement that qualifies capacity claims, never a cause."""
    r, kind, why, _ = problems[0]
    values |= {
        "issue": kind,
        "issues": sorted({p[1] for p in problems}),
        "caveat": True,
        "request_rate_rps": finite(r["request_rate_rps"]),
        "max_concurrency": r["max_concurrency"],
        "failed": r["failed"],
        "completed": r["completed"],
    }
    kinds = {p[1] for p in problems}
    qualifies = tuple(
        dict.fromkeys(
            (QUALIFIES if kinds - {"chunked streaming"} else ())
            + (QUALIFIES_ITL if "chunked streaming" in kinds else ())
        )
    )
    return finding(
        RULE,
        severity="info",
        confidence="high",
        impact=None,
        formula=FORMULA,
        values=values,
        table=table,
        substituted=f"{run_label(r)}: {why}",
        evidence=[bench_evidence(p[0], issue=p[1], detail=p[2]) for p in problems][: ctx.settings.max_evidence],
        title=("Caveat on inter-token latency: " if kind == "chunked streaming" else "Caveat on capacity claims: ")
        + why,
        qualifies=qualifies,
        next_check=(
            "Read the throughput and latencies as those at this concurrency. For capacity under independent "
            "arrivals, rerun open loop: a finite --request-rate with --burstiness 1 (Poisson), no --max-concurrency, "
            "--save-detailed, several independent runs."
            if kind != "chunked streaming"
            else "Judge per-token pacing by TPOT, and stalls by the engine's steps (a trace) or by a client that "
            "counts the tokens in each chunk; the chunking itself is the server's stream setting (SGLang "
            "--stream-interval, a frontend that batches deltas)."
        ),
    )
