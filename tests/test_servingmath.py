"""The serving math against the worked examples docs/method.md quotes (step 6, SCH002-SCH010)."""

from __future__ import annotations

import math
import random

import pytest

from tracediag.model.servingmath import (
    RequestOutcome,
    attainment_bounds,
    conditional_acceptance,
    expected_tokens_per_round,
    joint_attainment,
    kv_bytes_per_token,
    littles_law_l,
    mann_kendall,
    meets_slo,
    metric_bounds_from_percentiles,
    mk_statistic,
    nearest_rank,
    paged_tail_waste_bound,
    tpot_s,
)

GIB = 1024**3


# ------------------------------------------------------------ percentiles (SCH002)


def test_mean_itl_hides_the_stall_and_nearest_rank_p99_too():
    gaps = [10.0] * 99 + [500.0]
    assert sum(gaps) / len(gaps) == pytest.approx(14.9)
    assert nearest_rank(gaps, 99) == 10.0  # the 99th of 100 sorted values
    assert nearest_rank(gaps, 100) == 500.0 == max(gaps)  # the per-request max stall is what shows it


def test_nearest_rank_definition():
    assert nearest_rank([3, 1, 2], 50) == 2
    assert nearest_rank([1, 2, 3, 4], 50) == 2  # ceil(0.5·4) = 2nd value, no interpolation
    assert nearest_rank([1, 2, 3, 4], 0) == 1
    assert nearest_rank([], 99) is None
    with pytest.raises(ValueError):
        nearest_rank([1], 101)


# ------------------------------------------------------------ speculative decoding (SCH007)


def test_expected_tokens_per_round_k4_alpha08_is_3_3616():
    # constant conditional acceptance α = 0.8 over k = 4 drafts: P(first i accepted) = α^i, E = 1 + α + … + α^4
    assert expected_tokens_per_round([0.8**i for i in range(1, 5)]) == pytest.approx(3.3616)
    assert pytest.approx(3.3616) != 1 + 4 * 0.8  # not 1 + k·α


def test_conditional_from_vllm_per_position_rates():
    # vLLM's per-position acceptance rate is the joint P(A1…Ai); mean acceptance length = 1 + Σ
    joint = [0.543, 0.357, 0.264]  # vllm-19254 excerpt
    assert expected_tokens_per_round(joint) == pytest.approx(2.164)  # the line says 2.16
    cond = conditional_acceptance(joint)
    assert cond[0] == pytest.approx(0.543) and cond[1] == pytest.approx(0.357 / 0.543)
    assert conditional_acceptance([0.0, 0.0]) == [0.0, None]


# ------------------------------------------------------------ KV cache (SCH004, SCH005)


def test_kv_bytes_per_token_128_kib_and_capacity_458752():
    per_token = kv_bytes_per_token(L=32, H_kv=8, D=128, b=2)
    assert per_token == 131_072 == 128 * 1024
    assert 8192 * per_token == GIB  # one 8,192-token sequence = 1 GiB


def test_kv_uses_kv_heads_and_replicates_past_p():
    assert kv_bytes_per_token(32, 32, 128, 2) == 4 * kv_bytes_per_token(32, 8, 128, 2)  # heads, not KV heads: 4×
    assert kv_bytes_per_token(28, 4, 128, 2, p=2) == 28_672  # Qwen2-7B at TP=2: 2 KV heads per rank
    assert kv_bytes_per_token(28, 4, 128, 2, p=8) == kv_bytes_per_token(28, 4, 128, 2, p=4)  # replicated


def test_paged_tail_waste():
    assert paged_tail_waste_bound(3, 16) == 45  # sequences of 35, 17, 48 tokens waste 13 + 15 + 0 = 28 < 45
    assert paged_tail_waste_bound(3, 16) >= 13 + 15 + 0


# ------------------------------------------------------------ SLO attainment and goodput (SCH010)


def test_tpot_undefined_for_one_token_outputs():
    assert tpot_s(2.0, 0.5, 1) is None
    assert tpot_s(2.0, 0.5, 4) == pytest.approx(0.5)
    one = RequestOutcome(True, 0.2, 0.2, 1)
    assert meets_slo(one, {"tpot": 1.0, "ttft": 300})  # the TPOT budget is not checked for O = 1


def test_goodput_counts_errors_in_the_denominator():
    ok = RequestOutcome(True, 0.1, 1.0, 11)  # TPOT 90 ms
    slow = RequestOutcome(True, 0.9, 2.0, 11)  # TTFT 900 ms
    err = RequestOutcome(False, None, None, 0)
    reqs = [ok] * 7 + [slow] * 1 + [err] * 2
    a = joint_attainment(reqs, {"ttft": 500, "tpot": 100}, duration_s=10.0)
    assert (a.n, a.good, a.failed) == (10, 7, 2)
    assert a.attainment == pytest.approx(0.7)  # not 7/8 = 0.875 over completed requests only
    assert a.goodput_rps == pytest.approx(0.7)


def test_joint_attainment_is_not_the_separate_p99s():
    # 200 requests: TTFT misses on 2 requests, TPOT misses on 2 other requests -> 99 % each, 98 % jointly
    reqs = [RequestOutcome(True, 0.1, 1.1, 11) for _ in range(196)]
    reqs += [RequestOutcome(True, 2.0, 3.0, 11)] * 2 + [RequestOutcome(True, 0.1, 10.1, 11)] * 2
    slo = {"ttft": 500, "tpot": 200}
    assert sum(meets_slo(r, {"ttft": 500}) for r in reqs) / 200 == 0.99
    assert sum(meets_slo(r, {"tpot": 200}) for r in reqs) / 200 == 0.99
    assert joint_attainment(reqs, slo).attainment == pytest.approx(0.98)


def test_goodput_example_a_vs_b():
    # two runs of 100 s: 600 of 1,000 requests within a 1 s TTFT budget against 810 of 900
    a = joint_attainment(
        [RequestOutcome(True, 0.1, 1, 2)] * 600 + [RequestOutcome(True, 9, 10, 2)] * 400, {"ttft": 1000}, duration_s=100
    )
    b = joint_attainment(
        [RequestOutcome(True, 0.1, 1, 2)] * 810 + [RequestOutcome(True, 9, 10, 2)] * 90, {"ttft": 1000}, duration_s=100
    )
    assert a.goodput_rps == pytest.approx(6.0) and b.goodput_rps == pytest.approx(8.1)


def test_itl_budget_applies_to_the_worst_gap():
    r = RequestOutcome(True, 0.1, 1.6, 101, itl_max_s=0.5)  # mean gap 15 ms, one 500 ms stall
    assert not meets_slo(r, {"itl": 100})
    assert meets_slo(r, {"tpot": 100})


def test_attainment_bounds_from_percentiles():
    lo, hi = metric_bounds_from_percentiles({50: 100.0, 95: 400.0, 99: 600.0}, 500)
    assert (lo, hi) == (0.95, 0.99)
    assert metric_bounds_from_percentiles({50: 900.0}, 500) == (0.0, 0.5)
    joint = attainment_bounds({"ttft": (0.99, 1.0), "tpot": (0.99, 1.0)}, completed=98, failed=2)
    assert joint == pytest.approx((0.98 * 0.98, 0.98))


def test_littles_law():
    assert littles_law_l(4.989, 8.61) == pytest.approx(42.955, abs=1e-3)


# ------------------------------------------------------------ trend test


def test_mann_kendall_exact_on_a_strictly_rising_series():
    t = mann_kendall([0, 10, 20, 30, 40], [66, 72, 78, 84, 90])
    assert t.s == 10 and t.method == "exact"
    assert t.p_increase == pytest.approx(1 / 120)  # one permutation of 120 is as ordered
    assert t.sen_slope == pytest.approx(0.6) and t.ols_slope == pytest.approx(0.6)
    assert t.increasing and not t.decreasing


def test_mann_kendall_flat_and_too_short():
    flat = mann_kendall(range(6), [0] * 6)
    assert flat.s == 0 and not flat.increasing and flat.p_increase == 1.0
    three = mann_kendall(range(3), [1, 2, 3])
    assert three.p_increase == pytest.approx(1 / 6) and not three.increasing  # n = 3 cannot reach α = 0.05


def test_mann_kendall_ties_exact_matches_enumeration_and_normal_for_long_series():
    t = mann_kendall(range(7), [62, 0, 0, 0, 0, 45, 0])  # the 0.23.0 log's Waiting series
    assert t.method == "exact" and t.s == -3 and not t.increasing
    rng = random.Random(7)
    y = [i // 3 + rng.choice([0, 0, 1]) for i in range(40)]
    tn = mann_kendall(range(40), y)
    assert tn.method == "normal (tie-corrected)" and tn.increasing and tn.p_increase < 1e-6


def test_mann_kendall_exact_p_values_are_a_distribution():
    # P(S >= s) + P(S <= s) - P(S = s) = 1 for every s; spot-check with n = 6 (no ties)
    ys = [3, 1, 4, 6, 5, 2]
    t = mann_kendall(range(6), ys)
    assert 0 < t.p_increase <= 1 and 0 < t.p_decrease <= 1
    assert t.p_increase + t.p_decrease >= 1  # they overlap at S = s


def test_mk_statistic_matches_the_pairwise_definition():
    rng = random.Random(3)
    for n in (0, 1, 2, 5, 17, 60):
        y = [rng.choice([0, 1, 2, 3, 3.5]) for _ in range(n)]  # many ties
        naive = sum((y[j] > y[i]) - (y[j] < y[i]) for i in range(n) for j in range(i + 1, n))
        assert mk_statistic(y) == naive


def test_trend_test_scales():
    """O(n log n): 10^5 samples in about a second, not an exact table or all pairs in memory (10^6 is timed by
    benchmarks/bench_sch003.py)."""
    import time

    n = 100_000
    rng = random.Random(5)
    y = [i // 1000 + rng.random() for i in range(n)]
    t0 = time.perf_counter()
    t = mann_kendall(range(n), y)
    assert time.perf_counter() - t0 < 20
    assert t.method == "normal (tie-corrected)" and t.increasing
    assert t.sen_method.startswith("median of") and t.sen_slope == pytest.approx(0.001, rel=0.05)


# ------------------------------------------------------------ same-second samples, growth size, histograms, fleets


def test_spread_ties_orders_samples_of_one_printed_second_by_position():
    from tracediag.model.servingmath import spread_ties

    assert spread_ties([0, 0, 0, 1, 1, 2]) == [0.0, 1 / 3, 2 / 3, 1.0, 1.5, 2.0]
    assert spread_ties([5.0, 7.0]) == [5.0, 7.0]  # distinct stamps are left alone
    out = spread_ties([0.0, float("nan"), float("nan")])
    assert out[0] == 0.0 and all(math.isnan(x) for x in out[1:])
    # the queue of SGLang #25960, seven lines in one second: a trend with a slope, not "all at one time"
    t = mann_kendall(spread_ties([0] * 7), [28, 51, 51, 50, 73, 96, 119])
    assert t.increasing and t.sen_slope > 0


def test_queue_rise_threshold_is_relative_to_the_running_batch():
    from tracediag.model.servingmath import queue_rise_threshold

    assert queue_rise_threshold(None) == 2.0 and queue_rise_threshold(8) == 2.0  # one stuck request is not growth
    assert queue_rise_threshold(256) == pytest.approx(25.6)


def test_histogram_quantile_as_prometheus_with_bucket_bounds():
    from tracediag.model.servingmath import histogram_quantile

    inf = float("inf")
    # production-stack #318's queue-time buckets: 291 of 293 requests ≤ 0.3 s
    b = [(0.3, 291), (0.5, 292), (2.5, 293), (5.0, 293), (inf, 293)]
    med = histogram_quantile(b, 0.5)
    assert (med.low, med.high) == (0.0, 0.3) and med.estimate == pytest.approx(0.3 * 146.5 / 291)
    p999 = histogram_quantile(b, 0.999)
    assert (p999.low, p999.high) == (0.5, 2.5)
    assert p999.estimate == pytest.approx(0.5 + 2.0 * (0.999 * 293 - 292) / 1)
    top = histogram_quantile([(1.0, 0), (inf, 3)], 0.5)  # in the +Inf bucket: the highest finite edge, unbounded
    assert (top.estimate, top.low, top.high) == (1.0, 1.0, inf)
    assert histogram_quantile([(1.0, 0), (inf, 0)], 0.5) is None
    with pytest.raises(ValueError):
        histogram_quantile(b, 1.5)


def test_capacity_lost_against_the_fastest_engine():
    from tracediag.model.servingmath import capacity_lost

    assert capacity_lost([100, 100]) == 0.0
    assert capacity_lost([100, 40]) == pytest.approx(0.3)  # 1 − 140 / 200
    assert capacity_lost([141.75, 35.42, 35.42, 141.74, 35.44, 35.44, 140.76]) == pytest.approx(0.4296, abs=1e-4)
    assert capacity_lost([5.0]) == 0.0


def test_acceptance_drift_needs_significance_and_size():
    from tracediag.model.servingmath import acceptance_drift

    t = list(range(0, 100, 10))
    decay = acceptance_drift(t, [0.82, 0.80, 0.79, 0.76, 0.74, 0.71, 0.69, 0.66, 0.64, 0.61])
    assert decay.decaying and decay.trend.p_decrease < 0.05 and decay.drop == pytest.approx(0.21, abs=0.01)
    wobble = acceptance_drift(t, [0.80, 0.79, 0.80, 0.79, 0.80, 0.79, 0.80, 0.79, 0.80, 0.79])
    assert not wobble.decaying
    tiny = acceptance_drift(t, [0.800, 0.799, 0.798, 0.797, 0.796, 0.795, 0.794, 0.793, 0.792, 0.791])
    assert tiny.trend.decreasing and not tiny.decaying  # significant, but 1 % of the median is not a drift
