"""KRN001 Attention dispatch per phase.

Hypothesis: the attention backend named in a config or a log proves nothing; only the kernels in the
trace show what ran, and a phase (often decode, or prefill with an unusual mask/dtype/head size) can
silently fall back to the math path — bmm + softmax (`_scaled_dot_product_attention_math`) — which
materialises the score matrix and is much slower than a fused kernel.

Formula: per phase, attention time by catalog family (FlashAttention 2/3/4, FlashInfer, cuDNN SDPA,
memory-efficient, paged, Triton, TensorRT-LLM, CK/AITER, CPU flash) and the fallback share
fallback_ns / (fallback_ns + fused_ns); a phase runs the fallback when that share is ≥ 0.5 or when no
fused attention ran in it. The fallback is `aten::_scaled_dot_product_attention_math` or an eager
attention's QKᵀ → softmax → PV with matching shapes — a softmax alone (a sampler's, a router's) is not
attention. A kernel the catalog does not know takes the class of the op that launched it. Severity follows
cost: the fallback's share of the phase's step time (warning from 5 %, else info); the finding's impact (what the
verdict ranks) is the fallback time / the window's step time (analyses/basis.py). Kernel time on GPU
traces; outermost CPU op time on CPU-only traces.

Evidence: kernel (or op) names per phase with calls and time, the first call of each; the attention
op's recorded inputs (dtype, head dim, mask) and the device's compute capability as facts for the
likely causes.

What to do: for a fallback, check in this order: GPU arch (compute capability) and the kernel
library's support matrix, dtype (fp32 inputs), head dim, custom or materialised masks, dropout > 0,
an explicit backend override (sdpa_kernel / attn_implementation), and the versions installed.
"""

from __future__ import annotations

from collections import defaultdict

import orjson

from tracediag.analyses.basis import window_time
from tracediag.analyses.kernels import (
    ATTENTION_KLASSES,
    SOURCE_LABEL,
    dispatch_rows,
    ms,
    phase_evidence,
    phase_name,
    phase_order,
    source_of,
    unphased_name,
)
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="KRN001",
    step=5,
    title="Attention kernel per phase (fused family or math fallback)",
    requires_tables=("steps",),
    may_be_downstream_of=("SHP002",),
)
FALLBACK_SHARE = 0.5  # fallback share of a phase's attention time that counts as "runs the fallback"
WARNING_COST = 0.05  # fallback share of the phase's step time from which it is a warning (below: info)


def _attention_inputs(ctx: Context) -> dict[str, dict]:
    """Per phase: dtype, head dim and mask of aten::scaled_dot_product_attention as recorded."""
    rows = ctx.rows(  # derive/sdpa_ops.sql: the scaled-dot-product-attention ops inside steps
        """SELECT s.phase, o.input_dims, o.input_types FROM sdpa_ops o JOIN steps s USING (rank, step_id)
           ORDER BY o.name <> 'aten::scaled_dot_product_attention'"""
    )
    out: dict[str, dict] = {}
    unphased = unphased_name(ctx)
    for r in rows:
        ph = phase_name(r["phase"], unphased)
        if ph in out:
            continue
        try:
            dims, types = orjson.loads(r["input_dims"]), orjson.loads(r["input_types"] or "[]")
        except orjson.JSONDecodeError:
            continue
        q = dims[0] if dims and isinstance(dims[0], list) else []
        out[ph] = {
            "query_shape": q,
            "head_dim": q[-1] if q else None,
            "dtype": types[0] if types else None,
            "attn_mask_given": bool(len(dims) > 3 and dims[3]),
        }
    return out


def check(ctx: Context) -> Check:
    rows = dispatch_rows(ctx, ATTENTION_KLASSES)
    if not rows:
        return not_applicable(
            RULE,
            "missing attention: no attention kernel or op of a catalogued family inside any engine step",
        )
    source = source_of(ctx)
    unphased = unphased_name(ctx)
    phase_time = {
        phase_name(r["phase"], unphased): r["t"]
        for r in ctx.rows("SELECT phase, sum(step_ns) AS t FROM step_activity GROUP BY phase")
    }
    by_phase: dict[str, dict] = defaultdict(lambda: {"fused_ns": 0, "fallback_ns": 0, "rows": []})
    for r in sorted(rows, key=lambda r: (phase_order(r["phase"]), -r["time_ns"])):
        p = by_phase[phase_name(r["phase"], unphased)]
        p["fallback_ns" if r["klass"] == "attention_fallback" else "fused_ns"] += r["time_ns"]
        p["rows"].append(r)
    table, summary, fallback_phases = [], {}, []
    for ph, p in by_phase.items():
        total = p["fused_ns"] + p["fallback_ns"]
        share = p["fallback_ns"] / total if total else 0.0
        runs_fallback = p["fallback_ns"] > 0 and (p["fused_ns"] == 0 or share >= FALLBACK_SHARE)
        if runs_fallback:
            fallback_phases.append(ph)
        fams = defaultdict(lambda: [0, 0])
        for r in p["rows"]:
            fams[r["family_label"]][0] += r["calls"]
            fams[r["family_label"]][1] += r["time_ns"]
            table.append(
                {
                    "phase": ph,
                    "klass": r["klass"],
                    "family": r["family"],
                    "family_label": r["family_label"],
                    "name": r["name"],
                    "calls": r["calls"],
                    "time_ns": r["time_ns"],
                    "share_of_phase_attention": r["time_ns"] / total if total else None,
                    "steps": r["steps"],
                    "graph_calls": r["graph_calls"],
                }
            )
        summary[ph] = {
            "families": {k: {"calls": v[0], "time_ns": v[1]} for k, v in fams.items()},
            "fused_ns": p["fused_ns"],
            "fallback_ns": p["fallback_ns"],
            "fallback_share": share,
            "runs_fallback": runs_fallback,
        }
    no_attention = sorted(set(phase_time) - set(summary) - {unphased})
    values = {
        "time_source": SOURCE_LABEL[source],
        "phases": summary,
        "phases_without_attention": no_attention,
        "attention_inputs": _attention_inputs(ctx),
        "compute_capability": ctx.scalar(
            "SELECT any_value(device_compute_capability) FROM inputs WHERE device_compute_capability IS NOT NULL"
        ),
        "device": ctx.scalar("SELECT any_value(device_name) FROM inputs WHERE device_name IS NOT NULL"),
        "attention_calls_outside_steps": ctx.scalar(
            "SELECT coalesce(sum(calls), 0) FROM kernel_steps WHERE step_id IS NULL AND klass IN (?, ?)",
            list(ATTENTION_KLASSES),
        ),
    }

    def line(ph: str, label: bool = True) -> str:
        fams = summary[ph]["families"]
        text = ", ".join(f"{k} ({v['calls']} calls, {ms(v['time_ns'])})" for k, v in fams.items())
        return f"{ph}: {text}" if label else text

    formula = "fallback share = fallback_ns / (fallback_ns + fused_ns) per phase; fallback when ≥ 0.5 or no fused"
    substituted = "; ".join(
        f"{ph}: {ms(s['fallback_ns'])} / ({ms(s['fallback_ns'])} + {ms(s['fused_ns'])}) = {s['fallback_share']:.2f}"
        for ph, s in summary.items()
    )
    evidence = [
        phase_evidence(r, unphased, family=r["family_label"])
        for r in sorted(
            rows,
            key=lambda r: (
                phase_name(r["phase"], unphased) not in fallback_phases,
                r["klass"] != "attention_fallback",
                phase_order(r["phase"]),
                -r["time_ns"],
            ),
        )
    ][: ctx.settings.max_evidence]
    if not fallback_phases:
        extra = f"; no catalogued attention in {', '.join(no_attention)}" if no_attention else ""
        return passed(
            RULE,
            confidence="high",
            title="Fused attention in every phase — " + "; ".join(line(ph) for ph in summary) + extra,
            formula=formula,
            substituted=substituted,
            values=values,
            table=table,
            evidence=evidence,
        )
    worst = fallback_phases[0]
    s = summary[worst]
    others = [line(ph) for ph in summary if ph not in fallback_phases]
    inputs = values["attention_inputs"].get(worst, {})
    facts = ", ".join(
        f"{k} {v}"
        for k, v in (
            ("compute capability", values["compute_capability"]),
            ("dtype", inputs.get("dtype")),
            ("head dim", inputs.get("head_dim")),
            ("attn_mask given", inputs.get("attn_mask_given")),
        )
        if v is not None
    )
    impact = (s["fallback_ns"] / phase_time[worst]) if phase_time.get(worst) else s["fallback_share"]
    values["fallback_share_of_step_time"] = round(impact, 6)
    # ranked on the window's time like every trace-side finding; the share of the phase's step time judges it
    wt = window_time(ctx)
    values |= wt.values(s["fallback_ns"])
    substituted += f"; impact ({worst} fallback) {wt.text(s['fallback_ns'])}"
    return finding(
        RULE,
        severity="warning" if impact >= WARNING_COST else "info",
        confidence="high" if source == "cpu_op" or s["fused_ns"] == 0 else "medium",
        impact=wt.share(s["fallback_ns"]),
        impact_basis=wt.basis,
        title=(
            f"{' and '.join(fallback_phases)} "
            f"{'phases run' if len(fallback_phases) > 1 else 'phase runs'} the math attention fallback — "
            f"{line(worst, label=False)}, {impact:.2%} of its step time"
            + (f" (fused elsewhere — {'; '.join(others)})" if others else "")
        ),
        formula=formula,
        substituted=substituted,
        values=values,
        table=table,
        evidence=evidence,
        next_check=(
            f"Find why {worst} left the fused kernel ({facts or 'no input facts recorded'}): GPU arch and the "
            "kernel library's support matrix, dtype (fp32), head dim, custom/materialised mask, dropout > 0, "
            "an explicit backend override (sdpa_kernel(SDPBackend.MATH), attn_implementation='eager'), "
            "library versions."
        ),
    )
