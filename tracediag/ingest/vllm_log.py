"""vLLM engine/server logs: periodic stats lines, preemption warnings, speculative-decoding lines, startup facts.

Record format (vllm/logger.py): `LEVEL MM-DD HH:MM:SS [file.py:line] message`, no year; the 2023 format
wrote `file.py:line]` without the bracket; multi-process servers prefix `(APIServer pid=N) `,
`(EngineCore_0 pid=N) `, `(VllmWorker TP1 pid=N) `. Handled here: ANSI colour codes, records glued onto one
line (a missing newline, or a tqdm bar before the record), and logs hard-wrapped by a terminal (a line
that does not start a record continues the previous one when the file wraps at a fixed width).

Stats lines, by generation (vllm/engine/metrics.py LoggingStatLogger; vllm/v1/metrics/loggers.py):
  V0  `Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %d reqs,
       Swapped: %d reqs, Pending: %d reqs, GPU KV cache usage: %.1f%%, CPU KV cache usage: %.1f%%.`
  V1  `Engine %03d: Avg prompt throughput: …, Running: %d reqs, Waiting: %d reqs[, Deferred: %d reqs]
       [, Preemptions: %d], GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%
       [, External prefix cache hit rate: %.1f%%][, MM cache hit rate: %.1f%%]`
       (`N Engines Aggregated:` for the aggregated data-parallel logger). Fields are read by name, so
       fields added later land in extra_json instead of breaking the parse.
Speculative decoding (three formats):
  V0 `Speculative metrics: Draft acceptance rate: %.3f, System efficiency: %.3f, Number of speculative
      tokens: %d, Number of accepted tokens: %d, Number of draft tokens: %d, Number of emitted tokens: %d.`
      (totals since start: vllm/spec_decode/metrics.py AsyncMetricsCollector)
  V1 ≤0.9 `SpecDecoding metrics: Draft acceptance rate: %.1f%%, Mean acceptance length: %.2f, Accepted: %d
      tokens, Drafted: %d tokens, Per-position acceptance rate: …`
  V1 `SpecDecoding metrics: Mean acceptance length: %.2f, Accepted throughput: %.2f tokens/s, Drafted
      throughput: %.2f tokens/s, Accepted: %d tokens, Drafted: %d tokens, Per-position acceptance rate: …,
      Avg Draft acceptance rate: %.1f%%` (per logging interval: vllm/v1/spec_decode/metrics.py)
Preemption (V0 scheduler warning): `Sequence group %s is preempted by PreemptionMode.%s mode because there
is not enough KV cache space. … total_num_cumulative_preemption=%d`.
Checked against every vLLM log in tests/data/external/vllm/.
"""

from __future__ import annotations

import ast
import json
import re
from collections import Counter
from datetime import datetime, timedelta
from itertools import pairwise
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracediag.errors import InputError
from tracediag.ingest.base import IngestOptions, Parsed, read_gunzipped

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
RECORD = re.compile(
    r"(?:\((?P<proc>[A-Za-z_][\w.\- ]*?)\s+pid=(?P<pid>\d+)\)\s*)?"
    r"(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(?P<date>\d{2}-\d{2})\s+(?P<time>\d{2}:\d{2}:\d{2})(?:[.,]\d+)?\s+"
    r"\[?(?P<file>[\w.\-]+\.py):(?P<lineno>\d+)\]\s?"
)
_PREFIX = re.compile(r"^\s*\([A-Za-z_][\w.\- ]*?\s+pid=\d+\)")
_STARTS_RECORD = re.compile(r"^\s*(?:\(|\[|(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\b|/|\w+Error\b|Traceback)")

_ENGINE = re.compile(r"^(?:Engine (?P<engine>\d+)|(?P<agg>\d+) Engines Aggregated):\s*(?P<body>.*)$", re.S)
_FIELD = re.compile(
    r"^(?P<key>[A-Za-z][A-Za-z /()_-]*?):\s*(?:active\s+)?(?P<val>-?\d+(?:\.\d+)?|nan|inf)\s*(?P<unit>%|tokens/s|reqs)?"
)
STATS_FIELDS = {
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

_PREEMPT = re.compile(
    r"Sequence group (?P<seq>\S+) is preempted by PreemptionMode\.(?P<mode>\w+) mode because there is not enough "
    r"KV cache space(?:.*?total_num_cumulative_preemption=(?P<cum>\d+))?",
    re.S,
)
_NUM = r"(-?\d+(?:\.\d+)?|nan)"
_SPEC_FIELDS = {
    "acceptance_pct": re.compile(r"(?<!Avg )Draft acceptance rate:\s*" + _NUM + r"\s*%"),
    "avg_acceptance_pct": re.compile(r"Avg Draft acceptance rate:\s*" + _NUM + r"\s*%"),
    "acceptance_frac": re.compile(r"Draft acceptance rate:\s*" + _NUM + r"\s*(?:,|\.?$)"),
    "system_efficiency": re.compile(r"System efficiency:\s*" + _NUM),
    "num_spec_tokens": re.compile(r"Number of speculative tokens:\s*(\d+)"),
    "accepted_v0": re.compile(r"Number of accepted tokens:\s*(\d+)"),
    "draft_v0": re.compile(r"Number of draft tokens:\s*(\d+)"),
    "emitted_v0": re.compile(r"Number of emitted tokens:\s*(\d+)"),
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
    ("vllm_version", re.compile(r"Initializing an? (?:V1 )?LLM engine \(v([^)]+)\)"), 1, None),
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

# Where a record stands (`base` in parse_vllm_log): the leading columns of the stats, event and spec tables.
_RECORD_COLUMNS = [
    ("input_id", pa.int32()),
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
        ("text", pa.string()),
    ]
)
STARTUP_SCHEMA = pa.schema(
    [
        ("input_id", pa.int32()),
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


def _read_lines(path: Path) -> list[str]:
    raw = read_gunzipped(path, "log")
    if b"\x00" in raw[:4096]:
        raise InputError(path, "not a vLLM log: binary content")
    text = _ANSI.sub("", raw.decode("utf-8", errors="replace"))
    # '\r' inside a line is a tqdm redraw, not a line break: keep only '\n' (and '\r\n') as separators.
    return text.replace("\r\n", "\n").split("\n")


def _unwrap(lines: list[str]) -> list[tuple[int, str]]:
    """Join terminal hard-wraps: at a width many lines end at, a line that starts no record continues."""
    widths = Counter(len(a) for a, b in pairwise(lines) if len(a) >= 80 and b and not _STARTS_RECORD.match(b))
    wrap = {w for w, c in widths.items() if c >= 2}
    out: list[tuple[int, str]] = []
    last_len = 0  # length of the last physical line appended
    for i, line in enumerate(lines, start=1):
        if out and last_len in wrap and line and not _STARTS_RECORD.match(line):
            out[-1] = (out[-1][0], out[-1][1] + line)
        else:
            out.append((i, line))
        last_len = len(line)
    return out


def _num(s: str | None) -> float | None:
    if s is None:
        return None
    try:
        return float(s.replace(",", ""))
    except ValueError:
        return None


class _Clock:
    """MM-DD HH:MM:SS without a year -> seconds since the file's first record (year rollover handled)."""

    def __init__(self) -> None:
        self.t0: datetime | None = None
        self.last: datetime | None = None
        self.year = 2000  # a leap year, so 02-29 parses

    def __call__(self, date: str, time: str) -> float | None:
        try:
            dt = datetime.strptime(f"{self.year}-{date} {time}", "%Y-%m-%d %H:%M:%S")
        except ValueError:
            return None
        if self.last is not None and dt < self.last - timedelta(days=180):
            self.year += 1
            dt = dt.replace(year=self.year)
        self.last = dt
        if self.t0 is None:
            self.t0 = dt
        return (dt - self.t0).total_seconds()


def _parse_stats(msg: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """({column: value}, {other field: value}) of a stats message, None when it is not one."""
    m = _ENGINE.match(msg)
    engine = None
    body = msg
    if m:
        body = m["body"]
        engine = int(m["engine"]) if m["engine"] is not None else -1
    if not (body.startswith("Avg prompt throughput:") or re.match(r"Running: \d+ reqs", body)):
        return None
    cols: dict[str, Any] = {"engine": engine, "log_format": "v1" if m or "Waiting:" in body else "v0"}
    extra: dict[str, Any] = {}
    for part in re.split(r",\s*", body.strip().rstrip(".").strip()):
        f = _FIELD.match(part.strip())
        if not f:
            continue
        key = f["key"].strip().lower()
        val = float(f["val"])
        col = STATS_FIELDS.get(key)
        if col:
            cols[col] = int(val) if col in INT_FIELDS else val
        else:
            extra[f["key"].strip()] = val
    if "Pending" in body:
        cols["log_format"] = "v0"
    return cols, extra


def _parse_spec(msg: str) -> dict[str, Any] | None:
    if not (msg.startswith("SpecDecoding metrics:") or msg.startswith("Speculative metrics:")):
        return None
    g: dict[str, Any] = {}
    for key, rx in _SPEC_FIELDS.items():
        m = rx.search(msg)
        if m:
            g[key] = m.group(1)
    if msg.startswith("Speculative metrics:"):  # V0, totals since start
        k = int(g["num_spec_tokens"]) if "num_spec_tokens" in g else None
        drafted = int(g["draft_v0"]) if "draft_v0" in g else None
        return {
            "log_format": "v0",
            "cumulative": True,
            "num_spec_tokens": k,
            "draft_tokens": drafted,
            "accepted_tokens": int(g["accepted_v0"]) if "accepted_v0" in g else None,
            "emitted_tokens": int(g["emitted_v0"]) if "emitted_v0" in g else None,
            "num_drafts": drafted / k if drafted is not None and k else None,
            "acceptance_rate": _num(g.get("acceptance_frac")),
            "system_efficiency": _num(g.get("system_efficiency")),
        }
    per_pos = [float(x) for x in re.split(r"\s*,\s*", g["per_position"])] if "per_position" in g else None
    k = len(per_pos) if per_pos else None
    drafted = int(g["drafted"]) if "drafted" in g else None
    accepted = int(g["accepted"]) if "accepted" in g else None
    pct = _num(g.get("avg_acceptance_pct") or g.get("acceptance_pct"))
    return {
        "log_format": "v1",
        "cumulative": False,
        "num_spec_tokens": k,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "num_drafts": drafted / k if drafted is not None and k else None,
        "acceptance_rate": pct / 100 if pct is not None else (accepted / drafted if drafted else None),
        "mean_acceptance_length": _num(g.get("mean_acceptance_length")),
        "accepted_tput_tok_s": _num(g.get("accepted_tput")),
        "drafted_tput_tok_s": _num(g.get("drafted_tput")),
        "per_position": per_pos,
    }


def _literal_dict(text: str) -> dict[str, Any]:
    start = text.find("{")
    if start < 0:
        return {}
    try:
        d = ast.literal_eval(text[start:])
        return d if isinstance(d, dict) else {}
    except (ValueError, SyntaxError):
        found = {}
        for key in _ARGS_KEYS:
            m = re.search(rf"'{key}':\s*('[^']*'|[^,}}]+)", text)
            if m:
                found[key] = m.group(1).strip().strip("'")
        return found


def _startup_facts(msg: str) -> list[tuple[str, str, float | None, str | None]]:
    facts: list[tuple[str, str, float | None, str | None]] = []
    for key, rx, group, unit in _STARTUP:
        m = rx.search(msg)
        if m:
            value = m.group(group)
            num = _num(value) if unit else None
            if key in ("world_size",):
                num = _num(value)
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
                facts.append((f"arg_{key}", str(value), float(num) if num is not None else None, _UNITS.get(key)))
    return facts


def parse_vllm_log(path: Path, order: int, options: IngestOptions) -> Parsed:
    lines = _unwrap(_read_lines(path))
    clock = _Clock()
    stats: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    startup: list[dict[str, Any]] = []
    spec: list[dict[str, Any]] = []
    malformed: list[tuple[int, str]] = []
    records = 0
    last_engine: dict[Any, int | None] = {}
    seen_facts: set[tuple] = set()
    for n, line in lines:
        matches = list(RECORD.finditer(line))
        for j, m in enumerate(matches):
            records += 1
            end = matches[j + 1].start() if j + 1 < len(matches) else len(line)
            msg = line[m.end() : end].strip()
            t_s = clock(m["date"], m["time"])
            ts_text = f"{m['date']} {m['time']}"
            proc = m["proc"]
            pid = int(m["pid"]) if m["pid"] else None
            base = {"input_id": order, "line": n, "ts_text": ts_text, "t_s": t_s, "process": proc, "pid": pid}
            parsed = _parse_stats(msg)
            if parsed is not None:
                cols, extra = parsed
                if "running" not in cols or ("waiting" not in cols and "swapped" not in cols):
                    malformed.append((n, msg))
                    continue
                stats.append({**base, **cols, "extra_json": json.dumps(extra) if extra else None})
                last_engine[pid] = cols.get("engine")
                continue
            sp = _parse_spec(msg)
            if sp is not None:
                if sp.get("draft_tokens") is None and sp.get("accepted_tokens") is None:
                    malformed.append((n, msg))
                    continue
                spec.append({**base, **sp, "engine": last_engine.get(pid), "text": msg})
                continue
            pm = _PREEMPT.search(msg)
            if pm:
                events.append(
                    {
                        **base,
                        "kind": "preemption",
                        "seq_group": pm["seq"],
                        "mode": pm["mode"],
                        "cumulative": int(pm["cum"]) if pm["cum"] else None,
                        "text": msg,
                    }
                )
                continue
            for key, value, num, unit in _startup_facts(msg):
                ident = (key, value, proc)
                if ident in seen_facts:
                    continue
                seen_facts.add(ident)
                startup.append(  # STARTUP_SCHEMA keeps base's input_id, line, process and pid
                    {
                        **base,
                        "key": key,
                        "value": value,
                        "value_num": num,
                        "unit": unit,
                        "text": msg[:500],
                    }
                )
    if records == 0:
        first = next((t.strip() for _, t in lines if t.strip()), "")
        raise InputError(
            path,
            "not a vLLM log: no 'LEVEL MM-DD HH:MM:SS [file.py:N]' records"
            + (f" (line 1: {first[:60]!r})" if first else " (empty file)"),
        )
    facts = {}
    for f in startup:
        facts.setdefault(f["key"], f["value"])
    meta = {
        "records": records,
        "stats_lines": len(stats),
        "spec_decode_lines": len(spec),
        "preemption_warnings": len(events),
        "startup_facts": facts,
        "malformed_lines": len(malformed),
        "malformed_examples": [{"line": n, "text": t[:120]} for n, t in malformed[:MAX_EXAMPLES]],
        "engines": sorted({s["engine"] for s in stats if s.get("engine") is not None}),
    }
    version = facts.get("vllm_version")
    row = {
        "rank": None,
        "profiler": f"vLLM {version} log" if version else "vLLM log",
        "file_bytes": path.stat().st_size,
        "events_total": records,
        "meta_json": json.dumps(meta),
    }

    def table(rows: list[dict[str, Any]], schema: pa.Schema) -> pa.Table:
        return pa.Table.from_pylist([{f.name: r.get(f.name) for f in schema} for r in rows], schema=schema)

    return Parsed(
        path=str(path),
        format="vllm-log",
        inputs_rows=[row],
        tables={
            "serving_stats": table(stats, STATS_SCHEMA),
            "serving_events": table(events, EVENTS_SCHEMA),
            "serving_startup": table(startup, STARTUP_SCHEMA),
            "spec_decode": table(spec, SPEC_SCHEMA),
        },
    )
