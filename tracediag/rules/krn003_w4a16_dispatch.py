"""KRN003 W4A16 dispatch.

Hypothesis: with a 4-bit weight-only checkpoint the projection GEMMs should run fused W4A16 kernels
(Marlin, Machete, AWQ / GPTQ / exllama, bitsandbytes, TensorRT-LLM fpA_intB, int4 packed mm): they read
4-bit weights and dequantize in registers. Two things defeat that: no W4A16 kernel at all (SHP003), or a
separate dequantize kernel that writes 16-bit weights back to memory before a dense GEMM (vLLM's AWQ
does this above a token threshold) — its time Δ is paid every step, and above the budget
(W16 − W4)/BW the quantized path is slower than plain bf16 weights.

Formula: Δ = separate dequantize time per step (per phase); budget = (W16 − W4) / BW with
W16 = 2·(L·P + V·H/p) bytes per rank (P = projection parameters per layer per rank), W4 = L·P·(1/2 + 2/G)
+ 2·V·H/p (4-bit projections, one 16-bit scale per group of G, lm_head left 16-bit); BW from the device
properties, else --hbm-bandwidth. Quantized path slower when Δ > budget.

Evidence: W4A16 kernels and dequantize kernels with calls and time per phase; the byte counts and BW.

What to do: no W4A16 kernel → SHP003. Dequantize kernels → check the engine's per-batch-size path
(e.g. vLLM AWQ dequantizes for ≥ 256 tokens), prefer a Marlin/Machete kernel for this method (awq_marlin,
gptq_marlin), and compare Δ with the budget.
"""

from __future__ import annotations

from collections import defaultdict

from tracediag.engine import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.rules._kernels import (
    SOURCE_LABEL,
    bandwidth,
    call_evidence,
    phase_evidence,
    phase_name,
    prepare,
    source_of,
    tp_degree,
    w16_w4_bytes,
    weight_only_4bit,
)

RULE = RuleMeta(
    id="KRN003",
    step=5,
    title="W4A16 kernels fused (no separate dequantize beyond the budget (W16 − W4)/BW)",
    requires_tables=("steps",),
    requires_model=("H",),
    may_be_downstream_of=("SHP003",),
)


def dequant_budget(w16_bytes: float, w4_bytes: float, bw_bytes_per_s: float) -> float:
    """Seconds of extra, non-overlapped work per step below which the W4 path still beats 16-bit weights."""
    return (w16_bytes - w4_bytes) / bw_bytes_per_s


def check(ctx: Context) -> Check:
    declared = weight_only_4bit(ctx.model)
    if declared is None:
        return not_applicable(RULE, f"missing 4-bit weight-only quantization_config in {ctx.model.path}")
    prepare(ctx)
    source = source_of(ctx)
    rows = ctx.rows(
        """SELECT phase, klass, name, family, sum(calls) AS calls, sum(time_ns) AS time_ns,
                  count(DISTINCT (rank, step_id)) AS steps, arg_min(rank, first_ts_ns) AS rank,
                  arg_min(step_id, first_ts_ns) AS step, min(first_ts_ns) AS ts_ns
           FROM kernel_steps WHERE klass IN ('wo_gemm', 'dequant') AND step_id IS NOT NULL
           GROUP BY ALL ORDER BY klass DESC, time_ns DESC"""
    )
    wo = [r for r in rows if r["klass"] == "wo_gemm"]
    dq = [r for r in rows if r["klass"] == "dequant"]
    p, p_source = tp_degree(ctx)
    w = w16_w4_bytes(ctx.model, p)
    bw, bw_source = bandwidth(ctx)
    values = {
        "declared": declared,
        "time_source": SOURCE_LABEL[source],
        "p": p,
        "p_source": p_source,
        "w4a16_calls": sum(r["calls"] for r in wo),
        "dequant_calls": sum(r["calls"] for r in dq),
    }
    table = [
        {k: r[k] for k in ("klass", "name", "family", "calls", "time_ns", "steps")} | {"phase": phase_name(r["phase"])}
        for r in rows
    ]
    evidence = [phase_evidence(r) for r in rows][: ctx.settings.max_evidence]
    formula = "Δ (dequantize time per step) vs budget (W16 − W4) / BW"
    if not wo:
        dense = ctx.scalar("SELECT coalesce(sum(calls), 0) FROM kernel_steps WHERE klass = 'gemm'")
        if not dense:
            return not_applicable(RULE, "missing GEMMs: no W4A16 or dense GEMM kernel/op in any step")
        ex = ctx.rows(
            """SELECT rank, step_id, first_ts_ns AS ts_ns, name, calls FROM kernel_steps
               WHERE klass = 'gemm' AND step_id IS NOT NULL ORDER BY time_ns DESC LIMIT ?""",
            [ctx.settings.max_evidence],
        )
        return finding(
            RULE,
            severity="warning",
            confidence="high",
            impact=1.0,
            title=f"No W4A16 kernel in any step although the config declares {declared}: {dense} dense GEMM calls",
            formula=formula,
            substituted=f"W4A16 calls = 0; dense GEMM calls = {dense}",
            values=values | {"dense_gemm_calls": dense},
            table=table,
            evidence=[call_evidence(e, "step_id") for e in ex],
            next_check="See SHP003: the weights are not used quantized; fix the load path before the kernel path.",
        )
    if not dq:
        return passed(
            RULE,
            confidence="high",
            title=(
                f"Fused W4A16 path: {values['w4a16_calls']} calls of {', '.join(sorted({r['name'] for r in wo}))}, "
                "no separate dequantize kernel"
            ),
            formula=formula,
            substituted="Δ = 0 (no dequantize kernel or op in any step)",
            values=values,
            table=table,
            evidence=evidence,
        )
    per_phase: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for r in dq:
        acc = per_phase[phase_name(r["phase"])]
        acc[0] += r["time_ns"]
        acc[1] = max(acc[1], r["steps"])
    delta = {ph: t / n for ph, (t, n) in per_phase.items()}
    worst_ph = max(delta, key=delta.get)
    values["delta_ns_per_step"] = delta
    budget_ns = None
    if w is not None:
        values |= {"W16_bytes": w["W16_bytes"], "W4_bytes": w["W4_bytes"], "G": w["G"], "G_source": w["G_source"]}
    if w is not None and bw is not None:
        budget_ns = dequant_budget(w["W16_bytes"], w["W4_bytes"], bw) * 1e9
        values |= {"bandwidth_bytes_per_s": bw, "bandwidth_source": bw_source, "budget_ns": budget_ns}
        substituted = (
            f"{worst_ph}: Δ = {delta[worst_ph] / 1e6:.3g} ms vs ({w['W16_bytes'] / 1e6:.4g} − "
            f"{w['W4_bytes'] / 1e6:.4g} MB) / {bw / 1e9:.4g} GB/s = {budget_ns / 1e6:.3g} ms"
        )
    else:
        values["budget"] = "not computed: " + (bw_source if bw is None else "config lacks h, H_kv, D or I")
        substituted = f"{worst_ph}: Δ = {delta[worst_ph] / 1e6:.3g} ms per step; budget {values['budget']}"
    over = budget_ns is not None and delta[worst_ph] > budget_ns
    return finding(
        RULE,
        severity="warning" if over or budget_ns is None else "info",
        confidence="high" if budget_ns is not None else "medium",
        impact=min(1.0, delta[worst_ph] / budget_ns) if budget_ns else 0.5,
        title=(
            f"Separate dequantize kernels before dense GEMMs in {', '.join(delta)}: Δ = {delta[worst_ph] / 1e6:.3g} ms "
            f"per {worst_ph} step"
            + (
                f" {'>' if over else '≤'} budget (W16 − W4)/BW = {budget_ns / 1e6:.3g} ms"
                + (": the quantized path is slower than 16-bit weights there" if over else "")
                if budget_ns is not None
                else " (budget needs --hbm-bandwidth)"
            )
        ),
        formula=formula,
        substituted=substituted,
        values=values,
        table=table,
        evidence=evidence,
        next_check=(
            "Check which batch sizes take the dequantize path (e.g. vLLM AWQ for ≥ 256 tokens) and whether a "
            "Marlin/Machete kernel exists for this method and GPU (awq_marlin, gptq_marlin)."
        ),
    )
