"""KRN007 Narrow shards.

Hypothesis: tensor parallelism divides each projection GEMM by p, and the cost model assumes each rank then
runs its 1/p of the FLOPs at the same rate (ideal 1/p, docs/method.md step 3; real small matrices can lose
efficiency when each card's I/p is too narrow). When the shards get narrow — I/p or h·D/p columns on a rank —
a GEMM kernel runs at a lower FLOP rate, so TP=p buys less than 1/p and the break-even T* (COL003) is optimistic.

Formula: per projection role (q/k/v or fused qkv, o, gate/up, down, matched by their (K, N) at TP=p from the
config) and T: FLOPs = 2·T·K·N per call, achieved rate R_p = Σ FLOPs / Σ time (GPU kernel time of the op on
GPU traces, the op's host time on CPU-only traces). Against a TP=1 trace of the same model (--tp1-baseline),
same role at the same T: efficiency E = R_p / R_1 (1 = ideal 1/p); else against --peak-tflops, or without it the
GPU catalogue's dense peak for the GEMM activation type on the trace's GPU (a datasheet upper bound: E understated):
R_p / peak.
Finding when a role's E < 0.7 at the largest T both traces share (the compute-bound steps; decode GEMMs are
bound by weight reads, not FLOPs): info below 0.7, warning below 0.5; its impact (what the verdict ranks) is the
projection time the lost rate costs, Σ time·(1 − E), / the window's step time (analyses/basis.py).

Evidence: per role and T, the shapes at TP=p and TP=1, calls, time, FLOP/s and E; example GEMM ops.

What to do: a narrow shard losing rate means TP=p costs more compute than its 1/p: try a lower p (or p replicas of
TP=1, SHP004) for these shapes, a GEMM backend tuned for skinny shapes, or fuse the narrow GEMMs (fused QKV,
fused gate/up); re-measure T* (COL003) with --tp1-baseline.
"""

from __future__ import annotations

from collections import defaultdict

import orjson

from tracediag.analyses import gpu
from tracediag.analyses.basis import window_time
from tracediag.context import Baseline, Context
from tracediag.errors import TracediagError
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model.gemm_roles import expected_roles
from tracediag.store import query_dicts

RULE = RuleMeta(
    id="KRN007",
    step=5,
    title="Narrow shards: FLOP rate of the sharded projection GEMMs at TP=p vs TP=1",
    requires_tables=("gemm_shapes",),
    requires_model=("H", "I", "h", "H_kv", "D"),
    requires_tp=True,
    may_be_downstream_of=("SHP001", "SHP002"),
    enabled_by=("--tp1-baseline", "--peak-tflops"),
)
INFO_BELOW, WARNING_BELOW = 0.7, 0.5
_NO_REFERENCE = "missing a reference FLOP rate: pass --tp1-baseline (a TP=1 trace of the same model) or --peak-tflops"


def _shape(r: dict, roles: dict[tuple[int, int], str]) -> tuple[str, int, int, int, int] | None:
    """(role, T, K, N, time) of a GEMM op row; None when it is not a projection of the model or took no time."""
    try:
        act, w = orjson.loads(r["act_dims"] or "null"), orjson.loads(r["w_dims"] or "null")
    except orjson.JSONDecodeError:
        return None
    if not act or not w or len(w) != 2 or len(act) < 2:
        return None
    k, n = (act[-1], w[0]) if r["name"] == "aten::linear" else (act[-1], w[-1])
    role = roles.get((k, n))
    t = 1
    for d in act[:-1]:
        t *= d
    ns = r["gpu_ns"] if r["gpu_ns"] is not None else r["dur_ns"]
    if role is None or not ns:
        return None
    return role, t, k, n, ns


def _rates(rows: list[dict], roles: dict[tuple[int, int], str]) -> dict[tuple[str, int], dict]:
    """(role, T) -> calls, FLOPs, time, shape, an example op."""
    out: dict[tuple[str, int], dict] = {}
    for r in rows:
        shape = _shape(r, roles)
        if shape is None:
            continue
        role, t, k, n, ns = shape
        d = out.setdefault(
            (role, t), {"calls": 0, "flops": 0.0, "ns": 0, "K": k, "N": n, "example": r, "basis": r["basis"]}
        )
        d["calls"] += 1
        d["flops"] += 2.0 * t * k * n
        d["ns"] += ns
    return out


def _any_projection(ctx: Context, roles: dict[tuple[int, int], str]) -> bool:
    """Whether _rates would find a projection GEMM, reading the GEMM ops only until the first one."""
    cur = ctx.con.execute(_GEMMS_SQL)
    cols = [d[0] for d in cur.description]
    while batch := cur.fetchmany(1000):
        if any(_shape(dict(zip(cols, r)), roles) is not None for r in batch):
            return True
    return False


_GEMMS_SQL = (
    "SELECT rank, step_id, name, ts_ns, act_dims, w_dims, dur_ns, gpu_ns, "
    "CASE WHEN gpu_ns IS NOT NULL THEN 'GPU kernel time' ELSE 'host time of the op' END AS basis "
    "FROM gemm_shapes ORDER BY rank, ts_ns"
)


def _gemms(rows_fn) -> list[dict]:
    return rows_fn(_GEMMS_SQL, None)


def _roles(m, p: int) -> dict[tuple[int, int], str]:
    return {kn: role for role, kn in expected_roles(m, p).items() if not role.startswith("lm_head")}


def _baseline(baseline: Baseline, m) -> tuple[dict | None, str]:
    path = baseline.path
    try:
        con = baseline.store()
    except TracediagError as exc:
        return None, f"the TP=1 baseline could not be read ({exc})"
    world = con.execute("SELECT max(world_size), count(DISTINCT rank) FROM inputs").fetchone()
    if (world[0] or 1) > 1 or world[1] > 1:
        return None, f"the baseline {path} is not a TP=1 trace (world size {world[0]}, {world[1]} rank files)"
    rates = _rates(_gemms(lambda q, a: query_dicts(con, q, a)), _roles(m, 1))
    if not rates:
        return None, f"the baseline {path} has no projection GEMM of this model's shapes at TP=1"
    return rates, f"TP=1 baseline {path}"


def _efficiency_rows(
    here: dict[tuple[str, int], dict], base: dict | None, peak: float | None
) -> tuple[list[dict], dict[str, list[dict]]]:
    """Per (projection role, T): the FLOP rate at TP=p and its efficiency E against the TP=1 rate of the same role
    and T (a (role, T) the baseline lacks is left out), else against the peak; with the rows by role, each with
    its example call."""
    table = []
    by_role: dict[str, list[dict]] = defaultdict(list)
    for (role, t), d in sorted(here.items()):
        rate = d["flops"] / (d["ns"] / 1e9)
        row = {
            "role": role,
            "T": t,
            "K": d["K"],
            "N": d["N"],
            "calls": d["calls"],
            "time_ns": d["ns"],
            "tflops": round(rate / 1e12, 6),
            "time_basis": d["basis"],
        }
        if base is not None:
            b = base.get((role, t))
            if b is None:
                continue
            r1 = b["flops"] / (b["ns"] / 1e9)
            row |= {"K_tp1": b["K"], "N_tp1": b["N"], "tflops_tp1": round(r1 / 1e12, 6), "efficiency": rate / r1}
        else:
            row["efficiency"] = rate / peak
        table.append(row)
        by_role[role].append(row | {"example": d["example"]})
    return table, by_role


def _shard_evidence(by_role: dict[str, list[dict]]) -> list[dict]:
    """Per role its example call at the largest T, least efficient first."""
    return [
        {
            "rank": r["example"]["rank"],
            "step": r["example"]["step_id"],
            "ts_ns": r["example"]["ts_ns"],
            "name": r["example"]["name"],
            "role": r["role"],
            "shape": f"[{r['T']}, {r['K']}] x [{r['K']}, {r['N']}]",
            "efficiency": round(r["efficiency"], 4),
        }
        for r in sorted((rows[-1] for rows in by_role.values()), key=lambda r: r["efficiency"])
    ]


def _reference_words(ctx: Context, base: dict | None, base_source: str | None, peak: float | None) -> str:
    """What E is measured against: the TP=1 baseline, --peak-tflops, or the GPU catalogue's datasheet peak."""
    if base is not None:
        return f"TP=1 ({base_source})"
    if ctx.settings.peak_tflops:
        return f"peak {ctx.settings.peak_tflops:g} TFLOP/s"
    return f"datasheet peak {peak / 1e12:g} TFLOP/s of the {gpu.for_trace(ctx).name} (GPU catalogue)"


def check(ctx: Context) -> Check:
    m, p = ctx.model, ctx.tp.p
    if p == 1:
        return not_applicable(RULE, f"p = 1 ({ctx.tp.source}): no sharded projections")
    roles = _roles(m, p)
    missing_gemms = f"missing projection GEMMs of this model's shapes at TP={p} in the trace"
    peak_ref, peak_source = gpu.peak_flops(ctx)
    if not ctx.settings.tp1_baseline and peak_ref is None:
        # no reference rate: the answer is "not applicable" either way; which reason needs one projection GEMM
        no_ref = _NO_REFERENCE
        if "catalogue" in peak_source:  # a GPU is named that the catalogue lacks (or lacks the type's peak of)
            no_ref = _NO_REFERENCE.replace("rate: ", f"rate: {peak_source}; ", 1)
        return not_applicable(RULE, no_ref if _any_projection(ctx, roles) else missing_gemms)
    here = _rates(_gemms(ctx.rows), roles)
    if not here:
        return not_applicable(RULE, missing_gemms)
    base, base_source, peak = None, None, None
    if ctx.settings.tp1_baseline:
        base, base_source = _baseline(ctx.baseline, m)
    if base is None and peak_ref is not None:
        peak = peak_ref
    if base is None and peak is None:
        why = f"{base_source}; " if base_source else ""
        return not_applicable(RULE, _NO_REFERENCE.replace("rate: ", f"rate: {why}", 1))
    table, by_role = _efficiency_rows(here, base, peak)
    if not table:
        return not_applicable(RULE, f"missing common (role, T) between the trace and the {base_source}")
    judged = [max(rows, key=lambda r: r["T"]) for rows in by_role.values()]
    worst = min(judged, key=lambda r: r["efficiency"])
    reference = _reference_words(ctx, base, base_source, peak)
    values = {
        "p": p,
        "reference": reference,
        "efficiency_at_largest_T": {r["role"]: round(r["efficiency"], 4) for r in judged},
        "worst_role": worst["role"],
        "worst_efficiency": round(worst["efficiency"], 4),
        "worst_T": worst["T"],
        "thresholds": {"info": INFO_BELOW, "warning": WARNING_BELOW},
    }
    if base is None and not ctx.settings.peak_tflops:
        values["reference_source"] = peak_source
    formula = "E = R_p / R_1, R = Σ 2·T·K·N / Σ time per projection role and T (ideal sharding: E = 1)"
    ref_rate = worst.get("tflops_tp1")
    substituted = (
        f"{worst['role']} at T = {worst['T']}: [{worst['T']}×{worst['K']}]×[{worst['K']}×{worst['N']}] at TP={p} runs "
        f"{worst['tflops']:.4g} TFLOP/s vs "
        + (f"{ref_rate:.4g} TFLOP/s at TP=1 ([{worst['K_tp1']}×{worst['N_tp1']}])" if ref_rate else reference)
        + f" → E = {worst['efficiency']:.3f}"
    )
    evidence = _shard_evidence(by_role)[: ctx.settings.max_evidence]
    table = [{k: v for k, v in r.items()} for r in table]
    common = {"formula": formula, "substituted": substituted, "values": values, "table": table, "evidence": evidence}
    if base is None:
        # against a nominal peak, a low rate says nothing about the shard width alone
        return passed(
            RULE,
            **common,
            confidence="low",
            title=(
                f"Projection GEMMs at TP={p} reach {worst['efficiency']:.0%}–"
                f"{max(r['efficiency'] for r in judged):.0%} of the {reference} at the largest T; no TP=1 trace to "
                "tell what the narrow shards lose (--tp1-baseline)"
            ),
        )
    if worst["efficiency"] >= INFO_BELOW:
        return passed(
            RULE,
            **common,
            confidence="high",
            title=(
                f"Sharded projections keep their FLOP rate at TP={p}: lowest E = {worst['efficiency']:.2f} "
                f"({worst['role']}, T = {worst['T']})"
            ),
        )
    # ranked on the window's time like every trace-side finding: the projection time the lost rate costs,
    # Σ time·(1 − E) over the (role, T) rows below their reference rate; E of the worst role judges it
    wt = window_time(ctx)
    lost = sum(r["time_ns"] * (1 - r["efficiency"]) for r in table if r["efficiency"] < 1)
    common["values"] = values | {"projection_ns_lost": round(lost)} | wt.values(lost)
    common["substituted"] = f"{substituted}; impact (Σ time·(1 − E)) {wt.text(lost)}"
    return finding(
        RULE,
        **common,
        severity="warning" if worst["efficiency"] < WARNING_BELOW else "info",
        confidence="medium",
        impact=wt.share(lost),
        impact_basis=wt.basis,
        title=(
            f"Narrow shards lose FLOP rate at TP={p}: {worst['role']} ([{worst['K']}×{worst['N']}] per rank) runs at "
            f"E = {worst['efficiency']:.2f} of its TP=1 rate at T = {worst['T']} — TP={p} buys less than 1/p of the "
            "projection time, so T* (COL003) is optimistic"
        ),
        next_check=(
            "Compare a lower p or p replicas of TP=1 (SHP004) for these shapes; fused QKV / gate-up GEMMs or a "
            "backend tuned for skinny GEMMs; re-measure the break-even with --tp1-baseline (COL003)."
        ),
    )
