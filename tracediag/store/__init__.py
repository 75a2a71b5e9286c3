"""The DuckDB store: one database file per analysis, canonical tables from schema.sql."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa


def _sql(package: str, name: str) -> str:
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")


def schema_files() -> list[str]:
    """schema.sql (profiler tables) first, then the other schema_*.sql files (telemetry, topology...)."""
    names = sorted(
        f.name
        for f in resources.files("tracediag.store").iterdir()
        if f.name.startswith("schema") and f.name.endswith(".sql")
    )
    return sorted(names, key=lambda n: n != "schema.sql")


def open_store(path: str | Path | None = None) -> duckdb.DuckDBPyConnection:
    """Open a new store (file or in-memory) with the canonical schema created."""
    con = duckdb.connect(str(path) if path else ":memory:")
    for name in schema_files():
        con.execute(_sql("tracediag.store", name))
    return con


def has_table(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    return bool(
        con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [table]).fetchone()[0]
    )


def column_names(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    return [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]  # table names are ours, not input


def append_arrow(con: duckdb.DuckDBPyConnection, table: str, data: pa.Table) -> None:
    """Bulk-append an Arrow table; columns are matched by name, missing ones become NULL."""
    if not has_table(con, table):
        raise ValueError(f"unknown table {table}: add it to a tracediag/store/schema*.sql file")
    cols = column_names(con, table)
    present = [c for c in cols if c in data.column_names]
    view = f"_incoming_{table}"
    con.register(view, data)
    try:
        select = ", ".join(f'"{c}"' if c in present else "NULL" for c in cols)
        con.execute(f"INSERT INTO {table} SELECT {select} FROM {view}")
    finally:
        con.unregister(view)


def append_rows(con: duckdb.DuckDBPyConnection, table: str, rows: list[dict[str, Any]]) -> None:
    """Append a handful of metadata rows (one per input file), still as one bulk insert."""
    if rows:
        cols = column_names(con, table)
        append_arrow(con, table, pa.Table.from_pylist([{c: r.get(c) for c in cols} for r in rows]))


def run_sql_file(con: duckdb.DuckDBPyConnection, package: str, name: str) -> None:
    con.execute(_sql(package, name))


def table_count(con: duckdb.DuckDBPyConnection, table: str) -> int:
    """Rows in a store table (0 when the table does not exist); `table` is a name of ours, never input."""
    return con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] if has_table(con, table) else 0


def query_dicts(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
    """Rows as dicts (column name -> value), parameters bound."""
    cur = con.execute(sql, params or [])
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]
