"""The line fits every rule and section shares (tracediag.model.fitting): least squares, Theil–Sen and Sen's slope
with its two subsamples for large inputs."""

from __future__ import annotations

import numpy as np
import pytest

from tracediag.model.fitting import (
    MAX_PAIRWISE_POINTS,
    POINTS_SEED,
    SAMPLE_PAIRS,
    SAMPLE_POINTS,
    ols,
    sen_slope,
    theil_sen,
)


def test_theil_sen_ignores_outliers():
    rng = np.random.default_rng(1)
    x = np.repeat([1e3, 1e4, 1e5, 1e6], 50)
    y = 10e-6 + x / 100e9 + rng.normal(0, 1e-7, x.size)
    y[::4] += 5e-3  # a quarter of the calls waited for a late rank
    fit = theil_sen(x, y)
    assert fit.slope == pytest.approx(1 / 100e9, rel=0.02) and fit.intercept == pytest.approx(10e-6, rel=0.05)
    assert theil_sen([5, 5, 5], [1, 2, 3]) is None


def test_sen_slope_exact_below_the_pair_budget_and_sampled_above():
    slope, method = sen_slope([0, 1, 2, 3, 4], [0, 1, 2, 3, 100])  # one outlier does not move the median slope
    assert method == "all pairs" and slope == pytest.approx(1.0)
    xs = list(range(2000))
    slope, method = sen_slope(xs, [2 * x for x in xs])
    assert method.startswith("median of") and "random pairs of 1,999,000" in method
    assert slope == pytest.approx(2.0)


def test_both_subsamples_give_the_exact_median_below_their_limits():
    # ties and few distinct x (the grouped path) and many distinct x (all index pairs): one multiset of slopes
    rng = np.random.default_rng(3)
    for x in (np.repeat([1e3, 1e4, 1e5], 40), rng.uniform(0, 100, 300)):
        y = 2.5 * x + rng.normal(0, 1, x.size)
        slopes = [(y[j] - y[i]) / (x[j] - x[i]) for i in range(x.size) for j in range(i + 1, x.size) if x[j] != x[i]]
        exact = float(np.median(slopes))
        assert sen_slope(x, y, SAMPLE_PAIRS) == (exact, "all pairs")
        assert sen_slope(x, y, SAMPLE_POINTS) == (exact, "all pairs")
    with pytest.raises(ValueError):
        sen_slope([1, 2], [1, 2], "every pair")


def test_points_subsample_above_its_limit_falls_back_to_medians_per_x():
    # every point at x = 1 but one at x = 2 that the seeded draw of points leaves out: the drawn points hold one x
    # value, so the slope comes from the medians of y per x over all points
    n = MAX_PAIRWISE_POINTS + 500
    drawn = set(np.random.default_rng(POINTS_SEED).choice(n, MAX_PAIRWISE_POINTS, replace=False).tolist())
    left_out = min(set(range(n)) - drawn)
    x = np.ones(n)
    x[left_out] = 2.0
    y = np.where(x == 1.0, 10.0, 14.0)
    assert sen_slope(x, y, SAMPLE_POINTS) == (4.0, "the medians of y per x value")
    assert theil_sen(x, y).slope == 4.0 and theil_sen(x, y).intercept == 6.0


def test_ols():
    fit = ols([1, 2, 4], [3.0, 5.0, 9.0])  # y = 2x + 1 exactly
    assert (fit.slope, fit.intercept, fit.r2, fit.n, fit.distinct_x) == (2.0, 1.0, 1.0, 3, 3)
    assert fit.method == "least squares"
    noisy = ols([0, 1, 2, 3], [0.0, 2.0, 1.0, 3.0])
    assert noisy.slope == pytest.approx(0.8) and noisy.intercept == pytest.approx(0.3)
    assert noisy.r2 == pytest.approx(1 - 1.8 / 5.0)
    assert ols([0, 1, 2, 3], [0.0, 2.0, 1.0, 3.0], with_r2=False).r2 is None
    assert ols([5, 5, 5], [1.0, 2.0, 3.0]) is None and ols([], []) is None
    assert ols([1, 2, 3], [4.0, 4.0, 4.0]).r2 == 1.0  # constant y: the flat line explains it
