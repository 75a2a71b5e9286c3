"""`vllm bench serve` results: `--save-result` / `--save-detailed` JSON (one object, or one per line with
`--append-result`), the old `benchmarks/benchmark_serving.py` keys, and the client's stdout result table.

Keys (vllm/benchmarks/serve.py `benchmark()` and `main_async()`): date, backend, model_id, num_prompts,
request_rate ("inf" when infinite), burstiness, max_concurrency, duration, completed, failed,
total_input_tokens, total_output_tokens, request_throughput, request_goodput, output_throughput,
total_token_throughput, max_output_tokens_per_s, max_concurrent_requests, {mean,median,std,pNN}_{ttft,tpot,
itl,e2el}_ms; with --save-detailed also input_lens, output_lens, ttfts (s), itls (s, one list per request),
errors ('' when none), generated_texts, and in newer versions start_times (s). Older benchmark_serving.py
wrote input_throughput, no `failed`, and {mean,median,p99}_latency_ms for the end-to-end latency.
The stdout table is `============ Serving Benchmark Result ============` followed by `Name: value` lines;
the run's arguments come from the `Namespace(...)` line the client prints first.
"""

from __future__ import annotations

import json
import math
import re
from array import array
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from tracediag.errors import InputError
from tracediag.ingest.base import IngestOptions, Parsed
from tracediag.ingest.validate import BadRecords, Checker
from tracediag.inputfile import read_input, size_text
from tracediag.memory import memory_limit

RUNS_SCHEMA = pa.schema(
    [
        ("input_id", pa.int32()),
        ("run", pa.int32()),
        ("source", pa.string()),
        ("date", pa.string()),
        ("backend", pa.string()),
        ("model_id", pa.string()),
        ("tag", pa.string()),
        ("dataset_name", pa.string()),
        ("num_prompts", pa.int32()),
        ("request_rate_rps", pa.float64()),
        ("burstiness", pa.float64()),
        ("max_concurrency", pa.int32()),
        ("duration_s", pa.float64()),
        ("completed", pa.int32()),
        ("failed", pa.int32()),
        ("total_input_tokens", pa.int64()),
        ("total_output_tokens", pa.int64()),
        ("request_throughput_rps", pa.float64()),
        ("request_goodput_rps", pa.float64()),
        ("output_tput_tok_s", pa.float64()),
        ("total_tput_tok_s", pa.float64()),
        ("max_output_tput_tok_s", pa.float64()),
        ("max_concurrent_requests", pa.int32()),
        ("has_requests", pa.bool_()),
        ("goodput_json", pa.string()),
        ("meta_json", pa.string()),
    ]
)
LATENCY_SCHEMA = pa.schema(
    [
        ("input_id", pa.int32()),
        ("run", pa.int32()),
        ("metric", pa.string()),
        ("stat", pa.string()),
        ("percentile", pa.float64()),
        ("value_ms", pa.float64()),
    ]
)
REQUESTS_SCHEMA = pa.schema(
    [
        ("input_id", pa.int32()),
        ("run", pa.int32()),
        ("req", pa.int32()),
        ("input_len", pa.int32()),
        ("output_len", pa.int32()),
        ("success", pa.bool_()),
        ("error", pa.string()),
        ("start_s", pa.float64()),
        ("ttft_s", pa.float64()),
        ("e2el_s", pa.float64()),
        ("e2el_source", pa.string()),
        ("tpot_s", pa.float64()),
        ("itl_count", pa.int32()),
        ("itl_max_s", pa.float64()),
        ("itl_mean_s", pa.float64()),
        ("itls_s", pa.list_(pa.float64())),
    ]
)

_STAT_KEY = re.compile(
    r"^(?P<stat>mean|median|std|p(?P<p>\d+(?:\.\d+)?))_(?P<metric>ttft|tpot|itl|e2el|latency|e2e_latency)_ms$"
)
_METRIC_ALIAS = {"latency": "e2el", "e2e_latency": "e2el"}
PER_REQUEST = ("input_lens", "output_lens", "ttfts", "itls", "errors", "generated_texts", "start_times")
SUMMARY_KEYS = {
    "duration": "duration_s",
    "completed": "completed",
    "failed": "failed",
    "total_input_tokens": "total_input_tokens",
    "total_output_tokens": "total_output_tokens",
    "request_throughput": "request_throughput_rps",
    "request_goodput": "request_goodput_rps",
    "output_throughput": "output_tput_tok_s",
    "total_token_throughput": "total_tput_tok_s",
    "total_throughput": "total_tput_tok_s",  # SGLang
    "max_output_tokens_per_s": "max_output_tput_tok_s",
    "max_concurrent_requests": "max_concurrent_requests",
    "num_prompts": "num_prompts",
    "burstiness": "burstiness",
    "max_concurrency": "max_concurrency",
    "date": "date",
    "model_id": "model_id",
}
# stdout table: label -> column, or (metric, stat) for latency rows
_TABLE_ROWS = {
    "successful requests": "completed",
    "failed requests": "failed",
    "maximum request concurrency": "max_concurrency",
    "request rate configured (rps)": "request_rate_rps",
    "benchmark duration (s)": "duration_s",
    "total input tokens": "total_input_tokens",
    "total generated tokens": "total_output_tokens",
    "request throughput (req/s)": "request_throughput_rps",
    "request goodput (req/s)": "request_goodput_rps",
    "output token throughput (tok/s)": "output_tput_tok_s",
    "peak output token throughput (tok/s)": "max_output_tput_tok_s",
    "peak concurrent requests": "max_concurrent_requests",
    "total token throughput (tok/s)": "total_tput_tok_s",
    "traffic request rate": "request_rate_rps",  # SGLang
    "max request concurrency": "max_concurrency",
    "max reqeuest concurrency": "max_concurrency",  # SGLang's spelling in some versions
}
_TABLE_LAT = re.compile(
    r"^(?P<stat>Mean|Median|Std|P(?P<p>\d+(?:\.\d+)?)|Max)\s+(?P<metric>TTFT|TPOT|ITL|E2EL|E2E Latency)\s+\(ms\):"
    r"\s*(?P<v>\S+)"
)
_TABLE_ROW = re.compile(r"^(?P<label>[A-Za-z][^:]*?):\s+(?P<v>\S+)\s*$")
# (?<!=): a search does not restart inside a run of '=' (quadratic on a line of 10^6 of them)
_BANNER = re.compile(r"(?<!=)=+ Serving Benchmark Result =")
_NS_PAIR = re.compile(
    r"\b(request_rate|max_concurrency|num_prompts|burstiness|dataset_name|goodput|model|backend|label|save_detailed)=('[^']*'|\[[^\]]*\]|[^,)\s]+)"
)
INT_COLS = {"completed", "failed", "max_concurrency", "num_prompts", "max_concurrent_requests"}


def _float(v: Any) -> float | None:
    """A number as the result wrote it; 'inf'/Infinity kept (request rates), NaN and non-numbers None."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v) if isinstance(v, (int, float)) else float(str(v).strip().strip("'"))  # 'inf' -> inf
    except (ValueError, OverflowError):
        return None
    return None if math.isnan(f) else f


def _finite(v: Any) -> float | None:
    f = _float(v)
    return f if f is not None and math.isfinite(f) and abs(f) < 1e300 else None


def _int(v: Any, limit: int = 2**31 - 1) -> int | None:
    """A count; None when it is not a finite number within the column's range (a bad value is not a crash)."""
    f = _float(v)
    return int(f) if f is not None and math.isfinite(f) and abs(f) <= limit else None


def _text(v: Any) -> str | None:
    return None if v is None else str(v)[:200]


def _json_runs(text: str) -> list[dict[str, Any]] | None:
    """The result objects of a JSON file (one, or several with --append-result); None when not JSON."""
    dec = json.JSONDecoder()
    runs, i = [], re.match(r"\s*", text).end()  # not text.strip(): a copy of a 64 MiB result
    while i < len(text):
        try:
            obj, end = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            return runs if runs else None
        except RecursionError:
            raise ValueError("JSON nested too deeply") from None
        if isinstance(obj, list):
            runs.extend(o for o in obj if isinstance(o, dict))
        elif isinstance(obj, dict):
            runs.append(obj)
        i = end
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
    return runs


def _one_json_document(raw: bytes) -> list[dict[str, Any]] | None:
    """The result objects of a file that is one JSON document (the usual --save-result), decoded from its bytes by
    orjson (no text copy of a file of a million requests, a third of the stdlib's objects' time); None for anything
    else (JSON Lines, several results, NaN or Infinity, integers beyond 64 bits, text that is not UTF-8), which
    `_json_runs` reads."""
    head = raw[:64].lstrip()
    if not head.startswith((b"{", b"[")):
        return None
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None
    if isinstance(doc, dict):
        return [doc]
    if isinstance(doc, list) and any(isinstance(o, dict) for o in doc):
        return [o for o in doc if isinstance(o, dict)]
    return None


def _requests(order: int, run: int, d: dict[str, Any]) -> dict[str, list[Any]]:
    """The per-request columns of one result (REQUESTS_SCHEMA; empty lists when it has no `ttfts`). Columns, not a
    dict per request: a result of a million requests holds a few lists, not a million dicts (GBs)."""
    cols: dict[str, list[Any]] = {f.name: [] for f in REQUESTS_SCHEMA}
    ttfts = d.get("ttfts")
    if not isinstance(ttfts, list):
        return cols
    n = len(ttfts)

    def col(key):
        v = d.get(key)
        return v if isinstance(v, list) and len(v) == n else [None] * n

    ins, outs, itls, errs, starts = (
        col("input_lens"),
        col("output_lens"),
        col("itls"),
        col("errors"),
        col("start_times"),
    )
    e2e_key = next((k for k in ("e2els", "latencies") if isinstance(d.get(k), list) and len(d[k]) == n), None)
    e2es = d[e2e_key] if e2e_key else [None] * n
    has_errors = "errors" in d
    cols["input_id"] = [order] * n
    cols["run"] = [run] * n
    cols["req"] = list(range(n))
    cols["input_len"] = [_int(x) for x in ins]
    cols["start_s"] = [_finite(x) for x in starts]
    add_out, add_success, add_error = cols["output_len"].append, cols["success"].append, cols["error"].append
    add_ttft, add_e2e, add_source = cols["ttft_s"].append, cols["e2el_s"].append, cols["e2el_source"].append
    add_tpot, add_count, add_max = cols["tpot_s"].append, cols["itl_count"].append, cols["itl_max_s"].append
    add_mean = cols["itl_mean_s"].append
    flat, offsets = array("d"), array("i", [0])  # the gaps of every request: 8 bytes each, not a float object
    for i in range(n):
        gaps = [g for g in (_finite(x) for x in (itls[i] if isinstance(itls[i], list) else [])) if g is not None]
        itls[i] = None  # the decoded list freed as its gaps are made: the document and its columns are not both held
        err = errs[i] if isinstance(errs[i], str) else None
        ttft = _finite(ttfts[i])
        success = not err if errs[i] is not None or has_errors else (ttft or 0) > 0
        e2e, source = _finite(e2es[i]), e2e_key
        if e2e is None and success and ttft is not None:
            e2e, source = ttft + sum(gaps), "ttft+sum(itl)"
        out = _int(outs[i])
        tpot = (
            (e2e - ttft) / (out - 1) if success and out and out > 1 and e2e is not None and ttft is not None else None
        )
        add_out(out)
        add_success(success)
        add_error(err)
        add_ttft(ttft if success else None)
        add_e2e(e2e if success else None)
        add_source(source if success else None)
        add_tpot(tpot)
        add_count(len(gaps))
        add_max(max(gaps) if gaps else None)
        add_mean(sum(gaps) / len(gaps) if gaps else None)
        flat.extend(gaps)
        offsets.append(len(flat))
    values = pa.array(np.frombuffer(flat, dtype=np.float64)) if flat else pa.array([], pa.float64())
    cols["itls_s"] = [pa.ListArray.from_arrays(pa.array(np.frombuffer(offsets, dtype=np.int32)), values)]
    return cols


def _latency_rows(order: int, run: int, items: list[tuple[str, str, float | None, float]]) -> list[dict[str, Any]]:
    return [
        {"input_id": order, "run": run, "metric": m, "stat": s, "percentile": p, "value_ms": v} for m, s, p, v in items
    ]


def _from_json(order: int, runs: list[dict[str, Any]], path: Path):
    run_rows, lat_rows = [], []
    req_cols: dict[str, list[Any]] = {f.name: [] for f in REQUESTS_SCHEMA}
    for r, d in enumerate(runs):
        if "completed" not in d or not any(k in d for k in ("duration", "request_throughput")):
            raise InputError(
                path,
                "not a `vllm bench serve` result: the JSON has no 'completed' and 'duration'/'request_throughput' keys",
            )
        row: dict[str, Any] = {"input_id": order, "run": r}
        for key, colname in SUMMARY_KEYS.items():
            if key in d:
                row[colname] = (
                    _int(d[key], 2**62 if colname.startswith("total_") else 2**31 - 1)
                    if colname in INT_COLS or (colname.startswith("total_") and colname.endswith("_tokens"))
                    else (str(d[key])[:200] if colname in ("date", "model_id") else _finite(d[key]))
                )
        row["request_rate_rps"] = _float(d.get("request_rate"))
        row["backend"] = _text(d.get("backend") or d.get("endpoint_type"))
        row["tag"] = _text(d.get("label") or d.get("tag"))
        row["dataset_name"] = _text(d.get("dataset_name"))
        reqs = _requests(order, r, d)
        row["has_requests"] = bool(reqs["req"])
        row["source"] = "result json with per-request detail" if reqs["req"] else "result json, summary only"
        if row.get("failed") is None:
            if isinstance(d.get("errors"), list):
                row["failed"] = sum(1 for e in d["errors"] if e)
            elif row.get("num_prompts") is not None and row.get("completed") is not None:
                row["failed"] = max(0, row["num_prompts"] - row["completed"])
        lat = []
        for key, v in d.items():
            m = _STAT_KEY.match(key)
            if m and _finite(v) is not None:
                metric = _METRIC_ALIAS.get(m["metric"], m["metric"])
                lat.append(
                    (
                        metric,
                        m["stat"],
                        float(m["p"]) if m["p"] else (50.0 if m["stat"] == "median" else None),
                        _finite(v),
                    )
                )
        lat_rows += _latency_rows(order, r, lat)
        for name, values in reqs.items():
            req_cols[name] += values
        del reqs
        known = (
            set(SUMMARY_KEYS)
            | set(PER_REQUEST)
            | {"request_rate", "backend", "endpoint_type", "label", "tag", "e2els", "latencies"}
        )
        meta = {k: v for k, v in d.items() if k not in known and not _STAT_KEY.match(k) and not isinstance(v, list)}
        row["meta_json"] = json.dumps(meta, default=str)
        run_rows.append(row)
    return run_rows, lat_rows, req_cols


def _namespace(line: str) -> dict[str, str]:
    return {k: v.strip("'") for k, v in _NS_PAIR.findall(line)}


def _from_table(order: int, text: str, path: Path):
    lines = text.replace("\r", "\n").split("\n")
    run_rows, lat_rows = [], []
    args: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("Namespace(") or "Namespace(" in line[:40]:
            args = _namespace(line)
        if _BANNER.search(line):
            r = len(run_rows)
            row: dict[str, Any] = {
                "input_id": order,
                "run": r,
                "source": "result table (stdout), summary only",
                "has_requests": False,
            }
            lat = []
            i += 1
            while i < len(lines) and not re.fullmatch(r"=+", lines[i].strip()):
                s = lines[i].strip()
                lm = _TABLE_LAT.match(s)
                if lm:
                    stat = lm["stat"].lower()
                    pct = float(lm["p"]) if lm["p"] else (50.0 if stat == "median" else None)
                    metric = "e2el" if lm["metric"] == "E2E Latency" else lm["metric"].lower()
                    lat.append((metric, stat, 100.0 if stat == "max" else pct, _float(lm["v"])))
                else:
                    tm = _TABLE_ROW.match(s)
                    if tm and tm["label"].strip().lower() in _TABLE_ROWS:
                        colname = _TABLE_ROWS[tm["label"].strip().lower()]
                        row[colname] = _int(tm["v"]) if colname in INT_COLS else _float(tm["v"])
                i += 1
            for key, colname in (("request_rate", "request_rate_rps"), ("burstiness", "burstiness")):
                if key in args and row.get(colname) is None:
                    row[colname] = _float(args[key])
            for key in ("max_concurrency", "num_prompts"):
                if key in args and row.get(key) is None:
                    row[key] = _int(args[key])
            row["dataset_name"] = args.get("dataset_name")
            row["model_id"] = args.get("model")
            row["backend"] = args.get("backend")
            if args.get("goodput") not in (None, "None"):
                pairs = re.findall(r"\b(\w{1,64}):([\d.]+)", args["goodput"])  # \b, bounded: linear
                row["goodput_json"] = json.dumps({k: float(v) for k, v in pairs})
            row["meta_json"] = json.dumps({"namespace": args} if args else {})
            run_rows.append(row)
            lat_rows += _latency_rows(order, r, [x for x in lat if x[3] is not None])
        i += 1
    if not run_rows:
        first = next((t.strip() for t in lines if t.strip()), "")
        from tracediag.ingest.unrecognised import file_text, not_a_record  # content-free: no byte of the file

        first_no = next((i for i, t in enumerate(lines, 1) if t.strip()), None)
        raise InputError(
            path,
            "not a `vllm bench serve` result: neither result JSON nor a 'Serving Benchmark Result' table"
            + (f" ({file_text(path, len(lines))}; {not_a_record('a result line', first_no, first)})" if first
               else " (empty file)"),
        )  # fmt: skip
    return run_rows, lat_rows


def _rate_text(v: float | None) -> float | str | None:
    return "inf" if v is not None and math.isinf(v) else v


def parse_vllm_bench(path: Path, order: int, options: IngestOptions) -> Parsed:
    return parse_bench(path, order, "vllm-bench", options.memory_limit)


TOOL_NAMES = {"vllm-bench": "vllm bench serve", "sglang-bench": "sglang.bench_serving"}


def parse_bench(path: Path, order: int, fmt: str, limit: int | None = None) -> Parsed:
    """A benchmark client's result file; `fmt` is 'vllm-bench' or 'sglang-bench' (same tables); read within the
    memory budget `limit` (tracediag.memory)."""
    raw = read_input(path, "benchmark result", limit)
    _check_fits(path, raw, limit)
    runs = _one_json_document(raw)
    text = raw.decode("utf-8", errors="replace") if runs is None else ""
    del raw
    try:
        if runs is None:
            runs = _json_runs(text) if text.lstrip().startswith(("{", "[")) else None
    except ValueError as exc:
        raise InputError(path, f"not a benchmark result: {exc}") from None
    if runs is not None:
        if not runs:
            raise InputError(path, "not a `vllm bench serve` result: the JSON holds no result object")
        del text
        run_rows, lat_rows, req_cols = _from_json(order, runs, path)
        del runs
    else:
        run_rows, lat_rows = _from_table(order, text, path)
        req_cols = {f.name: [] for f in REQUESTS_SCHEMA}
    n_requests = len(req_cols["req"])
    meta = {
        "runs": len(run_rows),
        "source": run_rows[0]["source"],
        "requests": n_requests,
        "request_rates": [_rate_text(r.get("request_rate_rps")) for r in run_rows],
    }
    bad = BadRecords()
    tables = {
        "bench_runs": _table(run_rows, RUNS_SCHEMA, Checker(bad, "bench_runs")),
        "bench_latency": _table(lat_rows, LATENCY_SCHEMA, Checker(bad, "bench_latency")),
        "bench_requests": _columns_table(req_cols, REQUESTS_SCHEMA, Checker(bad, "bench_requests")),
    }
    if bad:
        meta["bad_records"] = bad.to_meta()
    row = {
        "rank": None,
        "profiler": f"{TOOL_NAMES[fmt]} ({run_rows[0]['source']})",
        "file_bytes": path.stat().st_size,
        "events_total": n_requests or len(run_rows),
        "meta_json": json.dumps(meta, default=str),
        "bad_records": bad.records,
    }
    return Parsed(path=str(path), format=fmt, inputs_rows=[row], tables=tables)


# Peak bytes of a result's parse: BYTES_PER_VALUE per JSON value (per ',', '[' or '{' of its text: a decoded float
# and its list slot, its share of the per-request columns) plus BYTES_PER_BYTE per byte (the text, the strings
# decoded from it: generated_texts). Fitted on two 60 MB --save-detailed results, one of 135,780 requests (3.4 M
# values, 17 B of JSON each: 287 MiB above the interpreter's) and one of 2,400 requests with dense one-digit itls (30
# M values, 2 B each: 802 MiB): 19.4 B a value and 3.7 B a byte; rounded up for room. A real result's values are long
# numbers (17-22 B), so one within the read budget (1/CHUNK_FACTOR of the limit) is estimated at 0.7 of the limit at
# most; only dense short values go beyond it.
BYTES_PER_VALUE = 32
BYTES_PER_BYTE = 4


def _check_fits(path: Path, raw: bytes, limit: int | None) -> None:
    """InputError when the result, decoded, would take more than the memory budget: the read budget bounds its bytes,
    but `[0,0,0,…]` is a Python object every 2 bytes (a 60 MB result of dense itls took 1.9 GB at 512 MiB)."""
    values = raw.count(b",") + raw.count(b"[") + raw.count(b"{")  # commas in strings too: an upper bound
    need = values * BYTES_PER_VALUE + len(raw) * BYTES_PER_BYTE
    budget = memory_limit(limit)
    if need > budget:
        raise InputError(
            path,
            f"benchmark result holds about {values:,} JSON values, which take about {size_text(need)} in memory, more "
            f"than --memory-limit {size_text(budget)}; raise --memory-limit to read it "
            f"(e.g. --memory-limit {-(-need // (1 << 30))}GiB)",
        )


def _table(rows: list[dict[str, Any]], schema: pa.Schema, check: Checker) -> pa.Table:
    """Rows -> a table of `schema` (`_columns_table`)."""
    return _columns_table({f.name: [r.get(f.name) for r in rows] for f in schema}, schema, check)


def _columns_table(cols: dict[str, list[Any]], schema: pa.Schema, check: Checker) -> pa.Table:
    """Columns -> a table of `schema`; integer columns through the validation layer (a count of inf or 1e30 in the
    result table is NULL and counted), text that is not UTF-8 (a lone \\ud800 escape in the JSON) with U+FFFD."""
    arrays = []
    for f in schema:
        values = cols[f.name]
        if pa.types.is_integer(f.type):
            arrays.append(check.ints(f.name, values, f.type))
        elif pa.types.is_string(f.type):
            arrays.append(pa.array(check.str_values(f.name, values), pa.string()))
        elif values and isinstance(values[0], pa.Array):  # chunks made by `_requests`
            arrays.append(pa.chunked_array(values, f.type))
        else:
            arrays.append(pa.array(values, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)
