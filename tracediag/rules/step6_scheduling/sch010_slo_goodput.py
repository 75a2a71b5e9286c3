"""SCH010 SLO goodput.

Hypothesis: what users got is the share of requests that met every latency budget at once, with failed
requests counted as misses — not separate p99s (99 % within TTFT and 99 % within TPOT can be 98 %
jointly) and not vLLM's request goodput, which divides only completed requests by the duration.

Formula: I = success ∧ TTFT ≤ B_f ∧ TPOT ≤ B_d ∧ max ITL ≤ B_i ∧ E2E ≤ B_e per request; attainment ΣI / N
(N includes errors and timeouts: failed requests count as misses, and a result that does not count its
failures — SGLang's — is said to be an upper bound); goodput ΣI / T in SLO-meeting *requests per second*
over the run's duration T (not vLLM's --goodput, which counts only successful requests, nor the per-card
output-token goodput of SHP004). TPOT = (E2E − TTFT)/(O − 1) is undefined for O = 1:
those requests are excluded from TPOT statistics and the TPOT budget is not checked for them. Percentiles
are nearest-rank. Across repeated independent runs the acceptance rule is the minimum attainment over runs —
a pre-declared conservative rule, not a confidence bound; it also needs an error rate within budget, a valid
load test (SCH009) and no sustained queue rise (SCH003). Without
per-request data (no --save-detailed), attainment is bounded from the reported percentiles: per metric
[largest p with v_p ≤ B, smallest p with v_p > B], joint lower bound 1 − Σ(1 − lo_k) (union bound), upper
bound min hi_k, both × completed / N (vLLM's percentiles interpolate linearly).

Evidence: the budgets (--slo), per-request outcomes or the run's percentile table, completed and failed
counts, duration.

What to do: if attainment is below target, find which budget fails first (per-metric attainment), then
follow the walk: queue (SCH003), KV pressure (SCH004), prefill stalls (SCH002). When the bounds straddle the
target the outcome is marked undetermined and the verdict says so ("inconclusive", not "no problem"), with the
one rerun that decides it: per-request results (`vllm bench serve --save-detailed`, `sglang.bench_serving
--output-details`).
"""

from __future__ import annotations

from tracediag.analyses.serving import bench_evidence, bench_percentiles, bench_runs, run_label
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model.servingmath import (
    RequestOutcome,
    attainment_bounds,
    joint_attainment,
    meets_slo,
    metric_bounds_from_percentiles,
    nearest_rank,
)

RULE = RuleMeta(
    id="SCH010",
    step=6,
    title="Requests meet every latency budget jointly (errors counted)",
    may_be_downstream_of=("SCH009", "SCH011", "SCH003", "SCH013", "SCH012", "SCH002", "SCH004"),
    enabled_by=("--slo ttft=MS,tpot=MS,e2el=MS", "--bench"),
)
TARGET = 0.95  # attainment a run must reach (the example target q of the capacity method, docs/method.md SCH010)
FORMULA = "attainment = Σ_i [success ∧ TTFT≤B_f ∧ TPOT≤B_d ∧ E2E≤B_e] / N (errors in N); goodput = ΣI / T"


def _budgets(ctx: Context) -> dict[str, float]:
    return dict(ctx.settings.slo_ms)


def _detailed(ctx: Context, r: dict, slo: dict[str, float]) -> dict:
    rows = ctx.rows(
        "SELECT success, ttft_s, e2el_s, output_len, itl_max_s FROM bench_requests WHERE input_id = ? AND run = ? "
        "ORDER BY req",
        [r["input_id"], r["run"]],
    )
    outcomes = [RequestOutcome(x["success"], x["ttft_s"], x["e2el_s"], x["output_len"], x["itl_max_s"]) for x in rows]
    a = joint_attainment(outcomes, slo, r["duration_s"])
    per_metric = (
        {k: sum(meets_slo(o, {k: v}) for o in outcomes) / len(outcomes) for k, v in slo.items()} if outcomes else {}
    )
    ok = [o for o in outcomes if o.success]
    tpots = [
        (o.e2el_s - o.ttft_s) / (o.output_len - 1)
        for o in ok
        if o.output_len and o.output_len > 1 and o.e2el_s is not None and o.ttft_s is not None
    ]
    return {
        "run": run_label(r),
        "method": "per-request (--save-detailed)",
        "n": a.n,
        "failed": a.failed,
        "good": a.good,
        "attainment": a.attainment,
        "attainment_low": a.attainment,
        "attainment_high": a.attainment,
        "goodput_rps": a.goodput_rps,
        "per_metric": per_metric,
        "p99_nearest_rank_ms": {
            "ttft": (nearest_rank([o.ttft_s for o in ok if o.ttft_s is not None], 99) or 0) * 1000,
            "tpot": (nearest_rank(tpots, 99) or 0) * 1000,
            "e2el": (nearest_rank([o.e2el_s for o in ok if o.e2el_s is not None], 99) or 0) * 1000,
        },
        "one_token_outputs": sum(1 for o in ok if o.output_len is not None and o.output_len <= 1),
    }


def _bounded(ctx: Context, r: dict, slo: dict[str, float]) -> dict | None:
    pct = bench_percentiles(ctx, r["input_id"], r["run"])
    per_metric = {}
    for key, budget in slo.items():
        if key not in pct:
            return None  # a budget on a metric the run did not report: no bound
        per_metric[key] = metric_bounds_from_percentiles(pct[key], budget)
    completed, failed = r["completed"] or 0, r["failed"] or 0
    lo, hi = attainment_bounds(per_metric, completed, failed)
    return {
        "run": run_label(r),
        "method": "bounds from reported percentiles (numpy-interpolated; no per-request data)",
        "n": completed + failed,
        "failed": r["failed"],
        "good": None,
        "attainment": None,
        "attainment_low": lo,
        "attainment_high": hi,
        "goodput_rps": None,
        "goodput_rps_bounds": [lo * (completed + failed) / r["duration_s"], hi * (completed + failed) / r["duration_s"]]
        if r["duration_s"]
        else None,
        "per_metric": {k: list(v) for k, v in per_metric.items()},
        "percentiles_ms": {k: {f"p{p:g}": v for p, v in sorted(pct[k].items())} for k in slo},
    }


def _attainment_per_run(ctx: Context, runs: list[dict], slo: dict[str, float]) -> list[dict]:
    """Per benchmark run its joint attainment: exact from the per-request results, else bounded from the
    percentiles (a run with neither is left out); each row keeps its run under "_r" for the verdict's words."""
    table = []
    for r in runs:
        if r["has_requests"]:
            table.append(_detailed(ctx, r, slo) | {"_r": r})
        else:
            b = _bounded(ctx, r, slo)
            if b is not None:
                table.append(b | {"_r": r})
    return table


def _values(slo: dict[str, float], table: list[dict], worst: dict) -> dict:
    """The finding's values: the worst run's attainment and goodput, and the conventions they were counted by."""
    return {
        "slo_ms": slo,
        "target": TARGET,
        "runs": len(table),
        "min_attainment_over_runs": min(t["attainment_high"] for t in table)
        if all(t["attainment"] is not None for t in table)
        else None,
        "run": worst["run"],
        "method": worst["method"],
        "attainment": worst["attainment"],
        "attainment_low": worst["attainment_low"],
        "attainment_high": worst["attainment_high"],
        "n": worst["n"],
        "failed": worst["failed"],
        "goodput_rps": worst["goodput_rps"],
        "per_metric_attainment": worst["per_metric"],
        "tpot_convention": "TPOT undefined for one-token outputs: excluded from TPOT statistics, budget not checked",
        "goodput_unit": "SLO-meeting requests per second (ΣI / T), failed requests counted as misses",
        "min_over_runs_note": "the minimum over runs is a conservative acceptance rule, not a confidence bound",
        "failures_counted": worst["failed"] is not None,
        "percentile_method": "nearest rank (per-request data); vLLM's reported percentiles interpolate linearly",
    }


def check(ctx: Context) -> Check:
    slo = _budgets(ctx)
    if not slo:
        return not_applicable(
            RULE, "missing SLO budgets: pass --slo ttft=MS,tpot=MS,e2el=MS (itl=MS for the worst gap)"
        )
    runs = bench_runs(ctx)
    if not runs:
        return not_applicable(RULE, "missing benchmark results: pass a `vllm bench serve` result with --bench")
    table = _attainment_per_run(ctx, runs, slo)
    if not table:
        keys = ", ".join(slo)
        return not_applicable(
            RULE, f"missing per-request results (--save-detailed) and percentiles for every budgeted metric ({keys})"
        )
    worst = min(table, key=lambda t: t["attainment_high"])
    r = worst.pop("_r")
    for t in table:
        t.pop("_r", None)
    exact = worst["attainment"] is not None
    values = _values(slo, table, worst)
    budgets = ", ".join(f"{k} ≤ {v:g} ms" for k, v in slo.items())
    if exact:
        substituted = f"{worst['run']}: {worst['good']} / {worst['n']} = {worst['attainment']:.4f} ({budgets})"
        att_txt = f"{worst['attainment'] * 100:.1f} %"
    else:
        terms = " + ".join(f"(1 − {lo:.2f})" for lo, _ in worst["per_metric"].values())
        substituted = (
            f"{worst['run']}: lower = (1 − [{terms}]) × {r['completed']}/{worst['n']} = {worst['attainment_low']:.3f}, "
            f"upper = min hi_k × {r['completed']}/{worst['n']} = {worst['attainment_high']:.3f} ({budgets})"
        )
        att_txt = f"between {worst['attainment_low'] * 100:.1f} % and {worst['attainment_high'] * 100:.1f} %"
    evidence = [bench_evidence(r, attainment_low=worst["attainment_low"], attainment_high=worst["attainment_high"])]
    common = {"formula": FORMULA, "substituted": substituted, "values": values, "table": table, "evidence": evidence}
    if worst["attainment_low"] >= TARGET:
        return passed(
            RULE,
            confidence="high" if exact else "medium",
            **common,
            title=f"Joint SLO attainment {att_txt} ≥ target {TARGET:.0%} ({budgets}; errors counted)",
        )
    failing = [k for k, v in worst["per_metric"].items() if (v if exact else v[1]) < TARGET]
    nxt = (
        f"Budgets failing most: {', '.join(failing) or 'jointly, not one alone'}. Follow the walk: queue growth "
        "(SCH003), KV pressure (SCH004), prefill stalls (SCH002); rerun with --save-detailed for exact attainment."
    )
    if worst["attainment_high"] < TARGET:
        return finding(
            RULE,
            severity="error",
            confidence="high" if exact else "medium",
            impact=1 - worst["attainment_high"],
            impact_basis="requests (missing the joint SLO)",
            next_check=nxt,
            **common,
            title=f"Joint SLO attainment {att_txt} < target {TARGET:.0%} ({budgets}; errors counted)",
        )
    sglang = ctx.scalar("SELECT count(*) FROM inputs WHERE input_id = ? AND format = 'sglang-bench'", [r["input_id"]])
    rerun = (
        "rerun `python -m sglang.bench_serving` with --output-details (per-request TTFT, ITL and errors)"
        if sglang
        else "rerun `vllm bench serve` with --save-detailed (per-request TTFT, ITL, E2E and errors)"
    )
    return finding(
        RULE,
        severity="info",
        confidence="low",
        impact=1 - worst["attainment_low"],
        impact_basis="requests (missing the joint SLO, at most)",
        next_check=nxt,
        **common,
        undetermined=f"{rerun} and pass that result with --bench: exact joint attainment against the "
        f"{TARGET:.0%} target",
        title=(
            f"Joint SLO attainment undetermined: {att_txt} around the {TARGET:.0%} target — the percentiles cannot "
            "tell; rerun with --save-detailed"
        ),
    )
