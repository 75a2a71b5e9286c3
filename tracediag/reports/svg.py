"""Inline SVG charts for report.html and diff.html: no scripts, no fonts or files fetched, every label
XML-escaped.

Small on purpose: scatter/line plots (with fitted lines), histograms with numeric bins, stacked horizontal
bars (a time breakdown) and before/after bars. Axes get round ticks (1, 2, 5 × 10^k) in the unit of the
data; long series are thinned so a chart stays a few kilobytes whatever the trace length.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

W, H = 640, 300
PAD_L, PAD_R, PAD_T, PAD_B = 64, 16, 30, 44
COLORS = ("#0969da", "#cf222e", "#1a7f37", "#9a6700", "#8250df", "#57606a", "#bc4c00", "#1b7c83")
MAX_POINTS = 400  # points drawn per chart; more are thinned (quantiles kept per x value)
MAX_LINE_POINTS = 600  # vertices of a connected series; more are reduced to min/max per bucket

Fmt = Callable[[float], str]


def escape(s: str) -> str:
    """XML text: & < > as entities (what xml.sax.saxutils.escape does, without importing its urllib chain)."""
    return s.replace("&", "&amp;").replace(">", "&gt;").replace("<", "&lt;")


def _attr(s: str) -> str:
    return escape(s).replace('"', "&quot;")


def _round_step(lo: float, hi: float, n: int) -> float | None:
    """The round step (1, 2, 2.5, 5 × 10^k) that cuts [lo, hi] in about n; None for a span that under- or
    overflows a float (values near 1e-320 or 1e308): no round step exists, the ends are the axis."""
    raw = (hi - lo) / max(n, 1)
    if not 0 < raw < math.inf:
        return None
    mag = 10 ** math.floor(math.log10(raw))
    return next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)


def nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values (1, 2, 2.5, 5 × 10^k) covering [lo, hi], about n of them."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return [0.0]
    if hi <= lo:
        return [lo]
    step = _round_step(lo, hi, n)
    if step is None:
        return [lo, hi]
    start = math.floor(lo / step + 1e-9) * step
    ticks = []
    t = start
    while t <= hi + step * 1e-9:
        if t >= lo - step * 1e-9:
            ticks.append(round(t, 12))
        t += step
    return ticks


def nice_bounds(lo: float, hi: float, n: int = 5) -> tuple[float, float]:
    """[lo, hi] widened to round tick values."""
    if hi <= lo:
        return (lo - 1, hi + 1) if lo == hi else (hi, lo)
    step = _round_step(lo, hi, n)
    if step is None:
        return lo, hi
    return math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step


def plain(v: float) -> str:
    """An axis number: 0, 0.5, 12, 1,500, 2.5k, 3M."""
    a = abs(v)
    if a == 0:
        return "0"
    if a >= 1e6:
        return f"{v / 1e6:g}M"
    if a >= 1e4:
        return f"{v / 1e3:g}k"
    if a >= 1:
        return f"{v:,.10g}"
    return f"{v:.3g}"


def _frame(title: str, xlabel: str, ylabel: str, x0: float, x1: float, y0: float, y1: float, *,
           xfmt: Fmt = plain, yfmt: Fmt = plain, xticks: bool = True, height: int = H,
           yticks: Sequence[float] | None = None, xtick_values: Sequence[float] | None = None):  # fmt: skip
    pw, ph = W - PAD_L - PAD_R, height - PAD_T - PAD_B

    def sx(x: float) -> float:
        return PAD_L + (x - x0) / ((x1 - x0) or 1) * pw

    def sy(y: float) -> float:
        return height - PAD_B - (y - y0) / ((y1 - y0) or 1) * ph

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" width="{W}" height="{height}" '
        f'role="img" aria-label="{_attr(title)}" font-family="sans-serif" font-size="12" fill="#1d2329">',
        f"<title>{escape(title)}</title>",
        f'<text x="{W / 2}" y="17" text-anchor="middle" font-size="14" font-weight="600">{escape(title)}</text>',
    ]
    for t in nice_ticks(y0, y1) if yticks is None else yticks:
        y = sy(t)
        parts.append(f'<line x1="{PAD_L}" y1="{y:.1f}" x2="{W - PAD_R}" y2="{y:.1f}" stroke="#eaeef2"/>')
        parts.append(f'<text x="{PAD_L - 5}" y="{y + 4:.1f}" text-anchor="end">{escape(yfmt(t))}</text>')
    if xticks:
        for t in nice_ticks(x0, x1, 6) if xtick_values is None else xtick_values:
            x = sx(t)
            parts.append(f'<line x1="{x:.1f}" y1="{height - PAD_B}" x2="{x:.1f}" y2="{height - PAD_B + 4}" '
                         'stroke="#57606a"/>')  # fmt: skip
            parts.append(f'<text x="{x:.1f}" y="{height - PAD_B + 16}" text-anchor="middle">{escape(xfmt(t))}</text>')
    parts += [
        f'<line x1="{PAD_L}" y1="{height - PAD_B}" x2="{W - PAD_R}" y2="{height - PAD_B}" stroke="#57606a"/>',
        f'<line x1="{PAD_L}" y1="{PAD_T}" x2="{PAD_L}" y2="{height - PAD_B}" stroke="#57606a"/>',
        f'<text x="{PAD_L + pw / 2}" y="{height - 8}" text-anchor="middle">{escape(xlabel)}</text>',
        f'<text x="13" y="{PAD_T + ph / 2}" text-anchor="middle" '
        f'transform="rotate(-90 13 {PAD_T + ph / 2})">{escape(ylabel)}</text>',
    ]
    return parts, sx, sy


def thin(points: Sequence[tuple[float, float]], limit: int = MAX_POINTS) -> list[tuple[float, float]]:
    """At most about `limit` points: per distinct x, evenly spaced order statistics of y (min and max kept),
    each x getting a share proportional to its points."""
    if len(points) <= limit:
        return list(points)
    groups: dict[float, list[float]] = {}
    for x, y in points:
        groups.setdefault(x, []).append(y)
    if len(groups) > limit:  # mostly distinct x: keep every k-th point in x order, plus the extremes of y
        pts = sorted(points)
        k = math.ceil(len(pts) / limit)
        keep = set(range(0, len(pts), k)) | {max(range(len(pts)), key=lambda i: pts[i][1])}
        return [pts[i] for i in sorted(keep)]
    out = []
    for x, ys in groups.items():
        ys.sort()
        m = max(2, round(limit * len(ys) / len(points)))
        if len(ys) <= m:
            out += [(x, y) for y in ys]
        else:
            out += [(x, ys[round(i * (len(ys) - 1) / (m - 1))]) for i in range(m)]
    return out


def _reduce_line(s: Sequence[tuple[float, float]], limit: int = MAX_LINE_POINTS) -> list[tuple[float, float]]:
    """A connected series with at most about `limit` vertices: per bucket of x its first, min, max and last."""
    if len(s) <= limit:
        return list(s)
    per = math.ceil(len(s) / (limit / 4))
    out = []
    for i in range(0, len(s), per):
        chunk = s[i : i + per]
        lo, hi = min(chunk, key=lambda p: p[1]), max(chunk, key=lambda p: p[1])
        out += sorted({chunk[0], lo, hi, chunk[-1]})
    return out


def _legend(parts: list[str], entries: list[tuple[str, str, str]]) -> None:
    """Legend entries (name, color, kind: point / line / dashed / box) in rows along the top of the plot."""
    x, y = PAD_L + 8, PAD_T + 8
    for name, color, kind in entries:
        w = 28 + 7.2 * len(name)
        if x + w > W - PAD_R and x > PAD_L + 8:
            x, y = PAD_L + 8, y + 14
        if kind == "point":
            parts.append(f'<rect x="{x + 5}" y="{y - 3}" width="6" height="6" rx="3" fill="{color}"/>')
        elif kind == "box":
            parts.append(f'<rect x="{x + 2}" y="{y - 5}" width="12" height="10" fill="{color}"/>')
        else:
            dash = ' stroke-dasharray="6 3"' if kind == "dashed" else ""
            parts.append(f'<line x1="{x}" y1="{y}" x2="{x + 18}" y2="{y}" stroke="{color}" stroke-width="2"{dash}/>')
        parts.append(f'<text x="{x + 22}" y="{y + 4}">{escape(name)}</text>')
        x += w


def scatter(
    title: str,
    xlabel: str,
    ylabel: str,
    series: dict[str, Sequence[tuple[float, float]]],
    lines: dict[str, Sequence[tuple[float, float]]] | None = None,
    connect: bool = False,
    *,
    xfmt: Fmt = plain,
    yfmt: Fmt = plain,
    y_from_zero: bool = True,
    tips: dict[str, Sequence[str]] | None = None,
    clip_outliers: bool = False,
    log_y: bool = False,
) -> str:
    """Points per series (joined when `connect`, e.g. a time series) and optional lines (a fit, a benchmark).

    `tips` gives per series one hover text per point (drawn only while the chart is small). With
    `clip_outliers` the y axis ends near the 95th percentile of the points (and above every line), so that
    a few very slow calls do not flatten the rest against the axis; points above are drawn as triangles on
    the top edge and counted in the legend. With `log_y` the y axis is logarithmic (latencies spanning
    decades: the bulk and the tail both readable); values ≤ 0 are left out."""
    if log_y:
        series = {k: [(x, math.log10(y)) for x, y in v if y > 0] for k, v in series.items()}
        lines = {k: [(x, math.log10(y)) for x, y in v if y > 0] for k, v in (lines or {}).items()}
        return _scatter(title, xlabel, ylabel, series, lines, connect, xfmt=xfmt, tips=tips, log_y=True)
    return _scatter(title, xlabel, ylabel, series, lines, connect, xfmt=xfmt, yfmt=yfmt, y_from_zero=y_from_zero,
                    tips=tips, clip_outliers=clip_outliers)  # fmt: skip


def _log_ticks(lo: float, hi: float) -> list[float]:
    """log10 positions of 1, 2, 5 × 10^k within [lo, hi] (decades only when the range is wide)."""
    steps = (1, 2, 5) if hi - lo <= 3 else (1,)
    out = []
    for e in range(math.floor(lo), math.ceil(hi) + 1):
        for m in steps:
            t = e + math.log10(m)
            if lo - 1e-9 <= t <= hi + 1e-9:
                out.append(t)
    return out


def _scatter(
    title: str,
    xlabel: str,
    ylabel: str,
    series: dict[str, Sequence[tuple[float, float]]],
    lines: dict[str, Sequence[tuple[float, float]]] | None,
    connect: bool,
    *,
    xfmt: Fmt = plain,
    yfmt: Fmt = plain,
    y_from_zero: bool = True,
    tips: dict[str, Sequence[str]] | None = None,
    clip_outliers: bool = False,
    log_y: bool = False,
) -> str:
    series = {k: list(v) for k, v in series.items() if v}
    lines = {k: list(v) for k, v in (lines or {}).items() if v}
    pts = [p for s in series.values() for p in s] + [p for s in lines.values() for p in s]
    pts = [p for p in pts if math.isfinite(p[0]) and math.isfinite(p[1])]
    if len({p[0] for s in series.values() for p in s if math.isfinite(p[0])}) < 2:
        return ""  # one x (one step, one size): an axis around it would invent its ticks; the caller says why
    xs, ys = [p[0] for p in pts], [p[1] for p in pts]
    top = max(ys)
    if clip_outliers:
        point_ys = sorted(p[1] for s in series.values() for p in s)
        line_top = max((p[1] for s in lines.values() for p in s), default=0.0)
        if point_ys:
            q95 = point_ys[min(len(point_ys) - 1, int(0.95 * len(point_ys)))]
            top = min(top, max(q95 * 1.3, line_top * 1.15, point_ys[len(point_ys) // 2] * 2))
    ys = [min(y, top) for y in ys]
    x0, x1 = min(xs), max(xs)
    if x0 == x1:
        x0, x1 = x0 - 1, x1 + 1
    pad = (x1 - x0) * 0.02  # points on the first and last x stay clear of the axes
    x0, x1 = x0 - pad, x1 + pad
    if log_y:
        y0, y1 = math.floor(min(ys)), max(math.ceil(max(ys)), math.floor(min(ys)) + 1)
        yticks = _log_ticks(y0, y1)
        yfmt = lambda t: plain(float(f"{10**t:.3g}"))  # noqa: E731
    else:
        y0, y1 = nice_bounds(min(0.0, min(ys)) if y_from_zero else min(ys), max(ys) * 1.04 or 1.0)
        yticks = None
    n_series = len(series) + len(lines)
    legend_rows = 1 + (sum(28 + 7.2 * len(k) for k in [*series, *lines]) > W - PAD_L - PAD_R - 16)
    y1 = y1 + (y1 - y0) * 0.08 * legend_rows * (n_series > 0)  # room for the legend above the data
    parts, sx, sy = _frame(title, xlabel, ylabel, x0, x1, y0, y1, xfmt=xfmt, yfmt=yfmt, yticks=yticks)
    legend = []
    total = sum(len(s) for s in series.values())
    for i, (name, s) in enumerate(series.items()):
        c = COLORS[i % len(COLORS)]
        if connect and len(s) > 1:
            d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in _reduce_line(s))
            parts.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="1.5"/>')
        if connect and len(s) > MAX_POINTS // max(1, len(series)):
            legend.append((name, c, "line"))
            continue
        above = [(x, y) for x, y in s if y > top]
        shown = thin([(x, y) for x, y in s if y <= top], max(20, MAX_POINTS * len(s) // max(total, 1)))
        tip = (tips or {}).get(name)
        if tip and len(shown) == len(s) and total <= MAX_POINTS:
            parts += [
                f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{c}"><title>{escape(t)}</title></circle>'
                for (x, y), t in zip(s, tip)
            ]
        else:
            parts += [f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2.5" fill="{c}"/>' for x, y in shown]
        for x, _ in {(x, 0) for x, _ in above}:  # one triangle per x: calls above the top of the chart
            xp, yp = sx(x), sy(top)
            parts.append(
                f'<path d="M{xp - 4:.1f},{yp + 6:.1f} L{xp + 4:.1f},{yp + 6:.1f} L{xp:.1f},{yp:.1f} Z" fill="{c}"/>'
            )
        label = name if len(shown) + len(above) == len(s) else f"{name} ({len(shown)} of {len(s)} shown)"
        if above:
            label += f", {len(above)} above the top (▲)"
        legend.append((label, c, "line" if connect else "point"))
    for j, (name, s) in enumerate(lines.items()):
        c = COLORS[(len(series) + j) % len(COLORS)]
        d = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y in s)
        parts.append(f'<polyline points="{d}" fill="none" stroke="{c}" stroke-width="2" stroke-dasharray="6 3"/>')
        legend.append((name, c, "dashed"))
    _legend(parts, legend)
    return "".join(parts) + "</svg>"


def roofline(
    title: str,
    points: Sequence[tuple[float, float, float, str, str, bool]],
    roofs: Sequence[tuple[str, float]],
    bandwidth_tb_s: float,
) -> str:
    """A log–log roofline: achieved TFLOP/s against arithmetic intensity (FLOP/byte), one mark per point
    (intensity, TFLOP/s, time ns, series, hover text, hollow) with its area proportional to its time; the memory
    roof (bandwidth × intensity) and one compute roof per (label, TFLOP/s), each meeting the memory roof at its
    ridge (a dashed vertical). Hollow marks: bounded by launch latency. Colours by series (the op family)."""
    pts = [p for p in points if p[0] > 0 and p[1] > 0 and math.isfinite(p[0]) and math.isfinite(p[1])]
    peaks = [(name, v) for name, v in roofs if v and v > 0]
    if not pts or not peaks or not bandwidth_tb_s > 0:
        return ""
    ridges = [v / bandwidth_tb_s for _, v in peaks]
    xs = [math.log10(p[0]) for p in pts] + [math.log10(r) for r in ridges]
    ys = [math.log10(p[1]) for p in pts] + [math.log10(v) for _, v in peaks]
    x0, x1 = math.floor(min(xs) - 0.3), math.ceil(max(xs) + 0.3)
    y0, y1 = math.floor(min(ys) - 0.3), math.ceil(max(ys) + 0.5)
    y0 = min(y0, math.floor(math.log10(bandwidth_tb_s * 10**x0)))  # the memory roof enters on the left edge
    parts, sx, sy = _frame(title, "arithmetic intensity (FLOP/byte, log)", "achieved TFLOP/s (log)", x0, x1, y0, y1,
                           xfmt=lambda t: plain(float(f"{10**t:.3g}")), yfmt=lambda t: plain(float(f"{10**t:.3g}")),
                           yticks=_log_ticks(y0, y1), xtick_values=_log_ticks(x0, x1))  # fmt: skip
    top = max(v for _, v in peaks)
    x_top = math.log10(top / bandwidth_tb_s)
    y_left = math.log10(bandwidth_tb_s) + x0
    x_start = x0 if y_left >= y0 else y0 - math.log10(bandwidth_tb_s)
    parts.append(
        f'<polyline points="{sx(x_start):.1f},{sy(math.log10(bandwidth_tb_s) + x_start):.1f} '
        f'{sx(x_top):.1f},{sy(math.log10(top)):.1f}" fill="none" stroke="#57606a" stroke-width="2"/>'
    )
    parts.append(
        f'<text x="{sx(x_start) + 6:.1f}" y="{sy(math.log10(bandwidth_tb_s) + x_start) - 6:.1f}" fill="#57606a" '
        f'font-size="11">memory roof {bandwidth_tb_s:.3g} TB/s</text>'
    )
    for name, v in sorted(peaks, key=lambda nv: -nv[1]):
        xr = math.log10(v / bandwidth_tb_s)
        yv = sy(math.log10(v))
        parts.append(f'<line x1="{sx(xr):.1f}" y1="{yv:.1f}" x2="{sx(x1):.1f}" y2="{yv:.1f}" stroke="#57606a" '
                     'stroke-width="2"/>')  # fmt: skip
        parts.append(f'<line x1="{sx(xr):.1f}" y1="{yv:.1f}" x2="{sx(xr):.1f}" y2="{sy(y0):.1f}" stroke="#8c959f" '
                     'stroke-dasharray="4 3"/>')  # fmt: skip
        parts.append(f'<text x="{sx(x1) - 4:.1f}" y="{yv - 5:.1f}" text-anchor="end" fill="#57606a" font-size="11">'
                     f"{escape(name)} {v:,.4g} TFLOP/s (ridge {v / bandwidth_tb_s:,.0f} FLOP/B)</text>")  # fmt: skip
    tmax = max(p[2] for p in pts) or 1
    series = list(dict.fromkeys(p[3] for p in pts))
    shown = sorted(pts, key=lambda p: -p[2])[:MAX_POINTS]
    for p in sorted(shown, key=lambda p: -p[2]):  # small marks drawn last, on top
        c = COLORS[series.index(p[3]) % len(COLORS)]
        r = 2.5 + 9 * math.sqrt(max(p[2], 0) / tmax)
        fill = f'fill="none" stroke="{c}" stroke-width="1.5"' if p[5] else f'fill="{c}" fill-opacity="0.6" stroke="{c}"'
        parts.append(f'<circle cx="{sx(math.log10(p[0])):.1f}" cy="{sy(math.log10(p[1])):.1f}" r="{r:.1f}" {fill}>'
                     f"<title>{escape(p[4])}</title></circle>")  # fmt: skip
    legend = [(name, COLORS[i % len(COLORS)], "point") for i, name in enumerate(series)]
    if len(shown) < len(pts):
        legend.append((f"{len(shown)} of {len(pts)} largest shown", "#57606a", "point"))
    _legend(parts, legend)
    return "".join(parts) + "</svg>"


def numeric_bins(values: Sequence[float], max_bins: int = 24) -> list[tuple[float, float, int]]:
    """(low, high, count) bins over the values: one bin per distinct integer when they are few, else
    round-width linear bins, or powers of two when the values span more than two decades."""
    vals = [v for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return []
    lo, hi = min(vals), max(vals)
    distinct = sorted(set(vals))
    if all(float(v).is_integer() for v in distinct) and hi - lo + 1 <= max_bins:
        counts = {int(v): 0 for v in range(int(lo), int(hi) + 1)}
        for v in vals:
            counts[int(v)] += 1
        return [(k - 0.5, k + 0.5, n) for k, n in counts.items()]
    if lo > 0 and hi / lo > 100:
        edges = [2.0**e for e in range(math.floor(math.log2(lo)), math.ceil(math.log2(hi)) + 1)]
        if edges[-1] <= hi:
            edges.append(edges[-1] * 2)
    else:
        b0, b1 = nice_bounds(lo, hi if hi > lo else lo + 1, min(max_bins, 12))
        step = nice_ticks(b0, b1, min(max_bins, 12))
        width = (step[1] - step[0]) if len(step) > 1 else 1.0
        edges = [b0 + i * width for i in range(round((b1 - b0) / width) + 1)]
        if edges[-1] <= hi:
            edges.append(edges[-1] + width)
    bins = [[edges[i], edges[i + 1], 0] for i in range(len(edges) - 1)]
    for v in vals:
        for b in bins:
            if b[0] <= v < b[1] or (b is bins[-1] and v == b[1]):
                b[2] += 1
                break
    return [(a, b, n) for a, b, n in bins]


def histogram(
    title: str,
    xlabel: str,
    bins: Sequence[tuple[str, float]] | dict[str, Sequence[tuple[float, float, int]]],
    ylabel: str = "count",
    *,
    xfmt: Fmt = plain,
) -> str:
    """Bars: categorical (label, count) pairs, or numeric bins per series {name: [(low, high, count)]}
    stacked in one chart (e.g. T per phase)."""
    if not bins:
        return ""
    if isinstance(bins, dict):
        return _numeric_histogram(title, xlabel, bins, ylabel, xfmt)
    top = max(v for _, v in bins) or 1.0
    _, y1 = nice_bounds(0, top)
    parts, _, sy = _frame(title, xlabel, ylabel, 0, 1, 0, y1, xticks=False)
    width = (W - PAD_L - PAD_R) / len(bins)
    for i, (lbl, v) in enumerate(bins):
        x = PAD_L + i * width
        parts.append(
            f'<rect x="{x + 2:.1f}" y="{sy(v):.1f}" width="{max(width - 4, 1):.1f}" height="{H - PAD_B - sy(v):.1f}" '
            f'fill="{COLORS[0]}"><title>{escape(lbl)}: {plain(v)}</title></rect>'
        )
        parts.append(f'<text x="{x + width / 2:.1f}" y="{H - PAD_B + 16}" text-anchor="middle">{escape(lbl)}</text>')
    return "".join(parts) + "</svg>"


def _numeric_histogram(title, xlabel, series, ylabel, xfmt) -> str:
    series = {k: v for k, v in series.items() if v}
    if not series:
        return ""
    x0 = min(b[0] for s in series.values() for b in s)
    x1 = max(b[1] for s in series.values() for b in s)
    edges = sorted({(b[0], b[1]) for s in series.values() for b in s})
    stacks = {e: 0 for e in edges}
    for s in series.values():
        for a, b, n in s:
            stacks[(a, b)] += n
    _, y1 = nice_bounds(0, max(stacks.values()) or 1)
    y1 *= 1.12 if len(series) > 1 else 1
    log = x0 > 0 and x1 / x0 > 100
    tx = (lambda v: math.log2(v)) if log else (lambda v: v)
    fx = (lambda t: xfmt(2**t)) if log else xfmt
    integer_bins = all(b - a == 1 for a, b in edges) and len(edges) <= 24
    parts, sx, sy = _frame(title, xlabel, ylabel, tx(x0), tx(x1), 0, y1, xfmt=fx, xticks=not integer_bins)
    if integer_bins:  # one bar per integer value: label the bars themselves
        step = max(1, math.ceil(len(edges) / 12))
        for i, (a, b) in enumerate(edges):
            if i % step == 0:
                xm = sx((tx(a) + tx(b)) / 2)
                tick = escape(xfmt(a + 0.5))
                parts.append(f'<text x="{xm:.1f}" y="{H - PAD_B + 16}" text-anchor="middle">{tick}</text>')
    base = dict.fromkeys(edges, 0)
    legend = []
    for i, (name, s) in enumerate(series.items()):
        c = COLORS[i % len(COLORS)]
        for a, b, n in s:
            if not n:
                continue
            left, right = sx(tx(a)), sx(tx(b))
            y_top, y_bot = sy(base[(a, b)] + n), sy(base[(a, b)])
            rng = f"{xfmt(a + 0.5)}" if integer_bins else f"{xfmt(a)}–{xfmt(b)}"
            parts.append(
                f'<rect x="{left + 1:.1f}" y="{y_top:.1f}" width="{max(right - left - 2, 1):.1f}" '
                f'height="{max(y_bot - y_top, 0.5):.1f}" fill="{c}"><title>{escape(name)}, {escape(xlabel)} '
                f"{escape(rng)}: {n}</title></rect>"
            )
            base[(a, b)] += n
        legend.append((f"{name} ({sum(n for _, _, n in s)})", c, "box"))
    if len(series) > 1:
        _legend(parts, legend)
    return "".join(parts) + "</svg>"


def stacked_bars(
    title: str,
    rows: Sequence[tuple[str, Sequence[tuple[str, float]]]],
    *,
    total_fmt: Fmt = plain,
    unit_note: str = "share of step time",
) -> str:
    """One horizontal bar per row (e.g. a phase), split into named segments; each bar is drawn as shares of
    its own total, with the total printed at its end. Segment names get one color across rows."""
    rows = [(lbl, [(n, v) for n, v in segs if v > 0]) for lbl, segs in rows]
    rows = [(lbl, segs) for lbl, segs in rows if segs]
    if not rows:
        return ""
    names: list[str] = []
    for _, segs in rows:
        names += [n for n, _ in segs if n not in names]
    color = {n: COLORS[i % len(COLORS)] for i, n in enumerate(names)}
    left, right, bar_h, gap = 96, 84, 26, 14
    legend_rows = 1 + (sum(26 + 6.8 * len(n) for n in names) > W - 40)
    top = 30 + 14 * legend_rows + 8
    height = top + len(rows) * (bar_h + gap) + 22
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" width="{W}" height="{height}" '
        f'role="img" aria-label="{_attr(title)}" font-family="sans-serif" font-size="12" fill="#1d2329">',
        f"<title>{escape(title)}</title>",
        f'<text x="{W / 2}" y="17" text-anchor="middle" font-size="14" font-weight="600">{escape(title)}</text>',
    ]
    x, y = 10, 36
    for n in names:
        w = 26 + 6.8 * len(n)
        if x + w > W - 10:
            x, y = 10, y + 14
        parts.append(f'<rect x="{x}" y="{y - 5}" width="12" height="10" fill="{color[n]}"/>')
        parts.append(f'<text x="{x + 16}" y="{y + 4}">{escape(n)}</text>')
        x += w
    span = W - left - right
    for i, (lbl, segs) in enumerate(rows):
        yb = top + i * (bar_h + gap)
        total = sum(v for _, v in segs)
        parts.append(f'<text x="{left - 6}" y="{yb + bar_h / 2 + 4}" text-anchor="end">{escape(lbl)}</text>')
        x = float(left)
        for n, v in segs:
            w = span * v / total
            share = v / total
            parts.append(
                f'<rect x="{x:.1f}" y="{yb}" width="{max(w, 0.5):.1f}" height="{bar_h}" fill="{color[n]}">'
                f"<title>{escape(lbl)}: {escape(n)} {share * 100:.1f}% ({escape(total_fmt(v))})</title></rect>"
            )
            if w > 34:
                parts.append(
                    f'<text x="{x + w / 2:.1f}" y="{yb + bar_h / 2 + 4}" text-anchor="middle" fill="#fff" '
                    f'font-weight="600">{share * 100:.0f}%</text>'
                )
            x += w
        parts.append(f'<text x="{left + span + 6}" y="{yb + bar_h / 2 + 4}">{escape(total_fmt(total))}</text>')
    parts.append(f'<text x="{left}" y="{height - 6}" fill="#57606a">{escape(unit_note)}</text>')
    return "".join(parts) + "</svg>"


def paired_bars(
    title: str, rows: Sequence[tuple[str, float | None, float | None]], *, vfmt: Fmt = plain, names=("before", "after")
) -> str:
    """Before/after horizontal bars per row (label, before, after); missing values are left out."""
    rows = [r for r in rows if r[1] is not None or r[2] is not None]
    if not rows:
        return ""
    left, right, bar_h, gap = 170, 90, 11, 10
    top = 44
    height = top + len(rows) * (2 * bar_h + gap) + 10
    vmax = max(v for r in rows for v in r[1:] if v is not None) or 1.0
    span = W - left - right
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {height}" width="{W}" height="{height}" '
        f'role="img" aria-label="{_attr(title)}" font-family="sans-serif" font-size="12" fill="#1d2329">',
        f"<title>{escape(title)}</title>",
        f'<text x="{W / 2}" y="17" text-anchor="middle" font-size="14" font-weight="600">{escape(title)}</text>',
    ]
    colors = ("#8c959f", COLORS[0])
    for k, (n, c) in enumerate(zip(names, colors)):
        parts.append(f'<rect x="{left + k * 90}" y="27" width="12" height="10" fill="{c}"/>')
        parts.append(f'<text x="{left + k * 90 + 16}" y="36">{escape(n)}</text>')
    for i, (lbl, *vals) in enumerate(rows):
        yb = top + i * (2 * bar_h + gap)
        shown = lbl if len(lbl) <= 28 else lbl[:27] + "…"
        parts.append(
            f'<text x="{left - 6}" y="{yb + bar_h + 4}" text-anchor="end"><title>{escape(lbl)}</title>'
            f"{escape(shown)}</text>"
        )
        for k, v in enumerate(vals):
            if v is None:
                continue
            w = span * v / vmax
            y = yb + k * bar_h
            parts.append(
                f'<rect x="{left}" y="{y}" width="{max(w, 0.5):.1f}" height="{bar_h - 1}" fill="{colors[k]}">'
                f"<title>{escape(lbl)} {names[k]}: {escape(vfmt(v))}</title></rect>"
            )
            parts.append(f'<text x="{left + w + 4:.1f}" y="{y + bar_h - 2}" font-size="10">{escape(vfmt(v))}</text>')
    return "".join(parts) + "</svg>"
