"""KRN003's measurement: which kernels served each quantized module group, the separate dequantize and
activation-quantize work per phase, and the dense groups' weight bytes its budget (W16 − Wq)/BW is made of.

The budget covers the dense quantized groups only (the experts a step touches are a routing estimate), so Δ, the
dequantize time it is compared with, counts the dense groups' dequantize only: a dequantize launched inside a fused
MoE op (or an op named after the experts) serves the experts and is measured apart, never in Δ.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from tracediag.analyses.kernels import (
    SOURCE_LABEL,
    declared_formats,
    group_dispatch,
    phase_name,
    source_of,
    tp_degree,
    unphased_name,
)
from tracediag.context import Context
from tracediag.model import accounting

# an op whose work is the experts': the fused-MoE op as a whole (catalog family fused_moe_op) or one named so
EXPERT_OP = r"(?i)fused_?moe|\bmoe_forward|\bexperts?\b"

_AUX_SQL = """
SELECT phase, klass, family, name, sum(calls) AS calls, sum(time_ns) AS time_ns,
       count(DISTINCT (rank, step_id)) AS steps, arg_min(rank, first_ts_ns) AS rank,
       arg_min(step_id, first_ts_ns) AS step, min(first_ts_ns) AS ts_ns
FROM kernel_steps WHERE (klass = 'dequant' OR family = 'act_quant') AND step_id IS NOT NULL
GROUP BY ALL ORDER BY time_ns DESC, phase, klass, family, name
"""

# dequantize work inside an experts' op, per step: a kernel by its launching call's thread and time, a CPU op (a
# CPU-only rank) by its own; the step holds the launch (or the op's start), as in kernel_steps
_EXPERT_DEQUANT_SQL = f"""
WITH launch AS (
    SELECT rank, correlation, arg_min(tid, ts_ns) AS tid, min(ts_ns) AS ts_ns FROM runtime
    WHERE correlation > 0 GROUP BY ALL
),
dq AS (
    SELECT k.rank, l.tid, l.ts_ns, k.dur_ns FROM kernels k JOIN launch l USING (rank, correlation)
    WHERE k.klass = 'dequant'
    UNION ALL
    SELECT rank, tid, ts_ns, dur_ns FROM cpu_ops
    WHERE klass = 'dequant' AND rank NOT IN (SELECT DISTINCT rank FROM kernels)
),
moe AS (
    SELECT rank, tid, ts_ns, ts_ns + dur_ns AS end_ns FROM cpu_ops
    WHERE family = 'fused_moe_op' OR regexp_matches(name, '{EXPERT_OP}')
),
inside AS (
    SELECT DISTINCT dq.* FROM dq JOIN moe ON moe.rank = dq.rank AND moe.tid = dq.tid
        AND moe.ts_ns <= dq.ts_ns AND dq.ts_ns < moe.end_ns
)
SELECT s.phase, sum(i.dur_ns) AS time_ns, count(*) AS calls
FROM inside i JOIN steps s ON s.rank = i.rank AND i.ts_ns >= s.ts_ns AND i.ts_ns < s.ts_ns + s.dur_ns
GROUP BY ALL
"""


def expert_dequant(ctx: Context) -> dict[str, dict[str, int]]:
    """Dequantize work that serves the MoE experts, per phase name: {'decode': {'time_ns': …, 'calls': …}}."""
    unphased = unphased_name(ctx)
    return {
        phase_name(r["phase"], unphased): {"time_ns": int(r["time_ns"] or 0), "calls": int(r["calls"])}
        for r in ctx.rows(_EXPERT_DEQUANT_SQL)
    }


@dataclass
class LowBitDispatch:
    """KRN003's numbers (measure)."""

    verdicts: list  # accounting group verdicts (group_dispatch)
    gemms: list[dict]  # GEMM rows with their formats
    p: int
    dq: list[dict]  # dequantize rows (kernel_steps), experts' included
    aq: list[dict]  # activation-quantize rows
    values: dict[str, Any]
    table: list[dict]
    delta: dict[str, float] = field(default_factory=dict)  # dense groups' dequantize time per step, per phase
    dense_dequant_ns: float = 0.0  # ... summed over the steps: Δ's total, what the window pays
    step_ns: dict[str, float] = field(default_factory=dict)  # mean step time per phase

    @property
    def lowbit(self) -> list[dict]:
        return [r for r in self.gemms if r["fmt"].lowbit]


def _mean_step_ns(ctx: Context) -> dict[str, float]:
    """Mean step time per phase name (step_activity: the step's GPU window, or its host span on a CPU trace)."""
    rows = ctx.rows("SELECT phase, avg(step_ns) AS step_ns FROM step_activity WHERE step_ns > 0 GROUP BY phase")
    unphased = unphased_name(ctx)
    return {phase_name(r["phase"], unphased): r["step_ns"] for r in rows}


def measure(ctx: Context) -> LowBitDispatch:
    """Dispatch per quantized group, the dequantize / activation-quantize rows, and Δ per phase (dense groups)."""
    m = ctx.model
    p, p_source = tp_degree(ctx)
    verdicts, gemms, _ = group_dispatch(ctx, p)
    aux = ctx.rows(_AUX_SQL)
    dq = [r for r in aux if r["klass"] == "dequant"]
    aq = [r for r in aux if r["family"] == "act_quant"]
    lowbit = [r for r in gemms if r["fmt"].lowbit]
    unphased = unphased_name(ctx)
    values = {
        "declared": declared_formats(m),
        "time_source": SOURCE_LABEL[source_of(ctx)],
        "p": p,
        "p_source": p_source,
        "lowbit_calls": sum(r["calls"] for r in lowbit),
        "schemes_run": sorted({r["fmt"].scheme for r in lowbit}),
        "dequant_calls": sum(r["calls"] for r in dq),
        "act_quant_calls": sum(r["calls"] for r in aq),
        "act_quant_time_ns": sum(r["time_ns"] for r in aq),
        "groups": [v.row() for v in verdicts],
    }
    table = [v.row() for v in verdicts] + [
        {k: r[k] for k in ("klass", "name", "family", "calls", "time_ns", "steps")}
        | {"phase": phase_name(r["phase"], unphased)}
        for r in aux
    ]
    out = LowBitDispatch(verdicts, gemms, p, dq, aq, values, table)
    if dq:
        _delta(ctx, out)
    return out


def _delta(ctx: Context, out: LowBitDispatch) -> None:
    """Δ per phase: the dense groups' dequantize time per step (the experts' measured apart, never in Δ)."""
    unphased = unphased_name(ctx)
    per_phase: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    for r in out.dq:
        acc = per_phase[phase_name(r["phase"], unphased)]
        acc[0] += r["time_ns"]
        acc[1] = max(acc[1], r["steps"])
    experts = expert_dequant(ctx)
    dense = {ph: max(0.0, t - experts.get(ph, {}).get("time_ns", 0)) for ph, (t, _) in per_phase.items()}
    out.delta = {ph: dense[ph] / n for ph, (_, n) in per_phase.items() if dense[ph] > 0}
    out.dense_dequant_ns = sum(dense.values())
    out.values["delta_ns_per_step"] = out.delta
    if experts:
        out.values["experts_dequant"] = experts
        out.values["experts_dequant_note"] = (
            "dequantize work inside a fused-MoE (experts') op: left out of Δ, as the budget (W16 − Wq)/BW holds the "
            "dense groups only"
        )
    out.step_ns = _mean_step_ns(ctx)
    out.values["step_ns_mean"] = {ph: out.step_ns.get(ph) for ph in out.delta}


def dense_budget_bytes(ctx: Context, d: LowBitDispatch) -> tuple[float, float, list[str], list]:
    """(W16, Wq, the dense groups, their weight rows): the bytes one rank holds of the quantized dense groups at 16
    bits and at their declared format, the budget's terms."""
    m = ctx.model
    dense_groups = [v.group for v in d.verdicts if v.group != "experts"]
    served = accounting.formats(m)
    w16 = sum(
        g.bytes_per_rank
        for g in accounting.weights(m, d.p, {g: accounting.W16 for g in served})
        if g.group in dense_groups
    )
    rows = [g for g in accounting.weights(m, d.p, served) if g.group in dense_groups]
    return w16, sum(g.bytes_per_rank for g in rows), dense_groups, rows
