"""A Kineto trace read and decoded whole: the file as one buffer (mapped, or gunzipped within the read budget) and
one msgspec decode of it, for a file the chunked decode cannot split (the whole decode names its problem exactly).
"""

from __future__ import annotations

import mmap
import os
import zlib
from pathlib import Path
from typing import Any

import msgspec

from tracediag.errors import InputError
from tracediag.ingest.kineto.events import (
    _Event,
    _events_one_by_one,
    _TraceItems,
    _TraceOrArray,
    _TraceOrArrayTsText,
)
from tracediag.ingest.kineto.timestamps import _ts_from_text
from tracediag.ingest.validate import BadRecords
from tracediag.inputfile import open_stream, too_large
from tracediag.memory import read_bytes_budget


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
