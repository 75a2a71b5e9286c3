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


def total(s: np.ndarray, e: np.ndarray) -> int:
    return int((np.asarray(e) - np.asarray(s)).sum()) if len(s) else 0
