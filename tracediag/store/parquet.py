"""The Parquet store: the canonical and derived tables of one analysis as a Parquet dataset on disk.

Layout of a store folder (readable by DuckDB, Spark, Trino or pyarrow unchanged):

    manifest.json                     schema "tracediag/store-v1": inputs, versions, tables, row counts
    tables/<table>/rank=<r>/*.parquet one hive partition per rank (rank=__HIVE_DEFAULT_PARTITION__: no rank)
    tables/<table>/*.parquet          tables without a rank column (inputs metadata, serving telemetry...)

`tracediag ingest TRACES --store DIR` writes it; `analyze/check/diff --store DIR` read it through DuckDB views
(no re-parsing, no re-deriving). Ingest workers write their own partition files (`tracediag.fleet.write_parsed`)
and send back only metadata, so a trace's tables never travel through a pipe. A store is valid for the tracediag
version that wrote it: its `schema_version` fingerprints the schema and derivation SQL, and a mismatch is an input error
that says to ingest again.
"""

from __future__ import annotations

import datetime as _dt
import functools
import hashlib
import json
import re
import shutil
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import duckdb
import msgspec

from tracediag.errors import InputError
from tracediag.version import __version__

if TYPE_CHECKING:  # imported where files are written: reading a store through views needs no Arrow
    import pyarrow as pa

STORE_SCHEMA_ID = "tracediag/store-v1"
MANIFEST = "manifest.json"
TABLES = "tables"
RANK = "rank"


def schema_version() -> str:
    """Fingerprint of everything that decides what the tables hold: the schema and derivation SQL files."""
    h = hashlib.sha256(__version__.encode())
    for package in ("tracediag.store", "tracediag.derive"):
        for f in sorted(resources.files(package).iterdir(), key=lambda x: x.name):
            if f.name.endswith(".sql"):
                h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def _table_dir(store: Path, table: str) -> Path:
    return store / TABLES / table


def write_arrow(store: Path, table: str, data: pa.Table, part: str) -> int:
    """Write one Arrow table as Parquet files of `table`, partitioned by rank when it has a rank column.

    `part` makes the file names unique per writer (e.g. "input-3"), so workers never write the same file.
    Returns the rows written.
    """
    import pyarrow as pa
    import pyarrow.compute
    import pyarrow.dataset as pads

    if data.num_rows == 0:
        return 0
    target = _table_dir(store, table)
    partitions = 1
    if RANK in data.column_names:
        partitioning = pads.partitioning(pa.schema([(RANK, data.schema.field(RANK).type)]), flavor="hive")
        # one per rank (pyarrow stops at 1024 by default: an nsys export with a device per kernel has thousands)
        partitions = pa.compute.count_distinct(data[RANK], mode="all").as_py()
    else:
        partitioning = None
    pads.write_dataset(
        data,
        target,
        format="parquet",
        partitioning=partitioning,
        basename_template=f"{part}-{{i}}.parquet",
        existing_data_behavior="overwrite_or_ignore",
        max_partitions=max(1024, partitions),
    )
    return data.num_rows


@functools.cache
def canonical_arrow_schemas() -> dict[str, pa.Schema]:
    """Arrow schema of every canonical table (from the schema files), to write complete, typed files."""
    from tracediag.store import open_store

    con = open_store()
    try:
        names = [r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()]
        return {n: con.sql(f"SELECT * FROM {n} LIMIT 0").to_arrow_table().schema for n in names}
    finally:
        con.close()


def conform(table: str, data: pa.Table) -> pa.Table:
    """The parser's table with the store's columns, in order and type; columns it lacks are NULL (as in
    store.append_arrow), so every file of a table has the same schema."""
    import pyarrow as pa

    schema = canonical_arrow_schemas().get(table)
    if schema is None:
        raise ValueError(f"unknown table {table}: add it to a tracediag/store/schema*.sql file")
    cols = [
        data.column(f.name).cast(f.type) if f.name in data.column_names else pa.nulls(data.num_rows, f.type)
        for f in schema
    ]
    return pa.table(cols, schema=schema)


def copy_table(con: duckdb.DuckDBPyConnection, store: Path, table: str) -> int:
    """Write a table of the DuckDB connection (a derived table) into the store; returns its row count."""
    n = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]  # table names are ours, not input
    if n == 0:
        return 0
    target = _table_dir(store, table)
    target.mkdir(parents=True, exist_ok=True)
    cols = [r[0] for r in con.execute(f"DESCRIBE {table}").fetchall()]
    if RANK in cols:
        con.execute(
            f"COPY (SELECT * FROM {table}) TO ? "
            "(FORMAT parquet, PARTITION_BY (rank), OVERWRITE_OR_IGNORE, FILENAME_PATTERN 'derived-{i}')",
            [str(target)],
        )
    else:
        con.execute(f"COPY (SELECT * FROM {table}) TO ? (FORMAT parquet)", [str(target / "derived-0.parquet")])
    return n


def _sql_path(p: Path) -> str:
    return str(p).replace("'", "''")


def table_schema(con: duckdb.DuckDBPyConnection, table: str) -> list[list[str]]:
    return [[r[0], r[1]] for r in con.execute(f"DESCRIBE {table}").fetchall()]


@dataclass(frozen=True)
class StoreManifest:
    path: Path
    doc: dict[str, Any]

    @property
    def tables(self) -> dict[str, dict[str, Any]]:
        return self.doc["tables"]


def write_manifest(store: Path, inputs: list[dict[str, Any]], tables: dict[str, dict[str, Any]], **extra: Any) -> None:
    from tracediag.catalog import CATALOG_VERSION
    from tracediag.files import write_atomic

    doc = {
        "schema": STORE_SCHEMA_ID,
        "tool": {"name": "tracediag", "version": __version__},
        "schema_version": schema_version(),
        "catalog_version": CATALOG_VERSION,
        "created": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "inputs": inputs,
        "tables": tables,
        **extra,
    }
    write_atomic(store / MANIFEST, (json.dumps(doc, indent=2, default=str) + "\n").encode())


def read_manifest(store: Path) -> StoreManifest:
    store = Path(store)
    m = store / MANIFEST
    if not m.is_file():
        raise InputError(
            store, f"not a tracediag store (no {MANIFEST}); create one with `tracediag ingest ... --store`"
        )
    try:
        doc = json.loads(m.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise InputError(m, f"unreadable store manifest ({exc})") from None
    if not isinstance(doc, dict) or doc.get("schema") != STORE_SCHEMA_ID or not isinstance(doc.get("tables"), dict):
        raise InputError(m, f"not a {STORE_SCHEMA_ID} manifest")
    _validate_manifest(m, doc)
    if doc.get("schema_version") != schema_version():
        raise InputError(
            store,
            f"store written by tracediag {_tool_version(doc)} with another table layout "
            f"(schema {doc.get('schema_version')}, this version reads {schema_version()}); ingest the traces again",
        )
    verify_layout(store, doc["tables"])
    verify_parquet_files(store)
    return StoreManifest(store, doc)


NOT_OURS = "not a tracediag store"
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_RANK_DIR = re.compile(rf"^{RANK}=(-?\d{{1,10}}|{_HIVE_NULL})$")


def _what(st_mode: int) -> str:
    import stat

    if stat.S_ISLNK(st_mode):
        return "a symbolic link"
    if stat.S_ISDIR(st_mode):
        return "a folder"
    return "a file" if stat.S_ISREG(st_mode) else "not a regular file (a pipe, a device or a socket)"


def verify_layout(store: Path, tables: dict[str, Any]) -> None:
    """What the store's views read is what `tracediag ingest` writes: the folder of each table of the manifest holds
    regular .parquet files, or rank=<integer> folders of them when the table has a rank column. Anything else there
    (a file of another kind, a folder, a symbolic link, a pipe) is refused, naming it, before a byte of it is read (a
    pipe would block the reader, a link would read outside the store). Entries of tables/ that the manifest does not
    list are never read (open_store_views names a derived table the manifest lacks)."""
    import stat

    root = Path(store, TABLES)
    if not root.is_dir():
        return
    for top in sorted(root.iterdir()):
        entry = tables.get(top.name)
        if entry is None:
            continue
        st = top.lstat()
        if not stat.S_ISDIR(st.st_mode):
            raise InputError(top, f"{NOT_OURS}: {_what(st.st_mode)} in place of a table's folder; ingest the traces "
                                  "again")  # fmt: skip
        ranked = any(c == RANK for c, _ in entry.get("columns", []) if isinstance(c, str))
        for f in sorted(top.iterdir()):
            st = f.lstat()
            if stat.S_ISDIR(st.st_mode) and ranked and _RANK_DIR.match(f.name):
                for g in sorted(f.iterdir()):
                    _check_data_file(g, g.lstat().st_mode)
            else:
                _check_data_file(f, st.st_mode)


def _check_data_file(f: Path, mode: int) -> None:
    import stat

    if not (stat.S_ISREG(mode) and f.suffix == ".parquet"):
        raise InputError(
            f, f"{NOT_OURS}: {_what(mode)} where only the table's Parquet files belong; ingest the traces again"
        )


_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
# a column type as DuckDB names it: BIGINT, VARCHAR, DECIMAL(18,3), STRUCT(a INTEGER)[]… (no quotes, no semicolons)
_TYPE = re.compile(r"^[A-Za-z0-9_ ,()\[\]]{1,200}$")
# what a stored view's SQL may not do (it is run when the store is opened): write, load or attach anything
_VIEW_FORBIDDEN = re.compile(r"\b(COPY|ATTACH|DETACH|INSTALL|LOAD|EXPORT|IMPORT|PRAGMA|SET|CALL)\b", re.I)


class _TableEntry(msgspec.Struct):
    columns: list[tuple[str, str]]
    rows: int = 0
    kind: str | None = None


class _Failed(msgspec.Struct):
    path: str
    error: str


class _Manifest(msgspec.Struct):
    schema: str
    tables: dict[str, _TableEntry]
    inputs: list[dict[str, Any]] = []
    views: dict[str, str] = {}
    failed: list[_Failed] = []  # inputs the ingest could not read (--keep-going): the report lists them


def _tool_version(doc: dict[str, Any]) -> Any:
    tool = doc.get("tool")
    return tool.get("version") if isinstance(tool, dict) else None


def _validate_manifest(m: Path, doc: dict[str, Any]) -> None:
    """The manifest's tables, columns and views become SQL when the store is opened: every name must be an
    identifier, every type a type, every view one CREATE VIEW of a SELECT (a manifest edited by hand, or by
    someone else, must not run other SQL)."""
    try:
        man = msgspec.convert(doc, _Manifest)
    except msgspec.ValidationError as exc:
        raise InputError(m, f"not the manifest tracediag writes ({exc}); ingest the traces again") from None
    for table, entry in man.tables.items():
        bad = [n for n in (table, *(c for c, _ in entry.columns)) if not _IDENT.match(n)]
        bad += [t for _, t in entry.columns if not _TYPE.match(t)]
        if bad:
            raise InputError(m, f"table {table[:60]!r}: names or types no tracediag store has ({bad[0][:60]!r})")
    for name, sql in man.views.items():
        head = re.match(r"\s*CREATE\s+(?:OR\s+REPLACE\s+)?VIEW\s+(\w+)\s+AS\s", sql, re.I)
        try:
            one = len(duckdb.extract_statements(sql)) == 1
        except duckdb.Error:
            one = False
        if not (_IDENT.match(name) and head and head.group(1) == name and one and not _VIEW_FORBIDDEN.search(sql)):
            raise InputError(m, f"view {name[:60]!r}: not a view definition tracediag writes; ingest the traces again")


_PARQUET_MAGIC = b"PAR1"


def verify_parquet_files(store: Path) -> None:
    """Every Parquet file of the store begins and ends with its magic bytes: a file cut short (a copy that did not
    finish, a full disk) is named now, not as a reader's error deep inside a rule."""
    for f in sorted(Path(store, TABLES).rglob("*.parquet")):
        try:
            size = f.stat().st_size
            with open(f, "rb") as fh:
                head = fh.read(4)
                fh.seek(max(0, size - 4))
                tail = fh.read(4)
        except OSError as exc:
            raise InputError(f, f"cannot read this store file ({exc.strerror or exc})") from None
        if size < 12 or head != _PARQUET_MAGIC or tail != _PARQUET_MAGIC:
            raise InputError(
                f,
                f"truncated or damaged Parquet file ({size:,} bytes, no {_PARQUET_MAGIC.decode()} footer) in the "
                f"store {store}; ingest the traces again",
            )


# DuckDB's words for a Parquet file it cannot decode: a damaged page or footer (Thrift), a column chunk of a type it
# cannot read, a file it cannot open, that ends early or whose magic bytes are gone (all seen on flipped, cut or
# zeroed bytes of a store's files)
_PARQUET_DAMAGE = re.compile(
    r"TProtocolException|invalid TType|TTransport|don't know what type|No magic bytes found|Failed to read file|"
    r"Could not read enough bytes|Footer length error|Invalid Parquet|Corrupt|corrupt|Parquet"
)
# the file, or the table's glob (DuckDB cuts a long query line with "..." before its closing quote)
_PARQUET_FILE = re.compile(r"""file "([^"]+\.parquet)"|file '([^']+\.parquet)'|read_parquet\('(.+?)(?:'|\.\.\.)""")


def read_error(exc: BaseException, stores: tuple[Path, ...] = ()) -> InputError | None:
    """The input error when `exc` is DuckDB failing on a damaged file of a store (bytes flipped, cut or zeroed
    after ingest): the file (or the table's files, or the store) DuckDB names, else the first file of `stores`
    that does not read as its manifest says (damaged_file); None when it is not that (a bug of ours stays one)."""
    if not isinstance(exc, duckdb.Error):
        return None
    text = str(exc)
    # a decoder's own error (Thrift, snappy: "Out of buffer") comes as DuckDB's bare Error or an IO error, never as
    # one of the classes a query of ours gets wrong (Binder, Catalog, Conversion, ...)
    undecodable = type(exc) is duckdb.Error or isinstance(exc, duckdb.IOException)
    m = _PARQUET_FILE.search(text)
    if (_PARQUET_DAMAGE.search(text) or (stores and undecodable)) and (m or stores):
        where = next(g for g in m.groups() if g) if m else " or ".join(map(str, stores))
        first = text.splitlines()[0][:300]
        return InputError(
            where,
            f"a Parquet file of the store is damaged or unreadable ({first}); ingest the traces again "
            "(tracediag ingest … --store)",
        )
    for store in stores:  # a damage DuckDB's error does not show (a renamed column fails in the binder)
        err = damaged_file(store)
        if err is not None:
            return err
    return None


def damaged_file(store: Path) -> InputError | None:
    """After a query over the store failed: the first Parquet file whose schema cannot be read or whose columns
    are not the ones the manifest gives its table (a flipped byte can rename a column: the query then fails in its
    binder, like a bug of ours). Reads every file's footer, so only on the failure path; None when every file reads
    as the manifest says."""
    try:
        doc = json.loads((Path(store) / MANIFEST).read_text(encoding="utf-8"))
        tables = {t: {c for c, _ in e["columns"]} - {RANK} for t, e in doc["tables"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # read_manifest names a manifest it cannot read
    con = duckdb.connect()
    try:
        for table, want in tables.items():
            for f in sorted(_table_dir(Path(store), table).rglob("*.parquet")):
                try:
                    have = {r[0] for r in con.execute("SELECT name FROM parquet_schema(?)", [str(f)]).fetchall()}
                    con.execute("SELECT count(*) FROM read_parquet(?)", [str(f)]).fetchall()
                except duckdb.Error as exc:
                    first = str(exc).splitlines()[0][:200]
                    why = f"damaged Parquet file of the store {store} ({first}); ingest the traces again"
                    return InputError(f, why)
                missing = sorted(want - have)
                if missing:
                    return InputError(
                        f,
                        f"damaged Parquet file of the store {store}: its columns lack {', '.join(missing[:3])} of "
                        "the manifest's; ingest the traces again",
                    )
    finally:
        con.close()
    return None


def _partitioned(target: Path, cols: list) -> bool:
    """The table's files are in rank=… folders (a table with a rank column, written partitioned by it)."""
    return any(c == RANK for c, _ in cols) and any(p.name.startswith("rank=") for p in target.iterdir())


def _read_sql(target: Path, cols: list, files: str | None = None) -> str:
    """read_parquet(…) of a stored table's files (`files`: a list of some of its partitions' globs), read by name
    across the files, its rank from the partition folders."""
    if not _partitioned(target, cols):
        return f"read_parquet('{_sql_path(target)}/*.parquet', union_by_name=true)"
    rank_type = dict(map(tuple, cols)).get(RANK, "INTEGER")
    files = files or f"'{_sql_path(target)}/**/*.parquet'"
    return f"read_parquet({files}, hive_partitioning=true, hive_types={{'rank': {rank_type}}}, union_by_name=true)"


def verify_columns(con: duckdb.DuckDBPyConnection, manifest: StoreManifest) -> None:
    """Every stored table's files, read together, hold the columns its manifest entry gives and no other. A flipped
    byte in a file's footer can rename a column; read by name across the files, that file's values would be NULL
    without a word. One footer pass per table (0.3 s for a 256-rank store of 3,073 files)."""
    for table, info in manifest.tables.items():
        target = _table_dir(manifest.path, table)
        if info.get("rows", 0) == 0 or not target.exists():
            continue
        want = {c for c, _ in info["columns"]}
        try:
            types = dict(
                r[:2] for r in con.execute(f"DESCRIBE SELECT * FROM {_read_sql(target, info['columns'])}").fetchall()
            )
            have = set(types)
        except duckdb.Error:
            have = None
        if have != want:
            raise damaged_file(manifest.path) or InputError(
                target,
                f"the files of table {table} in the store {manifest.path} do not hold its columns "
                f"({', '.join(sorted((have or set()) ^ want)[:4]) or 'unreadable'}); ingest the traces again",
            )
        _verify_types_and_rows(con, target, table, info, types)
        _verify_file_columns(con, target, table, want - {RANK} if _partitioned(target, info["columns"]) else want)


def _kind(duckdb_type: str | None) -> str | None:
    """A column type's kind (number, text, list, ...): the Parquet writer stores some types as others of their kind
    (HUGEINT as DOUBLE), which the store's views cast back; a file whose column is of another kind is not ours."""
    if duckdb_type is None:
        return None
    t = duckdb_type.upper()
    if t.endswith("]"):
        return "list"
    head = re.match(r"[A-Z]+", t)
    head = head.group(0) if head else t
    if head in ("VARCHAR", "BLOB", "JSON", "UUID", "BIT"):
        return "text"
    if head in ("STRUCT", "MAP", "UNION"):
        return "nested"
    if head.startswith(("DATE", "TIME", "INTERVAL")):
        return "time"
    return "bool" if head == "BOOLEAN" else "number"


def _verify_types_and_rows(
    con: duckdb.DuckDBPyConnection, target: Path, table: str, info: dict[str, Any], types: dict[str, str]
) -> None:
    """The table's files read together have the manifest's column types and row count: a column written as text
    where the store has integers, or a file or partition added (rows the ingest did not write), is refused."""
    sql = _read_sql(target, info["columns"])
    wrong = [f"{c} is {types.get(c)}, not {t}" for c, t in info["columns"] if _kind(types.get(c)) != _kind(t)]
    if wrong:
        raise InputError(target, f"{NOT_OURS}: the files of table {table} do not have its types ({wrong[0]})")
    rows = con.execute(f"SELECT count(*) FROM {sql}").fetchone()[0]
    if rows != info.get("rows"):
        raise InputError(
            target,
            f"{NOT_OURS}: the files of table {table} hold {rows:,} rows, the manifest {info.get('rows'):,} (a file "
            "added or changed after the ingest); ingest the traces again",
        )


def _verify_file_columns(con: duckdb.DuckDBPyConnection, target: Path, table: str, want: set[str]) -> None:
    """Each Parquet file of the table holds exactly its columns (read together by name, a file without one would
    give NULLs for it without a word). One pass over the footers (parquet_schema)."""
    elements: dict[str, list[tuple[str, int]]] = {}
    for file, name, children in con.execute(
        "SELECT file_name, name, num_children FROM parquet_schema(?)", [f"{target}/**/*.parquet"]
    ).fetchall():
        elements.setdefault(file, []).append((name, children or 0))
    for file, els in sorted(elements.items()):
        have = set(_top_level(els))
        if have != want:
            diff = sorted(have ^ want)[:3]
            raise InputError(
                file,
                f"{NOT_OURS}: a file of table {table} whose columns are not the table's ({', '.join(diff)}); "
                "ingest the traces again",
            )


def _top_level(elements: list[tuple[str, int]]) -> list[str]:
    """The top-level column names of a Parquet schema given depth first (name, number of children), the root first."""
    names: list[str] = []
    open_: list[int] = []  # children still to come at each open level
    for k, (name, children) in enumerate(elements):
        if k == 0:
            open_ = [children]
            continue
        if len(open_) == 1:
            names.append(name)
        open_[-1] -= 1
        if children:
            open_.append(children)
        while len(open_) > 1 and open_[-1] <= 0:
            open_.pop()
    return names


def attach_views(con: duckdb.DuckDBPyConnection, manifest: StoreManifest, ranks: Any = None) -> None:
    """One view per stored table, with the columns and types it had when written (empty tables included).
    `ranks`: only these ranks' partitions of the rank-partitioned tables are read (one TP group's task)."""
    for table, info in manifest.tables.items():
        cols: list[list[str]] = info["columns"]
        con.execute(f"DROP TABLE IF EXISTS {table}")
        con.execute(f"DROP VIEW IF EXISTS {table}")
        select = ", ".join(f'CAST("{c}" AS {t}) AS "{c}"' for c, t in cols)
        target = _table_dir(manifest.path, table)
        if info.get("rows", 0) == 0 or not target.exists():
            empty = ", ".join(f'CAST(NULL AS {t}) AS "{c}"' for c, t in cols)
            con.execute(f"CREATE VIEW {table} AS SELECT {empty} WHERE false")
            continue
        files = None
        if ranks is not None and _partitioned(target, cols):
            # and the rows without a rank (telemetry inputs), which every group reads
            parts = [target / f"{RANK}={int(r)}" for r in sorted(set(ranks))] + [
                target / f"{RANK}=__HIVE_DEFAULT_PARTITION__"
            ]
            parts = [d for d in parts if any(d.glob("*.parquet"))]
            if not parts:
                empty = ", ".join(f'CAST(NULL AS {t}) AS "{c}"' for c, t in cols)
                con.execute(f"CREATE VIEW {table} AS SELECT {empty} WHERE false")
                continue
            files = "[" + ", ".join(f"'{_sql_path(d)}/*.parquet'" for d in parts) + "]"
        con.execute(f"CREATE VIEW {table} AS SELECT {select} FROM {_read_sql(target, cols, files)}")


def clear_store(store: Path) -> None:
    """Remove a previous store's tables and manifest (only what a store holds; nothing else in the folder)."""
    if (store / TABLES).is_dir():
        shutil.rmtree(store / TABLES)
    (store / MANIFEST).unlink(missing_ok=True)


def is_store(path: Path) -> bool:
    return Path(path, MANIFEST).is_file() and Path(path, TABLES).is_dir()
