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

from tracediag.analyses import attention_dispatch as ad
from tracediag.analyses.basis import window_time
from tracediag.analyses.kernels import SOURCE_LABEL, ms, phase_evidence, phase_name, phase_order
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
FORMULA = "fallback share = fallback_ns / (fallback_ns + fused_ns) per phase; fallback when ≥ 0.5 or no fused"


def check(ctx: Context) -> Check:
    m = ad.attention_dispatch(ctx)
    if m is None:
        return not_applicable(
            RULE,
            "missing attention: no attention kernel or op of a catalogued family inside any engine step",
        )
    fallback_phases = _mark_fallback_phases(m.phases)
    values = {
        "time_source": SOURCE_LABEL[m.source],
        "phases": m.phases,
        "phases_without_attention": m.phases_without_attention,
        "attention_inputs": ad.attention_inputs(ctx),
        "compute_capability": ad.compute_capability(ctx),
        "device": ad.device_name(ctx),
        "attention_calls_outside_steps": ad.attention_calls_outside_steps(ctx),
    }
    substituted = "; ".join(
        f"{ph}: {ms(s['fallback_ns'])} / ({ms(s['fallback_ns'])} + {ms(s['fused_ns'])}) = {s['fallback_share']:.2f}"
        for ph, s in m.phases.items()
    )
    evidence = _evidence(ctx, m, fallback_phases)
    if not fallback_phases:
        return _fused_everywhere(m, values, substituted, evidence)
    return _fallback(ctx, m, fallback_phases, values, substituted, evidence)


def _mark_fallback_phases(phases: dict[str, dict]) -> list[str]:
    """Sets each phase's runs_fallback (FALLBACK_SHARE, or no fused attention at all); returns the phases that run
    the fallback, in phase order (the first is the one the finding is about)."""
    out = []
    for ph, s in phases.items():
        s["runs_fallback"] = s["fallback_ns"] > 0 and (s["fused_ns"] == 0 or s["fallback_share"] >= FALLBACK_SHARE)
        if s["runs_fallback"]:
            out.append(ph)
    return out


def _evidence(ctx: Context, m: ad.AttentionDispatch, fallback_phases: list[str]) -> list[dict]:
    """The fallback phases' kernels first, their fallback before their fused ones; then by phase and time."""
    return [
        phase_evidence(r, m.unphased, family=r["family_label"])
        for r in sorted(
            m.rows,
            key=lambda r: (
                phase_name(r["phase"], m.unphased) not in fallback_phases,
                r["klass"] != "attention_fallback",
                phase_order(r["phase"]),
                -r["time_ns"],
            ),
        )
    ][: ctx.settings.max_evidence]


def _families_line(phases: dict[str, dict], ph: str, label: bool = True) -> str:
    """'decode: FlashAttention 2 (12 calls, 3.4 ms), …': what ran in a phase."""
    text = ", ".join(f"{k} ({v['calls']} calls, {ms(v['time_ns'])})" for k, v in phases[ph]["families"].items())
    return f"{ph}: {text}" if label else text


def _fused_everywhere(m: ad.AttentionDispatch, values: dict, substituted: str, evidence: list[dict]) -> Check:
    no_attention = values["phases_without_attention"]
    extra = f"; no catalogued attention in {', '.join(no_attention)}" if no_attention else ""
    return passed(
        RULE,
        confidence="high",
        title="Fused attention in every phase — " + "; ".join(_families_line(m.phases, ph) for ph in m.phases) + extra,
        formula=FORMULA,
        substituted=substituted,
        values=values,
        table=m.table,
        evidence=evidence,
    )


def _input_facts(values: dict, phase: str) -> str:
    """'compute capability 8.0, dtype c10::BFloat16, head dim 128': what was recorded of the likely causes."""
    inputs = values["attention_inputs"].get(phase, {})
    return ", ".join(
        f"{k} {v}"
        for k, v in (
            ("compute capability", values["compute_capability"]),
            ("dtype", inputs.get("dtype")),
            ("head dim", inputs.get("head_dim")),
            ("attn_mask given", inputs.get("attn_mask_given")),
        )
        if v is not None
    )


def _fallback(
    ctx: Context,
    m: ad.AttentionDispatch,
    fallback_phases: list[str],
    values: dict,
    substituted: str,
    evidence: list[dict],
) -> Check:
    worst = fallback_phases[0]
    s = m.phases[worst]
    others = [_families_line(m.phases, ph) for ph in m.phases if ph not in fallback_phases]
    facts = _input_facts(values, worst)
    phase_ns = m.phase_time.get(worst)
    impact = (s["fallback_ns"] / phase_ns) if phase_ns else s["fallback_share"]
    values["fallback_share_of_step_time"] = round(impact, 6)
    # ranked on the window's time like every trace-side finding; the share of the phase's step time judges it
    wt = window_time(ctx)
    values |= wt.values(s["fallback_ns"])
    substituted += f"; impact ({worst} fallback) {wt.text(s['fallback_ns'])}"
    return finding(
        RULE,
        severity="warning" if impact >= WARNING_COST else "info",
        confidence="high" if m.source == "cpu_op" or s["fused_ns"] == 0 else "medium",
        impact=wt.share(s["fallback_ns"]),
        impact_basis=wt.basis,
        title=(
            f"{' and '.join(fallback_phases)} "
            f"{'phases run' if len(fallback_phases) > 1 else 'phase runs'} the math attention fallback — "
            f"{_families_line(m.phases, worst, label=False)}, {impact:.2%} of its step time"
            + (f" (fused elsewhere — {'; '.join(others)})" if others else "")
        ),
        formula=FORMULA,
        substituted=substituted,
        values=values,
        table=m.table,
        evidence=evidence,
        next_check=(
            f"Find why {worst} left the fused kernel ({facts or 'no input facts recorded'}): GPU arch and the "
            "kernel library's support matrix, dtype (fp32), head dim, custom/materialised mask, dropout > 0, "
            "an explicit backend override (sdpa_kernel(SDPBackend.MATH), attn_implementation='eager'), "
            "library versions."
        ),
    )
