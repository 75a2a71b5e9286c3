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
"""

from __future__ import annotations

import ast
import json
import math
import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracediag.catalog import failures
from tracediag.errors import InputError
from tracediag.ingest.base import IngestOptions, Parsed
from tracediag.ingest.log_blocks import RUN_BACKWARDS_S, clocked_segments, read_blocks
from tracediag.inputfile import open_stream
from tracediag.memory import read_bytes_budget

RECORD = re.compile(
    r"(?:\((?P<proc>[A-Za-z_][\w.\-]*(?: [A-Za-z_][\w.\-]*)*?)(?:\s+rank=\d+)?\s+pid=(?P<pid>\d+)\)\s*)?"
    r"(?:(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+)?(?P<date>\d{2}-\d{2})\s+(?P<time>\d{2}:\d{2}:\d{2})(?:[.,]\d+)?\s+"
    r"\[?(?P<file>[\w.\-/]+\.py):(?P<lineno>\d+)\]\s?"
    r"|(?P<ydate>\d{4}-\d{2}-\d{2})[ T](?P<ytime>\d{2}:\d{2}:\d{2})(?:[.,]\d+)?\s+-\s+(?P<logger>vllm(?:\.\w+)*)\s+-\s+"
    r"(?P<ylevel>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+-\s+"
    r"|(?<![\w:])(?P<dlevel>DEBUG|INFO|WARNING|ERROR|CRITICAL):(?P<dlogger>vllm(?:\.\w+)+):"  # logging.BASIC_FORMAT
)
_STARTS_RECORD = re.compile(
    r"^\s*(?:\(|\[|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b|/|\w+Error\b|Traceback|\d{4}-\d{2}-\d{2})"
)
_CONTINUES = re.compile(r"^[a-z0-9%]")
_ACCESS = re.compile(r'INFO:\s+(?P<addr>\S+)\s+-\s+"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})')
_UVICORN = re.compile(
    r"INFO:\s+(?P<msg>(?:Started server process|Waiting for application|Application startup complete|"
    r"Shutting down|Waiting for connections|Application shutdown|Finished server process|"
    r"Uvicorn running).*)"
)

_ENGINE = re.compile(r"^(?:Engine (?P<engine>\d+)|(?P<agg>\d+) Engines Aggregated):\s*(?P<body>.*)$", re.S)
_FIELD = re.compile(
    r"^(?P<key>[A-Za-z][A-Za-z /()_-]*?):\s*(?:active\s+)?(?P<val>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|nan|inf)\s*"
    r"(?P<unit>%|tokens/s|reqs|ms)?"
)
STATS_FIELDS = {
    "throughput": "tput_tok_s",
    "avg prompt throughput": "prompt_tput_tok_s",
    "avg generation throughput": "gen_tput_tok_s",
    "running": "running",
    "waiting": "waiting",
    "pending": "waiting",
    "swapped": "swapped",
    "deferred": "deferred",
    "preemptions": "preemptions",
    "gpu kv cache usage": "kv_usage_pct",
    "kv cache usage": "kv_usage_pct",
    "cpu kv cache usage": "cpu_kv_usage_pct",
    "prefix cache hit rate": "prefix_hit_pct",
    "gpu prefix cache hit rate": "prefix_hit_pct",
    "external prefix cache hit rate": "external_prefix_hit_pct",
    "mm cache hit rate": "mm_hit_pct",
}
INT_FIELDS = {"running", "waiting", "swapped", "deferred", "preemptions"}
INT32_MAX = 2**31 - 1
_V0_PREFIX_HIT = re.compile(r"^Prefix cache hit rate: GPU: (?P<gpu>\d+(?:\.\d+)?)%, CPU: (?P<cpu>\d+(?:\.\d+)?)%")

_PREEMPT = re.compile(
    r"Sequence group (?P<seq>\S+) is preempted by PreemptionMode\.(?P<mode>\w+) mode because there is not enough "
    r"KV cache space(?:.*?total_num_cumulative_preemption=(?P<cum>\d+))?",
    re.S,
)
# (kind, pattern): lifecycle and wait messages (FORMATS.md c1-c5). Death, hang and cascade messages are data, in
# tracediag/catalog/engine_failures.json (failures.match), each with the file that prints it.
EVENT_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("shm_broadcast_wait", re.compile(r"No available shared memory broadcast block found in \d+ seconds")),
    ("request_finished", re.compile(r"Finished request \S+")),
    ("health_check", re.compile(r"Called check_health")),
    (
        "shutdown",
        re.compile(r"Shutting down FastAPI HTTP server|Application shutdown complete|Finished server process"),
    ),
    ("ready", re.compile(r"Application startup complete|Starting vLLM (?:API )?server on|Available routes are")),
]
_BANNER = re.compile(
    r"vLLM API server version|Initializing an? (?:V[01] )?LLM engine \(v|Starting vLLM (?:API )?server on"
)
_NUM = r"(-?\d+(?:\.\d+)?|nan)"
_SPEC_FIELDS = {
    "acceptance_pct": re.compile(r"(?<!Avg )Draft acceptance rate:\s*" + _NUM + r"\s*%"),
    "avg_acceptance_pct": re.compile(r"Avg Draft acceptance rate:\s*" + _NUM + r"\s*%"),
    "acceptance_frac": re.compile(r"Draft acceptance rate:\s*" + _NUM + r"\s*(?:,|\.?\s*$)"),
    "system_efficiency": re.compile(r"System efficiency:\s*" + _NUM),
    "num_spec_tokens": re.compile(r"Number of speculative tokens:\s*(\d+)"),
    "accepted_v0": re.compile(r"Number of accepted tokens:\s*(\d+)"),
    "draft_v0": re.compile(r"Number of draft tokens(?: tokens)?:\s*(\d+)"),
    "emitted_v0": re.compile(r"Number of emitted tokens(?: tokens)?:\s*(\d+)"),
    "mean_acceptance_length": re.compile(r"Mean acceptance length:\s*" + _NUM),
    "accepted_tput": re.compile(r"Accepted throughput:\s*" + _NUM),
    "drafted_tput": re.compile(r"Drafted throughput:\s*" + _NUM),
    "accepted": re.compile(r"Accepted:\s*(\d+)\s*tokens"),
    "drafted": re.compile(r"Drafted:\s*(\d+)\s*tokens"),
    "per_position": re.compile(
        r"Per-position acceptance rate:\s*((?:-?\d+(?:\.\d+)?|nan)(?:\s*,\s*(?:-?\d+(?:\.\d+)?|nan))*)"
    ),
}

# Startup facts: (key, regex, group, unit). vLLM source wording, checked on the real logs.
_STARTUP: list[tuple[str, re.Pattern[str], int, str | None]] = [
    ("vllm_version", re.compile(r"vLLM API server version (\S+)"), 1, None),
    ("vllm_version", re.compile(r"Initializing an? (?:V[01] )?LLM engine \(v([^)]+)\)"), 1, None),
    ("vllm_version", re.compile(r"[█▄▀]\s+version (\d+\.\d+[\w.+-]*)\s*$"), 1, None),
    ("architecture", re.compile(r"Resolved architecture: (\w+)"), 1, None),
    ("max_model_len", re.compile(r"Using max model len (\d+)"), 1, "tokens"),
    (
        "max_num_batched_tokens",
        re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(\d+)"),
        1,
        "tokens",
    ),
    ("kv_cache_tokens", re.compile(r"GPU KV cache size: ([\d,]+) tokens"), 1, "tokens"),
    ("max_concurrency_x", re.compile(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"), 1, "x"),
    ("max_concurrency_request_tokens", re.compile(r"Maximum concurrency for ([\d,]+) tokens per request"), 1, "tokens"),
    ("num_gpu_blocks", re.compile(r"num_gpu_blocks is: (\d+)"), 1, "blocks"),
    ("num_gpu_blocks", re.compile(r"# (?:GPU|cuda|npu|xpu) blocks: (\d+)"), 1, "blocks"),
    ("num_cpu_blocks", re.compile(r"# CPU blocks: (\d+)"), 1, "blocks"),
    ("kv_cache_memory_gib", re.compile(r"Available KV cache memory: ([\d.]+) GiB"), 1, "GiB"),
    ("model_weights_gib", re.compile(r"Model loading took ([\d.]+) ?GiB"), 1, "GiB"),
    ("world_size", re.compile(r"rank \d+ in world size (\d+) is assigned as"), 1, None),
    ("attention_backend", re.compile(r"Using (\w+) attention backend"), 1, None),
    ("attention_backend", re.compile(r"Using (.+?) backend on V1 engine"), 1, None),
    ("attention_backend", re.compile(r"^Using (\w+(?:-\d)?) backend\.?$"), 1, None),
    ("flash_attention_version", re.compile(r"Using FlashAttention version (\d+)"), 1, None),
    ("quant_kernel", re.compile(r"(?:Using|Selected) (\w+Kernel) for (\w+)"), 0, None),
    ("platform", re.compile(r"Automatically detected platform (\w+)"), 1, None),
    ("nccl_version", re.compile(r"vLLM is using nccl==([\d.]+)"), 1, None),
    ("custom_all_reduce", re.compile(r"Custom allreduce is (disabled)"), 1, None),
    ("async_scheduling", re.compile(r"Asynchronous scheduling is (enabled|disabled)"), 1, None),
    ("profiler_dir", re.compile(r"Torch profiling enabled\. Traces will be saved to: (\S+)"), 1, None),
]
# key=value pairs of the engine config line worth keeping (vllm/v1/engine/core.py, vllm/engine/llm_engine.py)
_CONFIG_KEYS = (
    "model",
    "dtype",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "quantization",
    "kv_cache_dtype",
    "max_seq_len",
    "enable_prefix_caching",
    "enable_chunked_prefill",
    "chunked_prefill_enabled",
    "speculative_config",
    "enforce_eager",
    "block_size",
    "served_model_name",
)
_CONFIG_PAIR = re.compile(r"(?:^|[,(:]\s*)(" + "|".join(_CONFIG_KEYS) + r")=('[^']*'|[^,\s)]+)")
_ARGS_KEYS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "gpu_memory_utilization",
    "max_model_len",
    "tensor_parallel_size",
    "pipeline_parallel_size",
    "data_parallel_size",
    "enable_chunked_prefill",
    "enable_prefix_caching",
    "kv_cache_dtype",
    "quantization",
    "block_size",
    "speculative_config",
    "num_speculative_tokens",
)
_UNITS = {
    "max_num_seqs": "requests",
    "max_num_batched_tokens": "tokens",
    "max_model_len": "tokens",
    "max_seq_len": "tokens",
}

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
_OUTER_TIME = re.compile(r"^[-\s\[]*(?P<date>\d{4}-\d{2}-\d{2})[T ](?P<time>\d{2}:\d{2}:\d{2})")


# The V1 and V0 stats lines exactly as vLLM writes them, whole line, one record: most lines of a long log. Anything
# else (other fields, glued records, wrappers, wraps) takes the general path.
_FAST = re.compile(
    r"(?:\((?P<proc>[A-Za-z_][\w.\-]*) pid=(?P<pid>\d{1,9})\) )?(?:INFO|DEBUG) (?P<date>\d\d-\d\d) "
    r"(?P<time>\d\d:\d\d:\d\d) \[?[\w.]+\.py:\d+\] (?:Engine (?P<engine>\d{3}): )?"
    r"Avg prompt throughput: (?P<p>\d{1,12}\.\d) tokens/s, Avg generation throughput: (?P<g>\d{1,12}\.\d) tokens/s, "
    r"Running: (?P<r>\d{1,9}) reqs, "
    r"(?:Waiting: (?P<w>\d{1,9})|Swapped: (?P<sw>\d{1,9}) reqs, Pending: (?P<pe>\d{1,9})) reqs, "
    r"GPU KV cache usage: (?P<kv>\d{1,3}\.\d)%, (?:Prefix cache hit rate: (?P<ph>\d{1,3}\.\d)%|"
    r"CPU KV cache usage: (?P<cpu>\d{1,3}\.\d)%\.?)$"
)

# _FAST for the block reader (pyarrow's RE2 over a raw line with its newline): the same groups, ASCII classes
_FAST_BLOCK = (
    r"^(?:\((?P<proc>[A-Za-z_][A-Za-z0-9_.\-]*) pid=(?P<pid>[0-9]{1,9})\) )?(?:INFO|DEBUG) "
    r"(?P<date>[0-9][0-9]-[0-9][0-9]) (?P<time>[0-9][0-9]:[0-9][0-9]:[0-9][0-9]) \[?[A-Za-z0-9_.]+\.py:[0-9]+\] "
    r"(?:Engine (?P<engine>[0-9]{3}): )?Avg prompt throughput: (?P<p>[0-9]{1,12}\.[0-9]) tokens/s, "
    r"Avg generation throughput: (?P<g>[0-9]{1,12}\.[0-9]) tokens/s, Running: (?P<r>[0-9]{1,9}) reqs, "
    r"(?:Waiting: (?P<w>[0-9]{1,9})|Swapped: (?P<sw>[0-9]{1,9}) reqs, Pending: (?P<pe>[0-9]{1,9})) reqs, "
    r"GPU KV cache usage: (?P<kv>[0-9]{1,3}\.[0-9])%, (?:Prefix cache hit rate: (?P<ph>[0-9]{1,3}\.[0-9])%|"
    r"CPU KV cache usage: (?P<cpu>[0-9]{1,3}\.[0-9])%\.?)\r?\n?$"
)


class BadValue(ValueError):
    """A number in a line that no engine writes (out of range, not finite): the line is counted as bad."""


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


def open_log(path: Path) -> BinaryIO:
    """The log as a buffered binary stream, gunzipped when it starts with the gzip magic (a regular file only, and
    a gzip stream bounded: inputfile.open_stream)."""
    return open_stream(path, "log")[0]


class Joiner:
    """Physical lines in, logical lines out (to `emit(first physical line number, text)`), hard-wraps joined.

    A line that starts no record continues the previous one when it starts in lower case or with a digit or
    '%' (a wrap mid-word or mid-number), or when the previous line ended at a width the file already wrapped at.
    The pieces are joined once, at the end (joining as they come copied the whole so far for each: 200,000 wrapped
    lines ran for hours), and a joined line ends at the read budget (memory.read_bytes_budget) like a physical one.
    """

    def __init__(self, emit: Any, starts_record: re.Pattern[str] = _STARTS_RECORD, longest: int | None = None) -> None:
        self.emit = emit
        self.starts_record = starts_record
        self.widths: set[int] = set()
        self.start = 0  # physical line number of the pending logical line (0: none)
        self.parts: list[str] = []
        self.size = 0
        self.longest = longest if longest is not None else read_bytes_budget()
        self.last_len = 0

    def feed(self, i: int, line: str) -> None:
        if (
            self.start
            and line
            and self.last_len >= 60
            and self.size + len(line) <= self.longest
            and not self.starts_record.match(line)
            and (_CONTINUES.match(line) or self.last_len in self.widths)
        ):
            self.widths.add(self.last_len)
            self.parts.append(line)
            self.size += len(line)
        else:
            if self.start:
                self.emit(self.start, self.parts[0] if len(self.parts) == 1 else "".join(self.parts))
            self.start, self.parts, self.size = i, [line], len(line)
        self.last_len = len(line)

    def flush(self) -> None:
        """Emit the pending line: the next line starts a record."""
        if self.start:
            self.emit(self.start, self.parts[0] if len(self.parts) == 1 else "".join(self.parts))
        self.start, self.parts, self.size = 0, [], 0


class Clock:
    """Record times -> seconds since the file's first record. 'MM-DD' dates carry no year (year rollover
    handled); 'YYYY-MM-DD' dates do."""

    BACKWARDS_S = 180 * 86400  # a time this far before the latest is the next year's (MM-DD dates)

    def __init__(self) -> None:
        self.t0: datetime | None = None
        self.year = 2000  # a leap year, so 02-29 parses
        self._day_key: str | None = None
        # whole seconds since t0 (exact in a float): the latest record, and midnight of the day of _day_key
        self._last_s: float | None = None
        self._day_s = 0.0

    @property
    def last(self) -> datetime | None:
        """The latest record's time."""
        return None if self._last_s is None else self.t0 + timedelta(seconds=self._last_s)

    def __call__(self, date: str, time: str) -> float | None:
        # fast path: the same day as the previous record (most lines of a long log), in seconds since t0 without
        # datetime arithmetic (a third of a long log's parse otherwise)
        if date == self._day_key and len(time) == 8 and time[2] == ":" and time[5] == ":":
            try:
                sec = int(time[:2]) * 3600 + int(time[3:5]) * 60 + int(time[6:8])
            except ValueError:
                sec = -1
            if 0 <= sec < 86400:
                t = self._day_s + sec
                if t >= self._last_s - self.BACKWARDS_S:
                    self._last_s = t
                    return t
        try:
            if len(date) == 10:
                dt = datetime.strptime(f"{date} {time}", "%Y-%m-%d %H:%M:%S")
            else:
                dt = datetime.strptime(f"{self.year}-{date} {time}", "%Y-%m-%d %H:%M:%S")
                last = self.last
                if last is not None and dt < last - timedelta(seconds=self.BACKWARDS_S):
                    self.year += 1
                    dt = dt.replace(year=self.year)
        except ValueError:
            return None
        if self.t0 is None:
            self.t0 = dt
        self._last_s = (dt - self.t0).total_seconds()
        self._day_key, self._day_s = date, (datetime(dt.year, dt.month, dt.day) - self.t0).total_seconds()
        return self._last_s


def checked_int(v: float, limit: int = INT32_MAX) -> int:
    if not math.isfinite(v) or abs(v) > limit:
        raise BadValue(f"{v:g} is out of range")
    return int(v)


def checked_float(v: float) -> float:
    if math.isinf(v) or abs(v) > 1e300:
        raise BadValue(f"{v:g} is not a finite number")
    return v


def parse_stats(msg: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """({column: value}, {other field: value}) of a stats message, None when it is not one.

    Raises BadValue for a number no engine writes (a counter beyond 32 bits, an infinite throughput)."""
    m = _ENGINE.match(msg)
    engine = None
    body = msg
    if m:
        body = m["body"]
        engine = int(m["engine"]) if m["engine"] is not None and len(m["engine"]) < 9 else -1
    if not (body.startswith(("Avg prompt throughput:", "Throughput:")) or re.match(r"Running: \d+ reqs", body)):
        return None
    cols: dict[str, Any] = {"engine": engine, "log_format": "v1" if m or "Waiting:" in body else "v0"}
    if body.startswith("Throughput:"):
        cols["log_format"] = "v0-2023"
    extra: dict[str, Any] = {}
    for part in re.split(r",\s*", body.strip().rstrip(".").strip()):
        f = _FIELD.match(part.strip())
        if not f:
            continue
        key = f["key"].strip().lower()
        val = float(f["val"])
        col = STATS_FIELDS.get(key)
        if col:
            cols[col] = checked_int(val) if col in INT_FIELDS else checked_float(val)
        elif math.isfinite(val):
            extra[f["key"].strip()] = val
    if "Pending" in body and cols["log_format"] == "v1":
        cols["log_format"] = "v0"
    return cols, extra


def parse_spec(msg: str) -> dict[str, Any] | None:
    if not (msg.startswith("SpecDecoding metrics:") or msg.startswith("Speculative metrics:")):
        return None
    g: dict[str, Any] = {}
    for key, rx in _SPEC_FIELDS.items():
        m = rx.search(msg)
        if m:
            g[key] = m.group(1)

    def count(key: str) -> int | None:
        return checked_int(float(g[key]), 2**62) if key in g else None

    if msg.startswith("Speculative metrics:"):  # V0 (and V1 before PR #15902), totals since start
        k = count("num_spec_tokens")
        drafted = count("draft_v0")
        return {
            "log_format": "v0",
            "cumulative": True,
            "num_spec_tokens": checked_int(k) if k is not None else None,
            "draft_tokens": drafted,
            "accepted_tokens": count("accepted_v0"),
            "emitted_tokens": count("emitted_v0"),
            "num_drafts": drafted / k if drafted is not None and k else None,
            "acceptance_rate": _num(g.get("acceptance_frac")),
            "system_efficiency": _num(g.get("system_efficiency")),
        }
    per_pos = [float(x) for x in re.split(r"\s*,\s*", g["per_position"])] if "per_position" in g else None
    k = len(per_pos) if per_pos else None
    drafted = count("drafted")
    accepted = count("accepted")
    pct = _num(g.get("avg_acceptance_pct") or g.get("acceptance_pct"))
    return {
        "log_format": "v1",
        "cumulative": False,
        "num_spec_tokens": k,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "num_drafts": drafted / k if drafted is not None and k else None,
        "acceptance_rate": pct / 100
        if pct is not None
        else (accepted / drafted if drafted and accepted is not None else None),
        "mean_acceptance_length": _num(g.get("mean_acceptance_length")),
        "accepted_tput_tok_s": _num(g.get("accepted_tput")),
        "drafted_tput_tok_s": _num(g.get("drafted_tput")),
        "per_position": per_pos,
    }


def _num(s: str | None) -> float | None:
    if s is None:
        return None
    try:
        v = float(s.replace(",", ""))
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _literal_dict(text: str) -> dict[str, Any]:
    start = text.find("{")
    if start < 0:
        return {}
    try:
        d = ast.literal_eval(text[start : start + 20000])
        return d if isinstance(d, dict) else {}
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        found = {}
        for key in _ARGS_KEYS:
            m = re.search(rf"'{key}':\s*('[^']*'|[^,}}]+)", text)
            if m:
                found[key] = m.group(1).strip().strip("'")
        return found


def startup_facts(msg: str) -> list[tuple[str, str, float | None, str | None]]:
    facts: list[tuple[str, str, float | None, str | None]] = []
    for key, rx, group, unit in _STARTUP:
        m = rx.search(msg)
        if m:
            value = m.group(group)
            num = _num(value) if unit or key == "world_size" else None
            facts.append((key, value, num, unit))
    if "with config:" in msg and "LLM engine" in msg:
        for key, value in _CONFIG_PAIR.findall(msg):
            value = value.strip("'")
            if key == "chunked_prefill_enabled":
                key = "enable_chunked_prefill"
            facts.append(
                (key, value, _num(value) if key.endswith("_size") or key == "max_seq_len" else None, _UNITS.get(key))
            )
    if "non-default args:" in msg:
        for key, value in _literal_dict(msg).items():
            if key in _ARGS_KEYS:
                num = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
                facts.append(
                    (f"arg_{key}", str(value)[:200], _num(str(num)) if num is not None else None, _UNITS.get(key))
                )
    return facts


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


def _message(st: LogState, n: int, msg: str, base: dict) -> None:
    """One vLLM record's message into the tables."""
    try:
        parsed = parse_stats(msg)
    except BadValue as exc:
        st.bad(n, msg, str(exc))
        return
    if parsed is not None:
        cols, extra = parsed
        if "running" not in cols or ("waiting" not in cols and "swapped" not in cols):
            st.bad(n, msg, "stats line without Running and Waiting/Pending (truncated?)")
            return
        st.stats.add({**base, **cols, "extra_json": json.dumps(extra) if extra else None})
        st.last_engine[base["pid"]] = cols.get("engine")
        st.run_active = True
        return
    m = _V0_PREFIX_HIT.match(msg)
    if m:  # V0's own line right after the stats line of the same interval
        if st.stats.n and st.stats.last("pid") == base["pid"] and st.stats.last("prefix_hit_pct") is None:
            st.stats.set_last("prefix_hit_pct", float(m["gpu"]))
        return
    try:
        sp = parse_spec(msg)
    except BadValue as exc:
        st.bad(n, msg, str(exc))
        return
    if sp is not None:
        if sp.get("draft_tokens") is None:
            st.bad(n, msg, "speculative-decoding line without a drafted-token count")
            return
        st.spec.add({**base, **sp, "engine": st.last_engine.get(base["pid"]), "text": msg[:MAX_TEXT]})
        st.run_active = True
        return
    pm = _PREEMPT.search(msg)
    if pm:
        cum = int(pm["cum"]) if pm["cum"] and len(pm["cum"]) < 18 else None
        st.event(
            base, "preemption", msg, seq_group=pm["seq"][:100], mode=pm["mode"][:20], cumulative=cum, own_time=True
        )
        st.run_active = True
        return
    if _BANNER.search(msg) and st.run_active:
        st.new_run(n, "startup banner")
        base = {**base, "run": st.run}
    if _event(st, base, msg, own_time=True):
        return
    for key, value, num, unit in startup_facts(msg):
        st.fact(base, key, value, num, unit, msg)


def _event(st: LogState, base: dict, text: str, own_time: bool, engine: str = "vllm") -> bool:
    fail = failures.match(text, engine)
    if fail is not None:
        st.event(base, fail.kind, text, own_time=own_time, pattern=fail.id)
        st.run_active = True
        return True
    for kind, rx in EVENT_PATTERNS:
        if rx.search(text):
            st.event(base, kind, text, own_time=own_time)
            if kind in ("shm_broadcast_wait", "request_finished", "shutdown"):
                st.run_active = True
            return True
    if _BANNER.search(text):
        st.event(base, "startup", text, own_time=own_time)
        return False  # the banner also carries the version fact
    return False


def _other_line(st: LogState, n: int, line: str) -> None:
    """A line that holds no vLLM record: an access line, a uvicorn line, a PyTorch/NCCL message, or unknown."""
    stripped = line.strip()
    if not stripped:
        return
    base = st.at(None, n, st.last_ts_text, None, None) | {"t_s": st.last_t}
    a = _ACCESS.search(line)
    own = False
    o = _OUTER_TIME.match(line)
    if o and (st.outer_clock or st.records == 0):  # only when no vLLM record gives the file its clock
        st.outer_clock = True
        t = st.clock(o["date"], o["time"])
        base = st.at(t, n, f"{o['date']} {o['time']}", None, None)
        own = t is not None
    if a:
        st.event(base, "access", f"{a['method']} {a['path']} {a['status']}", http_status=int(a["status"]), own_time=own)
        st.run_active = True
        return
    u = _UVICORN.search(line)
    if u:
        msg = u["msg"]
        kind = "shutdown" if msg.startswith(("Shutting down", "Application shutdown", "Finished server")) else "ready"
        if msg.startswith(("Started server process", "Waiting for application", "Uvicorn running")):
            kind = "startup"
        st.event(base, kind, msg, own_time=own)
        if kind == "shutdown":
            st.run_active = True  # whatever starts next is a new run
        return
    if _event(st, base, line, own_time=own):
        return
    st.unknown_line(n, stripped)


def _logical_line(st: LogState, n: int, line: str) -> None:
    """One logical line of a vLLM log into the tables."""
    f = _FAST.match(line)
    if f:
        g = f.groupdict()  # one call for every group (a subscript each costs as much as the match)
        st.records += 1
        pid = int(g["pid"]) if g["pid"] else None
        engine = int(g["engine"]) if g["engine"] else None
        v1 = g["w"] is not None
        row = st.at(st.clock(g["date"], g["time"]), n, f"{g['date']} {g['time']}", g["proc"], pid)  # a new dict
        row["engine"] = engine
        row["log_format"] = "v1" if v1 else "v0"
        row["prompt_tput_tok_s"] = float(g["p"])
        row["gen_tput_tok_s"] = float(g["g"])
        row["running"] = int(g["r"])
        row["waiting"] = int(g["w"] if v1 else g["pe"])
        row["swapped"] = None if v1 else int(g["sw"])
        row["kv_usage_pct"] = float(g["kv"])
        row["prefix_hit_pct"] = float(g["ph"]) if g["ph"] else None
        row["cpu_kv_usage_pct"] = float(g["cpu"]) if g["cpu"] else None
        st.stats.add(row)
        st.last_engine[pid] = engine
        st.run_active = True
        return
    matches = list(RECORD.finditer(line)) if (".py:" in line or " - vllm" in line or ":vllm." in line) else []
    if not matches:
        _other_line(st, n, line)
        return
    if matches[0].start() > 0:
        head = line[: matches[0].start()]
        if _ACCESS.search(head) or failures.match(head, "vllm") or any(rx.search(head) for _, rx in EVENT_PATTERNS):
            _other_line(st, n, head)
    for j, m in enumerate(matches):
        st.records += 1
        end = matches[j + 1].start() if j + 1 < len(matches) else len(line)
        msg = line[m.end() : end].strip()
        if m["ydate"]:
            date, time_, proc, pid_s = m["ydate"], m["ytime"], None, None
        elif m["dlevel"]:  # Python's default layout carries no time
            date, time_, proc, pid_s = None, None, None, None
        else:
            date, time_, proc, pid_s = m["date"], m["time"], m["proc"], m["pid"]
        pid = int(pid_s) if pid_s and len(pid_s) < 10 else None
        if st.outer_clock:  # a record after wrapper-timed lines: its own clock wins from here on
            st.outer_clock, st.clock = False, Clock()
        t_s = st.clock(date, time_) if date else None
        base = st.at(t_s, n, f"{date} {time_}" if date else None, proc, pid)
        _message(st, n, msg, base)


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
