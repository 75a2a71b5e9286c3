"""The one way from input files to a store with derived tables: discover → parse → load → derive.

`build_store(files)` is what `analyze` runs on traces, what a TP=1 baseline (--tp1-baseline, Context.baseline) is
read with, and what tests build their stores with; `store_from(parsed)` loads inputs parsed some other way;
`derive(con)` builds the derived tables (tracediag.derive's registry) — what `tracediag ingest` runs over the views of
its Parquet store (tracediag.fleet), whose parsers write the partitions themselves. `input_files` turns the paths a
user gave into the (path, format) pairs all of them read.

Below the context (a Context builds its baseline with it), above derive, ingest and the store.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from pathlib import Path

import duckdb

from tracediag.derive import build_all
from tracediag.errors import InputError, UsageError
from tracediag.ingest import discover_inputs, load, parse_all, parts_folder
from tracediag.ingest.base import IngestOptions, Parsed
from tracediag.interrupt import interrupting
from tracediag.memory import spill_bytes
from tracediag.store import memory_limit_within, open_store

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
        con = _loaded(parsed, db_path, options.memory_limit, say)
        del parsed  # the parsed tables are in the store now: not held while deriving
    if large:
        _release()
    with interrupting(con):  # a stopped call's derivation statement ends at once (tracediag.interrupt)
        return _derived(con, say)


def _release() -> None:
    import pyarrow as pa  # here, not at the top: `analyze --store` imports this module and no Arrow

    gc.collect()  # a parsed input's tables can sit in a reference cycle
    pa.default_memory_pool().release_unused()
