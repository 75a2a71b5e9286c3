"""AIPerf (NVIDIA's load generator, the successor of GenAI-Perf) `profile_export_aiperf.json`: the aggregated
statistics of one `aiperf profile` run, into the same tables as `vllm bench serve` results (ingest/vllm_bench.py),
so that SCH002, SCH009, SCH010 and SCH012 read it like any benchmark summary.

Layout, as AIPerf writes it (src/aiperf/exporters/metrics_json_exporter.py, the JsonExportData and JsonMetricResult
models of src/aiperf/common/models/export_models.py): one object per metric tag with `unit` and the statistics
`avg`, `min`, `max`, `p1` … `p99`, `std` (a count metric such as request_count has only `avg`); beside them
`input_config` (the user configuration: `endpoint.model_names`, `endpoint.type`, `loadgen.concurrency`,
`loadgen.request_rate`, `loadgen.request_rate_mode`, `loadgen.request_count`, `loadgen.request_cancellation_rate`),
`error_summary` ([{error_details: {code, type, message}, count}]), `start_time`, `end_time`, and since schema 1.0
`schema_version` and `aiperf_version`. Earlier releases nested the metrics under `records`, each also carrying
its `tag`, `header` and `count` (ai-dynamo/aiperf examples/artifacts/run1, 2025-10). Tags differ across releases
too: `ttft` / `time_to_first_token`, `ttst` / `time_to_second_token`.

Meanings (docs/metrics_reference.md): `time_to_first_token`; `inter_token_latency` is per request
(request_latency − TTFT) / (output_sequence_length − 1), i.e. vLLM's TPOT; `inter_chunk_latency` is every gap
between streamed chunks, i.e. vLLM's ITL; `request_latency` is the end-to-end latency; `request_count` counts the
valid requests and `error_request_count` the failed ones. A cancellation AIPerf made on purpose
(`--request-cancellation-rate`, errors of type RequestCancellationError) is not a failure of the server: such
requests are counted apart (`cancelled_by_client` in the run's meta), not in `failed`. The per-request export
(`profile_export.jsonl`) is not read yet: SCH002's per-request stalls need it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import orjson

from tracediag.errors import InputError
from tracediag.ingest.base import IngestOptions, Parsed
from tracediag.ingest.validate import BadRecords, Checker
from tracediag.ingest.vllm_bench import LATENCY_SCHEMA, REQUESTS_SCHEMA, RUNS_SCHEMA, _columns_table, _table
from tracediag.inputfile import read_input

# AIPerf metric tag -> the bench_latency metric it is (the aliases are earlier releases' tags)
LATENCY_TAGS = {
    "time_to_first_token": "ttft",
    "ttft": "ttft",
    "inter_token_latency": "tpot",  # per request: (latency − TTFT) / (OSL − 1)
    "inter_chunk_latency": "itl",  # per streamed chunk, as vLLM's and SGLang's clients time ITL
    "request_latency": "e2el",
}
TO_MS = {"ms": 1.0, "sec": 1000.0, "s": 1000.0, "us": 1e-3, "ns": 1e-6}
CANCELLED = "RequestCancellationError"  # the error type of AIPerf's own --request-cancellation-rate


def _num(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    f = float(v)
    return f if math.isfinite(f) and abs(f) < 1e300 else None


def _count(v: Any) -> int | None:
    f = _num(v)
    return int(f) if f is not None and 0 <= f < 2**31 else None


def _metrics(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """tag -> {unit, avg, p50, …}: the top-level metric objects, or those under `records`."""
    src = doc.get("records") if isinstance(doc.get("records"), dict) else doc
    return {k: v for k, v in src.items() if isinstance(v, dict) and isinstance(v.get("unit"), str)}


def _value(metrics: dict[str, dict[str, Any]], tag: str, stat: str = "avg") -> float | None:
    m = metrics.get(tag)
    return _num(m.get(stat)) if m else None


def _seconds(metrics: dict[str, dict[str, Any]], tag: str) -> float | None:
    m = metrics.get(tag)
    v = _value(metrics, tag)
    scale = TO_MS.get(m.get("unit", "")) if m else None
    return v * scale / 1000 if v is not None and scale is not None else None


def _latency_rows(order: int, metrics: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    rows = []
    for tag, metric in LATENCY_TAGS.items():
        m = metrics.get(tag)
        scale = TO_MS.get(m.get("unit", "")) if m else None
        if scale is None:
            continue
        for key, v in m.items():
            value = _num(v)
            if value is None:
                continue
            if key == "avg":
                stat, p = "mean", None
            elif key == "std":
                stat, p = "std", None
            elif key in ("min", "max"):
                stat, p = key, None
            elif key.startswith("p") and key[1:].isdigit():
                stat, p = ("median" if key == "p50" else key), float(key[1:])
            else:
                continue  # adj_p99 (failures as unbounded latency), count, tag, header
            rows.append({"input_id": order, "run": 0, "metric": metric, "stat": stat, "percentile": p,
                         "value_ms": value * scale})  # fmt: skip
    return rows


def _errors(doc: dict[str, Any]) -> tuple[int, int]:
    """(failed, cancelled by the client on purpose) from `error_summary`."""
    failed = cancelled = 0
    for e in doc.get("error_summary") or []:
        if not isinstance(e, dict):
            continue
        n = _count(e.get("count")) or 0
        kind = (e.get("error_details") or {}).get("type") if isinstance(e.get("error_details"), dict) else None
        if kind == CANCELLED:
            cancelled += n
        else:
            failed += n
    return failed, cancelled


def parse_aiperf(path: Path, order: int, options: IngestOptions) -> Parsed:
    raw = read_input(path, "AIPerf export", options.memory_limit)
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InputError(path, f"not an AIPerf export: invalid JSON ({exc})") from None
    del raw
    if not isinstance(doc, dict):
        raise InputError(path, "not an AIPerf export: the JSON is not an object")
    metrics = _metrics(doc)
    if "request_count" not in metrics and not any(t in metrics for t in LATENCY_TAGS):
        raise InputError(
            path, "not an AIPerf export: no request_count and no latency metric (profile_export_aiperf.json)"
        )
    cfg = doc.get("input_config") if isinstance(doc.get("input_config"), dict) else {}
    endpoint = cfg.get("endpoint") if isinstance(cfg.get("endpoint"), dict) else {}
    loadgen = cfg.get("loadgen") if isinstance(cfg.get("loadgen"), dict) else {}
    names = endpoint.get("model_names") if isinstance(endpoint.get("model_names"), list) else []
    failed, cancelled = _errors(doc)
    errors_metric = _count(_value(metrics, "error_request_count"))
    if errors_metric is not None and not doc.get("error_summary"):
        failed = errors_metric  # counted, but not described: every error counts as a failure
    rate = _num(loadgen.get("request_rate"))
    mode = loadgen.get("request_rate_mode") if isinstance(loadgen.get("request_rate_mode"), str) else None
    if rate is None and mode == "concurrency_burst":
        rate = math.inf  # every request is issued as soon as a concurrency slot frees: no arrival rate
    run = {
        "input_id": order,
        "run": 0,
        "source": "AIPerf profile export json, summary only",
        "date": str(doc.get("start_time"))[:200] if doc.get("start_time") else None,
        "backend": str(endpoint.get("type"))[:200] if endpoint.get("type") else None,
        "model_id": str(names[0])[:200] if names else None,
        "num_prompts": _count(loadgen.get("request_count")),
        "request_rate_rps": rate,
        "max_concurrency": _count(loadgen.get("concurrency")),
        "duration_s": _seconds(metrics, "benchmark_duration"),
        "completed": _count(_value(metrics, "request_count")),
        "failed": failed,
        "total_input_tokens": _count(_value(metrics, "total_isl")),
        "total_output_tokens": _count(_value(metrics, "total_osl")),
        "request_throughput_rps": _value(metrics, "request_throughput"),
        "request_goodput_rps": _value(metrics, "goodput"),
        "output_tput_tok_s": _value(metrics, "output_token_throughput"),
        "has_requests": False,
        "meta_json": json.dumps(
            {
                "aiperf_version": doc.get("aiperf_version"),
                "schema_version": doc.get("schema_version"),
                "request_rate_mode": mode,
                "request_cancellation_rate": _num(loadgen.get("request_cancellation_rate")),
                "cancelled_by_client": cancelled,
                "was_cancelled": doc.get("was_cancelled"),
                "cli_command": str(cfg.get("cli_command"))[:500] if cfg.get("cli_command") else None,
                "end_time": doc.get("end_time"),
            },
            default=str,
        ),
    }
    lat = _latency_rows(order, metrics)
    bad = BadRecords()
    tables = {
        "bench_runs": _table([run], RUNS_SCHEMA, Checker(bad, "bench_runs")),
        "bench_latency": _table(lat, LATENCY_SCHEMA, Checker(bad, "bench_latency")),
        "bench_requests": _columns_table(
            {f.name: [] for f in REQUESTS_SCHEMA}, REQUESTS_SCHEMA, Checker(bad, "bench_requests")
        ),
    }
    meta = {"runs": 1, "source": run["source"], "requests": 0, "aiperf_version": doc.get("aiperf_version")}
    if bad:
        meta["bad_records"] = bad.to_meta()
    row = {
        "rank": None,
        "profiler": f"AIPerf ({run['source'].removeprefix('AIPerf ')})",
        "file_bytes": path.stat().st_size,
        "events_total": 1,
        "meta_json": json.dumps(meta, default=str),
        "bad_records": bad.records,
    }
    return Parsed(path=str(path), format="aiperf", inputs_rows=[row], tables=tables)
