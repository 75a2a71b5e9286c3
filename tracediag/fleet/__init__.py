"""Ingest once, analyse many times: traces of many ranks into a Parquet store, on one machine or on Dask.

`ingest_store(paths, store)` parses every input in its own task — a local process pool by default, or a
`dask.distributed` cluster (`scheduler="tcp://HOST:8786"`, or a `distributed.Client`) — and each task writes its
tables straight into the store's partition files, returning only metadata. The coordinator then records the
inputs, builds the derived tables with DuckDB over views of the Parquet files (the same SQL as `analyze`, so the
findings are the same), writes them back as Parquet, and writes the manifest. The store folder must be on a
file system every worker can reach.

`open_store_views(store)` gives a DuckDB connection whose tables are views over the store: what
`analyze --store` runs the rules on.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from tracediag.errors import InputError, UsageError
from tracediag.ingest.base import IngestOptions, Parsed, SpilledTable
from tracediag.store import open_store
from tracediag.store import parquet as pq

# One task: (path, format or None, input order, options, store folder) -> metadata (see write_parsed).
Task = tuple[str, str | None, int, IngestOptions, str]


def ingest_task(task: Task) -> dict[str, Any]:
    """Parse one input and write its tables into the store (runs in a worker process or on a Dask worker)."""
    from tracediag.ingest import parse_one

    path, fmt, order, options, store = task
    t0 = time.monotonic()
    # a rank too large to hold is parsed into Parquet parts on the store's disk, then moved into its partitions
    parts = Path(store) / f".parts-input-{order}"
    shutil.rmtree(parts, ignore_errors=True)
    parts.mkdir(parents=True)
    try:
        parsed = parse_one(Path(path), fmt, order, dataclasses.replace(options, spill_dir=str(parts)))
        meta = write_parsed(Path(store), parsed, order)
    finally:
        shutil.rmtree(parts, ignore_errors=True)
    meta["parse_write_s"] = round(time.monotonic() - t0, 3)
    meta["worker_pid"] = os.getpid()
    return meta


def write_parsed(store: Path, parsed: Parsed, input_id: int) -> dict[str, Any]:
    """Write a parser's tables into the store; return what the coordinator needs (no table data).

    A table the parser spilled (ingest.base.SpilledTable: Parquet parts already in the store's columns) is
    moved in a part at a time, so a multi-GB rank is never held whole."""
    counts = {}
    for name, t in parsed.tables.items():
        if isinstance(t, SpilledTable):
            counts[name] = sum(_move_part(store, name, f, f"input-{input_id}-{i}") for i, f in enumerate(t.files))
        else:
            counts[name] = pq.write_arrow(store, name, pq.conform(name, t), f"input-{input_id}")
    return {
        "input_id": input_id,
        "path": parsed.path,
        "format": parsed.format,
        "inputs_rows": parsed.inputs_rows,
        "process_groups": parsed.process_groups,
        "rows": {k: v for k, v in counts.items() if v},
    }


def _move_part(store: Path, table: str, part: str, name: str) -> int:
    import pyarrow.parquet as papq

    n = pq.write_arrow(store, table, papq.read_table(part), name)
    os.unlink(part)
    return n


def ingest_task_keep_going(task: Task) -> dict[str, Any]:
    """`ingest_task`, but an input error becomes a record {failed: path, error} (`ingest --keep-going`)."""
    from tracediag.errors import TracediagError

    try:
        return ingest_task(task)
    except TracediagError as exc:
        return {"failed": task[0], "error": str(exc), "input_id": task[2]}


@dataclass
class IngestResult:
    store: Path
    inputs: list[dict[str, Any]]
    tables: dict[str, dict[str, Any]]
    elapsed_s: float
    backend: str
    failed: list[dict[str, str]] = field(default_factory=list)


def _run_local(tasks: list[Task], jobs: int | None, fn: Callable = ingest_task) -> list[dict[str, Any]]:
    import multiprocessing as mp
    import sys
    from concurrent.futures import ProcessPoolExecutor

    jobs = jobs or min(len(tasks), os.cpu_count() or 1)
    if len(tasks) == 1 or jobs <= 1:
        return [fn(t) for t in tasks]
    ctx = mp.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        return list(pool.map(fn, tasks))


def _run_dask(tasks: list[Task], scheduler: Any, fn: Callable = ingest_task) -> list[dict[str, Any]]:
    return run_on_dask(fn, tasks, [f"tracediag-ingest-{t[2]}-{Path(t[0]).name}" for t in tasks], scheduler)


def run_on_dask(fn: Callable, tasks: Sequence, keys: list[str], scheduler: Any) -> list:
    """`fn` over `tasks` on a dask.distributed cluster (an address, or a Client the caller owns), results in task
    order; a missing dask or an unreachable scheduler is a usage error."""
    try:
        from distributed import Client
    except ImportError:
        raise UsageError("--scheduler needs dask.distributed: pip install 'tracediag[fleet]'") from None
    own = not isinstance(scheduler, Client)
    try:
        client = Client(scheduler, timeout="30s") if own else scheduler
    except OSError as exc:
        raise UsageError(f"--scheduler {scheduler}: cannot reach the Dask scheduler ({exc})") from None
    try:
        return client.gather(client.map(fn, tasks, key=keys))
    finally:
        if own:
            client.close()


def _check_ranks(metas: list[dict[str, Any]]) -> None:
    from tracediag.ingest import TRACE_FORMATS

    seen: dict[int, str] = {}
    for m in metas:
        if m["format"] not in TRACE_FORMATS:
            continue
        for r in m["inputs_rows"]:
            rank = r.get("rank")
            if rank is None:
                continue
            if rank in seen:
                raise InputError(
                    m["path"],
                    f"rank {rank} was already given by {seen[rank]}; pass the traces of one run, one file per rank",
                )
            seen[rank] = m["path"]


def ingest_store(
    paths: Sequence[str | Path],
    store: str | Path,
    *,
    extra_inputs: Sequence[tuple[str | Path, str]] = (),
    keep_python: bool = False,
    jobs: int | None = None,
    scheduler: Any = None,
    progress: Callable[[str], None] | None = None,
    keep_going: bool = False,
    memory_limit: int | None = None,
) -> IngestResult:
    """Parse `paths` (+ explicit-format inputs) into the Parquet store folder `store` (replaced atomically).

    `keep_going`: an input that cannot be read is recorded (manifest `failed`: path and error; the report lists
    it) instead of stopping the ingest; at least one input must be read. `memory_limit` (bytes; None: the
    default of tracediag.memory) travels to every parser task, local or on Dask, in its IngestOptions."""
    from tracediag.pipeline import input_files

    t0 = time.monotonic()
    say = progress or (lambda _msg: None)
    files = input_files(paths, extra_inputs)
    store = Path(store)
    if store.exists() and not store.is_dir():
        raise UsageError(f"--store {store} is a file; give a folder")
    if store.is_dir() and any(store.iterdir()) and not pq.is_store(store):
        raise UsageError(f"--store {store} is a folder that is not a tracediag store; give a new or empty folder")
    store.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{store.name}.", suffix=".partial", dir=store.resolve().parent))
    try:
        options = IngestOptions(keep_python=keep_python, memory_limit=memory_limit)
        tasks: list[Task] = [(str(p), fmt, i, options, str(staging)) for i, (p, fmt) in enumerate(files)]
        backend = f"dask.distributed ({scheduler})" if scheduler is not None else "local processes"
        say(f"ingesting {len(tasks)} input(s) on {backend}")
        fn = ingest_task_keep_going if keep_going else ingest_task
        metas = _run_dask(tasks, scheduler, fn) if scheduler is not None else _run_local(tasks, jobs, fn)
        metas.sort(key=lambda m: m["input_id"])
        failed = [{"path": m["failed"], "error": m["error"]} for m in metas if "failed" in m]
        metas = [m for m in metas if "failed" not in m]
        if not metas:
            raise InputError(failed[0]["path"], f"no input could be read ({failed[0]['error']})")
        for f in failed:
            say(f"failed: {f['error']}")
        _check_ranks(metas)

        say("deriving steps, collectives and kernel tables")
        tables, views = _derive_tables(staging, metas)
        inputs = _manifest_inputs(metas)
        for f in staging.glob("scratch*"):
            f.unlink()
        pq.write_manifest(
            staging, inputs, tables, views=views, backend=backend, failed=failed, derivations=derivations_record()
        )
        if store.exists():
            pq.clear_store(store)
        store.mkdir(parents=True, exist_ok=True)
        for entry in staging.iterdir():
            os.replace(entry, store / entry.name)
        return IngestResult(store, inputs, tables, time.monotonic() - t0, backend, failed)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _derive_tables(staging: Path, metas: list[dict[str, Any]]) -> tuple[dict[str, dict], dict[str, str]]:
    """Over the parsed Parquet parts in `staging`: write the metadata tables, run the derivations and copy every
    table out; returns the manifest's tables (columns, rows, kind) and the derived views."""
    from tracediag.pipeline import derive
    from tracediag.store import append_rows

    con = _scratch_connection(staging)
    try:
        canonical = _canonical_schemas()
        counts: dict[str, int] = {}
        for m in metas:
            for t, n in m["rows"].items():
                counts[t] = counts.get(t, 0) + n
        tables = {t: {"columns": cols, "rows": counts.get(t, 0), "kind": "canonical"} for t, cols in canonical.items()}
        pq.attach_views(con, pq.StoreManifest(staging, {"tables": tables}))
        # inputs and process groups: small metadata rows, written as ordinary tables
        for name in ("inputs", "process_groups"):
            con.execute(f"DROP VIEW IF EXISTS {name}")
        _create_metadata_tables(con)
        append_rows(
            con,
            "inputs",
            [
                {**r, "input_id": m["input_id"], "path": m["path"], "format": m["format"]}
                for m in metas
                for r in m["inputs_rows"]
            ],
        )
        append_rows(con, "process_groups", [pg for m in metas for pg in m["process_groups"]])
        derive(con)
        for name in ("inputs", "process_groups"):
            tables[name] = {
                "columns": pq.table_schema(con, name),
                "rows": pq.copy_table(con, staging, name),
                "kind": "canonical",
            }
        for name in _derived_tables(con, set(canonical)):
            tables[name] = {
                "columns": pq.table_schema(con, name),
                "rows": pq.copy_table(con, staging, name),
                "kind": "derived",
            }
        views = _derived_views(con)
    finally:
        con.close()
    return tables, views


def _manifest_inputs(metas: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The manifest's entry per input read: its path, format, ranks, row counts and parse time."""
    return [
        {
            "input_id": m["input_id"],
            "path": m["path"],
            "format": m["format"],
            "ranks": [r["rank"] for r in m["inputs_rows"] if r.get("rank") is not None],
            "rows": m["rows"],
            "parse_write_s": m["parse_write_s"],
        }
        for m in metas
    ]


def _scratch_connection(staging: Path) -> duckdb.DuckDBPyConnection:
    """In-memory DuckDB that spills to the staging folder (same file system as the store)."""
    return duckdb.connect(":memory:", config={"temp_directory": str(staging / "scratch.tmp")})


def _canonical_schemas() -> dict[str, list[list[str]]]:
    """Columns and types of every canonical table, from the schema files (an empty store)."""
    con = open_store()
    try:
        names = [
            r[0]
            for r in con.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE' ORDER BY table_name"
            ).fetchall()
        ]
        return {n: pq.table_schema(con, n) for n in names if n not in ("inputs", "process_groups")}
    finally:
        con.close()


def _create_metadata_tables(con: duckdb.DuckDBPyConnection) -> None:
    ref = open_store()
    try:
        for name in ("inputs", "process_groups"):
            cols = ", ".join(f'"{c}" {t}' for c, t in pq.table_schema(ref, name))
            con.execute(f"CREATE TABLE {name} ({cols})")
    finally:
        ref.close()


def _derived_tables(con: duckdb.DuckDBPyConnection, canonical: set[str]) -> list[str]:
    rows = con.execute(
        "SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE' "
        "AND table_schema = 'main' ORDER BY table_name"
    ).fetchall()
    return [r[0] for r in rows if r[0] not in canonical and r[0] not in ("inputs", "process_groups")]


def _derived_views(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """Views the derivations create over the derived tables (e.g. step_collectives), by their SQL."""
    rows = con.execute(
        "SELECT view_name, sql FROM duckdb_views() WHERE NOT internal AND schema_name = 'main' ORDER BY view_name"
    ).fetchall()
    stored = {
        r[0] for r in con.execute("SELECT table_name FROM information_schema.tables WHERE table_type='VIEW'").fetchall()
    }
    return {
        name: sql
        for name, sql in rows
        if name in stored and not sql.lstrip().upper().startswith("CREATE VIEW " + name.upper() + " AS SELECT CAST(")
    }


def derivations_record() -> dict[str, Any]:
    """What a store's manifest says about its derived tables: the registry's version and the tables and views it
    provides (tracediag.derive.REGISTRY)."""
    from tracediag.derive import provided_tables, registry_version

    return {"registry_version": registry_version(), "provides": provided_tables()}


def check_derivations(store: Path, manifest: pq.StoreManifest) -> None:
    """An input error unless the store holds what this version's derivations provide."""
    from tracediag.derive import registry_version

    held = manifest.doc.get("derivations")
    want = derivations_record()
    version = held.get("registry_version") if isinstance(held, dict) else None
    if version != want["registry_version"]:
        raise InputError(
            store,
            f"store derived by another set of derivations (registry {version}, this version builds "
            f"{registry_version()}); ingest the traces again",
        )
    have = set(manifest.doc.get("tables", {})) | set(manifest.doc.get("views", {}))
    missing = [t for t in want["provides"] if t not in have]
    if missing:
        raise InputError(store, f"store lacks the derived table(s) {', '.join(missing)}; ingest the traces again")


def open_store_views(
    store: str | Path, db_path: str | Path | None = None, ranks: Sequence[int] | None = None
) -> duckdb.DuckDBPyConnection:
    """A DuckDB connection (file `db_path` or in memory) with one view per table of the store; `ranks`: only
    those ranks' partitions (a TP group's task reads its own files, not every rank's). The whole store's files are
    checked against the manifest's columns when it is opened whole (a group's task opens what was checked)."""
    manifest = pq.read_manifest(Path(store))
    check_derivations(Path(store), manifest)
    con = duckdb.connect(str(db_path) if db_path else ":memory:")
    if ranks is None:
        try:
            pq.verify_columns(con, manifest)
        except BaseException:
            con.close()
            raise
    pq.attach_views(con, manifest, ranks)
    for _name, sql in manifest.doc.get("views", {}).items():
        con.execute(sql)
    return con
