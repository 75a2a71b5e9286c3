"""Writes outputs atomically, with the user's umask: the analysis folder (findings.json, report.html,
trace.duckdb) and single files (JUnit XML, annotated trace, diff.json, diff.html).

Faults of the output location are the user's to fix and are one-line errors (exit 2), never tracebacks: a
read-only or full file system, no permission, a file where the folder should be, a folder where a file should be.

Staging: the files of a run are written into a hidden staging folder on the same file system as `--out` (so each
move into place is an atomic rename, also when `--out` is a mount point such as a container volume): inside
`--out` when it exists, beside it when it does not (the finished staging folder is then renamed to `--out`).
The staging folder holds a lock for as long as its run lives; a run that was killed (`kill -9`, a crash, a power
cut) leaves its staging folder behind unlocked, and the next run that writes there removes it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: staging folders are told apart by pid and host only
    fcntl = None

from tracediag.errors import TracediagError, UsageError
from tracediag.files import (
    STAGING_SUFFIX,
    OutputGuard,
    atomic_file,
    is_location_fault,
    umask,
    write_atomic,
)

# tracediag.analysis.Report, not imported: Report.save writes through this module
Report = Any

__all__ = ["OUTPUT_NAMES", "atomic_file", "findings_json", "remove_stale", "staged_outputs", "write_atomic"]
_STAGING_INSIDE = ".tracediag-staging-"  # staging folder inside an existing --out
_LOCK = ".lock"
# staging folders of tracediag versions without a lock are removed once this old (they cannot be told apart
# from a run still going on, so not at once)
_UNLOCKED_STALE_S = 24 * 3600
# files an analysis or check writes into --out (a folder in the way of one is an error before the run starts)
OUTPUT_NAMES = ("findings.json", "report.html", "trace.duckdb", "check.json")


def _location_error(where: Path, exc: OSError, what: str = "write the output") -> UsageError:
    reason = exc.strerror or str(exc)
    if exc.errno == errno.EISDIR and exc.filename:
        reason = f"{exc.filename} is a folder"
    return UsageError(f"--out {where}: cannot {what} there ({reason})")


def findings_json(report: Report) -> bytes:
    """findings.json. A string longer than 4,096 characters (a hostile kernel name) is written in full once,
    under `long_strings`, and cut where it is used; a value JSON cannot carry as a number (an integer beyond
    64 bits) is written as its decimal text rather than failing the run at its last step."""
    from tracediag.findings import compact_long_strings

    doc = compact_long_strings(report.to_dict())
    option = orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS
    try:
        return orjson.dumps(doc, option=option) + b"\n"
    except orjson.JSONEncodeError:
        return orjson.dumps(_jsonable(doc), option=option) + b"\n"


def _jsonable(o):
    if isinstance(o, bool) or o is None:
        return o
    if isinstance(o, int):
        return o if -(2**63) <= o < 2**64 else str(o)
    if isinstance(o, dict):
        return {k: _jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_jsonable(v) for v in o]
    return o


# --- staging ---------------------------------------------------------------------------------------------


class _Staging:
    """A hidden folder on the same file system as `--out`, locked while this run lives."""

    def __init__(self, out_dir: Path) -> None:
        self.out_dir = out_dir
        self.inside = out_dir.is_dir()
        base = out_dir if self.inside else out_dir.parent
        prefix = _STAGING_INSIDE if self.inside else f".{out_dir.name}."
        remove_stale(out_dir)
        self.path = Path(tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}.", suffix=STAGING_SUFFIX, dir=base))
        self._lock = os.open(self.path / _LOCK, os.O_CREAT | os.O_WRONLY, 0o600)
        try:
            if fcntl is not None:
                fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pass  # no locks on this file system: the pid and host written below tell a live run apart
        os.write(self._lock, f"{os.getpid()} {socket.gethostname()}\n".encode())

    def unlock(self) -> None:
        if self._lock >= 0:
            with contextlib.suppress(OSError):
                os.close(self._lock)
            self._lock = -1

    def remove(self) -> None:
        self.unlock()
        shutil.rmtree(self.path, ignore_errors=True)


def _staging_folders(out_dir: Path) -> list[Path]:
    found: list[Path] = []
    with contextlib.suppress(OSError):
        if out_dir.is_dir():
            found += [p for p in out_dir.iterdir() if p.name.startswith(_STAGING_INSIDE)]
    with contextlib.suppress(OSError):
        prefix = f".{out_dir.name}."
        found += [p for p in out_dir.parent.iterdir() if p.name.startswith(prefix)]
    return [p for p in found if p.name.endswith(STAGING_SUFFIX) and p.is_dir() and not p.is_symlink()]


def _is_stale(folder: Path) -> bool:
    lock = folder / _LOCK
    try:
        fd = os.open(lock, os.O_RDWR)
    except FileNotFoundError:  # a version without locks, or a run that has not written its lock yet
        try:
            return time.time() - folder.stat().st_mtime > _UNLOCKED_STALE_S
        except OSError:
            return False
    except OSError:
        return False
    try:
        try:
            if fcntl is None:
                raise OSError(errno.ENOLCK, "no flock")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # a live run holds it
        except OSError:  # no locks here: a run on this host whose process is gone
            pid, _, host = os.pread(fd, 256, 0).decode("utf-8", "replace").strip().partition(" ")
            if host != socket.gethostname() or not pid.isdigit():
                return False
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                return True
            except OSError:
                return False
            return False
        return True  # nobody holds the lock: its run is gone
    finally:
        os.close(fd)


def remove_stale(out_dir: str | Path) -> list[Path]:
    """Remove staging folders that killed runs left in and beside `out_dir`; returns those removed."""
    removed = []
    for folder in _staging_folders(Path(out_dir)):
        if _is_stale(folder):
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _preflight(out_dir: Path, guard: OutputGuard | None, names: tuple[str, ...]) -> None:
    """Faults of the location that can be seen before a run of minutes: say them now. With a guard: an input or a
    file tracediag did not write where an output goes is refused (tracediag/files.py)."""
    if guard is not None:
        guard.check_folder(out_dir, names)
    if out_dir.exists() and not out_dir.is_dir():
        raise UsageError(f"--out {out_dir}: is a file, not a folder")
    for name in names:
        target = out_dir / name
        if target.is_dir() and not target.is_symlink():
            raise UsageError(f"--out {out_dir}: {name} there is a folder; remove it or choose another --out")


def staged_outputs(
    out_dir: Path,
    produce: Callable[[Path], Report],
    guard: OutputGuard | None = None,
    names: tuple[str, ...] = OUTPUT_NAMES,
) -> Report:
    """Run `produce(staging_dir)` and move its files into out_dir only when it succeeds.

    Nothing is left behind on failure or interruption (SIGINT, SIGTERM: the staging folder is removed; after
    `kill -9`, by the next run). The staging folder is on the same file system as out_dir (module docstring),
    so each move is an atomic rename; existing files in out_dir are replaced one by one, each atomically.
    """
    out_dir = Path(out_dir)
    _preflight(out_dir, guard, names)
    try:
        out_dir.parent.mkdir(parents=True, exist_ok=True)
        staging = _Staging(out_dir)
    except OSError as exc:
        raise _location_error(out_dir, exc) from None
    try:
        from tracediag.reports.html import render_html

        try:
            report = produce(staging.path)
            (staging.path / "findings.json").write_bytes(findings_json(report))
            (staging.path / "report.html").write_text(render_html(report), encoding="utf-8")
        except TracediagError:
            raise
        except Exception as exc:
            if is_location_fault(exc):
                if isinstance(exc, OSError):
                    raise _location_error(out_dir, exc) from None
                raise UsageError(f"--out {out_dir}: cannot write trace.duckdb there ({_first_line(exc)})") from None
            raise
        _move_into_place(staging, out_dir)
        return report
    finally:
        staging.remove()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _move_into_place(staging: _Staging, out_dir: Path) -> None:
    files = [f for f in staging.path.iterdir() if f.name != _LOCK]
    try:
        if not staging.inside and not out_dir.exists():
            # a new --out: the whole folder appears at once
            staging.unlock()
            (staging.path / _LOCK).unlink()
            os.chmod(staging.path, 0o777 & ~umask())
            try:
                os.rename(staging.path, out_dir)
                return
            except OSError as exc:
                if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY):
                    raise
                # another run created --out meanwhile: move the files in one by one
        out_dir.mkdir(parents=True, exist_ok=True)
        for f in files:
            os.replace(f, out_dir / f.name)
    except OSError as exc:
        raise _location_error(out_dir, exc, "move the output into place") from None
