"""Key measures of a run, from its store or from findings.json alone: step time per phase and T bucket,
communication and attention share, collectives per step, payload per call, kernel-family time, dispatch.

Shared by `tracediag check --baseline` (regressions) and `tracediag diff` (what changed).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import duckdb

from tracediag.analyses.per_rank import collectives_per_rank, steps_per_rank
from tracediag.context import Context
from tracediag.store.readback import open_read_back

WHOLE_TRACE = "whole trace (no step markers)"  # steps.marker_source of the fallback step (derive/steps.sql)


def t_bucket(T: int | None) -> str:
    """Power-of-two bucket of the step's token count: T=1, T=2, T=3-4, T=5-8, ..., T=33-64."""
    if T is None:
        return "T=?"
    if T <= 2:
        return f"T={T}"
    hi = 1 << (T - 1).bit_length()
    lo = hi // 2 + 1
    return f"T={lo}-{hi}"


def _phase(row: dict[str, Any]) -> str:
    return row.get("phase") or "unphased"


def _section_rows(doc: dict[str, Any], section: str, legacy_key: str) -> list[dict[str, Any]]:
    s = (doc.get("sections") or {}).get(section)
    if isinstance(s, dict) and isinstance(s.get("tables"), dict) and s["tables"]:
        return next(iter(s["tables"].values())) or []
    return doc.get(legacy_key) or []  # README's older top-level layout


def marked_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for s in steps if s.get("dur_ns") and s.get("marker_source") != WHOLE_TRACE]


def step_measures(steps: list[dict[str, Any]], collectives: list[dict[str, Any]]) -> dict[str, Any]:
    """Measures from the steps and collectives tables as findings.json carries them."""
    steps = marked_steps(steps)
    out: dict[str, Any] = {"step_time_ns": {}, "communication_share": {}, "collectives_per_step": {},
                           "phase_step_ns": {}}  # fmt: skip
    groups: dict[tuple[str, str], list[dict]] = {}
    for s in steps:
        groups.setdefault((_phase(s), t_bucket(s.get("T"))), []).append(s)
    for (phase, bucket), rows in sorted(groups.items()):
        durs = sorted(r["dur_ns"] for r in rows)
        out["step_time_ns"][f"{phase},{bucket}"] = {
            "phase": phase,
            "T_bucket": bucket,
            "steps": len(rows),
            "median": statistics.median(durs),
            "mean": statistics.fmean(durs),
            "min": durs[0],
            "max": durs[-1],
        }
    by_phase: dict[str, list[dict]] = {}
    for s in steps:
        by_phase.setdefault(_phase(s), []).append(s)
    for phase, rows in sorted(by_phase.items()):
        total = sum(r["dur_ns"] for r in rows)
        durs = [r["dur_ns"] for r in rows]
        out["phase_step_ns"][phase] = {"steps": len(rows), "median": statistics.median(durs), "mean": total / len(rows)}
        coll = sum(r.get("collective_ns") or 0 for r in rows)
        out["communication_share"][phase] = {"value": coll / total if total else None, "steps": len(rows)}
        for col, op in (("all_reduces", "all_reduce"), ("collectives", "all")):
            counts = [r.get(col) or 0 for r in rows]
            out["collectives_per_step"][f"{phase},{op}"] = {
                "phase": phase,
                "op": op,
                "median": statistics.median(counts),
                "min": min(counts),
                "max": max(counts),
                "steps": len(rows),
            }
    per_op: dict[str, dict[str, Any]] = {}
    per_dtype: dict[str, dict[str, Any]] = {}
    for c in collectives:
        for agg, key in ((per_op, c.get("op") or "unknown"), (per_dtype, f"{c.get('op')},{c.get('dtype') or '?'}")):
            a = agg.setdefault(key, {"calls": 0, "sized_calls": 0, "total_payload_bytes": 0, "dtypes": set()})
            a["calls"] += c.get("calls") or 0
            a["sized_calls"] += c.get("sized_calls") or 0
            a["total_payload_bytes"] += c.get("total_payload_bytes") or 0
            a["dtypes"].add(c.get("dtype") or "?")
    for agg in (per_op, per_dtype):
        for a in agg.values():
            a["mean_bytes"] = a["total_payload_bytes"] / a["sized_calls"] if a["sized_calls"] else None
            a["dtypes"] = sorted(a["dtypes"])
    out["payload_per_call"] = dict(sorted(per_op.items()))
    out["payload_by_dtype"] = dict(sorted(per_dtype.items()))
    return out


DISPATCH_GROUPS = {
    "attention": ("attention", "attention_fallback"),
    "gemm": ("gemm", "wo_gemm"),
    "collective": ("collective",),
}


# Work items (kernels on GPU traces, else the innermost classified CPU op of each class) with the step
# they ran in: kernels by their launching runtime call's host time (else their own), ASOF-joined to
# the last step that started before; outside that step's range -> 'outside steps'.
_KERNEL_WORK = """
WITH rt AS (
    SELECT rank, correlation, min(ts_ns) AS ts_ns FROM runtime WHERE correlation IS NOT NULL GROUP BY ALL
),
w AS (
    SELECT k.rank, k.klass, coalesce(k.family, k.klass) AS family, k.dur_ns, coalesce(rt.ts_ns, k.ts_ns) AS anchor
    FROM kernels k LEFT JOIN rt ON rt.rank = k.rank AND rt.correlation = k.correlation
)"""


_CPU_WORK = """
WITH c AS (
    SELECT rank, tid, klass, coalesce(family, klass) AS family, ts_ns, dur_ns FROM cpu_ops
    WHERE klass IS NOT NULL AND klass NOT IN ('other', 'collective')
),
nxt AS (
    -- Ops on one thread nest properly: an op is the innermost of its class when the next op of that
    -- class (in start order) does not start inside it.
    SELECT *, lead(ts_ns) OVER (PARTITION BY rank, tid, klass ORDER BY ts_ns, dur_ns DESC) AS next_ts FROM c
),
leaf AS (
    SELECT * FROM nxt WHERE next_ts IS NULL OR next_ts >= ts_ns + dur_ns
),
w AS (
    SELECT rank, klass, family, dur_ns, ts_ns AS anchor FROM leaf
    UNION ALL
    -- collectives: the backend's work range (gloo worker) or the call, not the enqueue op
    SELECT rank, 'collective', lower(split_part(coalesce(exec_name, call_name), ':', 1)), dur_ns, anchor_ts_ns
    FROM collectives
)"""


_WORK_BY_STEP = """
, ws AS (
    SELECT w.*, s.step_id, s.phase, s.ts_ns AS s_ts, s.dur_ns AS s_dur
    FROM w ASOF LEFT JOIN steps s ON s.rank = w.rank AND w.anchor >= s.ts_ns
)
SELECT klass, family,
    CASE WHEN step_id IS NULL OR anchor >= s_ts + s_dur THEN 'outside steps' ELSE coalesce(phase, 'unphased') END
        AS phase,
    count(*) AS calls, sum(dur_ns) AS total_ns
FROM ws GROUP BY ALL ORDER BY klass, family, phase
"""


def store_measures(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """Measures that need the store: kernel-family time, dispatch per phase, attention share."""
    gpu = con.execute("SELECT count(*) FROM kernels").fetchone()[0] > 0
    rows = con.execute((_KERNEL_WORK if gpu else _CPU_WORK) + _WORK_BY_STEP).fetchall()
    work = [dict(zip(("klass", "family", "phase", "calls", "total_ns"), r)) for r in rows]
    steps = con.execute(
        "SELECT coalesce(phase, 'unphased') AS phase, count(*), sum(dur_ns), sum(gpu_end_ns - gpu_ts_ns), "
        f"count(*) FILTER (WHERE marker_source <> '{WHOLE_TRACE}') FROM steps GROUP BY ALL"
    ).fetchall()
    n_steps = sum(r[4] for r in steps)  # marked steps only: per step means nothing for a whole-trace "step"
    denom = {r[0]: (r[3] if gpu else r[2]) for r in steps}
    fam: dict[str, dict[str, Any]] = {}
    for w in work:
        f = fam.setdefault(f"{w['klass']}/{w['family']}", {"klass": w["klass"], "family": w["family"], "calls": 0})
        f["calls"] += w["calls"]
        f["total_ns"] = f.get("total_ns", 0) + int(w["total_ns"] or 0)
    all_ns = sum(f["total_ns"] for f in fam.values())
    for f in fam.values():
        f["per_step_ns"] = f["total_ns"] / n_steps if n_steps else None
        f["calls_per_step"] = f["calls"] / n_steps if n_steps else None
        f["mean_ns"] = f["total_ns"] / f["calls"] if f["calls"] else None
        f["share"] = f["total_ns"] / all_ns if all_ns else None
    dispatch: dict[str, dict[str, Any]] = {}
    for group, klasses in DISPATCH_GROUPS.items():
        per_phase: dict[str, dict[str, int]] = {}
        for w in work:
            if w["klass"] in klasses and w["phase"] != "outside steps":
                fams = per_phase.setdefault(w["phase"], {})
                fams[w["family"]] = fams.get(w["family"], 0) + int(w["total_ns"] or 0)
        for phase, fams in sorted(per_phase.items()):
            total = sum(fams.values())
            top = max(sorted(fams), key=lambda k: fams[k])
            dispatch.setdefault(group, {})[phase] = {
                "family": top,
                "share": fams[top] / total if total else None,
                "families_ns": dict(sorted(fams.items(), key=lambda kv: -kv[1])),
            }
    attention: dict[str, Any] = {}
    for phase, d in dispatch.get("attention", {}).items():
        den = denom.get(phase)
        attn = sum(d["families_ns"].values())
        attention[phase] = {"value": attn / den if den else None, "attention_ns": attn, "step_ns": den}
    return {
        "time_basis": "GPU kernels" if gpu else "CPU ops (innermost of each class) and collective work ranges",
        "kernel_family_time": dict(sorted(fam.items(), key=lambda kv: -kv[1]["total_ns"])),
        "dispatch": dispatch,
        "attention_share": attention,
    }


def _steps_and_collectives_from_store(con: duckdb.DuckDBPyConnection) -> tuple[list[dict], list[dict]]:
    # The same rows as findings.json carries (the steps and collectives sections show these tables).
    ctx = Context(con=con, model=None, tp=None)
    return steps_per_rank(ctx), collectives_per_rank(ctx)


def run_measures(doc: dict[str, Any], db_path: Path | None) -> dict[str, Any]:
    """Key measures of a run: from its store when there is one, else from findings.json alone."""
    if db_path is not None and Path(db_path).is_file():
        con = open_read_back(db_path)  # data, not code: a baseline or diff input may come from anywhere
        try:
            steps, colls = _steps_and_collectives_from_store(con)
            m = step_measures(steps, colls) | store_measures(con)
        finally:
            con.close()
        m["source"] = "store"
        return m
    m = step_measures(_section_rows(doc, "steps", "steps"), _section_rows(doc, "collectives", "collectives_by_rank"))
    m["source"] = "findings.json (no trace.duckdb beside it: no kernel-family time, dispatch or attention share)"
    return m


def fmt_measure(v: float | None, unit: str) -> str:
    if v is None:
        return "—"
    if unit == "ns":
        return f"{v / 1e6:.3f} ms" if abs(v) >= 1e5 else f"{v / 1e3:.1f} µs"
    if unit == "share":
        return f"{v * 100:.1f}%"
    if unit == "bytes":
        return f"{v:,.0f} B"
    return f"{v:g}"
