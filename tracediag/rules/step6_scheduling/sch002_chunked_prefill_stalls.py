"""SCH002 Chunked-prefill stalls.

Hypothesis: a long prefill scheduled in the same engine step as decoding requests lengthens that step for
every one of them: step ≈ decode + prefill·c/prompt + overhead, so their next token waits. Mean ITL hides
it (99 gaps of 10 ms and one of 500 ms: mean 14.9 ms, nearest-rank p99 10 ms); each request's largest gap
(its max stall) shows it.

Formula: per request, max stall = max_i gap_i; per step with decoding requests, gap = step time (GPU span
of the step's kernels, else host duration). Budget: the ITL SLO (--slo itl=MS) when given, else 5× the
typical gap (median inter-token gap of all requests, or median decode-only step). Finding: a step mixing
prefill and decode over budget, or ≥ 5 % of requests with a max stall over budget (info below 5 %). From a
benchmark summary alone (no per-request gaps, no steps): the p99 gap over the budget (5 × the median gap, or the
SLO) means at least 1 % of gaps are stalls (warning, low confidence); not applicable when the gaps are per streamed
chunk (mean ITL ≥ 1.5 × mean TPOT, SCH009's caveat).

Evidence: the worst steps with their prefill tokens (ctx_tokens) and decoding requests (gen_reqs), or the
requests with the worst stalls (--save-detailed itls), with nearest-rank percentiles of the max stalls.

What to do: lower max_num_batched_tokens (the token budget per step, not requests) or the long-prefill
chunk threshold so prefills are split into smaller chunks: prefill completes later, decode runs smoother;
compare TTFT and max stall per request after the change.
"""

from __future__ import annotations

from statistics import median

from tracediag.analyses.serving import bench_evidence, bench_runs, bench_stat, run_label
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model.servingmath import nearest_rank

RULE = RuleMeta(
    id="SCH002",
    step=6,
    title="Decoding requests are not stalled by prefill chunks",
    may_be_downstream_of=("SCH003",),
    enabled_by=("--bench", "--slo itl=MS"),
)
STALL_FACTOR = 5.0
WARN_SHARE = 0.05
CHUNKED_STREAMING = 1.5  # mean ITL / mean TPOT at or above which gaps are per chunk (SCH009's caveat)
PERCENTILE_FORMULA = "p99 gap / median gap of the summary; stalls when p99 gap > budget (at least 1 % of gaps over it)"
FORMULA = "max stall = max_i gap_i per request; mixed step gap = decode + prefill·c/prompt + overhead vs budget"


def _budget(ctx: Context, typical_s: float | None) -> tuple[float | None, str]:
    itl = dict(ctx.settings.slo_ms).get("itl")
    if itl is not None:
        return itl / 1000, f"--slo itl={itl:g} ms"
    if typical_s:
        return STALL_FACTOR * typical_s, f"{STALL_FACTOR:g} × typical gap {typical_s * 1000:.2f} ms"
    return None, "none"


def _from_requests(ctx: Context) -> Check | None:
    runs = [r for r in bench_runs(ctx) if r["has_requests"]]
    rows = []
    for r in runs:
        reqs = ctx.rows(
            "SELECT req, itl_max_s, itl_mean_s, itl_count, itls_s, output_len FROM bench_requests "
            "WHERE input_id = ? AND run = ? AND success AND itl_count > 0 ORDER BY req",
            [r["input_id"], r["run"]],
        )
        rows += [(r, q) for q in reqs]
    if not rows:
        return None
    gaps = [g for _, q in rows for g in q["itls_s"]]
    typical = median(gaps) if gaps else None
    budget, budget_src = _budget(ctx, typical)
    if budget is None:  # every gap 0 (a result of zeros) and no --slo itl: nothing to judge a stall by here
        return None
    stalls = [q["itl_max_s"] for _, q in rows]
    over = [(r, q) for r, q in rows if budget is not None and q["itl_max_s"] > budget]
    share = len(over) / len(rows)
    values = {
        "requests": len(rows),
        "gaps": len(gaps),
        "mean_gap_ms": sum(gaps) / len(gaps) * 1000,
        "p99_gap_nearest_rank_ms": nearest_rank(gaps, 99) * 1000,
        "p50_max_stall_ms": nearest_rank(stalls, 50) * 1000,
        "p99_max_stall_ms": nearest_rank(stalls, 99) * 1000,
        "max_stall_ms": max(stalls) * 1000,
        "budget_ms": budget * 1000 if budget else None,
        "budget_source": budget_src,
        "requests_over_budget": len(over),
        "share_over_budget": share,
        "warn_share": WARN_SHARE,
        "percentile_method": "nearest rank",
    }
    worst = sorted(rows, key=lambda x: -x[1]["itl_max_s"])[: ctx.settings.max_evidence]
    evidence = [
        bench_evidence(
            r,
            request=q["req"],
            max_stall_ms=q["itl_max_s"] * 1000,
            mean_gap_ms=q["itl_mean_s"] * 1000,
            gaps=q["itl_count"],
        )
        for r, q in worst
    ]
    table = [
        {
            "run": run_label(r),
            "request": q["req"],
            "max_stall_ms": q["itl_max_s"] * 1000,
            "mean_gap_ms": q["itl_mean_s"] * 1000,
            "gaps": q["itl_count"],
        }
        for r, q in worst
    ]
    substituted = (
        f"{len(over)} of {len(rows)} requests have a max stall > {values['budget_ms']:.1f} ms ({budget_src}); "
        f"p99 max stall {values['p99_max_stall_ms']:.1f} ms vs mean gap {values['mean_gap_ms']:.1f} ms and "
        f"nearest-rank p99 gap {values['p99_gap_nearest_rank_ms']:.1f} ms"
    )
    common = {"formula": FORMULA, "substituted": substituted, "values": values, "evidence": evidence, "table": table}
    nxt = (
        "Lower max_num_batched_tokens (token budget per step) or the long-prefill threshold so prefills run in "
        "smaller chunks; compare per-request max stall and TTFT after the change."
    )
    if not over:
        return passed(
            RULE,
            confidence="high",
            **common,
            title=f"No request stalls beyond {values['budget_ms']:.1f} ms (max stall {values['max_stall_ms']:.1f} ms)",
        )
    return finding(
        RULE,
        severity="warning" if share >= WARN_SHARE else "info",
        confidence="medium",
        impact=share,
        next_check=nxt,
        **common,
        title=(
            f"{len(over)} of {len(rows)} requests stall > {values['budget_ms']:.0f} ms between tokens (worst "
            f"{values['max_stall_ms']:.0f} ms) while the mean gap is {values['mean_gap_ms']:.1f} ms"
        ),
    )


def _steps_with_decode(ctx: Context) -> list[dict]:
    """The steps that carry decoding requests, each with its decode gap: the step's GPU window less host-blocking
    stalls (measured once by KRN006, kept out of step times), else the host step duration."""
    return ctx.rows(
        "SELECT rank, step_id, name, ts_ns, ctx_reqs, ctx_tokens, gen_reqs, gen_tokens, "
        "coalesce(win_end_ns - win_ts_ns - coalesce(stall_ns, 0), dur_ns) AS gap_ns, win_ts_ns IS NOT NULL AS on_gpu "
        "FROM steps WHERE gen_reqs > 0 ORDER BY rank, step_id"
    )


def _mixed_table(mixed: list[dict], budget: float) -> list[dict]:
    """The mixed prefill/decode steps, longest decode gap first, each marked against the budget (s)."""
    return [
        {
            "rank": s["rank"],
            "step": s["step_id"],
            "prefill_tokens": s["ctx_tokens"],
            "decoding_requests": s["gen_reqs"],
            "gap_ms": s["gap_ns"] / 1e6,
            "over_budget": s["gap_ns"] / 1e9 > budget,
        }
        for s in sorted(mixed, key=lambda s: -s["gap_ns"])
    ]


def _stall_evidence(steps: list[dict]) -> list[dict]:
    return [
        {
            "rank": s["rank"],
            "step": s["step_id"],
            "ts_ns": s["ts_ns"],
            "name": s["name"],
            "prefill_tokens": s["ctx_tokens"],
            "decoding_requests": s["gen_reqs"],
            "gap_ms": s["gap_ns"] / 1e6,
        }
        for s in steps
    ]


def _from_steps(ctx: Context) -> Check | None:
    steps = _steps_with_decode(ctx)
    if not steps:
        return None
    decode = [s["gap_ns"] for s in steps if not s["ctx_tokens"]]
    mixed = [s for s in steps if s["ctx_tokens"]]
    typical = median(decode) / 1e9 if decode else None
    budget, budget_src = _budget(ctx, typical)
    values = {
        "steps_with_decode": len(steps),
        "decode_only_steps": len(decode),
        "mixed_steps": len(mixed),
        "median_decode_gap_ms": typical * 1000 if typical else None,
        "max_decode_only_gap_ms": max(decode) / 1e6 if decode else None,
        "budget_ms": budget * 1000 if budget else None,
        "budget_source": budget_src,
        "gap_measure": "GPU span of the step's kernels" if any(s["on_gpu"] for s in steps) else "host step duration",
    }
    if not mixed:
        return passed(
            RULE,
            confidence="medium",
            formula=FORMULA,
            values=values,
            substituted=f"0 of {len(steps)} steps with decoding requests carry prefill tokens",
            title=(
                f"No step mixes prefill with decode: decoding requests never waited on a prefill chunk "
                f"(max decode gap {values['max_decode_only_gap_ms']:.1f} ms over {len(decode)} steps)"
            ),
        )
    if budget is None:
        return None
    over = sorted((s for s in mixed if s["gap_ns"] / 1e9 > budget), key=lambda s: -s["gap_ns"])
    table = _mixed_table(mixed, budget)
    w = (over or sorted(mixed, key=lambda s: -s["gap_ns"]))[0]
    values |= {
        "mixed_over_budget": len(over),
        "worst_gap_ms": w["gap_ns"] / 1e6,
        "worst_prefill_tokens": w["ctx_tokens"],
        "worst_decoding_requests": w["gen_reqs"],
    }
    substituted = (
        f"rank {w['rank']} step {w['step_id']}: {w['gen_reqs']} decoding requests wait {w['gap_ns'] / 1e6:.1f} ms in a "
        f"step with {w['ctx_tokens']} prefill tokens; budget {budget * 1000:.1f} ms ({budget_src})"
    )
    evidence = _stall_evidence((over or mixed)[: ctx.settings.max_evidence])
    if not over:
        return passed(
            RULE,
            confidence="medium",
            formula=FORMULA,
            values=values,
            substituted=substituted,
            table=table,
            evidence=evidence,
            title=f"Mixed prefill/decode steps stay within {budget * 1000:.1f} ms ({budget_src})",
        )
    return finding(
        RULE,
        severity="warning",
        confidence="medium",
        impact=len(over) / len(steps),
        formula=FORMULA,
        values=values,
        substituted=substituted,
        table=table,
        evidence=evidence,
        title=(
            f"Prefill chunks stall decoding: {w['gen_reqs']} decoding requests waited {w['gap_ns'] / 1e6:.0f} ms "
            f"in a step carrying {w['ctx_tokens']:,} prefill tokens ({len(over)} of {len(mixed)} mixed steps over "
            f"{budget * 1000:.0f} ms)"
        ),
        next_check=(
            "Lower max_num_batched_tokens (token budget per step) so long prompts are split into smaller chunks; "
            "the decoding requests then wait less per step while the prefill finishes later."
        ),
    )


def _from_percentiles(ctx: Context) -> Check | None:
    """A benchmark summary without per-request gaps: the p99 inter-token gap against the budget. p99 above it
    means at least 1 % of all gaps are stalls; how many requests they hit needs the per-request data."""
    found = []
    for r in bench_runs(ctx):
        stat = {k: bench_stat(ctx, r["input_id"], r["run"], m, k2) for k, (m, k2) in {
            "median": ("itl", "median"), "p99": ("itl", "p99"), "mean": ("itl", "mean"), "tpot": ("tpot", "mean"),
        }.items()}  # fmt: skip
        if stat["median"] and stat["p99"]:
            found.append((r, stat))
    if not found:
        return None
    r, stat = max(found, key=lambda f: f[1]["p99"] / f[1]["median"])
    if stat["mean"] and stat["tpot"] and stat["mean"] >= CHUNKED_STREAMING * stat["tpot"]:
        return not_applicable(
            RULE,
            f"inter-token gaps are per streamed chunk, not per token: mean ITL {stat['mean']:.3g} ms is "
            f"{stat['mean'] / stat['tpot']:.1f}× mean TPOT {stat['tpot']:.3g} ms ({run_label(r)}), so ITL percentiles "
            "cannot show a stall (SCH009's caveat); per-request data (--save-detailed) or engine steps (a trace) can",
        )
    budget, budget_src = _budget(ctx, stat["median"] / 1000)
    ratio = stat["p99"] / stat["median"]
    values = {
        "median_gap_ms": stat["median"],
        "p99_gap_ms": stat["p99"],
        "mean_gap_ms": stat["mean"],
        "mean_tpot_ms": stat["tpot"],
        "p99_over_median": ratio,
        "budget_ms": budget * 1000,
        "budget_source": budget_src,
        "source": "benchmark summary percentiles (no per-request gaps)",
        "percentile_method": "as the benchmark client computed it (vLLM, SGLang: numpy linear interpolation)",
    }
    substituted = (
        f"{run_label(r)}: p99 gap {stat['p99']:.3g} ms = {ratio:.1f}× the median {stat['median']:.3g} ms; budget "
        f"{budget * 1000:.3g} ms ({budget_src})"
    )
    common = {
        "formula": PERCENTILE_FORMULA,
        "substituted": substituted,
        "values": values,
        "evidence": [bench_evidence(r, metric="p99_itl_ms", value=stat["p99"])],
    }
    if stat["p99"] <= budget * 1000:
        return passed(
            RULE,
            confidence="low",
            **common,
            title=(
                f"The p99 inter-token gap ({stat['p99']:.3g} ms, {ratio:.1f}× the median) is within "
                f"{budget * 1000:.3g} ms: fewer than 1 % of gaps can be stalls (a summary; --save-detailed counts them)"
            ),
        )
    return finding(
        RULE,
        severity="warning",
        confidence="low",
        impact=None,
        **common,
        title=(
            f"The p99 inter-token gap is {stat['p99']:.3g} ms, {ratio:.1f}× the median {stat['median']:.3g} ms: at "
            f"least 1 % of gaps are stalls over {budget * 1000:.3g} ms, the pattern of prefill chunks interrupting "
            "decode"
        ),
        next_check=(
            "Confirm per request: rerun with --save-detailed (max stall per request) or profile a few steps (mixed "
            "prefill/decode steps); then lower max_num_batched_tokens or the long-prefill threshold."
        ),
    )


def check(ctx: Context) -> Check:
    result = _from_requests(ctx) or _from_steps(ctx) or _from_percentiles(ctx)
    if result is not None:
        return result
    if ctx.scalar("SELECT count(*) FROM steps WHERE ctx_tokens > 0 AND gen_reqs > 0"):
        return not_applicable(
            RULE,
            "missing a gap budget: mixed prefill/decode steps but no decode-only step to compare with; "
            "pass --slo itl=MS",
        )
    counted = ctx.rows(
        "SELECT count(*) AS steps, sum(ctx_tokens) AS prefill_tokens FROM steps "
        "WHERE ctx_reqs IS NOT NULL OR gen_reqs IS NOT NULL"
    )[0]
    if counted["steps"]:  # the trace has engine steps with token counts, and none of them is decoding
        n = counted["steps"]
        return not_applicable(
            RULE,
            f"missing decoding requests: the trace's {n} engine step{'s' if n > 1 else ''} with token counts (step "
            f"annotations) carr{'y' if n > 1 else 'ies'} prefill only ({counted['prefill_tokens'] or 0:,} prefill "
            "tokens, no decoding request), so no decode waited on a prefill chunk; a stall needs decoding requests "
            "in a step with prefill, or per-request inter-token latencies (--bench with a `vllm bench serve "
            "--save-detailed` result)",
        )
    return not_applicable(
        RULE,
        "missing per-request inter-token latencies (vllm bench serve --save-detailed) and engine steps with "
        "prefill/decode token counts (vLLM step annotations in a trace)",
    )
