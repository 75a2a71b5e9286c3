"""KRN003 Low-bit dispatch: each quantized group on a fused kernel of its format.

Hypothesis: a quantized module group should run a fused kernel of its format that reads the packed weights and
dequantizes in registers — W4A16 (Marlin, Machete, AWQ / GPTQ / exllama, bitsandbytes, TensorRT-LLM fpA_intB,
int4 packed mm, Triton matmul_ogs with MXFP4), W4A8 (MXFP4 × MXFP8 trtllm-gen MoE), W4A4 (NVFP4), W8A8 (FP8
scaled-mm, DeepGEMM, CUTLASS / CK MoE). Two things defeat that: no kernel of the format at all (SHP003), or
a separate dequantize kernel that writes 16-bit weights back to memory before a dense GEMM (vLLM's AWQ does
this above a token threshold) — its time Δ is paid every step, and above the budget (W16 − Wq)/BW the
quantized path is slower than plain 16-bit weights. Activation-quantize kernels (FP8 / NVFP4 / MXFP8 quant of
the activations before a W8A8 / W4A4 / W4A8 GEMM) are listed with their time: they are part of the path.

Formula: Δ = separate dequantize time per step (per phase); budget = (W16 − Wq) / BW with W16 and Wq the
bytes one rank holds of the quantized dense groups at 16 bits and at their declared format (scales included;
tracediag.model.accounting); BW from --hbm-bandwidth, else the device properties' spec peak. Quantized path
slower when Δ > budget. The budget assumes both paths bandwidth-bound (the notes' W4A16 decode model), so it
judges decode steps (and steps of unknown phase) only: a prefill's Δ is reported with its share of the prefill
step, to be measured against a 16-bit run (the notes: a decode ratio does not carry over to prefill). Without a
bandwidth the budget cannot be computed: the finding is info and says what would decide it.

Evidence: per quantized group the kernels that served it and the scheme read from their names (W4A16, W4A8,
W8A8, W4A4); dequantize and activation-quantize kernels with calls and time per phase; the byte counts and BW.

What to do: no kernel of the format → SHP003. Dequantize kernels → check the engine's per-batch-size path
(e.g. vLLM AWQ dequantizes for ≥ 256 tokens), prefer a Marlin/Machete kernel for this method (awq_marlin,
gptq_marlin), and compare Δ with the budget.
"""

from __future__ import annotations

from collections import defaultdict

from tracediag.analyses.kernels import (
    SOURCE_LABEL,
    bandwidth,
    call_evidence,
    declared_formats,
    group_dispatch,
    kernels_in_words,
    phase_evidence,
    phase_name,
    source_of,
    tp_degree,
    unphased_name,
)
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model import accounting

RULE = RuleMeta(
    id="KRN003",
    step=5,
    title="Quantized groups on fused kernels of their format (no separate dequantize beyond (W16 − Wq)/BW)",
    requires_tables=("steps",),
    requires_model=("H",),
    may_be_downstream_of=("SHP003",),
)


# phases whose steps are compute-bound: the bandwidth budget (both paths bandwidth-bound) does not judge them
UNBUDGETED = ("prefill", "mixed")


def _units(ctx: Context) -> str:
    """What the dequantize steps are in this trace: GPU kernels, or CPU ops (a CPU trace)."""
    return "kernels" if source_of(ctx) == "gpu_kernel" else "ops"


def _mean_step_ns(ctx: Context) -> dict[str, float]:
    """Mean step time per phase name (step_activity: the step's GPU window, or its host span on a CPU trace)."""
    rows = ctx.rows("SELECT phase, avg(step_ns) AS step_ns FROM step_activity WHERE step_ns > 0 GROUP BY phase")
    unphased = unphased_name(ctx)
    return {phase_name(r["phase"], unphased): r["step_ns"] for r in rows}


def _dequant_fields(ctx: Context, formula: str, substituted: str, values: dict, table: list, dq: list) -> dict:
    """The numbers and events a finding about separate dequantize kernels shows."""
    return {
        "formula": formula,
        "substituted": substituted,
        "values": values,
        "table": table,
        "evidence": [phase_evidence(r, unphased_name(ctx)) for r in dq][: ctx.settings.max_evidence],
    }


def _prefill_only(
    ctx: Context,
    delta: dict[str, float],
    step_ns: dict[str, float],
    values: dict,
    table: list,
    dq: list,
    formula: str,
    fused_decode: bool,
) -> Check:
    """Separate dequantize kernels in compute-bound steps only (vLLM's AWQ at ≥ 256 tokens): their time and its
    share of those steps, not judged against the decode budget."""
    worst = max(delta, key=delta.get)
    share = delta[worst] / step_ns[worst] if step_ns.get(worst) else None
    values["budget"] = "not applied: the (W16 − Wq)/BW budget assumes bandwidth-bound (decode) steps"
    per = "; ".join(
        f"{ph}: Δ = {d / 1e6:.3g} ms per step"
        + (f" of {step_ns[ph] / 1e6:.3g} ms = {d / step_ns[ph]:.1%}" if step_ns.get(ph) else "")
        for ph, d in delta.items()
    )
    return finding(
        RULE,
        severity="info",
        confidence="medium",
        impact=min(1.0, share or 0.0),
        title=(
            f"Separate dequantize {_units(ctx)} before dense GEMMs in {', '.join(delta)} steps only: Δ = "
            f"{delta[worst] / 1e6:.3g} ms per {worst} step"
            + (f" ({share:.1%} of it)" if share is not None else "")
            + ("; decode steps run the fused low-bit kernel" if fused_decode else "")
        ),
        **_dequant_fields(ctx, formula, per, values, table, dq),
        next_check=(
            "The dequantize-then-GEMM path runs where the engine expects it to be compute-bound (vLLM AWQ: ≥ 256 "
            "tokens); the decode budget (W16 − Wq)/BW does not judge it — compare prefill time (TTFT) with a "
            "16-bit run of the same prompts, and prefer a Marlin/Machete kernel (awq_marlin, gptq_marlin)."
        ),
    )


def dequant_budget(w16_bytes: float, w4_bytes: float, bw_bytes_per_s: float) -> float:
    """Seconds of extra, non-overlapped work per step below which the W4 path still beats 16-bit weights."""
    return (w16_bytes - w4_bytes) / bw_bytes_per_s


def _scheme_words(v) -> str:
    """'experts mxfp4 W4A16 on Triton matmul_ogs (MXFP4 MoE) W4A16 (2 kernels, 48 calls)'."""
    return f"{v.group} {v.declared.name} {v.declared.scheme}" + (
        f" on {kernels_in_words(v.kernels)}" if v.kernels else ""
    )


def check(ctx: Context) -> Check:
    m = ctx.model
    if m.quant is None or not m.quant.quantized_groups:
        return not_applicable(RULE, f"missing quantization_config: {m.path} declares no quantized module group")
    source = source_of(ctx)
    p, p_source = tp_degree(ctx)
    verdicts, gemms, _ = group_dispatch(ctx, p)
    aux = ctx.rows(
        """SELECT phase, klass, family, name, sum(calls) AS calls, sum(time_ns) AS time_ns,
                  count(DISTINCT (rank, step_id)) AS steps, arg_min(rank, first_ts_ns) AS rank,
                  arg_min(step_id, first_ts_ns) AS step, min(first_ts_ns) AS ts_ns
           FROM kernel_steps WHERE (klass = 'dequant' OR family = 'act_quant') AND step_id IS NOT NULL
           GROUP BY ALL ORDER BY time_ns DESC, phase, klass, family, name"""
    )
    dq = [r for r in aux if r["klass"] == "dequant"]
    aq = [r for r in aux if r["family"] == "act_quant"]
    lowbit = [r for r in gemms if r["fmt"].lowbit]
    values = {
        "declared": declared_formats(m),
        "time_source": SOURCE_LABEL[source],
        "p": p,
        "p_source": p_source,
        "lowbit_calls": sum(r["calls"] for r in lowbit),
        "schemes_run": sorted({r["fmt"].scheme for r in lowbit}),
        "dequant_calls": sum(r["calls"] for r in dq),
        "act_quant_calls": sum(r["calls"] for r in aq),
        "act_quant_time_ns": sum(r["time_ns"] for r in aq),
        "groups": [v.row() for v in verdicts],
    }
    table = [v.row() for v in verdicts] + [
        {k: r[k] for k in ("klass", "name", "family", "calls", "time_ns", "steps")}
        | {"phase": phase_name(r["phase"], unphased_name(ctx))}
        for r in aux
    ]
    formula = "per quantized group: a kernel of its format; Δ (dequantize time per step) vs budget (W16 − Wq) / BW"
    missing = [v for v in verdicts if v.verdict in ("not_applied", "partly")]
    if missing:
        if not gemms:
            return not_applicable(RULE, "missing GEMMs: no GEMM kernel or op in any step")
        dense_calls = sum(r["calls"] for r in gemms if not r["fmt"].lowbit)
        ex = sorted((r for r in gemms if not r["fmt"].lowbit), key=lambda r: -r["time_ns"])[: ctx.settings.max_evidence]
        schemes = sorted({v.declared.scheme for v in missing})
        return finding(
            RULE,
            severity="warning",
            confidence="high",
            impact=len(missing) / len(verdicts),
            title=(
                f"No {'/'.join(schemes)} kernel for {', '.join(f'{v.group} ({v.declared.name})' for v in missing)} "
                f"although the config declares {values['declared']}: {dense_calls} dense GEMM calls"
            ),
            formula=formula,
            substituted="; ".join(f"{v.group}: {v.verdict} — {v.why}" for v in verdicts),
            values=values | {"dense_gemm_calls": dense_calls, "w4a16_calls": values["lowbit_calls"]},
            table=table,
            evidence=[call_evidence(e) for e in ex],
            next_check="See SHP003: the weights are not used quantized; fix the load path before the kernel path.",
        )
    if not dq:
        ran = [v for v in verdicts if v.kernels]
        aq_note = f"; activation quantize {len(aq)} kernel(s), {values['act_quant_time_ns'] / 1e6:.3g} ms" if aq else ""
        return passed(
            RULE,
            confidence="high" if all(v.verdict == "applied" for v in verdicts) else "low",
            title=(
                f"Fused low-bit path: {'; '.join(_scheme_words(v) for v in ran) or 'no quantized group seen'}, "
                f"no separate dequantize kernel{aq_note}"
            ),
            formula=formula,
            substituted="Δ = 0 (no dequantize kernel or op in any step)",
            values=values | {"w4a16_calls": values["lowbit_calls"]},
            table=table,
            evidence=[phase_evidence(r, unphased_name(ctx)) for r in aux][: ctx.settings.max_evidence]
            or [call_evidence(r, scheme=r["fmt"].scheme) for r in lowbit][: ctx.settings.max_evidence],
        )
    per_phase: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for r in dq:
        acc = per_phase[phase_name(r["phase"], unphased_name(ctx))]
        acc[0] += r["time_ns"]
        acc[1] = max(acc[1], r["steps"])
    delta = {ph: t / n for ph, (t, n) in per_phase.items()}
    values["delta_ns_per_step"] = delta
    step_ns = _mean_step_ns(ctx)
    values["step_ns_mean"] = {ph: step_ns.get(ph) for ph in delta}
    judged = {ph: d for ph, d in delta.items() if ph not in UNBUDGETED}
    if not judged:  # dequantize in prefill (or mixed) steps only: compute-bound there, the budget does not hold
        fused_decode = any(r["fmt"].lowbit and r["phase"] == "decode" for r in gemms)
        return _prefill_only(ctx, delta, step_ns, values, table, dq, formula, fused_decode)
    worst_ph = max(judged, key=judged.get)
    dense_groups = [v.group for v in verdicts if v.group != "experts"]
    served = accounting.formats(m)
    w16 = sum(
        g.bytes_per_rank
        for g in accounting.weights(m, p, {g: accounting.W16 for g in served})
        if g.group in dense_groups
    )
    wq = sum(g.bytes_per_rank for g in accounting.weights(m, p, served) if g.group in dense_groups)
    values |= {
        "W16_bytes": round(w16),
        "Wq_bytes": round(wq),
        "W4_bytes": round(wq),
        "budget_groups": dense_groups,
        "weight_table": [g.row() for g in accounting.weights(m, p, served) if g.group in dense_groups],
    }
    bw, bw_source = bandwidth(ctx)
    budget_ns = None
    if bw is not None and w16 > wq:
        budget_ns = dequant_budget(w16, wq, bw) * 1e9
        values |= {"bandwidth_bytes_per_s": bw, "bandwidth_source": bw_source, "budget_ns": budget_ns}
        substituted = (
            f"{worst_ph}: Δ = {delta[worst_ph] / 1e6:.3g} ms vs ({w16 / 1e6:.4g} − {wq / 1e6:.4g} MB) / "
            f"{bw / 1e9:.4g} GB/s = {budget_ns / 1e6:.3g} ms"
        )
    else:
        values["budget"] = "not computed: " + (bw_source if bw is None else "no dense quantized group")
        substituted = f"{worst_ph}: Δ = {delta[worst_ph] / 1e6:.3g} ms per step; budget {values['budget']}"
    over = budget_ns is not None and delta[worst_ph] > budget_ns
    share = delta[worst_ph] / step_ns[worst_ph] if step_ns.get(worst_ph) else None
    decide = (
        None
        if budget_ns is not None
        else "pass --hbm-bandwidth GB/s (the GPU's sustained memory bandwidth): Δ against the budget (W16 − Wq)/BW"
    )
    return finding(
        RULE,
        severity="warning" if over else "info",
        confidence="high" if budget_ns is not None else "medium",
        # the share of the budget Δ takes; without a budget, the share of the step Δ takes (a measure, not a guess)
        impact=min(1.0, delta[worst_ph] / budget_ns) if budget_ns else min(1.0, share or 0.0),
        undetermined=decide,
        title=(
            f"Separate dequantize {_units(ctx)} before dense GEMMs in {', '.join(delta)}: Δ = "
            f"{delta[worst_ph] / 1e6:.3g} ms "
            f"per {worst_ph} step"
            + (
                f" {'>' if over else '≤'} budget (W16 − Wq)/BW = {budget_ns / 1e6:.3g} ms"
                + (": the quantized path is slower than 16-bit weights there" if over else "")
                if budget_ns is not None
                else " (budget needs --hbm-bandwidth)"
            )
        ),
        **_dequant_fields(ctx, formula, substituted, values, table, dq),
        next_check=(
            "Check which batch sizes take the dequantize path (e.g. vLLM AWQ for ≥ 256 tokens) and whether a "
            "Marlin/Machete kernel exists for this method and GPU (awq_marlin, gptq_marlin)."
        ),
    )
