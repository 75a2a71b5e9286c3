"""PyTorch profiler (Kineto) Chrome-trace JSON -> canonical columnar tables.

One call parses one rank file and returns Arrow tables shaped like `store/schema.sql`.
The file is decoded by msgspec into typed structs that keep only the fields the schema needs (unknown keys are
skipped inside the decoder, not materialised as dicts), chunk by chunk of its `traceEvents` array, then each
category is turned into columns with list comprehensions and numpy. That is the parse floor on this hardware:
see benchmarks/bench_ingest.py.

Every value goes through `tracediag.ingest.validate`: an event whose `ts` or `dur` is not a finite number in
range is dropped, an out-of-range or wrongly typed arg (a 2**40 group size, invalid UTF-8 in `Input Dims`) is
set to NULL, and both are counted in the input's `bad_records`; the rank of the file, when present and not a
rank, is an InputError naming `distributedInfo.rank`.

The package, by concern:
  events.py      the msgspec structs and decoders of the trace (field names as Kineto and PyTorch write them)
  timestamps.py  `ts`/`dur` to int64 ns, exact ns from the JSON text where float64 cannot hold them
  whole.py       a file read and decoded whole (one that cannot be read in chunks)
  columns.py     the column builders and the tables, each declared once (its source categories, its columns)
  builder.py     one file's tables built chunk by chunk, bad records merged, spilled to Parquet past the budget
  meta.py        the file's rank, process groups and inputs row (distributedInfo, deviceProperties)
  here           reading: `parse_kineto`, the chunked decode, and the whole-file decode it falls back to
"""

from __future__ import annotations

import contextlib
import gc
import mmap
import os
import zlib
from pathlib import Path
from typing import Any

import msgspec

from tracediag.errors import InputError
from tracediag.ingest.base import IngestOptions, Parsed
from tracediag.ingest.jsonstream import MAX_ITEM_CHUNKS, ArrayChunks, NotAnArray, map_file
from tracediag.ingest.kineto.builder import _Builder

# (F401: the structs and timestamp conversions the tests and benchmarks read from here)
from tracediag.ingest.kineto.events import (  # noqa: F401
    _EVENTS_TS_TEXT,
    _ITEMS,
    _TOP,
    _Args,
    _Event,
    _events_one_by_one,
    _raw_ts_of,
    _RawTs,
    _Trace,
    _TraceOrArray,
    _TraceTsText,
)
from tracediag.ingest.kineto.timestamps import (  # noqa: F401
    _exact_ns_checked,
    _exact_ts_ns,
    _needs_exact_ts,
    _set_exact_ts,
    _ts_from_text,
)
from tracediag.ingest.kineto.whole import _decode, read_bytes
from tracediag.ingest.validate import BadRecords
from tracediag.inputfile import open_stream
from tracediag.interrupt import checkpoint
from tracediag.memory import chunk_bytes, decode_chunk_bytes, spill_bytes


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
        b = _Builder(p, order, opts, exact=_needs_exact_ts(events), spill_at=spill_bytes(opts.memory_limit), bad=bad)
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


def _open_stream(p: Path, limit: int | None) -> tuple[Any, mmap.mmap | None]:
    """(the file's stream, a private map of it when it is plain JSON: ArrayChunks decodes the map where it lies)."""
    stream, gz = open_stream(p, "trace", limit)  # a gzip stream is bounded (a gzip bomb is an InputError)
    if not gz and os.fstat(stream.fileno()).st_size == 0:
        stream.close()
        raise InputError(p, "file is empty")
    return stream, None if gz else map_file(stream)


def _parse_chunked(p: Path, order: int, opts: IngestOptions, exact: bool) -> Parsed:
    stream, mapped = _open_stream(p, opts.memory_limit)
    b = _Builder(p, order, opts, exact=exact, spill_at=spill_bytes(opts.memory_limit))

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
