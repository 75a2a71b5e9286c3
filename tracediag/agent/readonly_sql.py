"""Read-only SQL over a run's trace.duckdb, for callers that are not trusted to write: the `query` tool.

Three barriers, each enough on its own for a write: the text must be exactly one SELECT statement (checked
with DuckDB's own parser, so `SELECT 1; DROP TABLE kernels` is two statements and is refused); the database is
opened read-only; and file access is off (`enable_external_access = false`: no `read_csv('/etc/passwd')`, no
`COPY … TO`, no ATTACH), which DuckDB refuses to turn back on while the database is open.

Bounds, because the caller may be an agent told by a trace to exhaust the server: a row cap and a byte cap on the
answer (the rows' JSON; `truncated` and `truncated_by` say which stopped it, `row_count` how many rows came back),
rows fetched a chunk at a time so that rows past the cap are never made; DuckDB's `memory_limit` (min(1 GiB, a
quarter of the machine's memory)) with no spill folder and a cap on its threads, so that a query that needs more
(a `string_agg` of a gigabyte) fails at once with a one-line error instead of taking the machine's memory; a timer
that interrupts a query past its time limit; and a cancel hook (tracediag.agent.cancel) that interrupts it when the
client cancels the call.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb

from tracediag.agent.cancel import Cancel, Cancelled
from tracediag.errors import InputError, UsageError
from tracediag.store.readback import check_only_data

MAX_ROWS = 200  # rows returned by default
ROW_CAP = 10_000  # the most rows one query may ask for
TIME_LIMIT_S = 10.0  # default time limit of one query
MAX_TIME_LIMIT_S = 120.0
MAX_BYTES = 1 << 20  # bytes of the rows' JSON in one answer
MEMORY_CAP = 1 << 30  # DuckDB memory_limit of one query: at most this, and at most a quarter of the machine's
THREADS_CAP = 2  # DuckDB threads of one query
_FETCH = 256  # rows fetched from DuckDB at a time


def machine_memory() -> int | None:
    """Bytes of memory this process may use: the machine's, or its cgroup's limit when lower (Linux)."""
    total = None
    with contextlib.suppress(AttributeError, OSError, ValueError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for f in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(f).read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            continue
        if text.isdigit() and (total is None or int(text) < total):
            total = int(text)
    return total


def query_memory_limit() -> int:
    """DuckDB's memory_limit for one agent query: min(MEMORY_CAP, a quarter of machine_memory()), ≥ 64 MiB."""
    total = machine_memory()
    return max(64 << 20, min(MEMORY_CAP, total // 4 if total else MEMORY_CAP))


def _jsonable(v: Any) -> Any:
    """A DuckDB value as JSON: numbers and text as they are, non-finite floats and other types as text."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else str(v)
    if isinstance(v, Decimal):
        return float(v)
    if isinstance(v, (datetime, date, time, timedelta)):
        return str(v)
    if isinstance(v, (bytes, bytearray, memoryview)):
        return bytes(v).hex()
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return str(v)


def _one_select(con: duckdb.DuckDBPyConnection, sql: str) -> str:
    try:
        statements = con.extract_statements(sql)
    except duckdb.Error as exc:
        raise UsageError(f"query: {_first_line(exc)}") from None
    if len(statements) != 1:
        raise UsageError(f"query: give exactly one SQL statement (got {len(statements)}); nothing was run")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise UsageError(
            f"query: only a read-only SELECT is allowed, not {kind.name}; nothing was run and the store is unchanged"
        )
    return statements[0].query


def _first_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def read_only_query(
    db_path: str | Path,
    sql: str,
    max_rows: int = MAX_ROWS,
    time_limit_s: float = TIME_LIMIT_S,
    max_bytes: int = MAX_BYTES,
    cancel: Cancel | None = None,
    memory_limit: int | None = None,
    threads: int = THREADS_CAP,
) -> dict[str, Any]:
    """{columns, types, rows, row_count, truncated, truncated_by, max_rows, max_bytes} of one SELECT over the
    store at `db_path`.

    Raises UsageError for anything but one SELECT, for a query DuckDB rejects, for one that runs past
    `time_limit_s` or over `memory_limit` (default: query_memory_limit()); Cancelled when `cancel` is set while it
    runs; InputError when the file is not a DuckDB database."""
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or not 1 <= max_rows <= ROW_CAP:
        raise UsageError(f"query: max_rows must be an integer from 1 to {ROW_CAP:,}, got {max_rows}")
    if not isinstance(time_limit_s, (int, float)) or not 0 < time_limit_s <= MAX_TIME_LIMIT_S:
        raise UsageError(f"query: time_limit_s must be above 0 and at most {MAX_TIME_LIMIT_S:g}, got {time_limit_s}")
    mem = memory_limit or query_memory_limit()
    config = {"enable_external_access": False, "memory_limit": f"{mem >> 20}MiB", "threads": max(1, threads),
              "temp_directory": ""}  # fmt: skip  # no spill folder: a query over the limit fails, it does not write
    try:
        con = duckdb.connect(str(db_path), read_only=True, config=config)
    except duckdb.Error as exc:
        raise InputError(db_path, f"cannot open the store read-only ({_first_line(exc)})") from None
    try:  # a store from elsewhere is data: a view or macro of its own would run (or forge answers) in the query
        check_only_data(con, db_path)
    except BaseException:
        con.close()
        raise
    cancel = cancel or Cancel()
    timer = threading.Timer(time_limit_s, con.interrupt)
    try:
        statement = _one_select(con, sql)
        timer.start()
        with cancel.hook(con.interrupt):
            try:
                cur = con.execute(statement)
                columns = [d[0] for d in cur.description]
                types = [str(d[1]) for d in cur.description]
                rows, truncated_by = _fetch_bounded(cur, max_rows, max_bytes)
            except duckdb.InterruptException:
                if cancel.is_set:
                    raise Cancelled() from None
                raise UsageError(f"query: stopped at the time limit ({time_limit_s:g} s); narrow it down") from None
            except duckdb.OutOfMemoryException:
                raise UsageError(
                    f"query: needs more than the {mem / 2**20:,.0f} MiB agent queries may use; aggregate less, or "
                    "select fewer or shorter values"
                ) from None
            except duckdb.Error as exc:
                raise UsageError(f"query: {_first_line(exc)}") from None
    finally:
        timer.cancel()
        con.close()
    return {
        "columns": columns,
        "types": types,
        "rows": rows,
        "row_count": len(rows),
        "truncated": truncated_by is not None,
        "truncated_by": truncated_by,
        "max_rows": max_rows,
        "max_bytes": max_bytes,
    }


def _fetch_bounded(cur: duckdb.DuckDBPyConnection, max_rows: int, max_bytes: int) -> tuple[list, str | None]:
    """The rows (as JSON values) up to `max_rows` rows and `max_bytes` bytes of their JSON, fetched a chunk at a
    time; and what cut them short: "max_rows", "max_bytes" or None."""
    import orjson

    rows: list[list[Any]] = []
    size = 2  # the brackets of the list
    while True:
        chunk = cur.fetchmany(min(_FETCH, max_rows + 1 - len(rows)))
        if not chunk:
            return rows, None
        for r in chunk:
            if len(rows) == max_rows:
                return rows, "max_rows"
            row = [_jsonable(v) for v in r]
            size += len(orjson.dumps(row)) + 1
            if size > max_bytes:
                return rows, "max_bytes"
            rows.append(row)
