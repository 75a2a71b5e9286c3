"""Serving math of step 6 (docs/method.md), as pure functions (no store, no I/O): percentiles, speculative
decoding, KV bytes per token, SLO attainment and goodput, Little's law and the trend test. The worked examples
docs/method.md quotes for them are tests in tests/test_servingmath.py.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from tracediag.model.fitting import SAMPLE_PAIRS, ols, sen_slope

# ---------------------------------------------------------------- percentiles


def nearest_rank(values: Iterable[float], p: float) -> float | None:
    """Nearest-rank percentile: the ceil(p/100 · n)-th smallest value (p in [0, 100]); None when empty.

    (99 gaps of 10 ms and one of 500 ms: p99 = 10 ms, while the mean is 14.9 ms.)
    """
    ys = sorted(values)
    if not ys:
        return None
    if not 0 <= p <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {p}")
    return ys[max(0, math.ceil(p / 100 * len(ys)) - 1)]


# ---------------------------------------------------------------- speculative decoding


def expected_tokens_per_round(joint: Sequence[float]) -> float:
    """E[tokens/round] = 1 + P(A1) + P(A1∩A2) + … + P(A1∩…∩Ak); `joint[i]` = P(first i+1 drafts accepted).

    vLLM's per-position acceptance rate (accepted at position i / drafts) is exactly this joint
    probability, and its "mean acceptance length" is this expectation.
    """
    return 1.0 + sum(joint)


def conditional_acceptance(joint: Sequence[float]) -> list[float | None]:
    """P(A_i | A_1…A_{i−1}) = joint[i] / joint[i−1]; None where the previous position was never accepted."""
    out: list[float | None] = []
    prev = 1.0
    for j in joint:
        out.append(j / prev if prev > 0 else None)
        prev = j
    return out


# ---------------------------------------------------------------- KV cache


def kv_bytes_per_token(L: int, H_kv: int, D: int, b: float, p: int = 1, pp: int = 1) -> float:
    """Per-token KV bytes held by one GPU: 2·(L/pp)·ceil(H_kv/p)·D·b.

    KV heads, not attention heads; with p > H_kv the heads are replicated (each rank keeps one).
    """
    return 2 * (L / pp) * math.ceil(H_kv / p) * D * b


def paged_tail_waste_bound(active_sequences: int, block_size: int) -> int:
    """Unused slots in the last block of each non-empty sequence: waste ≤ A·(B−1) tokens.

    The bound is reached (every length ≡ 1 mod B: three 17-token sequences with B = 16 waste 45 = 3·15), so it
    is "≤", not "<". It bounds tail blocks only — not block tables, reservations, or blocks shared by a prefix
    cache or freed by a sliding window.
    """
    return active_sequences * (block_size - 1)


# ---------------------------------------------------------------- SLO attainment and goodput

SLO_KEYS = ("ttft", "tpot", "itl", "e2el")


@dataclass(frozen=True)
class RequestOutcome:
    success: bool
    ttft_s: float | None
    e2el_s: float | None
    output_len: int | None
    itl_max_s: float | None = None


def tpot_s(e2el_s: float | None, ttft_s: float | None, output_len: int | None) -> float | None:
    """(E2E − TTFT) / (O − 1); undefined (None) for O ≤ 1."""
    if e2el_s is None or ttft_s is None or output_len is None or output_len <= 1:
        return None
    return (e2el_s - ttft_s) / (output_len - 1)


def meets_slo(r: RequestOutcome, slo_ms: Mapping[str, float]) -> bool:
    """Joint indicator: success ∧ TTFT ≤ B_f ∧ TPOT ≤ B_d ∧ ITL_max ≤ B_i ∧ E2E ≤ B_e.

    Conventions: a failed request (error, timeout) is 0. TPOT is undefined for one-token outputs: the TPOT
    budget is not checked for them (vLLM's --goodput sets their TPOT to 0, which gives the same outcome).
    The ITL budget applies to the request's largest inter-token gap (its worst stall), not the mean.
    A budget whose measure is missing for a successful request counts as not met.
    """
    if not r.success:
        return False
    for key, budget_ms in slo_ms.items():
        b = budget_ms / 1000.0
        if key == "ttft":
            ok = r.ttft_s is not None and r.ttft_s <= b
        elif key == "e2el":
            ok = r.e2el_s is not None and r.e2el_s <= b
        elif key == "tpot":
            t = tpot_s(r.e2el_s, r.ttft_s, r.output_len)
            ok = True if (r.output_len is not None and r.output_len <= 1) else (t is not None and t <= b)
        elif key == "itl":
            ok = (
                True
                if (r.output_len is not None and r.output_len <= 1)
                else (r.itl_max_s is not None and r.itl_max_s <= b)
            )
        else:
            raise ValueError(f"unknown SLO key {key!r} (known: {', '.join(SLO_KEYS)})")
        if not ok:
            return False
    return True


@dataclass(frozen=True)
class Attainment:
    n: int  # requests, failures included
    good: int  # requests meeting every budget
    failed: int
    attainment: float  # good / n
    goodput_rps: float | None  # good / duration


def joint_attainment(
    requests: Sequence[RequestOutcome], slo_ms: Mapping[str, float], duration_s: float | None = None
) -> Attainment:
    """Attainment ΣI/N with errors in N, and goodput ΣI/T."""
    good = sum(meets_slo(r, slo_ms) for r in requests)
    n = len(requests)
    return Attainment(
        n=n,
        good=good,
        failed=sum(not r.success for r in requests),
        attainment=good / n if n else 0.0,
        goodput_rps=good / duration_s if duration_s else None,
    )


def attainment_bounds(
    per_metric: Mapping[str, tuple[float, float]], completed: int, failed: int
) -> tuple[float, float]:
    """Joint attainment bounds from per-metric bounds [lo_k, hi_k] over successful requests.

    Lower: union bound 1 − Σ(1 − lo_k); upper: min hi_k; both scaled by completed / (completed + failed),
    since failures count as misses.
    """
    n = completed + failed
    if n == 0:
        return 0.0, 0.0
    share = completed / n
    lo = max(0.0, 1.0 - sum(1.0 - lo_k for lo_k, _ in per_metric.values()))
    hi = min((hi_k for _, hi_k in per_metric.values()), default=1.0)
    return lo * share, hi * share


def metric_bounds_from_percentiles(percentiles: Mapping[float, float], budget_ms: float) -> tuple[float, float]:
    """Share of requests within a budget, bounded by the reported percentiles (percentile → value_ms).

    A reported p-th percentile ≤ budget means about p % are within it; one above it means fewer than p %.
    """
    lo, hi = 0.0, 1.0
    for p, v in percentiles.items():
        if v <= budget_ms:
            lo = max(lo, p / 100)
        else:
            hi = min(hi, p / 100)
    return lo, max(lo, hi)


def littles_law_l(arrival_rate: float, mean_time_in_system: float) -> float:
    """L = λ·W."""
    return arrival_rate * mean_time_in_system


# ---------------------------------------------------------------- trend test
#
# Every statistic here is O(n log n) in time and O(n) in memory: a day of stats lines at 10 s (8,640 samples)
# or a million scrapes must not hang the tool. Exact small-sample distributions are used only below a small n.

EXACT_MAX_N = 10  # no ties: exact permutation distribution of S (Mahonian numbers) up to this n
EXACT_TIES_MAX_N = 7  # with ties: enumeration of the 7! = 5,040 orders; above, the tie-corrected normal approximation


@dataclass(frozen=True)
class Trend:
    n: int
    s: int  # Mann-Kendall S = Σ_{i<j} sign(y_j − y_i)
    p_increase: float  # one-sided p-value for an increasing trend
    p_decrease: float  # one-sided p-value for a decreasing trend
    method: str  # 'exact' (permutation distribution) or 'normal' (tie-corrected, continuity-corrected)
    sen_slope: float | None  # median pairwise slope, y-units per x-unit
    ols_slope: float | None  # least-squares slope, y-units per x-unit
    alpha: float  # significance level the caller tests against
    sen_method: str = "all pairs"  # 'all pairs' or 'median of N random pairs (seed S)'

    @property
    def increasing(self) -> bool:
        return self.p_increase < self.alpha and (self.sen_slope or 0) > 0

    @property
    def decreasing(self) -> bool:
        return self.p_decrease < self.alpha and (self.sen_slope or 0) < 0


def _mk_s_naive(y: Sequence[float]) -> int:
    n = len(y)
    return sum((y[j] > y[i]) - (y[j] < y[i]) for i in range(n) for j in range(i + 1, n))


def mk_statistic(y: Sequence[float]) -> int:
    """S = Σ_{i<j} sign(y_j − y_i) in O(n log n): for each j, (earlier values below y_j) − (earlier above),
    counted with a Fenwick tree over the ranks of y (equal values contribute 0)."""
    n = len(y)
    if n < 2:
        return 0
    ranks = {v: i + 1 for i, v in enumerate(sorted(set(y)))}
    m = len(ranks)
    tree = [0] * (m + 1)
    s = 0
    for j, v in enumerate(y):
        r = ranks[v]
        below, i = 0, r - 1
        while i > 0:  # prefix sum of ranks < r
            below += tree[i]
            i -= i & -i
        at_or_below, i = 0, r
        while i > 0:
            at_or_below += tree[i]
            i -= i & -i
        s += below - (j - at_or_below)
        i = r
        while i <= m:
            tree[i] += 1
            i += i & -i
    return s


def _inversion_counts(n: int) -> list[int]:
    """Number of permutations of n items with k inversions (Mahonian numbers), k = 0..n(n−1)/2."""
    counts = [1]
    for m in range(2, n + 1):
        new = [0] * (len(counts) + m - 1)
        for k, c in enumerate(counts):
            for j in range(m):
                new[k + j] += c
        counts = new
    return counts


def _normal_sf(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2))


def _ordered(x: Sequence[float], y: Sequence[float]) -> tuple[list[float], list[float]]:
    """x and y as floats in the order of a stable sort by x; a log's samples come sorted, and then no index list
    and no sort by key (10^6 samples: ~0.5 s and ~50 MB) is needed."""
    if all(a <= b for a, b in zip(x, itertools.islice(x, 1, None))):  # False at a NaN: then sorted as before
        return [float(v) for v in x], [float(v) for v in y]
    order = sorted(range(len(x)), key=lambda i: x[i])
    return [float(x[i]) for i in order], [float(y[i]) for i in order]


def mann_kendall(x: Sequence[float], y: Sequence[float], alpha: float = 0.05) -> Trend:
    """Mann-Kendall trend test of y ordered by x, with Sen's and least-squares slopes; O(n log n).

    p-values: exact permutation distribution of S for n ≤ EXACT_MAX_N without ties (Mahonian numbers) or
    n ≤ EXACT_TIES_MAX_N with ties (enumeration); otherwise the normal approximation with the tie-corrected
    variance [n(n−1)(2n+5) − Σ t(t−1)(2t+5)] / 18 and a continuity correction.
    """
    if len(x) != len(y):
        raise ValueError("x and y differ in length")
    xs, ys = _ordered(x, y)
    n = len(ys)
    s = mk_statistic(ys)
    groups: dict[float, int] = {}
    for v in ys:
        groups[v] = groups.get(v, 0) + 1
    ties = len(groups) < n
    if n < 2:
        p_inc = p_dec = 1.0
        method = "exact"
    elif not ties and n <= EXACT_MAX_N:
        pairs = n * (n - 1) // 2
        counts = _inversion_counts(n)
        total = math.factorial(n)
        d = (pairs - s) // 2  # discordant pairs = inversions
        p_inc = sum(counts[: d + 1]) / total  # P(S ≥ s) = P(inversions ≤ d)
        p_dec = sum(counts[d:]) / total  # P(S ≤ s)
        method = "exact"
    elif ties and n <= EXACT_TIES_MAX_N:
        dist = [_mk_s_naive(perm) for perm in itertools.permutations(ys)]
        p_inc = sum(v >= s for v in dist) / len(dist)
        p_dec = sum(v <= s for v in dist) / len(dist)
        method = "exact"
    else:
        var = (n * (n - 1) * (2 * n + 5) - sum(t * (t - 1) * (2 * t + 5) for t in groups.values())) / 18
        if var <= 0:
            p_inc = p_dec = 1.0
        else:
            z = (s - 1) / math.sqrt(var) if s > 0 else (s + 1) / math.sqrt(var) if s < 0 else 0.0
            p_inc, p_dec = _normal_sf(z), _normal_sf(-z)
        method = "normal (tie-corrected)"
    # Sen's slope over all pairs up to SEN_EXACT_MAX_PAIRS pairs, else over as many random pairs (O(n) memory)
    sen, sen_method = sen_slope(xs, ys, SAMPLE_PAIRS)
    line = ols(xs, ys, with_r2=False)
    return Trend(
        n=n,
        s=s,
        p_increase=p_inc,
        p_decrease=p_dec,
        method=method,
        sen_slope=sen,
        ols_slope=line.slope if line is not None else None,
        alpha=alpha,
        sen_method=sen_method,
    )


# ---------------------------------------------------------------- samples that share a printed second


def spread_ties(t: Sequence[float]) -> list[float]:
    """Times in file order, with the samples that share one printed whole second spread across that second by
    position: the j-th of m samples stamped s gets s + j/m.

    Engines print whole seconds (SGLang logs a batch line every few decode steps, many per second), so equal stamps
    are real order, not simultaneity; a printed stamp s means a time in [s, s + 1). Spreading keeps that order for
    the trend tests and gives Sen's slope a time difference between them. Times that differ are left as they are;
    NaN stays NaN.
    """
    out = [float(x) for x in t]
    i, n = 0, len(out)
    while i < n:
        j = i + 1
        while j < n and out[j] == out[i]:
            j += 1
        m = j - i
        if m > 1 and not math.isnan(out[i]):
            base = out[i]
            for k in range(m):
                out[i + k] = base + k / m
        i = j
    return out


# ---------------------------------------------------------------- queue growth that matters

QUEUE_MIN_RISE = 2.0  # requests: a queue must rise by more than this to be growth (one stuck request is not)
QUEUE_RISE_SHARE = 0.10  # ... and by at least this share of the running batch


def queue_rise_threshold(running_median: float | None) -> float:
    """The rise a queue must exceed to count as growth: max(QUEUE_MIN_RISE, QUEUE_RISE_SHARE × median running).

    A trend test alone calls 0 → 1 growth; a queue of one request next to a batch of 32 is one slow admission
    (or a stuck request: SCH011's), not arrivals outpacing completions."""
    return max(QUEUE_MIN_RISE, QUEUE_RISE_SHARE * (running_median or 0.0))


# ---------------------------------------------------------------- histograms (Prometheus buckets)


@dataclass(frozen=True)
class HistogramQuantile:
    q: float  # the quantile asked, 0-1
    estimate: float  # Prometheus histogram_quantile: linear inside the bucket that holds the rank
    low: float  # the bucket's lower edge: the true quantile is in [low, high]
    high: float  # the bucket's upper edge (inf in the +Inf bucket)
    count: float  # observations in the histogram


def histogram_quantile(buckets: Sequence[tuple[float, float]], q: float) -> HistogramQuantile | None:
    """The q-quantile of a cumulative histogram [(le, count ≤ le)] with its error bounds; None when it is empty.

    As Prometheus's histogram_quantile: rank = q·N, the first bucket whose cumulative count reaches it holds the
    quantile, linearly interpolated between its edges (the lowest bucket from 0 when its edge is positive); in the
    +Inf bucket the estimate is the highest finite edge. The bounds are the edges themselves: a histogram knows a
    quantile only to its bucket.
    """
    if not 0 <= q <= 1:
        raise ValueError(f"quantile must be in [0, 1], got {q}")
    bs = sorted((float(le), float(c)) for le, c in buckets)
    if not bs or bs[-1][1] <= 0:
        return None
    total = bs[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    if bs[0][0] <= 0:
        prev_le = bs[0][0]
    for le, c in bs:
        if c >= rank and c > prev_c:
            if math.isinf(le):
                finite = [b for b, _ in bs if not math.isinf(b)]
                top = finite[-1] if finite else 0.0
                return HistogramQuantile(q, top, top, math.inf, total)
            lo = prev_le if prev_le < le else le
            est = lo + (le - lo) * (rank - prev_c) / (c - prev_c)
            return HistogramQuantile(q, est, lo, le, total)
        prev_le, prev_c = le, c
    return None


# ---------------------------------------------------------------- data-parallel engines


def capacity_lost(throughputs: Sequence[float]) -> float:
    """Share of the engines' combined capacity not delivered: 1 − Σ tput_e / (n · max tput_e).

    What the fleet would gain if every engine generated as fast as the fastest one did in the same window (an upper
    estimate: the fastest engine may have had the most work)."""
    xs = [x for x in throughputs if x is not None and not math.isnan(x)]
    if len(xs) < 2 or max(xs) <= 0:
        return 0.0
    return 1.0 - sum(xs) / (len(xs) * max(xs))


# ---------------------------------------------------------------- speculative acceptance over time

DRIFT_MIN_DROP = 0.10  # a decay must lose at least this share of the series' median acceptance over the window


@dataclass(frozen=True)
class Drift:
    trend: Trend
    window_s: float
    drop: float  # −Sen slope × window: acceptance lost over the window (units of the series)
    median: float
    decaying: bool  # significant decrease (one-sided, α) and drop ≥ DRIFT_MIN_DROP · median


def acceptance_drift(t: Sequence[float], y: Sequence[float], alpha: float = 0.05) -> Drift:
    """Mann-Kendall test for a decrease of acceptance over time, with the Sen drop over the window.

    A few noisy intervals are not drift: the decrease must be significant and lose at least DRIFT_MIN_DROP of the
    median acceptance (0.80 → 0.70 is a decay; 0.54 → 0.45 over five intervals is one only if the test says so)."""
    tr = mann_kendall(t, y, alpha)
    ts = sorted(float(x) for x in t)
    window = ts[-1] - ts[0] if ts else 0.0
    drop = -(tr.sen_slope or 0.0) * window
    ys = sorted(float(v) for v in y)
    med = ys[len(ys) // 2] if len(ys) % 2 else (ys[len(ys) // 2 - 1] + ys[len(ys) // 2]) / 2 if ys else 0.0
    return Drift(tr, window, drop, med, tr.decreasing and drop >= DRIFT_MIN_DROP * med)
