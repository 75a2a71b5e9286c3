"""SCH002 Chunked-prefill stalls.

Hypothesis: a long prefill scheduled in the same engine step as decoding requests lengthens that step for
every one of them: step ≈ decode + prefill·c/prompt + overhead, so their next token waits. Mean ITL hides
it (99 gaps of 10 ms and one of 500 ms: mean 14.9 ms, nearest-rank p99 10 ms); each request's largest gap
(its max stall) shows it.

Formula: per request, max stall = max_i gap_i; per step with decoding requests, gap = step time (GPU span
of the step's kernels, else host duration). Budget: the ITL SLO (--slo itl=MS) when given, else 5× the
typical gap (median inter-token gap of all requests, or median decode-only step). Finding: a step mixing
prefill and decode over budget, or ≥ 5 % of requests with a max stall over budget (info below 5 %).

Evidence: the worst steps with their prefill tokens (ctx_tokens) and decoding requests (gen_reqs), or the
requests with the worst stalls (--save-detailed itls), with nearest-rank percentiles of the max stalls.

What to do: lower max_num_batched_tokens (the token budget per step, not requests) or the long-prefill
chunk threshold so prefills are split into smaller chunks: prefill completes later, decode runs smoother;
compare TTFT and max stall per request after the change.
"""

from __future__ import annotations

from statistics import median

from tracediag.analyses.serving import bench_evidence, bench_runs, run_label
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


def _from_steps(ctx: Context) -> Check | None:
    steps = ctx.rows(
        "SELECT rank, step_id, name, ts_ns, ctx_reqs, ctx_tokens, gen_reqs, gen_tokens, "
        # the step's GPU window less host-blocking stalls (measured once by KRN006, kept out of step times)
        "coalesce(win_end_ns - win_ts_ns - coalesce(stall_ns, 0), dur_ns) AS gap_ns, win_ts_ns IS NOT NULL AS on_gpu "
        "FROM steps WHERE gen_reqs > 0 ORDER BY rank, step_id"
    )
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
    table = [
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
    evidence = [
        {
            "rank": s["rank"],
            "step": s["step_id"],
            "ts_ns": s["ts_ns"],
            "name": s["name"],
            "prefill_tokens": s["ctx_tokens"],
            "decoding_requests": s["gen_reqs"],
            "gap_ms": s["gap_ns"] / 1e6,
        }
        for s in (over or mixed)[: ctx.settings.max_evidence]
    ]
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


def check(ctx: Context) -> Check:
    result = _from_requests(ctx) or _from_steps(ctx)
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
