"""The files tracediag writes: atomic writes with the user's umask, and the output guard that keeps every
writing command and option off the user's files.

This module is on the lowest floor (it imports nothing of tracediag but the errors), so that the store, the gate,
the diff and the output staging can all use it.

The guard's contract (every command and option that writes: `--out`, `--junit`, `--annotated-trace`, `--store`,
`scrape -o`, `capture -o`, `diff -o`):
- a target that is one of the run's inputs (the same file, through any symlink or hard link, or an input
  folder) is refused, always;
- an existing file that tracediag did not write is refused unless `--force` is given. tracediag's files are told
  by their content (`is_tracediag_output`): each kind carries a marker that no user file carries by chance.
  An empty file holds nothing to lose and may be replaced.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import os
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tracediag.errors import UsageError

STAGING_SUFFIX = ".partial"
# errno values that say the location cannot take the output (the user's to fix)
LOCATION_ERRNOS = {
    errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, errno.EISDIR, errno.ENOTDIR, errno.EEXIST,
    errno.ENAMETOOLONG, errno.ELOOP, errno.EXDEV, errno.EFBIG, errno.EMLINK, errno.ENOENT, errno.EIO,
    errno.ENOTEMPTY,
}  # fmt: skip


# what DuckDB says when it cannot write its database file (its IOException carries no errno)
DUCKDB_WRITE_FAULTS = ("No space left on device", "Read-only file system", "Permission denied", "Disk quota exceeded",
                       "File too large", "Input/output error")  # fmt: skip


def is_location_fault(exc: BaseException) -> bool:
    """Whether `exc` says the output location cannot take the files (the user's to fix), not a bug."""
    if isinstance(exc, OSError):
        return exc.errno in LOCATION_ERRNOS or any(s in str(exc) for s in DUCKDB_WRITE_FAULTS)
    try:
        import duckdb
    except ImportError:  # pragma: no cover - duckdb is a dependency
        return False
    return isinstance(exc, duckdb.Error) and any(s in str(exc) for s in DUCKDB_WRITE_FAULTS)


def fault_reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror + (f": {exc.filename}" if exc.filename else "")
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[IO[bytes]]:
    """A binary file written beside `path` and renamed onto it when the block ends without error.

    A reader never sees half a file, a failure leaves nothing behind, and the file gets the mode a
    plain `open()` would give it (0666 minus the umask; mkstemp's 0600 is not what users expect).
    A location that cannot take the file is a UsageError naming it.
    """
    path = Path(path)
    try:
        if path.is_dir():
            raise UsageError(f"{path} is a folder; give a file path")
        if path.exists() and not path.is_file():  # renaming onto /dev/null (as root) would replace the device
            raise UsageError(f"{path} is not a regular file (a FIFO, socket or device); give a file path")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=STAGING_SUFFIX, dir=path.parent)
    except OSError as exc:
        raise UsageError(f"cannot write {path} ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.chmod(tmp, 0o666 & ~umask())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.errno in LOCATION_ERRNOS:
            raise UsageError(f"cannot write {path} ({exc.strerror or exc})") from None
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, data: bytes) -> None:
    with atomic_file(path) as f:
        f.write(data)


# --- what tracediag wrote ---------------------------------------------------------------------------------

# Markers in the first (or, for the annotated trace, last) 64 KiB of each kind of file tracediag writes.
_HEAD_MARKERS = (
    b'"schema": "tracediag/',  # findings.json, check.json, diff.json, a store's manifest.json
    b'"schema":"tracediag/',
    b'<meta name="generator" content="tracediag',  # report.html, diff.html
    b'<testsuites name="tracediag',  # --junit
    b"# tracediag-scrape ",  # scrape -o
    b"tracediag findings",  # --annotated-trace: its findings processes are named first
)
_TAIL_MARKERS = (b'"tracediag": {"tool":{"name":"tracediag"', b'"tool":{"name":"tracediag"')
_PEEK = 64 * 1024
_DUCKDB_MAGIC = b"DUCK"  # at offset 8 of a DuckDB database file
STORE_TABLES = frozenset({"inputs", "kernels", "cpu_ops", "runtime"})  # tracediag/store/schema.sql


def is_tracediag_output(path: str | Path) -> bool:
    """Whether the existing regular file `path` is one tracediag wrote (or is empty: nothing to lose)."""
    p = Path(path)
    try:
        size = p.stat().st_size
        if size == 0:
            return True
        with open(p, "rb") as f:
            head = f.read(_PEEK)
            if size > _PEEK:
                f.seek(max(_PEEK, size - _PEEK))
                tail = f.read(_PEEK)
            else:
                tail = head
    except OSError:
        return False
    if head[:2] == b"\x1f\x8b":  # a gzip annotated trace: its marker is in the last bytes of the content
        try:
            with gzip.open(p, "rb") as g:
                head = tail = g.read(_PEEK)
                while chunk := g.read(1 << 20):
                    tail = (tail + chunk)[-_PEEK:]
        except (OSError, EOFError):
            return False
    if any(m in head for m in _HEAD_MARKERS) or any(m in tail for m in _TAIL_MARKERS):
        return True
    if head[8:12] == _DUCKDB_MAGIC:
        return _is_tracediag_database(p)
    return False


def database_tables(path: Path) -> set[str]:
    """The table names of the DuckDB database at `path`, opened read-only; duckdb.Error when it cannot be opened."""
    import duckdb

    con = duckdb.connect(str(path), read_only=True)
    try:
        return {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
    finally:
        con.close()


def missing_store_tables(names: set[str]) -> list[str]:
    """The tables every tracediag store holds (tracediag/store/schema.sql) that `names` lacks."""
    return sorted(STORE_TABLES - names)


def _is_tracediag_database(path: Path) -> bool:
    try:
        names = database_tables(path)
    except Exception:  # locked, another version's format, not a database after all: not provably ours
        return False
    return not missing_store_tables(names)


# --- the guard --------------------------------------------------------------------------------------------


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()  # follows symlinks: a link to an input is the input
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


@contextlib.contextmanager
def _probing(path: str | Path, option: str) -> Iterator[None]:
    """Looking at an output path can itself fail (a name too long, a component that is a file, no permission)."""
    try:
        yield
    except OSError as exc:
        raise UsageError(f"{option} {path}: cannot write there ({exc.strerror or exc})") from None


# an input folder with more files than this is not walked file by file (its inode set would cost more than
# the run); the folder itself is still guarded, and so is every file named on the command line
_MAX_WALK = 20_000


@dataclass
class OutputGuard:
    """The run's inputs, and whether `--force` was given; `check_*` raise UsageError before anything is written.

    Built once per command from every path the command reads (traces, folders, --model, --log, --baseline, …)."""

    inputs: list[Path] = field(default_factory=list)
    force: bool = False

    def __post_init__(self) -> None:
        self._files: set[tuple[int, int]] = set()
        self._folders: set[tuple[int, int]] = set()
        walked = 0
        for p in self.inputs:
            p = Path(p)
            ident = _identity(p)
            if ident is None:
                continue
            if p.is_dir():
                self._folders.add(ident)
                for root, _dirs, names in os.walk(p):
                    for n in names:
                        walked += 1
                        if walked > _MAX_WALK:
                            break
                        if (i := _identity(Path(root, n))) is not None:
                            self._files.add(i)
            else:
                self._files.add(ident)

    @classmethod
    def of(cls, *groups: Iterable[str | Path | None] | str | Path | None, force: bool = False) -> OutputGuard:
        """From any mix of paths, lists of paths and Nones (the options as the CLI has them)."""
        paths: list[Path] = []
        for g in groups:
            if g is None:
                continue
            if isinstance(g, (str, Path)):
                paths.append(Path(g))
            else:
                paths += [Path(x) for x in g if x is not None]
        return cls(paths, force)

    def is_input(self, path: Path) -> bool:
        ident = _identity(path)
        return ident is not None and (ident in self._files or ident in self._folders)

    @staticmethod
    def check_link(p: Path, option: str) -> None:
        """A symbolic link that leads nowhere (dangling, or a loop) cannot take an output."""
        try:
            dangling = p.is_symlink() and not p.exists()
        except OSError:  # ELOOP on some systems
            dangling = True
        if dangling:
            raise UsageError(f"{option} {p}: is a symbolic link that leads nowhere (dangling or a loop); remove it")

    def check_file(self, path: str | Path, option: str) -> None:
        """A single output file (`--junit`, `--annotated-trace`, `scrape -o`, a file inside `--out`)."""
        with _probing(path, option):
            self._check_file(Path(path), str(path), option)

    def check_folder(self, path: str | Path, names: Iterable[str], option: str = "--out") -> None:
        """An output folder and the files the command writes into it (`--out`, `diff -o`, `capture -o`)."""
        with _probing(path, option):
            self._check_folder(Path(path), str(path), tuple(names), option)

    def _check_file(self, p: Path, path: str, option: str) -> None:
        if str(path) == "":
            raise UsageError(f"{option}: empty path; give a file name")
        if self.is_input(p):
            raise UsageError(f"{option} {p}: is one of the inputs; writing there would replace it — give another path")
        self.check_link(p, option)
        if p.exists() and not p.is_file() and not p.is_dir():  # replacing /dev/null as root would be a disaster
            raise UsageError(f"{option} {p}: not a regular file (a FIFO, socket or device); give a file path")
        if p.exists() and p.is_file() and not self.force and not is_tracediag_output(p):
            raise UsageError(
                f"{option} {p}: a file that tracediag did not write is there; pass --force to replace it, "
                "or give another path"
            )

    def _check_folder(self, p: Path, path: str, names: tuple[str, ...], option: str) -> None:
        if str(path) == "":
            raise UsageError(f"{option}: empty path; give a folder (e.g. {option} tracediag-out)")
        if self.is_input(p):
            raise UsageError(f"{option} {p}: is one of the inputs; give another folder for the outputs")
        self.check_link(p, option)
        if p.is_dir():
            for name in names:
                target = p / name
                if target.exists() and not target.is_dir():
                    self._check_file(target, str(target), option)


def require_regular_file(path: str | Path) -> None:
    """What tracediag reads back (a findings.json, a trace.duckdb, a baseline) must be a regular file: a FIFO or a
    device would block or never end. The same check, and words, as every input (tracediag/inputfile.py)."""
    from tracediag.inputfile import regular_file

    regular_file(path, Path(path).name)  # "save the trace.duckdb to a file and give that"
