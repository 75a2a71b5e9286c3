"""Interval arithmetic on [start, end) ns intervals (numpy): unions, overlaps, idle gaps.

Time windows are compared as unions, never as sums: two kernels on two streams that run at the same
time are busy time once.
"""

from __future__ import annotations

import numpy as np


def merge_intervals(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Union of [start, end) intervals as sorted, disjoint intervals."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    if starts.size == 0:
        return starts, ends
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    return s[idx], np.maximum.reduceat(e, idx)


def covered(bs: np.ndarray, be: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Length of the disjoint sorted intervals (bs, be) that lies before each point x."""
    x = np.asarray(x, dtype=np.int64)
    if bs.size == 0:
        return np.zeros_like(x, dtype=np.int64)
    cum = np.concatenate(([0], np.cumsum(be - bs)))
    i = np.searchsorted(bs, x, side="right")  # intervals starting at or before x
    j = np.maximum(i - 1, 0)
    last = np.where(i > 0, np.minimum(x, be[j]) - bs[j], 0)
    return np.where(i > 0, cum[j] + np.maximum(last, 0), 0)


def overlap_each(as_: np.ndarray, ae: np.ndarray, bs: np.ndarray, be: np.ndarray) -> np.ndarray:
    """For each interval of A, the length it shares with the union B (B disjoint and sorted)."""
    return covered(bs, be, ae) - covered(bs, be, as_)


def clip(s: np.ndarray, e: np.ndarray, w0: int, w1: int) -> tuple[np.ndarray, np.ndarray]:
    """The parts of the intervals inside [w0, w1)."""
    cs, ce = np.maximum(s, w0), np.minimum(e, w1)
    keep = ce > cs
    return cs[keep], ce[keep]


def gaps(bs: np.ndarray, be: np.ndarray, w0: int, w1: int) -> tuple[np.ndarray, np.ndarray]:
    """The idle intervals of [w0, w1) not covered by the disjoint sorted union (bs, be)."""
    cs, ce = clip(bs, be, w0, w1)
    starts = np.concatenate(([w0], ce))
    ends = np.concatenate((cs, [w1]))
    keep = ends > starts
    return starts[keep], ends[keep]


def subtract(as_: np.ndarray, ae: np.ndarray, bs: np.ndarray, be: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The disjoint sorted union A minus the disjoint sorted union B."""
    out_s: list[int] = []
    out_e: list[int] = []
    for s, e in zip(as_.tolist(), ae.tolist(), strict=True):
        gs, ge = gaps(bs, be, s, e)
        out_s += gs.tolist()
        out_e += ge.tolist()
    return np.array(out_s, dtype=np.int64), np.array(out_e, dtype=np.int64)


_BEFORE_ALL = np.iinfo(np.int64).min  # start of the gap before the first interval
_AFTER_ALL = np.iinfo(np.int64).max  # end of the gap after the last interval


def longest_gap_each(us: np.ndarray, ue: np.ndarray, w0: np.ndarray, w1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each window [w0, w1): the longest part of it that the disjoint sorted union (us, ue) leaves idle,
    as (length, start); length 0 (start undefined) when the union covers the whole window. The first of equal
    longest parts wins. One pass over all windows: gap k of the union (between intervals k−1 and k) is idle
    in a window when it meets it, and the gaps a window meets are k = lo..hi."""
    us, ue = np.asarray(us, dtype=np.int64), np.asarray(ue, dtype=np.int64)
    w0, w1 = np.asarray(w0, dtype=np.int64), np.asarray(w1, dtype=np.int64)
    n, m = w0.size, us.size
    if n == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    lo = np.searchsorted(ue, w0, side="right")  # first interval that ends after the window starts
    hi = np.maximum(np.searchsorted(us, w1, side="left"), lo)  # first interval that starts at or after its end
    counts = hi - lo + 1
    offsets = np.concatenate(([0], np.cumsum(counts)[:-1]))
    seg = np.repeat(np.arange(n), counts)
    k = lo[seg] + (np.arange(int(counts.sum())) - offsets[seg])
    if m:
        gap_s = np.where(k > 0, ue[np.maximum(k - 1, 0)], _BEFORE_ALL)
        gap_e = np.where(k < m, us[np.minimum(k, m - 1)], _AFTER_ALL)
    else:
        gap_s = np.full(k.size, _BEFORE_ALL, dtype=np.int64)
        gap_e = np.full(k.size, _AFTER_ALL, dtype=np.int64)
    start = np.maximum(gap_s, w0[seg])
    length = np.maximum(np.minimum(gap_e, w1[seg]) - start, 0)
    best = np.maximum.reduceat(length, offsets)
    at_best = np.flatnonzero(length == best[seg])
    first = at_best[np.searchsorted(seg[at_best], np.arange(n), side="left")]
    return best, start[first]


def total(s: np.ndarray, e: np.ndarray) -> int:
    return int((np.asarray(e) - np.asarray(s)).sum()) if len(s) else 0
