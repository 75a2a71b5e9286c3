"""Serving telemetry: queue depth, running requests, KV-cache usage, generation throughput and preemptions over
time (vLLM and SGLang logs and /metrics scrapes), server runs, hang and death messages, startup facts,
speculative decoding, benchmark runs, and what each input held. Long series are thinned for the charts (min
and max of each bucket kept) and long tables are cut, saying so: a day of stats lines must not make a 100 MB
page."""

from __future__ import annotations

import itertools
import json

import numpy as np

from tracediag.analyses.serving import (
    input_paths,
    key_value,
    log_runs,
    plain_column,
    run_starts,
    series_label,
    short,
)
from tracediag.reports.sections import Section
from tracediag.reports.svg import scatter

MAX_SERIES = 6
MAX_POINTS = 1500  # per chart series
MAX_ROWS = 200  # per table: the first and last rows
TELEMETRY = ("prometheus", "vllm-log", "vllm-bench", "sglang-log", "sglang-bench", "aiperf")


def _thin(pts: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """At most MAX_POINTS points: per bucket of consecutive points, the min and the max (spikes stay visible)."""
    if len(pts) <= MAX_POINTS:
        return pts
    step = -(-len(pts) // (MAX_POINTS // 2))
    out = []
    for i in range(0, len(pts), step):
        chunk = pts[i : i + step]
        lo, hi = min(chunk, key=lambda p: p[1]), max(chunk, key=lambda p: p[1])
        out += sorted({lo, hi})
    return out


def _cut(rows: list[dict], notes: list[str], what: str) -> list[dict]:
    if len(rows) <= MAX_ROWS:
        return rows
    notes.append(f"{what}: {len(rows):,} rows; the first and last {MAX_ROWS // 2} are shown (all are in trace.duckdb).")
    return rows[: MAX_ROWS // 2] + rows[-MAX_ROWS // 2 :]


def _series(ctx, column: str) -> dict[str, list[tuple[float, float]]]:
    """Log stats series and timed metric series of one quantity, keyed by a readable label."""
    paths = input_paths(ctx)
    runs = log_runs(ctx)
    data = ctx.con.execute(
        f"SELECT input_id, run, engine, t_s, CAST({column} AS DOUBLE) AS v FROM serving_stats "
        f"WHERE {column} IS NOT NULL AND t_s IS NOT NULL ORDER BY input_id, run, engine, pid, t_s"  # names are ours
    ).fetchnumpy()  # a day of stats lines is 10^5-10^6 rows: split and thinned in NumPy
    cols = {k: plain_column(a) for k, a in data.items()}
    t, v = cols["t_s"].astype(float), cols["v"].astype(float)
    parts: dict[str, list[slice]] = {}
    for a, b in itertools.pairwise(run_starts(cols, ("input_id", "run", "engine"))):
        i, run = int(cols["input_id"][a]), key_value(cols["run"][a])
        label = series_label(paths.get(i), key_value(cols["engine"][a]), run if runs.get(i, 1) > 1 else None)
        parts.setdefault(label, []).append(slice(a, b))
    out = {}
    for label, slices in parts.items():
        ts, vs = (np.concatenate([x[sl] for sl in slices]) for x in (t, v))
        out[label] = _thin_arrays(ts, vs)
    return out


def _thin_arrays(t: np.ndarray, v: np.ndarray) -> list[tuple[float, float]]:
    """_thin of the points zip(t, v), bucket by bucket in NumPy (argmin/argmax: the first extreme, as min/max)."""
    if len(t) <= MAX_POINTS or np.isnan(v).any():  # NaN: min/max of Python floats, as _thin decides them
        return _thin(list(zip(t.tolist(), v.tolist())))
    step = -(-len(t) // (MAX_POINTS // 2))
    out: list[tuple[float, float]] = []
    for i in range(0, len(t), step):
        cv = v[i : i + step]
        lo, hi = i + int(np.argmin(cv)), i + int(np.argmax(cv))
        out += sorted({(float(t[lo]), float(v[lo])), (float(t[hi]), float(v[hi]))})
    return out


def _metric(ctx, canonical: str, scale: float = 1.0) -> dict[str, list[tuple[float, float]]]:
    out: dict[str, list[tuple[float, float]]] = {}
    paths = input_paths(ctx)
    for r in ctx.rows(
        "SELECT input_id, engine, scrape, min(t_s) AS t_s, sum(value) AS v FROM metric_samples "
        "WHERE canonical = ? AND part = 'value' AND preferred AND t_s IS NOT NULL "
        "GROUP BY input_id, engine, scrape ORDER BY input_id, engine, scrape",
        [canonical],
    ):
        label = series_label(paths.get(r["input_id"]), r["engine"]) + " (metrics)"
        out.setdefault(label, []).append((r["t_s"], float(r["v"] or 0) * scale))
    return {k: _thin(v) for k, v in out.items() if len(v) > 1}


def _chart(title: str, ylabel: str, series: dict[str, list[tuple[float, float]]]) -> str | None:
    series = {k: v for k, v in list(series.items())[:MAX_SERIES] if v}
    if not series:
        return None
    return scatter(title, "seconds since the first record of each input", ylabel, series, connect=True)


def _preemptions(ctx) -> dict[str, list[tuple[float, float]]]:
    out = _series(ctx, "preemptions")
    paths = input_paths(ctx)
    for r in ctx.rows(
        "SELECT input_id, t_s, cumulative FROM serving_events WHERE kind = 'preemption' AND t_s IS NOT NULL "
        "ORDER BY input_id, t_s"
    ):
        label = short(paths.get(r["input_id"])) + " (V0 cumulative preemptions)"
        out.setdefault(label, []).append((r["t_s"], float(r["cumulative"] or 0)))
    for label, pts in _series(ctx, "swapped").items():
        if any(v for _, v in pts):
            out[label + " (V0 swapped)"] = pts
    for label, pts in _metric(ctx, "preemptions").items():
        out[label] = pts
    return out


def _input_row(i: dict, meta: dict, name: str) -> dict:
    """The telemetry-inputs row of one input: its format, record count and the reader's counts (meta_json)."""
    return {
        "input": name,
        "format": i["format"],
        "what": i["profiler"],
        "records": i["events_total"],
        "malformed_lines": meta.get("malformed_lines", 0),
        "details": {
            k: meta[k]
            for k in (
                "scrapes",
                "timed_scrapes",
                "stats_lines",
                "spec_decode_lines",
                "preemption_warnings",
                "runs",
                "requests",
                "unknown_lines",
                "events",
            )
            if k in meta
        },
    }


def _reading_notes(i: dict, meta: dict, name: str) -> list[str]:
    """What the reader skipped or cut in one input (malformed or unknown lines, NUL bytes, over-long lines) and
    where a log holds several server runs."""
    notes: list[str] = []
    if meta.get("malformed_lines"):
        ex = "; ".join(f"line {e['line']}: {e['text']!r}" for e in meta.get("malformed_examples", [])[:3])
        notes.append(f"{name}: {meta['malformed_lines']} malformed line(s) skipped ({ex}).")
    if meta.get("nul_head_bytes"):
        notes.append(
            f"{name}: starts with {meta['nul_head_bytes']:,} NUL bytes, skipped (a log truncated in place while "
            "the server kept writing, as logrotate's copytruncate does)."
        )
    if meta.get("nul_run_bytes"):
        notes.append(f"{name}: {meta['nul_run_bytes']:,} NUL bytes between lines, skipped (a hole in the file).")
    if meta.get("lines_cut"):
        notes.append(f"{name}: {meta['lines_cut']} line(s) longer than the read budget, cut (--memory-limit).")
    if meta.get("unknown_lines"):
        ex = "; ".join(f"line {e['line']}: {e['text'][:60]!r}" for e in meta.get("unknown_examples", [])[:2])
        notes.append(f"{name}: {meta['unknown_lines']} line(s) of no known kind ({ex}).")
    if isinstance(meta.get("runs"), int) and meta["runs"] > 1 and i["format"].endswith("-log"):
        starts = ", ".join(
            f"run {r['run']} from line {r['line']} ({r['why']})" for r in meta.get("run_starts", [])[1:6]
        )
        notes.append(f"{name}: {meta['runs']} server runs — {starts}; series are labelled by run.")
    return notes


def build(ctx) -> Section | None:
    inputs = ctx.rows(
        "SELECT input_id, path, format, profiler, events_total, meta_json FROM inputs "
        f"WHERE format IN ({', '.join('?' for _ in TELEMETRY)}) ORDER BY input_id",
        list(TELEMETRY),
    )
    if not inputs:
        return None
    notes, summary = [], []
    for i in inputs:
        meta = json.loads(i["meta_json"] or "{}")
        name = short(i["path"])
        summary.append(_input_row(i, meta, name))
        notes += _reading_notes(i, meta, name)
    notes.append("Log times carry no year: the x axis is seconds since each file's first timestamped record.")
    charts = [
        _chart(
            "Queue depth (waiting requests)",
            "requests",
            {**_series(ctx, "waiting"), **_metric(ctx, "requests_waiting")},
        ),
        _chart("Running requests", "requests", {**_series(ctx, "running"), **_metric(ctx, "requests_running")}),
        _chart("GPU KV-cache usage", "percent", {**_series(ctx, "kv_usage_pct"), **_metric(ctx, "kv_usage", 100.0)}),
        _chart(
            "Generation throughput",
            "tokens/s",
            {**_series(ctx, "gen_tput_tok_s"), **_series(ctx, "tput_tok_s"), **_metric(ctx, "gen_tput_tok_s")},
        ),
        _chart("Preemptions", "count", _preemptions(ctx)),
    ]
    tables = {"telemetry inputs": summary}
    n_stats = ctx.scalar("SELECT count(*) FROM serving_stats") or 0
    sql = (
        "SELECT i.path, s.run, s.line, s.ts_text, s.t_s, s.engine, s.running, s.waiting, s.swapped, s.preemptions, "
        "s.kv_usage_pct, s.prefix_hit_pct, s.prompt_tput_tok_s, s.gen_tput_tok_s FROM serving_stats s "
        "JOIN (SELECT DISTINCT input_id, path FROM inputs) i USING (input_id) ORDER BY s.input_id, s.t_s, s.line "
        "LIMIT ? OFFSET ?"
    )
    if n_stats > MAX_ROWS:  # the first and last rows only, fetched as such (a million rows stay in the store)
        stats = ctx.rows(sql, [MAX_ROWS // 2, 0]) + ctx.rows(sql, [MAX_ROWS // 2, n_stats - MAX_ROWS // 2])
        notes.append(f"engine stats lines: {n_stats:,} rows; the first and last {MAX_ROWS // 2} are shown.")
    else:
        stats = ctx.rows(sql, [MAX_ROWS, 0])
    if stats:
        tables["engine stats lines"] = [{**r, "path": short(r["path"])} for r in stats]
    events = ctx.rows(
        "SELECT i.path, e.run, e.line, e.ts_text, e.kind, e.text FROM serving_events e "
        "JOIN (SELECT DISTINCT input_id, path FROM inputs) i USING (input_id) "
        "WHERE e.kind NOT IN ('access', 'health_check', 'request_finished', 'preemption') ORDER BY e.input_id, e.line"
    )
    if events:
        tables["hang, death and lifecycle messages"] = _cut(
            [{**r, "path": short(r["path"]), "text": r["text"][:200]} for r in events], notes, "messages"
        )
    facts = ctx.rows(
        "SELECT i.path, f.key, f.value, f.unit, f.line, f.process FROM serving_startup f "
        "JOIN (SELECT DISTINCT input_id, path FROM inputs) i USING (input_id) ORDER BY f.input_id, f.line"
    )
    if facts:
        tables["startup facts"] = [{**r, "path": short(r["path"])} for r in facts]
    spec = ctx.rows(
        "SELECT input_id, line, ts_text, engine, log_format, num_spec_tokens AS k, draft_tokens, accepted_tokens, "
        "emitted_tokens, acceptance_rate, mean_acceptance_length, per_position FROM spec_decode ORDER BY input_id, t_s"
    )
    if spec:
        tables["speculative decoding lines"] = _cut(spec, notes, "speculative decoding lines")
    runs = ctx.rows(
        "SELECT input_id, run, source, date, tag, request_rate_rps, max_concurrency, num_prompts, completed, failed, "
        "duration_s, request_throughput_rps, output_tput_tok_s, max_concurrent_requests FROM bench_runs "
        "ORDER BY input_id, run"
    )
    if runs:
        for r in runs:
            rate = r["request_rate_rps"]
            r["request_rate_rps"] = "inf" if rate is not None and rate == float("inf") else rate
        tables["benchmark runs"] = runs
        lat = ctx.rows(
            "SELECT input_id, run, metric, stat, value_ms FROM bench_latency ORDER BY input_id, run, metric, stat"
        )
        tables["benchmark latency (ms)"] = lat
    return Section(
        id="serving",
        step=6,
        title="Serving telemetry (vLLM and SGLang logs, /metrics, benchmark results)",
        tables=tables,
        notes=tuple(notes),
        svgs=tuple(c for c in charts if c),
        queries={
            "engine stats lines": "SELECT * FROM serving_stats ORDER BY input_id, t_s, line",
            "startup facts": "SELECT * FROM serving_startup ORDER BY input_id, line",
            "speculative decoding lines": "SELECT * FROM spec_decode ORDER BY input_id, t_s",
            "benchmark latency (ms)": "SELECT * FROM bench_latency ORDER BY input_id, run, metric, stat",
        },
    )
