"""The compute tensor parallelism divides, as COL003 measures it: the projection GEMM time per token a (the Theil–Sen
slope of per-step GEMM time over T, from a TP=1 baseline or estimated at TP=p) with its fixed part c (the same
fit's intercept: weight reads as T → 0), and the projection FLOPs F_proj that a stands for (from
tracediag.model.accounting) with, given a peak, the compute floor F/peak."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tracediag.context import Baseline, Context
from tracediag.errors import TracediagError
from tracediag.model import accounting
from tracediag.model.fitting import LineFit, theil_sen
from tracediag.store import query_dicts

LM_HEAD_INCLUDED = "lm_head included"  # in a's source when its GEMM time counts the lm_head

Rows = Callable[[str, list | None], list[dict[str, Any]]]

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
