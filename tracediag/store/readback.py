"""A trace.duckdb that tracediag did not just write (a baseline, a diff's input, a run named to `check`) is read as
data, never as code.

Such a file may come from anywhere — in CI the baseline is often a downloaded artifact — and a DuckDB database can
carry code: a `kernels` *view* over `read_text('<a local file>')` copies that file into every report that reads
`kernels`, a view over `range(10^12)` hangs the reader, a `CREATE MACRO median(a) AS 42` shadows the built-in and
forges every measure. So a read-back store is opened read-only with external access off (no file, no network, no
extension), and accepted only when it holds nothing but tables (no generated column) and the views tracediag's
derivations create, with their SQL exactly as they create them (compared after DuckDB's own rendering, on tables of
the store's columns); any other view, any macro, is refused as "not a tracediag store".
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import duckdb

from tracediag.errors import InputError

NOT_OURS = "not a tracediag store"
_VIEW_FILES = ("collectives_finish.sql",)  # the derivations' SQL files that create views (tracediag/derive)


def open_read_back(path: str | Path) -> duckdb.DuckDBPyConnection:
    """The store at `path` opened read-only with external access off, once checked to hold only data (tables and
    tracediag's own views); an InputError naming it otherwise."""
    try:
        con = duckdb.connect(str(path), read_only=True, config={"enable_external_access": False})
    except duckdb.Error as exc:
        raise InputError(path, f"cannot open the store read-only ({_first_line(exc)})") from None
    try:
        check_only_data(con, path)
    except BaseException:
        con.close()
        raise
    return con


def check_only_data(con: duckdb.DuckDBPyConnection, path: str | Path) -> None:
    """An InputError naming `path` unless the open store holds only data: tables and tracediag's own views."""
    query = "SELECT function_name FROM duckdb_functions() WHERE NOT internal ORDER BY function_name"
    macros = [r[0] for r in con.execute(query).fetchall()]
    if macros:
        raise InputError(path, f"{NOT_OURS}: it defines {_some(macros, 'macro')}, which tracediag never writes")
    generated = [f"{t}.{c}" for t, c in con.execute(
        "SELECT table_name, column_name FROM duckdb_columns() WHERE NOT internal AND is_generated "
        "ORDER BY table_name, column_index").fetchall()]  # fmt: skip
    if generated:  # an expression run on every read of the table
        raise InputError(path, f"{NOT_OURS}: it holds {_some(generated, 'generated column')}, which tracediag never "
                               "writes")  # fmt: skip
    views = dict(
        con.execute("SELECT view_name, sql FROM duckdb_views() WHERE NOT internal ORDER BY view_name").fetchall()
    )
    if not views:
        return
    ours = _our_views_over(con)
    foreign = sorted(name for name, sql in views.items() if ours.get(name) != sql)
    if foreign:
        raise InputError(path, f"{NOT_OURS}: it holds {_some(foreign, 'view')} that tracediag does not write")


def _our_views_over(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """{view name: SQL as DuckDB renders it} of tracediag's own views, created over empty tables of the columns
    `con`'s tables have (in memory: nothing of the store's runs)."""
    columns: dict[str, list[str]] = {}
    for table, column, data_type in con.execute(
        "SELECT table_name, column_name, data_type FROM duckdb_columns() "
        "WHERE NOT internal AND table_name IN (SELECT table_name FROM duckdb_tables() WHERE NOT internal) "
        "ORDER BY table_name, column_index"
    ).fetchall():
        columns.setdefault(table, []).append(f'"{column}" {data_type}')
    ref = duckdb.connect(":memory:", config={"enable_external_access": False})
    try:
        for table, cols in columns.items():
            try:
                ref.execute(f'CREATE TABLE "{table}" ({", ".join(cols)})')
            except duckdb.Error:
                continue  # a type this version cannot name: a view over it is then not ours
        for statement in _view_statements():
            try:
                ref.execute(statement)
            except duckdb.Error:
                continue  # the store lacks a table or column the view reads: a view of that name is not ours
        return dict(ref.execute("SELECT view_name, sql FROM duckdb_views() WHERE NOT internal").fetchall())
    finally:
        ref.close()


def _view_statements() -> list[str]:
    """The CREATE VIEW statements of tracediag's derivations."""
    out = []
    for name in _VIEW_FILES:
        text = resources.files("tracediag.derive").joinpath(name).read_text(encoding="utf-8")
        text = re.sub(r"--[^\n]*", "", text)  # comments may hold a ';'
        out += [s.strip() for s in text.split(";") if re.match(r"\s*CREATE\s+(OR\s+REPLACE\s+)?VIEW\b", s, re.I)]
    return out


def _some(names: list[str], what: str) -> str:
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"{what}{'s' if len(names) > 1 else ''} {shown}"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
