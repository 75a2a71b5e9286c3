"""COL003 α–β fit and TP profitability.

Hypothesis: each TP all-reduce costs a fixed latency α plus its bus bytes over a bandwidth B; a
decode step makes 2L *dependent* calls, so at small T the fixed part 2L·α is not paid back by the
compute TP saves and TP=p is slower than TP=1 (docs/method.md, step 3: the inequality TP=p must satisfy).

Formula: τ = α + V_AR/B with V_AR = 2(p−1)/p·S, fitted robustly (Theil–Sen) over the trace's
all-reduce calls per group size; per step t_comm = 2L·τ_AR(T·H·e_a, p) and its share of the step
time per T bucket; with a = seconds per token of the projection compute at TP=1 (from a TP=1 trace,
else p × the per-rank GEMM-time slope over T at TP=p, an estimate), the break-even token count is
T* = 2L·α_p / (a(1−1/p) − 4L·(p−1)/p·H·e_a/B_p); a non-positive denominator means no T benefits.
Sequence parallelism (COL001): the fit runs over the reduce-scatters and all-gathers, each V = (p−1)/p·S
of its full [T, H] side (a reduce-scatter the backend ran as an all-reduce, as gloo does: 2(p−1)/p·S), and
t_comm and T* count 4L calls per step: T* = 4L·α / (a(1−1/p) − 2L·(v_RS + v_AG)·H·e_a/B).
The α–β line is a screening device (collective time is linear in the payload only for large messages): the per-T-bucket
measured times are shown beside it. T* assumes ideal 1/p compute and ignores the rest of the step, so it
is optimistic: decode T below it is a sound finding, T above it proves nothing — with one correction: the a·T
model leaves out the GEMM time's fixed part c (the same fit's intercept, at TP=1 scale: weight reads as T → 0),
which TP divides too. TP=p is called slower at T only when 2L·α − c(1−1/p) − (a(1−1/p) − bw)·T > 0 for most
decode steps (T*_c = (2L·α − c(1−1/p)) / (a(1−1/p) − bw)); when T* says slower but T*_c does not, the finding is
info ("not decided").
F_proj (tracediag.model.accounting): the projection FLOPs per token a stands for, 2 per multiply-add with the
weights a token uses — dense: L·(4(H·h·D + H·H_kv·D) + 6H·I), docs/method.md's 4(H² + H·H_KV) + 6H·I per layer
when h·D = H; MoE-active: attention (MLA: q_a, q_b, kv_a, kv_b, o) of all L layers, the dense layers' MLPs at
their width (first_k_dense_replace, mlp_only_layers, ...), and per MoE layer the router H·E, the shared experts
and k of the E routed experts of the expert width; attention scores over the context are left out. a is never
taken from F_proj and a peak (a nominal peak is not what GEMMs reach): F_proj shows the throughput a implies
(F/a), and with --peak-tflops the compute floor F/peak — an a below it is not compute time (weight reads, which
TP also divides and the a·T model leaves out), so the finding is lowered to info ("not decided"). MoE: the 2L
account assumes the experts split over the TP group with one all-reduce after each MoE block; all-to-all
dispatch/combine fails COL001.

Evidence: the fitted α (µs), B (GB/s), goodness of fit (R², median relative residual), the payload
range, where the call times came from (the shortest rank's time of each matched call when several
ranks are given: the others include waiting), the per-T-bucket table, a and its source, T* and the
decode steps below it, c, the time TP saves of it, T*_c and the share of steps slower with it; F_proj's kind
(dense or MoE-active), formula, inputs (k, E, expert width, shared experts, dense-layer count) and values, the
per-rank share of F_proj at TP=p against the ideal 1/p, and with --peak-tflops the compute floor and T* at it.
When the 2L / T·H·e_a accounting does not hold (COL001/COL002 conditions, recomputed here), T* is not computed.

What to do: when decode T is mostly below T*, TP=p is not buying latency for these batches: compare
with p replicas of TP=1 (SHP004), raise the decode batch, or lower α (custom all-reduce, NVLS,
CUDA graphs); measure a from a TP=1 trace (--tp1-baseline) instead of the estimate before deciding.
"""

from __future__ import annotations

from tracediag.analyses.projection_compute import MOE_TP_ASSUMPTION as MOE_TP_ASSUMPTION
from tracediag.analyses.projection_compute import estimate_a
from tracediag.analyses.projection_compute import projection_account as projection_account
from tracediag.analyses.tp_breakeven import BreakEvenMeasure, breakeven, measure_fit
from tracediag.analyses.tp_collectives import activation_element_bytes
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.rules import upstream_check

RULE = RuleMeta(
    id="COL003",
    step=3,
    title="α–β fit of the all-reduces and the TP break-even T*",
    requires_tables=("collectives", "steps"),
    requires_window="steady",
    requires_model=("L", "H"),
    requires_tp=True,
    may_be_downstream_of=("SHP001", "SHP002", "COL001", "COL002", "COL005"),
    enabled_by=("--tp1-baseline", "--peak-tflops"),
)
BELOW_SHARE_FINDING = 0.5  # "the observed decode T distribution lies mostly below T*"


# --- cost-model applicability (COL001 / COL002 conditions, recomputed) ----------------------------------------


def cost_model_verdicts(ctx: Context) -> list[str]:
    """Reasons the 2L·τ_AR(T·H·e_a) account does not hold, from COL001/COL002's own checks on this store."""
    reasons = []
    for rule_id in ("COL001", "COL002"):
        c = upstream_check(ctx, rule_id)
        if c.cost_model_applies is False:
            reasons.append(f"{c.rule}: {c.title}")
    return reasons


def measure(ctx: Context) -> BreakEvenMeasure | str:
    """Every number COL003 judges by (tracediag.analyses.tp_breakeven), or the reason (a string) it does not
    apply: no TP, no fit, COL001/COL002 against the 2L account, no element size."""
    p = ctx.tp.p
    if p == 1:
        return "p = 1: no tensor-parallel all-reduces to fit"
    fm = measure_fit(ctx, p)
    if isinstance(fm, str):
        return fm
    against = cost_model_verdicts(ctx)
    if against:
        return (
            "the 2L·τ_AR(T·H·e_a, p) cost model does not apply here ("
            + "; ".join(against)
            + f"), so neither the per-step account nor T* is computed; fitted {fm.fit_text}"
        )
    element = activation_element_bytes(ctx)
    if element[0] is None:
        return "missing activation element type (no GEMM input types, no torch_dtype)"
    return breakeven(ctx, fm, element, estimate_a(ctx, p))


def _formula(ctx: Context, ms: BreakEvenMeasure) -> tuple[str, str]:
    """T*'s formula and the same with the numbers plugged in, for the scheme measured."""
    m, p, fit, cm, a, e_a = ctx.model, ms.p, ms.fm.fit, ms.fm.cm, ms.a, ms.e_a
    t_star, proj, values = ms.t_star, ms.proj, ms.fm.values
    B = fit.bus_bw_bytes_per_s
    bw = f"{B / 1e9:.3g} GB/s" if B else "∞ (unresolved)"
    if cm.name == "sequence-parallel":
        formula = (
            "T* = 4L·α / (a(1−1/p) − 2L·(v_RS + v_AG)·H·e_a/B), τ = α + V/B fitted (Theil–Sen) over the "
            "reduce-scatters and all-gathers (sequence-parallel variant)"
        )
        factors = " + ".join(f"{n}·{f:.3g}" for _, n, f in cm.calls)
        substituted = (
            f"T* = {cm.calls_per_step}·{fit.alpha_s * 1e6:.1f} µs / ({a * 1e3:.4g} ms·(1−1/{p}) − ({factors})·{m.H}·"
            f"{e_a} B/{bw}) = {ms.two_l_alpha * 1e3:.4g} ms / {ms.den * 1e3:.4g} ms = "
            + (f"{t_star:.3g} tokens" if t_star is not None else "no solution (denominator ≤ 0)")
        )
    else:
        formula = "T* = 2L·α_p / (a(1−1/p) − 4L·(p−1)/p·H·e_a/B_p), τ = α + V_AR/B fitted (Theil–Sen)"
        substituted = (
            f"T* = 2·{m.L}·{fit.alpha_s * 1e6:.1f} µs / ({a * 1e3:.4g} ms·(1−1/{p}) − 4·{m.L}·{(p - 1) / p:.3g}·"
            f"{m.H}·{e_a} B/{bw}) = {ms.two_l_alpha * 1e3:.4g} ms / {ms.den * 1e3:.4g} ms = "
            + (f"{t_star:.3g} tokens" if t_star is not None else "no solution (denominator ≤ 0)")
        )
    # the decision's own condition: TP slower at T when 2L·α − c(1−1/p) − den·T > 0 (c: the GEMM time's fixed part)
    formula += "; TP slower at T when 2L·α − c(1−1/p) − den·T > 0, T*_c = (2L·α − c(1−1/p)) / den"
    substituted += (
        f"; c = {ms.c_fixed * 1e3:.4g} ms per step, c(1−1/{p}) = {ms.fixed_saved * 1e3:.4g} ms: T*_c = "
        + (f"{values['T_star_with_c']:.4g}" if values["T_star_with_c"] is not None else "none (den ≤ 0)")
        + f", slower for {ms.share_with_c:.0%} of {len(ms.Ts)} steps"
    )
    if "F_proj_kind" in proj:
        formula += f"; a is read against F_proj ({proj['F_proj_kind']}): {proj['F_proj_formula']}"
        substituted += (
            f"; {proj['F_proj_substituted']}; a = {a * 1e3:.4g} ms per token implies "
            f"{proj['F_compared_with_a']}/a = {proj['a_implied_tflops']:.4g} TFLOP/s"
        )
    return formula, substituted


def _not_decided(ctx: Context, ms: BreakEvenMeasure, common: dict) -> Check | None:
    """Decode T is below T*, but the a·T model does not support "TP is slower": said as info, not a warning."""
    p, t_star, values, fit_text = ms.p, ms.t_star, ms.fm.values, ms.fm.fit_text
    if ms.share > BELOW_SHARE_FINDING and ms.floor is not None and ms.a < ms.floor:
        # The a·T model cannot hold: the GEMM time per token is below what the FLOPs need at the peak, so it is not
        # compute, and the weight-read time TP also divides is missing from it. No warning on that basis.
        title = (
            f"TP={p} against TP=1 not decided: a = {ms.a * 1e3:.3g} ms per token is below the compute floor "
            f"F/peak = {ms.floor * 1e3:.3g} ms ({ms.proj['F_proj_kind']} F_proj at {ms.proj['peak_tflops']:g} "
            f"TFLOP/s), so the GEMM time over the T seen is not compute; T* = "
            + (f"{t_star:.3g}" if t_star is not None else "none")
            + f" from it does not show that TP loses; {fit_text}"
        )
        next_check = (
            "Measure a from a TP=1 trace of the same model (--tp1-baseline) over batches where the projections "
            "are compute-bound, check that --peak-tflops is the peak of the GEMMs' input type and that the "
            "config is the served model's (SHP002); the per-T-bucket table shows the measured all-reduce time."
        )
    elif ms.share > BELOW_SHARE_FINDING and ms.share_with_c <= BELOW_SHARE_FINDING:
        t_c = values["T_star_with_c"]
        title = (
            f"TP={p} against TP=1 not decided: median decode T = {values['median_T']:g} is below T* = "
            + (f"{t_star:.3g}" if t_star is not None else "none")
            + f" of the per-token model, but the GEMM time also has a fixed part c = {ms.c_fixed * 1e3:.3g} ms per "
            f"step (its intercept over T: weight reads) that TP divides too; counting it, TP=p is slower for "
            f"only {ms.share_with_c:.0%} of steps"
            + (f" (T*_c = {t_c:.3g})" if t_c is not None else "")
            + f"; {fit_text}"
        )
        next_check = (
            "Measure both layouts: a TP=1 trace of the same model (--tp1-baseline) gives a and c at TP=1; "
            "compare p replicas of TP=1 with TP=p by per-card goodput (SHP004)."
        )
    else:
        return None
    return finding(
        RULE, **common, severity="info", confidence="low", impact=ms.share, title=title, next_check=next_check
    )


def judge(ctx: Context, ms: BreakEvenMeasure) -> Check:
    """Status, severity and words from COL003's numbers."""
    p, fit, cm, t_star, values = ms.p, ms.fm.fit, ms.fm.cm, ms.t_star, ms.fm.values
    formula, substituted = _formula(ctx, ms)
    confidence = "medium" if ms.a_is_estimate else "high"
    if fit.line.r2 is not None and fit.line.r2 < 0.5 and fit.bus_bw_bytes_per_s is not None:
        confidence = "low" if ms.a_is_estimate else "medium"
    common = {
        "formula": formula,
        "substituted": substituted,
        "values": values,
        "table": ms.table,
        "evidence": ms.evidence,
        "cost_model_applies": True,
    }
    undecided = _not_decided(ctx, ms, common)
    if undecided is not None:
        return undecided
    if ms.share > BELOW_SHARE_FINDING:
        if t_star is None:
            title = (
                f"TP={p} cannot beat TP=1 at any T: the bus-time per token exceeds the compute it saves "
                f"(a(1−1/p) − bandwidth term = {ms.den * 1e3:.3g} ms ≤ 0); {ms.fm.fit_text}"
            )
        else:
            title = (
                f"TP={p} is slower than TP=1 for {ms.share:.0%} of {ms.scope.split(' ')[0]} steps: median T = "
                f"{values['median_T']:g} < T* = {t_star:.3g}; the fixed latency of {cm.calls_per_step} dependent "
                f"{'collectives (' + cm.describe() + ')' if cm.name != 'all-reduce' else 'all-reduces (2L)'} "
                f"({ms.two_l_alpha * 1e3:.3g} ms per step at α = {fit.alpha_s * 1e6:.0f} µs) dominates"
            )
        return finding(
            RULE,
            **common,
            severity="warning",
            confidence=confidence,
            impact=ms.share,
            title=title + (" (a estimated)" if ms.a_is_estimate else ""),
            next_check=(
                "Compare with p replicas of TP=1 by per-card goodput (SHP004); raise the decode batch or lower α "
                "(custom all-reduce, NVLS, CUDA graphs); measure a from a TP=1 trace (--tp1-baseline)"
                + (" — a here is an estimate" if ms.a_is_estimate else "")
                + "."
            ),
        )
    return passed(
        RULE,
        **common,
        confidence=confidence,
        title=(
            f"Decode T (median {values['median_T']:g}) is above the break-even T* = {t_star:.3g} for TP={p}; "
            f"{ms.fm.fit_text} — T* is optimistic (ideal 1/p compute, the rest of the step ignored): "
            "this does not prove TP pays off"
        ),
    )


def check(ctx: Context) -> Check:
    ms = measure(ctx)
    if isinstance(ms, str):
        return not_applicable(RULE, ms)
    return judge(ctx, ms)
