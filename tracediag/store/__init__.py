"""The DuckDB store: one database file per analysis, canonical tables from schema.sql.

Every column carries its unit and meaning as a DuckDB column comment (`duckdb_columns()`, `DESCRIBE`
shows them in recent DuckDB), taken from the `-- comment` beside the column in the schema files and in the
derivations' SQL (and the `# comment` of the collectives table's Arrow schema).
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb

from tracediag.memory import duckdb_settings

if TYPE_CHECKING:  # Arrow is imported where data is appended: reading a store needs none
    import pyarrow as pa


@functools.cache
def _sql(package: str, name: str) -> str:
    """The text of a SQL file of the package (package data: read once per process)."""
    return resources.files(package).joinpath(name).read_text(encoding="utf-8")


def schema_files() -> list[str]:
    """schema.sql (profiler tables) first, then the other schema_*.sql files (telemetry, topology...)."""
    return list(_schema_files())


@functools.cache
def _schema_files() -> tuple[str, ...]:
    names = sorted(
        f.name
        for f in resources.files("tracediag.store").iterdir()
        if f.name.startswith("schema") and f.name.endswith(".sql")
    )
    return tuple(sorted(names, key=lambda n: n != "schema.sql"))


def connect(path: str | Path | None = None, memory_limit: int | None = None) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection within the memory budget (`tracediag.memory`): `memory_limit` set from it,
    spilling beyond it to `<file>.tmp` beside a file store (DuckDB's default) or, in memory, to a folder in
    the system's temporary folder."""
    import os
    import tempfile

    config = duckdb_settings(memory_limit)
    if not path:
        config["temp_directory"] = os.path.join(tempfile.gettempdir(), f"tracediag-duckdb-{os.getpid()}")
    return duckdb.connect(str(path) if path else ":memory:", config=config)


def open_store(path: str | Path | None = None, memory_limit: int | None = None) -> duckdb.DuckDBPyConnection:
    """Open a new store (file or in-memory) with the canonical schema created."""
    con = connect(path, memory_limit)
    with transaction(con):  # one commit: a file store syncs its write-ahead log once, not once per table
        for name in schema_files():
            con.execute(_sql("tracediag.store", name))
    return con


@contextlib.contextmanager
def memory_limit_within(con: duckdb.DuckDBPyConnection, limit_bytes: int) -> Iterator[None]:
    """DuckDB's memory_limit set to `limit_bytes` inside the block, as it was after it. DuckDB keeps what it wrote
    in its buffer pool up to its limit: a file store loading a 10^6-line log held ~190 MiB beside the parsed
    tables under the default limit, ~80 MiB under half the budget, in the same time."""
    before = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    con.execute(f"SET memory_limit = '{int(limit_bytes) >> 20}MiB'")
    try:
        yield
    finally:
        con.execute("SET memory_limit = ?", [before])


@contextlib.contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """The statements inside as one transaction (rolled back on an exception): a file store commits (and syncs
    its write-ahead log) once instead of after every statement. Not for use inside an open transaction."""
    con.execute("BEGIN TRANSACTION")
    try:
        yield
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


# --- column comments -------------------------------------------------------------------------------------

_CREATE = re.compile(
    r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?P<temp>TEMP(?:ORARY)?\s+)?(?:TABLE|VIEW)\s+(?:IF\s+NOT\s+EXISTS\s+)?"
    r"(?P<name>\w+)\s*(?P<rest>.*)$",
    re.IGNORECASE,
)
_NOT_A_COLUMN = {"end", "and", "or", "then", "else", "null", "from", "where", "join", "on", "select", "as", "by",
                 "case", "when", "over", "filter", "distinct", "all", "union", "with", "not", "in", "is"}  # fmt: skip
_ADD_COLUMN = re.compile(
    r"^\s*ALTER\s+TABLE\s+(?P<table>\w+)\s+ADD\s+COLUMN\s+(?:IF\s+NOT\s+EXISTS\s+)?(?P<col>\w+)\b", re.I
)
_ARROW_FIELD = re.compile(r'^\s*\("(?P<col>\w+)",\s*pa\.[^#]*#\s*(?P<comment>.+?)\s*$')
_ARROW_SCHEMA = re.compile(r"^(?P<name>[A-Z_]+)_SCHEMA\s*=\s*pa\.schema\(")


def sql_column_comments(text: str) -> dict[str, dict[str, str]]:
    """{table: {column: comment}} from `-- comment`s beside columns: in `CREATE TABLE t (col TYPE, -- ...)`
    the column is the line's first word; in `CREATE TABLE t AS SELECT ... expr AS col, -- ...` its last.
    `ALTER TABLE t ADD COLUMN col TYPE; -- ...` comments col. Temporary tables are skipped (they do not outlive
    the derivation)."""
    out: dict[str, dict[str, str]] = {}
    table, ddl = None, False
    for line in text.splitlines():
        added = _ADD_COLUMN.match(line)
        if added and "--" in line and line.split("--", 1)[1].strip():
            out.setdefault(added.group("table").lower(), {})[added.group("col")] = line.split("--", 1)[1].strip()
            continue
        m = _CREATE.match(line)
        if m:
            table = None if m.group("temp") else m.group("name").lower()
            rest = m.group("rest").split("--", 1)[0].strip()
            ddl = rest.startswith("(") and not re.match(r"^\(?\s*(AS|WITH|SELECT)\b", rest, re.IGNORECASE)
            continue
        if table is None:
            continue
        code, sep, comment = line.partition("--")
        code = code.strip()
        if sep and code and comment.strip():
            cols = _columns_of(code, ddl)
            for col in cols:
                out.setdefault(table, {})[col] = comment.strip()
        if ";" in code:
            table = None
    return out


def _columns_of(code: str, ddl: bool) -> list[str]:
    code = code.rstrip(",").strip()
    if ddl:
        first = re.match(r"^\"?(\w+)\"?\s+\w", code)
        return [first.group(1)] if first and first.group(1).lower() not in ("primary", "unique", "check") else []
    if re.fullmatch(r"[\w.]+(\s*,\s*[\w.]+)*", code):  # a list of bare columns: one comment for all
        return [c.strip().split(".")[-1] for c in code.split(",")]
    last = re.search(r"(?:\bAS\s+)?\"?([A-Za-z_]\w*)\"?\s*$", code, re.IGNORECASE)
    return [last.group(1)] if last and last.group(1).lower() not in _NOT_A_COLUMN else []


def arrow_column_comments(text: str) -> dict[str, dict[str, str]]:
    """{table: {column: comment}} from `NAME_SCHEMA = pa.schema([("col", pa.type()),  # comment ...])`."""
    out: dict[str, dict[str, str]] = {}
    table = None
    for line in text.splitlines():
        m = _ARROW_SCHEMA.match(line)
        if m:
            table = m.group("name").lower()
            continue
        if table is None:
            continue
        f = _ARROW_FIELD.match(line)
        if f:
            out.setdefault(table, {})[f.group("col")] = f.group("comment")
        elif line.startswith(")"):
            table = None
    return out


# Derived columns that Python code writes, with no SQL or Arrow schema to carry a comment beside them (said here
# from what the code writes into them). A `.sql` derivation comments every column it makes in its own file.
SUPPLEMENT = {
    "kernel_op_class": {
        "name": "kernel name as written",
        "op": "the CPU op that launched it (correlation id)",
        "klass": "class given from the launching op",
        "family": "family given from the launching op",
        "kernels": "kernels of this name whose class came from the launching op",
    },
    "step_kernel_phase": {
        "step_id": "engine step (steps.step_id) that launched the kernels",
        "phase": "the phase its attention kernels call for: prefill, decode or mixed (derive/kernel_phase.py)",
        "prefill_kernels": "prefill-only attention kernels the step launched (catalog phase_hint prefill)",
        "decode_kernels": "decode-only attention kernels the step launched (catalog phase_hint decode)",
        "mixed_kernels": "attention kernels that run prefill and decode in one call (catalog phase_hint mixed)",
        "prefill_names": "the prefill-only kernel names (at most 3)",
        "decode_names": "the decode-only kernel names (at most 3)",
        "mixed_names": "the mixed kernel names (at most 3)",
    },
    "step_activity": {
        "time_basis": "what step_ns measures: the GPU span of the step's kernels, or the host duration "
        "of the step when the rank has no GPU kernels",
    },
    "step_collectives": {
        "step_id": "engine step (steps.step_id)",
        "T": "tokens in the step (steps.T)",
        "min_payload_bytes": "smallest per-rank input bytes of one call in the step",
        "max_payload_bytes": "largest per-rank input bytes of one call in the step",
    },
}


@functools.cache
def _all_column_comments() -> dict[str, dict[str, str]]:
    """{table: {column: comment}} of every schema and derivation file (package data: parsed once per process;
    callers must not change the dicts)."""
    found: dict[str, dict[str, str]] = {t: dict(cols) for t, cols in SUPPLEMENT.items()}
    sources = [("tracediag.store", n) for n in schema_files()]
    sources += sorted(
        ("tracediag.derive", f.name) for f in resources.files("tracediag.derive").iterdir() if f.name.endswith(".sql")
    )
    for package, name in sources:
        for table, cols in sql_column_comments(_sql(package, name)).items():
            found.setdefault(table, {}).update(cols)
    for f in resources.files("tracediag.derive").iterdir():
        if f.name.endswith(".py"):
            for table, cols in arrow_column_comments(f.read_text(encoding="utf-8")).items():
                found.setdefault(table, {}).update(cols)
    return found


@functools.cache
def _canonical_column_comments() -> dict[str, str]:
    """{column: comment} of the canonical tables' columns, the first file that documents a column winning."""
    canonical: dict[str, str] = {}
    for name in schema_files():
        for cols in sql_column_comments(_sql("tracediag.store", name)).values():
            for col, text in cols.items():
                canonical.setdefault(col, text)
    return canonical


def column_docs() -> dict[str, dict[str, str]]:
    """{table: {column: unit and meaning}} of every table and view the schema and derivation files document
    (a copy: the comments trace.duckdb carries), the schema files' columns first."""
    docs = {}
    for table, cols in sorted(_all_column_comments().items()):
        said_here = SUPPLEMENT.get(table, {})
        docs[table] = dict(sorted(cols.items(), key=lambda kv: kv[0] in said_here))  # stable: file order kept
    return docs


def comment_columns(con: duckdb.DuckDBPyConnection) -> int:
    """Set a comment on every column of the store's tables and views that a schema or derivation file
    documents; a column documented nowhere for its own table takes the comment of the same column of the
    canonical tables (`rank`, `ts_ns`, ...). Returns how many comments were set."""
    comments = _all_column_comments()
    canonical = _canonical_column_comments()
    rows = con.execute(
        "SELECT table_name, column_name, comment FROM duckdb_columns() WHERE NOT internal AND schema_name = 'main'"
    ).fetchall()
    statements = []
    for table, col, current in rows:
        text = comments.get(table.lower(), {}).get(col) or canonical.get(col)
        if text and text != current:
            quoted = text.replace("'", "''")  # the text of our own schema files, not input
            statements.append(f'COMMENT ON COLUMN "{table}"."{col}" IS \'{quoted}\';')
    if not statements:
        return 0
    # DuckDB has no statement that comments several columns, and each statement's fixed cost (~0.2 ms: the
    # optimizer's passes and a task for every worker thread) is most of the time of ~500 of them: one thread and
    # no optimizer (a COMMENT has nothing to optimize) for the batch, as before after it.
    threads = con.execute("SELECT current_setting('threads')").fetchone()[0]
    con.execute("SET threads = 1; PRAGMA disable_optimizer;")
    try:
        con.execute("BEGIN TRANSACTION;\n" + "\n".join(statements) + "\nCOMMIT;")
    finally:
        con.execute(f"PRAGMA enable_optimizer; SET threads = {int(threads)};")
    return len(statements)


def has_table(con: duckdb.DuckDBPyConnection, table: str) -> bool:
    return bool(
        con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [table]).fetchone()[0]
    )


def column_names(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    return [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]  # table names are ours, not input


def append_arrow(con: duckdb.DuckDBPyConnection, table: str, data: pa.Table) -> None:
    """Bulk-append an Arrow table; columns are matched by name, missing ones become NULL."""
    _append(con, table, data, _table_columns(con, table))


def _table_columns(con: duckdb.DuckDBPyConnection, table: str) -> list[str]:
    """The columns of a table of the store, in order (binding the name: no catalog query, and a missing table
    leaves an open transaction usable); ValueError when there is no such table."""
    try:
        return list(con.table(table).columns)
    except duckdb.CatalogException:
        raise ValueError(f"unknown table {table}: add it to a tracediag/store/schema*.sql file") from None


def _append(con: duckdb.DuckDBPyConnection, table: str, data: pa.Table, cols: list[str]) -> None:
    present = [c for c in cols if c in data.column_names]
    view = f"_incoming_{table}"
    con.register(view, data)
    try:
        select = ", ".join(f'"{c}"' if c in present else "NULL" for c in cols)
        con.execute(f"INSERT INTO {table} SELECT {select} FROM {view}")
    except BaseException:
        # a failed INSERT (out of memory, an interrupt) aborts the transaction: unregistering then raises
        # TransactionException, which would hide the INSERT's own error
        with contextlib.suppress(duckdb.Error):
            con.unregister(view)
        raise
    con.unregister(view)


def append_rows(con: duckdb.DuckDBPyConnection, table: str, rows: list[dict[str, Any]]) -> None:
    """Append a handful of metadata rows (one per input file), still as one bulk insert."""
    if rows:
        import pyarrow as pa

        cols = _table_columns(con, table)
        _append(con, table, pa.Table.from_pylist([{c: r.get(c) for c in cols} for r in rows]), cols)


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
