"""Shared queries of the serving rules (SCH002-SCH011): time series from vLLM/SGLang logs and /metrics scrapes,
startup facts, benchmark runs, and evidence rows. Tables: tracediag/store/schema_serving.sql."""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tracediag.context import Context

MIN_TREND_POINTS = 4  # fewest samples a trend test runs on (exact one-sided p can reach 1/24 < 0.05)
SIGNIFICANCE = 0.05  # one-sided significance level of the trend tests


def input_paths(ctx: Context) -> dict[int, str]:
    return {r["input_id"]: r["path"] for r in ctx.rows("SELECT DISTINCT input_id, path FROM inputs")}


def short(path: str | None) -> str:
    return Path(path).name if path else "?"


def series_label(path: str | None, engine: Any, run: Any = None) -> str:
    """A log's or scrape's file name, with the server run (when the file holds several) and the engine:
    "server.log run 2 engine 1"."""
    r = "" if run is None else f" run {run}"
    eng = "" if engine is None else f" engine {engine}"
    return f"{short(path)}{r}{eng}"


def plain_column(a: Any) -> np.ndarray:
    """A fetched column as a plain array: NULL becomes NaN (numbers) or None (text)."""
    ma = sys.modules.get("numpy.ma")  # no masked array exists unless numpy.ma was imported (20 ms otherwise)
    if ma is not None and isinstance(a, ma.MaskedArray):
        if a.dtype.kind in "iuf":
            return a.astype(float).filled(np.nan)
        return a.astype(object).filled(None)
    return np.asarray(a)


@dataclass
class Series:
    """One time series of a serving quantity: a log's stats lines of one (run, engine, process), or one scrape
    series. Columns are arrays (a day of stats lines is 10^4-10^6 samples): `t` seconds, `v` values, and the
    other fetched columns in `cols`; `point(i)` gives one sample as a dict for evidence, with the text columns
    `texts(i)` reads for that sample alone (a log line's own time: 10^6 Python strings are not fetched for the
    few samples evidence names)."""

    source: str  # 'log' or 'metrics'
    input_id: int
    path: str
    engine: Any  # engine index / label, None when the log or scrape has none
    run: Any = None  # server run within the log; None when the file holds one run
    cols: dict[str, np.ndarray] = field(default_factory=dict)
    texts: Callable[[int], dict[str, Any]] | None = field(default=None, repr=False, compare=False)

    @property
    def label(self) -> str:
        return series_label(self.path, self.engine, self.run)

    @property
    def t(self) -> np.ndarray:
        return self.cols["t_s"]

    @property
    def v(self) -> np.ndarray:
        return self.cols["value"]

    def __len__(self) -> int:
        return len(self.cols.get("value", ()))

    def point(self, i: int) -> dict[str, Any]:
        out = {}
        for k, a in self.cols.items():
            x = a[i]
            if isinstance(x, np.generic):
                x = x.item()
            if isinstance(x, float) and math.isnan(x):
                x = None
            out[k] = x
        if self.texts is not None:
            out.update(self.texts(i))
        return out

    @property
    def points(self) -> list[dict[str, Any]]:
        return [self.point(i) for i in range(len(self))]

    def valid(self) -> np.ndarray:
        """Indices of samples with a time and a value, in time order."""
        ok = ~np.isnan(self.t.astype(float)) & ~np.isnan(self.v.astype(float))
        return np.nonzero(ok)[0]

    def xy(self) -> tuple[list[float], list[float]]:
        idx = self.valid()
        return self.t[idx].astype(float).tolist(), self.v[idx].astype(float).tolist()


def run_starts(cols: dict[str, np.ndarray], keys: tuple[str, ...]) -> list[int]:
    """Where each run of equal `keys` starts in rows sorted by them, then the row count: starts[i]:starts[i + 1]
    is one run. NULLs (NaN, None) equal each other; integer columns are compared in C (10^6 lines: seconds in
    Python)."""
    n = len(next(iter(cols.values()))) if cols else 0
    if n == 0:
        return [0]
    change = np.zeros(n, dtype=bool)
    change[0] = True
    for k in keys:
        a = cols[k]
        if a.dtype.kind == "f":
            same = (a[1:] == a[:-1]) | (np.isnan(a[1:]) & np.isnan(a[:-1]))
        elif a.dtype.kind in "biu":
            same = a[1:] == a[:-1]
        else:
            same = np.fromiter((_same(x, y) for x, y in zip(a[1:], a[:-1])), dtype=bool, count=n - 1)
        change[1:] |= ~same
    return [*np.nonzero(change)[0].tolist(), n]


def key_value(x: Any) -> Any:
    """A key of a fetched column as written: None for NULL (read as NaN or None), an int for a number read as
    float (an integer column with NULLs), else the value (an engine may be a label)."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return None
    return int(x) if isinstance(x, float) else x


def _split(
    source: str,
    paths: dict[int, str],
    data: dict[str, Any],
    keys: tuple[str, ...],
    runs: dict,
    texts: Callable[[dict[str, np.ndarray]], Callable[[int], dict[str, Any]]] | None = None,
) -> list[Series]:
    cols = {k: plain_column(v) for k, v in data.items()}
    out: list[Series] = []
    for start, i in itertools.pairwise(run_starts(cols, keys)):
        g = {k: a[start:i] for k, a in cols.items()}
        first = {k: g[k][0] for k in keys}
        iid = int(first["input_id"])
        eng = key_value(first.get("engine"))
        run = key_value(first.get("run"))
        run = None if run is None else int(run)
        s = Series(source, iid, paths.get(iid, "?"), eng, run if runs.get(iid, 1) > 1 else None, g)
        s.texts = texts(g) if texts is not None else None
        out.append(s)
    return out


def _param(x: Any) -> Any:
    """A fetched value as a query parameter: a Python scalar, NULL (NaN) as None."""
    x = x.item() if isinstance(x, np.generic) else x
    return None if isinstance(x, float) and math.isnan(x) else x


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def log_runs(ctx: Context) -> dict[int, int]:
    """input_id -> number of server runs in that log."""
    return {
        r["input_id"]: r["n"]
        for r in ctx.rows("SELECT input_id, count(DISTINCT run) AS n FROM serving_stats GROUP BY input_id")
    }


LOG_COLUMNS = ("running", "waiting", "kv_usage_pct", "gen_tput_tok_s", "prompt_tput_tok_s", "tput_tok_s")
LOG_TEXTS = ("ts_text", "log_format")  # read per sample asked (Series.point), never for the whole log
_LOG_KEYS = ("input_id", "run", "engine", "pid")


def log_series(ctx: Context, column: str, also: tuple[str, ...] = LOG_COLUMNS) -> list[Series]:
    """serving_stats[column] per (log, run, engine, process), in time order. `column` is a serving_stats column;
    `also` the other numeric columns the caller reads (in `cols` and in each point). A point also holds the
    line's `ts_text` and `log_format`, read from the store for that sample only."""
    if not ctx.scalar("SELECT EXISTS (SELECT 1 FROM serving_stats)"):
        return []
    paths = input_paths(ctx)
    extra = "".join(f", {c}" for c in also if c != column)
    data = ctx.con.execute(
        f"SELECT input_id, run, engine, pid, line, t_s, {column} AS value{extra} "
        "FROM serving_stats ORDER BY input_id, run, engine NULLS FIRST, pid NULLS FIRST, t_s NULLS LAST, line"
    ).fetchnumpy()  # column names come from the calling rule, not from input
    return _split("log", paths, data, _LOG_KEYS, log_runs(ctx), lambda g: _log_texts(ctx, g))


def _log_texts(ctx: Context, g: dict[str, np.ndarray]) -> Callable[[int], dict[str, Any]]:
    """The text columns of sample i of one log series: the stats row with the sample's keys, line and time."""

    def read(i: int) -> dict[str, Any]:
        ident = [_param(g[k][i]) for k in (*_LOG_KEYS, "line", "t_s")]
        row = ctx.con.execute(
            f"SELECT {', '.join(LOG_TEXTS)} FROM serving_stats WHERE "
            + " AND ".join(f"{k} IS NOT DISTINCT FROM ?" for k in (*_LOG_KEYS, "line", "t_s"))
            + " LIMIT 1",
            ident,
        ).fetchone()
        # NULL text reads as "?", as the bulk fetch gave it (plain_column: a masked text array's fill value)
        return {k: "?" if v is None else v for k, v in zip(LOG_TEXTS, row or (None,) * len(LOG_TEXTS))}

    return read


def metric_series(ctx: Context, canonical: str, part: str = "value") -> list[Series]:
    """A canonical metric per (file, engine), one point per timed scrape (summed over other labels)."""
    if not ctx.scalar("SELECT EXISTS (SELECT 1 FROM metric_samples)"):  # no scrape: asked by many rules, once
        return []
    paths = input_paths(ctx)
    data = ctx.con.execute(
        "SELECT input_id, engine, scrape, min(t_s) AS t_s, min(ts_ns) AS ts_ns, min(line) AS line, "
        "sum(value) AS value FROM metric_samples WHERE canonical = ? AND part = ? AND preferred "
        "GROUP BY input_id, engine, scrape ORDER BY input_id, engine NULLS FIRST, scrape",
        [canonical, part],
    ).fetchnumpy()
    return _split("metrics", paths, data, ("input_id", "engine"), {})


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
