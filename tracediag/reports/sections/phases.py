"""Prefill/decode split: per-phase table, T histogram, step time against T with the fit t = a·T + b."""

from __future__ import annotations

from tracediag.reports import svg
from tracediag.reports.sections import Section
from tracediag.rules._kernels import PHASES, fit_line, phase_name, phase_table, prepare, step_rows


def _bucket(t: int) -> tuple[int, str]:
    """Power-of-two bucket of T: (lower bound, label)."""
    if t <= 0:
        return 0, "0"
    lo = 1 << (int(t).bit_length() - 1)
    hi = 2 * lo - 1
    return lo, str(lo) if lo == hi else f"{lo}–{hi}"


def t_histogram(ts: list[int]) -> list[tuple[str, float]]:
    """Counts per power-of-two bucket of T, empty buckets between the smallest and largest kept."""
    if not ts:
        return []
    counts: dict[int, int] = {}
    for t in ts:
        lo, _ = _bucket(t)
        counts[lo] = counts.get(lo, 0) + 1
    los = sorted(counts)
    out, lo = [], los[0]
    while lo <= los[-1]:
        out.append((_bucket(lo)[1], float(counts.get(lo, 0))))
        lo = lo * 2 if lo else 1
    return out


def build(ctx) -> Section | None:
    prepare(ctx)
    steps = step_rows(ctx)
    if not steps:
        return None
    table = phase_table(steps)
    svgs = []
    for ph in [*PHASES, None]:
        ts = [s["T"] for s in steps if s["phase"] == ph and s["T"] is not None]
        if ts:
            svgs.append(
                svg.histogram(f"T per {phase_name(ph)} step", "T (tokens in the step)", t_histogram(ts), "steps")
            )
    pts = [(s["T"], s["step_ns"] / 1e6) for s in steps if s["T"] is not None and s["step_ns"] is not None]
    fit = fit_line([(t, ms * 1e6) for t, ms in pts])
    notes = [f"Step time: {steps[0]['time_basis']}."]
    if fit:
        a, b = fit["a_ns_per_token"], fit["b_ns"]
        notes.append(
            f"Fit over {fit['n']} steps ({fit['distinct_T']} distinct T): t_step = {a / 1e3:.4g} µs/token · T + "
            f"{b / 1e6:.4g} ms, R² = {fit['r2']:.3f}."
        )
    else:
        notes.append("No fit of t_step = a·T + b: it needs ≥ 3 steps with T and ≥ 2 distinct T.")
    if pts:
        series = {
            phase_name(ph): [
                (s["T"], s["step_ns"] / 1e6)
                for s in steps
                if s["phase"] == ph and s["T"] is not None and s["step_ns"] is not None
            ]
            for ph in [*PHASES, None]
        }
        lines = None
        if fit:
            lo, hi = min(t for t, _ in pts), max(t for t, _ in pts)
            lines = {"fit a·T + b": [(x, (fit["a_ns_per_token"] * x + fit["b_ns"]) / 1e6) for x in (lo, hi)]}
        svgs.append(
            svg.scatter(
                "Step time against T",
                "T (tokens in the step)",
                "step time (ms)",
                {k: v for k, v in series.items() if v},
                lines,
            )
        )
    per_step = ctx.rows(
        """SELECT a.rank, a.step_id, s.name, s.marker_source, a.phase, s.phase_source, a.T, s.t_source, a.step_ns,
                  a.host_dur_ns, a.kernels, a.gpu_idle_ns, a.attention_ns + a.attention_fallback_ns AS attention_ns
           FROM step_activity a JOIN steps s USING (rank, step_id) ORDER BY a.rank, a.step_id"""
    )
    return Section(
        id="phases",
        step=6,
        title="Prefill / decode split",
        tables={"phases": table, "steps": per_step},
        notes=tuple(notes),
        svgs=tuple(x for x in svgs if x),
    )
