"""Input discovery and ingest orchestration: files -> canonical tables in the store."""

from __future__ import annotations

import gzip
import multiprocessing as mp
import os
import sys
import zlib
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import duckdb
import pyarrow as pa

from tracediag.errors import InputError, UsageError
from tracediag.ingest.kineto import ParsedTrace, parse_kineto
from tracediag.store import append_arrow, append_rows

TRACE_SUFFIXES = (".json", ".json.gz")
_SNIFF_BYTES = 1 << 16


def looks_like_other_json(path: Path) -> bool:
    """True for a readable JSON file whose head has no trace keys (a config.json beside the traces).

    Used only when expanding a directory; unreadable or corrupt files are kept so that they fail
    loudly with their own error instead of being skipped.
    """
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            f.seek(0)
            if head == b"\x1f\x8b":
                with gzip.open(f) as g:
                    text = g.read(_SNIFF_BYTES)
            else:
                text = f.read(_SNIFF_BYTES)
    except (OSError, EOFError, zlib.error):
        return False
    stripped = text.lstrip()
    if not stripped.startswith((b"{", b"[")):
        return False
    return b'"traceEvents"' not in text and b'"ph"' not in text and len(text) < _SNIFF_BYTES


def discover_inputs(paths: list[str | Path]) -> list[Path]:
    """Expand directories to the trace files inside them (sorted), keep files as given.

    In a directory, JSON files that are plainly not traces (config.json, notes) are passed over;
    a file named explicitly is always parsed, so a wrong file fails with its own error.
    """
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            files = sorted(
                f
                for f in p.iterdir()
                if f.is_file() and f.name.endswith(TRACE_SUFFIXES) and not looks_like_other_json(f)
            )
            if not files:
                raise InputError(p, "directory holds no trace files (*.json, *.json.gz with traceEvents)")
            found.extend(files)
        elif p.exists():
            found.append(p)
        else:
            raise InputError(p, "no such file or directory")
    if not found:
        raise UsageError("no input files given")
    return found


def _parse_job(args: tuple[str, int, bool]) -> ParsedTrace:
    path, order, keep_python = args
    return parse_kineto(path, order=order, keep_python=keep_python)


def parse_all(files: list[Path], keep_python: bool = False, jobs: int | None = None) -> list[ParsedTrace]:
    """Parse rank files, one process per file when there are several (bounded by the cores)."""
    work = [(str(f), i, keep_python) for i, f in enumerate(files)]
    jobs = jobs or min(len(files), os.cpu_count() or 1)
    if len(files) == 1 or jobs <= 1:
        return [_parse_job(w) for w in work]
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        return list(pool.map(_parse_job, work))


def load(con: duckdb.DuckDBPyConnection, parsed: list[ParsedTrace]) -> None:
    """Write parsed traces into the store; two files claiming the same rank is an input error."""
    seen: dict[int, str] = {}
    for pt in parsed:
        rank = pt.meta["rank"]
        if rank in seen:
            raise InputError(
                pt.path,
                f"rank {rank} ({pt.meta['rank_source']}) was already given by {seen[rank]}; "
                "pass the traces of one run, one file per rank",
            )
        seen[rank] = pt.path
    append_rows(con, "inputs", [pt.meta for pt in parsed])
    append_rows(con, "process_groups", [pg for pt in parsed for pg in pt.process_groups])
    by_table: dict[str, list[pa.Table]] = {}
    for pt in parsed:
        for name, table in pt.tables.items():
            by_table.setdefault(name, []).append(table)
    for name, tables in by_table.items():
        for t in tables:
            append_arrow(con, name, t)
