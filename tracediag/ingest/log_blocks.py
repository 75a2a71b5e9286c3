"""Server logs read in large blocks: one compiled pass (pyarrow's RE2 `extract_regex`) over each block's lines finds
the lines a parser reads in bulk (the periodic stats lines that are most of a long log), and every other line goes
through the parser's line-by-line path, in file order.

The lines are exactly those of a line-by-line reader: a run of NUL bytes where a line starts is skipped (counted
as nul_head_bytes at the head of the file, nul_run_bytes elsewhere), a line longer than the read budget
(memory.read_bytes_budget) is cut there and the rest of it skipped (lines_cut), the first line is checked for
binary content, bytes are decoded as UTF-8 with replacement, a trailing '\\r' is dropped and ANSI colour codes
are removed. A bulk line is one whole physical line of ASCII that is also a whole logical line: the last bulk
candidate before another line (which might continue it) takes the line-by-line path.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracediag.errors import InputError
from tracediag.inputfile import open_stream, skip_nul_run
from tracediag.memory import read_bytes_budget

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\[(?:\d{1,3}(?:;\d{1,3})*)m(?=\s|\(|$)")
BLOCK = 8 << 20  # bytes read at a time (then to the end of the line)
RUN_BACKWARDS_S = 300.0  # a clock going back more than this starts a new run
MIN_BULK = 16  # fewer bulk candidates in a row than this take the line-by-line path (no gain in columns)

# fast_rows(st, joiner, matches, a, c, first_line, general): rows a..c-1 of `matches` (the struct array of
# extract_regex over the block's lines), physical line numbers first_line + index; `general(k)` sends line k
# through the line-by-line path
FastRows = Callable[[Any, Any, pa.StructArray, int, int, int, Callable[[int], None]], None]


def _blocks(path: Path, st: Any, longest: int) -> Iterator[bytes]:
    """The file in blocks of whole lines (the last one may lack its newline at the end of the file)."""
    f, gz = open_stream(path, "log")
    try:
        st.nul_head_bytes = skip_nul_run(f, gz)
        while True:
            if f.peek(1)[:1] == b"\x00":
                st.nul_run_bytes += skip_nul_run(f, gz)
            data = f.read(BLOCK)
            if not data:
                break
            if not data.endswith(b"\n"):
                cut = data.rfind(b"\n") + 1
                if not data[cut:].strip(b"\x00"):  # a NUL run where a line starts goes on past the block
                    st.nul_run_bytes += len(data) - cut
                    data = data[:cut]
                else:
                    rest = f.readline(longest)
                    data += rest
                    if len(rest) == longest and not rest.endswith(b"\n"):  # the rest of a line beyond the budget
                        while True:
                            skip_nul_run(f, gz)  # a hole after the line's text: stepped over, not read
                            more = f.readline(longest)
                            if not more or more.endswith(b"\n"):
                                break
            if data:
                yield data
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(path, f"corrupt or truncated log ({exc})") from None
    finally:
        f.close()


def line_text(st: Any, raw: bytes, longest: int) -> str:
    """One physical line (its bytes from where it starts, newline included) as a line-by-line reader reads it."""
    if raw[:1] == b"\x00":
        kept = raw.lstrip(b"\x00")
        st.nul_run_bytes += len(raw) - len(kept)
        raw = kept
    if len(raw) - raw.endswith(b"\n") >= longest:
        raw = raw[:longest].rstrip(b"\x00")
        st.lines_cut += 1
    line = raw.decode("utf-8", errors="replace").rstrip("\n")
    if line.endswith("\r"):
        line = line[:-1]
    if "\x1b" in line or "[0m" in line:
        line = ANSI.sub("", line)
    return line


def fixed_width(arr: pa.Array, width: int) -> np.ndarray:
    """A binary array whose values all have `width` bytes as an (n, width) uint8 view."""
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32 if arr.type == pa.binary() else np.int64)
    offsets = offsets[arr.offset : arr.offset + len(arr) + 1]
    if not np.all(np.diff(offsets) == width):
        raise ValueError("not fixed width")
    data = np.frombuffer(arr.buffers()[2], dtype=np.uint8)
    return data[offsets[0] : offsets[0] + width * len(arr)].reshape(len(arr), width)


def read_blocks(path: Path, st: Any, joiner: Any, fast: str, fast_rows: FastRows, longest: int | None = None) -> None:
    """Every line of `path`, in order: runs of lines matching the RE2 pattern `fast` (anchored, over the raw line
    with its newline) to `fast_rows`, the others to `joiner.feed(line number, text)`. `longest`: the read budget
    of one line (memory.read_bytes_budget of the run's --memory-limit)."""
    longest = longest if longest is not None else read_bytes_budget()
    line_no = 0
    first = True
    for block in _blocks(path, st, longest):
        nl = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
        ends = [] if block.endswith(b"\n") else [len(block)]
        offsets = np.concatenate(([0], nl + 1, ends)).astype(np.int64)
        n = len(offsets) - 1
        if first:
            head = block[: offsets[1]]
            head = head[:longest].rstrip(b"\x00") if len(head) - head.endswith(b"\n") >= longest else head
            if b"\x00" in head[:4096]:
                raise InputError(path, "not a log: binary content")
            first = False
        lines = pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(block)]
        )
        matches = pc.extract_regex(lines, fast)
        others = np.flatnonzero(~matches.is_valid().to_numpy(zero_copy_only=False)).tolist()
        base = line_no

        def general(k: int, base: int = base, block: bytes = block, offsets: np.ndarray = offsets) -> None:
            joiner.feed(base + k + 1, line_text(st, block[offsets[k] : offsets[k + 1]], longest))

        prev = 0
        for k in [*others, n]:
            if k > prev:  # bulk candidates prev..k-1; the last one might be continued by line k
                if k - 1 - prev >= MIN_BULK:
                    fast_rows(st, joiner, matches, prev, k - 1, base, general)
                else:
                    for j in range(prev, k - 1):
                        general(j)
                general(k - 1)
            if k < n:
                general(k)
            prev = k + 1
        line_no += n


def clocked_segments(
    st: Any,
    joiner: Any,
    rows: pa.StructArray,
    general: Callable[[int], None],
    date_width: int,
    changes: np.ndarray | None = None,
    ok: Callable[[int], bool] | None = None,
) -> Iterator[tuple[int, int, np.ndarray]]:
    """(start, count, times) of the stretches of `rows` (bulk candidates, each with a `date` and a `time` group)
    that may become rows in bulk: on the day of the clock's last record (its same-day path: seconds since t0 without
    datetime), no later than a run's worth back (RUN_BACKWARDS_S, no new run), and `ok` at their start;
    `changes[i]` (rows i and i+1 differ in something the line-by-line path decides on) ends a stretch. Every other
    row goes to `general` (the line-by-line path, which moves the clock to a new day or starts a new run) first."""
    n = len(rows)
    day = fixed_width(rows.field("date"), date_width)
    sec = fixed_width(rows.field("time"), 8).astype(np.int64) - 48
    sec = (sec[:, 0] * 10 + sec[:, 1]) * 3600 + (sec[:, 3] * 10 + sec[:, 4]) * 60 + sec[:, 6] * 10 + sec[:, 7]
    bad = sec >= 86400  # not the clock's same-day path
    brk = bad.copy()
    brk[1:] |= bad[:-1] | (day[1:] != day[:-1]).any(axis=1)
    if changes is not None:
        brk[1:] |= changes
    s = 0
    for e in [*np.flatnonzero(brk).tolist(), n]:
        while s < e:
            joiner.flush()  # a line sent through the line-by-line path is a whole line (the next starts a record)
            if e - s < MIN_BULK or bad[s]:
                for k in range(s, e):
                    general(k)
                break
            if st.clock._day_key != day[s].tobytes().decode() or (ok is not None and not ok(s)):
                general(s)  # the clock's slow path (a new day) or what `ok` leaves to the line-by-line path
                s += 1
                continue
            t = st.clock._day_s + sec[s:e]
            if st.max_t is not None and st.run_active and t[0] < st.max_t - RUN_BACKWARDS_S:
                general(s)  # a new run: decided line by line
                s += 1
                continue
            before = np.maximum.accumulate(t)[:-1]
            if st.max_t is not None:
                before = np.maximum(before, st.max_t)
            back = np.flatnonzero(t[1:] < before - RUN_BACKWARDS_S)
            v = int(back[0]) + 1 if len(back) else e - s
            yield s, v, t[:v]
            s += v
        s = e
