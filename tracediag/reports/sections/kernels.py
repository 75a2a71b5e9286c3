"""What ran in each phase: family and kernel tables (calls, time, share of the phase's step time)."""

from __future__ import annotations

from tracediag.analyses.kernels import SOURCE_LABEL, phase_name, phase_order, source_of, unphased_name
from tracediag.catalog import family_label
from tracediag.reports.sections import Section

TOP_KERNELS = 15  # kernel rows per phase; the rest are summed into one row


def build(ctx) -> Section | None:
    if not ctx.scalar("SELECT count(*) FROM kernel_steps"):
        return None
    unphased = unphased_name(ctx)
    phase_ns = {
        phase_name(r["phase"], unphased): r["t"]
        for r in ctx.rows("SELECT phase, sum(step_ns) AS t FROM step_activity GROUP BY 1")
    }
    fams = ctx.rows(
        """SELECT phase, klass, family, sum(calls) AS calls, sum(time_ns) AS time_ns, sum(graph_calls) AS graph_calls
           FROM kernel_steps WHERE step_id IS NOT NULL GROUP BY ALL ORDER BY phase, klass, family"""
    )
    names = ctx.rows(
        """SELECT phase, klass, family, name, sum(calls) AS calls, sum(time_ns) AS time_ns,
                  count(DISTINCT (rank, step_id)) AS steps
           FROM kernel_steps WHERE step_id IS NOT NULL GROUP BY ALL ORDER BY phase, klass, family, name"""
    )
    family_rows = [
        {
            "phase": phase_name(r["phase"], unphased),
            "class": r["klass"],
            "family": family_label(r["family"]) if r["family"] else "unclassified",
            "calls": r["calls"],
            "time_ns": r["time_ns"],
            "share_of_step_time": _share(r["time_ns"], phase_ns.get(phase_name(r["phase"], unphased))),
            "graph_calls": r["graph_calls"],
        }
        for r in sorted(fams, key=lambda r: (phase_order(r["phase"]), -r["time_ns"]))
    ]
    kernel_rows = []
    for ph in sorted({r["phase"] for r in names}, key=phase_order):
        rows = sorted((r for r in names if r["phase"] == ph), key=lambda r: -r["time_ns"])
        for r in rows[:TOP_KERNELS]:
            kernel_rows.append(
                {
                    "phase": phase_name(ph, unphased),
                    "family": family_label(r["family"]) if r["family"] else f"unclassified ({r['klass']})",
                    "kernel": r["name"],
                    "calls": r["calls"],
                    "time_ns": r["time_ns"],
                    "share_of_step_time": _share(r["time_ns"], phase_ns.get(phase_name(ph, unphased))),
                    "steps": r["steps"],
                }
            )
        rest = rows[TOP_KERNELS:]
        if rest:
            kernel_rows.append(
                {
                    "phase": phase_name(ph, unphased),
                    "family": "…",
                    "kernel": f"{len(rest)} other names",
                    "calls": sum(r["calls"] for r in rest),
                    "time_ns": sum(r["time_ns"] for r in rest),
                    "share_of_step_time": _share(
                        sum(r["time_ns"] for r in rest), phase_ns.get(phase_name(ph, unphased))
                    ),
                    "steps": None,
                }
            )
    outside = ctx.rows(
        """SELECT sum(calls) AS calls, sum(time_ns) AS t,
                  coalesce(sum(calls) FILTER (WHERE klass IN ('memcpy', 'memset')), 0) AS copies
           FROM kernel_steps WHERE step_id IS NULL"""
    )[0]
    source = source_of(ctx)
    if source == "gpu_kernel":
        notes = [
            f"Time: {SOURCE_LABEL[source]}. Share = time / the phase's summed step time (GPU span of the kernels "
            "each step launched); kernels on concurrent streams add up.",
            "Kernels replayed from CUDA/HIP graphs count in the step that launched the graph (graph_calls).",
        ]
    else:
        notes = [
            f"Time: {SOURCE_LABEL[source]}. Share = time / the phase's summed step time (host duration of the "
            "steps); outermost classified ops only (aten::linear, not the aten::mm inside it).",
        ]
    if outside["calls"]:
        what = "ops" if source == "cpu_op" else "kernels"
        copies = f" and {outside['copies']} copies/memsets" if outside["copies"] else ""
        notes.append(
            f"{outside['calls'] - outside['copies']} {what}{copies} ({outside['t'] / 1e6:.3g} ms) ran outside every "
            "step, or their launch is not in the trace (work queued before the profiler started); left out above."
        )
    return Section(
        id="kernels",
        step=5,
        title="Kernels per phase",
        tables={"families per phase": family_rows, "kernels per phase": kernel_rows},
        notes=tuple(notes),
        queries={
            "kernels per phase": "SELECT phase, klass, family, name, sum(calls) AS calls, sum(time_ns) AS time_ns, "
            "count(DISTINCT (rank, step_id)) AS steps FROM kernel_steps WHERE step_id IS NOT NULL "
            "GROUP BY ALL ORDER BY phase, time_ns DESC",
        },
    )


def _share(t: float | None, total: float | None) -> float | None:
    return round(t / total, 4) if t is not None and total else None
