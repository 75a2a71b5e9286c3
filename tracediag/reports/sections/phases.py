"""Prefill/decode split: per-phase table, T histogram, step time against T with the fit t = a·T + b."""

from __future__ import annotations

from tracediag.analyses.kernels import PHASES, fit_line, phase_table, step_rows, unphased_name
from tracediag.reports import svg, units
from tracediag.reports.sections import Section

PHASE_LABEL = {"prefill": "prefill", "decode": "decode", "mixed": "mixed", None: "unphased"}
MIN_DISTINCT_T = 4  # fewer distinct T than this: the T distribution is said in words, not drawn


def t_histogram(steps: list[dict]) -> dict[str, list[tuple[float, float, int]]]:
    """T per phase on common numeric bins (one bin per T when they are few, else round-width or
    power-of-two bins): {phase: [(low, high, steps)]}."""
    ts = [s["T"] for s in steps if s["T"] is not None]
    edges = [(a, b) for a, b, _ in svg.numeric_bins(ts)]
    out: dict[str, list[tuple[float, float, int]]] = {}
    for ph in [*PHASES, None]:
        vals = [s["T"] for s in steps if s["phase"] == ph and s["T"] is not None]
        if vals:
            out[PHASE_LABEL[ph]] = [
                (a, b, sum(1 for v in vals if a <= v < b or (i == len(edges) - 1 and v == b)))
                for i, (a, b) in enumerate(edges)
            ]
    return out


def _t_words(steps: list[dict]) -> str:
    parts = []
    for ph in [*PHASES, None]:
        vals = sorted({s["T"] for s in steps if s["phase"] == ph and s["T"] is not None})
        n = sum(1 for s in steps if s["phase"] == ph and s["T"] is not None)
        if vals:
            parts.append(f"{PHASE_LABEL[ph]} T = {' or '.join(str(v) for v in vals)} ({n} rank-step{'s' * (n != 1)})")
    return "Tokens per step: " + "; ".join(parts) + "."


def build(ctx) -> Section | None:
    steps = step_rows(ctx)
    if not steps:
        return None
    table = phase_table(steps, unphased_name(ctx))
    svgs = []
    notes = [f"Step time: {steps[0]['time_basis']}."]
    if len({s["T"] for s in steps if s["T"] is not None}) >= MIN_DISTINCT_T:
        svgs.append(svg.histogram("T per step, by phase", "T (tokens in the step)", t_histogram(steps), "steps"))
    elif any(s["T"] is not None for s in steps):
        notes.append(_t_words(steps))
    pts = [(s["T"], s["step_ns"] / 1e6) for s in steps if s["T"] is not None and s["step_ns"] is not None]
    fit = fit_line([(t, ms * 1e6) for t, ms in pts])
    if fit:
        a, b = fit["a_ns_per_token"], fit["b_ns"]
        line = (
            f"{units.duration(a)}/token · T + {units.duration(b)}"
            if a >= 0
            else f"{units.duration(b)} − {units.duration(-a)}/token · T (step time falls as T grows)"
        )
        fit_text = f"Fit over {fit['n']} steps ({fit['distinct_T']} distinct T)"
        notes.append(f"{fit_text}: t_step = {line}, R² = {fit['r2']:.3f}.")
    else:
        notes.append("No fit of t_step = a·T + b: it needs ≥ 3 steps with T and ≥ 2 distinct T.")
    if pts and len({t for t, _ in pts}) < 2:
        notes.append(
            f"{len(pts)} step{'s' * (len(pts) != 1)} of one size (T = {pts[0][0]}): no chart of step time against T."
        )
    elif pts:
        series = {
            PHASE_LABEL[ph]: [
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
    return Section(
        id="phases",
        step=6,
        # a training job's or an encoder's steps have no prefill or decode to split
        title="Prefill / decode split" if any(s["phase"] for s in steps) else "Steps: tokens and step time",
        tables={"phases": table},
        notes=tuple(notes),
        svgs=tuple(x for x in svgs if x),
    )
