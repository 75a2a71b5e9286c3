"""vLLM engine/server logs: periodic stats lines of every version, preemptions, speculative decoding, startup
facts, server runs, and the messages of hung or dead engines.

Record layouts (vllm/logger.py):
  2023 – v0.7  `LEVEL MM-DD HH:MM:SS file.py:N] message`
  v0.8 – now   `[VLLM_LOGGING_PREFIX](Proc pid=N) LEVEL MM-DD HH:MM:SS [file.py:N] message`; at
               VLLM_LOGGING_LEVEL=DEBUG the file part is a path (`[v1/metrics/loggers.py:111]`);
               process prefixes `(APIServer pid=N)`, `(EngineCore_DP0 pid=N)`, `(VllmWorker rank=0 pid=N)`.
  application  vLLM used through the application's own Python logging (VLLM_CONFIGURE_LOGGING=0):
               `YYYY-MM-DD HH:MM:SS - vllm.engine.metrics - INFO - message`, or Python's default
               `INFO:vllm.engine.metrics:message` (logging.BASIC_FORMAT, no time: rows have no t_s).
Anything before a record on its line is a wrapper and is skipped (docker `--timestamps`, Kubernetes and log
aggregator prefixes, `sglang  | `-style compose prefixes). ANSI colour codes are removed; several records glued
on one line are split; terminal hard-wraps are joined (a line that starts no record continues the previous one
when it starts in lower case or the file wraps at a fixed width); NewLineFormatter's continuation lines carry
their own header and are records.

Stats lines, by generation (read by field name, so fields added later land in extra_json):
  2023 scheduler.py  `Throughput: %.1f tokens/s, Running: %d reqs, Swapped: %d reqs, Pending: %d reqs,
                      GPU KV cache usage: %.1f%, CPU KV cache usage: %.1f%` (prompt + generation together)
  V0 llm_engine.py / metrics.py  `Avg prompt throughput: …, Avg generation throughput: …, Running, Swapped,
                      Pending, GPU KV cache usage, CPU KV cache usage[.]`, then (prefix caching on)
                      `Prefix cache hit rate: GPU: %.2f%%, CPU: %.2f%%` as its own line
  V1 loggers.py      `Engine %03d: Avg prompt throughput: …, Running: %d reqs, Waiting: %d reqs[, Deferred]
                      [, Preemptions], GPU KV cache usage, Prefix cache hit rate[, Corrupted][, External prefix
                      cache hit rate][, MM cache hit rate]` (`N Engines Aggregated:` for data parallel)
  V1 ≥ 0.8.5 demotes a line whose throughputs (this and the last) are all zero to DEBUG: at INFO, silence
  means idle *or* stuck — SCH011 tells them apart from the last line's Running/Waiting and the other lines.
Speculative decoding: V0 `Speculative metrics: Draft acceptance rate: %.3f, System efficiency: %.3f, Number
of speculative tokens: %d, Number of accepted tokens: %d, Number of draft tokens[ tokens]: %d, Number of emitted
tokens[ tokens]: %d.` (totals; the doubled "tokens" of ~v0.4/0.5 included); V1 `SpecDecoding metrics: …
Accepted: %d tokens, Drafted: %d tokens, Per-position acceptance rate: …` (per interval).
Events (serving_events.kind): preemption, shm_broadcast_wait, startup, ready, shutdown, health_check,
request_finished, access (uvicorn access lines: no time of their own, they take the previous record's), and the
failure kinds of tracediag/catalog/engine_failures.json (device errors, fatal signals, engine deaths, collective
timeouts, cascades…) with the pattern's id in `pattern`; a failure line without a record prefix (`Fatal Python
error: Aborted`, a ROCm runtime line) is one too.
Runs: a startup banner after activity, a new pid of a process already seen, or a clock going back more
than 5 minutes starts a new server run; every row carries its run.
A line that cannot be read (a bad number, a truncated record) is counted and shown, never fatal; lines that
are neither records, access lines, continuations nor known messages are counted as unknown.
Checked against every vLLM log in tests/data/external/vllm/.
The file is read in blocks (log_blocks.read_blocks): one RE2 pass over a block finds the V1/V0 stats lines in
vLLM's exact layout (_FAST_BLOCK), which become columns in bulk while the clock stays on one day and no run
starts; every other line goes through the line-by-line path (_logical_line), in file order, to the same tables.

The package, by concern:
  patterns.py  the lines' patterns: record prefixes, stats fields, event/spec/startup messages, the fast stats line
  decode.py    a message's values (stats fields, spec counts, startup facts) and record times (Clock)
  tables.py    the tables' schemas, their rows in Arrow batches (Columns), the parser's state and runs (LogState)
  lines.py     physical lines joined into logical ones (Joiner), and each logical line into the tables
  here         `parse_vllm_log`: the file's blocks, their fast stats lines in bulk, the rest line by line
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracediag.catalog import failures
from tracediag.errors import InputError
from tracediag.ingest.base import IngestOptions, Parsed
from tracediag.ingest.log_blocks import clocked_segments, read_blocks
from tracediag.ingest.vllm_log.decode import (
    INT32_MAX,
    BadValue,
    Clock,
    checked_float,
    checked_int,
    parse_spec,
    parse_stats,
    startup_facts,
)
from tracediag.ingest.vllm_log.lines import Joiner, _logical_line, open_log
from tracediag.ingest.vllm_log.patterns import _FAST_BLOCK, EVENT_PATTERNS, INT_FIELDS, RECORD, STATS_FIELDS
from tracediag.ingest.vllm_log.tables import (
    EVENTS_SCHEMA,
    MAX_EXAMPLES,
    MAX_PROCESSES,
    MAX_RUN_STARTS,
    MAX_TEXT,
    RUN_PID_GAP_S,
    SPEC_SCHEMA,
    STARTUP_SCHEMA,
    STATS_SCHEMA,
    Columns,
    LogState,
)
from tracediag.memory import read_bytes_budget

# the names this package had as one module (sglang_log, the tests and benchmarks read them from here)
__all__ = [
    "EVENTS_SCHEMA",
    "EVENT_PATTERNS",
    "INT32_MAX",
    "INT_FIELDS",
    "MAX_EXAMPLES",
    "MAX_PROCESSES",
    "MAX_RUN_STARTS",
    "MAX_TEXT",
    "RECORD",
    "RUN_PID_GAP_S",
    "SPEC_SCHEMA",
    "STARTUP_SCHEMA",
    "STATS_FIELDS",
    "STATS_SCHEMA",
    "BadValue",
    "Clock",
    "Columns",
    "Joiner",
    "LogState",
    "checked_float",
    "checked_int",
    "open_log",
    "parse_spec",
    "parse_stats",
    "parse_vllm_log",
    "startup_facts",
]


def _opt(arr: pa.Array, type_: pa.DataType) -> pa.Array:
    """A group of the block pattern as a column: '' (the group took no part) is NULL."""
    text = arr.cast(pa.large_string())
    return pc.if_else(pc.equal(pc.binary_length(arr), 0), pa.scalar(None, pa.large_string()), text).cast(type_)


def _fast_rows(st: LogState, joiner: Joiner, matches: pa.StructArray, a: int, c: int, first_line: int, general) -> None:
    """Stats lines a..c-1 of a block (all _FAST lines) into the tables: in columns where the clock is on the day
    of the last record, the process and pid stay those already seen and the time does not go back a run's worth;
    any other line (a new day, a new pid, a new run) through the line-by-line path, which decides it."""
    rows = matches.slice(a, c - a)
    proc, pid = rows.field("proc"), rows.field("pid")
    changes = None
    if len(pc.unique(proc)) > 1 or len(pc.unique(pid)) > 1:
        changes = pc.not_equal(proc.slice(1), proc.slice(0, len(proc) - 1)).to_numpy(zero_copy_only=False)
        changes |= pc.not_equal(pid.slice(1), pid.slice(0, len(pid) - 1)).to_numpy(zero_copy_only=False)

    def same_pid(s: int) -> bool:  # a process seen before with another pid may start a run: line by line
        name = proc[s].as_py().decode()
        old = st.pids.get(name) if name else None
        return old is None or old[0] == int(pid[s].as_py())

    for s, v, t in clocked_segments(st, joiner, rows, lambda k: general(a + k), 5, changes, same_pid):
        _bulk_stats(st, rows.slice(s, v), t, first_line + a + s + 1, proc[s].as_py().decode() or None)


def _bulk_stats(st: LogState, rows: pa.StructArray, t: np.ndarray, line: int, proc: str | None) -> None:
    n = len(rows)
    date, time_ = rows.field("date"), rows.field("time")
    ts_text = pc.binary_join_element_wise(date, time_, pa.scalar(b" ", date.type)).cast(pa.string())
    pid = _opt(rows.field("pid"), pa.int32())
    engine = _opt(rows.field("engine"), pa.int32())
    v1 = pc.greater(pc.binary_length(rows.field("w")), 0)
    cols = {
        "input_id": pa.array(np.full(n, st.order, dtype=np.int32)),
        "run": pa.array(np.full(n, st.run, dtype=np.int32)),
        "line": pa.array(np.arange(line, line + n, dtype=np.int32)),
        "ts_text": ts_text,
        "t_s": pa.array(t, pa.float64()),
        "process": _opt(rows.field("proc"), pa.string()),
        "pid": pid,
        "engine": engine,
        "log_format": pc.if_else(v1, "v1", "v0"),
        "prompt_tput_tok_s": _opt(rows.field("p"), pa.float64()),
        "gen_tput_tok_s": _opt(rows.field("g"), pa.float64()),
        "running": _opt(rows.field("r"), pa.int32()),
        "waiting": pc.if_else(v1, _opt(rows.field("w"), pa.int32()), _opt(rows.field("pe"), pa.int32())),
        "swapped": _opt(rows.field("sw"), pa.int32()),
        "kv_usage_pct": _opt(rows.field("kv"), pa.float64()),
        "cpu_kv_usage_pct": _opt(rows.field("cpu"), pa.float64()),
        "prefix_hit_pct": _opt(rows.field("ph"), pa.float64()),
    }
    last_t = st.add_stats_rows(cols, n, t, ts_text)
    pid_last = pid[n - 1].as_py()
    if proc is not None:
        st.pids[proc] = (pid_last, last_t)
    st.records += n
    st.last_engine[pid_last] = engine[n - 1].as_py()
    st.run_active = True


def parse_vllm_log(path: Path, order: int, options: IngestOptions) -> Parsed:
    st = LogState(order)
    longest = read_bytes_budget(options.memory_limit)
    joiner = Joiner(lambda n, line: _logical_line(st, n, line), longest=longest)
    read_blocks(path, st, joiner, _FAST_BLOCK, _fast_rows, longest)
    joiner.flush()
    tp_ranks = {int(m[1]) for name in st.pids if (m := re.match(r"Worker_TP(\d{1,4})$", name or ""))}
    if tp_ranks and "tensor_parallel_size" not in st.startup.column("key"):  # `(Worker_TP1 pid=N)` prefixes
        st.fact(
            {"input_id": order, "run": 0, "line": None, "process": None, "pid": None},
            "tensor_parallel_size",
            str(max(tp_ranks) + 1),
            float(max(tp_ranks) + 1),
            None,
            f"from the Worker_TP0..TP{max(tp_ranks)} process prefixes (no config line)",
        )
    served = sum(st.events.kinds.get(k, 0) for k in (*failures.KINDS, "access"))
    if st.records == 0 and not served:  # a server log of uvicorn lines and tracebacks only is still read
        from tracediag.ingest.unrecognised import file_text, not_a_record  # content-free: no byte of the file

        raise InputError(
            path,
            "not a vLLM log: no 'LEVEL MM-DD HH:MM:SS [file.py:N]' or 'YYYY-MM-DD HH:MM:SS - vllm.x - LEVEL -' "
            f"records ({file_text(path)}; {st.n_unknown} other lines"
            + (f"; {not_a_record('a vLLM record', *st.unknown[0], cap=120)})" if st.unknown else ")"),
        )
    meta = st.meta()
    version = meta["startup_facts"].get("vllm_version")
    row = {
        "rank": None,
        "profiler": f"vLLM {version} log" if version else "vLLM log",
        "file_bytes": path.stat().st_size,
        "events_total": st.records,
        "meta_json": json.dumps(meta),
    }
    return Parsed(path=str(path), format="vllm-log", inputs_rows=[row], tables=st.tables())
