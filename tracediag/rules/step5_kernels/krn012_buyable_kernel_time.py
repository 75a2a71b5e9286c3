"""KRN012 Buyable kernel time: the op family furthest from the GPU's roofline, as a share of step time.

Hypothesis: the kernels of one op family (GEMMs, attention, normalisation, elementwise ...) run far below what the
GPU can do for their shapes: a GEMM tile that wastes waves, a fallback attention backend, an unfused or strided
elementwise pass. Kernels at their roofline would save that time; the family with the most of it is where a faster
kernel (a library, a backend, a fusion, other shapes) buys the most.

Formula: per op, shape, dtype and phase (the table op_roofline: FLOPs and bytes per call from the per-op cost model,
tracediag/model/op_cost.py; the roofs from the GPU catalogue): roofline = calls · max(FLOPs / peak, bytes /
bandwidth); buyable = Σ max(0, kernel time − roofline) per op family and phase (tracediag/analyses/roofline.py);
share = buyable / the window's step time (the one basis of trace-side impacts, analyses/basis.py: the steady GPU
span; without steps, the profiled span); Amdahl bound on the step = 1 / (1 − share). Kernels of under 5 µs per call
are bounded by launch latency, not by the roofline: shown apart, never judged. The roofs are datasheet peaks, which
no kernel reaches (the best GEMM libraries reach 60-80 % of the dense peak): the buyable time is an upper bound, so
a family at 50 % of its roofline or more is near the practical limit and passes. Beside it, a lower estimate: the
buyable time if every row of the family ran at the best % of roofline one of its rows reaches in this trace (a rate
this GPU and library demonstrably reach). Finding from 10 % of step time (info), warning from 25 %, and from 1 ms of
buyable time.

Evidence: the family's largest rows (rank, phase, op, shape, dtype, calls, kernel time, roofline time, % of
roofline, bound) and the longest kernel each launched.

What to do: GEMM far from the compute roof → shapes that fill the GPU (batch more tokens, pad N and K to multiples
of 64/128, avoid skinny shards: KRN007), the GEMM library's tuning (cuBLASLt / hipBLASLt autotuning, TunableOp);
memory-bound GEMMs (decode) → fewer weight bytes (low-bit: KRN004); attention → a fused backend (FlashAttention,
FlashInfer: KRN001); elementwise, normalisation → fuse them (torch.compile, fused RMSNorm / SiLU-and-mul kernels),
contiguous inputs.
"""

from __future__ import annotations

from tracediag.analyses.basis import window_time
from tracediag.analyses.kernels import ms, phase_name, unphased_name
from tracediag.analyses.roofline import LAUNCH_BOUND_US, Buyable, FamilyGroup, amdahl, buyable, family_row, share
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="KRN012",
    step=5,
    title="Buyable kernel time: the op family furthest from the GPU's roofline, as a share of step time",
    requires_window="complete",
    may_be_downstream_of=("KRN001", "KRN003", "KRN007", "KRN009"),
)
INFO_SHARE, WARNING_SHARE = 0.10, 0.25  # buyable time of the family as a share of the window's step time
NEAR_LIMIT_PCT = 50.0  # a family at this % of its datasheet roofline or more is near what kernels reach
MIN_BUYABLE_NS = 1_000_000  # less buyable time than this over the window is no finding at any share
_ADVICE = {
    "GEMM": (
        "GEMMs below their roofline: see the shapes in the table — compute-bound ones want shapes that fill the GPU "
        "(more tokens per step, N and K padded to multiples of 64/128, no narrow shards: KRN007) and the GEMM "
        "library's tuning (cuBLASLt / hipBLASLt heuristics, PyTorch TunableOp); memory-bound ones (decode) want fewer "
        "weight bytes (low-bit weights: KRN004)."
    ),
    "attention": (
        "Attention below its roofline: check the backend that ran (KRN001: a fused FlashAttention / FlashInfer "
        "kernel, not the math or a fallback path), the head dim and the dtype; for a causal model check that the "
        "causal flag reaches the kernel (half the score work)."
    ),
    "normalisation": "Fuse the norms (a fused RMSNorm / LayerNorm kernel, with the residual add), or torch.compile.",
    "elementwise": (
        "Fuse the elementwise passes (torch.compile, fused SiLU-and-mul / rotary kernels) and keep their inputs "
        "contiguous: each separate pass reads and writes the whole tensor (KRN008)."
    ),
    "reduction": "Reductions far from bandwidth: fuse them with their producer, or check for strided inputs.",
    "copy / fill": "Copies and fills far from bandwidth: avoid them (views, preallocated outputs) or batch them.",
}


def _row_evidence(ctx: Context, r: dict) -> dict:
    kernel = ctx.rows(
        """SELECT k.name, k.ts_ns, k.dur_ns FROM kernels k
           SEMI JOIN (SELECT rank, external_id FROM cpu_ops WHERE name = ? AND rank = ?) o
           ON o.rank = k.rank AND o.external_id = k.external_id
           WHERE k.rank = ? ORDER BY k.dur_ns DESC LIMIT 1""",
        [r["op"], r["rank"], r["rank"]],
    )
    k = kernel[0] if kernel else {}
    return {
        "rank": r["rank"],
        "ts_ns": k.get("ts_ns"),
        "name": k.get("name"),
        "phase": phase_name(r["phase"], unphased_name(ctx)),
        "op": r["op"],
        "shape": r["shape"],
        "dtype": r["dtype"],
        "calls": r["calls"],
        "kernel_ns": r["kernel_ns"],
        "roofline_ns": round(r["roofline_ns"]),
        "pct_of_roofline": round(r["pct_of_roofline"], 1),
        "bound": r["bound"],
        "longest_kernel_ns": k.get("dur_ns"),
    }


def _table(b: Buyable, unphased: str) -> list[dict]:
    return [
        family_row(g, b, unphased)
        | {"share_of_phase": round(share(g.buyable_ns, b.phase_ns.get(g.phase, 0)), 4) if b.phase_ns else None}
        for g in b.groups
    ]


def _values(b: Buyable, lead: FamilyGroup | None, unphased: str) -> dict:
    v = {
        "gpu": b.gpu,
        "roofs": b.peak_source,
        "basis": b.basis,
        "basis_ns": b.basis_ns,
        "op_roofline_rows": b.rows,
        "kernel_ns": b.total_kernel_ns,
        "kernel_ns_linked_to_ops": b.linked_kernel_ns,
        "counted_kernel_ns": b.counted_ns,
        "launch_bound_ns": b.launch_bound_ns,
        "no_roofline_ns": b.no_roofline_ns,
        "no_roofline_why": b.no_roofline_why,
        "outside_steps_ns": b.outside_steps_ns,
        "rows_faster_than_roofline": len(b.faster_than_roofline),
        "buyable_ns": round(b.buyable_ns),
        "thresholds": {
            "info": INFO_SHARE,
            "warning": WARNING_SHARE,
            "near_limit_pct": NEAR_LIMIT_PCT,
            "min_buyable_ns": MIN_BUYABLE_NS,
        },
    }
    if lead is not None:
        s = share(lead.buyable_ns, b.basis_ns)
        v |= {
            "family": lead.family,
            "phase": phase_name(lead.phase, unphased),
            "family_kernel_ns": lead.kernel_ns,
            "family_roofline_ns": round(lead.roofline_ns),
            "family_pct_of_roofline": round(lead.pct_of_roofline or 0, 1),
            "family_buyable_ns": round(lead.buyable_ns),
            "family_best_pct_of_roofline": round(lead.best_pct, 1) if lead.best_pct else None,
            "family_buyable_at_best_ns": round(lead.demonstrated_ns),
            "share_of_step_time": round(s, 4),
            "amdahl_step_speedup_bound": round(amdahl(s), 3) if amdahl(s) else None,
        }
    return v


def _not_counted(b: Buyable) -> str:
    parts = []
    if b.launch_bound_ns:
        parts.append(
            f"{ms(b.launch_bound_ns)} of kernels under {LAUNCH_BOUND_US} µs per call (bounded by launch "
            "latency, not by the roofline)"
        )
    if b.no_roofline_ns:
        parts.append(f"{ms(b.no_roofline_ns)} without a roofline (ops the cost model does not know, or no shapes)")
    if b.outside_steps_ns:
        parts.append(f"{ms(b.outside_steps_ns)} outside every step")
    unlinked = b.total_kernel_ns - b.linked_kernel_ns
    if unlinked > 0:
        parts.append(
            f"{ms(unlinked)} of kernels not linked to a CPU op (CUDA/HIP graph replays, launches "
            "the trace did not record)"
        )
    return "; not counted: " + "; ".join(parts) if parts else ""


def _why_no_roofline(ctx: Context, b: Buyable) -> str:
    """The not-applicable reason of a window where no op has a roofline: the first input that is missing."""
    if not ctx.scalar("SELECT count(*) FROM kernels"):
        return "missing GPU kernels"
    if not b.rows:
        return (
            "missing CPU ops that launched the kernels: no kernel's External id names a CPU op (a trace without "
            "CPU ops, or an Nsight export without PyTorch's NVTX op ranges)"
        )
    if not ctx.scalar("SELECT count(*) FROM op_roofline WHERE shape IS NOT NULL AND shape <> '[]'"):
        return (
            "missing input shapes: the CPU ops that launched the kernels carry no 'Input Dims' (profile with "
            "torch.profiler.profile(record_shapes=True))"
        )
    if not ctx.scalar("SELECT count(*) FROM op_roofline WHERE model IS NOT NULL"):
        return (
            f"missing an op with a cost: the ops that launched the kernels ({_top_ops(ctx)}, …) are ones the cost "
            "model does not know, or their recorded dims do not fit the op"
        )
    if not ctx.scalar("SELECT count(*) FROM op_roofline WHERE roofline_ns IS NOT NULL"):
        return f"missing the GPU's roofs: {b.peak_source or next(iter(b.no_roofline_why), 'no roofs')}"
    outside = f", {ms(b.outside_steps_ns)} outside every step" if b.outside_steps_ns else ""
    return (
        f"missing an op with a cost beyond launch latency: the ops with a roofline run under {LAUNCH_BOUND_US} µs "
        f"per call ({ms(b.launch_bound_ns)}: the launch, not the roofline, bounds them){outside}; "
        f"{ms(b.no_roofline_ns)} of kernels are ops without a cost ({_top_ops(ctx)}, …)"
    )


def _top_ops(ctx: Context) -> str:
    return ", ".join(
        r["op"]
        for r in ctx.rows(
            "SELECT op, sum(kernel_ns) AS t FROM op_roofline WHERE roofline_ns IS "
            "NULL GROUP BY op ORDER BY t DESC, op LIMIT 3"
        )
    )


def check(ctx: Context) -> Check:
    b = buyable(ctx)
    if not b.groups:
        return not_applicable(RULE, _why_no_roofline(ctx, b))
    if not b.basis_ns:
        return not_applicable(RULE, "missing the window's step time: no steps and no GPU span")
    # the largest buyable time among the families still far from their roofline (one near it is at the practical
    # limit whatever its time); when every family is near it, the largest one, to say so
    far = [g for g in b.groups if (g.pct_of_roofline or 0) < NEAR_LIMIT_PCT]
    lead = (far or b.groups)[0]
    s = share(lead.buyable_ns, b.basis_ns)
    unphased = unphased_name(ctx)
    values = _values(b, lead, unphased) | window_time(ctx).values(lead.buyable_ns)
    bound = amdahl(s)
    bound_text = f"{bound:.2f}×" if bound else "unbounded (the whole step)"
    formula = (
        "roofline = calls · max(FLOPs / peak, bytes / bandwidth) per op, shape, dtype and phase; buyable = "
        "Σ max(0, kernel time − roofline) per op family and phase; share = buyable / step time; step speed-up "
        "≤ 1 / (1 − share)"
    )
    where = f"{lead.family} in {phase_name(lead.phase, unphased)}"
    substituted = (
        f"{where}: {ms(lead.kernel_ns)} of kernels vs {ms(lead.roofline_ns)} at the roofline"
        f" ({lead.pct_of_roofline or 0:.0f} % of roofline); buyable {ms(lead.buyable_ns)} / {ms(b.basis_ns)} "
        f"of {b.basis} = {s:.1%}; step speed-up ≤ {bound_text}; at the family's best rate here "
        f"({lead.best_pct or 0:.0f} % of roofline) every row would save {ms(lead.demonstrated_ns)}" + _not_counted(b)
    )
    top = sorted(lead.rows, key=lambda r: -r["buyable_ns"])[: ctx.settings.max_evidence]
    evidence = [_row_evidence(ctx, r) for r in top]
    common = {
        "formula": formula,
        "substituted": substituted,
        "values": values,
        "table": _table(b, unphased),
        "evidence": evidence,
    }
    near = (lead.pct_of_roofline or 0) >= NEAR_LIMIT_PCT
    if s < INFO_SHARE or lead.buyable_ns < MIN_BUYABLE_NS or near:
        reason = (
            f"every family at {NEAR_LIMIT_PCT:.0f} % of its roofline or more (near what kernels reach against "
            f"datasheet peaks); the most buyable is {where}, at {lead.pct_of_roofline:.0f} %"
            if near
            else f"the most buyable far from it is {where}: {ms(lead.buyable_ns)}, {s:.1%} of {b.basis}"
        )
        if b.counted_ns < 0.5 * b.total_kernel_ns:
            reason += f" (judged on {ms(b.counted_ns)} of {ms(b.total_kernel_ns)} of kernels: see the values)"
        return passed(
            RULE,
            **common,
            confidence="medium",
            title=f"No op family far from the roofline: {reason}",
        )
    return finding(
        RULE,
        **common,
        severity="warning" if s >= WARNING_SHARE else "info",
        confidence="medium",  # datasheet roofs: an upper bound on what a faster kernel buys
        impact=min(1.0, s),
        impact_basis=b.basis,  # the window's step time (analyses/basis.py), as every trace-side impact
        cost_ns=int(lead.buyable_ns),
        title=(
            f"{where} runs at {lead.pct_of_roofline:.0f} % of the GPU's datasheet roofline: kernels at the roofline "
            f"would save {ms(lead.buyable_ns)}, {s:.0%} of {b.basis} (step speed-up ≤ {bound_text}); "
            f"{ms(lead.demonstrated_ns)} at the best rate its kernels reach here ({lead.best_pct or 0:.0f} %)"
        ),
        next_check=_ADVICE.get(lead.family, "See the op's rows in op_roofline and the kernels each launched."),
    )
