"""Per-op efficiency of two runs: each CPU op's kernel time as a % of its own GPU's roofline (table `op_roofline`,
tracediag/derive/op_roofline.sql), per op and phase, side by side.

A time says nothing across GPUs; a % of the GPU's own roofline does: it is the share of the kernel time that a
kernel at the GPU's datasheet roofs would need. So this section is shown for runs on different GPUs, while the rest
of the diff refuses them (diff.comparability: `efficiency_comparable`). Rows whose mean kernel time per call is
under 5 µs are bounded by launch latency, not by the roofline, and are left out of the % (their time is counted
apart). The datasheet peaks are upper bounds: both sides are understated, neither more than the other's GPU does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tracediag.runs import RunData
from tracediag.store.readback import open_read_back

EFFICIENCY_POINTS = 10.0  # a change of more than 10 points of roofline is a headline
EFFICIENCY_MIN_SHARE = 0.01  # ops under 1 % of the costed kernel time on both sides are not headlined
BASIS = (
    "% of each GPU's own roofline: 100 · roofline time / kernel time, against datasheet peaks (upper bounds: both "
    "sides understated); ops under 5 µs per call are launch-bound and left out"
)

# Per op and phase, summed over ranks, shapes and dtypes: the kernel time with a roofline (not launch-bound), the
# roofline time of those calls, the launch-bound time, the costed shapes, and why a row has no roofline.
_EFFICIENCY_SQL = """
SELECT op, coalesce(phase, 'unphased') AS phase,
    string_agg(DISTINCT gpu, ', ' ORDER BY gpu) AS gpu,
    sum(calls) AS calls, sum(kernel_ns) AS kernel_ns,
    sum(kernel_ns) FILTER (WHERE roofline_ns IS NOT NULL AND NOT launch_bound) AS costed_ns,
    sum(roofline_ns) FILTER (WHERE roofline_ns IS NOT NULL AND NOT launch_bound) AS roofline_ns,
    sum(kernel_ns) FILTER (WHERE launch_bound) AS launch_bound_ns,
    list(DISTINCT coalesce(shape, '') || ' ' || coalesce(dtype, ''))
        FILTER (WHERE roofline_ns IS NOT NULL AND NOT launch_bound) AS shapes,
    mode(coalesce(note, peak_source)) FILTER (WHERE roofline_ns IS NULL) AS why_none
FROM op_roofline GROUP BY ALL ORDER BY kernel_ns DESC
"""


def _rows(db: Path) -> list[dict[str, Any]] | str:
    """The side's rows, or why it has none."""
    con = open_read_back(db)  # data, not code: a diff input may come from anywhere
    try:
        known = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = 'op_roofline'")
        if not known.fetchone()[0]:
            return "its store has no op_roofline table (written by an older tracediag: rerun analyze)"
        cur = con.execute(_EFFICIENCY_SQL)
        cols = [c[0] for c in cur.description]
        return [dict(zip(cols, r)) for r in cur.fetchall()]
    finally:
        con.close()


def side_efficiency(run: RunData) -> dict[str, Any]:
    """{gpu, kernel_ns, costed_ns, roofline_ns, pct, rows: {op|phase: row}, why}: `why` says what is missing when
    the side has no op with a roofline."""
    out: dict[str, Any] = {"gpu": None, "kernel_ns": None, "costed_ns": None, "roofline_ns": None, "pct": None,
                           "rows": {}, "why": None}  # fmt: skip
    if run.db_path is None or not Path(run.db_path).is_file():
        out["why"] = "missing op_roofline: no trace.duckdb beside its findings.json (give the output folder or traces)"
        return out
    rows = _rows(Path(run.db_path))
    if isinstance(rows, str):
        out["why"] = f"missing op_roofline: {rows}"
        return out
    if not rows:
        out["why"] = "missing op_roofline rows: no GPU kernel was linked to a CPU op (a CPU trace, or no External ids)"
        return out
    gpus = sorted({g for r in rows for g in (r["gpu"] or "").split(", ") if g})
    costed = sum(r["costed_ns"] or 0 for r in rows)
    roof = sum(r["roofline_ns"] or 0 for r in rows)
    out |= {
        "gpu": gpus or None,
        "kernel_ns": sum(r["kernel_ns"] or 0 for r in rows),
        "costed_ns": costed,
        "roofline_ns": roof,
        "pct": 100 * roof / costed if costed else None,
        "rows": {f"{r['op']}|{r['phase']}": r for r in rows},
    }
    if not costed:
        reasons = [r["why_none"] for r in rows if r["why_none"]]
        top = max(set(reasons), key=reasons.count) if reasons else "every linked op is launch-bound"
        out["why"] = f"no op has a roofline: {top}"
    return out


def _pct(r: dict[str, Any] | None) -> float | None:
    if not r or not r.get("costed_ns"):
        return None
    return 100 * r["roofline_ns"] / r["costed_ns"]


def _row(key: str, x: dict[str, Any] | None, y: dict[str, Any] | None, costed: tuple[float, float]):
    m = x or y
    pb, pa = _pct(x), _pct(y)
    sb, sa = set((x or {}).get("shapes") or []), set((y or {}).get("shapes") or [])
    return {
        "op": m["op"],
        "phase": m["phase"],
        "before_kernel_ns": x and x["kernel_ns"],
        "after_kernel_ns": y and y["kernel_ns"],
        "before_costed_ns": x and x["costed_ns"],
        "after_costed_ns": y and y["costed_ns"],
        "before_roofline_ns": x and x["roofline_ns"],
        "after_roofline_ns": y and y["roofline_ns"],
        "before_pct": pb,
        "after_pct": pa,
        "change_points": pa - pb if pb is not None and pa is not None else None,
        "before_share": x["costed_ns"] / costed[0] if x and x["costed_ns"] and costed[0] else None,
        "after_share": y["costed_ns"] / costed[1] if y and y["costed_ns"] and costed[1] else None,
        "before_shapes": len(sb),
        "after_shapes": len(sa),
        "common_shapes": len(sb & sa),
        "before_launch_bound_ns": x and x["launch_bound_ns"],
        "after_launch_bound_ns": y and y["launch_bound_ns"],
        "why_none": None if pb is not None and pa is not None else _why_none(x, y),
    }


def _why_none(x: dict[str, Any] | None, y: dict[str, Any] | None) -> str:
    why = []
    for side, r in (("BEFORE", x), ("AFTER", y)):
        if r is None:
            why.append(f"not run on {side}")
        elif not r.get("costed_ns"):
            why.append(f"{side}: " + (r["why_none"] or "launch-bound (under 5 µs per call)"))
    return "; ".join(why)


def _headline(r: dict[str, Any], gpus: str) -> str | None:
    if r["change_points"] is None or abs(r["change_points"]) < EFFICIENCY_POINTS:
        return None
    if max(r["before_share"] or 0, r["after_share"] or 0) < EFFICIENCY_MIN_SHARE:
        return None
    if r["common_shapes"] == r["before_shapes"] == r["after_shapes"]:
        shapes = f"the same {r['common_shapes']} shape(s)"
    else:
        shapes = (
            f"{r['before_shapes']} → {r['after_shapes']} shape(s), {r['common_shapes']} in common: other shapes "
            "reach other fractions of the roofline"
        )
    return (
        f"{r['op']} ({r['phase']}) efficiency: {r['before_pct']:.1f}% → {r['after_pct']:.1f}% of roofline "
        f"({r['change_points']:+.1f} points){gpus}; {shapes}"
    )


def efficiency_diff(before: RunData, after: RunData, comp: dict[str, Any], force: bool = False) -> dict[str, Any]:
    """The per-op efficiency section of diff.json: {comparable, verdict, basis, before, after, rows, headlines,
    note}. Rows only where `comp` says efficiency can be compared (or `force`) and both sides have a roofline."""
    b, a = side_efficiency(before), side_efficiency(after)
    sides = {k: {f: s[f] for f in ("gpu", "kernel_ns", "costed_ns", "roofline_ns", "pct", "why")}
             for k, s in (("before", b), ("after", a))}  # fmt: skip
    out = {"comparable": comp["efficiency_comparable"], "verdict": comp["efficiency_verdict"], "basis": BASIS,
           **sides, "rows": [], "headlines": [], "note": None}  # fmt: skip
    missing = [f"{side.upper()}: {s['why']}" for side, s in sides.items() if s["why"]]
    if len(missing) == 2 and sides["before"]["why"] == sides["after"]["why"]:
        missing = [f"both runs: {sides['before']['why']}"]
    if missing:
        out["note"] = "per-op efficiency not applicable: " + "; ".join(missing)
        return out
    if not comp["efficiency_comparable"] and not force:
        out["note"] = f"per-op efficiency {comp['efficiency_verdict']}: not compared (--force-compare compares it)"
        return out
    costed = (b["costed_ns"], a["costed_ns"])
    keys = sorted(set(b["rows"]) | set(a["rows"]),
                  key=lambda k: -max((b["rows"].get(k) or {}).get("kernel_ns") or 0,
                                     (a["rows"].get(k) or {}).get("kernel_ns") or 0))  # fmt: skip
    rows = [_row(k, b["rows"].get(k), a["rows"].get(k), costed) for k in keys]
    out["rows"] = sorted(rows, key=lambda r: r["change_points"] is None)  # compared first, each part by time
    gpus = "" if b["gpu"] == a["gpu"] else f" on {', '.join(b['gpu'])} → {', '.join(a['gpu'])}"
    whole = a["pct"] - b["pct"]
    head = []
    if gpus or abs(whole) >= EFFICIENCY_POINTS:  # across GPUs the whole is the first thing to read
        head.append(
            f"per-op efficiency, all ops with a roofline: {b['pct']:.1f}% → {a['pct']:.1f}% of roofline "
            f"({whole:+.1f} points){gpus}"
        )
    out["headlines"] = head + [h for h in (_headline(r, gpus) for r in out["rows"]) if h]
    return out
