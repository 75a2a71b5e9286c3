"""KRN002 Attention share and the Amdahl bound, per phase.

Hypothesis: a faster attention kernel speeds up a step only in proportion to the share of the step
spent in attention (Amdahl), and that share differs between prefill (many query rows, N×N work) and
decode (one query row per sequence against its KV history, no N×N matrix) — so a kernel benchmark's
speed-up says little about the service until the share is known per phase.

Formula: f = attention time / step time per phase (attention kernels, fallback included, over the
phase's summed t_step); best end-to-end speed-up of a kernel s times faster = 1 / ((1 − f) + f/s),
reported for s = 2 (docs/method.md's example: f = 0.3, s = 2 → 1.18). Finding (info) when f ≥ 0.3 in a phase; its
impact (what the verdict ranks) is that phase's attention time / the window's step time (analyses/basis.py).

Evidence: per phase: attention time, step time, f, the bound; the attention kernels (KRN001).

What to do: where f is large (long prefills), a faster attention kernel or backend is worth trying —
within the bound; where f is small (decode, short prompts), look at what holds the rest of the step
(weights and KV reads, collectives, host overhead: KRN005, KRN006) before touching attention.
"""

from __future__ import annotations

from tracediag.analyses.basis import window_time
from tracediag.analyses.kernels import (
    SOURCE_LABEL,
    phase_evidence,
    phase_name,
    phase_order,
    source_of,
    unphased_name,
)
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="KRN002",
    step=5,
    title="Attention share f per phase and the Amdahl bound 1/((1−f)+f/s)",
    requires_tables=("steps",),
    requires_window="steady",
    may_be_downstream_of=("KRN001",),
    share_of_steady="span",
)
SPEEDUP = 2.0  # s: a kernel twice as fast
SHARE_FINDING = 0.3  # f at or above this in a phase: attention is a lever worth the name


def amdahl(f: float, s: float = SPEEDUP) -> float:
    return 1.0 / ((1.0 - f) + f / s)


def check(ctx: Context) -> Check:
    rows = ctx.rows(
        """SELECT phase, count(*) AS steps, sum(step_ns) AS step_ns,
                  sum(attention_ns + attention_fallback_ns) AS attention_ns, any_value(time_basis) AS time_basis
           FROM step_activity GROUP BY phase"""
    )
    rows = [r for r in rows if r["step_ns"]]
    if not any(r["attention_ns"] for r in rows):
        return not_applicable(RULE, "missing attention: no attention kernel or op of a catalogued family inside steps")
    # a training job's steps have no prefill/decode phase: they are training steps, not steps of an unknown phase;
    # an encoder's or a vision model's are forward passes (analyses/kernels.py unphased_name)
    training = ctx.layout is not None and ctx.layout.workload == "training"
    unphased = "training" if training else unphased_name(ctx)

    def label(phase: str | None) -> str:
        return phase_name(phase, unphased)

    table = []
    for r in sorted(rows, key=lambda r: phase_order(r["phase"])):
        f = r["attention_ns"] / r["step_ns"]
        table.append(
            {
                "phase": label(r["phase"]),
                "steps": r["steps"],
                "attention_ns": r["attention_ns"],
                "step_ns": r["step_ns"],
                "f": f,
                "speedup_bound_s2": amdahl(f),
            }
        )
    source = source_of(ctx)
    values = {
        "s": SPEEDUP,
        "time_source": SOURCE_LABEL[source],
        "time_basis": rows[0]["time_basis"],
        "f": {t["phase"]: round(t["f"], 4) for t in table},
        "bound": {t["phase"]: round(t["speedup_bound_s2"], 4) for t in table},
    }
    formula = "f = attention time / step time; bound = 1 / ((1 − f) + f/s), s = 2"
    substituted = "; ".join(
        f"{t['phase']}: f = {t['attention_ns'] / 1e6:.3g} / {t['step_ns'] / 1e6:.3g} ms = {t['f']:.3f} → "
        f"1/((1 − {t['f']:.3f}) + {t['f']:.3f}/2) = {t['speedup_bound_s2']:.3f}"
        for t in table
    )
    ex = ctx.rows(
        """SELECT rank, step_id, phase, name, first_ts_ns AS ts_ns, calls, time_ns FROM kernel_steps
           WHERE step_id IS NOT NULL AND klass IN ('attention', 'attention_fallback')
           ORDER BY time_ns DESC LIMIT ?""",
        [ctx.settings.max_evidence],
    )
    evidence = [phase_evidence(e, unphased, "step_id") for e in ex]
    top = max(table, key=lambda t: t["f"])
    summary = "; ".join(f"{t['phase']} f = {t['f']:.1%} → ≤ {t['speedup_bound_s2']:.2f}×" for t in table)
    if top["f"] >= SHARE_FINDING:
        # ranked on the window's time like every trace-side finding; f (a share of the phase's steps) judges it
        wt = window_time(ctx)
        return finding(
            RULE,
            severity="info",
            confidence="high" if source == "gpu_kernel" else "medium",
            impact=wt.share(top["attention_ns"]),
            impact_basis=wt.basis,
            title=(
                f"Attention is {top['f']:.0%} of {top['phase']} step time: a 2× faster attention kernel gives at "
                f"most {top['speedup_bound_s2']:.2f}× there ({summary})"
            ),
            formula=formula,
            substituted=f"{substituted}; impact ({top['phase']} attention) {wt.text(top['attention_ns'])}",
            values=values | wt.values(top["attention_ns"]),
            table=table,
            evidence=evidence,
            next_check=(
                f"Attention is a real lever in {top['phase']}: compare fused backends on this shape (KRN001 shows "
                "which one ran)"
                + (", and keep the other phases' bounds in mind — they do not move with it." if len(table) > 1 else ".")
            ),
        )
    return passed(
        RULE,
        confidence="high" if source == "gpu_kernel" else "medium",
        title=f"Attention is a small share of every phase ({summary}): a faster attention kernel buys little",
        formula=formula,
        substituted=substituted,
        values=values,
        table=table,
        evidence=evidence,
    )
