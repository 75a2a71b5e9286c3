"""Inline SVG charts for report.html: no scripts, no fonts or files fetched; every label XML-escaped.

Small on purpose: scatter/line plots with optional fitted lines, and bar histograms.
"""

from __future__ import annotations

from collections.abc import Sequence
from xml.sax.saxutils import escape

W, H = 640, 300
PAD_L, PAD_R, PAD_T, PAD_B = 70, 20, 30, 45
COLORS = ("#0969da", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#57606a")


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    if hi <= lo:
        return [lo]
    step = (hi - lo) / n
    return [lo + i * step for i in range(n + 1)]


def _fmt(v: float) -> str:
    a = abs(v)
    if a >= 1e6 or (0 < a < 1e-2):
        return f"{v:.2g}"
    return f"{v:,.0f}" if a >= 100 else f"{v:.3g}"


def _frame(title: str, xlabel: str, ylabel: str, x0: float, x1: float, y0: float, y1: float):
    sx = lambda x: PAD_L + (x - x0) / ((x1 - x0) or 1) * (W - PAD_L - PAD_R)  # noqa: E731
    sy = lambda y: H - PAD_B - (y - y0) / ((y1 - y0) or 1) * (H - PAD_T - PAD_B)  # noqa: E731
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" '
        f'role="img" aria-label="{escape(title, {chr(34): "&quot;"})}" font-family="sans-serif" font-size="11">',
        f'<text x="{W / 2}" y="16" text-anchor="middle" font-size="13">{escape(title)}</text>',
        f'<line x1="{PAD_L}" y1="{H - PAD_B}" x2="{W - PAD_R}" y2="{H - PAD_B}" stroke="#57606a"/>',
        f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{H - PAD_B}" stroke="#57606a"/>',
        f'<text x="{(PAD_L + W - PAD_R) / 2}" y="{H - 8}" text-anchor="middle">{escape(xlabel)}</text>',
        f'<text x="14" y="{(PAD_T + H - PAD_B) / 2}" text-anchor="middle" '
        f'transform="rotate(-90 14 {(PAD_T + H - PAD_B) / 2})">{escape(ylabel)}</text>',
    ]
    for t in _ticks(x0, x1):
        parts.append(f'<text x="{sx(t):.1f}" y="{H - PAD_B + 14}" text-anchor="middle">{_fmt(t)}</text>')
    for t in _ticks(y0, y1):
        parts.append(f'<text x="{PAD_L - 4}" y="{sy(t) + 4:.1f}" text-anchor="end">{_fmt(t)}</text>')
        parts.append(f'<line x1="{PAD_L}" y1="{sy(t):.1f}" x2="{W - PAD_R}" y2="{sy(t):.1f}" stroke="#eaeef2"/>')
    return parts, sx, sy


def scatter(
    title: str,
    xlabel: str,
    ylabel: str,
    series: dict[str, Sequence[tuple[float, float]]],
    lines: dict[str, Sequence[tuple[float, float]]] | None = None,
    connect: bool = False,
) -> str:
    """Points per series (optionally joined, e.g. a time series) plus optional lines (e.g. a fit)."""
    pts = [p for s in series.values() for p in s] + [p for s in (lines or {}).values() for p in s]
    if not pts:
        return ""
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    y0 = min(0.0, min(ys))
    parts, sx, sy = _frame(title, xlabel, ylabel, min(xs), max(xs), y0, max(ys) * 1.05 or 1.0)
    legend = []
    for i, (name, s) in enumerate(series.items()):
        c = COLORS[i % len(COLORS)]
        if connect and len(s) > 1:
            d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
            parts.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="1.5"/>')
        parts += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{c}"/>' for x, y in s]
        legend.append((name, c, False))
    for j, (name, s) in enumerate((lines or {}).items()):
        c = COLORS[(len(series) + j) % len(COLORS)]
        d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        parts.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2" stroke-dasharray="6 3"/>')
        legend.append((name, c, True))
    for k, (name, c, dashed) in enumerate(legend):
        y = PAD_T + 6 + 14 * k
        dash = ' stroke-dasharray="6 3"' if dashed else ""
        parts.append(
            f'<line x1="{PAD_L + 10}" y1="{y}" x2="{PAD_L + 28}" y2="{y}" stroke="{c}" stroke-width="2"{dash}/>'
        )
        parts.append(f'<text x="{PAD_L + 32}" y="{y + 4}">{escape(name)}</text>')
    return "".join(parts) + "</svg>"


def histogram(title: str, xlabel: str, bins: Sequence[tuple[str, float]], ylabel: str = "count") -> str:
    """Bars with categorical labels (e.g. T buckets) and their counts."""
    if not bins:
        return ""
    top = max(v for _, v in bins) or 1.0
    parts, _, sy = _frame(title, xlabel, ylabel, 0, 1, 0, top * 1.05)
    parts = [
        p
        for p in parts
        if 'text-anchor="middle">' not in p or "rotate" in p or escape(title) in p or escape(xlabel) in p
    ]  # drop numeric x ticks: the axis is categorical
    width = (W - PAD_L - PAD_R) / len(bins)
    for i, (label, v) in enumerate(bins):
        x = PAD_L + i * width
        parts.append(
            f'<rect x="{x + 2:.1f}" y="{sy(v):.1f}" width="{max(width - 4, 1):.1f}" '
            f'height="{H - PAD_B - sy(v):.1f}" fill="{COLORS[0]}"><title>{escape(label)}: {_fmt(v)}</title></rect>'
        )
        parts.append(f'<text x="{x + width / 2:.1f}" y="{H - PAD_B + 14}" text-anchor="middle">{escape(label)}</text>')
    return "".join(parts) + "</svg>"
