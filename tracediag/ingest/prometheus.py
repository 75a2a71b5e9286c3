"""vLLM `/metrics` (Prometheus text exposition): one scrape or a file of many timestamped scrapes.

Parsed with prometheus_client's text parser (`text_string_to_metric_families`). Each scrape becomes rows of
`metric_samples` with the sample's labels, its part (value / bucket / sum / count / created) and a
canonical name that is the same across vLLM versions (e.g. `vllm:gpu_cache_usage_perc` and
`vllm:kv_cache_usage_perc` are both `kv_usage`; `vllm:time_per_output_token_seconds` and
`vllm:inter_token_latency_seconds` are both `itl_seconds`).

Scrapes in one file are separated by `tracediag scrape` marker comments (`# tracediag-scrape seq=N
unix_ms=T url=U`), or, without markers (`curl …/metrics` before and after a run, pasted into one file), by a
`# HELP`/`# TYPE` line of a family the current scrape already had, a sample (name and labels) the current scrape
already had, or a pasted shell prompt (`$ curl …`) after samples. A sample's own timestamp (ms, exposition
format) wins over the marker's. Untimed scrapes keep their order: counters are differenced between consecutive
scrapes by the rules (tracediag/analyses/serving.py counter_windows), whatever the clock. Lines the parser rejects
are counted and reported in the input's meta (`malformed_lines`, first examples), never fatal; a file
with no valid sample at all is an input error.

Metric names: vllm/v1/metrics/loggers.py (PrometheusStatLogger), vllm/v1/spec_decode/metrics.py
(SpecDecodingProm), vllm/engine/metrics.py (V0 Metrics), checked against the real scrapes in
tests/data/external/vllm/metrics/.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
from prometheus_client.parser import text_string_to_metric_families

from tracediag.errors import InputError
from tracediag.ingest.base import IngestOptions, Parsed, read_gunzipped
from tracediag.ingest.validate import BadRecords
from tracediag.inputfile import size_text
from tracediag.memory import memory_limit

# metric family (without _total/_bucket/_sum/_count/_created) -> (canonical name, rank: 0 current, 1 deprecated)
CANONICAL: dict[str, tuple[str, int]] = {
    "vllm:num_requests_running": ("requests_running", 0),
    "vllm:num_requests_waiting": ("requests_waiting", 0),
    "vllm:num_requests_swapped": ("requests_swapped", 0),  # V0
    "vllm:kv_cache_usage_perc": ("kv_usage", 0),  # fraction 0-1 despite the name
    "vllm:gpu_cache_usage_perc": ("kv_usage", 1),  # V0 and V1 before 0.10
    "vllm:cpu_cache_usage_perc": ("cpu_kv_usage", 0),  # V0
    "vllm:num_preemptions": ("preemptions", 0),
    "vllm:prefix_cache_queries": ("prefix_cache_queries", 0),  # tokens
    "vllm:gpu_prefix_cache_queries": ("prefix_cache_queries", 1),  # early V1 documented it in blocks
    "vllm:prefix_cache_hits": ("prefix_cache_hits", 0),
    "vllm:gpu_prefix_cache_hits": ("prefix_cache_hits", 1),
    "vllm:gpu_prefix_cache_hit_rate": ("prefix_cache_hit_rate", 0),  # V0 gauge, fraction
    "vllm:cpu_prefix_cache_hit_rate": ("cpu_prefix_cache_hit_rate", 0),
    "vllm:external_prefix_cache_queries": ("external_prefix_cache_queries", 0),
    "vllm:external_prefix_cache_hits": ("external_prefix_cache_hits", 0),
    "vllm:mm_cache_queries": ("mm_cache_queries", 0),
    "vllm:mm_cache_hits": ("mm_cache_hits", 0),
    "vllm:prompt_tokens": ("prompt_tokens", 0),
    "vllm:generation_tokens": ("generation_tokens", 0),
    "vllm:request_success": ("request_success", 0),
    "vllm:time_to_first_token_seconds": ("ttft_seconds", 0),
    "vllm:inter_token_latency_seconds": ("itl_seconds", 0),
    "vllm:time_per_output_token_seconds": ("itl_seconds", 1),  # deprecated in 0.11 for the name above
    "vllm:request_time_per_output_token_seconds": ("request_tpot_seconds", 0),
    "vllm:e2e_request_latency_seconds": ("e2e_latency_seconds", 0),
    "vllm:request_queue_time_seconds": ("queue_time_seconds", 0),
    "vllm:time_in_queue_requests": ("queue_time_seconds", 1),  # V0 duplicate
    "vllm:request_prefill_time_seconds": ("prefill_time_seconds", 0),
    "vllm:request_decode_time_seconds": ("decode_time_seconds", 0),
    "vllm:request_inference_time_seconds": ("inference_time_seconds", 0),
    "vllm:request_prompt_tokens": ("request_prompt_tokens", 0),
    "vllm:request_generation_tokens": ("request_generation_tokens", 0),
    "vllm:request_max_num_generation_tokens": ("request_max_generation_tokens", 0),
    "vllm:request_params_n": ("request_params_n", 0),
    "vllm:request_params_max_tokens": ("request_params_max_tokens", 0),
    "vllm:iteration_tokens_total": ("iteration_tokens", 0),  # a histogram whose name ends in _total
    "vllm:iteration_tokens": ("iteration_tokens", 0),
    "vllm:spec_decode_num_drafts": ("spec_drafts", 0),
    "vllm:spec_decode_num_draft_tokens": ("spec_draft_tokens", 0),
    "vllm:spec_decode_num_accepted_tokens": ("spec_accepted_tokens", 0),
    "vllm:spec_decode_num_accepted_tokens_per_pos": ("spec_accepted_tokens_per_pos", 0),  # label position
    "vllm:spec_decode_num_emitted_tokens": ("spec_emitted_tokens", 0),  # V0
    "vllm:spec_decode_draft_acceptance_rate": ("spec_acceptance_rate", 0),  # V0 gauge
    "vllm:spec_decode_efficiency": ("spec_efficiency", 0),  # V0 gauge
    "vllm:cache_config_info": ("cache_config_info", 0),  # labels block_size, num_gpu_blocks, ...
    "vllm:avg_prompt_throughput_toks_per_s": ("prompt_tput_tok_s", 0),  # V0
    "vllm:avg_generation_throughput_toks_per_s": ("gen_tput_tok_s", 0),  # V0
    "process_start_time_seconds": ("process_start_time", 0),
    # KV connectors: NIXL (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py NixlPromMetrics) and LMCache
    # (lmcache/observability.py): transfer and load time per operation, seconds
    "vllm:nixl_xfer_time_seconds": ("kv_transfer_seconds", 0),
    "vllm:nixl_post_time_seconds": ("kv_transfer_post_seconds", 0),
    "vllm:nixl_num_failed_transfers": ("kv_transfer_failed", 0),
    "lmcache:time_to_retrieve": ("kv_load_seconds", 0),
    "lmcache:time_to_store": ("kv_store_seconds", 0),
    # SGLang (python/sglang/srt/metrics/collector.py; older names from its docs/references/production_metrics.md)
    "sglang:num_running_reqs": ("requests_running", 0),
    "sglang:num_requests_running": ("requests_running", 1),
    "sglang:num_queue_reqs": ("requests_waiting", 0),
    "sglang:num_requests_waiting": ("requests_waiting", 1),
    "sglang:token_usage": ("kv_usage", 0),  # fraction 0-1 of max_total_num_tokens
    "sglang:num_used_tokens": ("kv_used_tokens", 0),
    "sglang:max_total_num_tokens": ("kv_capacity_tokens", 0),
    "sglang:cache_hit_rate": ("prefix_cache_hit_rate", 0),  # fraction 0-1 (percent in the oldest docs)
    "sglang:gen_throughput": ("gen_tput_tok_s", 0),
    "sglang:spec_accept_length": ("spec_accept_length", 0),
    "sglang:spec_accept_rate": ("spec_acceptance_rate", 0),
    "sglang:num_retracted_reqs": ("retracted_requests", 0),  # gauge: retracted in the last interval
    "sglang:num_retracted_requests": ("preemptions", 0),  # counter: a retraction is SGLang's preemption
    "sglang:prompt_tokens": ("prompt_tokens", 0),
    "sglang:generation_tokens": ("generation_tokens", 0),
    "sglang:cached_tokens": ("cached_tokens", 0),
    "sglang:num_requests": ("request_success", 0),  # finished requests
    "sglang:num_aborted_requests": ("request_aborted", 0),
    "sglang:time_to_first_token_seconds": ("ttft_seconds", 0),
    "sglang:inter_token_latency_seconds": ("itl_seconds", 0),
    "sglang:time_per_output_token_seconds": ("itl_seconds", 1),
    "sglang:e2e_request_latency_seconds": ("e2e_latency_seconds", 0),
    "sglang:queue_time_seconds": ("queue_time_seconds", 0),
    "sglang:waiting_request_latency_seconds": ("queue_time_seconds", 1),
    "sglang:per_stage_req_latency_seconds": ("stage_latency_seconds", 0),  # label stage (prefill_forward, ...)
    "sglang:kv_transfer_latency_ms": ("kv_transfer_latency_ms", 0),  # gauge, PD disaggregation
}
# Families exposed as histograms (for samples of files without # TYPE lines).
HISTOGRAMS = {
    f
    for f, (c, _) in CANONICAL.items()
    if c.endswith("_seconds") or (c.startswith("request_") and c != "request_success") or c == "iteration_tokens"
}

MARKER = "# tracediag-scrape"  # written by `tracediag scrape` before each scrape
_MARKER_RE = re.compile(r"^#\s*tracediag-scrape\b(?P<rest>.*)$")
_KV_RE = re.compile(r"\b(\w{1,64})=(\S+)")  # \b and a bounded key: linear on a 1 MiB marker line
_DIRECTIVE_RE = re.compile(r"^#\s*(HELP|TYPE)\s+(\S+)")
# a sample's identity: its name and label set, up to the value (quoted label values may hold `}` and spaces)
_SAMPLE_KEY_RE = re.compile(r'\s*[^\s{#]+(?:\{(?:[^"}]|"(?:[^"\\]|\\.)*")*\})?')
MAX_EXAMPLES = 5

SCHEMA = pa.schema(
    [
        ("input_id", pa.int32()),
        ("scrape", pa.int32()),
        ("ts_ns", pa.int64()),
        ("t_s", pa.float64()),
        ("line", pa.int32()),
        ("name", pa.string()),
        ("family", pa.string()),
        ("canonical", pa.string()),
        ("name_rank", pa.int16()),
        ("preferred", pa.bool_()),
        ("type", pa.string()),
        ("part", pa.string()),
        ("le", pa.float64()),
        ("quantile", pa.float64()),
        ("model_name", pa.string()),
        ("engine", pa.string()),
        ("labels_json", pa.string()),
        ("value", pa.float64()),
    ]
)


def _read_text(path: Path, limit: int | None) -> str:
    return read_gunzipped(path, "metrics file", limit).decode("utf-8", errors="replace")


def _split_scrapes(
    lines: list[str], prompts: set[int] = frozenset()
) -> list[tuple[dict[str, str], list[tuple[int, str]]]]:
    """[(marker fields, [(line number, text)])]: one entry per scrape. `prompts`: 0-based indices of pasted shell
    prompt lines (`$ curl …`), a boundary when the current scrape already has samples."""
    scrapes: list[tuple[dict[str, str], list[tuple[int, str]]]] = []
    cur: list[tuple[int, str]] = []
    marker: dict[str, str] = {}
    seen: set[str] = set()
    samples: set[str] = set()  # name{labels} of the current scrape's samples

    def flush():
        if cur:
            scrapes.append((marker, list(cur)))

    for i, line in enumerate(lines, start=1):
        stripped = line.strip()
        m = _MARKER_RE.match(stripped)
        if m:
            flush()
            cur, seen, samples = [], set(), set()
            marker = dict(_KV_RE.findall(m["rest"]))
            continue
        if i - 1 in prompts and samples:  # `$ curl …/metrics` again: the next scrape
            flush()
            cur, seen, samples, marker = [], set(), set(), {}
            continue
        d = _DIRECTIVE_RE.match(stripped)
        new_scrape = False
        if d:
            key = f"{d[1]} {d[2]}"
            new_scrape = key in seen and bool(samples)  # the same family again: a new scrape without a marker
        elif stripped and not stripped.startswith("#"):
            k = _SAMPLE_KEY_RE.match(stripped)
            key = k[0] if k else stripped
            new_scrape = key in samples  # the same sample again (scrapes pasted without # HELP lines)
        if new_scrape:
            flush()
            cur, seen, samples, marker = [], set(), set(), {}
        if d:
            seen.add(key)
        elif stripped and not stripped.startswith("#"):
            samples.add(key)
        cur.append((i, line))
    flush()
    return scrapes


def _families(text: str):
    return list(text_string_to_metric_families(text))


def _parse_scrape(block: list[tuple[int, str]], malformed: list[tuple[int, str]], bad: BadRecords):
    """[(line, family type, sample)] for one scrape; rejected lines go to `malformed`, and those with a number no
    float holds (which the parser's own arithmetic overflows on) are also bad records of `bad`."""
    sample_lines = [n for n, t in block if t.strip() and not t.lstrip().startswith("#")]
    try:
        fams = _families("\n".join(t for _, t in block) + "\n")
        out = [(f.type, s) for f in fams for s in f.samples]
        if len(out) == len(sample_lines):
            return [(n, typ, s) for n, (typ, s) in zip(sample_lines, out)]
    except (ValueError, OverflowError):  # OverflowError: a timestamp of 400 digits, divided by 1000 by the parser
        pass
    # Line by line, each sample with its family's HELP/TYPE context, so one bad line costs only itself.
    result = []
    context: list[str] = []
    context_name = None
    for n, t in block:
        stripped = t.strip()
        if not stripped:
            continue
        d = _DIRECTIVE_RE.match(stripped)
        if stripped.startswith("#"):
            if not d:
                continue  # plain comment
            try:
                _families(stripped + "\n")
            except (ValueError, OverflowError):
                malformed.append((n, t))
                continue
            if d[2] != context_name:
                context, context_name = [], d[2]
            context.append(stripped)
            continue
        try:
            fams = _families("\n".join([*context, stripped]) + "\n")
            samples = [(f.type, s) for f in fams for s in f.samples]
        except OverflowError:  # a timestamp of 400 digits: the parser divides it by 1000 into a float
            malformed.append((n, f"timestamp is beyond a 64-bit float: {t}"))
            bad.skipped("metric_samples.timestamp", "sample dropped (beyond a 64-bit float)", [stripped])
            continue
        except ValueError:
            malformed.append((n, t))
            continue
        if len(samples) != 1:
            malformed.append((n, t))
            continue
        result.append((n, samples[0][0], samples[0][1]))
    return result


def _part_and_family(name: str, labels: dict[str, str], typ: str) -> tuple[str, str, str]:
    """(part, family, type) of one sample."""
    if name.endswith("_bucket") and "le" in labels:
        return "bucket", name[: -len("_bucket")], "histogram"
    if name.endswith("_created"):
        return "created", name[: -len("_created")], typ
    if "quantile" in labels:
        return "quantile", name, "summary"
    for suffix in ("_sum", "_count"):
        base = name[: -len(suffix)]
        if name.endswith(suffix) and (typ in ("histogram", "summary") or base in HISTOGRAMS):
            return suffix[1:], base, typ if typ in ("histogram", "summary") else "histogram"
    if name.endswith("_total") and name not in CANONICAL:
        return "value", name[: -len("_total")], "counter" if typ in ("untyped", "unknown") else typ
    return "value", name, "untyped" if typ == "unknown" else typ


MAX_TS_S = 9.2e9  # int64 nanoseconds end in 2262


def _ts_ns(ts: Any) -> int | None:
    """Sample or marker time (Unix seconds) -> ns; ValueError for a time no scrape has."""
    if ts is None:
        return None
    try:
        v = float(ts)
    except (TypeError, ValueError, OverflowError):
        raise ValueError("timestamp is not a number") from None
    if not math.isfinite(v) or not 0 <= v < MAX_TS_S:
        raise ValueError(f"timestamp {v:g} s is not a time (NaN, infinite, negative or after 2262)")
    return round(v * 1e9)


def _engine_label(labels: dict[str, str]) -> str | None:
    """vLLM's `engine` label; SGLang's scheduler ranks (dp/tp/pp) as one label: each rank is its own series."""
    if "engine" in labels:
        return labels["engine"]
    ranks = [f"{k[:-5]}{labels[k]}" for k in ("dp_rank", "pp_rank", "tp_rank") if k in labels]
    return "/".join(ranks) or None


def _num(v: str | None) -> float | None:
    if v is None:
        return None
    try:
        return float(v)
    except ValueError:
        return None


# Peak bytes of a scrape file's parse: PARSE_BYTES_PER_LINE a line (the line's text, the parser's sample and label
# objects, the row's column entries) plus PARSE_BYTES_PER_BYTE a byte (the text and its lines). Measured: 1.15 KiB a
# line on 8,662 real scrapes (24 MB, 268,522 lines: 309 MiB above the interpreter's), 1.04 KiB on 10^6 one-sample
# lines (6 MB: 1,041 MiB); the read budget alone (1/CHUNK_FACTOR of the limit) let the second take twice the limit.
PARSE_BYTES_PER_LINE = 1280
PARSE_BYTES_PER_BYTE = 3
# gauges that are fractions 0-1 (engines round: a little over 1 is a full cache, far over it is not a usage)
FRACTION_GAUGES = {"kv_usage", "cpu_kv_usage"}
FRACTION_MAX = 1.005
VALUE_MAX = 1e300  # no engine's metric is this large: ±1e308 is a corrupt sample, not a measurement


def _check_fits(path: Path, text: str, limit: int | None) -> None:
    """InputError when the file's lines, parsed, would take more than the memory budget."""
    lines = text.count("\n") + 1
    need = lines * PARSE_BYTES_PER_LINE + len(text) * PARSE_BYTES_PER_BYTE
    budget = memory_limit(limit)
    if need > budget:
        raise InputError(
            path,
            f"metrics file has {lines:,} lines, which take about {size_text(need)} in memory to parse, more than "
            f"--memory-limit {size_text(budget)}; raise --memory-limit to read it "
            f"(e.g. --memory-limit {-(-need // (1 << 30))}GiB)",
        )


def _bad_value(value: float, canon: str | None, part: str, stype: str) -> str | None:
    """Why a sample's value is not one its metric can have (None when it can). NaN is a quantile's "no observation
    yet" and kept; elsewhere it is bad, as an infinite value, one beyond VALUE_MAX, a usage fraction outside 0-1 and a
    negative count."""
    if math.isnan(value):
        return None if part == "quantile" else "not a number"
    if not abs(value) < VALUE_MAX:
        return "infinite or beyond 1e300"
    if canon in FRACTION_GAUGES and part == "value" and not 0 <= value <= FRACTION_MAX:
        return "a usage fraction outside 0-1"
    if value < 0 and (part in ("bucket", "count") or (stype == "counter" and part == "value")):
        return "a negative count"
    return None


class _Samples:
    """The metric_samples columns of a file, built scrape by scrape, with its malformed lines and bad records."""

    def __init__(self, order: int) -> None:
        self.order = order
        self.cols: dict[str, list[Any]] = {f.name: [] for f in SCHEMA}
        self.malformed: list[tuple[int, str]] = []
        self.bad = BadRecords()
        self.label_json: dict[tuple, str] = {}  # label sets repeat in every scrape: serialise each once

    def add_scrape(self, idx: int, marker: dict[str, str], block: list[tuple[int, str]]) -> int | None:
        """The rows of one scrape; returns the scrape's first sample time (ns), None when untimed."""
        parsed = _parse_scrape(block, self.malformed, self.bad)
        marker_ms = _num(marker.get("unix_ms"))
        if marker_ms is not None and not (math.isfinite(marker_ms) and 0 <= marker_ms < MAX_TS_S * 1000):
            marker_ms = None
        best: dict[tuple, int] = {}  # (canonical, part, le, quantile, labels) -> row of the best-ranked name
        first_ts = None
        for n, typ, s in parsed:
            ts_s = s.timestamp if s.timestamp is not None else (marker_ms / 1000 if marker_ms is not None else None)
            try:
                ts_ns = _ts_ns(ts_s)
            except ValueError as exc:  # NaN, infinite or beyond year 2262: a bad sample, the rest still counts
                self.malformed.append((n, f"{exc}: {s.name}"))
                self.bad.skipped("metric_samples.timestamp", "sample dropped (not a time)", [ts_s])
                continue
            try:
                value = float(s.value)
            except (TypeError, ValueError, OverflowError):  # an integer of 400 digits: no double holds it
                self.malformed.append((n, f"value is beyond a 64-bit float: {s.name}"))
                self.bad.skipped("metric_samples.value", "sample dropped (beyond a 64-bit float)", [s.value])
                continue
            first_ts = first_ts if first_ts is not None else ts_ns
            self._add_row(idx, n, typ, s, ts_ns, value, best)
        return first_ts

    def _add_row(self, idx: int, n: int, typ: str, s: Any, ts_ns: int | None, value: float, best: dict) -> None:
        cols = self.cols
        labels = dict(s.labels)
        part, family, stype = _part_and_family(s.name, labels, typ)
        canon, rank = CANONICAL.get(family, (None, None))
        if canon is None and family.endswith("_total"):
            canon, rank = CANONICAL.get(family[: -len("_total")], (None, None))
        le = _num(labels.get("le")) if part == "bucket" else None
        q = _num(labels.get("quantile")) if part == "quantile" else None
        row = len(cols["name"])
        why = _bad_value(value, canon, part, stype)
        if why is not None:
            self.bad.nulled("metric_samples", "value", [row], [value], f"value set to NULL ({why})")
        lkey = tuple(sorted(labels.items()))
        lj = self.label_json.get(lkey)
        if lj is None:
            lj = self.label_json[lkey] = json.dumps(dict(lkey))
        cols["input_id"].append(self.order)
        cols["scrape"].append(idx)
        cols["ts_ns"].append(ts_ns)
        cols["t_s"].append(None)
        cols["line"].append(n)
        cols["name"].append(s.name)
        cols["family"].append(family)
        cols["canonical"].append(canon)
        cols["name_rank"].append(rank)
        cols["preferred"].append(True)
        cols["type"].append(stype)
        cols["part"].append(part)
        cols["le"].append(le)
        cols["quantile"].append(q)
        cols["model_name"].append(labels.get("model_name"))
        cols["engine"].append(_engine_label(labels))
        cols["labels_json"].append(lj)
        cols["value"].append(None if why or math.isnan(value) else value)
        if canon is not None:
            rest = {k: v for k, v in labels.items() if k not in ("le", "quantile")}
            key = (canon, part, le, q, tuple(sorted(rest.items())))
            other = best.setdefault(key, row)
            if other != row:
                if rank < cols["name_rank"][other]:
                    cols["preferred"][other] = False
                    best[key] = row
                else:
                    cols["preferred"][row] = False


def _no_samples(path: Path, lines: list[str]) -> InputError:
    """The error of a file without one valid sample (content-free: no byte of the file)."""
    first = next((t.strip() for t in lines if t.strip()), "")
    if not first:
        return InputError(path, "empty metrics file: no Prometheus samples")
    from tracediag.ingest.unrecognised import file_text, not_a_record

    first_no = next(i for i, t in enumerate(lines, 1) if t.strip())
    return InputError(
        path,
        f"not Prometheus text exposition: none of its {len(lines)} lines is a metric sample "
        f"({file_text(path)}; {not_a_record('a metric sample', first_no, first)})",
    )


def parse_prometheus(path: Path, order: int, options: IngestOptions) -> Parsed:
    text = _read_text(path, options.memory_limit)
    _check_fits(path, text, options.memory_limit)
    lines = text.splitlines()
    del text
    # a pasted `$ curl …/metrics` prompt line is not exposition: skipped (kept as a blank, so line numbers hold)
    prompts = [i for i, ln in enumerate(lines) if ln.startswith("$ ")]
    for i in prompts:
        lines[i] = ""
    scrapes = _split_scrapes(lines, set(prompts))
    acc = _Samples(order)
    scrape_times = [acc.add_scrape(idx, marker, block) for idx, (marker, block) in enumerate(scrapes)]
    cols, bad, malformed = acc.cols, acc.bad, acc.malformed
    n_samples = len(cols["name"])
    if n_samples == 0:
        raise _no_samples(path, lines)
    t0 = min((t for t in cols["ts_ns"] if t is not None), default=None)
    if t0 is not None:
        cols["t_s"] = [(t - t0) / 1e9 if t is not None else None for t in cols["ts_ns"]]
    versions = sorted({c for c in cols["family"] if c.startswith("vllm:")})
    meta = {
        "scrapes": len(scrapes),
        "samples": n_samples,
        "timed_scrapes": sum(t is not None for t in scrape_times),
        "vllm_metrics": len(versions),
        "engine_label": any(e is not None for e in cols["engine"]),
        "shell_prompt_lines": len(prompts),
        "malformed_lines": len(malformed),
        "malformed_examples": [{"line": n, "text": t.strip()[:120]} for n, t in malformed[:MAX_EXAMPLES]],
    }
    if bad:
        meta["bad_records"] = bad.to_meta()
    ts_known = [t for t in cols["ts_ns"] if t is not None]
    row = {
        "rank": None,
        "profiler": f"Prometheus text exposition ({len(scrapes)} scrape{'s' if len(scrapes) != 1 else ''})",
        "file_bytes": path.stat().st_size,
        "events_total": n_samples,
        "trace_start_ns": min(ts_known) if ts_known else None,
        "trace_end_ns": max(ts_known) if ts_known else None,
        "meta_json": json.dumps(meta),
        "bad_records": bad.records,
    }
    table = pa.Table.from_pydict(cols, schema=SCHEMA)
    return Parsed(path=str(path), format="prometheus", inputs_rows=[row], tables={"metric_samples": table})
