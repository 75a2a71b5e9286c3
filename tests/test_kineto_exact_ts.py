"""Timestamps in one decode (tracediag/ingest/kineto/timestamps.py): the values and exact ns read from each event's
`ts` text equal what the typed decode and the per-value exact parse give, on a real ns-resolution trace; the array
range check of exact ns equals the per-value one on random values."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

import msgspec
import numpy as np

from tracediag.ingest import kineto
from tracediag.ingest import validate as val

V100 = Path(__file__).parent / "data/external/kineto/hta_v100_ns_resolution.pt.trace.json.gz"


class _TsOnly(msgspec.Struct):
    traceEvents: list[kineto._RawTs]


def test_ts_from_text_equals_the_typed_decode_and_the_exact_parse():
    data = gzip.decompress(V100.read_bytes())
    typed = msgspec.json.decode(data, type=kineto._Trace).traceEvents
    raws = [r.ts for r in msgspec.json.decode(data, type=_TsOnly).traceEvents]
    events = msgspec.json.decode(data, type=kineto._TraceTsText).traceEvents
    assert kineto._ts_from_text(events, False)  # the V100 clock needs exact ns
    assert [e.ts for e in events] == [e.ts for e in typed]
    assert [type(e.ts) for e in events] == [type(e.ts) for e in typed]
    assert [e.ts_ns for e in events[::5]] == [kineto._exact_ts_ns(r) for r in raws[::5]]
    assert any(e.ts is None for e in events) or all(e.ts_ns is not None for e in events)


def test_exact_ns_range_check_equals_the_per_value_check():
    lim = val.TS_NS_MAX

    def reference(ts_list):
        ok = np.fromiter((type(t) is int and -lim <= t <= lim for t in ts_list), dtype=bool, count=len(ts_list))
        return np.array([t if good else 0 for t, good in zip(ts_list, ok)], dtype=np.int64), ok

    rng = random.Random(7)
    pool = [None, 0, 1, -1, lim, lim + 1, -lim, -lim - 1, 2**63 - 1, -(2**63), 10**30, -(10**30), 1712195495505582988]
    for trial in range(2000):
        n = rng.randint(1, 30)
        xs = [rng.choice(pool) if rng.random() < 0.5 else rng.randint(-(2**64), 2**64) for _ in range(n)]
        if trial % 2:
            xs = [x for x in xs if x is None or -(2**63) <= x < 2**63] or [None]
        (ts, ok), (want_ts, want_ok) = kineto._exact_ns_checked(xs), reference(xs)
        assert ts.dtype == want_ts.dtype and ts.tolist() == want_ts.tolist() and ok.tolist() == want_ok.tolist(), xs
