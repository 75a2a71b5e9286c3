"""Opening an input file: the checks every reader makes before it parses a byte.

An input is a regular file. A named pipe blocks until something writes to it, and a character device (/dev/zero,
a terminal) or a socket never ends, so `regular_file` refuses anything else from its `stat`, before it is opened;
`open_input` opens without blocking and checks again what it opened (a pipe put in the file's place meanwhile).

Readers that hold a whole file (metrics, benchmark results, nccl-tests output, topology snapshots, model configs)
read it with `read_input`, which stops at `memory.read_bytes_budget()` bytes (of the file, or of what it expands to
when it is gzip) with an error naming the file, the budget and the --memory-limit it comes from. Readers that
stream (logs, Kineto traces) hold a chunk at a time whatever the size, and open the file with `open_stream`: a
gzip stream there is bounded by GZIP_MAX_RATIO times the compressed size (and at least GZIP_RATIO_FLOOR), as no
real capture expands that much (Kineto JSON 8-22x, logs 10-30x) and a gzip bomb (~1000x per member, members
concatenated without end) does: its bytes are parsed as a real file's would be, at a log parser's few MB/s.

`skip_nul_run` steps over a run of NUL bytes (a log truncated in place by logrotate's copytruncate starts with one;
on a file system with sparse files it is a hole, stepped over without reading it).
"""

from __future__ import annotations

import errno
import io
import os
import stat
import zlib
from pathlib import Path
from typing import BinaryIO

from tracediag.errors import InputError
from tracediag.memory import CHUNK_FACTOR, memory_limit, read_bytes_budget

GZIP_MAGIC = b"\x1f\x8b"
GZIP_MAX_RATIO = 100  # decompressed / compressed bytes of a streamed gzip input
GZIP_RATIO_FLOOR = 1 << 20  # a small file may expand more (a few repeated lines)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_BINARY = getattr(os, "O_BINARY", 0)


def size_text(n: int) -> str:
    """Bytes as the CLI's --memory-limit writes them: '64 MiB', '3.0 GiB', '512 bytes'."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.1f} {unit}"
    return f"{n} bytes"


def _kind(mode: int) -> str | None:
    """What a file that is not a regular file is, in words; None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _refused(path: str | Path, mode: int, what: str) -> InputError:
    kind = _kind(mode)
    if stat.S_ISDIR(mode):
        return InputError(path, f"{kind}, not a file: give the {what} file itself")
    return InputError(
        path, f"{kind}, not a regular file: a pipe or a device may never end; save the {what} to a file and give that"
    )


def regular_file(path: str | Path, what: str = "input") -> os.stat_result:
    """The file's stat when it is a regular file (symbolic links followed); InputError otherwise, without opening
    it (opening a named pipe blocks until a writer comes)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise InputError(path, "no such file or directory") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        raise InputError(path, f"cannot read {what} ({getattr(exc, 'strerror', None) or exc})") from None
    if not stat.S_ISREG(st.st_mode):
        raise _refused(path, st.st_mode, what)
    return st


def open_input(path: str | Path, what: str = "input") -> BinaryIO:
    """The file opened for binary reading, when it is a regular file (`regular_file`); InputError otherwise."""
    regular_file(path, what)
    try:
        fd = os.open(path, os.O_RDONLY | _NONBLOCK | _CLOEXEC | _BINARY)
    except OSError as exc:
        raise InputError(path, f"cannot read {what} ({exc.strerror or exc})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # replaced by a pipe or a device since the check
            raise _refused(path, st.st_mode, what)
        if _NONBLOCK:
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def _budget_text(limit: int | None) -> str:
    return (
        f"the {size_text(read_bytes_budget(limit))} one file may take under --memory-limit "
        f"{size_text(memory_limit(limit))} (1/{CHUNK_FACTOR} of it)"
    )


def too_large(path: str | Path, what: str, size: int | None, limit: int | None = None) -> InputError:
    """The error of a file beyond the read budget: its size (None: a gzip file whose decompressed size is not known
    beyond the budget), the budget, and the option that raises it."""
    budget = read_bytes_budget(limit)
    if size is None:
        head = f"{what} expands (gzip) to more than {size_text(budget)}"
        hint = ""
    else:
        head = f"{what} is {size_text(size)}"
        need = max(memory_limit(limit), size * CHUNK_FACTOR)
        hint = f" (e.g. --memory-limit {-(-need // (1 << 30))}GiB)"
    return InputError(path, f"{head}, more than {_budget_text(limit)}; raise --memory-limit to read it{hint}")


def read_input(path: str | Path, what: str, limit: int | None = None) -> bytes:
    """The whole file's bytes, gunzipped when it starts with the gzip magic, within the read budget (`too_large`
    beyond it, checked before anything is read for a plain file, as the decompression goes for gzip; a gzip file is
    also held to the ratio of `open_stream`)."""
    budget = read_bytes_budget(limit)
    f, gz = open_stream(path, what, limit)
    with f:
        if not gz:
            try:
                size = os.fstat(f.fileno()).st_size
                if size > budget:
                    raise too_large(path, what, size, limit)
                data = f.read(budget + 1)  # bounded even if the file grows meanwhile
            except OSError as exc:
                raise InputError(path, f"cannot read {what} ({exc.strerror or exc})") from None
            if len(data) > budget:
                raise too_large(path, what, len(data), limit)
            return data
        try:
            data = f.read(budget + 1)  # decompressed as it is read: never more than this is made
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(path, f"corrupt gzip {what} ({exc})") from None
    if len(data) > budget:
        raise too_large(path, what, None, limit)
    return data


_GZIP_READ = 1 << 20  # compressed bytes read at a time


class _GzipStream(io.RawIOBase):
    """The decompressed bytes of a gzip file (members one after another, zero padding between or after them skipped,
    as gzip(1) does), which fails, naming the file, once it has produced more than `cap` bytes.

    zlib directly, not gzip.GzipFile: GzipFile reads the zero padding after a member one byte per call (a gzip
    file followed by a 3 GiB hole took 25 minutes), and this is also where the output is counted."""

    def __init__(self, path: str | Path, what: str, raw: BinaryIO, cap: int, compressed: int) -> None:
        self._path, self._what, self._raw = path, what, raw
        self._cap, self._compressed, self._out = cap, compressed, 0
        self._d = zlib.decompressobj(31)  # 31: a gzip header and trailer
        self._input = b""  # compressed bytes read but not given to the decompressor yet
        self._done = False

    def readable(self) -> bool:
        return True

    def _next_member(self) -> bool:
        """After a member's end: start the next one (False at the end of the file); zero padding is skipped."""
        rest = self._d.unused_data.lstrip(b"\x00")
        while len(rest) < 2:
            more = self._raw.read(_GZIP_READ)
            if not more:
                if rest:
                    raise OSError(f"trailing data after the last gzip member ({rest!r})")
                return False
            rest = (rest + more).lstrip(b"\x00")
        if rest[:2] != GZIP_MAGIC:
            raise OSError(f"data after a gzip member is not gzip ({rest[:8]!r}…)")
        self._d = zlib.decompressobj(31)
        self._input = rest
        return True

    def readinto(self, b) -> int:
        want = len(b)
        while not self._done and want:
            if self._d.eof:
                if not self._next_member():
                    self._done = True
                    break
                continue
            data = self._d.unconsumed_tail or self._input or self._raw.read(_GZIP_READ)
            self._input = b""
            if not data:
                raise EOFError("Compressed file ended before the end-of-stream marker was reached")
            out = self._d.decompress(data, want)
            if not out:
                continue  # a header, or the end of a member
            n = len(out)
            b[:n] = out
            self._out += n
            if self._out > self._cap:
                raise InputError(
                    self._path,
                    f"gzip {self._what} expands to more than {size_text(self._cap)}, over {GZIP_MAX_RATIO} times its "
                    f"{size_text(self._compressed)} (no real capture compresses that well: a gzip bomb?); if it is "
                    "real, decompress it and give the plain file",
                )
            return n
        return 0

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


def open_stream(path: str | Path, what: str = "input", limit: int | None = None) -> tuple[BinaryIO, bool]:
    """(binary stream of the file's bytes, gunzipped when it starts with the gzip magic; whether it is gzip).
    A gzip stream fails with an InputError beyond max(GZIP_RATIO_FLOOR, GZIP_MAX_RATIO × compressed size), and
    with OSError / EOFError / zlib.error when it is corrupt or truncated."""
    f = open_input(path, what)
    try:
        head = f.read(2)
        f.seek(0)
        if head != GZIP_MAGIC:
            return f, False
        compressed = os.fstat(f.fileno()).st_size
        cap = max(GZIP_RATIO_FLOOR, GZIP_MAX_RATIO * compressed)
        return io.BufferedReader(_GzipStream(path, what, f, cap, compressed), 1 << 16), True  # type: ignore[return-value]
    except OSError as exc:
        f.close()
        raise InputError(path, f"cannot read {what} ({exc.strerror or exc})") from None
    except BaseException:
        f.close()
        raise


def skip_nul_run(f: BinaryIO, gz: bool) -> int:
    """Skip the run of NUL bytes at the position of `f` (a stream of `open_stream`); returns its length. logrotate's
    copytruncate empties a log while the server goes on writing at its old offset, so the file starts with that
    many NULs: on a file system with sparse files a hole, which SEEK_DATA steps over without reading it (the block
    the run starts in is read, then the hole after it is stepped over)."""
    skipped = 0
    while head := f.peek(1 << 16):
        run = len(head) - len(head.lstrip(b"\x00"))
        if run:
            f.read(run)
            skipped += run
        if run < len(head):
            break
        if not gz and hasattr(os, "SEEK_DATA"):
            skipped += _to_data(f)
    return skipped


def _to_data(f: BinaryIO) -> int:
    """Move a plain file's stream to where data resumes after its position (SEEK_DATA); returns the bytes skipped."""
    fd = f.fileno()
    at = f.tell()
    here = os.lseek(fd, 0, os.SEEK_CUR)  # the buffered reader's idea of the descriptor's offset: kept
    try:
        data = os.lseek(fd, at, os.SEEK_DATA)
    except OSError as exc:  # ENXIO: no data after `at` (the rest is a hole); else no SEEK_DATA here
        data = os.fstat(fd).st_size if exc.errno == errno.ENXIO else at
    finally:
        os.lseek(fd, here, os.SEEK_SET)
    if data > at:
        f.seek(data)
    return data - at
