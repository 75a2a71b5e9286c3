"""What every ingester returns: rows for `inputs`, and Arrow tables shaped like the store's schema."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracediag.catalog import CLASSIFY_MAX_CHARS

if TYPE_CHECKING:  # imported where tables are built: a store's reader needs no Arrow
    import pyarrow as pa


@dataclass(frozen=True)
class IngestOptions:
    keep_python: bool = False  # Kineto: also store python_function events
    memory_limit: int | None = None  # bytes one parser may use besides its tables (None: memory.DEFAULT_MEMORY_LIMIT)
    # a folder where a parser may write the tables of a large file as Parquet parts instead of holding them
    # (SpilledTable); None: tables are held in memory. The caller removes the folder once it has loaded them.
    spill_dir: str | None = None


@dataclass
class SpilledTable:
    """A table a parser wrote to Parquet files (in its IngestOptions.spill_dir) instead of holding it: the files
    have the store's columns, rank included, so the loader streams them into the store with bounded memory."""

    files: list[str]
    num_rows: int


@dataclass
class Parsed:
    """One input file, parsed.

    `inputs_rows` has one row per rank (or process) the file holds — one for a Kineto trace, several for
    an Nsight export of a multi-GPU run, one with rank None for telemetry (metrics, logs, benchmarks).
    Each row's keys are `inputs` columns; format-specific facts go into `meta_json`.
    """

    path: str
    format: str
    inputs_rows: list[dict[str, Any]]
    tables: dict[str, pa.Table | SpilledTable] = field(default_factory=dict)
    process_groups: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ranks(self) -> list[int]:
        return [r["rank"] for r in self.inputs_rows if r.get("rank") is not None]


def read_gunzipped(path: Path, what: str, limit: int | None = None) -> bytes:
    """The file's bytes, decompressed when they start with the gzip magic, within the read budget of the memory
    budget `limit` (inputfile.read_input); `what` names the file in errors."""
    from tracediag.inputfile import read_input

    return read_input(path, what, limit)


NAMED_TABLES = ("kernels", "cpu_ops", "annotations")


def long_names(table: pa.Table) -> set[str]:
    """The distinct names of a kernels/cpu_ops/annotations table longer than the catalog matches."""
    import pyarrow.compute as pc

    lengths = pc.utf8_length(table.column("name"))
    if (pc.max(lengths).as_py() or 0) <= CLASSIFY_MAX_CHARS:
        return set()
    return set(pc.unique(pc.filter(table.column("name"), pc.greater(lengths, CLASSIFY_MAX_CHARS))).to_pylist())


def names_classified_by_prefix(tables: dict[str, pa.Table]) -> int:
    """Distinct kernel/op/annotation names longer than the catalog matches (only their first
    CLASSIFY_MAX_CHARS characters were classified); recorded in the input's meta when not 0."""
    n = 0
    for name in NAMED_TABLES:
        t = tables.get(name)
        if t is not None and t.num_rows:
            n += len(long_names(t))
    return n
