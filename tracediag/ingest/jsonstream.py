"""Decode one big JSON array of a document in chunks, so memory stays bounded whatever the file size.

A Kineto trace is one JSON object whose `traceEvents` array holds almost every byte (or a bare array of
events). `ArrayChunks` reads the file in pieces (plain or gzip, decompressed as it goes), finds the array,
and hands the caller's decoder one chunk of whole array items at a time, wrapped in `[...]`. Everything
else in the document (keys before and after the array) is kept as a small JSON object, `rest`, with the
array left empty, available once the chunks are consumed.

Where one chunk ends is found without a byte-by-byte scan in Python: a candidate cut is a `}` followed by
`,` and `{` (optionally with whitespace) — the separator between two objects of the array — and the decoder
itself is the validator: when a candidate lies inside a nested object or a string, the chunk does not
decode and the previous candidate is tried. A well-formed file needs one decode per chunk; a chunk that
holds a single huge item grows until that item ends, so memory is bounded by the chunk size or the largest
item, whichever is larger — up to `max_item_bytes` (MAX_ITEM_CHUNKS chunks, at least MIN_MAX_ITEM): an item or a
document head beyond it (a file of one endless string, `[` and a 3 GB hole) is NotAnArray, not a buffer that grows
with the file.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import re
from collections.abc import Callable, Iterator
from typing import IO, Generic, TypeVar

T = TypeVar("T")

DEFAULT_CHUNK_BYTES = 32 << 20
_READ = 16 << 20  # bytes read at a time: a quarter of the chunk, within these bounds
_MIN_READ = 64 << 10
_WS = b" \t\r\n"
_MAX_TRIES = 64  # candidate cuts tried per chunk before reading more (a pathological item)
_NON_WS = re.compile(rb"[^ \t\r\n]")
_TAIL_MISSES = 64  # ']' after the last candidate whose rest of the document is not valid: the items have begun
_MAX_TAIL_TRIES = 4096  # ']' tried from the end to find the array's end (a truncated file has none)
MAX_ITEM_CHUNKS = 4
MIN_MAX_ITEM = 64 << 20  # no trace event is near this (the largest real ones: a few hundred KiB of Input Dims)


def map_file(f: IO[bytes]) -> mmap.mmap | None:
    """A private writable map of a plain file for ArrayChunks (None when the file cannot be mapped: a stream, an
    empty file): its pages are read from the page cache as they are decoded, and writes (the cut's brackets) stay
    in this process."""
    try:
        if os.fstat(f.fileno()).st_size == 0:
            return None
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    except (OSError, ValueError, AttributeError):  # io.UnsupportedOperation is both of the first two
        return None


class NotAnArray(ValueError):
    """The document has no array under the key (or is not a JSON object/array at all)."""


class ArrayChunks(Generic[T]):
    """Iterate `decode(b"[" + items + b"]")` over chunks of the array stored under `key`.

    `decode` must raise `errors` (e.g. msgspec.DecodeError) on a syntactically invalid chunk; any
    other exception propagates. It is given a memoryview of the reading buffer, valid only during the call
    (the chunk is decoded in place, without a copy); values that keep pointing into it (msgspec.Raw) are fine.
    `prefix` is the document before the array's items, set before the first chunk is decoded.
    After iteration, `rest` is the document without the array's items (`{"key": [], ...}`), or None when the
    document was a bare array; `items_bytes` counts the bytes of the array's items.

    `f` is a stream (a gzip stream, a file), read into a buffer of the chunks' size; or a private writable map of a
    whole plain file (`mmap.ACCESS_COPY`, from `map_file`), decoded where it lies, with no copy into a buffer, and
    the pages of every consumed chunk dropped from this process (MADV_DONTNEED: a private file map reads them from
    the file again, should anything still point into them). Both walk the document in the same reads of the same
    size, so they find the same cuts, chunks and errors.
    """

    def __init__(
        self,
        f: IO[bytes] | mmap.mmap,
        decode: Callable[[bytes], T],
        errors: type[BaseException] | tuple[type[BaseException], ...],
        key: bytes = b"traceEvents",
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        max_item_bytes: int | None = None,
    ) -> None:
        self._map = f if isinstance(f, mmap.mmap) else None
        self._f = None if self._map is not None else f
        self._len = 0  # mapped: the bytes of the map read so far (the stream's buffer is map[:_len])
        self._dropped = 0  # mapped: the pages below this offset are dropped (consumed)
        self._decode = decode
        self._errors = errors
        self._key = re.compile(rb'"' + re.escape(key) + rb'"\s*:\s*\[')
        self._chunk = max(1, chunk_bytes)
        self.rest: bytes | None = None
        self.prefix = b""  # the document up to and including the array's '[' (b"" for a bare array), once found
        self.items_bytes = 0
        self._eof = False
        self._scratch: bytearray | None = None
        # the largest item (or document head) held whole: `max_item_bytes`, at least MIN_MAX_ITEM (default: at least
        # MAX_ITEM_CHUNKS chunks)
        self.max_item_bytes = max(MIN_MAX_ITEM, max_item_bytes or MAX_ITEM_CHUNKS * self._chunk)
        self.read_bytes = 0  # of the document so far

    def _read(self, buf: bytearray | mmap.mmap) -> bool:
        if self._eof:
            return False
        n = max(_MIN_READ, min(_READ, self._chunk // 4))
        if self._map is not None:  # the next n bytes of the map count as read: no copy
            lo = self._len
            got = min(n, len(self._map) - lo)
            if not got:
                self._eof = True
                return False
            if self._map.find(b"\x00", lo, lo + got) >= 0:
                raise NotAnArray(f"a NUL byte in the document, within its first {self.read_bytes + got} bytes")
            self.read_bytes += got
            self._len += got
            return True
        if self._scratch is None or len(self._scratch) != n:
            self._scratch = bytearray(n)
        # read into one reused buffer: a fresh 16 MiB bytes object per read costs its page faults every time
        got = self._f.readinto(self._scratch)
        if not got:
            self._eof = True
            self._scratch = None  # the last chunk is decoded after this: not beside it
            return False
        data = memoryview(self._scratch)[:got]
        if self._scratch.find(b"\x00", 0, got) >= 0:  # never in JSON text (a control character): a hole, a binary
            raise NotAnArray(f"a NUL byte in the document, within its first {self.read_bytes + got} bytes")
        self.read_bytes += got
        try:
            buf += data
        except BufferError:  # the caller still holds values that point into the buffer: grow a new one
            self._buf = buf = self._buf + data
        return True

    def _length(self, buf: bytearray | mmap.mmap) -> int:
        """Bytes of the buffer read so far (mapped: of the map)."""
        return self._len if self._map is not None else len(buf)

    def _find_array(self, buf: bytearray | mmap.mmap) -> tuple[bytes, int]:
        """(prefix up to and including '[', offset of the first item)."""
        while True:
            n = self._length(buf)
            head = bytes(buf[: min(64, n)]).lstrip(_WS)
            if head.startswith(b"["):
                return b"", _NON_WS.search(buf, 0, n).start() + 1
            if head and not head.startswith(b"{"):
                raise NotAnArray("not a JSON object or array")
            m = self._key.search(buf, 0, n)
            if m:
                return bytes(buf[: m.end()]), m.end()
            if n > self.max_item_bytes:
                raise NotAnArray(f"no array under the key in the first {self.max_item_bytes >> 20} MiB")
            if not self._read(buf):
                raise NotAnArray("no array under the key")

    def _cuts(self, buf: bytearray | mmap.mmap, lo: int, hi: int) -> Iterator[tuple[int, int]]:
        """Candidate (end of an item, start of the next) pairs in buf[lo:hi], last first."""
        i = hi
        while True:
            i = buf.rfind(b"}", lo, i)
            if i < 0:
                return
            j = i + 1
            while j < hi and buf[j] in _WS:
                j += 1
            if j < hi and buf[j] == 0x2C:  # ','
                k = j + 1
                while k < hi and buf[k] in _WS:
                    k += 1
                if k < hi and buf[k] == 0x7B:  # '{'
                    yield i + 1, k
            if i <= lo:
                return

    def _try_span(self, buf: bytearray | mmap.mmap, start: int, end: int) -> tuple[bool, T | None]:
        """Decode buf[start:end] as an array without copying it: the separator bytes either side of the span
        (buf[start - 1], buf[end]: the array's '[' or whitespace or ',') are set to '[' and ']' for the decode
        and put back after it."""
        before, after = buf[start - 1], buf[end]
        buf[start - 1], buf[end] = 0x5B, 0x5D
        try:
            return True, self._decode(memoryview(buf)[start - 1 : end + 1])
        except self._errors:
            return False, None
        finally:
            buf[start - 1], buf[end] = before, after

    def __iter__(self) -> Iterator[T]:
        self._buf = self._map if self._map is not None else bytearray()
        self._read(self._buf)
        prefix, pos = self._find_array(self._buf)
        self.prefix = prefix
        start = pos  # buf[start:] is not consumed yet (buf[start - 1] is a separator or the '[')
        while True:
            while self._length(self._buf) - start < self._chunk and self._read(self._buf):
                pass
            if self._eof:
                break
            value, nxt = self._first_chunk(self._buf, start)
            if nxt is not None:
                start = nxt
                yield value
                value = None  # the consumer is done with it: it must not pin the buffer
                if self._map is not None:
                    self._drop(start - 1)
                elif start > len(self._buf) // 2:  # drop what is consumed, keeping the separator before `start`
                    try:
                        del self._buf[: start - 1]
                    except BufferError:
                        self._buf = self._buf[start - 1 :]
                    start = 1
            elif self._length(self._buf) - start > self.max_item_bytes:
                raise NotAnArray(f"no item of the array ends within {self.max_item_bytes >> 20} MiB")
            elif not self._read(self._buf):  # no cut decodes yet: an item runs on; read more and retry
                break
        # the one copy of the last items
        body = bytearray(b"[") + memoryview(self._buf)[start : self._length(self._buf)]
        if self._map is not None:
            self._drop(start)
        self._buf = bytearray()
        yield from self._tail(prefix, body)

    def _drop(self, below: int) -> None:
        """Hand back the map's pages below `below` (consumed): MADV_DONTNEED where the platform has it."""
        page = mmap.PAGESIZE
        hi = below // page * page
        if hi > self._dropped and hasattr(mmap, "MADV_DONTNEED"):
            with contextlib.suppress(OSError, ValueError):
                self._map.madvise(mmap.MADV_DONTNEED, self._dropped, hi - self._dropped)
            self._dropped = hi

    def _first_chunk(self, buf: bytearray | mmap.mmap, start: int) -> tuple[T | None, int | None]:
        """Decode the longest run of whole items from `start` that ends at a candidate cut (None: none does)."""
        n = self._length(buf)
        hi = min(n, start + self._chunk)
        for tries, (end, nxt) in enumerate(self._cuts(buf, start, hi)):
            if tries >= _MAX_TRIES:
                break
            ok, value = self._try_span(buf, start, end)
            if ok:
                self.items_bytes += end - start
                return value, nxt
        if hi < n:  # nothing decodes within one chunk: look in the whole buffer (a huge item)
            for tries, (end, nxt) in enumerate(self._cuts(buf, start, n)):
                if tries >= _MAX_TRIES:
                    break
                ok, value = self._try_span(buf, start, end)
                if ok:
                    self.items_bytes += end - start
                    return value, nxt
        return None, None

    def _tail(self, prefix: bytes, body: bytearray) -> Iterator[T]:
        """The last items, the array's closing ']' and what follows it (the rest of the document).

        `body` is '[' followed by the unconsumed bytes: the items up to a candidate ']' are decoded in place,
        '[' + items + ']' (whitespace included), without copying them. A candidate is a ']' after which the rest of
        the document is valid JSON; the keys after the array may hold ']' too (deviceProperties lists), so the
        candidates are gathered from the end first and the leftmost tried first: a ']' inside the items never
        leaves a valid rest, and one decode of the last items is enough."""
        candidates: list[tuple[int, bytes | None]] = []
        j, misses = len(body), 0
        for _ in range(_MAX_TAIL_TRIES):
            j = body.rfind(b"]", 1, j)
            if j < 0:
                break
            suffix = bytes(body[j + 1 :])
            if prefix:
                doc_rest = prefix + b"]" + suffix
                ok_rest, _ = self._try_rest(doc_rest)
            else:
                doc_rest, ok_rest = None, not suffix.strip(_WS)
            if ok_rest:
                candidates.append((j, doc_rest))
                misses = 0
            elif candidates:
                misses += 1
                if misses >= _TAIL_MISSES:  # well inside the items now
                    break
        for j, doc_rest in reversed(candidates):
            if not _NON_WS.search(body, 1, j):
                self.rest = doc_rest
                return
            try:
                value = self._decode(memoryview(body)[: j + 1])
            except self._errors:
                continue
            k = j - 1
            while body[k] in _WS:  # the items' bytes, without the whitespace before the ']'
                k -= 1
            self.items_bytes += k
            self.rest = doc_rest
            yield value
            return
        raise NotAnArray("the array is not closed (truncated file?)")

    def _try_rest(self, doc: bytes) -> tuple[bool, None]:
        import json

        try:
            json.loads(doc)  # small: the document without its array items
            return True, None
        except ValueError:
            return False, None
