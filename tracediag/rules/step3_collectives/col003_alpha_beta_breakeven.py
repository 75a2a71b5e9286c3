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

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tracediag.analyses import gpu
from tracediag.analyses.allreduce_fits import allreduce_fits, allreduce_samples
from tracediag.analyses.tp_collectives import (
    SEQUENCE_PARALLEL,
    activation_element_bytes,
    tp_allreduce_where,
    tp_scheme,
    tp_sp_where,
)
from tracediag.context import Baseline, Context
from tracediag.errors import TracediagError
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model import accounting, tpmath
from tracediag.model.fitting import LineFit, theil_sen
from tracediag.rules import upstream_check
from tracediag.store import query_dicts

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
LM_HEAD_INCLUDED = "lm_head included"  # in a's source when its GEMM time counts the lm_head

Rows = Callable[[str, list | None], list[dict[str, Any]]]


# --- bus bytes per call ----------------------------------------------------------------------------------------


def _bus_factor(op: str, exec_op: str | None, p: int) -> float:
    """Bus bytes per byte of the call's full [T, H] side: 2(p−1)/p for an all-reduce (also a reduce-scatter the
    backend ran as one), (p−1)/p for a reduce-scatter or an all-gather."""
    if op == "all_reduce" or exec_op == "all_reduce":
        return 2 * (p - 1) / p
    return (p - 1) / p


# --- projection slope a ---------------------------------------------------------------------------------------


def _lm_head_widths(model, p: int) -> list[int]:
    """Output widths that identify the lm_head GEMM (V, V/p) unless a projection has the same width."""
    m = model
    if not m or not m.vocab_size:
        return []
    proj = {m.H}
    if m.I:
        proj |= {m.I // p, 2 * m.I // p, m.I, 2 * m.I}
    if m.h and m.D:
        kv = -(-(m.H_kv or m.h) // p)
        proj |= {m.h // p * m.D, (m.h // p + 2 * kv) * m.D, kv * m.D, m.h * m.D}
    return [w for w in {m.vocab_size, m.vocab_size // p} if w not in proj]


def gemm_time_per_step(rows: Rows, model, p: int) -> tuple[list[dict], str]:
    """Per (rank, step) with T: projection GEMM time. GPU kernels (gemm/wo_gemm classes, launched in the
    step) when the trace has kernels; else the outermost CPU GEMM ops, without the lm_head (vocab width)."""
    gpu = rows(
        """
        SELECT s.rank, s.step_id, s.T, sum(k.dur_ns) AS gemm_ns
        FROM steps s
        JOIN runtime r ON r.rank = s.rank AND r.ts_ns >= s.ts_ns AND r.ts_ns < s.ts_ns + s.dur_ns
        JOIN kernels k ON k.rank = r.rank AND k.correlation = r.correlation
        WHERE s.T IS NOT NULL AND k.klass IN ('gemm', 'wo_gemm')
        GROUP BY s.rank, s.step_id, s.T ORDER BY s.rank, s.step_id
        """,
        None,
    )
    if gpu:
        return gpu, f"GPU GEMM kernel time per step (gemm and weight-only GEMM classes, {LM_HEAD_INCLUDED})"
    widths = _lm_head_widths(model, p)
    n_out = (
        "CASE WHEN g.name = 'aten::linear' THEN try_cast(g.w_dims AS BIGINT[])[1] "
        "ELSE try_cast(g.w_dims AS BIGINT[])[-1] END"
    )
    excl = " AND ".join(f"coalesce({n_out} <> ?, TRUE)" for _ in widths) or "TRUE"
    cpu = rows(
        f"""
        WITH g AS (
            SELECT g.rank, g.step_id, g.dur_ns FROM gemm_shapes g WHERE {excl}
            UNION ALL  -- weight-only GEMM ops called directly (aten::_weight_int4pack_mm_for_cpu, ...)
            SELECT o.rank, s.step_id, o.dur_ns FROM cpu_ops o
            JOIN steps s ON s.rank = o.rank AND o.ts_ns >= s.ts_ns AND o.ts_ns < s.ts_ns + s.dur_ns
            WHERE o.klass = 'wo_gemm'
        )
        SELECT s.rank, s.step_id, s.T, sum(g.dur_ns) AS gemm_ns
        FROM g JOIN steps s ON s.rank = g.rank AND s.step_id = g.step_id
        WHERE s.T IS NOT NULL
        GROUP BY s.rank, s.step_id, s.T ORDER BY s.rank, s.step_id
        """,
        widths,
    )
    lm = "lm_head excluded" if widths else f"{LM_HEAD_INCLUDED} (vocab width unknown or equal to a projection's)"
    return cpu, f"CPU time of the outermost GEMM and weight-only GEMM ops per step, {lm}"


def projection_slope(rows: Rows, model, p: int) -> tuple[LineFit | None, str, int]:
    """Theil–Sen slope of per-step GEMM time (s) over T; returns (fit, source, points)."""
    per_step, source = gemm_time_per_step(rows, model, p)
    fit = theil_sen([r["T"] for r in per_step], [r["gemm_ns"] / 1e9 for r in per_step])
    return fit, source, len(per_step)


def baseline_slope(baseline: Baseline, model) -> tuple[float | None, str, float]:
    """a from a TP=1 trace (its own in-memory store, Context.baseline): (a, how, c) or (None, why not, 0), c the
    fit's intercept (s per step, 0 when negative)."""
    path = baseline.path
    try:
        con = baseline.store()
    except TracediagError as exc:
        return None, f"the TP=1 baseline could not be read ({exc})", 0.0
    world = con.execute("SELECT max(world_size), count(DISTINCT rank) FROM inputs").fetchone()
    ars = con.execute(
        "SELECT count(*) FROM collectives WHERE op = 'all_reduce' AND coalesce(group_size, 2) > 1"
    ).fetchone()[0]
    if (world[0] or 1) > 1 or world[1] > 1 or ars:
        return (
            None,
            f"the baseline {path} is not a TP=1 trace (world size {world[0]}, {world[1]} rank files, "
            f"{ars} all-reduces)",
            0.0,
        )
    widths = con.execute(
        "SELECT count(*) FROM gemm_shapes WHERE try_cast(act_dims AS BIGINT[])[-1] = ?", [model.H]
    ).fetchone()[0]
    has_shapes = con.execute("SELECT count(*) FROM gemm_shapes").fetchone()[0]
    if has_shapes and not widths:
        return None, f"the baseline {path} has no GEMM with input width H = {model.H}: another model", 0.0
    fit, source, n = projection_slope(lambda q, a: query_dicts(con, q, a), model, 1)
    if fit is None or fit.slope <= 0:
        why = f"the baseline {path} has no steps with two different T and a GEMM time rising with T ({n} steps)"
        return None, why, 0.0
    return fit.slope, f"TP=1 baseline {path}: slope of {source} over T ({n} steps)", max(fit.intercept, 0.0)


def estimate_a(ctx: Context, p: int) -> tuple[float | None, str, bool, list[str], float]:
    """(a in s/token, source, is_estimate, notes, c): c is the same fit's intercept at TP=1 scale, s per step (the
    GEMM time at T → 0, weight reads on a GPU; 0 when the fit's is negative), which TP divides too."""
    m = ctx.model
    notes: list[str] = []
    if ctx.settings.tp1_baseline:
        a, how, c = baseline_slope(ctx.baseline, m)
        if a is not None:
            return a, how, False, notes, c
        notes.append(how)
    fit, source, n = projection_slope(ctx.rows, m, p)
    if fit is not None and fit.slope > 0:
        return (
            p * fit.slope,
            f"estimate: p × slope of {source} over T at TP={p} ({n} rank-steps), assuming ideal 1/p sharding",
            True,
            notes,
            p * max(fit.intercept, 0.0),
        )
    if fit is None:
        notes.append(f"no per-step GEMM-time slope over T ({n} rank-steps with T; two different T are needed)")
    else:
        notes.append(
            f"the per-step GEMM time does not rise with T ({n} rank-steps, slope {fit.slope * 1e9:.3g} ns/token): "
            "compute time is hidden by overheads or contention"
        )
    # a is never taken from a nominal peak: it is fitted from a TP=1 trace bucketed by T, or estimated above
    return None, "", True, notes, 0.0


# --- the projection FLOPs a stands for (F_proj from tracediag.model.accounting) ---------------------------------

# What the 2L all-reduce account and the 1/p compute split assume of an MoE model. vLLM
# (model_executor/layers/fused_moe/runner/default_moe_runner.py, _maybe_reduce_output) sums the expert outputs of
# the TP group with one tensor-parallel all-reduce of [T, H] per MoE layer, with or without expert parallelism,
# unless an all-to-all combine kernel already reduced them.
MOE_TP_ASSUMPTION = (
    "MoE: the experts are split over the TP group (each rank holds 1/p of every expert, or with expert parallelism "
    "1/p of the experts) and the MoE block ends in one all-reduce of [T, H], as a dense MLP does (vLLM's FusedMoE "
    "reduces the expert outputs so unless an all-to-all combine kernel did); the compute per rank is 1/p of the "
    "active F_proj, which under expert parallelism holds only on average over uniform routing (the busiest rank "
    "sets the step). With all-to-all dispatch/combine (DeepEP, pplx, ...) only the attention blocks and the dense "
    "layers keep their all-reduce: COL001 then counts fewer than 2L and T* is not computed"
)
LEAVES_OUT = (
    "attention scores over the context (Q·Kᵀ and P·V, growing with the context length), norms and sampling: F_proj "
    "and T* count the projections only, a short-context estimate"
)


def projection_account(
    m,
    p: int,
    a: float,
    a_source: str,
    peak_tflops: float | None,
    t_star_at: Callable[[float], float | None],
    peak_source: str | None = None,
) -> tuple[dict[str, Any], float | None]:
    """F_proj per token (dense, or MoE-active: attention, dense layers, router, shared and k routed experts; from
    the shared accounting), the effective projection throughput the measured a implies (F/a), and with
    --peak-tflops the compute floor F/peak: a per-token GEMM time below it cannot be compute. Returns (values,
    the floor in s/token or None). `t_star_at(a)` is T* with another a."""
    fp = accounting.projection_flops(m)
    if fp is None:
        return {"F_proj_note": "not computed: the config lacks the attention shape (h, D) or every MLP width"}, None
    with_head = LM_HEAD_INCLUDED in a_source
    F = fp.layers + (fp.lm_head if with_head else 0.0)
    share = accounting.projection_flops(m, p).layers / fp.layers
    replicated = share > (1 / p) * (1 + 1e-4)
    values: dict[str, Any] = {
        "F_proj_kind": fp.kind,
        "F_proj_formula": fp.formula,
        "F_proj_inputs": fp.inputs,
        "F_proj_substituted": fp.substituted,
        "F_proj_flop_per_token": round(fp.layers),
        "F_proj_by_group_flop_per_token": {g: round(f) for g, f in fp.by_group.items()},
        "F_lm_head_flop_per_token": round(fp.lm_head),
        "F_compared_with_a": "F_proj + lm_head (a's GEMM time includes the lm_head)" if with_head else "F_proj",
        "a_implied_tflops": round(F / a / 1e12, 6),
        "F_proj_rank_share": round(share, 6),
        "F_proj_rank_share_note": (
            f"one rank does {share:.4g} of F_proj at TP={p} as the accounting splits the weights; T* assumes the "
            f"ideal 1/p = {1 / p:.4g}"
            + (
                " — the replicated parts (router, MLA down-projections, K/V heads when p > H_kv) make it more "
                "optimistic still"
                if replicated
                else ""
            )
        ),
        "F_proj_leaves_out": LEAVES_OUT,
    }
    if fp.kind == "MoE-active":
        dense = accounting.dense_formula_flops(m)
        if dense:
            values["F_proj_dense_formula_flop_per_token"] = round(dense)
            values["F_proj_vs_dense_formula"] = round(fp.layers / dense, 4)
        values["moe_tp_assumption"] = MOE_TP_ASSUMPTION
    if not peak_tflops:
        return values, None
    floor = F / (peak_tflops * 1e12)
    at_floor = t_star_at(floor)
    values |= {
        "peak_tflops": peak_tflops,
        **({"peak_source": peak_source} if peak_source and peak_source.startswith("from the GPU catalogue") else {}),
        "a_compute_floor_ms_per_token": round(floor * 1e3, 6),
        "a_vs_compute_floor": round(a / floor, 4),
        "T_star_at_compute_floor": round(at_floor, 3) if at_floor is not None else None,
        "compute_floor_note": (
            f"a compute-bound projection needs at least F/peak = {F:.4g} FLOP / {peak_tflops:g} TFLOP/s = "
            f"{floor * 1e3:.4g} ms per token, which puts T* at most at "
            + (f"{at_floor:.3g}" if at_floor is not None else "no solution")
            + (
                f"; the measured a = {a * 1e3:.4g} ms is below it: the GEMM time over the T seen is not compute "
                "(weight reads, which TP divides too and the a·T model leaves out, or GEMM work the trace does not "
                "attribute), so T* computed from it does not show that TP loses"
                if a < floor
                else ""
            )
        ),
    }
    return values, floor


# --- cost-model applicability (COL001 / COL002 conditions, recomputed) ----------------------------------------


def cost_model_verdicts(ctx: Context) -> list[str]:
    """Reasons the 2L·τ_AR(T·H·e_a) account does not hold, from COL001/COL002's own checks on this store."""
    reasons = []
    for rule_id in ("COL001", "COL002"):
        c = upstream_check(ctx, rule_id)
        if c.cost_model_applies is False:
            reasons.append(f"{c.rule}: {c.title}")
    return reasons


# --- per-T buckets ----------------------------------------------------------------------------------------------


def _bucket(T: int, distinct: int) -> str:
    if distinct <= 8:
        return str(T)
    lo = 1 << (max(T, 1).bit_length() - 1)
    return f"{lo}-{2 * lo - 1}"


def t_buckets(ctx: Context, p: int, fit: tpmath.AlphaBetaFit, e_a: int, model: CommModel | None = None) -> list[dict]:
    m = ctx.model
    model = model or CommModel("all-reduce", (("all-reduces", 2 * m.L, 2 * (p - 1) / p),))
    where = tp_sp_where("c") if model.name == "sequence-parallel" else tp_allreduce_where("c")
    steps = ctx.rows(
        f"""
        SELECT s.rank, s.step_id, s.T, s.phase, s.dur_ns,
               sum(c.dur_ns) FILTER (WHERE {where}) AS ar_ns,
               count(c.op) FILTER (WHERE {where}) AS ar_calls
        FROM steps s LEFT JOIN collectives c ON c.rank = s.rank AND c.step_id = s.step_id
        WHERE s.T IS NOT NULL AND s.T > 0
        GROUP BY s.rank, s.step_id, s.T, s.phase, s.dur_ns ORDER BY s.T
        """,
        [p, p],
    )
    distinct = len({s["T"] for s in steps})
    buckets: dict[tuple, list[dict]] = defaultdict(list)
    for s in steps:
        buckets[(_bucket(s["T"], distinct), s["phase"] or "unknown")].append(s)
    out = []
    for (b, phase), ss in sorted(buckets.items(), key=lambda kv: (min(s["T"] for s in kv[1]), kv[0][1])):
        T = statistics.median(s["T"] for s in ss)
        step_ns = statistics.median(s["dur_ns"] for s in ss)
        model_ns = model.step_time_s(fit, T * m.H * e_a) * 1e9
        out.append(
            {
                "T_bucket": b,
                "phase": phase,
                "rank_steps": len(ss),
                "median_T": T,
                "median_step_ns": int(step_ns),
                "model_comm_ns": int(model_ns),
                "model_comm_share": round(model_ns / step_ns, 4) if step_ns else None,
                "observed_allreduce_ns": int(statistics.median(s["ar_ns"] or 0 for s in ss)),
                "observed_allreduce_calls": statistics.median(s["ar_calls"] for s in ss),
            }
        )
    return out


# --- the communication account per step: all-reduces, or the sequence-parallel pairs ---------------------------


@dataclass(frozen=True)
class CommModel:
    """Calls per step of one collective scheme: (what, calls per step, bus bytes per byte of S = T·H·e_a)."""

    name: str
    calls: tuple[tuple[str, int, float], ...]

    @property
    def calls_per_step(self) -> int:
        return sum(n for _, n, _ in self.calls)

    def bus_bytes_per_token(self, H: int, e_a: int) -> float:
        return sum(n * f for _, n, f in self.calls) * H * e_a

    def step_time_s(self, fit: tpmath.AlphaBetaFit, S: float) -> float:
        B = fit.bus_bw_bytes_per_s
        return sum(n * (fit.alpha_s + (f * S / B if B else 0.0)) for _, n, f in self.calls)

    def describe(self) -> str:
        return " + ".join(f"{n} {what}" for what, n, _ in self.calls)


def comm_model(ctx: Context, p: int, scheme: str) -> CommModel:
    L = ctx.model.L
    if scheme != SEQUENCE_PARALLEL:
        return CommModel("all-reduce", (("all-reduces", 2 * L, 2 * (p - 1) / p),))
    ran = ctx.scalar(f"SELECT mode(exec_op) FROM collectives WHERE op = 'reduce_scatter' AND {tp_sp_where()}", [p])
    rs = _bus_factor("reduce_scatter", ran, p)
    what = "reduce-scatters (run as all-reduces by the backend)" if ran == "all_reduce" else "reduce-scatters"
    return CommModel("sequence-parallel", ((what, 2 * L, rs), ("all-gathers", 2 * L, (p - 1) / p)))


# --- the check --------------------------------------------------------------------------------------------------


def _fit_values(fit: tpmath.AlphaBetaFit) -> dict:
    return {
        "alpha_us": round(fit.alpha_s * 1e6, 3),
        "bus_bw_gbs": round(fit.bus_bw_bytes_per_s / 1e9, 4) if fit.bus_bw_bytes_per_s else None,
        "fit_r2": round(fit.line.r2, 4) if fit.line.r2 is not None else None,
        "fit_median_abs_rel_residual": round(fit.line.median_abs_rel_residual, 4),
        "fit_calls": fit.line.n,
        "fit_distinct_payloads": fit.line.distinct_x,
        "fit_payload_range_bytes": [fit.min_payload_bytes, fit.max_payload_bytes],
        "fit_method": fit.line.method,
    }


def _fit_text(fit: tpmath.AlphaBetaFit, r2: float | None) -> str:
    return (
        f"α = {fit.alpha_s * 1e6:.1f} µs, B = "
        + (f"{fit.bus_bw_bytes_per_s / 1e9:.2f} GB/s" if fit.bus_bw_bytes_per_s else "unresolved")
        + f" (R² {r2}, {fit.line.n} calls)"
    )


def _fit_notes(fit: tpmath.AlphaBetaFit, r2: float | None) -> dict[str, Any]:
    """The fit's caveats as values: a clamped intercept, a bandwidth the call times do not resolve."""
    notes: dict[str, Any] = {}
    if fit.alpha_clamped:
        notes["alpha_note"] = (
            f"the robust intercept was {fit.raw_intercept_s * 1e6:.1f} µs (< 0, not physical): α is taken as 0 and B "
            "from the median of τ/V_AR (a fit through the origin); T* is then 0 — read it as 'latency does not "
            "limit TP here', and check the fit residuals"
        )
    if fit.latency_only:
        notes["fitted_slope_bus_bw_gbs"] = round(1 / fit.line.slope / 1e9, 4) if fit.line.slope > 0 else None
        notes["bus_bw_note"] = (
            f"the call time does not grow measurably with payload over {fit.min_payload_bytes:,}–"
            f"{fit.max_payload_bytes:,} B (R² {r2} < {tpmath.MIN_R2_FOR_BANDWIDTH}): latency-bound, "
            "α = median call time and the bandwidth term is taken as 0 (T* is then a lower bound)"
        )
    return notes


@dataclass(frozen=True)
class FitMeasure:
    """The α–β fit at group size p and the calls it was made from."""

    fit: tpmath.AlphaBetaFit
    cm: CommModel
    samples: list[dict]
    values: dict[str, Any]
    fit_text: str


def measure_fit(ctx: Context, p: int) -> FitMeasure | str:
    """The α–β fit of the TP collectives at group size p, or why it cannot be made."""
    scheme = tp_scheme(ctx, p)
    what = "reduce-scatter / all-gather" if scheme == SEQUENCE_PARALLEL else "all-reduce"
    samples, dur_source = allreduce_samples(ctx, p, scheme)
    if not samples:
        return f"missing TP {what} calls with a recorded payload and duration"
    fits = allreduce_fits(ctx, p, scheme)
    fit = fits.get(p)
    if fit is None:
        sizes = sorted({s["payload_bytes"] for s in samples if s["group_size"] == p})
        return (
            f"missing {what} calls of at least two different payload sizes at group size {p} "
            f"(seen: {sizes[:5]}): α and B cannot be separated"
        )
    cm = comm_model(ctx, p, scheme)
    values: dict[str, Any] = {
        "p": p,
        **_fit_values(fit),
        "call_times_from": dur_source,
        "scheme": cm.name,
        "calls_per_step": cm.calls_per_step,
        "calls_per_step_by_op": cm.describe(),
    }
    if len(fits) > 1:
        values["other_group_sizes"] = {
            str(g): _fit_values(f) if f else "fewer than two payload sizes" for g, f in fits.items() if g != p
        }
    values |= _fit_notes(fit, values["fit_r2"])
    return FitMeasure(fit, cm, samples, values, _fit_text(fit, values["fit_r2"]))


def _evidence(ctx: Context, samples: list[dict]) -> list[dict]:
    return [
        {k: s[k] for k in ("rank", "step", "ts_ns", "name", "work_event", "payload_bytes", "dur_ns")}
        for s in sorted(samples, key=lambda s: s["payload_bytes"])[:: max(1, len(samples) // 5)][
            : ctx.settings.max_evidence
        ]
    ]


def _compared_steps(ctx: Context) -> tuple[list[int], str]:
    """The T of each decode step (one rank per step), or of every step when none is labelled decode."""
    decode = ctx.rows(
        "SELECT DISTINCT ON (step_id) step_id, T, rank FROM steps WHERE phase = 'decode' AND T IS NOT NULL "
        "ORDER BY step_id, rank"
    )
    scope = "decode"
    if not decode:
        decode = ctx.rows(
            "SELECT DISTINCT ON (step_id) step_id, T, rank FROM steps WHERE T IS NOT NULL ORDER BY step_id, rank"
        )
        scope = "all (no decode steps labelled)"
    return [d["T"] for d in decode], scope


@dataclass(frozen=True)
class BreakEvenMeasure:
    """COL003's numbers: the fit, a and c, T*, T*_c and the steps on either side of them."""

    p: int
    fm: FitMeasure
    e_a: int
    a: float
    a_is_estimate: bool
    c_fixed: float
    den: float
    t_star: float | None
    Ts: list[int]
    scope: str
    share: float
    share_with_c: float
    two_l_alpha: float
    fixed_saved: float
    proj: dict[str, Any]
    floor: float | None
    table: list[dict]
    evidence: list[dict]


def measure(ctx: Context) -> BreakEvenMeasure | str:
    """Every number COL003 judges by, or the reason (a string) it does not apply."""
    m, p = ctx.model, ctx.tp.p
    if p == 1:
        return "p = 1: no tensor-parallel all-reduces to fit"
    fm = measure_fit(ctx, p)
    if isinstance(fm, str):
        return fm
    fit, cm, values = fm.fit, fm.cm, fm.values
    against = cost_model_verdicts(ctx)
    if against:
        return (
            "the 2L·τ_AR(T·H·e_a, p) cost model does not apply here ("
            + "; ".join(against)
            + f"), so neither the per-step account nor T* is computed; fitted {fm.fit_text}"
        )
    e_a, e_a_source = activation_element_bytes(ctx)
    if e_a is None:
        return "missing activation element type (no GEMM input types, no torch_dtype)"
    values |= {"L": m.L, "H": m.H, "e_a": e_a, "e_a_source": e_a_source}
    table = t_buckets(ctx, p, fit, e_a, cm)
    a, a_source, a_is_estimate, a_notes, c_fixed = estimate_a(ctx, p)
    if a_notes:
        values["a_notes"] = a_notes
    evidence = _evidence(ctx, fm.samples)
    if a is None:
        return (
            "missing the projection slope a: " + "; ".join(a_notes) + "; pass --tp1-baseline (a TP=1 trace of the "
            f"same model; a is never taken from a nominal peak); fitted {fm.fit_text}"
        )
    B = fit.bus_bw_bytes_per_s
    per_token = cm.bus_bytes_per_token(m.H, e_a)
    den = tpmath.breakeven_denominator(a, p, m.L, m.H, e_a, B, per_token)
    t_star = tpmath.breakeven_tokens(m.L, fit.alpha_s, a, p, m.H, e_a, B, cm.calls_per_step, per_token)
    Ts, scope = _compared_steps(ctx)
    below = [t for t in Ts if t_star is None or t < t_star]
    share = len(below) / len(Ts) if Ts else 0.0
    # The per-token model leaves out the GEMM time's fixed part c (its intercept: weight reads at T → 0), which
    # TP divides as well. With it, TP=p is slower at T when 2L·α + bw·T > (c + a·T)(1 − 1/p), i.e. when
    # 2L·α − c(1 − 1/p) − den·T > 0. A "slower" verdict must hold with c counted.
    two_l_alpha = cm.calls_per_step * fit.alpha_s
    fixed_saved = c_fixed * (1 - 1 / p)
    slower_with_c = [t for t in Ts if two_l_alpha - fixed_saved - den * t > 0]
    share_with_c = len(slower_with_c) / len(Ts) if Ts else 0.0
    values |= {
        "a_ms_per_token": round(a * 1e3, 6),
        "a_source": a_source,
        "a_is_estimate": a_is_estimate,
        "breakeven_denominator_s": den,
        "T_star": round(t_star, 3) if t_star is not None else None,
        "steps_compared": scope,
        "steps_with_T": len(Ts),
        "median_T": statistics.median(Ts) if Ts else None,
        "share_below_T_star": round(share, 4),
        "c_fixed_gemm_ms_per_step": round(c_fixed * 1e3, 6),
        "c_saved_by_tp_ms_per_step": round(fixed_saved * 1e3, 6),
        "T_star_with_c": round((two_l_alpha - fixed_saved) / den, 3) if den > 0 else None,
        "share_slower_with_c": round(share_with_c, 4),
    }

    def t_star_at(a_other: float) -> float | None:
        return tpmath.breakeven_tokens(m.L, fit.alpha_s, a_other, p, m.H, e_a, B, cm.calls_per_step, per_token)

    peak, peak_source = gpu.peak_flops(ctx)  # --peak-tflops, else the GPU catalogue's datasheet peak
    proj, floor = projection_account(m, p, a, a_source, peak / 1e12 if peak else None, t_star_at, peak_source)
    values |= proj
    return BreakEvenMeasure(
        p,
        fm,
        e_a,
        a,
        a_is_estimate,
        c_fixed,
        den,
        t_star,
        Ts,
        scope,
        share,
        share_with_c,
        two_l_alpha,
        fixed_saved,
        proj,
        floor,
        table,
        evidence,
    )


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
