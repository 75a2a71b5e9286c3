"""Which attention ran in each phase (KRN001 judges it): per phase, the attention time by catalog family, the fused
and the fallback time (bmm + softmax, `_scaled_dot_product_attention_math`) and the fallback's share of the phase's
attention; the phases that ran no catalogued attention; the recorded inputs of the attention op and the device, as
facts for why a phase fell back. Kernel time on GPU traces, outermost CPU op time on CPU-only ones."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import orjson

from tracediag.analyses.kernels import (
    ATTENTION_KLASSES,
    dispatch_rows,
    phase_name,
    phase_order,
    source_of,
    unphased_name,
)
from tracediag.context import Context


@dataclass
class AttentionDispatch:
    """The attention of one trace. `rows`: dispatch_rows of the attention classes (inside steps); `phases`: per
    phase (in phase order), its families {label: {calls, time_ns}}, fused_ns, fallback_ns and fallback_share;
    `table`: one row per phase and kernel (or op) name; `phase_time`: the step time of each phase."""

    source: str
    unphased: str
    rows: list[dict[str, Any]]
    phases: dict[str, dict[str, Any]]
    table: list[dict[str, Any]]
    phase_time: dict[str, int]

    @property
    def phases_without_attention(self) -> list[str]:
        """Phases with steps but no catalogued attention (the unphased steps are not a phase that should have any)."""
        return sorted(set(self.phase_time) - set(self.phases) - {self.unphased})


def attention_dispatch(ctx: Context) -> AttentionDispatch | None:
    """The attention per phase, or None when no attention kernel or op of a catalogued family ran inside a step."""
    rows = dispatch_rows(ctx, ATTENTION_KLASSES)
    if not rows:
        return None
    unphased = unphased_name(ctx)
    phases, table = _by_phase(rows, unphased)
    return AttentionDispatch(source_of(ctx), unphased, rows, phases, table, _phase_step_time(ctx, unphased))


def _phase_step_time(ctx: Context, unphased: str) -> dict[str, int]:
    return {
        phase_name(r["phase"], unphased): r["t"]
        for r in ctx.rows("SELECT phase, sum(step_ns) AS t FROM step_activity GROUP BY phase")
    }


def _by_phase(rows: list[dict[str, Any]], unphased: str) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Per phase: families, fused and fallback time, fallback share; and the table of its kernels, largest first."""
    by_phase: dict[str, dict] = defaultdict(lambda: {"fused_ns": 0, "fallback_ns": 0, "rows": []})
    for r in sorted(rows, key=lambda r: (phase_order(r["phase"]), -r["time_ns"])):
        p = by_phase[phase_name(r["phase"], unphased)]
        p["fallback_ns" if r["klass"] == "attention_fallback" else "fused_ns"] += r["time_ns"]
        p["rows"].append(r)
    phases, table = {}, []
    for ph, p in by_phase.items():
        total = p["fused_ns"] + p["fallback_ns"]
        fams = defaultdict(lambda: [0, 0])
        for r in p["rows"]:
            fams[r["family_label"]][0] += r["calls"]
            fams[r["family_label"]][1] += r["time_ns"]
            table.append(_table_row(ph, r, total))
        phases[ph] = {
            "families": {k: {"calls": v[0], "time_ns": v[1]} for k, v in fams.items()},
            "fused_ns": p["fused_ns"],
            "fallback_ns": p["fallback_ns"],
            "fallback_share": p["fallback_ns"] / total if total else 0.0,
        }
    return phases, table


def _table_row(ph: str, r: dict[str, Any], phase_attention_ns: int) -> dict[str, Any]:
    return {
        "phase": ph,
        "klass": r["klass"],
        "family": r["family"],
        "family_label": r["family_label"],
        "name": r["name"],
        "calls": r["calls"],
        "time_ns": r["time_ns"],
        "share_of_phase_attention": r["time_ns"] / phase_attention_ns if phase_attention_ns else None,
        "steps": r["steps"],
        "graph_calls": r["graph_calls"],
    }


def attention_inputs(ctx: Context) -> dict[str, dict]:
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


def compute_capability(ctx: Context) -> Any:
    return ctx.scalar(
        "SELECT any_value(device_compute_capability) FROM inputs WHERE device_compute_capability IS NOT NULL"
    )


def device_name(ctx: Context) -> str | None:
    return ctx.scalar("SELECT any_value(device_name) FROM inputs WHERE device_name IS NOT NULL")


def attention_calls_outside_steps(ctx: Context) -> int:
    """Attention calls no step contains (they are not in the per-phase account)."""
    return ctx.scalar(
        "SELECT coalesce(sum(calls), 0) FROM kernel_steps WHERE step_id IS NULL AND klass IN (?, ?)",
        list(ATTENTION_KLASSES),
    )
