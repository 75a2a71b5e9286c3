"""COL001 Collective count per step.

Hypothesis: Megatron-style TP runs 2 all-reduces per layer per forward step (attention output,
MLP output). A different count means the simple communication model does not describe this run:
≈ 0 with p > 1 → the all-reduce is not recognised (custom all-reduce) or TP is not in use;
< 2L → fused collectives or sequence parallelism (all-gather + reduce-scatter pairs replace
all-reduces); > 2L → extra collectives (unfused bias/residual, MoE all-to-all, debug syncs).

Formula: n_AR(step, rank) vs 2L, accepted up to 2L + c (c = small constant: vocab-parallel
embedding all-reduce, logits gather).

Evidence: per rank and step, the all-reduce calls of the TP group and the other collectives, with
example calls (rank, step, timestamp, event name).

What to do: when the count is not ≈ 2L, stop applying the 2L·τ_AR(T·H·e_a) model (seed: "stop
applying the simplified formula") and rebuild the communication account from the trace.
"""

from __future__ import annotations

from collections import Counter

from tracediag.engine import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.rules._tp_collectives import example_calls, marked_steps, tp_allreduce_where

RULE = RuleMeta(
    id="COL001",
    step=3,
    title="All-reduces per step ≈ 2L",
    requires_tables=("steps",),
    requires_model=("L",),
    requires_tp=True,
    may_be_downstream_of=("SHP001", "SHP002"),
)


def _per_step_counts(ctx: Context, p: int) -> list[dict]:
    return ctx.rows(
        f"""
        SELECT s.rank, s.step_id, s.phase, s.T,
            count(c.op) FILTER (WHERE {tp_allreduce_where("c")})
                AS all_reduce,
            count(c.op) FILTER (WHERE c.op = 'all_gather') AS all_gather,
            count(c.op) FILTER (WHERE c.op = 'reduce_scatter') AS reduce_scatter,
            count(c.op) FILTER (WHERE c.op = 'all_to_all') AS all_to_all,
            count(c.op) AS all_collectives
        FROM steps s LEFT JOIN collectives c ON c.rank = s.rank AND c.step_id = s.step_id
        WHERE s.marker_source <> 'whole trace (no step markers)'
        GROUP BY s.rank, s.step_id, s.phase, s.T ORDER BY s.rank, s.step_id
        """,
        [p],
    )


def _verdict(n: int, two_l: int, slack: int) -> str:
    if n == 0:
        return "none"
    if n < two_l:
        return "fewer"
    if n > two_l + slack:
        return "more"
    return "ok"


def check(ctx: Context) -> Check:
    L, p, slack = ctx.model.L, ctx.tp.p, ctx.settings.collective_count_slack
    if p == 1:
        return not_applicable(RULE, "p = 1: no tensor-parallel collectives to count")
    if not marked_steps(ctx):
        return not_applicable(
            RULE,
            "missing engine step boundaries (no vLLM step annotation, ProfilerStep#N or execute_model "
            "range in the trace): counts per step cannot be formed",
        )
    two_l = 2 * L
    rows = _per_step_counts(ctx, p)
    for r in rows:
        r["verdict"] = _verdict(r["all_reduce"], two_l, slack)
    verdicts = Counter(r["verdict"] for r in rows)
    counts = Counter(r["all_reduce"] for r in rows)
    mode_n, _ = counts.most_common(1)[0]
    bad = [r for r in rows if r["verdict"] != "ok"]
    values = {
        "L": L,
        "2L": two_l,
        "slack_c": slack,
        "p": p,
        "p_source": ctx.tp.source,
        "steps_counted": len(rows),
        "ranks": len({r["rank"] for r in rows}),
        "all_reduce_per_step_mode": mode_n,
        "all_reduce_per_step_min": min(counts),
        "all_reduce_per_step_max": max(counts),
        "extra_over_2L_mode": mode_n - two_l,
        "steps_ok": verdicts.get("ok", 0),
        "steps_off": len(bad),
        "all_gather_per_step_max": max(r["all_gather"] for r in rows),
        "reduce_scatter_per_step_max": max(r["reduce_scatter"] for r in rows),
        "all_to_all_per_step_max": max(r["all_to_all"] for r in rows),
    }
    formula = "n_AR(step) ∈ [2L, 2L + c]"
    substituted = f"2L = 2×{L} = {two_l}; accepted {two_l}…{two_l + slack}; observed mode {mode_n}"
    if not bad:
        return passed(
            RULE,
            confidence="high",
            title=f"{mode_n} all-reduces per step = 2L + {mode_n - two_l} on every rank and step ({len(rows)} steps)",
            formula=formula,
            substituted=substituted,
            values=values,
            table=rows,
            evidence=example_calls(ctx, tp_allreduce_where(), [p], ctx.settings.max_evidence),
            cost_model_applies=True,
        )
    worst = Counter(r["verdict"] for r in bad).most_common(1)[0][0]
    ex_step = next(r for r in bad if r["verdict"] == worst)
    evidence = example_calls(
        ctx, "rank = ? AND step_id = ?", [ex_step["rank"], ex_step["step_id"]], ctx.settings.max_evidence
    )
    n = ex_step["all_reduce"]
    if worst == "none":
        title = (
            f"No TP all-reduce in {len(bad)} of {len(rows)} steps with p={p}: a custom all-reduce was "
            "not recognised, or the run is not tensor-parallel"
        )
        severity, nxt = (
            "error",
            (
                "Look for custom all-reduce kernels/ops in the kernel table (vLLM "
                "cross_device_reduce_*, symm_mem, FlashInfer/TRT-LLM AR) and check --tp."
            ),
        )
    elif worst == "fewer":
        sp = values["all_gather_per_step_max"] and values["reduce_scatter_per_step_max"]
        title = f"{n} all-reduces per step, fewer than 2L = {two_l}" + (
            " — all-gather + reduce-scatter pairs present (sequence parallelism)" if sp else " — fused collectives?"
        )
        severity, nxt = (
            "warning",
            (
                "Count all-gather/reduce-scatter pairs per layer; rebuild the "
                "communication account for sequence parallelism or fused AR+norm kernels."
            ),
        )
    else:
        title = (
            f"{n} all-reduces per step vs 2L = {two_l} (accepted up to {two_l + slack}): {n - two_l} "
            f"extra, ≈ {round((n - two_l) / L)} per layer — extra collectives"
        )
        severity, nxt = (
            "warning",
            (
                "Find the extra call per layer in the evidence (unfused bias/residual "
                "all-reduce, MoE all-to-all, debug syncs) and remove or fuse it."
            ),
        )
    return finding(
        RULE,
        severity=severity,
        confidence="high",
        impact=len(bad) / len(rows),
        title=title,
        formula=formula,
        substituted=substituted,
        values=values,
        table=rows,
        evidence=evidence,
        next_check=nxt + " The 2L·τ_AR(T·H·e_a) cost model does not apply to this run.",
        cost_model_applies=False,
    )
