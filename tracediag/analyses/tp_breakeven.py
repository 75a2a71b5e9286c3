"""The α–β break-even of tensor parallelism (COL003's measurement): the robust fit τ = α + V/B of the TP
collectives (tracediag.analyses.allreduce_fits) with its caveats, the communication account per step (2L
all-reduces, or the sequence-parallel reduce-scatter/all-gather pairs), the modelled against the measured
collective time per T bucket, and from the projection slope a (tracediag.analyses.projection_compute) the
break-even token count T*, the same with the GEMM time's fixed part c counted (T*_c), and the share of the steps
compared that lies on the slower side of each."""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from tracediag.analyses import gpu
from tracediag.analyses.allreduce_fits import allreduce_fits, allreduce_samples
from tracediag.analyses.projection_compute import projection_account
from tracediag.analyses.tp_collectives import SEQUENCE_PARALLEL, tp_allreduce_where, tp_scheme, tp_sp_where
from tracediag.context import Context
from tracediag.model import tpmath

# --- bus bytes per call ----------------------------------------------------------------------------------------


def _bus_factor(op: str, exec_op: str | None, p: int) -> float:
    """Bus bytes per byte of the call's full [T, H] side: 2(p−1)/p for an all-reduce (also a reduce-scatter the
    backend ran as one), (p−1)/p for a reduce-scatter or an all-gather."""
    if op == "all_reduce" or exec_op == "all_reduce":
        return 2 * (p - 1) / p
    return (p - 1) / p


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


# --- the fit at group size p, its caveats in words ----------------------------------------------------------------


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


# --- T* and T*_c against the steps compared -----------------------------------------------------------------------


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


AMeasure = tuple[float | None, str, bool, list[str], float]  # estimate_a's (a, source, is_estimate, notes, c)


def breakeven(ctx: Context, fm: FitMeasure, element: tuple[int, str], a_measured: AMeasure) -> BreakEvenMeasure | str:
    """T* and T*_c at the TP degree p from the fit `fm`, the activation element size e_a (bytes, where it came
    from) and the projection slope a with its fixed part c (projection_compute.estimate_a); with the per-T-bucket
    table and F_proj's account. Or why T* cannot be computed (no a)."""
    m, p = ctx.model, ctx.tp.p
    fit, cm, values = fm.fit, fm.cm, fm.values
    e_a, e_a_source = element
    values |= {"L": m.L, "H": m.H, "e_a": e_a, "e_a_source": e_a_source}
    table = t_buckets(ctx, p, fit, e_a, cm)
    a, a_source, a_is_estimate, a_notes, c_fixed = a_measured
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
