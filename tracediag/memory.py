"""The memory budget of one analysis: how big a chunk of events one parser decodes at a time, and DuckDB's
memory limit and spill folder.

One number, `--memory-limit` (default DEFAULT_MEMORY_LIMIT), bounds what a parser holds besides the columnar
tables it builds: the chunk of JSON text it decodes and the decoded events of that chunk, which take about
CHUNK_FACTOR times the chunk's bytes (msgspec structs, the strings they point to, the per-chunk columns).
A parser allowed to spill (IngestOptions.spill_dir) also writes its columnar tables out as Parquet parts
whenever they exceed `spill_bytes` (half the budget), so a file of any size is parsed within about 1.5× it.
DuckDB gets DUCKDB_FACTOR times that number as its `memory_limit`, and spills to a temporary folder beyond it;
while a file store is loaded it gets half the budget (the parsed tables it copies hold at most the other half).

The budget is a value, never a setting of the process: the CLI parses --memory-limit (parse_size) and passes the
bytes to the library (`tracediag.analyze(memory_limit=)`, `tracediag.fleet.ingest_store(memory_limit=)`), which
gives them to the parsers in IngestOptions.memory_limit (travelling with each parser process's or Dask worker's
task) and to DuckDB through `open_store(memory_limit=)`. Every function here takes it; None is the default.
"""

from __future__ import annotations

import re

DEFAULT_MEMORY_LIMIT = 512 << 20
MIN_MEMORY_LIMIT = 64 << 20
# peak bytes of one decoded chunk per byte of its JSON (measured on the 222 MB generated rank and the real
# GPU traces in tests/data/external: 4-6; 8 leaves room for the chunk's text and columns)
CHUNK_FACTOR = 8
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40, "tib": 1 << 40}  # fmt: skip


def parse_size(text: str) -> int:
    """'512MiB', '2G', '300m', '1073741824' -> bytes (binary units; 'MB' is read as MiB). ValueError otherwise."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (examples: 512MiB, 2GiB)")
    n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    if n < MIN_MEMORY_LIMIT:
        raise ValueError(f"memory limit {text!r} is below the minimum of {MIN_MEMORY_LIMIT >> 20} MiB")
    return n


def memory_limit(limit: int | None = None) -> int:
    """The budget in bytes: `limit` when given, else DEFAULT_MEMORY_LIMIT."""
    return DEFAULT_MEMORY_LIMIT if limit is None else limit


def chunk_bytes(limit: int | None = None) -> int:
    """Bytes of JSON text a parser decodes at a time within the budget."""
    return max(1 << 20, memory_limit(limit) // CHUNK_FACTOR)


# The trace decoder's chunks stop growing here however large the budget: a chunk's decoded events (hundreds of
# thousands of objects) are made and freed before the next, and in chunks of a few MiB they reuse the same memory,
# warm in the caches, instead of asking the kernel for fresh pages each time (the 222 MB generated rank: ~15 % less
# CPU and half the peak RSS at 8 MiB than at the 64 MiB of the default budget's eighth).
DECODE_CHUNK_MAX = 8 << 20


def decode_chunk_bytes(limit: int | None = None) -> int:
    """Bytes of a trace's event array a parser decodes at a time: chunk_bytes, at most DECODE_CHUNK_MAX."""
    return min(chunk_bytes(limit), DECODE_CHUNK_MAX)


def read_bytes_budget(limit: int | None = None) -> int:
    """Bytes of (decompressed) text a reader that holds a whole file may read: metrics, benchmark results,
    nccl-tests output, topology snapshots, model configs. Their parsers turn each byte into Python objects of
    about CHUNK_FACTOR times its size, as the trace parser's chunks, so a file of this size parses within the budget."""
    return chunk_bytes(limit)


def spill_bytes(limit: int | None = None) -> int:
    """Bytes of columnar tables a parser holds before it writes them out as Parquet parts (when it may spill):
    half the budget, so a rank of a few hundred MB never spills and a multi-GB rank is held a part at a time."""
    return max(MIN_MEMORY_LIMIT, memory_limit(limit)) // 2


# DuckDB's limit is a multiple of the parser budget: its joins and window functions over a rank's tables need
# working memory that not every operator can spill (a 512 MiB limit fails on a 4 GB rank: "failed to pin block")
DUCKDB_FACTOR = 4


def duckdb_settings(limit: int | None = None) -> dict[str, str]:
    """DuckDB settings for the budget: `memory_limit` DUCKDB_FACTOR × it (DuckDB spills to its temp_directory
    beyond), and insertion order not kept."""
    return {
        "memory_limit": f"{DUCKDB_FACTOR * max(memory_limit(limit), MIN_MEMORY_LIMIT) >> 20}MiB",
        # rows in no particular order (every query of ours that needs an order says ORDER BY): DuckDB then
        # inserts and builds tables in parallel, writing a file store's blocks as it goes instead of in one
        # checkpoint at the end (~1.4 s of the 2 x 222 MB pair), and needs less memory for it
        "preserve_insertion_order": "false",
    }
