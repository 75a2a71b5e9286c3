"""One Kineto rank file's tables, built chunk by chunk of decoded events (`_Builder`): each event to its table's
source category, its `ts` and `dur` checked (timestamps._timed), the tables' columns (columns.build_tables), bad
records merged with row keys unique per table; tables beyond the memory budget are spilled to Parquet parts.
`finish` assembles the tables and the inputs row (meta).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from tracediag.errors import InputError
from tracediag.ingest import validate as val
from tracediag.ingest.base import NAMED_TABLES, IngestOptions, Parsed, SpilledTable, long_names
from tracediag.ingest.kineto.columns import OLD_CATEGORY, SOURCES, TABLE_OF, FileColumns, _int64, build_tables
from tracediag.ingest.kineto.events import _Event
from tracediag.ingest.kineto.meta import _head_dist, _meta, _pg_config, _pick_rank
from tracediag.ingest.kineto.timestamps import _timed
from tracediag.ingest.validate import BadRecords

# Markers worth keeping from the (skipped) python_function events: vLLM V0 and V1 model runners
# show their per-step `execute_model` only as a Python frame (CATALOG.md section 4).
_PY_STEP_MARKER = re.compile(r"(?:^|\s|/)\w*model_runner\w*\.py\(\d+\): execute_model$")
_ROW_KEY = 1 << 48  # bad-record row keys: source number × 2**48 + row number within the source (unique per table)


class _Builder:
    """Columns of one rank file, built chunk by chunk of decoded events; `finish` assembles the tables.

    Rows keep the whole-file order: a table's rows are all rows of its first source category, then of the next
    (memops: every memcpy, then every memset), each source's rows in file order. Bad records are counted per
    chunk and merged with row keys that are unique per table row, so the counts are those of a whole-file parse.
    """

    def __init__(
        self, p: Path, order: int, opts: IngestOptions, exact: bool, spill_at: int, bad: BadRecords | None = None
    ) -> None:
        self.p = p
        self.order = order
        self.keep_python = opts.keep_python
        self.exact = exact
        # spilling: tables beyond `spill_at` bytes are written to Parquet parts in `spill_dir` (see _spill)
        self.spill_dir = Path(opts.spill_dir) if opts.spill_dir else None
        self.spill_at = spill_at
        self.held = 0  # bytes of the tables in self.parts
        self.head = b""  # the document up to its events array (jsonstream prefix): the rank when spilling
        self.spilled: dict[str, list[str]] = {}  # table -> its Parquet parts
        self.spilled_rows: dict[str, int] = {}
        self.spill_rank: tuple[int, str] | None = None  # the rank written into the parts
        self.stats = _TableStats()
        self.chunks = 0
        self.events_total = 0
        self.py_skipped = 0
        self.unread: dict[str, int] = {}  # duration events of categories no table holds, per category
        self.durations = 0  # duration (X) events of any category, stored or not
        self.bad = bad if bad is not None else BadRecords()
        self.rows = {src: 0 for srcs in SOURCES.values() for src in srcs}  # rows kept so far per source
        self.parts: dict[str, list[pa.Table]] = {src: [] for src in self.rows}
        self.columns = FileColumns()  # the names' classes and the runtime calls' correlation ids so far

    def add(self, events: list[_Event]) -> None:
        self.chunks += 1
        self.events_total += len(events)
        by_cat: dict[str, list[_Event]] = {}
        flows: list[_Event] = []
        keep_python = self.keep_python
        for e in events:
            ph = e.ph
            if ph == "X":
                cat = e.cat if type(e.cat) is str else ""
                if cat not in TABLE_OF:
                    cat = OLD_CATEGORY.get(cat, cat)
                if cat == "python_function":  # vLLM's execute_model frames are step markers, kept Python or not
                    if type(e.name) is str and _PY_STEP_MARKER.search(e.name):
                        cat = "python_step_marker"
                    elif not keep_python:
                        self.py_skipped += 1
                        continue
                lst = by_cat.get(cat)
                if lst is None:
                    by_cat[cat] = lst = []
                lst.append(e)
            elif ph in ("s", "f"):
                flows.append(e)
        self.durations += sum(map(len, by_cat.values()))
        if flows:
            by_cat["flows"] = flows
        for cat, evs in by_cat.items():
            if cat not in TABLE_OF:  # counted and reported, never dropped silently
                self.unread[cat] = self.unread.get(cat, 0) + len(evs)
        bad = BadRecords()
        timed = {cat: _timed(evs, TABLE_OF[cat], self.exact, bad) for cat, evs in by_cat.items() if cat in TABLE_OF}
        self._build(timed, bad)
        self._merge(bad, {cat: len(t[0]) for cat, t in timed.items()})
        for cat, (evs, _, _) in timed.items():
            self.rows[cat] += len(evs)
        if self.spill_dir is not None and self.held > self.spill_at:
            self._spill()

    def _assembled(self) -> dict[str, pa.Table]:
        """The tables held so far (each source's rows in order), without the rank column; the parts are released."""
        tables = {}
        for table, srcs in SOURCES.items():
            pieces = [t for s in srcs for t in self.parts[s]]
            for s in srcs:
                self.parts[s] = []
            if pieces:
                # chunked, not combined: DuckDB and the IPC writer take chunks as they are (combining copies all)
                tables[table] = pa.concat_tables(pieces) if len(pieces) > 1 else pieces[0]
        self.held = 0
        return tables

    def _build(self, timed: dict[str, tuple[list[_Event], np.ndarray, np.ndarray]], bad: BadRecords) -> None:
        """A chunk's tables, each held as one slice per source (assembled, or spilled, in row order)."""
        for parts, table in build_tables(timed, bad, self.columns):
            self.held += table.nbytes
            lo = 0
            for src, evs, _, _ in parts:
                self.parts[src].append(table.slice(lo, len(evs)))
                lo += len(evs)

    def _spill(self) -> None:
        """Write the tables held so far as one Parquet part each, in the store's columns (rank included), and
        release them. The rank is the one the document's head gives (Kineto writes distributedInfo before the
        events); `finish` rewrites the parts in the rare file whose rank is only given after them."""
        from tracediag.store.parquet import conform

        if self.spill_rank is None:
            self.spill_rank = _pick_rank(self.p, _head_dist(self.head), self.order)
        rank = self.spill_rank[0]
        for table, t in self._assembled().items():
            self.stats.add(table, t)
            t = conform(table, _with_rank(t, rank))
            files = self.spilled.setdefault(table, [])
            path = self.spill_dir / f"input-{self.order}.{table}.{len(files)}.parquet"
            self._write(t, path)
            files.append(str(path))
            self.spilled_rows[table] = self.spilled_rows.get(table, 0) + t.num_rows

    def _merge(self, bad: BadRecords, counts: dict[str, int]) -> None:
        """Fold a chunk's bad records in, its row indices (within the chunk's rows of a table) made into row keys."""
        for name, f in bad.fields.items():
            self.bad.note(name, f.action, [], f.count)
            g = self.bad.fields[name]
            g.examples.extend(f.examples[: val.MAX_EXAMPLES - len(g.examples)])
        self.bad._dropped += bad._dropped
        self.bad._extra += bad._extra
        for table, idx in bad._nulled.items():
            srcs = SOURCES.get(table)
            if srcs is None:  # not a per-row table of ours
                self.bad._nulled.setdefault(table, set()).update(idx)
                continue
            bounds, lo = [], 0
            for s_no, src in enumerate(srcs):
                n = counts.get(src, 0)
                bounds.append((lo, lo + n, s_no * _ROW_KEY + self.rows[src] - lo))
                lo += n
            keys = self.bad._nulled.setdefault(table, set())
            for i in idx:
                for a, b, shift in bounds:
                    if a <= i < b:
                        keys.add(i + shift)
                        break

    def finish(self, top: dict[str, Any]) -> Parsed:
        p, bad, order = self.p, self.bad, self.order
        if not self.events_total:
            raise InputError(p, "trace has no events (empty traceEvents)")
        stored = [s for s in self.rows if s != "flows"]
        if not self.durations:
            if self.py_skipped:
                raise InputError(
                    p,
                    f"trace has no duration events besides {self.py_skipped} python_function events "
                    "(pass --keep-python to store those)",
                )
            raise InputError(p, f"trace has no duration events (only {self.events_total} metadata/instant events)")
        if not any(self.rows[s] for s in stored) and self.unread and not bad:
            cats = ", ".join(f"{c!r} ({n:,})" for c, n in sorted(self.unread.items(), key=lambda x: -x[1])[:5])
            raise InputError(p, f"no event of a category tracediag reads; the trace's duration events are {cats}")
        if bad and not any(self.rows[s] for s in stored):
            first = next(iter(bad.fields))
            raise InputError(
                p,
                f"no event has a usable ts and dur ({bad.records} dropped; e.g. {first} = "
                f"{bad.fields[first].examples[0]})",
            )
        dist = top.get("distributedInfo")
        rank, rank_source = _pick_rank(p, dist, order)
        tables: dict[str, pa.Table | SpilledTable] = {}
        if self.spilled:
            self._spill()  # the rest too: a table is all in parts or all in memory
            if self.spill_rank != (rank, rank_source):
                self._relabel(rank)
            tables = {t: SpilledTable(files, self.spilled_rows[t]) for t, files in self.spilled.items()}
        else:
            for table, t in self._assembled().items():
                self.stats.add(table, t)
                tables[table] = _with_rank(t, rank)

        meta = _meta(p, order, rank, rank_source, dist, top.get("deviceProperties"), self.stats.device(), bad)
        pgs = _pg_config(dist, rank, bad)
        long_named = len(self.stats.long_names)
        meta |= {
            "trace_start_ns": self.stats.start,
            "trace_end_ns": self.stats.end,
            "events_total": self.events_total,
            "events_python_skipped": self.py_skipped,
        }
        facts = {"names_classified_by_prefix": long_named} if long_named else {}
        if self.unread:
            facts["unread_categories"] = dict(sorted(self.unread.items(), key=lambda x: -x[1])[:20])
        if bad:
            facts["bad_records"] = bad.to_meta()
        meta |= {"bad_records": bad.records, "meta_json": orjson.dumps(facts).decode() if facts else None}
        return Parsed(path=str(p), format="kineto", inputs_rows=[meta], tables=tables, process_groups=pgs)

    def _relabel(self, rank: int) -> None:
        """Rewrite the parts with the file's rank, given only after its events (one part in memory at a time)."""
        import pyarrow.parquet as pq

        for files in self.spilled.values():
            for f in files:
                t = pq.read_table(f)
                i = t.schema.get_field_index("rank")
                self._write(t.set_column(i, "rank", pa.array(np.full(t.num_rows, rank, dtype=np.int32))), f)

    def _write(self, t: pa.Table, path: Path | str) -> None:
        # a full or unwritable disk is the user's to fix, not a reason to decode the whole file in memory instead
        try:
            _write_parquet(t, path)
        except (OSError, pa.ArrowException) as exc:
            raise InputError(
                self.p,
                f"its tables are too large to hold and cannot be written out to {Path(path).parent} "
                f"({getattr(exc, 'strerror', None) or exc}); free space there, or raise --memory-limit",
            ) from None


def _with_rank(t: pa.Table, rank: int) -> pa.Table:
    return t.add_column(0, "rank", _int64(np.full(t.num_rows, rank, dtype=np.int32)))


def _write_parquet(t: pa.Table, path: Path | str) -> None:
    import pyarrow.parquet as pq

    # written once and read once by DuckDB, right after: fast compression, one row group per ~1M rows
    pq.write_table(t, str(path), compression="lz4", row_group_size=1 << 20)


class _TableStats:
    """What `finish` reports about the tables, gathered from each part as it is made (held or spilled): the
    trace's start and end, the kernels' devices, the long names the catalog classified by prefix."""

    def __init__(self) -> None:
        self.start: int | None = None
        self.end: int | None = None
        self.devices: dict[int, int] = {}
        self.long_names: set[tuple[str, str]] = set()

    def add(self, table: str, t: pa.Table) -> None:
        if not t.num_rows:
            return
        if table != "flows":
            ts = t.column("ts_ns").to_numpy()
            lo, hi = int(ts.min()), int((ts + t.column("dur_ns").to_numpy()).max())
            self.start = lo if self.start is None else min(self.start, lo)
            self.end = hi if self.end is None else max(self.end, hi)
        if table == "kernels":
            counts = pc.value_counts(pc.drop_null(t.column("device")))
            for d, n in zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist()):
                self.devices[d] = self.devices.get(d, 0) + n
        if table in NAMED_TABLES:
            self.long_names |= {(table, n) for n in long_names(t)}

    def device(self) -> int | None:
        """The device most kernels ran on (the first such in order of appearance on a tie)."""
        return max(self.devices, key=self.devices.__getitem__) if self.devices else None
