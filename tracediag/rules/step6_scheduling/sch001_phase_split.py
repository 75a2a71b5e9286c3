"""SCH001 Prefill/decode split.

Hypothesis: prefill and decode steps behave differently (prefill is compute-heavy with many tokens per
step, decode reads weights and KV for about one token per sequence), so every later number must be
judged per phase; and how step time grows with the tokens of a step (t_step = a·T + b) tells whether a
step costs per token (a) or per step (b: weight reads, launches, host work, synchronisation).

Formula: per phase: steps, share of step time, T distribution (min / median / max);
least-squares fit t_step = a·T + b over the steps with T, with R² (needs ≥ 3 steps and ≥ 2 distinct T).
t_step is the GPU span of the kernels a step launched (CUDA-graph replays included), or the host
duration of the step on CPU-only traces. Fixed-cost share of decode = b / median decode t_step.

Evidence: the steps (marker, phase and where it came from, T and where it came from), per-phase table,
the fit with its quality; steps are split per forward pass when one profiler step wraps several.

What to do: read later per-phase numbers against this split. When b dominates decode, more sequences
per step are nearly free and the fixed cost is weights, launches or host work: compare b with the
roofline floor (KRN005) and the GPU idle share (KRN006). A low R² means step time is driven by
something other than T (stalls, mixed steps, host overhead).
"""

from __future__ import annotations

from collections import defaultdict

from tracediag.analyses.kernels import (
    SOURCE_LABEL,
    fit_line,
    median,
    ms,
    phase_name,
    phase_table,
    step_events,
    step_rows,
    unphased_name,
)
from tracediag.context import Context
from tracediag.derive.kernel_phase import SOURCE as INFERRED
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="SCH001",
    step=6,
    title="Prefill/decode split, T distribution and t_step = a·T + b",
    requires_tables=("steps",),
    requires_window="steady",
    may_be_downstream_of=("COL001", "COL002", "COL003", "COL004", "COL005", "KRN001", "KRN005", "KRN006"),
)
FIXED_COST_SHARE = 0.8  # b / median decode step at or above this: decode is fixed-cost dominated


def _no_phase(ctx: Context) -> Check:
    """Not applicable, saying why no step has a phase: a training job, a non-LLM workload, or no phase evidence."""
    markers = sorted({r["marker_source"] for r in ctx.rows("SELECT DISTINCT marker_source FROM steps")})
    if ctx.layout is not None and ctx.layout.workload == "training":
        return not_applicable(
            RULE,
            f"missing inference steps: a training job ({ctx.layout.workload_evidence}); its steps "
            f"({', '.join(markers)}) have no prefill/decode phase",
        )
    dom = (ctx.fitness() or {}).get("domain") or {}
    if dom.get("workload") not in (None, "llm", "other"):  # an encoder, a vision model: nothing to split
        return not_applicable(
            RULE,
            f"missing LLM steps: the workload is {dom['label']} ({dom['workload_why']}); its steps "
            f"({', '.join(markers)}) are forward passes with no prefill/decode phase",
        )
    return not_applicable(
        RULE,
        "missing phase: no step carries an engine step annotation (vLLM, SGLang, TensorRT-LLM), an "
        "attention op with recorded shapes or a prefill/decode-only attention kernel (steps from: "
        f"{', '.join(markers)})",
    )


def _split_words(table: list[dict], steps: list[dict]) -> str:
    """The phase split in words: steps, time share and median T per phase."""
    ranks = len({s["rank"] for s in steps})
    per_rank = "" if ranks == 1 else f" (over {ranks} ranks)"
    return (
        ", ".join(
            f"{r['steps']} {r['phase']} ({r['time_share']:.0%} of time, T {r['T_median']:g})"
            if r["T_median"] is not None
            else f"{r['steps']} {r['phase']} ({r['time_share']:.0%} of time)"
            for r in table
        )
        + per_rank
    )


def _step_time_falls(
    ctx: Context, steps: list[dict], table: list[dict], fit: dict, formula: str, substituted: str, values: dict
) -> Check:
    """A negative slope a: the phase with fewer tokens per step is the slower one, so a per-step stall, not token
    work, sets its time."""
    a = fit["a_ns_per_token"]
    slow = max(table, key=lambda r: r["step_ns_median"] or 0)
    fast = min(table, key=lambda r: r["step_ns_median"] or 0)
    return finding(
        RULE,
        severity="warning",
        confidence="high" if fit["r2"] >= 0.5 else "medium",
        impact=slow["time_share"],
        impact_basis="step time (the slow phase's share)",
        title=(
            f"Step time falls as T grows (a = {a / 1e3:.3g} µs/token): {slow['phase']} steps (T "
            f"{slow['T_median']:g}) take {ms(slow['step_ns_median'])}, {fast['phase']} steps (T "
            f"{fast['T_median']:g}) {ms(fast['step_ns_median'])} — a per-step stall, not token work, drives "
            f"{slow['phase']}"
        ),
        formula=formula,
        substituted=substituted,
        values=values,
        table=table,
        evidence=_evidence(ctx, steps),
        next_check=(
            f"Look inside the slow {slow['phase']} steps for what does not scale with tokens: waits in "
            "collectives (rank skew, COL005), GPU idle gaps and host syncs (KRN006), sleeps or I/O on the host."
        ),
    )


def check(ctx: Context) -> Check:
    steps = step_rows(ctx)
    known = [s for s in steps if s["phase"]]
    if not known:
        return _no_phase(ctx)
    table = phase_table(steps, unphased_name(ctx))
    phases: dict[str | None, list[dict]] = defaultdict(list)
    for s in steps:
        phases[s["phase"]].append(s)
    fit = fit_line([(s["T"], s["step_ns"]) for s in steps if s["T"] is not None and s["step_ns"] is not None])
    source = steps[0]["source"]
    values = {
        "steps": len(steps),
        "ranks": len({s["rank"] for s in steps}),
        "steps_with_phase": len(known),
        "time_basis": steps[0]["time_basis"],
        "time_source": SOURCE_LABEL[source],
        "phases": {r["phase"]: r["steps"] for r in table},
        "time_share": {r["phase"]: round(r["time_share"], 4) for r in table},
        "markers": sorted({s for s in (r["marker_source"] for r in ctx.rows("SELECT marker_source FROM steps"))}),
    }
    split = _split_words(table, steps)
    formula = "t_step = a·T + b (least squares over steps with T); fixed-cost share of decode = b / median t_decode"
    if fit is None:
        values["fit"] = "not possible: needs ≥ 3 steps with T and ≥ 2 distinct T"
        return passed(
            RULE,
            confidence="high",
            title=f"Phase split: {split}; no fit of t_step = a·T + b ({values['fit']})",
            formula=formula,
            substituted=values["fit"],
            values=values,
            table=table,
            evidence=_evidence(ctx, steps),
        )
    a, b = fit["a_ns_per_token"], fit["b_ns"]
    values |= {"a_ns_per_token": a, "b_ns": b, "r2": fit["r2"], "fit_steps": fit["n"], "distinct_T": fit["distinct_T"]}
    decode_med = median([s["step_ns"] for s in phases.get("decode", []) if s["step_ns"] is not None])
    substituted = f"t_step = {a / 1e6:.4g} ms/token · T + {ms(b)} (R² {fit['r2']:.2f}, {fit['n']} steps)"
    if a < 0:
        return _step_time_falls(ctx, steps, table, fit, formula, substituted, values)
    if decode_med:
        share = b / decode_med
        values |= {"decode_step_ns_median": decode_med, "fixed_cost_share_decode": share}
        substituted += f"; b / median decode step = {ms(b)} / {ms(decode_med)} = {share:.2f}"
        if share > 1:  # the intercept above the steps it should bound: the line does not describe decode
            ts = [st["T"] for st in steps if st["T"] is not None]
            values["fit_reliability"] = (
                f"b = {ms(b)} exceeds the median decode step ({ms(decode_med)}): the line, fitted over T "
                f"{min(ts)}–{max(ts)}, overshoots the decode steps; read b as an upper bound of their fixed cost, "
                "not a measurement"
            )
            substituted += f" > 1: {values['fit_reliability']}"
        if share >= FIXED_COST_SHARE:
            dec = next(r for r in table if r["phase"] == "decode")
            unreliable = share > 1
            return finding(
                RULE,
                severity="info",
                confidence="low" if unreliable else "high" if fit["r2"] >= 0.5 else "medium",
                impact=dec["time_share"] * min(share, 1.0),
                impact_basis="step time (the fixed cost of decode steps)",
                title=(
                    f"Decode steps are fixed-cost bound: b / t_decode = {share:.2f} (b = {ms(b)}, median decode "
                    f"step {ms(decode_med)}, a = {a / 1e3:.3g} µs/token); {split}"
                    + (
                        "; the fit overshoots decode (b above the median decode step): an upper bound"
                        if unreliable
                        else ""
                    )
                ),
                formula=formula,
                substituted=substituted,
                values=values,
                table=table,
                evidence=_evidence(ctx, steps),
                next_check=(
                    "Compare b with the decode floor max(bytes/BW, FLOPs/peak) (KRN005) and with the GPU idle "
                    "share inside decode steps (KRN006): b far above the weight-read time is launch, host or "
                    "synchronisation overhead (CUDA graphs, fewer syncs); otherwise more sequences per step "
                    "cost only ≈ a per token."
                ),
            )
    return passed(
        RULE,
        confidence="high",
        title=f"Phase split: {split}; t_step = {a / 1e3:.3g} µs·T + {ms(b)} (R² {fit['r2']:.2f})",
        formula=formula,
        substituted=substituted,
        values=values,
        table=table,
        evidence=_evidence(ctx, steps),
    )


def _phase_kernels(ctx: Context, m: dict) -> dict:
    """The attention kernels a phase inferred from kernels rests on (derive/kernel_phase.py), else nothing."""
    if m["phase_source"] != INFERRED:
        return {}
    k = ctx.rows(
        "SELECT prefill_kernels, decode_kernels, mixed_kernels, prefill_names, decode_names, mixed_names "
        "FROM step_kernel_phase WHERE rank = ? AND step_id = ?",
        [m["rank"], m["step_id"]],
    )
    return {"phase_kernels": k[0]} if k else {}


def _evidence(ctx: Context, steps: list[dict]) -> list[dict]:
    rows = ctx.rows("SELECT rank, step_id, name, ts_ns, marker_source, phase_source, t_source FROM steps")
    meta = {(r["rank"], r["step_id"]): r for r in rows}
    events = step_events(rows)
    seen, out, unphased = set(), [], unphased_name(ctx)
    for s in steps:  # first step of each phase
        if s["phase"] in seen:
            continue
        seen.add(s["phase"])
        m = meta[(s["rank"], s["step_id"])]
        out.append(
            events[(s["rank"], s["step_id"])]
            | {
                "phase": phase_name(s["phase"], unphased),
                "phase_from": m["phase_source"],
                "T": s["T"],
                "T_from": m["t_source"],
                "step_ns": s["step_ns"],
                "marker": m["marker_source"],
            }
            | _phase_kernels(ctx, m)
        )
    return out[: ctx.settings.max_evidence]
