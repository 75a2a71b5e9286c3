"""Shared queries of the serving rules (SCH002-SCH010): time series from vLLM logs and /metrics scrapes,
startup facts, benchmark runs, and evidence rows. Tables: tracediag/store/schema_serving.sql."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracediag.engine import Context

MIN_TREND_POINTS = 4  # fewest samples a trend test runs on (exact one-sided p can reach 1/24 < 0.05)
SIGNIFICANCE = 0.05  # one-sided significance level of the trend tests


def input_paths(ctx: Context) -> dict[int, str]:
    return {r["input_id"]: r["path"] for r in ctx.rows("SELECT DISTINCT input_id, path FROM inputs")}


def short(path: str | None) -> str:
    return Path(path).name if path else "?"


def series_label(path: str | None, engine: Any) -> str:
    """A log's or scrape's file name, with the engine when it has one: "server.log engine 1"."""
    eng = "" if engine is None else f" engine {engine}"
    return f"{short(path)}{eng}"


@dataclass
class Series:
    """One time series of a serving quantity: a log's stats lines of one engine, or one scrape series."""

    source: str  # 'log' or 'metrics'
    input_id: int
    path: str
    engine: Any  # engine index / label, None when the log or scrape has none
    points: list[dict[str, Any]] = field(default_factory=list)  # rows with t_s, value and evidence fields

    @property
    def label(self) -> str:
        return series_label(self.path, self.engine)

    def xy(self) -> tuple[list[float], list[float]]:
        pts = [p for p in self.points if p["t_s"] is not None and p["value"] is not None]
        return [p["t_s"] for p in pts], [float(p["value"]) for p in pts]


def log_series(ctx: Context, column: str) -> list[Series]:
    """serving_stats[column] per (log, engine, process), in time order. `column` is a serving_stats column."""
    paths = input_paths(ctx)
    rows = ctx.rows(
        f"SELECT input_id, engine, pid, line, ts_text, t_s, {column} AS value, running, waiting, kv_usage_pct "
        "FROM serving_stats ORDER BY input_id, engine NULLS FIRST, pid NULLS FIRST, t_s, line"
    )  # column names come from the calling rule, not from input
    out: dict[tuple, Series] = {}
    for r in rows:
        key = (r["input_id"], r["engine"], r["pid"])
        s = out.setdefault(key, Series("log", r["input_id"], paths.get(r["input_id"], "?"), r["engine"]))
        s.points.append(r)
    return list(out.values())


def metric_series(ctx: Context, canonical: str, part: str = "value") -> list[Series]:
    """A canonical metric per (file, engine), one point per timed scrape (summed over other labels)."""
    paths = input_paths(ctx)
    rows = ctx.rows(
        "SELECT input_id, engine, scrape, min(t_s) AS t_s, min(ts_ns) AS ts_ns, min(line) AS line, "
        "sum(value) AS value FROM metric_samples WHERE canonical = ? AND part = ? AND preferred "
        "GROUP BY input_id, engine, scrape ORDER BY input_id, engine NULLS FIRST, scrape",
        [canonical, part],
    )
    out: dict[tuple, Series] = {}
    for r in rows:
        key = (r["input_id"], r["engine"])
        s = out.setdefault(key, Series("metrics", r["input_id"], paths.get(r["input_id"], "?"), r["engine"]))
        s.points.append(r)
    return list(out.values())


def startup_facts(ctx: Context) -> dict[int, dict[str, dict[str, Any]]]:
    """input_id -> fact key -> first row (value, value_num, unit, line, text)."""
    out: dict[int, dict[str, dict[str, Any]]] = {}
    for r in ctx.rows("SELECT * FROM serving_startup ORDER BY input_id, line"):
        out.setdefault(r["input_id"], {}).setdefault(r["key"], r)
    return out


def log_evidence(path: str, p: dict[str, Any], name: str, **extra: Any) -> dict[str, Any]:
    """An evidence row for a log record: logs carry no year, so ts_ns is None and `time` is the log's own."""
    return {
        "rank": None,
        "ts_ns": None,
        "name": name,
        "input": short(path),
        "line": p.get("line"),
        "time": p.get("ts_text"),
        "t_s": p.get("t_s"),
        **extra,
    }


def metric_evidence(path: str, p: dict[str, Any], name: str, **extra: Any) -> dict[str, Any]:
    return {
        "rank": None,
        "ts_ns": p.get("ts_ns"),
        "name": name,
        "input": short(path),
        "line": p.get("line"),
        "time": None,
        "t_s": p.get("t_s"),
        **extra,
    }


def series_evidence(s: Series, p: dict[str, Any], name: str, **extra: Any) -> dict[str, Any]:
    return (log_evidence if s.source == "log" else metric_evidence)(s.path, p, name, **extra)


def finite(v: Any) -> Any:
    """JSON-safe number: infinity becomes the string 'inf' (findings.json must stay valid JSON)."""
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def bench_runs(ctx: Context) -> list[dict[str, Any]]:
    paths = input_paths(ctx)
    rows = ctx.rows("SELECT * FROM bench_runs ORDER BY input_id, run")
    for r in rows:
        r["path"] = paths.get(r["input_id"], "?")
    return rows


def bench_percentiles(ctx: Context, input_id: int, run: int) -> dict[str, dict[float, float]]:
    """metric -> {percentile: value_ms} of one run's summary."""
    out: dict[str, dict[float, float]] = {}
    for r in ctx.rows(
        "SELECT metric, percentile, value_ms FROM bench_latency WHERE input_id = ? AND run = ? "
        "AND percentile IS NOT NULL",
        [input_id, run],
    ):
        out.setdefault(r["metric"], {})[r["percentile"]] = r["value_ms"]
    return out


def bench_stat(ctx: Context, input_id: int, run: int, metric: str, stat: str) -> float | None:
    return ctx.scalar(
        "SELECT value_ms FROM bench_latency WHERE input_id = ? AND run = ? AND metric = ? AND stat = ?",
        [input_id, run, metric, stat],
    )


def run_label(r: dict[str, Any]) -> str:
    rate = r.get("request_rate_rps")
    rate_s = "inf" if rate is not None and math.isinf(rate) else (f"{rate:g}" if rate is not None else "?")
    return f"{short(r['path'])} run {r['run']} (rate {rate_s} req/s)"


def bench_evidence(r: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "rank": None,
        "ts_ns": None,
        "name": run_label(r),
        "input": short(r["path"]),
        "date": r.get("date"),
        **extra,
    }
