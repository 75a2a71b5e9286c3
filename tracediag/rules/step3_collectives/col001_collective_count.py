"""COL001 Collective count per step.

Hypothesis: Megatron-style TP runs 2 all-reduces per layer per forward step (attention output,
MLP output). A different count means the simple communication model does not describe this run:
≈ 0 with p > 1 → the all-reduce is not recognised (custom all-reduce) or TP is not in use;
< 2L → fused collectives (all-reduce fused with the residual/norm, a custom collective) or sequence
parallelism (a reduce-scatter after each row-parallel GEMM and an all-gather before each column-parallel
one replace the all-reduces); > 2L → extra collectives (MoE dispatch/all-to-all, extra or debug
collectives). An unfused bias or residual adds elementwise kernels, not collectives.

Formula: n_AR(step, rank) vs 2L, accepted up to 2L + c (c = small constant: vocab-parallel
embedding all-reduce, logits gather). Sequence parallelism: n_RS and n_AG each in [2L, 2L + c + 1]
with no all-reduce — the same bus bytes per step as 2L all-reduces in twice the calls (the SP variant of
the cost model, used by COL002/COL003). Each collective is counted once as the program issued it,
whatever the backend runs for it (gloo runs a reduce-scatter as an all-reduce). Steps that ran no model
work (an empty scheduler iteration) are not counted.

Evidence: per rank and step, the all-reduce calls of the TP group and the other collectives, with
example calls (rank, step, timestamp, event name).

What to do: when the count is neither ≈ 2L all-reduces nor the sequence-parallel pairs, stop applying the
2L·τ_AR(T·H·e_a) model (the simplified formula does not describe this run) and rebuild the communication
account from the trace.
"""

from __future__ import annotations

from collections import Counter

from tracediag.analyses.tp_collectives import (
    SEQUENCE_PARALLEL,
    empty_steps,
    example_calls,
    marked_steps,
    per_step_counts,
    tp_allreduce_where,
    tp_scheme,
    tp_sp_where,
)
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="COL001",
    step=3,
    title="All-reduces per step ≈ 2L",
    requires_tables=("steps",),
    requires_window="complete",
    requires_model=("L",),
    requires_tp=True,
    may_be_downstream_of=("SHP001", "SHP002"),
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
    """The check, once per memoized stretch of the rules (COL003 asks for it again for its cost-model verdict)."""
    return ctx.once(("check", RULE.id), lambda: _check(ctx))


def _off_count_words(worst: str, n: int, n_bad: int, n_steps: int, values: dict) -> tuple[str, str, str]:
    """(title, severity, next check) for the commonest way the all-reduce count misses [2L, 2L + c]: none at all,
    fewer (sequence parallelism or fused collectives), or more (extra collectives); n is an example step's count."""
    L, p, two_l, slack = values["L"], values["p"], values["2L"], values["slack_c"]
    if worst == "none":
        title = (
            f"No TP all-reduce in {n_bad} of {n_steps} steps with p={p}: a custom all-reduce was "
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
            " — all-gather + reduce-scatter pairs present (partial sequence parallelism?)"
            if sp
            else " — fused collectives (all-reduce fused with residual/norm, a custom collective)?"
        )
        severity, nxt = (
            "warning",
            (
                "Count all-gather/reduce-scatter pairs per layer; rebuild the communication account for "
                "sequence parallelism, a fused all-reduce + norm/residual kernel or a custom all-reduce."
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
                "Find the extra call per layer in the evidence (what tensor it reduces: an extra or debug "
                "collective, MoE dispatch) and remove or merge it."
            ),
        )
    return title, severity, nxt


def _check(ctx: Context) -> Check:
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
    empty = empty_steps(ctx)
    all_rows = per_step_counts(ctx, p)
    rows = [r for r in all_rows if (r["rank"], r["step_id"]) not in empty]
    if not rows:
        return not_applicable(RULE, f"missing steps with model work: all {len(all_rows)} marked steps are empty")
    if tp_scheme(ctx, p) == SEQUENCE_PARALLEL:
        return _sequence_parallel(ctx, rows, L, p, slack, len(all_rows) - len(rows))
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
        "empty_steps_not_counted": len(all_rows) - len(rows),
        "scheme": "all-reduce",
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
    title, severity, nxt = _off_count_words(worst, n, len(bad), len(rows), values)
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


def _sequence_parallel(ctx: Context, rows: list[dict], L: int, p: int, slack: int, empty: int) -> Check:
    """Reduce-scatter + all-gather pairs instead of all-reduces: report sequence parallelism."""
    two_l = 2 * L
    rs = Counter(r["reduce_scatter"] for r in rows)
    ag = Counter(r["all_gather"] for r in rows)
    rs_mode, ag_mode = rs.most_common(1)[0][0], ag.most_common(1)[0][0]
    off = [
        r
        for r in rows
        if not (two_l <= r["reduce_scatter"] <= two_l + slack and two_l <= r["all_gather"] <= two_l + slack + 1)
        or r["all_reduce"] > slack
    ]
    values = {
        "L": L,
        "2L": two_l,
        "slack_c": slack,
        "p": p,
        "p_source": ctx.tp.source,
        "scheme": "sequence-parallel",
        "steps_counted": len(rows),
        "empty_steps_not_counted": empty,
        "ranks": len({r["rank"] for r in rows}),
        "reduce_scatter_per_step_mode": rs_mode,
        "all_gather_per_step_mode": ag_mode,
        "all_reduce_per_step_max": max(r["all_reduce"] for r in rows),
        "steps_off": len(off),
        "cost_model": "sequence-parallel variant: 2L reduce-scatters + 2L all-gathers of T·H·e_a per step "
        "(same bus bytes as 2L all-reduces, twice the calls)",
    }
    executed = ctx.rows(
        f"SELECT exec_op, count(*) AS n FROM collectives WHERE op = 'reduce_scatter' AND {tp_sp_where()} "
        "GROUP BY exec_op",
        [p],
    )
    ran_as = {r["exec_op"]: r["n"] for r in executed}
    if ran_as.get("all_reduce"):
        values["reduce_scatter_executed_as"] = (
            f"{ran_as['all_reduce']} reduce-scatters ran as all-reduces of the whole input on the backend "
            "(gloo's reduce_scatter_tensor: allreduce + copy of this rank's chunk); counted once each, as "
            "reduce-scatters"
        )
    formula = "n_RS(step), n_AG(step) ∈ [2L, 2L + c] and n_AR ≈ 0 (sequence parallelism)"
    substituted = (
        f"2L = 2×{L} = {two_l}; observed mode {rs_mode} reduce-scatters, {ag_mode} all-gathers, "
        f"{values['all_reduce_per_step_max']} all-reduces (max) per step"
    )
    ex_step = off[0] if off else rows[0]
    evidence = example_calls(
        ctx, "rank = ? AND step_id = ?", [ex_step["rank"], ex_step["step_id"]], ctx.settings.max_evidence
    )
    ok = not off
    return finding(
        RULE,
        severity="info" if ok else "warning",
        confidence="high",
        impact=0.0 if ok else len(off) / len(rows),
        title=(
            f"Sequence parallelism: {rs_mode} reduce-scatters + {ag_mode} all-gathers per step instead of 2L = "
            f"{two_l} all-reduces (2L + {rs_mode - two_l} and 2L + {ag_mode - two_l})"
            + (
                " — the sequence-parallel variant of the cost model applies (same bus bytes, twice the calls)"
                if ok
                else f"; {len(off)} of {len(rows)} steps do not follow the pattern"
            )
        ),
        formula=formula,
        substituted=substituted,
        values=values,
        table=rows,
        evidence=evidence,
        next_check=(
            "Read COL002/COL003 with the sequence-parallel accounting: each row-parallel output is reduce-scattered "
            "and each column-parallel input all-gathered, 4L calls of T·H·e_a per step; the fixed latency counts "
            "twice as often as with all-reduces, so small decode batches lose more to α."
        ),
        cost_model_applies=ok,
    )
