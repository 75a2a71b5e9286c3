"""Writes outputs atomically, with the user's umask: the analysis folder (findings.json, report.html,
trace.duckdb) and single files (JUnit XML, annotated trace, diff.json, diff.html)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING

import orjson

if TYPE_CHECKING:
    from tracediag.analysis import Report


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_file(path: str | Path) -> Iterator[IO[bytes]]:
    """A binary file written beside `path` and renamed onto it when the block ends without error.

    A reader never sees half a file, a failure leaves nothing behind, and the file gets the mode a
    plain `open()` would give it (0666 minus the umask; mkstemp's 0600 is not what users expect).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: str | Path, data: bytes) -> None:
    with atomic_file(path) as f:
        f.write(data)


def findings_json(report: Report) -> bytes:
    """findings.json; a string longer than 4,096 characters (a hostile kernel name) is written in full once,
    under `long_strings`, and cut where it is used."""
    from tracediag.findings import compact_long_strings

    doc = compact_long_strings(report.to_dict())
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS) + b"\n"


def staged_outputs(out_dir: Path, produce: Callable[[Path], Report]) -> Report:
    """Run `produce(staging_dir)` and move its files into out_dir only when it succeeds.

    Nothing is left behind on failure: the staging directory sits next to out_dir (same file system,
    so each move is an atomic rename) and is removed whatever happens. Existing files in out_dir are
    replaced one by one, each atomically.
    """
    out_dir = Path(out_dir)
    parent = out_dir.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".partial", dir=parent))
    try:
        from tracediag.reports.html import render_html

        report = produce(staging)
        (staging / "findings.json").write_bytes(findings_json(report))
        (staging / "report.html").write_text(render_html(report), encoding="utf-8")
        out_dir.mkdir(parents=True, exist_ok=True)
        for f in staging.iterdir():
            os.replace(f, out_dir / f.name)
        return report
    finally:
        shutil.rmtree(staging, ignore_errors=True)
