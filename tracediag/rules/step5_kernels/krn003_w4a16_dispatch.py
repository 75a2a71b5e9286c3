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
bandwidth the budget cannot be computed: the finding is info and says what would decide it. Δ counts the dense
groups' dequantize only, as the budget does: a dequantize inside a fused-MoE op serves the experts and is shown
apart (analyses/dequant.py). The impact (what the verdict ranks) is the dense groups' dequantize time over the
window's step time (analyses/basis.py); with no kernel of the declared format, the 16-bit GEMMs' time over it; Δ
against the budget (or Δ's share of the step) judges the finding and is shown beside it.

Evidence: per quantized group the kernels that served it and the scheme read from their names (W4A16, W4A8,
W8A8, W4A4); dequantize and activation-quantize kernels with calls and time per phase; the byte counts and BW.

What to do: no kernel of the format → SHP003. Dequantize kernels → check the engine's per-batch-size path
(e.g. vLLM AWQ dequantizes for ≥ 256 tokens), prefer a Marlin/Machete kernel for this method (awq_marlin,
gptq_marlin), and compare Δ with the budget.
"""

from __future__ import annotations

from tracediag.analyses.basis import window_time
from tracediag.analyses.dequant import LowBitDispatch, dense_budget_bytes, measure
from tracediag.analyses.kernels import (
    bandwidth,
    call_evidence,
    kernels_in_words,
    phase_evidence,
    source_of,
    unphased_name,
)
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

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


def _dequant_fields(ctx: Context, formula: str, substituted: str, values: dict, table: list, dq: list) -> dict:
    """The numbers and events a finding about separate dequantize kernels shows."""
    return {
        "formula": formula,
        "substituted": substituted,
        "values": values,
        "table": table,
        "evidence": [phase_evidence(r, unphased_name(ctx)) for r in dq][: ctx.settings.max_evidence],
    }


def _window_impact(ctx: Context, part_ns: float, fields: dict, what: str) -> dict:
    """impact / impact_basis of `part_ns` on the window's time (analyses/basis.py), its inputs added to the values and
    the substitution: every trace-side finding ranks on it; the rule's own share stays beside it."""
    wt = window_time(ctx)
    fields["values"] = fields["values"] | wt.values(part_ns)
    fields["substituted"] = f"{fields['substituted']}; impact ({what}) {wt.text(part_ns)}"
    return {"impact": wt.share(part_ns), "impact_basis": wt.basis}


def _prefill_only(ctx: Context, d: LowBitDispatch, formula: str, fused_decode: bool) -> Check:
    """Separate dequantize kernels in compute-bound steps only (vLLM's AWQ at ≥ 256 tokens): their time and its
    share of those steps, not judged against the decode budget."""
    delta, step_ns, values = d.delta, d.step_ns, d.values
    worst = max(delta, key=delta.get)
    share = delta[worst] / step_ns[worst] if step_ns.get(worst) else None
    values["budget"] = "not applied: the (W16 − Wq)/BW budget assumes bandwidth-bound (decode) steps"
    values["delta_share_of_step"] = round(share, 4) if share is not None else None
    per = "; ".join(
        f"{ph}: Δ = {x / 1e6:.3g} ms per step"
        + (f" of {step_ns[ph] / 1e6:.3g} ms = {x / step_ns[ph]:.1%}" if step_ns.get(ph) else "")
        for ph, x in delta.items()
    )
    fields = _dequant_fields(ctx, formula, per, values, d.table, d.dq)
    return finding(
        RULE,
        severity="info",
        confidence="medium",
        **_window_impact(ctx, d.dense_dequant_ns, fields, "the dense groups' dequantize time"),
        cost_ns=int(d.dense_dequant_ns),
        title=(
            f"Separate dequantize {_units(ctx)} before dense GEMMs in {', '.join(delta)} steps only: Δ = "
            f"{delta[worst] / 1e6:.3g} ms per {worst} step"
            + (f" ({share:.1%} of it)" if share is not None else "")
            + ("; decode steps run the fused low-bit kernel" if fused_decode else "")
        ),
        **fields,
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


FORMULA = "per quantized group: a kernel of its format; Δ (dequantize time per step) vs budget (W16 − Wq) / BW"


def check(ctx: Context) -> Check:
    m = ctx.model
    if m.quant is None or not m.quant.quantized_groups:
        return not_applicable(RULE, f"missing quantization_config: {m.path} declares no quantized module group")
    d = measure(ctx)
    if any(v.verdict in ("not_applied", "partly") for v in d.verdicts):
        if not d.gemms:
            return not_applicable(RULE, "missing GEMMs: no GEMM kernel or op in any step")
        return _not_served(ctx, d)
    if not d.delta:
        return _fused(ctx, d)
    judged = {ph: x for ph, x in d.delta.items() if ph not in UNBUDGETED}
    if not judged:  # dequantize in prefill (or mixed) steps only: compute-bound there, the budget does not hold
        fused_decode = any(r["fmt"].lowbit and r["phase"] == "decode" for r in d.gemms)
        return _prefill_only(ctx, d, FORMULA, fused_decode)
    return _judged(ctx, d, max(judged, key=judged.get))


def _not_served(ctx: Context, d: LowBitDispatch) -> Check:
    """A quantized group with no kernel of its format (SHP003's): the 16-bit GEMMs that run in its place."""
    missing = [v for v in d.verdicts if v.verdict in ("not_applied", "partly")]
    dense = [r for r in d.gemms if not r["fmt"].lowbit]
    dense_calls = sum(r["calls"] for r in dense)
    ex = sorted(dense, key=lambda r: -r["time_ns"])[: ctx.settings.max_evidence]
    schemes = sorted({v.declared.scheme for v in missing})
    fields = {
        "formula": FORMULA,
        "substituted": "; ".join(f"{v.group}: {v.verdict} — {v.why}" for v in d.verdicts),
        "values": d.values
        | {
            "dense_gemm_calls": dense_calls,
            "w4a16_calls": d.values["lowbit_calls"],
            "share_of_groups_not_served": round(len(missing) / len(d.verdicts), 4),
        },
    }
    return finding(
        RULE,
        severity="warning",
        confidence="high",
        # the time at stake: the 16-bit GEMMs that run where the config declares a low-bit format
        **_window_impact(ctx, sum(r["time_ns"] for r in dense), fields, "the 16-bit GEMMs' time"),
        title=(
            f"No {'/'.join(schemes)} kernel for {', '.join(f'{v.group} ({v.declared.name})' for v in missing)} "
            f"although the config declares {d.values['declared']}: {dense_calls} dense GEMM calls"
        ),
        **fields,
        table=d.table,
        evidence=[call_evidence(e) for e in ex],
        next_check="See SHP003: the weights are not used quantized; fix the load path before the kernel path.",
    )


def _fused(ctx: Context, d: LowBitDispatch) -> Check:
    """No separate dequantize of a dense group: the fused low-bit path (a pass)."""
    ran = [v for v in d.verdicts if v.kernels]
    aq_note = (
        f"; activation quantize {len(d.aq)} kernel(s), {d.values['act_quant_time_ns'] / 1e6:.3g} ms" if d.aq else ""
    )
    experts = d.values.get("experts_dequant")
    ex_note = (
        f"; the experts' dequantize ({sum(e['time_ns'] for e in experts.values()) / 1e6:.3g} ms, inside the fused-MoE "
        "op) measured apart"
        if experts
        else ""
    )
    lowbit = d.lowbit
    return passed(
        RULE,
        confidence="high" if all(v.verdict == "applied" for v in d.verdicts) else "low",
        title=(
            f"Fused low-bit path: {'; '.join(_scheme_words(v) for v in ran) or 'no quantized group seen'}, "
            f"no separate dequantize kernel{aq_note}{ex_note}"
        ),
        formula=FORMULA,
        substituted="Δ = 0 (no dequantize kernel or op of a dense group in any step)",
        values=d.values | {"w4a16_calls": d.values["lowbit_calls"]},
        table=d.table,
        evidence=[phase_evidence(r, unphased_name(ctx)) for r in d.dq + d.aq][: ctx.settings.max_evidence]
        or [call_evidence(r, scheme=r["fmt"].scheme) for r in lowbit][: ctx.settings.max_evidence],
    )


def _judged(ctx: Context, d: LowBitDispatch, worst_ph: str) -> Check:
    """Δ of the dense groups in decode (or unknown-phase) steps against the budget (W16 − Wq)/BW."""
    delta, values = d.delta, d.values
    w16, wq, dense_groups, rows = dense_budget_bytes(ctx, d)
    values |= {
        "W16_bytes": round(w16),
        "Wq_bytes": round(wq),
        "W4_bytes": round(wq),
        "budget_groups": dense_groups,
        "weight_table": [g.row() for g in rows],
    }
    bw, bw_source = bandwidth(ctx)
    budget_ns = None
    if bw is not None and w16 > wq:
        budget_ns = dequant_budget(w16, wq, bw) * 1e9
        values |= {"bandwidth_bytes_per_s": bw, "bandwidth_source": bw_source, "budget_ns": budget_ns}
        values["delta_over_budget"] = round(delta[worst_ph] / budget_ns, 4)
        substituted = (
            f"{worst_ph}: Δ = {delta[worst_ph] / 1e6:.3g} ms vs ({w16 / 1e6:.4g} − {wq / 1e6:.4g} MB) / "
            f"{bw / 1e9:.4g} GB/s = {budget_ns / 1e6:.3g} ms"
        )
    else:
        values["budget"] = "not computed: " + (bw_source if bw is None else "no dense quantized group")
        substituted = f"{worst_ph}: Δ = {delta[worst_ph] / 1e6:.3g} ms per step; budget {values['budget']}"
    over = budget_ns is not None and delta[worst_ph] > budget_ns
    step = d.step_ns.get(worst_ph)
    values["delta_share_of_step"] = round(delta[worst_ph] / step, 4) if step else None
    fields = _dequant_fields(ctx, FORMULA, substituted, values, d.table, d.dq)
    return finding(
        RULE,
        severity="warning" if over else "info",
        confidence="high" if budget_ns is not None else "medium",
        # ranked on the window's time: the dense groups' dequantize time over the window; Δ against the budget (or,
        # without one, Δ's share of the step) judges it and is shown beside it
        **_window_impact(ctx, d.dense_dequant_ns, fields, "the dense groups' dequantize time"),
        cost_ns=int(d.dense_dequant_ns),
        undetermined=None
        if budget_ns is not None
        else "pass --hbm-bandwidth GB/s (the GPU's sustained memory bandwidth): Δ against the budget (W16 − Wq)/BW",
        title=(
            f"Separate dequantize {_units(ctx)} before dense GEMMs in {', '.join(delta)}: Δ = "
            f"{delta[worst_ph] / 1e6:.3g} ms per {worst_ph} step"
            + (
                f" {'>' if over else '≤'} budget (W16 − Wq)/BW = {budget_ns / 1e6:.3g} ms"
                + (": the quantized path is slower than 16-bit weights there" if over else "")
                if budget_ns is not None
                else " (budget needs --hbm-bandwidth)"
            )
        ),
        **fields,
        next_check=(
            "Check which batch sizes take the dequantize path (e.g. vLLM AWQ for ≥ 256 tokens) and whether a "
            "Marlin/Machete kernel exists for this method and GPU (awq_marlin, gptq_marlin)."
        ),
    )
