"""SGLang server logs: prefill and decode batch lines, retractions, startup facts, watchdog timeouts.

Record prefix (python/sglang/srt/utils configure_logger: `[%(asctime)s{prefix}] %(message)s`): the time is
`HH:MM:SS` in 2024, `YYYY-MM-DD HH:MM:SS` from 2025; the prefix tags the scheduler process — `DP{n}`, `PP{n}`,
`ATTN_CP{n}`, `MOE_DP{n}`, `TP{n}` (only when tp_size > 1 from 2025), `EP{n}` — and is absent on tokenizer and
HTTP lines (`[2025-09-03 18:33:31] INFO:     ip - "POST /v1/chat/completions HTTP/1.1" 200 OK`). Wrappers
before the record (docker compose `sglang  | `, an outer timestamp) are skipped; a bare `[TP0] Decode batch.`
(pasted without times) is read with no time.

Lines (python/sglang/srt/managers/scheduler_metrics_mixin.py log_prefill_stats / log_decode_stats, and the
older scheduler.py / tp_worker.py forms):
  `Prefill batch[.,] #new-seq: N, #new-token: N, #cached-token: N, [cache hit rate: X%, ]token usage: X,
   #running-req: N, #queue-req: N[, ]` (hybrid: `full token usage`, `swa token usage` / `mamba usage`)
  `Decode batch[.,] #running-req: N, #token: N, token usage: X, [accept len: X, accept rate: X, ]
   [cuda graph: B, ]gen throughput (token/s): X, #queue-req: N[, ]` (hybrid: `#full token`, `full token usage`)
  `KV cache pool is full. Retract requests. #retracted_reqs: N, #new_token_ratio: X -> Y`
  `max_total_num_tokens=N, chunked_prefill_size=N, max_prefill_tokens=N, max_running_requests=N,
   context_len=N[, available_gpu_mem=X GB]`; `server_args=ServerArgs(...)` (tp_size, dp_size, attention_backend...)
  `Watchdog timeout (self.watchdog_timeout=N)` / `Scheduler watchdog timeout (…)`, `Scheduler hit an exception`.
Decode lines come every --decode-log-interval decode steps (40), not on a clock, and none while idle.
Rows go to the same tables as vLLM's (serving_stats with log_format 'sglang-prefill' / 'sglang-decode';
token usage as a percentage in kv_usage_pct; running = #running-req, waiting = #queue-req).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tracediag.errors import InputError
from tracediag.ingest.base import IngestOptions, Parsed
from tracediag.ingest.vllm_log import (
    _ACCESS,
    BadValue,
    LogState,
    checked_float,
    checked_int,
    logical_lines,
    physical_lines,
)

RECORD = re.compile(
    r"\[?(?:(?P<date>\d{4}-\d{2}-\d{2}) )?(?P<time>\d{2}:\d{2}:\d{2})?"
    r"(?P<tags>(?:\s{0,8}(?:DP|PP|TP|EP|ATTN_CP|MOE_DP)\d+)*)\]\s?"
)  # \s{0,8}, not \s*: finditer tries every position, and \s* ran to the end of a 1 MiB run of spaces from each
_STARTS_RECORD = re.compile(r"^\s*(?:\[|sglang\s+\||\w+Error\b|Traceback)")
_BATCH = re.compile(r"^(?P<kind>Prefill|Decode) batch(?:\(mixed #running-req: \d+\))?(?: \[\d+\])?[.,]\s*(?P<body>.*)$")
_FIELD = re.compile(
    r"^(?P<key>#?[A-Za-z][A-Za-z _()/-]*?):\s*(?P<val>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|True|False)(?P<pct>%)?$"
)
_RETRACT = re.compile(r"KV cache pool is full\. Retract requests\. #retracted_reqs: (?P<n>\d+)")
_STARTUP = re.compile(r"max_total_num_tokens=(?P<tokens>\d+)")
# a key starts at a word boundary and is short: `(\w+)=` alone retries from every character of a long word (a 1 MiB
# run of letters took hours)
_PAIR = re.compile(r"\b(\w{1,128})=('[^']*'|\"[^\"]*\"|[^,\s)]+)")
_SERVER_ARGS = (
    "tp_size",
    "dp_size",
    "pp_size",
    "ep_size",
    "attention_backend",
    "kv_cache_dtype",
    "model_path",
    "chunked_prefill_size",
    "max_running_requests",
    "mem_fraction_static",
    "schedule_policy",
    "speculative_algorithm",
    "speculative_num_draft_tokens",
    "enable_dp_attention",
    "disable_radix_cache",
)
_EVENTS = [
    ("watchdog_timeout", re.compile(r"(?:Scheduler )?[Ww]atchdog timeout \(self\.watchdog_timeout=\d+")),
    ("scheduler_exception", re.compile(r"Scheduler hit an exception|Received sigquit from a child process")),
    ("engine_dead", re.compile(r"Child process unexpectedly failed|SIGQUIT received|Rank \d+ scheduler is dead")),
]
_UNITS = {
    "max_total_num_tokens": "tokens",
    "chunked_prefill_size": "tokens",
    "max_prefill_tokens": "tokens",
    "max_running_requests": "requests",
    "context_len": "tokens",
    "available_gpu_mem": "GB",
}
# SGLang field -> serving_stats column
_COLS = {
    "#running-req": "running",
    "#queue-req": "waiting",
    "token usage": "kv_usage_pct",
    "full token usage": "kv_usage_pct",
    "gen throughput (token/s)": "gen_tput_tok_s",
    "cache hit rate": "prefix_hit_pct",
}


def _tp_rank(tags: str) -> int | None:
    m = re.search(r"TP(\d+)", tags or "")
    return int(m[1]) if m and len(m[1]) < 6 else None


def parse_batch(msg: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """({serving_stats column: value}, {other field: value}) of a prefill/decode batch line; None if not one."""
    m = _BATCH.match(msg)
    if not m:
        return None
    cols: dict[str, Any] = {"log_format": f"sglang-{m['kind'].lower()}"}
    extra: dict[str, Any] = {}
    for part in re.split(r",\s*", m["body"].strip().rstrip(",").strip()):
        f = _FIELD.match(part.strip())
        if not f:
            continue
        key, raw = f["key"].strip(), f["val"]
        if raw in ("True", "False"):
            extra[key] = raw == "True"
            continue
        val = float(raw)
        col = _COLS.get(key)
        if col in ("running", "waiting"):
            cols[col] = checked_int(val)
        elif col == "kv_usage_pct":
            cols[col] = checked_float(val) * 100
        elif col:
            cols[col] = checked_float(val)
        else:
            extra[key] = checked_float(val)
    if m["kind"] == "Prefill" and "#new-token" in extra:
        new, cached = extra["#new-token"], extra.get("#cached-token", 0.0)
        if "prefix_hit_pct" not in cols and new + cached > 0:
            cols["prefix_hit_pct"] = 100 * cached / (new + cached)
    return cols, extra


def parse_sglang_log(path: Path, order: int, options: IngestOptions) -> Parsed:
    st = LogState(order)
    batches = 0
    for n, line in logical_lines(physical_lines(path), _STARTS_RECORD):
        matches = [m for m in RECORD.finditer(line) if m["time"] or m["tags"]]
        if not matches:
            a = _ACCESS.search(line) or re.search(
                r'\[INFO\] "(?P<method>[A-Z]+) (?P<path>\S+)" (?P<status>\d{3})', line
            )
            base = st.at(None, n, st.last_ts_text, None, None) | {"t_s": st.last_t}
            if a:
                st.event(
                    base,
                    "access",
                    f"{a['method']} {a['path']} {a['status']}",
                    http_status=int(a["status"]),
                    own_time=False,
                )
                st.run_active = True
            elif line.strip():
                st.unknown_line(n, line.strip())
            continue
        m = matches[0]  # an outer wrapper timestamp may come first: the innermost of the adjacent prefixes is SGLang's
        for nxt in matches[1:]:
            if line[m.end() : nxt.start()].strip():
                break
            m = nxt
        st.records += 1
        msg = line[m.end() :].strip()
        ts_text = " ".join(x for x in (m["date"], m["time"]) if x) or None
        t_s = st.clock(m["date"] or "2000-01-01", m["time"]) if m["time"] else None
        tp = _tp_rank(m["tags"])
        base = st.at(t_s, n, ts_text, (m["tags"] or "").strip() or None, None)
        try:
            parsed = parse_batch(msg)
        except BadValue as exc:
            st.bad(n, msg, str(exc))
            continue
        if parsed is not None:
            cols, extra = parsed
            if "running" not in cols or ("waiting" not in cols and "kv_usage_pct" not in cols):
                st.bad(n, msg, "batch line without #running-req and #queue-req/token usage")
                continue
            batches += 1
            st.stats.add({**base, **cols, "engine": tp, "extra_json": json.dumps(extra) if extra else None})
            st.run_active = True
            continue
        a = _ACCESS.search(msg)
        if a:
            st.event(
                base, "access", f"{a['method']} {a['path']} {a['status']}", http_status=int(a["status"]), own_time=True
            )
            st.run_active = True
            continue
        r = _RETRACT.search(msg)
        if r:
            st.event(base, "retraction", msg, cumulative=int(r["n"]) if len(r["n"]) < 12 else None, own_time=True)
            st.run_active = True
            continue
        if any(_event(st, base, msg, kind, rx) for kind, rx in _EVENTS):
            continue
        if _STARTUP.search(msg) or msg.startswith("server_args=ServerArgs("):
            if st.run_active and _STARTUP.search(msg):
                st.new_run(n, "startup (max_total_num_tokens)")
                base = {**base, "run": st.run}
            for key, value in _PAIR.findall(msg):
                if key in _UNITS or key in _SERVER_ARGS:
                    value = value.strip("'\"")
                    num = None
                    try:
                        num = float(value) if key in _UNITS or key.endswith("_size") else None
                    except ValueError:
                        num = None
                    st.fact(base, key, value[:200], num, _UNITS.get(key), msg)
            continue
        lm = re.search(r"exceeds the maximum allowed length \((\d+) tokens\)", msg)
        if lm:
            st.fact(base, "max_input_len", lm[1], float(lm[1]), "tokens", msg)
    if st.records == 0:
        raise InputError(
            path,
            "not an SGLang log: no '[YYYY-MM-DD HH:MM:SS TPn] …' records"
            + (f" (line 1: {st.unknown[0][1][:60]!r})" if st.unknown else " (empty file)"),
        )
    meta = st.meta() | {"batch_lines": batches}
    row = {
        "rank": None,
        "profiler": "SGLang server log",
        "file_bytes": path.stat().st_size,
        "events_total": st.records,
        "meta_json": json.dumps(meta),
    }
    return Parsed(path=str(path), format="sglang-log", inputs_rows=[row], tables=st.tables())


def _event(st: LogState, base: dict, msg: str, kind: str, rx: re.Pattern[str]) -> bool:
    if rx.search(msg):
        st.event(base, kind, msg, own_time=True)
        st.run_active = True
        return True
    return False
