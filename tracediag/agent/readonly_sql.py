"""Read-only SQL over a run's trace.duckdb, for callers that are not trusted to write: the `query` tool.

Three barriers, each enough on its own for a write: the text must be exactly one SELECT statement (checked
with DuckDB's own parser, so `SELECT 1; DROP TABLE kernels` is two statements and is refused); the database is
opened read-only; and file access is off (`enable_external_access = false`: no `read_csv('/etc/passwd')`, no
`COPY … TO`, no ATTACH), which DuckDB refuses to turn back on while the database is open. A row cap keeps the
answer small and a timer interrupts a query that runs past its time limit.
"""

from __future__ import annotations

import math
import threading
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import duckdb

from tracediag.errors import InputError, UsageError

MAX_ROWS = 200  # rows returned by default
ROW_CAP = 10_000  # the most rows one query may ask for
TIME_LIMIT_S = 10.0  # default time limit of one query
MAX_TIME_LIMIT_S = 120.0


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
) -> dict[str, Any]:
    """{columns, types, rows, row_count, truncated, max_rows} of one SELECT over the store at `db_path`.

    Raises UsageError for anything but one SELECT, for a query DuckDB rejects and for one that runs past
    `time_limit_s`; InputError when the file is not a DuckDB database."""
    if not 1 <= max_rows <= ROW_CAP:
        raise UsageError(f"query: max_rows must be 1 to {ROW_CAP:,}, got {max_rows}")
    if not 0 < time_limit_s <= MAX_TIME_LIMIT_S:
        raise UsageError(f"query: time_limit_s must be above 0 and at most {MAX_TIME_LIMIT_S:g}, got {time_limit_s}")
    try:
        con = duckdb.connect(str(db_path), read_only=True, config={"enable_external_access": False})
    except duckdb.Error as exc:
        raise InputError(db_path, f"cannot open the store read-only ({_first_line(exc)})") from None
    timer = threading.Timer(time_limit_s, con.interrupt)
    try:
        statement = _one_select(con, sql)
        timer.start()
        try:
            cur = con.execute(statement)
            rows = cur.fetchmany(max_rows + 1)
        except duckdb.InterruptException:
            raise UsageError(f"query: stopped at the time limit ({time_limit_s:g} s); narrow it down") from None
        except duckdb.Error as exc:
            raise UsageError(f"query: {_first_line(exc)}") from None
        columns = [d[0] for d in cur.description]
        types = [str(d[1]) for d in cur.description]
    finally:
        timer.cancel()
        con.close()
    truncated = len(rows) > max_rows
    rows = rows[:max_rows]
    return {
        "columns": columns,
        "types": types,
        "rows": [[_jsonable(v) for v in r] for r in rows],
        "row_count": len(rows),
        "truncated": truncated,
        "max_rows": max_rows,
    }
