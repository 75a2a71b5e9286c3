"""The one way from input files to a store with derived tables: discover → parse → load → derive.

`build_store(files)` is what a TP=1 baseline (--tp1-baseline, Context.baseline) is read with, and what tests build
their stores with; `analysis_store(files, db_path)` is what `analyze` runs on traces (the store in memory when it
fits, its file written beside the rules: StoreFile); `store_from(parsed)` loads inputs parsed some other way;
`derive(con)` builds the derived tables (tracediag.derive's registry) — what `tracediag ingest` runs over the views of
its Parquet store (tracediag.fleet), whose parsers write the partitions themselves. `input_files` turns the paths a
user gave into the (path, format) pairs all of them read.

Below the context (a Context builds its baseline with it), above derive, ingest and the store.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import duckdb

from tracediag.derive import build_all
from tracediag.errors import InputError, UsageError
from tracediag.ingest import TRACE_FORMATS, discover_inputs, load, parse_all, parts_folder
from tracediag.ingest.base import IngestOptions, Parsed, SpilledTable
from tracediag.memory import memory_limit as budget_bytes
from tracediag.memory import spill_bytes
from tracediag.store import comment_columns, memory_limit_within, open_store

Files = list[tuple[Path, str | None]]
RELEASE_FROM_BYTES = 64 << 20  # inputs of this size or more hand the parse's freed memory back (build_store)


def input_files(paths: Sequence[str | Path] = (), extra_inputs: Sequence[tuple[str | Path, str]] = ()) -> Files:
    """`paths` (traces or folders, format detected from content) and `extra_inputs` ((path, format) pairs given
    with an explicit format: --metrics, --log, --bench...) as (path, format or None); a usage error when there are
    none, an input error naming a path that does not exist."""
    files: Files = [(f, None) for f in discover_inputs(list(paths))] if paths else []
    files += [(Path(p), fmt) for p, fmt in extra_inputs]
    if not files:
        raise UsageError("no inputs given: pass traces, or --metrics/--log/--bench files")
    for p, _ in files:
        if not p.exists():
            raise InputError(p, "no such file or directory")
    return files


def derive(con: duckdb.DuckDBPyConnection) -> None:
    """Build every derived table (tracediag.derive.REGISTRY, in dependency order) on a loaded store."""
    build_all(con)


def store_from(
    parsed: list[Parsed],
    *,
    db_path: str | Path | None = None,
    memory_limit: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> duckdb.DuckDBPyConnection:
    """A store (file `db_path` or in memory, within `memory_limit`) holding `parsed` and its derived tables; the
    caller closes it."""
    say = progress or (lambda stage: None)
    return _derived(_loaded(parsed, db_path, memory_limit, say), say)


def _loaded(
    parsed: list[Parsed], db_path: str | Path | None, memory_limit: int | None, say: Callable[[str], None]
) -> duckdb.DuckDBPyConnection:
    con = open_store(db_path, memory_limit)
    try:
        say("loading the store")
        if db_path is None:  # in memory: the store is what DuckDB holds, a lower limit would only spill it
            load(con, parsed)
        else:  # the parsed tables are held until the load ends (at most half the budget): DuckDB gets the rest
            with memory_limit_within(con, spill_bytes(memory_limit)):
                load(con, parsed)
    except BaseException:
        con.close()
        raise
    return con


def _derived(con: duckdb.DuckDBPyConnection, say: Callable[[str], None]) -> duckdb.DuckDBPyConnection:
    try:
        say("deriving steps, collectives and kernel classes")
        derive(con)
    except BaseException:
        con.close()
        raise
    return con


def parse(
    files: Files, options: IngestOptions | None = None, jobs: int | None = None, parts_dir: str | Path | None = None
) -> list[Parsed]:
    """The inputs parsed (tracediag.ingest.parse_all) with `options`, whose memory_limit every parser process
    gets with its task."""
    options = options or IngestOptions()
    return parse_all(files, jobs=jobs, options=options, parts_dir=parts_dir)


def build_store(
    files: Files,
    *,
    db_path: str | Path | None = None,
    options: IngestOptions | None = None,
    jobs: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> duckdb.DuckDBPyConnection:
    """Parse `files` ((path, format or None) pairs, as input_files gives), load them into a store (file `db_path`
    or in memory) and derive; the caller closes the connection. `options.memory_limit` bounds the parsers and
    DuckDB (tracediag.memory); a rank too large to hold is written as Parquet parts beside the store file, then
    streamed into it."""
    con, _ = _build(files, db_path, options, jobs, progress, in_memory_if_fits=False)
    return con


def analysis_store(
    files: Files,
    db_path: str | Path | None,
    *,
    options: IngestOptions | None = None,
    jobs: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> tuple[duckdb.DuckDBPyConnection, StoreFile | None]:
    """build_store for an analysis that keeps its store at `db_path` (trace.duckdb): when the parsed tables fit the
    memory budget, the store is built and read in memory (a file store compresses every block it writes: the
    load, the derivations and the rules took ~40 % longer on the 2 × 222 MB pair) and written to `db_path` in the
    background while the rules run, the columns commented first (StoreFile: the caller waits for it before the
    file is used). Otherwise (a rank that spilled, inputs beyond the budget) it is a file store, as build_store
    makes, and the StoreFile is None (fits_in_memory says which)."""
    return _build(files, db_path, options, jobs, progress, in_memory_if_fits=db_path is not None)


def _build(
    files: Files,
    db_path: str | Path | None,
    options: IngestOptions | None,
    jobs: int | None,
    progress: Callable[[str], None] | None,
    in_memory_if_fits: bool,
) -> tuple[duckdb.DuckDBPyConnection, StoreFile | None]:
    say = progress or (lambda stage: None)
    options = options or IngestOptions()
    size = sum(p.stat().st_size for p, _ in files if p.is_file())
    say(f"reading {len(files)} file{'s' if len(files) != 1 else ''} ({size / 2**20:,.1f} MiB)")
    with parts_folder(db_path) as parts_dir:
        parsed = parse(files, options, jobs, parts_dir)
        # Arrow's allocator keeps the buffers a parse freed for reuse (~190 MiB after a 10^6-line log): hand them
        # back before the store takes its copy, and again once the parsed tables are gone. Only for large inputs:
        # the full collection it starts with costs more than it gives back on small ones (and in a long-lived
        # process with a large heap, such as a notebook or the test suite, far more).
        large = size >= RELEASE_FROM_BYTES
        if large:
            _release()
        in_memory = in_memory_if_fits and fits_in_memory(parsed, options.memory_limit)
        con = _loaded(parsed, None if in_memory else db_path, options.memory_limit, say)
        del parsed  # the parsed tables are in the store now: not held while deriving
    if large:
        _release()
    con = _derived(con, say)
    if not in_memory:
        return con, None
    try:
        comment_columns(con)  # before the copy: COPY FROM DATABASE copies the comments with the tables
        return con, StoreFile(con, Path(db_path))
    except BaseException:
        con.close()
        raise


def fits_in_memory(parsed: list[Parsed], limit: int | None) -> bool:
    """Every input is a profiler trace, none had a table spilled, and the parsed tables together are within the
    budget (DuckDB's in-memory copy of them is about their size; its memory_limit is a multiple of the budget:
    tracediag.memory). Serving telemetry stays in a file store: its rules read each series once, so memory, not
    query speed, is what a long log costs (a 10^6-line log's stats held uncompressed beside SCH003's trend test:
    ~700 MiB instead of ~530)."""
    held = 0
    for pt in parsed:
        if pt.format not in TRACE_FORMATS:
            return False
        for t in pt.tables.values():
            if isinstance(t, SpilledTable):
                return False
            held += t.nbytes
    return held <= budget_bytes(limit)


class StoreFile:
    """An in-memory store being written to its file: COPY FROM DATABASE (tables, views, column comments) on a
    cursor of its own in a thread, while the caller reads the store (the copy sees the store as it was when it
    started). `wait()` returns once the file is complete and raises what the copy raised; `cancel()` interrupts it
    (an analysis that failed: the caller removes what it staged)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, path: Path) -> None:
        self.path = path
        self._cur = con.cursor()
        self._db = con.execute("SELECT current_database()").fetchone()[0]
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._copy, name="tracediag-store-file", daemon=True)
        self._thread.start()

    def _copy(self) -> None:
        quoted = str(self.path).replace("'", "''")  # ATTACH takes no parameter for the path
        try:
            self._cur.execute(f"ATTACH '{quoted}' AS tracediag_file")
            try:
                self._cur.execute(f'COPY FROM DATABASE "{self._db}" TO tracediag_file')
            finally:
                self._cur.execute("DETACH tracediag_file")
        except BaseException as exc:  # re-raised by wait() in the caller's thread
            self._error = exc

    def wait(self) -> None:
        self._thread.join()
        self._cur.close()
        if self._error is not None:
            raise self._error

    def cancel(self) -> None:
        if self._thread.is_alive():
            self._cur.interrupt()
        self._thread.join()
        self._cur.close()


def _release() -> None:
    import pyarrow as pa  # here, not at the top: `analyze --store` imports this module and no Arrow

    gc.collect()  # a parsed input's tables can sit in a reference cycle
    pa.default_memory_pool().release_unused()
