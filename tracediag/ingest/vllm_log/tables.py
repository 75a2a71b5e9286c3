"""The tables a vLLM (or SGLang) log becomes: their schemas, their rows gathered in Arrow batches (Columns), and the
parser's state (LogState): the four tables, server runs, counts and examples of bad and unknown lines.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from tracediag.ingest.log_blocks import RUN_BACKWARDS_S
from tracediag.ingest.vllm_log.decode import Clock

# Where a record stands: the leading columns of the stats, event and spec tables.
_RECORD_COLUMNS = [
    ("input_id", pa.int32()),
    ("run", pa.int32()),
    ("line", pa.int32()),
    ("ts_text", pa.string()),
    ("t_s", pa.float64()),
    ("process", pa.string()),
    ("pid", pa.int32()),
]
_ENGINE_COLUMNS = [("engine", pa.int32()), ("log_format", pa.string())]
STATS_SCHEMA = pa.schema(
    [
        *_RECORD_COLUMNS,
        *_ENGINE_COLUMNS,
        ("tput_tok_s", pa.float64()),
        ("prompt_tput_tok_s", pa.float64()),
        ("gen_tput_tok_s", pa.float64()),
        ("running", pa.int32()),
        ("waiting", pa.int32()),
        ("swapped", pa.int32()),
        ("deferred", pa.int32()),
        ("preemptions", pa.int32()),
        ("kv_usage_pct", pa.float64()),
        ("cpu_kv_usage_pct", pa.float64()),
        ("prefix_hit_pct", pa.float64()),
        ("external_prefix_hit_pct", pa.float64()),
        ("mm_hit_pct", pa.float64()),
        ("extra_json", pa.string()),
    ]
)
EVENTS_SCHEMA = pa.schema(
    [
        *_RECORD_COLUMNS,
        ("kind", pa.string()),
        ("seq_group", pa.string()),
        ("mode", pa.string()),
        ("cumulative", pa.int64()),
        ("http_status", pa.int32()),
        ("own_time", pa.bool_()),
        ("text", pa.string()),
        ("pattern", pa.string()),
    ]
)
STARTUP_SCHEMA = pa.schema(
    [
        ("input_id", pa.int32()),
        ("run", pa.int32()),
        ("line", pa.int32()),
        ("process", pa.string()),
        ("pid", pa.int32()),
        ("key", pa.string()),
        ("value", pa.string()),
        ("value_num", pa.float64()),
        ("unit", pa.string()),
        ("text", pa.string()),
    ]
)
SPEC_SCHEMA = pa.schema(
    [
        *_RECORD_COLUMNS,
        *_ENGINE_COLUMNS,
        ("cumulative", pa.bool_()),
        ("num_spec_tokens", pa.int32()),
        ("num_drafts", pa.float64()),
        ("draft_tokens", pa.int64()),
        ("accepted_tokens", pa.int64()),
        ("emitted_tokens", pa.int64()),
        ("acceptance_rate", pa.float64()),
        ("system_efficiency", pa.float64()),
        ("mean_acceptance_length", pa.float64()),
        ("accepted_tput_tok_s", pa.float64()),
        ("drafted_tput_tok_s", pa.float64()),
        ("per_position", pa.list_(pa.float64())),
        ("text", pa.string()),
    ]
)
MAX_EXAMPLES = 5
MAX_TEXT = 500
MAX_RUN_STARTS = 20  # the run starts listed in the input's meta (all are counted in `runs`)
MAX_PROCESSES = 4096  # process names whose pid is followed (DP x TP engines and workers: hundreds at most)
RUN_PID_GAP_S = 30.0  # a process name with a new pid starts a new run when its old pid was last heard this long ago


class Columns:
    """Rows of one Arrow schema, turned into Arrow batches every FLUSH rows (a million stats lines must not stay a
    million dicts). A row is the dict the parser made (one append per line; missing columns are NULL)."""

    FLUSH = 50_000  # rows kept as Python objects before they become an Arrow batch (bounded memory)

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema
        self.rows: list[dict[str, Any]] = []
        self.batches: list[pa.RecordBatch] = []
        self.n = 0
        self.kinds: dict[str, int] = {}  # counts of the 'kind' column (events), kept across flushes

    def add(self, values: dict[str, Any]) -> None:
        self.rows.append(values)
        self.n += 1
        if "kind" in values:
            self.kinds[values["kind"]] = self.kinds.get(values["kind"], 0) + 1
        if len(self.rows) >= self.FLUSH:
            self.batches.append(self._batch())
            self.rows = []

    def add_batch(self, batch: pa.RecordBatch) -> None:
        """Rows already in columns (the block reader's stats lines), after the rows added so far."""
        if self.rows:
            self.batches.append(self._batch())
            self.rows = []
        self.batches.append(batch)
        self.n += batch.num_rows

    def _batch(self) -> pa.RecordBatch:
        # the row dicts converted in one pass in Arrow's C++ (a struct array; keys the schema lacks are ignored,
        # missing ones are null): a Python pass per column took 40 % of a long log's parse
        rows = pa.array(self.rows, type=pa.struct(list(self.schema)))
        return pa.RecordBatch.from_struct_array(rows)  # the schema, field for field (no metadata to carry)

    def last(self, name: str) -> Any:
        """The last row's value; None right after every FLUSH-th row, as when each FLUSH rows became a batch."""
        if self.n % self.FLUSH == 0:
            return None
        if self.rows:
            return self.rows[-1].get(name)
        b = self.batches[-1]
        return b.column(name)[b.num_rows - 1].as_py()

    def set_last(self, name: str, value: Any) -> None:
        if self.n % self.FLUSH == 0:
            return
        if self.rows:
            self.rows[-1][name] = value
            return
        b = self.batches[-1]
        i = b.schema.get_field_index(name)
        col = pa.concat_arrays([b.column(i).slice(0, b.num_rows - 1), pa.array([value], b.schema.field(i).type)])
        self.batches[-1] = pa.RecordBatch.from_arrays(
            [col if j == i else b.column(j) for j in range(b.num_columns)], schema=b.schema
        )

    def column(self, name: str) -> list[Any]:
        """All values of a column (small tables: startup facts, events kinds)."""
        return [v for b in self.batches for v in b.column(name).to_pylist()] + [r.get(name) for r in self.rows]

    def unique(self, name: str) -> set[Any]:
        import pyarrow.compute as pc

        out = {r.get(name) for r in self.rows}
        for b in self.batches:
            out |= set(pc.unique(b.column(name)).to_pylist())
        return out

    def table(self) -> pa.Table:
        return pa.Table.from_batches([*self.batches, self._batch()], schema=self.schema)


class LogState:
    """What a log parser accumulates: the four tables, runs, counts of bad and unknown lines."""

    def __init__(self, order: int) -> None:
        self.order = order
        self.stats = Columns(STATS_SCHEMA)
        self.events = Columns(EVENTS_SCHEMA)
        self.startup = Columns(STARTUP_SCHEMA)
        self.spec = Columns(SPEC_SCHEMA)
        self.malformed: list[tuple[int, str]] = []
        self.n_malformed = 0
        self.unknown: list[tuple[int, str]] = []
        self.n_unknown = 0
        self.records = 0
        self.run = 0
        self.run_active = False
        self.run_starts: list[dict[str, Any]] = [{"run": 0, "line": 1, "why": "start of file"}]
        self.max_t: float | None = None
        self.last_t: float | None = None
        self.last_ts_text: str | None = None
        self.pids: dict[str, tuple[int, float | None]] = {}  # process name -> (pid, last time heard)
        self.outer_clock = False  # line times come from wrappers (a file of tracebacks without vLLM records)
        self.seen_facts: set[tuple] = set()
        self.last_engine: dict[Any, int | None] = {}
        self.clock = Clock()
        self.nul_head_bytes = 0  # NUL bytes skipped at the head of the file (log_blocks)
        self.nul_run_bytes = 0  # NUL bytes skipped where other lines start (log_blocks)
        self.lines_cut = 0  # lines longer than the read budget, cut (log_blocks)

    def new_run(self, line: int, why: str) -> None:
        self.run += 1
        self.run_active = False
        self.max_t = None
        if len(self.run_starts) < MAX_RUN_STARTS:  # a log whose clock jumps back every line is a run a line
            self.run_starts.append({"run": self.run, "line": line, "why": why})

    def bad(self, line: int, text: str, why: str) -> None:
        self.n_malformed += 1
        if len(self.malformed) < MAX_EXAMPLES:
            self.malformed.append((line, f"{why}: {text[:120]}"))

    def unknown_line(self, line: int, text: str) -> None:
        self.n_unknown += 1
        if len(self.unknown) < MAX_EXAMPLES:
            self.unknown.append((line, text[:120]))

    def at(self, t_s: float | None, line: int, ts_text: str | None, proc: str | None, pid: int | None) -> dict:
        """The leading columns of a row, after the run checks for this record's time and process."""
        if pid is not None and proc is not None:
            old = self.pids.get(proc)
            if (
                old is not None
                and old[0] != pid
                and self.run_active
                and t_s is not None
                and old[1] is not None
                and t_s - old[1] >= RUN_PID_GAP_S
            ):  # data-parallel API servers share a name and interleave; a restarted one comes back later
                self.new_run(line, f"new pid {pid} of {proc} (was {old[0]})")
            if old is not None or len(self.pids) < MAX_PROCESSES:  # a name a line must not grow it without end
                self.pids[proc] = (pid, t_s if t_s is not None else (old[1] if old else None))
        if t_s is not None:
            if self.max_t is not None and t_s < self.max_t - RUN_BACKWARDS_S and self.run_active:
                self.new_run(line, f"time went back {self.max_t - t_s:.0f} s")
            self.max_t = t_s if self.max_t is None else max(self.max_t, t_s)
            self.last_t, self.last_ts_text = t_s, ts_text
        return {
            "input_id": self.order,
            "run": self.run,
            "line": line,
            "ts_text": ts_text,
            "t_s": t_s,
            "process": proc,
            "pid": pid,
        }

    def event(self, base: dict, kind: str, text: str, **extra: Any) -> None:
        self.events.add({**base, "kind": kind, "text": text[:MAX_TEXT], **extra})

    def fact(self, base: dict, key: str, value: str, num: float | None, unit: str | None, text: str) -> None:
        ident = (self.run, key, value, base["process"])
        if ident in self.seen_facts:
            return
        self.seen_facts.add(ident)
        self.startup.add({**base, "key": key, "value": value, "value_num": num, "unit": unit, "text": text[:MAX_TEXT]})

    def add_stats_rows(self, cols: dict[str, pa.Array], n: int, t: np.ndarray, ts_text: pa.Array) -> float:
        """`n` stats rows found in bulk (log_blocks): `cols` by serving_stats column (the others NULL), at log
        times `t`; the clock and the last time move to the last row. Returns that row's time."""
        schema = self.stats.schema
        arrays = [cols[f.name].cast(f.type) if f.name in cols else pa.nulls(n, f.type) for f in schema]
        self.stats.add_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
        last_t = float(t[-1])
        self.clock._last_s = last_t
        self.max_t = last_t if self.max_t is None else max(self.max_t, float(t.max()))
        self.last_t, self.last_ts_text = last_t, ts_text[n - 1].as_py()
        return last_t

    def meta(self) -> dict[str, Any]:
        facts: dict[str, Any] = {}
        keys, values = self.startup.column("key"), self.startup.column("value")
        for k, v in zip(keys, values):
            facts.setdefault(k, v)
        kinds = dict(self.events.kinds)
        return {
            "records": self.records,
            "stats_lines": self.stats.n,
            "spec_decode_lines": self.spec.n,
            "preemption_warnings": kinds.get("preemption", 0),
            "events": kinds,
            "runs": self.run + 1,
            "run_starts": self.run_starts,
            "startup_facts": facts,
            "malformed_lines": self.n_malformed,
            "malformed_examples": [{"line": n, "text": t} for n, t in self.malformed],
            "unknown_lines": self.n_unknown,
            "unknown_examples": [{"line": n, "text": t} for n, t in self.unknown],
            "engines": sorted(e for e in self.stats.unique("engine") if e is not None)[:64],
        } | {
            k: v
            for k, v in (
                ("nul_head_bytes", self.nul_head_bytes),
                ("nul_run_bytes", self.nul_run_bytes),
                ("lines_cut", self.lines_cut),
            )
            if v
        }

    def tables(self) -> dict[str, pa.Table]:
        return {
            "serving_stats": self.stats.table(),
            "serving_events": self.events.table(),
            "serving_startup": self.startup.table(),
            "spec_decode": self.spec.table(),
        }
