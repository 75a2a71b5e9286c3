"""The validation layer every ingester runs its values through: what the store can hold, or a counted bad record.

Input files are untrusted: a value can be out of range (a 401-digit integer, 1e30 µs, a rank of 2**40), wrongly
typed (a blob in an integer column, a list where a name belongs) or undecodable (invalid UTF-8). Each such value
becomes one of two things, never an exception inside the ingester:

- a **bad record**, counted and reported (`inputs.bad_records`, details in `inputs.meta_json` → `bad_records`:
  per field, how many, what was done, a few examples). The record is dropped when the value is one it cannot
  be placed without (the timestamp or duration of an event, the process of a GPU row), else the value is set to
  NULL and the record kept. The rest of the file still counts.
- an **InputError** naming the file and the field, for a value the whole file depends on (the rank of a trace).

Bounds (`TS_NS_MAX`, ...) are chosen so that no derivation downstream can overflow 64-bit arithmetic: a timestamp
plus a duration, a sum over every event, elements × element size. They are far beyond any real capture.

The functions are small and work on one column (a list of decoded values) at a time, so a decoder that reads a
file in chunks can run them chunk by chunk with one `BadRecords` per input.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1
TS_NS_MAX = 2**62  # |timestamp| ≤ 2**62 ns ≈ 146 years either side of the clock's zero (epoch clocks to 2116)
DUR_NS_MAX = 2**52  # duration ≤ 2**52 ns ≈ 52 days; ts + dur stays below 2**63
RANK_MAX = 2**24 - 1  # ranks, world and group sizes ≤ 16.7 M
COUNT_MAX = 2**48  # elements, bytes: ≤ 256 Ti; × a 16-byte element stays below 2**53
ID_MAX = INT64_MAX  # correlation / external / flow ids, sequence numbers: any signed 64-bit value
MAX_EXAMPLES = 3
_EXAMPLE_CHARS = 80

_BAD = object()  # sentinel of a rejected value inside a column pass


@dataclass
class _Field:
    count: int = 0
    action: str = ""
    examples: list[str] = field(default_factory=list)


@dataclass
class BadRecords:
    """Bad values found in one input file: per field ("kernels.ts", "args.Group size"), how many, what was done,
    and the first few examples; `records` counts the records affected (dropped, or kept with a value set to NULL).
    """

    fields: dict[str, _Field] = field(default_factory=dict)
    _dropped: int = 0
    _nulled: dict[str, set[int]] = field(default_factory=dict)  # table -> indices of kept rows with a NULLed value
    _extra: int = 0  # records counted without a row index (whole lines, entries)

    @property
    def records(self) -> int:
        return self._dropped + self._extra + sum(len(s) for s in self._nulled.values())

    def __bool__(self) -> bool:
        return bool(self.fields)

    def note(self, name: str, action: str, examples: list[Any], count: int | None = None) -> None:
        f = self.fields.setdefault(name, _Field(action=action))
        f.count += len(examples) if count is None else count
        for v in examples[: MAX_EXAMPLES - len(f.examples)]:
            f.examples.append(example(v))

    def dropped(self, table: str, name: str, examples: list[Any]) -> None:
        """Records of `table` dropped because of their `name` value."""
        if examples:
            self.note(f"{table}.{name}", "record dropped", examples)
            self._dropped += len(examples)

    def nulled(
        self, table: str, name: str, rows: list[int], examples: list[Any], action: str = "value set to NULL"
    ) -> None:
        """Values of kept rows (indices `rows` of `table`) set to NULL (or as `action` says)."""
        if rows:
            self.note(f"{table}.{name}", action, examples, len(rows))
            self._nulled.setdefault(table, set()).update(rows)

    def skipped(self, name: str, action: str, examples: list[Any]) -> None:
        """Records without a row index (lines, entries, single values of a file): one per example."""
        if examples:
            self.note(name, action, examples)
            self._extra += len(examples)

    def to_meta(self) -> dict[str, Any] | None:
        if not self.fields:
            return None
        return {
            "records": self.records,
            "fields": {
                k: {"count": f.count, "action": f.action, "examples": f.examples}
                for k, f in sorted(self.fields.items())
            },
        }


def example(v: Any) -> str:
    """A short, printable rendering of a bad value (never the whole 1 MiB string, never a deep repr)."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v[:_EXAMPLE_CHARS])
        return f"bytes {b!r}" + (f" … ({len(v)} bytes)" if len(v) > _EXAMPLE_CHARS else "")
    if isinstance(v, str):
        s = v[:_EXAMPLE_CHARS].encode("utf-8", "backslashreplace").decode()
        return repr(s) + (f" … ({len(v)} characters)" if len(v) > _EXAMPLE_CHARS else "")
    if isinstance(v, int) and not isinstance(v, bool):
        digits = v.bit_length() * 0.30103
        return str(v) if digits < 40 else f"an integer of about {digits:.0f} digits"
    if isinstance(v, (list, tuple)):
        return f"a list of {len(v)}"
    if isinstance(v, dict):
        return f"an object of {len(v)} keys"
    return repr(v)[:_EXAMPLE_CHARS]


# --- one value -------------------------------------------------------------------------------------------------


def _int_or_bad(v: Any, lo: int, hi: int) -> Any:
    """An integer in [lo, hi] from an int, an integral float or a numeric string ("128", "0x1f"); else _BAD."""
    if type(v) is int:
        return v if lo <= v <= hi else _BAD
    if isinstance(v, bool):
        return _BAD
    if isinstance(v, float):
        return int(v) if math.isfinite(v) and v == int(v) and lo <= v <= hi else _BAD
    if isinstance(v, str):
        s = v.strip()
        if not s or len(s) > 24:
            return _BAD
        try:
            n = int(s, 16) if s[:2].lower() == "0x" else int(s) if s.lstrip("+-").isdecimal() else int(float(s))
        except (ValueError, OverflowError):
            return _BAD
        return n if lo <= n <= hi else _BAD
    if isinstance(v, int):  # numpy or other int subclasses
        return int(v) if lo <= v <= hi else _BAD
    return _BAD


def int_or_none(v: Any, lo: int = -INT64_MAX - 1, hi: int = INT64_MAX) -> int | None:
    """One value as an int in [lo, hi], else None (for facts of a file, not columns)."""
    if v is None:
        return None
    out = _int_or_bad(v, lo, hi)
    return None if out is _BAD else out


def str_or_bad(v: Any) -> Any:
    """A scalar as text (numbers as written); a list, object or other structure is _BAD."""
    if type(v) is str:
        return v
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v) if v.bit_length() < 256 else _BAD
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else _BAD
    if isinstance(v, str):
        return str(v)
    return _BAD


def json_text(v: Any) -> str | None:
    """JSON text of a decoded value for a *_json column; None when it cannot be written (integers beyond
    64 bits, nesting deeper than orjson writes, non-string keys)."""
    try:
        return orjson.dumps(v).decode()
    except (orjson.JSONEncodeError, TypeError):
        return None


# --- one column ----------------------------------------------------------------------------------------------


def ints(values: list[Any], lo: int, hi: int) -> tuple[list[int | None], list[int]]:
    """Optional integers: (values with each bad one set to None, indices of the bad ones). None stays None."""
    bad = 0

    def slow(v: Any) -> Any:
        nonlocal bad
        out = _int_or_bad(v, lo, hi)
        if out is _BAD:
            bad += 1
        return out

    out = [v if v is None or (type(v) is int and lo <= v <= hi) else slow(v) for v in values]
    if not bad:
        return out, []
    idx = [i for i, v in enumerate(out) if v is _BAD]
    for i in idx:
        out[i] = None
    return out, idx


def strs(values: list[Any]) -> tuple[list[str | None], list[int]]:
    """Optional text: scalars as text, structures (lists, objects) set to None and reported."""
    bad = 0

    def slow(v: Any) -> Any:
        nonlocal bad
        out = str_or_bad(v)
        if out is _BAD:
            bad += 1
        return out

    out = [v if v is None or type(v) is str else slow(v) for v in values]
    if not bad:
        return out, []
    idx = [i for i, v in enumerate(out) if v is _BAD]
    for i in idx:
        out[i] = None
    return out, idx


def utf8(raws: list[bytes | None]) -> tuple[list[str | None], list[int]]:
    """Raw bytes (verbatim JSON fragments, SQLite text) -> text; invalid UTF-8 set to None and reported."""
    out: list[str | None] = []
    idx: list[int] = []
    for i, b in enumerate(raws):
        if b is None:
            out.append(None)
            continue
        try:
            out.append(b.decode("utf-8"))
        except UnicodeDecodeError:
            out.append(None)
            idx.append(i)
    return out, idx


def has_surrogates(s: str) -> bool:
    """True for text that cannot be written as UTF-8 (lone surrogates, e.g. from undecodable bytes)."""
    if s.isascii():
        return False
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(values: list[Any]) -> tuple[list[Any], list[int]]:
    """Text that cannot be written as UTF-8 -> the same text with U+FFFD in place of what was undecodable;
    returns (values, indices replaced). Non-text values are left for `strs`."""
    idx = [i for i, v in enumerate(values) if type(v) is str and not v.isascii() and has_surrogates(v)]
    if not idx:
        return values, []
    out = list(values)
    for i in idx:
        if _escaped(out[i]):  # undecodable bytes kept by surrogateescape: U+FFFD for each, as a decoder would
            out[i] = out[i].encode("utf-8", "surrogateescape").decode("utf-8", "replace")
        else:  # lone surrogates from a \ud800 escape (JSON): U+FFFD each ("replace" on encoding would give "?")
            out[i] = _SURROGATE.sub("\ufffd", out[i])
    return out, idx


def _escaped(s: str) -> bool:
    """Surrogates from `surrogateescape` decoding only (U+DC80-U+DCFF), which re-encode to the original bytes."""
    return all("\udc80" <= c <= "\udcff" for c in s if "\ud800" <= c <= "\udfff")


_NUMBER_TYPES = frozenset({float, int})


def _arrow_numbers(values: list[Any]) -> pa.Array | None:
    """`values` as one Arrow int64, float64 or all-null array when they are numbers or None, converted in C (Arrow
    refuses text, bools, structures and integers beyond int64); None when they are not."""
    try:
        arr = pa.array(values)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):
        return None
    return arr if arr.type in (pa.int64(), pa.float64(), pa.null()) else None


def _floats(values: list[Any], none: float = math.nan) -> np.ndarray:
    """Numbers -> float64 (`none` for None; NaN for anything else — text, lists, true — and for integers no float
    can hold)."""
    arr = _arrow_numbers(values)
    if arr is not None and arr.type != pa.null():
        inferred_double = arr.type == pa.float64()
        try:  # an int64 column beyond 2**53 is not exact in float64: the cast refuses it (the path below rounds)
            out = arr.cast(pa.float64()).fill_null(none).to_numpy(zero_copy_only=False, writable=True)
        except pa.ArrowInvalid:
            pass
        else:
            if inferred_double:  # Arrow reads true/false after a float as 1.0/0.0: not numbers here (NaN, as below)
                for i in np.flatnonzero((out == 0.0) | (out == 1.0)).tolist():
                    if type(values[i]) is bool:
                        out[i] = math.nan
            return out
    if not math.isnan(none):
        values = [none if v is None else v for v in values]
    if set(map(type, values)) <= _NUMBER_TYPES:  # numpy alone would also parse "12" and [1, 2] (and True)
        try:
            return np.array(values, dtype=np.float64)
        except OverflowError:
            pass

    def one(v: Any) -> float:
        if type(v) is float:
            return v
        if isinstance(v, int) and not isinstance(v, bool):
            return float(v) if -(2**1000) < v < 2**1000 else math.nan
        return math.nan

    return np.array([one(v) for v in values], dtype=np.float64)


def us_to_ns(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Microsecond timestamps (int or float) -> (int64 ns, ok mask). Not a number, not finite or beyond ±TS_NS_MAX
    is not ok (its ns is 0). The integer part is converted apart from the fraction, so float64 rounding of
    1.7e15 µs × 1000 does not move the nanoseconds Kineto wrote."""
    ts = _floats(values)
    ok = np.isfinite(ts) & (np.abs(ts) <= TS_NS_MAX / 1000)
    res = np.zeros(len(ts), dtype=np.int64)
    good = ts[ok]
    whole = np.floor(good)
    res[ok] = whole.astype(np.int64) * 1000 + np.rint((good - whole) * 1000).astype(np.int64)
    return res, ok


def dur_us_to_ns(values: list[Any]) -> tuple[np.ndarray, np.ndarray]:
    """Microsecond durations -> (int64 ns ≥ 0, ok mask). A missing duration is 0 (ok); a negative one is clamped to
    0 (`negative_duration` tells the ones that were at least 1 ns below it, a bad record); not a number, not finite
    or beyond DUR_NS_MAX is not ok."""
    d = _floats(values, none=0.0)
    ok = np.isfinite(d) & (np.abs(d) <= DUR_NS_MAX / 1000)
    res = np.zeros(len(d), dtype=np.int64)
    res[ok] = np.maximum(np.rint(d[ok] * 1000), 0).astype(np.int64)
    return res, ok


def negative_duration(v: Any) -> bool:
    """A duration in µs that `dur_us_to_ns` clamped to 0 from at least 1 ns below it (not float rounding of an
    ns-resolution clock, which leaves a fraction of a ns)."""
    return type(v) in _NUMBER_TYPES and math.isfinite(v) and v * 1000 < -0.5  # np.rint(-0.5) is -0


def int_list(v: Any, lo: int = -(2**31), hi: int = INT32_MAX, max_len: int = 1 << 16) -> Any:
    """A list of integers in [lo, hi] (grid/block dims, ranks of a group); None stays None; else _BAD."""
    if v is None:
        return None
    if type(v) is not list or len(v) > max_len or not all(type(x) is int and lo <= x <= hi for x in v):
        return _BAD
    return v


def int_lists(values: list[Any], lo: int = -(2**31), hi: int = INT32_MAX) -> tuple[list[Any], list[int]]:
    out = [int_list(v, lo, hi) for v in values]
    idx = [i for i, v in enumerate(out) if v is _BAD]
    for i in idx:
        out[i] = None
    return out, idx


def is_bad(v: Any) -> bool:
    return v is _BAD


# --- Arrow columns of one table ----------------------------------------------------------------------------

_TYPE_RANGE = {pa.int8(): 2**7, pa.int16(): 2**15, pa.int32(): 2**31, pa.int64(): 2**63}


class Checker:
    """Column conversions for one table of one input; every bad value is counted in `bad` under
    "<table>.<field>" (field as the input names it: "ts", "args.Group size", "deviceId")."""

    def __init__(self, bad: BadRecords, table: str) -> None:
        self.bad = bad
        self.table = table

    def int_values(self, name: str, values: list[Any], lo: int, hi: int) -> list[int | None]:
        out, idx = ints(values, lo, hi)
        if idx:
            self.bad.nulled(self.table, name, idx, [values[i] for i in idx])
        return out

    def ints(self, name: str, values: list[Any], typ: pa.DataType, lo: int | None = None, hi: int | None = None):
        half = _TYPE_RANGE[typ]
        lo = -half if lo is None else lo
        hi = half - 1 if hi is None else hi
        arr = _arrow_numbers(values)  # integers (or None) all within [lo, hi]: converted in C, nothing to check
        if arr is not None and arr.type != pa.float64():
            if arr.type == pa.null():
                return pa.nulls(len(values), typ)
            import pyarrow.compute as pc  # here: a module that imports this one may never need Arrow compute

            bounds = pc.min_max(arr)
            if bounds["min"].as_py() >= lo and bounds["max"].as_py() <= hi:
                return arr.cast(typ)
        return pa.array(self.int_values(name, values, lo, hi), typ)

    def str_values(self, name: str, values: list[Any]) -> list[str | None]:
        out, idx = strs(values)
        if idx:
            self.bad.nulled(self.table, name, idx, [values[i] for i in idx])
        out, idx = clean_text(out)
        if idx:
            self.bad.note(f"{self.table}.{name}", "undecodable characters replaced by U+FFFD", [out[i] for i in idx])
            self.bad._nulled.setdefault(self.table, set()).update(idx)
        return out

    def strs(self, name: str, values: list[Any]) -> pa.Array:
        """Text column; Arrow converts a homogeneous list of str (or of ints: pid/tid) in C, anything else
        goes through `strs` and `clean_text`."""
        try:
            arr = pa.array(values)
            if arr.type == pa.string() or pa.types.is_null(arr.type):
                return arr.cast(pa.string())
            if pa.types.is_integer(arr.type):
                return arr.cast(pa.string())
        except (pa.ArrowException, OverflowError, TypeError, ValueError, UnicodeError):
            pass
        return pa.array(self.str_values(name, values), pa.string())

    def raw_text(self, name: str, raws: list[bytes | None]) -> pa.Array:
        """Verbatim bytes (JSON fragments such as Input Dims) -> text; invalid UTF-8 set to NULL."""
        try:
            return pa.array(raws, pa.binary()).cast(pa.string())
        except pa.ArrowInvalid:
            out, idx = utf8(raws)
            self.bad.nulled(self.table, name, idx, [raws[i] for i in idx])
            return pa.array(out, pa.string())

    def int_lists(self, name: str, values: list[Any]) -> pa.Array:
        out, idx = int_lists(values)
        if idx:
            self.bad.nulled(self.table, name, idx, [values[i] for i in idx])
        return pa.array(out, pa.list_(pa.int32()))
