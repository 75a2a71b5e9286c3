"""Straight-line fits y ≈ intercept + slope·x: least squares (`ols`) and Theil–Sen (`theil_sen`, its slope alone
`sen_slope`). One implementation of each for every caller: the step time over T (SCH001, the phases section),
the α–β fit of the collectives and the projection slope (tracediag.model.tpmath, COL003, PATH002), the trend of
a serving series (tracediag.model.servingmath, SCH003). Pure functions; below everything that fits a line.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class LineFit:
    """y ≈ intercept + slope·x."""

    intercept: float
    slope: float
    n: int  # points used
    distinct_x: int  # distinct x values among them
    r2: float | None  # 1 − SS_res/SS_tot on all points (None: y constant (Theil–Sen), or not asked for (ols))
    median_abs_rel_residual: float | None = None  # median |y − ŷ| / y (Theil–Sen): typical relative error
    method: str = "Theil–Sen"


# ---------------------------------------------------------------- least squares


def ols(x: Sequence[float], y: Sequence[float], with_r2: bool = True) -> LineFit | None:
    """Least squares: slope = Σ(x − x̄)(y − ȳ) / Σ(x − x̄)², intercept = ȳ − slope·x̄, and with `with_r2`
    R² = 1 − SS_res/SS_tot (1 when y is constant; without it None: a trend over 10^6 samples reports the slope
    only). None when Σ(x − x̄)² is not positive (no points, or one x value). Sums in Python's order (not NumPy's
    pairwise sums), so the numbers do not depend on the array library."""
    n = len(x)
    if n == 0:
        return None
    mx = sum(x) / n
    my = sum(y) / n
    sxx = sum((v - mx) ** 2 for v in x)
    if not sxx > 0:
        return None
    slope = sum((a - mx) * (b - my) for a, b in zip(x, y)) / sxx
    intercept = my - slope * mx
    r2 = None
    if with_r2:
        ss_tot = sum((b - my) ** 2 for b in y)
        ss_res = sum((b - (slope * a + intercept)) ** 2 for a, b in zip(x, y))
        r2 = 1 - ss_res / ss_tot if ss_tot > 0 else 1.0
    return LineFit(intercept=intercept, slope=slope, n=n, distinct_x=_distinct(x), r2=r2, method="least squares")


def _distinct(x: Sequence[float]) -> int:
    """len(set(x)) without the set (10^6 samples: tens of MB): NumPy's unique equals it when no x is NaN."""
    if len(x) < 1000:
        return len(set(x))
    xa = np.asarray(x, dtype=float)
    return len(set(x)) if np.isnan(xa).any() else int(np.unique(xa).size)


# ---------------------------------------------------------------- Theil–Sen

# The median of all pairwise slopes is O(n²) pairs. Above a size, one of two subsamples (each caller keeps the one
# its numbers were always computed with):
SAMPLE_POINTS = "points"  # above MAX_PAIRWISE_POINTS points: all pairs of that many points drawn without replacement
SAMPLE_PAIRS = "pairs"  # above SEN_EXACT_MAX_PAIRS pairs: that many pairs drawn uniformly at random (O(n) memory)
MAX_PAIRWISE_POINTS = 2000
POINTS_SEED = 0
SEN_EXACT_MAX_PAIRS = 200_000
SEN_SEED = 20240101  # fixed: the same series gives the same slope on every run

_FEW_DISTINCT_X = 64  # at most this many distinct x values: slopes built per pair of x groups


def _pairwise_slopes(xs: np.ndarray, ys: np.ndarray) -> np.ndarray:
    """(y_j − y_i)/(x_j − x_i) over every pair of points with different x. With few distinct x (payload sizes,
    token counts) built group pair by group pair, without the O(n²) index arrays; the same values either way
    ((−a)/(−b) is a/b exactly), so the median does not depend on the path."""
    ux, inverse = np.unique(xs, return_inverse=True)
    if ux.size > _FEW_DISTINCT_X:
        i, j = np.triu_indices(xs.size, k=1)
        dx = xs[j] - xs[i]
        keep = dx != 0
        return (ys[j] - ys[i])[keep] / dx[keep]
    groups = [ys[inverse == g] for g in range(ux.size)]
    parts = [
        np.subtract.outer(groups[v], groups[u]).ravel() / (ux[v] - ux[u])
        for u in range(ux.size)
        for v in range(u + 1, ux.size)
    ]
    return np.concatenate(parts) if parts else np.empty(0)


def sen_slope(x: Sequence[float], y: Sequence[float], sample: str = SAMPLE_PAIRS) -> tuple[float | None, str]:
    """Sen's slope: the median of (y_j − y_i)/(x_j − x_i) over the pairs with x_j ≠ x_i, and which pairs it used
    ("all pairs", or the subsample). None when no pair has two x values.

    `sample` says which subsample above the size limit: SAMPLE_PAIRS, or SAMPLE_POINTS (then, when the drawn
    points hold one x value only, the slope comes from the medians of y per x over all points)."""
    xa = np.asarray(x, dtype=float)
    ya = np.asarray(y, dtype=float)
    n = xa.size
    if sample == SAMPLE_PAIRS:
        if n < 2:
            return None, "all pairs"
        pairs = n * (n - 1) // 2
        if pairs <= SEN_EXACT_MAX_PAIRS:
            slopes, method = _pairwise_slopes(xa, ya), "all pairs"
        else:
            rng = np.random.default_rng(SEN_SEED)
            i = rng.integers(0, n, SEN_EXACT_MAX_PAIRS)
            j = rng.integers(0, n, SEN_EXACT_MAX_PAIRS)
            lo, hi = np.minimum(i, j), np.maximum(i, j)
            keep = lo != hi
            i, j = lo[keep], hi[keep]
            method = f"median of {len(i):,} random pairs of {pairs:,} (seed {SEN_SEED})"
            dx = xa[j] - xa[i]
            ok = dx != 0
            slopes = (ya[j] - ya[i])[ok] / dx[ok]
    elif sample == SAMPLE_POINTS:
        xs, ys, method = xa, ya, "all pairs"
        if n > MAX_PAIRWISE_POINTS:
            idx = np.random.default_rng(POINTS_SEED).choice(n, MAX_PAIRWISE_POINTS, replace=False)
            xs, ys = xs[idx], ys[idx]
            method = f"all pairs of {MAX_PAIRWISE_POINTS:,} of {n:,} points drawn at random (seed {POINTS_SEED})"
        slopes = _pairwise_slopes(xs, ys)
        if not slopes.size and n > MAX_PAIRWISE_POINTS:  # the drawn points hold one x value: medians per x
            ux = np.unique(xa)
            slopes = _pairwise_slopes(ux, np.array([np.median(ya[xa == u]) for u in ux]))
            method = "the medians of y per x value"
    else:
        raise ValueError(f"sample must be {SAMPLE_PAIRS!r} or {SAMPLE_POINTS!r}, not {sample!r}")
    if not slopes.size:
        return None, method
    return float(np.median(slopes)), method


def theil_sen(x, y) -> LineFit | None:
    """Theil–Sen line over the finite points: slope = Sen's slope (subsampled by points above
    MAX_PAIRWISE_POINTS), intercept = median of y − slope·x. Robust to up to ~29% outliers (e.g. calls that
    waited for a late rank). None with fewer than two distinct x values."""
    xa = np.asarray(x, dtype=float)
    ya = np.asarray(y, dtype=float)
    ok = np.isfinite(xa) & np.isfinite(ya)
    xa, ya = xa[ok], ya[ok]
    distinct = int(np.unique(xa).size)
    if distinct < 2:
        return None
    slope, _ = sen_slope(xa, ya, SAMPLE_POINTS)
    intercept = float(np.median(ya - slope * xa))
    pred = intercept + slope * xa
    ss_tot = float(np.sum((ya - ya.mean()) ** 2))
    r2 = 1 - float(np.sum((ya - pred) ** 2)) / ss_tot if ss_tot > 0 else None
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.abs(ya - pred) / np.abs(ya)
    rel = rel[np.isfinite(rel)]
    return LineFit(
        intercept=intercept,
        slope=slope,
        n=int(xa.size),
        distinct_x=distinct,
        r2=r2,
        median_abs_rel_residual=float(np.median(rel)) if rel.size else float("nan"),
    )
