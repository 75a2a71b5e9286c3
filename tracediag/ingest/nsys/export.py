"""The export: its tables and columns probed (nsys creates tables lazily, and the schema differs by version),
its queries run with a missing column named and text that is not UTF-8 read leniently, its metadata and enum
tables; rows read as columns with every value checked (`tracediag.ingest.validate`): the rows whose time, device
or thread is not an integer in range dropped and counted, the rows of processes without a rank removed.
"""

from __future__ import annotations

import re
import sqlite3
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from tracediag.errors import InputError
from tracediag.ingest import validate as val
from tracediag.ingest.validate import BadRecords


def pid_of(global_id: int | None) -> int | None:
    """Process id from a serialized GlobalId (nsys reports: (globalTid >> 24) & 0x00FFFFFF); None for anything
    that is not an integer."""
    return (global_id >> 24) & 0xFFFFFF if type(global_id) is int else None


def tid_of(global_tid: int | None) -> int | None:
    """Thread id from a serialized GlobalId (nsys reports: globalTid & 0x00FFFFFF)."""
    return global_tid & 0xFFFFFF if type(global_tid) is int else None


_NO_COLUMN = re.compile(r"no such column: (?:(\w+)\.)?(\w+)")
_TABLE_ALIAS = re.compile(r"\b(?:FROM|JOIN)\s+(\w+)(?:\s+(?!ON\b|WHERE\b|ORDER\b|LEFT\b|JOIN\b|GROUP\b)(\w+))?")


def _missing_column(sql: str, message: str) -> tuple[str, str] | None:
    """(table, column) of SQLite's "no such column: k.start" for a query of ours (the alias looked up in its FROM
    and JOIN clauses; an unqualified column is the query's only table's); None for any other error."""
    m = _NO_COLUMN.search(message)
    if m is None:
        return None
    alias, column = m.group(1), m.group(2)
    tables = _TABLE_ALIAS.findall(sql)
    for table, a in tables:
        if alias in (a, table):
            return table, column
    if alias is None and len({t for t, _ in tables}) == 1:
        return tables[0][0], column
    return (alias or "?"), column


def _lenient_text(b: bytes) -> str:
    # undecodable bytes become lone surrogates, which validate.clean_text finds, counts and replaces
    return b.decode("utf-8", "surrogateescape")


class _Export:
    def __init__(self, path: Path, con: sqlite3.Connection) -> None:
        self.path = path
        self.con = con
        self.tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        self._cols: dict[str, set[str]] = {}
        self.notes: list[str] = []
        self.bad = BadRecords()

    def cols(self, table: str) -> set[str]:
        if table not in self._cols:
            self._cols[table] = (
                {r[1] for r in self.con.execute(f'PRAGMA table_info("{table}")')} if table in self.tables else set()
            )
        return self._cols[table]

    def col(self, table: str, alias: str, name: str, default: str = "NULL") -> str:
        return f"{alias}.{name}" if name in self.cols(table) else default

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        try:
            return self.con.execute(sql, params).fetchall()
        except (sqlite3.OperationalError, UnicodeDecodeError) as exc:
            missing = _missing_column(sql, str(exc))
            if missing is not None:
                table, column = missing
                raise InputError(
                    self.path,
                    f"Nsight Systems export whose table {table} has no column {column} (an edited file, or an export "
                    "schema this tracediag does not know); re-export it with `nsys export --type=sqlite`",
                ) from None
            if "decode" not in str(exc) or self.con.text_factory is _lenient_text:
                raise
            # text that is not UTF-8 (a damaged page, a bad writer): read it leniently, count it where it is used
            self.con.text_factory = _lenient_text
            return self.con.execute(sql, params).fetchall()

    def text_values(self, table: str, column: str, values: list[Any]) -> list[str | None]:
        """Text from the export: non-text set to NULL, undecodable bytes replaced; both counted."""
        return val.Checker(self.bad, table).str_values(column, values)

    # --- metadata ---

    def metadata(self) -> tuple[str, dict[str, str]]:
        for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):  # 2024+ / 2023.2 and older
            if table in self.tables and {"name", "value"} <= self.cols(table):
                rows = self.rows(f"SELECT name, value FROM {table}")
                names = self.text_values(table, "name", [r[0] for r in rows])
                values = self.text_values(table, "value", [r[1] for r in rows])
                return table, {k: v for k, v in zip(names, values) if k is not None}
        return "", {}

    def check_is_nsys(self) -> None:
        markers = {"META_DATA_EXPORT", "EXPORT_META_DATA", "NVTX_EVENTS"}
        if "StringIds" not in self.tables or not (
            self.tables & markers or any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in self.tables)
        ):
            shown = ", ".join(sorted(self.tables)[:6]) or "none"
            raise InputError(
                self.path,
                "SQLite database, but not an Nsight Systems export: it has no StringIds and no "
                f"META_DATA_EXPORT/EXPORT_META_DATA, CUPTI_ACTIVITY_KIND_* or NVTX_EVENTS table (tables: {shown})",
            )

    def enum(self, table: str, fallback: dict[int, str]) -> dict[int, str]:
        if table in self.tables and {"id", "label"} <= self.cols(table):
            rows = _valid_tuples(self, table, self.rows(f"SELECT id, label FROM {table}"), {0: ("id", None, None)})
            labels = self.text_values(table, "label", [r[1] for r in rows])
            got = {r[0]: lab for r, lab in zip(rows, labels) if lab is not None}
            return got or fallback
        return fallback


def _pid_sql(alias: str, col: str) -> str:
    # see pid_of; a value that is not an integer is passed through as it is, for _valid_rows to report
    c = f"{alias}.{col}"
    return f"(CASE typeof({c}) WHEN 'integer' THEN (({c} >> 24) & 16777215) ELSE {c} END)"


def _dur_sql(alias: str) -> str:
    """end - start, ≥ 0; when either is not an integer, the bad value itself (for _valid_rows to report)."""
    s, e = f"{alias}.start", f"{alias}.end"
    return (
        f"(CASE WHEN typeof({s}) = 'integer' AND typeof({e}) = 'integer' THEN max({e} - {s}, 0) "
        f"WHEN typeof({e}) = 'integer' THEN NULL ELSE {e} END)"
    )


def _columns(ex: _Export, sql: str, names: tuple[str, ...]) -> dict[str, list]:
    rows = ex.rows(sql)
    cols = list(zip(*rows)) if rows else [() for _ in names]
    return {n: list(c) for n, c in zip(names, cols, strict=True)}


# value ranges of the columns a row cannot be placed without (validate.py: why these bounds)
_TS = (-val.TS_NS_MAX, val.TS_NS_MAX)
_DUR = (0, val.DUR_NS_MAX)
_ANY_INT = (-val.INT64_MAX - 1, val.INT64_MAX)
_INT32 = (-(2**31), val.INT32_MAX)


def _valid_rows(
    ex: _Export,
    table: str,
    cols: dict[str, list],
    required: dict[str, tuple[str, tuple[int, int]]],
    nullable: dict[str, tuple[str, tuple[int, int]]] | None = None,
) -> dict[str, list]:
    """The rows whose `required` columns are integers in range and whose `nullable` ones are NULL or such
    integers (`{column: (export column name, (lo, hi))}`); the other rows are dropped and counted."""
    n = len(next(iter(cols.values()), []))
    if not n:
        return cols
    ok = np.ones(n, dtype=bool)
    for spec, allow_null in ((required, False), (nullable or {}, True)):
        for name, (label, (lo, hi)) in spec.items():
            values = cols[name]
            good = np.fromiter(
                ((type(v) is int and lo <= v <= hi) or (allow_null and v is None) for v in values), dtype=bool, count=n
            )
            if not good.all():
                ex.bad.dropped(table, label, [v for v, g, o in zip(values, good, ok) if not g and o])
                ok &= good
    if ok.all():
        return cols
    return {k: [v for v, g in zip(vals, ok) if g] for k, vals in cols.items()}


def _valid_tuples(
    ex: _Export,
    table: str,
    rows: list[tuple],
    required: dict[int, tuple[str, int | None, int | None]],
    nullable: dict[int, tuple[str, int | None, int | None]] | None = None,
) -> list[tuple]:
    """_valid_rows for rows as tuples: `{position: (export column name, lo, hi)}` (None: the int64 bound)."""
    if not rows:
        return rows
    names = tuple(range(len(rows[0])))
    cols = {i: [r[i] for r in rows] for i in names}
    rng = {
        i: (lab, (-val.INT64_MAX - 1 if lo is None else lo, val.INT64_MAX if hi is None else hi))
        for i, (lab, lo, hi) in {**required, **(nullable or {})}.items()
    }
    kept = _valid_rows(ex, table, cols, {i: rng[i] for i in required}, {i: rng[i] for i in nullable or {}})
    return list(zip(*(kept[i] for i in names)))


def _keep(cols: dict[str, list], rank: list[int | None]) -> dict[str, list]:
    """The columns with a rank column added, rows without a rank removed."""
    if None not in rank:
        return cols | {"rank": rank}
    idx = [i for i, r in enumerate(rank) if r is not None]
    return {k: [v[i] for i in idx] for k, v in cols.items()} | {"rank": [rank[i] for i in idx]}


def _keep_host(cols: dict[str, list], rank: list[int | None], dropped: Counter) -> dict[str, list]:
    """_keep for host-side rows: the ones without a rank (no GPU work in their process) counted in `dropped` by pid."""
    dropped.update(p for p, r in zip(cols["pid"], rank) if r is None)
    return _keep(cols, rank)
