"""How far each op is from what the GPU can do: a roofline chart per phase and the buyable time per op family."""

from __future__ import annotations

from tracediag.analyses.kernels import phase_name, phase_order, unphased_name
from tracediag.analyses.roofline import LAUNCH_BOUND_US, amdahl, buyable, family_row, share
from tracediag.reports import svg
from tracediag.reports.sections import Section

TOP_ROWS = 20  # op rows in the table; the query gives them all


def _tip(r: dict, unphased: str) -> str:
    return (
        f"{r['op']} {r['shape'] or ''} {r['dtype'] or ''} ({phase_name(r['phase'], unphased)}): {r['calls']} calls, "
        f"{r['kernel_ns'] / 1e6:.3g} ms, {r['tflops_s']:.3g} TFLOP/s at {r['intensity']:.3g} FLOP/B, "
        f"{r['pct_of_roofline']:.0f} % of roofline ({r['bound']}-bound)"
        + (f", under {LAUNCH_BOUND_US} µs per call: launch-bound" if r["launch_bound"] else "")
    )


def _charts(rows: list[dict], unphased: str) -> list[str]:
    """One roofline per phase, of the ops with FLOPs (GEMM, attention) that have a roofline."""
    plotted = [r for r in rows if r["flops"] and r["roofline_ns"] is not None and r["intensity"] and r["tflops_s"]]
    charts = []
    for ph in sorted({r["phase"] for r in plotted}, key=lambda p: (phase_order(p), p or "")):
        mine = [r for r in plotted if r["phase"] == ph]
        bw = max(r["peak_tb_s"] for r in mine)
        roofs = {}
        for r in mine:
            roofs.setdefault(f"{r['dtype'].split(',')[0]} dense", r["peak_tflops"])
        points = [
            (r["intensity"], r["tflops_s"], r["kernel_ns"], r["family"], _tip(r, unphased), bool(r["launch_bound"]))
            for r in mine
        ]
        gpu = mine[0]["gpu"]
        charts.append(
            svg.roofline(
                f"Roofline, {phase_name(ph, unphased)}: {gpu} (mark area = kernel time; hollow: launch-bound)",
                points,
                sorted(roofs.items()),
                bw,
            )
        )
    return [c for c in charts if c]


def _roofs_text(rows: list[dict]) -> str:
    peaks = {}
    for r in rows:
        if r["peak_tflops"]:
            peaks.setdefault(f"{(r['dtype'] or '').split(',')[0]} dense {r['peak_tflops']:,.4g} TFLOP/s", None)
    bw = next((r["peak_tb_s"] for r in rows if r["peak_tb_s"]), None)
    return ", ".join([*peaks, *([f"memory {bw:.3g} TB/s"] if bw else [])]) or "none"


def build(ctx) -> Section | None:
    if not ctx.scalar("SELECT count(*) FROM op_roofline WHERE roofline_ns IS NOT NULL"):
        return None
    rows = ctx.rows("SELECT * FROM op_roofline ORDER BY kernel_ns DESC, rank, op, shape, dtype, phase")
    b = buyable(ctx)
    unphased = unphased_name(ctx)
    families = []
    for g in b.groups:
        bound = amdahl(share(g.buyable_ns, b.basis_ns))
        families.append(family_row(g, b, unphased) | {"step_speedup_bound": round(bound, 3) if bound else None})
    ops = [
        {
            "phase": phase_name(r["phase"], unphased),
            "op": r["op"],
            "calls": r["calls"],
            "kernel_ns": r["kernel_ns"],
            "flop_per_byte": round(r["intensity"], 2) if r["intensity"] is not None else None,
            "compute_tflops": round(r["tflops_s"], 2) if r["tflops_s"] is not None else None,
            "memory_gbs": round(r["tb_s"] * 1e3, 1) if r["tb_s"] is not None else None,
            "bound": ("launch" if r["launch_bound"] else r["bound"]) or "—",
            "pct_of_roofline": round(r["pct_of_roofline"], 1) if r["pct_of_roofline"] is not None else None,
            "buyable_ns": round(r["buyable_ns"]) if r["buyable_ns"] is not None else None,
            "shape": f"{r['shape'] or '—'} {r['dtype'] or ''}".strip(),
        }
        for r in rows[:TOP_ROWS]
    ]
    notes = [
        (
            f"Roofs of {b.gpu}: {_roofs_text(rows)}, given by flag where op_roofline.peak_source says so, else "
            "datasheet figures from the GPU catalogue"
            if any("(given" in (r["peak_source"] or "") for r in rows)
            else f"Roofs of {b.gpu}: {_roofs_text(rows)}, datasheet figures from the GPU catalogue"
        )
        + " (op_roofline.peak_source names each document): a datasheet peak is an upper bound no kernel reaches, so "
        "every % of roofline against it is understated and every buyable time an upper bound. 'Buyable at best' is "
        "the time saved if each row of the family ran at the best % of roofline one of its rows reaches in this "
        "trace (a rate this GPU and library reach).",
        "Bound: compute or memory by the op's intensity against the ridge (peak / bandwidth); launch: kernels of under "
        f"{LAUNCH_BOUND_US} µs per call, bounded by launch latency, not by the roofline (not counted as buyable); "
        "the rows without a roofline (no cost model for the op, or no shapes) are in op_roofline with a note.",
        f"Shares are of {b.basis}; the step speed-up bound is Amdahl's, 1 / (1 − share), with every kernel of the "
        "family on the critical path.",
        "The chart places the ops with FLOPs (GEMM, attention); memory-bound ops (normalisation, elementwise, "
        "copies: bytes only) are in the tables.",
    ]
    unlinked = b.total_kernel_ns - b.linked_kernel_ns
    if unlinked > 0:
        notes.append(
            f"{unlinked / 1e6:.3g} ms of {b.total_kernel_ns / 1e6:.3g} ms of kernels are not linked to a CPU op with "
            "shapes (CUDA/HIP graph replays, launches the trace did not record): not in these tables."
        )
    return Section(
        id="roofline",
        step=5,
        title="Speed of light per op",
        tables={"buyable time per op family and phase": families, "ops against the roofline (largest)": ops},
        notes=tuple(notes),
        svgs=tuple(_charts(rows, unphased)),
        queries={
            "ops against the roofline (largest)": "SELECT * FROM op_roofline ORDER BY kernel_ns DESC",
        },
    )
