"""SGLang server logs: prefill and decode batch lines, retractions, startup facts, watchdog timeouts.

Record prefix (python/sglang/srt/utils configure_logger: `[%(asctime)s{prefix}] %(message)s`): the time is
`HH:MM:SS` in 2024, `YYYY-MM-DD HH:MM:SS` from 2025; the prefix tags the scheduler process — `DP{n}`, `PP{n}`,
`ATTN_CP{n}`, `MOE_DP{n}`, `TP{n}` (only when tp_size > 1 from 2025), `EP{n}` — and is absent on tokenizer and
HTTP lines (`[2025-09-03 18:33:31] INFO:     ip - "POST /v1/chat/completions HTTP/1.1" 200 OK`). Wrappers
before the record (docker compose `sglang  | `, docker `--timestamps`, an outer timestamp) are skipped; a Ray actor
prefix `(SGLangEngine pid=N)` names the process (several engines in one Ray log stay apart); a bare `[TP0] Decode
batch.` (pasted without times) is read with no time. SGLang run under an application's own Python logging has no
bracket prefix: `YYYY-MM-DD HH:MM:SS[,ms] [LEVEL] sglang.srt.managers.scheduler_metrics_mixin: message` or
`YYYY-MM-DD HH:MM:SS[,ms] LEVEL PID [scheduler_metrics_mixin.py:N] message` (no rank tag: one engine per process).
The engine of a row is the data-parallel rank (`DP3`) when the prefix has one, else the tensor-parallel rank: with DP
attention each DP rank logs its own batches (`DP3 TP3 EP3`), without it `DPn TP0` is rank 0 of replica n.

Lines (python/sglang/srt/managers/scheduler_metrics_mixin.py log_prefill_stats / log_decode_stats, and the
older scheduler.py / tp_worker.py forms):
  `Prefill batch[.,] #new-seq: N, #new-token: N, #cached-token: N, [cache hit rate: X%, ]token usage: X,
   #running-req: N, #queue-req: N[, ]` (hybrid: `full token usage`, `swa token usage` / `mamba usage`)
  `Decode batch[.,] #running-req: N, #token: N, token usage: X, [accept len: X, accept rate: X, ]
   [cuda graph: B, ]gen throughput (token/s): X, #queue-req: N[, ]` (hybrid: `#full token`, `full token usage`)
  `KV cache pool is full. Retract requests. #retracted_reqs: N, #new_token_ratio: X -> Y` (from 2025; before it
   `Decode out of memory happened. #retracted_reqs: N, …`, and `decode out of memory happened, #retracted_reqs: N`
   in 2024): a retraction, SGLang's preemption
  `accept len: X, accept rate: Y` in a decode line (speculative decoding on): accept len = (accepted drafts + 1) per
   verify round averaged over the logging interval (spec_num_accepted_tokens / spec_num_forward_ct), accept rate =
   the same count over the draft tokens verified (forward_ct × speculative_num_draft_tokens); each becomes a
   spec_decode row (log_format 'sglang') of that engine
  `max_total_num_tokens=N, chunked_prefill_size=N, max_prefill_tokens=N, max_running_requests=N,
   context_len=N[, available_gpu_mem=X GB]`; `server_args=ServerArgs(...)` (tp_size, dp_size, attention_backend...)
  death, hang and cascade messages (`Watchdog timeout (self.watchdog_timeout=N)`, `Scheduler hit an exception`,
  `Health check failed … last_heartbeat time: …`, and the PyTorch / device lines without a record prefix such as
  `Fatal Python error: Aborted` or `HSA_STATUS_ERROR_…`): tracediag/catalog/engine_failures.json.
Decode lines come every --decode-log-interval decode steps (40), not on a clock, and none while idle; several lines
often share one printed second, and their order in the file is their order in time.
A line whose middle was cut by the terminal that copied it (`#cached-to…unning-req: 6`) keeps the fields it still
names; a field ending in `unning-req` is #running-req (the only SGLang key that ends so).
Rows go to the same tables as vLLM's (serving_stats with log_format 'sglang-prefill' / 'sglang-decode';
token usage as a percentage in kv_usage_pct; running = #running-req, waiting = #queue-req).
Decode batch lines of one TP tag in SGLang's exact layout (_FAST_BLOCK) are read in bulk by the block reader
(log_blocks.read_blocks); every other line line by line (_logical_line), to the same rows.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tracediag.catalog import failures
from tracediag.errors import InputError
from tracediag.ingest.base import IngestOptions, Parsed
from tracediag.ingest.log_blocks import clocked_segments, read_blocks
from tracediag.ingest.vllm_log.decode import BadValue, checked_float, checked_int
from tracediag.ingest.vllm_log.lines import Joiner
from tracediag.ingest.vllm_log.patterns import _ACCESS
from tracediag.ingest.vllm_log.tables import MAX_TEXT, LogState
from tracediag.memory import read_bytes_budget

RECORD = re.compile(
    r"\[?(?:(?P<date>\d{4}-\d{2}-\d{2}) )?(?P<time>\d{2}:\d{2}:\d{2})?"
    r"(?P<tags>(?:\s{0,8}(?:DP|PP|TP|EP|ATTN_CP|MOE_DP)\d+)*)\]\s?"
)  # \s{0,8}, not \s*: finditer tries every position, and \s* ran to the end of a 1 MiB run of spaces from each
_STARTS_RECORD = re.compile(
    r"^\s*(?:\[|sglang\s+\||\w+Error\b|Traceback|\d{4}-\d{2}-\d{2}[ T]\d{2}:|\([A-Za-z_]\w* pid=\d+)"
)
# SGLang under an application's Python logging (no bracket prefix, no rank tag): `2026-06-07 10:59:31,659 [INFO]
# sglang.srt.managers.scheduler_metrics_mixin: msg` or `2025-12-04 20:35:53 INFO 151972 [scheduler_metrics_mixin.py:287]
# msg` (logging.Formatter "%(asctime)s %(levelname)s %(process)d [%(filename)s:%(lineno)d] %(message)s")
_LEVEL = r"DEBUG|INFO|WARNING|ERROR|CRITICAL"
PY_RECORD = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})[ T](?P<time>\d{2}:\d{2}:\d{2})(?:[.,]\d{1,9})?\s+"
    rf"(?:\[(?:{_LEVEL})\]|(?:{_LEVEL}))\s+(?:(?P<pid>\d{{1,9}})\s+)?"
    r"(?:\[(?P<file>[\w.\-/]{1,200}\.py):\d{1,7}\]|(?P<logger>sglang(?:\.\w{1,64}){0,8})\s?:)\s?"
)
# Ray prints each actor's output behind `(ActorName pid=N[, ip=A])`; a markdown quote `> ` may come first
_RAY_ACTOR = re.compile(r"\((?P<actor>[A-Za-z_]\w{0,63}) pid=(?P<pid>\d{1,9})(?:, ip=[\d.:a-f]{1,64})?\)\s*$")
_BATCH = re.compile(r"^(?P<kind>Prefill|Decode) batch(?:\(mixed #running-req: \d+\))?(?: \[\d+\])?[.,]\s*(?P<body>.*)$")
_FIELD = re.compile(
    r"^(?P<key>#?[A-Za-z][A-Za-z _()/-]*?):\s*(?P<val>-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|True|False)(?P<pct>%)?$"
)
_RETRACT = re.compile(
    r"(?:KV cache pool is full\. Retract requests\.|[Dd]ecode out of memory happened[.,])\s*#retracted_reqs: (?P<n>\d+)"
)
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
    # the draft depth (EAGLE chain: k), candidates per step, tokens verified per round (root included): the field
    # names of python/sglang/srt/server_args.py ServerArgs; SCH007 reads them instead of deriving k
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_draft_model_path",
    "enable_dp_attention",
    "disable_radix_cache",
)
# death, hang and cascade messages: tracediag/catalog/engine_failures.json (failures.match), each with the file
# that prints it
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


def _engine(tags: str) -> int | None:
    """The engine a prefix names: the data-parallel rank (`DP3`, not `MOE_DP3`), else the tensor-parallel rank."""
    m = re.search(r"(?<![A-Z_])DP(\d+)", tags or "") or re.search(r"TP(\d+)", tags or "")
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
        if col is None and key.endswith("unning-req") and "running" not in cols:
            col = "running"  # the terminal cut the line between two keys: `#cached-to…unning-req: N`
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


def _logical_line(st: LogState, n: int, line: str) -> int:
    """One logical line of an SGLang log into the tables; 1 when it was a batch line."""
    matches = [m for m in RECORD.finditer(line) if m["time"] or m["tags"]]
    py = None if matches else PY_RECORD.search(line)
    if py is not None:
        st.records += 1
        pid = int(py["pid"]) if py["pid"] else None
        ts_text = f"{py['date']} {py['time']}"
        base = st.at(st.clock(py["date"], py["time"]), n, ts_text, "python-logging" if pid else None, pid)
        return _message(st, n, line[py.end() :].strip(), base, None)
    if not matches:
        a = _ACCESS.search(line) or re.search(r'\[INFO\] "(?P<method>[A-Z]+) (?P<path>\S+)" (?P<status>\d{3})', line)
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
        elif line.strip() and not _failure(st, base, line.strip(), own_time=False):
            st.unknown_line(n, line.strip())  # a failure without a record prefix (`Fatal Python error`) is kept
        return 0
    m = matches[0]  # an outer wrapper timestamp may come first: the innermost of the adjacent prefixes is SGLang's
    for nxt in matches[1:]:
        if line[m.end() : nxt.start()].strip():
            break
        m = nxt
    st.records += 1
    ray = _RAY_ACTOR.search(line, 0, m.start())
    proc, pid = (ray["actor"], int(ray["pid"])) if ray else (None, None)
    ts_text = " ".join(x for x in (m["date"], m["time"]) if x) or None
    t_s = st.clock(m["date"] or "2000-01-01", m["time"]) if m["time"] else None
    tags = (m["tags"] or "").strip() or None
    base = st.at(t_s, n, ts_text, tags if proc is None else f"{proc} {tags}" if tags else proc, pid)
    return _message(st, n, line[m.end() :].strip(), base, _engine(m["tags"]))


# the decode batch line of a scheduler with one TP tag, as SGLang writes it (most lines of a long log), for the
# block reader (pyarrow's RE2 over the raw line): integers without leading zeros where a float of them goes to
# extra_json (json writes 137.0), two decimals where SGLang prints two
_FAST_BLOCK = (
    r"^\[(?P<date>[0-9]{4}-[0-9]{2}-[0-9]{2}) (?P<time>[0-9]{2}:[0-9]{2}:[0-9]{2}) TP(?P<tp>[0-9]{1,5})\] "
    r"Decode batch[.,] #running-req: (?P<r>[0-9]{1,9}), #token: (?P<tok>0|[1-9][0-9]{0,14}), "
    r"token usage: (?P<u>[0-9]\.[0-9]{2}), (?:cuda graph: (?P<cg>True|False), )?"
    r"gen throughput \(token/s\): (?P<g>[0-9]{1,12}\.[0-9]{2}), #queue-req: (?P<q>[0-9]{1,9}),? ?\r?\n?$"
)


def _fast_rows(st: LogState, joiner: Any, matches: pa.StructArray, a: int, c: int, first_line: int, general) -> None:
    """Decode batch lines a..c-1 of a block into serving_stats in columns, where the clock is on the day of the
    last record and no run starts (log_blocks.clocked_segments); the others line by line."""
    rows = matches.slice(a, c - a)
    for s, v, t in clocked_segments(st, joiner, rows, lambda k: general(a + k), 10):
        _bulk_decode(st, rows.slice(s, v), t, first_line + a + s + 1)


def _bulk_decode(st: LogState, rows: pa.StructArray, t: np.ndarray, line: int) -> None:
    n = len(rows)
    text = {k: rows.field(k).cast(pa.large_string()) for k in ("date", "time", "tp", "r", "tok", "u", "g", "q")}

    def lit(x: str) -> pa.Scalar:
        return pa.scalar(x, pa.large_string())

    ts_text = pc.binary_join_element_wise(text["date"], text["time"], lit(" ")).cast(pa.string())
    graph = rows.field("cg").cast(pa.large_string())
    off = pc.if_else(pc.equal(graph, lit("False")), lit(', "cuda graph": false'), lit(""))
    graph_json = pc.if_else(pc.equal(graph, lit("True")), lit(', "cuda graph": true'), off)
    extra = pc.binary_join_element_wise(lit('{"#token": '), text["tok"], lit(".0"), graph_json, lit("}"), lit(""))
    cols = {
        "input_id": pa.array(np.full(n, st.order, dtype=np.int32)),
        "run": pa.array(np.full(n, st.run, dtype=np.int32)),
        "line": pa.array(np.arange(line, line + n, dtype=np.int32)),
        "ts_text": ts_text,
        "t_s": pa.array(t, pa.float64()),
        "process": pc.binary_join_element_wise(lit("TP"), text["tp"], lit("")),
        "engine": text["tp"].cast(pa.int32()),
        "log_format": pa.array(["sglang-decode"] * n, pa.string()),
        "gen_tput_tok_s": text["g"].cast(pa.float64()),
        "running": text["r"].cast(pa.int32()),
        "waiting": text["q"].cast(pa.int32()),
        "kv_usage_pct": pa.array(text["u"].cast(pa.float64()).to_numpy() * 100),
        "extra_json": extra,
    }
    st.add_stats_rows(cols, n, t, ts_text)
    st.records += n
    st.batch_lines += n
    st.run_active = True


def parse_sglang_log(path: Path, order: int, options: IngestOptions) -> Parsed:
    st = LogState(order)
    st.batch_lines = 0

    def logical(n: int, line: str) -> None:
        st.batch_lines += _logical_line(st, n, line)

    longest = read_bytes_budget(options.memory_limit)
    joiner = Joiner(logical, _STARTS_RECORD, longest)
    read_blocks(path, st, joiner, _FAST_BLOCK, _fast_rows, longest)
    joiner.flush()
    batches = st.batch_lines
    failed = sum(st.events.kinds.get(k, 0) for k in failures.KINDS)
    if st.records == 0 and not failed:  # a crash excerpt of PyTorch / runtime lines only is still read
        from tracediag.ingest.unrecognised import file_text, not_a_record  # content-free: no byte of the file

        raise InputError(
            path,
            "not an SGLang log: no '[YYYY-MM-DD HH:MM:SS TPn] …' records"
            + (f" ({file_text(path, st.n_unknown)}; {not_a_record('an SGLang record', *st.unknown[0], cap=120)})"
               if st.unknown else " (empty file)"),
        )  # fmt: skip
    meta = st.meta() | {"batch_lines": batches}
    row = {
        "rank": None,
        "profiler": "SGLang server log",
        "file_bytes": path.stat().st_size,
        "events_total": st.records,
        "meta_json": json.dumps(meta),
    }
    return Parsed(path=str(path), format="sglang-log", inputs_rows=[row], tables=st.tables())


def _message(st: LogState, n: int, msg: str, base: dict, engine: int | None) -> int:
    """One SGLang record's message into the tables; 1 when it was a batch line."""
    try:
        parsed = parse_batch(msg)
    except BadValue as exc:
        st.bad(n, msg, str(exc))
        return 0
    if parsed is not None:
        cols, extra = parsed
        if "running" not in cols or ("waiting" not in cols and "kv_usage_pct" not in cols):
            st.bad(n, msg, "batch line without #running-req and #queue-req/token usage")
            return 0
        st.stats.add({**base, **cols, "engine": engine, "extra_json": json.dumps(extra) if extra else None})
        st.run_active = True
        if "accept len" in extra:  # speculative decoding on: this interval's acceptance, per engine
            st.spec.add(
                {
                    **base,
                    "engine": engine,
                    "log_format": "sglang",
                    "cumulative": False,
                    "mean_acceptance_length": extra["accept len"],
                    "acceptance_rate": extra.get("accept rate"),
                    "text": msg[:MAX_TEXT],
                }
            )
        return 1
    a = _ACCESS.search(msg)
    if a:
        st.event(
            base, "access", f"{a['method']} {a['path']} {a['status']}", http_status=int(a["status"]), own_time=True
        )
        st.run_active = True
        return 0
    r = _RETRACT.search(msg)
    if r:
        st.event(base, "retraction", msg, cumulative=int(r["n"]) if len(r["n"]) < 12 else None, own_time=True)
        st.run_active = True
        return 0
    if _failure(st, base, msg):
        return 0
    if _STARTUP.search(msg) or msg.startswith("server_args=ServerArgs("):
        if st.run_active and _STARTUP.search(msg):
            st.new_run(n, "startup (max_total_num_tokens)")
            base = {**base, "run": st.run}
        # `server_args=ServerArgs(model_path=…`: the pairs start after the opening parenthesis (else the first pair
        # would be `server_args` and model_path's value would be lost inside it)
        for key, value in _PAIR.findall(msg.removeprefix("server_args=ServerArgs(")):
            if key in _UNITS or key in _SERVER_ARGS:
                value = value.strip("'\"")
                num = None
                try:
                    numeric = key in _UNITS or key.endswith(("_size", "_tokens", "_steps", "_topk"))
                    num = float(value) if numeric else None  # `None` (unset) raises: no number
                except ValueError:
                    num = None
                st.fact(base, key, value[:200], num, _UNITS.get(key), msg)
        return 0
    lm = re.search(r"exceeds the maximum allowed length \((\d+) tokens\)", msg)
    if lm:
        st.fact(base, "max_input_len", lm[1], float(lm[1]), "tokens", msg)
    return 0


def _failure(st: LogState, base: dict, msg: str, own_time: bool = True) -> bool:
    """A death, hang or cascade message (the catalogue's) into serving_events; False when the line is none."""
    fail = failures.match(msg, "sglang")
    if fail is None:
        return False
    st.event(base, fail.kind, msg, own_time=own_time, pattern=fail.id)
    st.run_active = True
    return True
