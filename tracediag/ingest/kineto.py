"""PyTorch profiler (Kineto) Chrome-trace JSON -> canonical columnar tables.

One call parses one rank file and returns Arrow tables shaped like `store/schema.sql`.
The whole file is decoded in one pass by msgspec into typed structs that keep only the fields
the schema needs (unknown keys are skipped inside the decoder, not materialised as dicts), then
each category is turned into columns with list comprehensions and numpy. That is the parse floor
on this hardware: see benchmarks/bench_ingest.py.

Field names are the ones Kineto and PyTorch write (pytorch/kineto libkineto/src/output_json.cpp,
torch/csrc/profiler/util.h).

Every value goes through `tracediag.ingest.validate`: an event whose `ts` or `dur` is not a finite number in
range is dropped, an out-of-range or wrongly typed arg (a 2**40 group size, invalid UTF-8 in `Input Dims`) is
set to NULL, and both are counted in the input's `bad_records`; the rank of the file, when present and not a
rank, is an InputError naming `distributedInfo.rank`.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import mmap
import operator
import os
import re
import zlib
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from tracediag.catalog import classify_cpu_op, classify_kernel
from tracediag.errors import InputError
from tracediag.ingest import validate as val
from tracediag.ingest.base import NAMED_TABLES, IngestOptions, Parsed, SpilledTable, long_names
from tracediag.ingest.jsonstream import MAX_ITEM_CHUNKS, ArrayChunks, NotAnArray, map_file
from tracediag.ingest.validate import BadRecords
from tracediag.inputfile import open_stream, too_large
from tracediag.interrupt import checkpoint
from tracediag.memory import chunk_bytes, decode_chunk_bytes, read_bytes_budget, spill_bytes

_EMPTY = msgspec.Raw(b"")


class _Args(msgspec.Struct, omit_defaults=True, gc=False):
    # Kineto writes some of these as numbers in one version and strings in another: Any keeps the
    # decoder from rejecting a real trace over a type it does not need to interpret.
    external_id: Any = msgspec.field(name="External id", default=None)
    device: Any = None
    stream: Any = None
    correlation: Any = None
    grid: Any = None
    block: Any = None
    bytes: Any = None
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=_EMPTY)
    input_types: msgspec.Raw = msgspec.field(name="Input type", default=_EMPTY)
    coll_name: Any = msgspec.field(name="Collective name", default=None)
    in_nelems: Any = msgspec.field(name="In msg nelems", default=None)
    out_nelems: Any = msgspec.field(name="Out msg nelems", default=None)
    in_size_old: Any = msgspec.field(name="In msg size", default=None)
    out_size_old: Any = msgspec.field(name="Out msg size", default=None)
    group_size: Any = msgspec.field(name="Group size", default=None)
    dtype: Any = None
    pg_name: Any = msgspec.field(name="Process Group Name", default=None)
    pg_id_old: Any = msgspec.field(name="Process Group ID", default=None)
    pg_desc: Any = msgspec.field(name="Process Group Description", default=None)
    pg_ranks: Any = msgspec.field(name="Process Group Ranks", default=None)
    seq: Any = msgspec.field(name="Seq", default=None)


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: Any = ""
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    id: Any = None
    args: _Args | None = None
    # Not Chrome-trace keys: filled by _timed (ts_ns from the raw JSON text when float64 cannot hold ns, see
    # _exact_ts), once both are validated.
    # (Any: a JSON key of the same name must not fail the decode; both are overwritten)
    ts_ns: Any = None
    dur_ns: Any = 0


class _RawTs(msgspec.Struct, gc=False):
    ts: msgspec.Raw = _EMPTY


class _EventTsText(_Event, gc=False):
    """An event as decoded: `ts` as its JSON text, turned into its value (and, when float64 cannot hold its ns, into
    exact integer ns) for all the events of a chunk at once by `_ts_from_text` while the text is still valid."""

    ts: msgspec.Raw = _EMPTY


# Above 2**43 µs (~8.8e12, i.e. epoch-based µs clocks) a float64 has a spacing of ≥ 2 ns, so the
# nanosecond digits Kineto writes ("1712195495505582.988") cannot survive a float parse.
_FLOAT_NS_EXACT_LIMIT_US = 2.0**43


class _Trace(msgspec.Struct):
    traceEvents: list[_Event] | None = None
    distributedInfo: Any = None
    deviceProperties: Any = None


_TraceOrArray = _Trace | list[_Event]


class _TraceTsText(msgspec.Struct):
    traceEvents: list[_EventTsText] | None = None
    distributedInfo: Any = None
    deviceProperties: Any = None


_TraceOrArrayTsText = _TraceTsText | list[_EventTsText]


class _TraceItems(msgspec.Struct):
    """A trace whose events are kept as raw JSON items, for a file where some item does not decode as _Event."""

    traceEvents: list[msgspec.Raw] | None = None
    distributedInfo: Any = None
    deviceProperties: Any = None


class _EventAnyArgs(_Event, gc=False):
    """An event whose `args` is not an object (a string, a number, a list): decoded as it is, then dropped."""

    args: Any = None


class _Loose(msgspec.Struct, gc=False):
    """The two fields an object item can fail _Event's decode on, as written."""

    ph: Any = ""


_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])
_EVENT = msgspec.json.Decoder(_Event)
_EVENT_ANY_ARGS = msgspec.json.Decoder(_EventAnyArgs)
_LOOSE = msgspec.json.Decoder(_Loose)
_RAW_TS_ONE = msgspec.json.Decoder(_RawTs)


def _item_text(raw: msgspec.Raw) -> str:
    return bytes(memoryview(raw)[:80]).decode("utf-8", "replace")


def _events_one_by_one(items: list[msgspec.Raw], bad: BadRecords) -> tuple[list[_Event], list[msgspec.Raw]]:
    """(events, their raw items) of a chunk where some item is not an event: each item decoded alone. An item
    that is not an object (null, a number, a list) or whose `ph` is not text is dropped; an `args` that is not an
    object is dropped from its event, which is kept. Each is a bad record (`traceEvents`, `traceEvents.ph`,
    `traceEvents.args`); the other events of the chunk are kept as they are."""
    events: list[_Event] = []
    kept: list[msgspec.Raw] = []
    for raw in items:
        try:
            events.append(_EVENT.decode(raw))
            kept.append(raw)
            continue
        except msgspec.ValidationError:
            pass
        try:
            loose = _LOOSE.decode(raw)
        except msgspec.ValidationError:  # not an object
            bad.skipped("traceEvents", "record dropped (not an event object)", [_item_text(raw)])
            continue
        if type(loose.ph) is not str:
            bad.skipped("traceEvents.ph", "record dropped (ph is not text)", [loose.ph])
            continue
        try:
            e = _EVENT_ANY_ARGS.decode(raw)
        except msgspec.ValidationError:  # no field is typed but ph and args: not reached
            bad.skipped("traceEvents", "record dropped (not an event object)", [_item_text(raw)])
            continue
        bad.skipped("traceEvents.args", "args set to NULL (not an object), event kept", [e.args])
        e.args = None
        events.append(e)
        kept.append(raw)
    return events, kept


def _raw_ts_of(items: list[msgspec.Raw]) -> list[_RawTs]:
    return [_RAW_TS_ONE.decode(r) for r in items]


# Markers worth keeping from the (skipped) python_function events: vLLM V0 and V1 model runners
# show their per-step `execute_model` only as a Python frame (CATALOG.md section 4).
_PY_STEP_MARKER = re.compile(r"(?:^|\s|/)\w*model_runner\w*\.py\(\d+\): execute_model$")
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)", re.IGNORECASE)


def read_bytes(path: Path, limit: int | None = None, why: str = "") -> bytes | mmap.mmap:
    """Whole-file bytes; gzip is detected by magic number, not by the file name, and decompressed within the read
    budget (a plain file is mapped, not read). `why` says why the file is read whole (for the budget's error)."""
    try:
        stream, gz = open_stream(path, "trace", limit)
        with stream as f:
            if gz:
                budget = read_bytes_budget(limit)
                try:
                    data = f.read(budget + 1)  # decompressed as it is read: never more than this is made
                except (OSError, EOFError, zlib.error) as exc:
                    raise InputError(path, f"corrupt or truncated gzip data ({exc})") from None
                if len(data) > budget:
                    err = too_large(path, "the trace", None, limit)
                    raise InputError(path, f"{why}; {err.problem}" if why else err.problem) from None
                return data
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise InputError(path, "file is empty")
            # mmap: the decoder reads straight from the page cache, no second copy of a 1 GB file.
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise InputError(path, f"cannot read file ({exc.strerror or exc})") from None


def _ends_whole(data: bytes | mmap.mmap) -> bool:
    """The JSON text ends with its closing bracket (so a 'truncated' from the decoder means a bad escape)."""
    tail = data[-64:] if len(data) >= 64 else data[:]
    return bytes(tail).rstrip().endswith((b"}", b"]"))


def _decode(
    path: Path, data: bytes | mmap.mmap, bad: BadRecords
) -> tuple[list[_Event], dict[str, Any], list[msgspec.Raw] | None]:
    """(events, top-level facts, the events' raw items when some item was not an event and they were decoded one
    by one (else None); the dropped items are counted in `bad`)."""
    try:  # one decode, `ts` as text (its value and exact ns from the text: _ts_from_text)
        doc = msgspec.json.decode(data, type=_TraceOrArrayTsText)
        _ts_from_text(doc if isinstance(doc, list) else doc.traceEvents or [], False)
    except msgspec.ValidationError:  # some value does not decode (a `ts` too: 1e999): as typed, which names it
        doc = None
    except (msgspec.DecodeError, RecursionError):
        doc = None  # the typed decode below names the problem
    try:
        if doc is None:
            doc = msgspec.json.decode(data, type=_TraceOrArray)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        if msg.startswith("Number out of range"):  # e.g. 1e999: no float holds it
            raise InputError(path, f"a number too large for any float ({msg})") from None
        try:  # an item that is not an event: the file's events one by one
            loose = msgspec.json.decode(data, type=_TraceItems | list[msgspec.Raw])
            items = loose if isinstance(loose, list) else loose.traceEvents
            if items is None:
                raise InputError(path, "JSON, but not a Chrome/Kineto trace: no 'traceEvents' array") from None
            events, kept = _events_one_by_one(items, bad)
        except msgspec.ValidationError:
            raise InputError(path, f"JSON, but not a Chrome/Kineto trace: {msg}") from None
        except (msgspec.DecodeError, RecursionError) as inner:
            # raised in this handler, the clauses below do not see it (an item nested too deep, or with invalid
            # UTF-8 that only its own decode checks): the same error as a whole-file decode gives
            raise _not_json(path, data, inner) from None
        top = {} if isinstance(loose, list) else {"distributedInfo": loose.distributedInfo,
                                                  "deviceProperties": loose.deviceProperties}  # fmt: skip
        return events, top, kept
    except (msgspec.DecodeError, RecursionError) as exc:
        raise _not_json(path, data, exc) from None
    if isinstance(doc, list):
        return doc, {}, None
    if doc.traceEvents is None:
        raise InputError(path, "JSON, but not a Chrome/Kineto trace: no 'traceEvents' array")
    return doc.traceEvents, {"distributedInfo": doc.distributedInfo, "deviceProperties": doc.deviceProperties}, None


def _not_json(path: Path, data: bytes | mmap.mmap, exc: Exception) -> InputError:
    """The input error of a decode that failed on the JSON itself: truncated, an invalid escape or byte, or nested
    deeper than the interpreter's recursion limit (msgspec stops there: no trace nests like this)."""
    if isinstance(exc, RecursionError):
        return InputError(path, "JSON nested too deep to be a trace (hundreds of levels of [ or {)")
    msg = str(exc)
    if "truncated" in msg.lower() and not _ends_whole(data):
        return InputError(path, f"truncated JSON ({msg}); was the profiler stopped mid-write?")
    if "truncated" in msg.lower():
        msg = "an invalid string escape, such as a lone \\ud800 surrogate"
    hint = "; NaN and Infinity are not JSON numbers" if "invalid character" in msg else ""
    return InputError(path, f"not valid JSON ({msg}{hint})")


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


_get_ts = operator.attrgetter("ts")
_get_ts_ns = operator.attrgetter("ts_ns")
_get_dur = operator.attrgetter("dur")
_get_name = operator.attrgetter("name")
_get_pid = operator.attrgetter("pid")
_get_tid = operator.attrgetter("tid")
_get_cat = operator.attrgetter("cat")
_get_args = operator.attrgetter("args")


def _needs_exact_ts(events: list[_Event]) -> bool:
    return _needs_exact_values(list(map(_get_ts, events)))


def _needs_exact_values(values: list[Any]) -> bool:
    limit = _FLOAT_NS_EXACT_LIMIT_US
    with np.errstate(invalid="ignore"):
        if not (np.abs(val._floats(values)) >= limit).any():  # no value that large at all
            return False
    return any(isinstance(t, float) and (t >= limit or t <= -limit) for t in values)


class _NeedsExact(Exception):
    """A later chunk holds timestamps float64 cannot resolve: the file is parsed again, all exact."""


class _ChunkFailed(Exception):
    """The chunked decode could not split the file: it is decoded whole, which names the problem. The message says
    what the chunked decode met (for a file too large to decode whole)."""


@contextlib.contextmanager
def _gc_paused():
    """No cyclic GC while hundreds of thousands of acyclic objects are made: each collection would walk them
    all (the structs are untracked, gc=False, but their lists, tuples and strings' containers are not)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def parse_kineto(path: str | Path, order: int = 0, options: IngestOptions | None = None) -> Parsed:
    """Parse one Kineto trace file. Raises InputError naming the file on any problem.

    The `traceEvents` array is decoded in chunks of `decode_chunk_bytes(options.memory_limit)` bytes
    (`tracediag.ingest.jsonstream`), each chunk turned into columns before the next is decoded, so memory
    stays within the budget plus the columnar tables whatever the file size. A file the chunker cannot
    split (malformed JSON, a value of the wrong type) is decoded whole, which names the problem exactly.
    """
    p = Path(path)
    opts = options or IngestOptions()
    with _gc_paused():
        try:
            return _parse_chunked(p, order, opts, exact=False)
        except _NeedsExact:
            return _parse_chunked(p, order, opts, exact=True)
        except _ChunkFailed as exc:
            return _parse_whole(p, order, opts, str(exc))


def _parse_whole(p: Path, order: int, opts: IngestOptions, why: str = "") -> Parsed:
    whole = f"it cannot be read in chunks ({why}) and must be decoded whole" if why else ""
    data = read_bytes(p, opts.memory_limit, whole)
    try:
        bad = BadRecords()
        events, top, items = _decode(p, data, bad)
        b = _Builder(p, order, opts, exact=_needs_exact_ts(events), bad=bad)
        if b.exact and items is not None:  # (decoded whole: `ts_ns` already set from the text by _decode)
            _set_exact_ts(events, _raw_ts_of(items))
        del items
        b.add(events)
        del events
        return b.finish(top)
    finally:
        if isinstance(data, mmap.mmap):
            # msgspec.Raw values point into the map; they were converted to str in _build.
            with contextlib.suppress(BufferError):
                data.close()


_EVENTS_TS_TEXT = msgspec.json.Decoder(list[_EventTsText])
_TOP = msgspec.json.Decoder(_Trace)


def _open_stream(p: Path, limit: int | None) -> tuple[Any, mmap.mmap | None]:
    """(the file's stream, a private map of it when it is plain JSON: ArrayChunks decodes the map where it lies)."""
    stream, gz = open_stream(p, "trace", limit)  # a gzip stream is bounded (a gzip bomb is an InputError)
    if not gz and os.fstat(stream.fileno()).st_size == 0:
        stream.close()
        raise InputError(p, "file is empty")
    return stream, None if gz else map_file(stream)


def _parse_chunked(p: Path, order: int, opts: IngestOptions, exact: bool) -> Parsed:
    stream, mapped = _open_stream(p, opts.memory_limit)
    b = _Builder(p, order, opts, exact=exact)

    def decode(chunk: memoryview) -> tuple[list[_Event], bool]:
        """(events, whether their `ts_ns` is set from the text). `chunk` is valid only during this call (jsonstream
        decodes in place): the `ts` texts are read now."""
        try:
            events = _EVENTS_TS_TEXT.decode(chunk)
            return events, _ts_from_text(events, b.exact)
        except msgspec.ValidationError:
            # some item is not an event (null, a number, a `ph` that is not text) — or the cut is not between two
            # items and the decode met a wrong type before the broken syntax: the items then do not decode
            # either, and this DecodeError makes the chunker try the next cut
            items = _ITEMS.decode(chunk)
            events, kept = _events_one_by_one(items, b.bad)
            exact = b.exact or _needs_exact_ts(events)
            if exact:
                _set_exact_ts(events, _raw_ts_of(kept))
            return events, exact

    try:
        source = mapped if mapped is not None else stream
        chunks = ArrayChunks(
            source,
            decode,
            msgspec.DecodeError,
            chunk_bytes=decode_chunk_bytes(opts.memory_limit),
            # an item or head held whole: up to MAX_ITEM_CHUNKS of the budget's chunks, however small the decode's
            max_item_bytes=MAX_ITEM_CHUNKS * chunk_bytes(opts.memory_limit),
        )
        for events, exact in chunks:
            checkpoint()  # a cancelled call stops between chunks, not after the whole file
            if exact and not b.exact:
                if b.chunks:
                    raise _NeedsExact
                b.exact = True
            b.head = chunks.prefix
            b.add(events)
            del events
        top = _TOP.decode(chunks.rest) if chunks.rest is not None else None
    except (NotAnArray, msgspec.DecodeError, OSError, EOFError, zlib.error, RecursionError, ValueError) as exc:
        raise _ChunkFailed(" ".join(str(exc).split())[:200] or type(exc).__name__) from None
    finally:
        stream.close()
        if mapped is not None:
            with contextlib.suppress(BufferError):  # a value still points into it: closed when that is gone
                mapped.close()
    if top is None:
        return b.finish({})
    return b.finish({"distributedInfo": top.distributedInfo, "deviceProperties": top.deviceProperties})


def _head_dist(prefix: bytes) -> Any:
    """distributedInfo from the keys written before the events array (Kineto writes it there), read before the
    events so a parser that spills its tables knows the rank; None when it is not there or does not decode (the
    whole document is decoded at the end anyway)."""
    if not prefix:
        return None
    try:
        return _TOP.decode(prefix + b"]}").distributedInfo
    except (msgspec.DecodeError, RecursionError):
        return None


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


_NO_ARGS = _Args()


def _int64(a: np.ndarray) -> pa.Array:
    """numpy int64/int32 -> Arrow without a copy (and without pyarrow's pandas shim, which `pa.array(ndarray)`
    imports: ~0.4 s per process)."""
    a = np.ascontiguousarray(a)
    typ = pa.int32() if a.dtype == np.int32 else pa.int64()
    return pa.Array.from_buffers(typ, len(a), [None, pa.py_buffer(a)])


def _args_of(evs: list[_Event]) -> list[_Args]:
    """The events' args, an empty _Args where an event has none (so attribute getters need no None test)."""
    args = list(map(_get_args, evs))
    if None in args:
        args = [a if a is not None else _NO_ARGS for a in args]
    return args


def _pick_rank(path: Path, dist: Any, order: int) -> tuple[int, str]:
    if isinstance(dist, dict) and dist.get("rank") is not None:
        rank = dist["rank"]
        if type(rank) is not int or not 0 <= rank <= val.RANK_MAX:
            raise InputError(
                path, f"distributedInfo.rank is {val.example(rank)}, not a rank (an integer 0 … {val.RANK_MAX})"
            )
        return rank, "distributedInfo"
    m = _RANK_IN_NAME.search(path.name)
    if m and len(m.group(1)) <= 8 and int(m.group(1)) <= val.RANK_MAX:
        return int(m.group(1)), "file name"
    return order, "input order"


_COMM_FIELDS = ("coll_name", "in_nelems", "in_size_old", "dtype", "group_size", "pg_name", "pg_id_old", "seq",
                "out_nelems", "out_size_old", "pg_desc", "pg_ranks")  # fmt: skip
_get_comm = operator.attrgetter(*_COMM_FIELDS)
_NO_COMM = (None,) * len(_COMM_FIELDS)


def _pg_ranks(x: Any) -> Any:
    # "Process Group Ranks" is text ("[0, 1]"); a list of ints is kept as its JSON text
    if type(x) is list and not val.is_bad(val.int_list(x)):
        return orjson.dumps(x).decode()
    return x


_COMM_TYPES = {"coll_name": pa.string(), "in_nelems": pa.int64(), "out_nelems": pa.int64(), "group_size": pa.int32(),
               "dtype": pa.string(), "pg_name": pa.string(), "pg_desc": pa.string(), "pg_ranks": pa.string(),
               "seq": pa.int64()}  # fmt: skip


def _comm_columns(args: list[_Args], chk: val.Checker) -> dict[str, pa.Array]:
    """Collective metadata columns; only the few events that carry any of it are visited per field."""
    n = len(args)
    # one C-level pass: the comm fields of every event as a tuple, compared with all-None
    idx = list(itertools.compress(range(n), map(_NO_COMM.__ne__, map(_get_comm, args))))

    def raw(getter) -> list[Any]:
        values = [None] * n
        for i in idx:
            values[i] = getter(args[i])
        return values

    if not idx:
        return {k: pa.nulls(n, t) for k, t in _COMM_TYPES.items()}
    elems = (0, val.COUNT_MAX)
    return {
        "coll_name": chk.strs("args.Collective name", raw(lambda a: a.coll_name)),
        "in_nelems": chk.ints(
            "args.In msg nelems",
            raw(lambda a: a.in_nelems if a.in_nelems is not None else a.in_size_old),
            pa.int64(),
            *elems,
        ),
        "out_nelems": chk.ints(
            "args.Out msg nelems",
            raw(lambda a: a.out_nelems if a.out_nelems is not None else a.out_size_old),
            pa.int64(),
            *elems,
        ),
        "group_size": chk.ints("args.Group size", raw(lambda a: a.group_size), pa.int32(), 1, val.RANK_MAX + 1),
        "dtype": chk.strs("args.dtype", raw(lambda a: a.dtype)),
        "pg_name": chk.strs(
            "args.Process Group Name", raw(lambda a: a.pg_name if a.pg_name is not None else a.pg_id_old)
        ),
        "pg_desc": chk.strs("args.Process Group Description", raw(lambda a: a.pg_desc)),
        "pg_ranks": chk.strs("args.Process Group Ranks", raw(lambda a: _pg_ranks(a.pg_ranks))),
        "seq": chk.ints("args.Seq", raw(lambda a: a.seq), pa.int64()),
    }


def _raw_column(raws: list[msgspec.Raw], name: str, chk: val.Checker) -> pa.Array:
    """Verbatim JSON fragments (Input Dims, Input type) -> string column (empty: NULL); invalid UTF-8 is NULL
    and counted. Built from one joined buffer and an offsets array (no bytes object per event)."""
    n = len(raws)
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int32 if lengths.sum() < 2**31 else np.int64)
    np.cumsum(lengths, out=offsets[1:])
    present = lengths > 0
    validity = None if present.all() else pa.array(present).buffers()[1]
    typ = pa.binary() if offsets.dtype == np.int32 else pa.large_binary()
    arr = pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(raws))])
    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid:
        return chk.raw_text(name, [bytes(r) if len(r) else None for r in raws])


class _Classes:
    """Name -> catalog class, each distinct name classified once per file (traces repeat a few thousand
    names hundreds of thousands of times), applied to a column with Arrow `index_in` + `take`."""

    def __init__(self, classify) -> None:
        self.classify = classify
        self.cache: dict[str, Any] = {}

    def columns(self, names: pa.Array) -> dict[str, pa.Array]:
        uniq = pc.unique(names)
        keys = uniq.to_pylist()
        cache, classify = self.cache, self.classify
        cls = [cache[k] if k in cache else cache.setdefault(k, classify(k)) for k in keys]
        at = pc.index_in(names, value_set=uniq)
        return {
            "klass": pc.take(pa.array([c.klass for c in cls], pa.string()), at),
            "family": pc.take(pa.array([c.family for c in cls], pa.string()), at),
            "collective_op": pc.take(pa.array([c.collective_op for c in cls], pa.string()), at),
        }


def _base(evs: list[_Event], ts: np.ndarray, dur: np.ndarray, chk: val.Checker) -> dict[str, Any]:
    """name, ts_ns, dur_ns of events that went through _timed (rank is added once the file is read). A negative
    duration, stored as 0, is a bad record of the row."""
    zero = np.flatnonzero(dur == 0)
    if len(zero):
        neg = [i for i in zero.tolist() if val.negative_duration(evs[i].dur)]
        chk.bad.nulled(chk.table, "dur", neg, [evs[i].dur for i in neg], "negative duration set to 0, record kept")
    return {
        "name": pc.fill_null(chk.strs("name", list(map(_get_name, evs))), ""),
        "ts_ns": _int64(ts),
        "dur_ns": _int64(dur),
    }


def _gpu_columns(evs: list[_Event], args: list[_Args], chk: val.Checker) -> dict[str, pa.Array]:
    i32 = (-(2**31), val.INT32_MAX)
    # args.device / args.stream when the event has them, else Kineto's pid (device) and tid (stream)
    dev_raw = [a.device for a in args]
    stream_raw = [a.stream for a in args]
    dev = chk.int_values("args.device", dev_raw, *i32)
    stream = chk.int_values("args.stream", stream_raw, -val.ID_MAX - 1, val.ID_MAX)
    return {
        "device": pa.array(
            [d if r is not None else val.int_or_none(e.pid, *i32) for d, r, e in zip(dev, dev_raw, evs)],
            pa.int32(),
        ),
        "stream": pa.array(
            [s if r is not None else val.int_or_none(e.tid) for s, r, e in zip(stream, stream_raw, evs)],
            pa.int64(),
        ),
        "correlation": chk.ints("args.correlation", [a.correlation for a in args], pa.int64()),
        "external_id": chk.ints("args.External id", [a.external_id for a in args], pa.int64()),
    }


def _host_columns(evs: list[_Event], chk: val.Checker) -> dict[str, pa.Array]:
    return {
        "pid": chk.strs("pid", list(map(_get_pid, evs))),
        "tid": chk.strs("tid", list(map(_get_tid, evs))),
    }


# event category -> the table its events go to (events of other categories are not stored, so not checked)
_TABLE_OF = {"kernel": "kernels", "gpu_memcpy": "memops", "gpu_memset": "memops", "cuda_runtime": "runtime",
             "cuda_driver": "runtime", "cpu_op": "cpu_ops", "python_function": "cpu_ops",
             "user_annotation": "annotations", "gpu_user_annotation": "annotations",
             "python_step_marker": "annotations", "flows": "flows"}  # fmt: skip
# table -> its sources in row order (a table's rows are those of its first source, then its second...)
_SOURCES = {"kernels": ("kernel",), "memops": ("gpu_memcpy", "gpu_memset"),
            "runtime": ("cuda_runtime", "cuda_driver"), "cpu_ops": ("cpu_op", "python_function"),
            "annotations": ("user_annotation", "gpu_user_annotation", "python_step_marker"),
            "flows": ("flows",)}  # fmt: skip
# the categories of PyTorch 1.8's first Kineto traces (libkineto's ChromeTraceLogger then wrote "Operator", "Kernel",
# "Runtime", "Memcpy", "Memset"; the tensorboard plugin's tests hold them), read as the categories that replaced them
_OLD_CATEGORY = {"Kernel": "kernel", "Operator": "cpu_op", "Runtime": "cuda_runtime", "Memcpy": "gpu_memcpy",
                 "Memset": "gpu_memset", "Python": "python_function"}  # fmt: skip
_SOURCE_VALUE = {"gpu_memcpy": "memcpy", "gpu_memset": "memset", "python_step_marker": "python_function"}
_ROW_KEY = 1 << 48  # bad-record row keys: source number × 2**48 + row number within the source (unique per table)


class _Builder:
    """Columns of one rank file, built chunk by chunk of decoded events; `finish` assembles the tables.

    Rows keep the whole-file order: a table's rows are all rows of its first source category, then of the next
    (memops: every memcpy, then every memset), each source's rows in file order. Bad records are counted per
    chunk and merged with row keys that are unique per table row, so the counts are those of a whole-file parse.
    """

    def __init__(self, p: Path, order: int, opts: IngestOptions, exact: bool, bad: BadRecords | None = None) -> None:
        self.p = p
        self.order = order
        self.keep_python = opts.keep_python
        self.exact = exact
        # spilling: tables beyond `spill_at` bytes are written to Parquet parts in `spill_dir` (see _spill)
        self.spill_dir = Path(opts.spill_dir) if opts.spill_dir else None
        self.spill_at = spill_bytes(opts.memory_limit)
        self.held = 0  # bytes of the tables in self.parts
        self.head = b""  # the document up to its events array (jsonstream prefix): the rank when spilling
        self.spilled: dict[str, list[str]] = {}  # table -> its Parquet parts
        self.spilled_rows: dict[str, int] = {}
        self.spill_rank: tuple[int, str] | None = None  # the rank written into the parts
        self.stats = _TableStats()
        self.chunks = 0
        self.events_total = 0
        self.py_skipped = 0
        self.unread: dict[str, int] = {}  # duration events of categories no table holds, per category
        self.durations = 0  # duration (X) events of any category, stored or not
        self.bad = bad if bad is not None else BadRecords()
        self.rows = {src: 0 for srcs in _SOURCES.values() for src in srcs}  # rows kept so far per source
        self.parts: dict[str, list[pa.Table]] = {src: [] for src in self.rows}
        self.kernel_classes = _Classes(classify_kernel)
        self.runtime_correlations: set[int] = set()  # ids of the runtime calls so far (_one_call_per_correlation)
        self.op_classes = _Classes(classify_cpu_op)

    def add(self, events: list[_Event]) -> None:
        self.chunks += 1
        self.events_total += len(events)
        by_cat: dict[str, list[_Event]] = {}
        flows: list[_Event] = []
        keep_python = self.keep_python
        for e in events:
            ph = e.ph
            if ph == "X":
                cat = e.cat if type(e.cat) is str else ""
                if cat not in _TABLE_OF:
                    cat = _OLD_CATEGORY.get(cat, cat)
                if cat == "python_function":  # vLLM's execute_model frames are step markers, kept Python or not
                    if type(e.name) is str and _PY_STEP_MARKER.search(e.name):
                        cat = "python_step_marker"
                    elif not keep_python:
                        self.py_skipped += 1
                        continue
                lst = by_cat.get(cat)
                if lst is None:
                    by_cat[cat] = lst = []
                lst.append(e)
            elif ph in ("s", "f"):
                flows.append(e)
        self.durations += sum(map(len, by_cat.values()))
        if flows:
            by_cat["flows"] = flows
        for cat, evs in by_cat.items():
            if cat not in _TABLE_OF:  # counted and reported, never dropped silently
                self.unread[cat] = self.unread.get(cat, 0) + len(evs)
        bad = BadRecords()
        timed = {cat: _timed(evs, _TABLE_OF[cat], self.exact, bad) for cat, evs in by_cat.items() if cat in _TABLE_OF}
        self._build(timed, bad)
        self._merge(bad, {cat: len(t[0]) for cat, t in timed.items()})
        for cat, (evs, _, _) in timed.items():
            self.rows[cat] += len(evs)
        if self.spill_dir is not None and self.held > self.spill_at:
            self._spill()

    def _assembled(self) -> dict[str, pa.Table]:
        """The tables held so far (each source's rows in order), without the rank column; the parts are released."""
        tables = {}
        for table, srcs in _SOURCES.items():
            pieces = [t for s in srcs for t in self.parts[s]]
            for s in srcs:
                self.parts[s] = []
            if pieces:
                # chunked, not combined: DuckDB and the IPC writer take chunks as they are (combining copies all)
                tables[table] = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
        self.held = 0
        return tables

    def _spill(self) -> None:
        """Write the tables held so far as one Parquet part each, in the store's columns (rank included), and
        release them. The rank is the one the document's head gives (Kineto writes distributedInfo before the
        events); `finish` rewrites the parts in the rare file whose rank is only given after them."""
        from tracediag.store.parquet import conform

        if self.spill_rank is None:
            self.spill_rank = _pick_rank(self.p, _head_dist(self.head), self.order)
        rank = self.spill_rank[0]
        for table, t in self._assembled().items():
            self.stats.add(table, t)
            t = conform(table, _with_rank(t, rank))
            files = self.spilled.setdefault(table, [])
            path = self.spill_dir / f"input-{self.order}.{table}.{len(files)}.parquet"
            self._write(t, path)
            files.append(str(path))
            self.spilled_rows[table] = self.spilled_rows.get(table, 0) + t.num_rows

    def _merge(self, bad: BadRecords, counts: dict[str, int]) -> None:
        """Fold a chunk's bad records in, its row indices (within the chunk's rows of a table) made into row keys."""
        for name, f in bad.fields.items():
            self.bad.note(name, f.action, [], f.count)
            g = self.bad.fields[name]
            g.examples.extend(f.examples[: val.MAX_EXAMPLES - len(g.examples)])
        self.bad._dropped += bad._dropped
        self.bad._extra += bad._extra
        for table, idx in bad._nulled.items():
            srcs = _SOURCES.get(table)
            if srcs is None:  # not a per-row table of ours
                self.bad._nulled.setdefault(table, set()).update(idx)
                continue
            bounds, lo = [], 0
            for s_no, src in enumerate(srcs):
                n = counts.get(src, 0)
                bounds.append((lo, lo + n, s_no * _ROW_KEY + self.rows[src] - lo))
                lo += n
            keys = self.bad._nulled.setdefault(table, set())
            for i in idx:
                for a, b, shift in bounds:
                    if a <= i < b:
                        keys.add(i + shift)
                        break

    def _build(self, timed: dict[str, tuple[list[_Event], np.ndarray, np.ndarray]], bad: BadRecords) -> None:
        def srcs(table: str) -> list[tuple[str, list[_Event], np.ndarray, np.ndarray]]:
            return [(s, *timed[s]) for s in _SOURCES[table] if s in timed and len(timed[s][0])]

        def joined(parts):
            evs = parts[0][1] if len(parts) == 1 else [e for part in parts for e in part[1]]
            ts = np.concatenate([part[2] for part in parts])
            dur = np.concatenate([part[3] for part in parts])
            return evs, ts, dur

        def store(parts, table: pa.Table) -> None:
            self.held += table.nbytes
            lo = 0
            for src, evs, _, _ in parts:
                self.parts[src].append(table.slice(lo, len(evs)))
                lo += len(evs)

        parts = srcs("kernels")
        if parts:
            chk = val.Checker(bad, "kernels")
            evs, ts, dur = joined(parts)
            args = _args_of(evs)
            cols = _base(evs, ts, dur, chk) | _gpu_columns(evs, args, chk)
            cols["grid"] = chk.int_lists("args.grid", [a.grid for a in args])
            cols["block"] = chk.int_lists("args.block", [a.block for a in args])
            cols |= self.kernel_classes.columns(cols["name"]) | _comm_columns(args, chk)
            store(parts, pa.table(cols))

        parts = srcs("memops")
        if parts:
            chk = val.Checker(bad, "memops")
            evs, ts, dur = joined(parts)
            args = _args_of(evs)
            cols = _base(evs, ts, dur, chk) | _gpu_columns(evs, args, chk)
            cols["kind"] = pa.array([_SOURCE_VALUE[s] for s, e, _, _ in parts for _ in e], pa.string())
            cols["bytes"] = chk.ints("args.bytes", [a.bytes for a in args], pa.int64(), 0, val.COUNT_MAX)
            store(parts, pa.table(cols))

        parts = srcs("runtime")
        if parts:
            chk = val.Checker(bad, "runtime")
            evs, ts, dur = joined(parts)
            args = _args_of(evs)
            cols = _base(evs, ts, dur, chk) | _host_columns(evs, chk)
            cols["cat"] = pa.array([s for s, e, _, _ in parts for _ in e], pa.string())
            corr = chk.int_values("args.correlation", [a.correlation for a in args], -val.ID_MAX - 1, val.ID_MAX)
            cols["correlation"] = pa.array(self._one_call_per_correlation(corr, chk), pa.int64())
            cols["external_id"] = chk.ints("args.External id", [a.external_id for a in args], pa.int64())
            store(parts, pa.table(cols))

        parts = srcs("cpu_ops")
        if not self.keep_python:
            parts = [x for x in parts if x[0] != "python_function"]
        if parts:
            chk = val.Checker(bad, "cpu_ops")
            evs, ts, dur = joined(parts)
            args = _args_of(evs)
            cols = _base(evs, ts, dur, chk) | _host_columns(evs, chk)
            cols["external_id"] = chk.ints("args.External id", [a.external_id for a in args], pa.int64())
            cols["input_dims"] = _raw_column([a.input_dims for a in args], "args.Input Dims", chk)
            cols["input_types"] = _raw_column([a.input_types for a in args], "args.Input type", chk)
            cols |= self.op_classes.columns(cols["name"]) | _comm_columns(args, chk)
            store(parts, pa.table(cols))

        parts = srcs("annotations")
        if parts:
            chk = val.Checker(bad, "annotations")
            evs, ts, dur = joined(parts)
            args = _args_of(evs)
            cols = _base(evs, ts, dur, chk) | _host_columns(evs, chk)
            cols["source"] = pa.array([_SOURCE_VALUE.get(s, s) for s, e, _, _ in parts for _ in e], pa.string())
            cols["external_id"] = chk.ints("args.External id", [a.external_id for a in args], pa.int64())
            cols["input_dims"] = _raw_column([a.input_dims for a in args], "args.Input Dims", chk)
            cols["input_types"] = _raw_column([a.input_types for a in args], "args.Input type", chk)
            cls = self.op_classes.columns(cols["name"])
            cols["klass"] = cls["klass"]
            cols["collective_op"] = cls["collective_op"]
            store(parts, pa.table(cols))

        parts = srcs("flows")
        if parts:
            chk = val.Checker(bad, "flows")
            evs, ts, _ = joined(parts)
            cols = {
                "flow_id": chk.ints("id", [e.id for e in evs], pa.int64()),
                "cat": chk.strs("cat", list(map(_get_cat, evs))),
                "phase": pa.array([e.ph for e in evs], pa.string()),
                "ts_ns": _int64(ts),
                "pid": chk.strs("pid", list(map(_get_pid, evs))),
                "tid": chk.strs("tid", list(map(_get_tid, evs))),
            }
            store(parts, pa.table(cols))

    def _one_call_per_correlation(self, corr: list[int | None], chk: val.Checker) -> list[int | None]:
        """The runtime calls' correlation ids with each id kept by its first call only: every derivation joins
        kernels to their launching call on it, so an id shared by n calls and m kernels makes n × m rows (a trace
        whose calls all share one id took 2.4 GB and 21 s instead of 0.2 GB and 3 s). A call that reuses an id
        gets NULL, a bad record. Checked in C (sets) unless an id repeats."""
        seen = self.runtime_correlations
        ids = list(filter(functools.partial(operator.is_not, None), corr))
        fresh = set(ids)
        if len(fresh) == len(ids) and seen.isdisjoint(fresh):
            seen |= fresh
            return corr
        reused = []
        for i, c in enumerate(corr):
            if c is None:
                continue
            if c in seen:
                reused.append(i)
            else:
                seen.add(c)
        chk.bad.nulled(
            chk.table, "args.correlation", reused, [corr[i] for i in reused], "shared with an earlier call: set to NULL"
        )
        out = list(corr)
        for i in reused:
            out[i] = None
        return out

    def finish(self, top: dict[str, Any]) -> Parsed:
        p, bad, order = self.p, self.bad, self.order
        if not self.events_total:
            raise InputError(p, "trace has no events (empty traceEvents)")
        stored = [s for s in self.rows if s != "flows"]
        if not self.durations:
            if self.py_skipped:
                raise InputError(
                    p,
                    f"trace has no duration events besides {self.py_skipped} python_function events "
                    "(pass --keep-python to store those)",
                )
            raise InputError(p, f"trace has no duration events (only {self.events_total} metadata/instant events)")
        if not any(self.rows[s] for s in stored) and self.unread and not bad:
            cats = ", ".join(f"{c!r} ({n:,})" for c, n in sorted(self.unread.items(), key=lambda x: -x[1])[:5])
            raise InputError(p, f"no event of a category tracediag reads; the trace's duration events are {cats}")
        if bad and not any(self.rows[s] for s in stored):
            first = next(iter(bad.fields))
            raise InputError(
                p,
                f"no event has a usable ts and dur ({bad.records} dropped; e.g. {first} = "
                f"{bad.fields[first].examples[0]})",
            )
        dist = top.get("distributedInfo")
        rank, rank_source = _pick_rank(p, dist, order)
        tables: dict[str, pa.Table | SpilledTable] = {}
        if self.spilled:
            self._spill()  # the rest too: a table is all in parts or all in memory
            if self.spill_rank != (rank, rank_source):
                self._relabel(rank)
            tables = {t: SpilledTable(files, self.spilled_rows[t]) for t, files in self.spilled.items()}
        else:
            for table, t in self._assembled().items():
                self.stats.add(table, t)
                tables[table] = _with_rank(t, rank)

        meta = _meta(p, order, rank, rank_source, dist, top.get("deviceProperties"), self.stats.device(), bad)
        pgs = _pg_config(dist, rank, bad)
        long_named = len(self.stats.long_names)
        meta |= {
            "trace_start_ns": self.stats.start,
            "trace_end_ns": self.stats.end,
            "events_total": self.events_total,
            "events_python_skipped": self.py_skipped,
        }
        facts = {"names_classified_by_prefix": long_named} if long_named else {}
        if self.unread:
            facts["unread_categories"] = dict(sorted(self.unread.items(), key=lambda x: -x[1])[:20])
        if bad:
            facts["bad_records"] = bad.to_meta()
        meta |= {"bad_records": bad.records, "meta_json": orjson.dumps(facts).decode() if facts else None}
        return Parsed(path=str(p), format="kineto", inputs_rows=[meta], tables=tables, process_groups=pgs)

    def _relabel(self, rank: int) -> None:
        """Rewrite the parts with the file's rank, given only after its events (one part in memory at a time)."""
        import pyarrow.parquet as pq

        for files in self.spilled.values():
            for f in files:
                t = pq.read_table(f)
                i = t.schema.get_field_index("rank")
                self._write(t.set_column(i, "rank", pa.array(np.full(t.num_rows, rank, dtype=np.int32))), f)

    def _write(self, t: pa.Table, path: Path | str) -> None:
        # a full or unwritable disk is the user's to fix, not a reason to decode the whole file in memory instead
        try:
            _write_parquet(t, path)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(
                self.p,
                f"its tables are too large to hold and cannot be written out to {Path(path).parent} "
                f"({getattr(exc, 'strerror', None) or exc}); free space there, or raise --memory-limit",
            ) from None


def _with_rank(t: pa.Table, rank: int) -> pa.Table:
    return t.add_column(0, "rank", _int64(np.full(t.num_rows, rank, dtype=np.int32)))


def _write_parquet(t: pa.Table, path: Path | str) -> None:
    import pyarrow.parquet as pq

    # written once and read once by DuckDB, right after: fast compression, one row group per ~1M rows
    pq.write_table(t, str(path), compression="lz4", row_group_size=1 << 20)


class _TableStats:
    """What `finish` reports about the tables, gathered from each part as it is made (held or spilled): the
    trace's start and end, the kernels' devices, the long names the catalog classified by prefix."""

    def __init__(self) -> None:
        self.start: int | None = None
        self.end: int | None = None
        self.devices: dict[int, int] = {}
        self.long_names: set[tuple[str, str]] = set()

    def add(self, table: str, t: pa.Table) -> None:
        if not t.num_rows:
            return
        if table != "flows":
            ts = t.column("ts_ns").to_numpy()
            lo, hi = int(ts.min()), int((ts + t.column("dur_ns").to_numpy()).max())
            self.start = lo if self.start is None else min(self.start, lo)
            self.end = hi if self.end is None else max(self.end, hi)
        if table == "kernels":
            counts = pc.value_counts(pc.drop_null(t.column("device")))
            for d, n in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()):
                self.devices[d] = self.devices.get(d, 0) + n
        if table in NAMED_TABLES:
            self.long_names |= {(table, n) for n in long_names(t)}

    def device(self) -> int | None:
        """The device most kernels ran on (the first such in order of appearance on a tie)."""
        return max(self.devices, key=self.devices.__getitem__) if self.devices else None


def _pg_config(dist: Any, rank: int, bad: BadRecords) -> list[dict[str, Any]]:
    """distributedInfo.pg_config -> process_groups rows; a wrongly typed or out-of-range value is NULL."""
    if not (isinstance(dist, dict) and isinstance(dist.get("pg_config"), list)):
        return []
    chk = val.Checker(bad, "distributedInfo.pg_config")
    entries = [pg for pg in dist["pg_config"] if isinstance(pg, dict)]

    def col(key: str) -> list[Any]:
        return [pg.get(key) for pg in entries]

    names, descs, backends = (chk.str_values(k, col(k)) for k in ("pg_name", "pg_desc", "backend_config"))
    sizes = chk.int_values("pg_size", col("pg_size"), 1, val.RANK_MAX + 1)
    ranks, idx = val.int_lists(col("ranks"), 0, val.RANK_MAX)
    bad.nulled("distributedInfo.pg_config", "ranks", idx, [entries[i].get("ranks") for i in idx])
    return [
        {
            "rank": rank,
            "pg_name": names[i],
            "pg_desc": descs[i],
            "backend_config": backends[i],
            "pg_size": sizes[i],
            "ranks": ranks[i],
        }
        for i in range(len(entries))
    ]


def _meta(
    p: Path,
    order: int,
    rank: int,
    rank_source: str,
    dist: Any,
    props: Any,
    device: int | None,
    bad: BadRecords,
) -> dict[str, Any]:
    dist = dist if isinstance(dist, dict) else {}
    prop = None
    if isinstance(props, list):
        cands = [d for d in props if isinstance(d, dict)]
        prop = next((d for d in cands if d.get("id") == device), cands[0] if cands else None)
    # facts of the file: a wrongly typed or out-of-range one is NULL and counted
    di, dp = val.Checker(bad, "distributedInfo"), val.Checker(bad, "deviceProperties")
    prop = prop or {}

    def fact(chk: val.Checker, doc: dict, key: str, lo: int | None = None, hi: int = val.INT64_MAX) -> Any:
        if lo is None:
            return chk.str_values(key, [doc.get(key)])[0]
        return chk.int_values(key, [doc.get(key)], lo, hi)[0]

    world_size = fact(di, dist, "world_size", 1, val.RANK_MAX + 1)
    if world_size is not None and rank_source == "distributedInfo" and rank >= world_size:
        # one of the two is wrong, and which is not known: the rank names the file's tables, the world size is
        # left out (NULL) rather than contradict it
        bad.nulled("inputs", "distributedInfo.world_size", [0], [f"rank {rank} of world_size {world_size}"],
                   "world_size set to NULL (the file's rank is not below it)")  # fmt: skip
        world_size = None
    backend, nccl_version = fact(di, dist, "backend"), fact(di, dist, "nccl_version")
    name, mem = fact(dp, prop, "name") or None, fact(dp, prop, "totalGlobalMem", 0)
    sms, major, minor = (fact(dp, prop, k, 0, val.INT32_MAX) for k in ("numSms", "computeMajor", "computeMinor"))
    dist_json = val.json_text(dist) if dist else None
    props_json = val.json_text(props) if props else None
    if dist and dist_json is None:
        bad.nulled("inputs", "distributedInfo", [0], [dist])
    if props and props_json is None:
        bad.nulled("inputs", "deviceProperties", [0], [props])
    return {
        "input_id": order,
        "path": str(p),
        "format": "kineto",
        "profiler": "pytorch-profiler (kineto)",
        "file_bytes": p.stat().st_size,
        "rank": rank,
        "rank_source": rank_source,
        "world_size": world_size,
        "backend": backend,
        "nccl_version": nccl_version,
        "device_name": name,
        "device_total_mem_bytes": mem,
        "device_num_sms": sms,
        "device_compute_capability": f"{major}.{minor}" if major is not None else None,
        "distributed_info_json": dist_json,
        "device_properties_json": props_json,
    }
