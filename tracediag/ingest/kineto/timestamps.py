"""Kineto timestamps to int64 ns: the value of each event's `ts` (and, where float64 cannot hold its ns, its exact ns)
read from its JSON text while that text is still valid, and the events whose `ts` and `dur` are usable (`_timed`).

Kineto writes µs with a fractional part down to ns ("1712195495505582.988"); above 2**43 µs (epoch-based clocks) a
float64 cannot keep those digits, so the ns are parsed from the text itself.
"""

from __future__ import annotations

import itertools
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracediag.ingest import validate as val
from tracediag.ingest.kineto.events import _Event, _get_dur, _get_ts, _get_ts_ns, _RawTs
from tracediag.ingest.validate import BadRecords

# Above 2**43 µs (~8.8e12, i.e. epoch-based µs clocks) a float64 has a spacing of ≥ 2 ns, so the
# nanosecond digits Kineto writes ("1712195495505582.988") cannot survive a float parse.
_FLOAT_NS_EXACT_LIMIT_US = 2.0**43


def _exact_ts_ns(raw: msgspec.Raw) -> int | None:
    """Decimal µs text -> integer ns, exactly (half-up on the 4th decimal)."""
    b = bytes(raw)
    if not b or b in (b"null",) or len(b) > 64:  # 64 characters: beyond any clock (validated after)
        return None
    try:
        if b"e" in b or b"E" in b:
            d = Decimal(b.decode())
            if not d.is_finite() or d.adjusted() > 30:  # 1e999999999 would expand to a billion digits
                return None
            return int((d * 1000).to_integral_value(rounding=ROUND_HALF_UP))
        whole, _, frac = b.partition(b".")
        ns = abs(int(whole)) * 1000 + int((frac + b"000")[:3])
        if len(frac) > 3 and frac[3:4] >= b"5":
            ns += 1
        return -ns if whole.startswith(b"-") else ns
    except (ValueError, ArithmeticError):
        return None


_TS_TEXT_MAX = 64  # characters: beyond any clock (as _exact_ts_ns)
_US6 = pc.CastOptions(target_type=pa.decimal128(38, 6), allow_decimal_truncate=True)


def _exact_ts_many(raws: list[msgspec.Raw]) -> list[int | None]:
    """`_exact_ts_ns` of every raw `ts` text at once: the texts as one Arrow string column, cast to decimal µs,
    rounded half away from zero to whole ns, whose unscaled decimal digits are the ns. Digits beyond the 6th
    decimal are cut first, which cannot move a value across the half-ns boundary (0.0005 µs). Any text Arrow
    cannot read as a number ('null', a string) sends the whole chunk through the exact per-value parse."""
    n = len(raws)
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    keep = (lengths > 0) & (lengths <= _TS_TEXT_MAX)
    if not n or not keep.all():
        return [_exact_ts_ns(r) for r in raws]
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    text = pa.Array.from_buffers(pa.large_string(), n, [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(raws))])
    try:
        ns = pc.round(pc.cast(text, options=_US6), ndigits=3, round_mode="half_towards_infinity")
        ns = ns.cast(pa.decimal128(38, 3))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return [_exact_ts_ns(r) for r in raws]
    # decimal128 values are 16-byte little-endian two's complement: the unscaled value (ns) fits int64 when the
    # high word is the low word's sign extension
    words = np.frombuffer(ns.buffers()[1], dtype=np.int64)[2 * ns.offset : 2 * (ns.offset + n)].reshape(n, 2)
    lo, hi = words[:, 0], words[:, 1]
    values = lo.tolist()
    fits = hi == (lo >> 63)
    if not fits.all():
        for i in np.flatnonzero(~fits).tolist():
            values[i] = None
    return values


_TS_VALUES = msgspec.json.Decoder(list[Any])


def _ts_from_text(events: list[_Event], exact: bool) -> bool:
    """Replace each event's `ts` text (_EventTsText) with its value, as the typed decode would give it: the texts of
    all the events in one small decode (a JSON array of just them). When `exact`, or when some value is beyond what
    float64 resolves to the ns, also set every `ts_ns` from the text (`_exact_ts_many`, vectorised). Returns whether
    `ts_ns` was set. Raises msgspec.ValidationError for a `ts` the typed decode would reject (1e999)."""
    raws = list(map(_get_ts, events))
    if not raws:
        return exact
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws))
    texts = raws if lengths.all() else [r if len(r) else b"null" for r in raws]  # no `ts` key: None
    values = _TS_VALUES.decode(b"[" + b",".join(texts) + b"]")
    exact = exact or _needs_exact_values(values)
    if exact:
        for e, v, ns in zip(events, values, _exact_ts_many(raws)):
            e.ts = v
            e.ts_ns = ns
    else:
        for e, v in zip(events, values):
            e.ts = v
    return exact


def _set_exact_ts(events: list[_Event], raws: list[_RawTs]) -> None:
    """Each event's `ts_ns` from the raw text of its `ts` (`raws`: the same events, decoded as _RawTs)."""
    if len(raws) != len(events):
        raise ValueError("the events and their raw timestamps differ in number")
    for e, ns in zip(events, _exact_ts_many([r.ts for r in raws])):
        e.ts_ns = ns


def _needs_exact_ts(events: list[_Event]) -> bool:
    return _needs_exact_values(list(map(_get_ts, events)))


def _needs_exact_values(values: list[Any]) -> bool:
    limit = _FLOAT_NS_EXACT_LIMIT_US
    with np.errstate(invalid="ignore"):
        if not (np.abs(val._floats(values)) >= limit).any():  # no value that large at all
            return False
    return any(isinstance(t, float) and (t >= limit or t <= -limit) for t in values)


def _timed(evs: list[_Event], table: str, exact: bool, bad: BadRecords) -> tuple[list[_Event], np.ndarray, np.ndarray]:
    """The events whose `ts` and `dur` are usable, with both in ns (int64 arrays aligned with the events);
    the others are dropped and counted as bad records of `table`.

    Kineto writes µs with a fractional part down to ns; `validate.us_to_ns` converts the integer part apart
    from the fraction (at 1.7e15 µs, float64 × 1000 is off by hundreds of ns). With `exact`, `ts_ns` already
    holds the value parsed from the JSON text (_ts_from_text) and is only range-checked.
    """
    if not evs:
        return evs, np.zeros(0, np.int64), np.zeros(0, np.int64)
    if exact:
        ts, ts_ok = _exact_ns_checked(list(map(_get_ts_ns, evs)))
    else:
        ts, ts_ok = val.us_to_ns(list(map(_get_ts, evs)))
    dur, dur_ok = val.dur_us_to_ns(list(map(_get_dur, evs)))
    ok = ts_ok & dur_ok
    if ok.all():
        return evs, ts, dur
    bad.dropped(table, "ts", [e.ts for e, good in zip(evs, ts_ok) if not good])
    bad.dropped(table, "dur", [e.dur for e, t, d in zip(evs, ts_ok, dur_ok) if t and not d])
    return list(itertools.compress(evs, ok.tolist())), ts[ok], dur[ok]


def _exact_ns_checked(ts_list: list[int | None]) -> tuple[np.ndarray, np.ndarray]:
    """(int64 ns, ok mask) of exact ns values (int, or None where the text was not a number): ok is an int within
    ±TS_NS_MAX (its ns is 0 otherwise). Converted as one array; per value only when some int is beyond int64."""
    lim = val.TS_NS_MAX
    arr = np.array(ts_list, dtype=object)
    missing = np.equal(arr, None)
    arr[missing] = 0
    try:
        ts = arr.astype(np.int64)
    except OverflowError:  # a 30-digit value: the same test, value by value
        ok = np.fromiter((type(t) is int and -lim <= t <= lim for t in ts_list), dtype=bool, count=len(ts_list))
        return np.array([t if good else 0 for t, good in zip(ts_list, ok)], dtype=np.int64), ok
    ok = ~missing & (ts >= -lim) & (ts <= lim)
    ts[~ok] = 0
    return ts, ok
