"""Shared queries of the serving rules (SCH002-SCH011): time series from vLLM/SGLang logs and /metrics scrapes,
startup facts, benchmark runs, and evidence rows. Tables: tracediag/store/schema_serving.sql."""

from __future__ import annotations

import itertools
import json
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
    """A canonical metric per (file, engine), one point per scrape (summed over other labels); `t` is NaN for an
    untimed scrape. A series without an engine label has engine None."""
    if not ctx.scalar("SELECT EXISTS (SELECT 1 FROM metric_samples)"):  # no scrape: asked by many rules, once
        return []
    paths = input_paths(ctx)
    data = ctx.con.execute(
        "SELECT input_id, engine, bool_or(engine IS NULL) AS engine_null, scrape, min(t_s) AS t_s, "
        "min(ts_ns) AS ts_ns, min(line) AS line, sum(value) AS value FROM metric_samples "
        "WHERE canonical = ? AND part = ? AND preferred "
        "GROUP BY input_id, engine, scrape ORDER BY input_id, engine NULLS FIRST, scrape",
        [canonical, part],
    ).fetchnumpy()
    out = _split("metrics", paths, data, ("input_id", "engine"), {})
    for s in out:  # a NULL label is read back as the masked array's fill value ('?'): no engine label at all
        if len(s) and bool(s.cols["engine_null"][0]):
            s.engine = None
    return out


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


# --- Counters over the run: the difference between scrapes -----------------------------------------------------
#
# Counters and histogram _sum/_count/_bucket grow from the server's start. A user scrapes /metrics before and
# after a benchmark (two files, or one file of concatenated scrapes, usually without timestamps): the run is what
# the counters gained between those scrapes, not their value. With one scrape only the lifetime exists, "since
# server start". A counter that goes down (or a process_start_time_seconds that changes) is a restart: the
# difference across it is not the run's, and is never taken.

COUNTER_PARTS = ("sum", "count", "bucket")  # histogram parts; a counter is part 'value' of type 'counter'
RESET_TOLERANCE = 1e-9  # relative: float sums re-exported by another process may wobble in the last digit
SAME_START_S = 1.0  # process_start_time_seconds of one process, read twice, agrees within this


@dataclass(frozen=True)
class ScrapePoint:
    """One scrape of a sequence: its file, its 0-based index in the file and its 1-based place in the sequence."""

    input_id: int
    path: str
    scrape: int
    ordinal: int
    ts_ns: int | None
    line: int | None
    counters: dict[tuple, float] = field(default_factory=dict, repr=False)  # (canonical, part, le, labels) -> value
    start_s: float | None = None  # process_start_time_seconds of this scrape

    def evidence(self, name: str, **extra: Any) -> dict[str, Any]:
        return metric_evidence(
            self.path, {"ts_ns": self.ts_ns, "line": self.line}, name, scrape=self.scrape + 1, **extra
        )


@dataclass(frozen=True)
class CounterWindow:
    """What one series' counters gained over the window: `values` holds the difference between the window's first
    and last scrape (`differenced`), or the lifetime of the only scrape. `basis` says which, in words, for the
    finding: "between scrape 1 and 2 of m.prom", "since server start: one scrape of m.prom"."""

    series: str
    engine: Any
    model_name: Any
    scrapes: list[ScrapePoint]
    first: ScrapePoint | None  # None: one scrape, lifetime values
    last: ScrapePoint
    values: dict[tuple, float]
    basis: str
    reset: str | None = None  # a restart between two scrapes of the sequence, in words
    broken: bool = False  # a restart left no two scrapes of one process: `values` is empty, `basis` says why
    segment: list[ScrapePoint] = field(default_factory=list, repr=False)  # the window's scrapes, first to last

    @property
    def differenced(self) -> bool:
        return self.first is not None

    @property
    def elapsed_s(self) -> float | None:
        if self.first is None or self.first.ts_ns is None or self.last.ts_ns is None:
            return None
        return (self.last.ts_ns - self.first.ts_ns) / 1e9

    def has(self, canonical: str) -> bool:
        """The series exposes this counter (in its last scrape), whether or not the window could difference it."""
        return any(c == canonical for c, _, _, _ in self.last.counters)

    def total(self, canonical: str, part: str = "value", values: dict[tuple, float] | None = None) -> float | None:
        """Sum over labels (and buckets) of one canonical counter; None when the window has none of it."""
        got = [
            v
            for (c, p, _, _), v in (values if values is not None else self.values).items()
            if c == canonical and p == part
        ]
        return float(sum(got)) if got else None

    def by_label(self, canonical: str, label: str, part: str = "value") -> dict[str, float]:
        """label value -> sum of one canonical counter over the other labels."""
        out: dict[str, float] = {}
        for (c, p, _, labels), v in self.values.items():
            if c == canonical and p == part:
                key = dict(labels).get(label)
                if key is not None:
                    out[key] = out.get(key, 0.0) + v
        return out

    def buckets(self, canonical: str) -> dict[float, float]:
        out: dict[float, float] = {}
        for (c, p, le, _), v in self.values.items():
            if c == canonical and p == "bucket" and le is not None:
                out[le] = out.get(le, 0.0) + v
        return out

    def evidence(self, name: str, **extra: Any) -> list[dict[str, Any]]:
        """Evidence rows: the window's first and last scrape (one row with one scrape)."""
        rows = [self.first.evidence(f"{name} (first scrape of the window)", **extra)] if self.first else []
        return [*rows, self.last.evidence(f"{name} (last scrape of the window)" if self.first else name, **extra)]


def _labels_key(labels_json: str | None) -> tuple:
    """A sample's labels without the ones the series and the part already say (engine, model, le, ranks)."""
    try:
        labels = json.loads(labels_json or "{}")
    except ValueError:
        labels = {}
    drop = {"engine", "model_name", "le", "quantile", "dp_rank", "tp_rank", "pp_rank"}
    return tuple(sorted((k, str(v)) for k, v in labels.items() if k not in drop))


def _scrape_points(ctx: Context) -> dict[tuple, list[ScrapePoint]]:
    """(engine, model_name) -> the scrapes of that series over every /metrics input, in order: by time when every
    one of them is timed, else in the order given (file, then scrape in the file)."""
    paths = input_paths(ctx)
    rows = ctx.con.execute(
        "SELECT input_id, scrape, engine, model_name, canonical, part, le, labels_json, value, ts_ns, line, "
        "name FROM metric_samples WHERE preferred AND value IS NOT NULL AND ("
        "(part = 'value' AND type = 'counter') OR part IN ('sum', 'count', 'bucket') OR "
        "canonical = 'process_start_time') AND canonical IS NOT NULL "
        "ORDER BY input_id, scrape, line"
    ).fetchall()
    points: dict[tuple, dict[tuple, dict[str, Any]]] = {}
    label_keys: dict[str | None, tuple] = {}  # label sets repeat in every scrape: parsed once each
    starts: dict[tuple, float] = {}  # (input, scrape) -> process_start_time_seconds (a process gauge: no labels)
    for iid, scrape, engine, model, canon, part, le, labels, value, ts_ns, line, _name in rows:
        if canon == "process_start_time":
            starts.setdefault((iid, scrape), value)
            continue
        p = points.setdefault((engine, model), {}).setdefault((iid, scrape), {"ts_ns": ts_ns, "line": line, "c": {}})
        lk = label_keys.get(labels)
        if lk is None:
            lk = label_keys[labels] = _labels_key(labels)
        key = (canon, part, le, lk)
        p["c"][key] = p["c"].get(key, 0.0) + value
    out: dict[tuple, list[ScrapePoint]] = {}
    for series, by in points.items():
        keys = list(by)
        if all(by[k]["ts_ns"] is not None for k in keys):
            keys.sort(key=lambda k: (by[k]["ts_ns"], k))
        out[series] = [
            ScrapePoint(k[0], paths.get(k[0], "?"), k[1], n, by[k]["ts_ns"], by[k]["line"], by[k]["c"], starts.get(k))
            for n, k in enumerate(keys, start=1)
        ]
    return out


def _restart(a: ScrapePoint, b: ScrapePoint) -> str | None:
    """Why b is not a later scrape of a's process (a counter fell, the process start changed), or None."""
    if a.start_s is not None and b.start_s is not None and abs(a.start_s - b.start_s) > SAME_START_S:
        return f"process_start_time_seconds changed {a.start_s:.0f} → {b.start_s:.0f}"
    for key, va in a.counters.items():
        vb = b.counters.get(key)
        if vb is not None and vb < va - RESET_TOLERANCE * max(1.0, abs(va)):
            canon, part, le, _labels = key
            what = canon + ("" if part == "value" else f"_{part}") + (f"{{le={le:g}}}" if le is not None else "")
            return f"{what} fell {va:g} → {vb:g}"
    return None


def _between(a: ScrapePoint, b: ScrapePoint) -> str:
    """Scrapes are numbered from 1 in their own file, as a user counts them."""
    if a.input_id == b.input_id:
        return f"between scrape {a.scrape + 1} and {b.scrape + 1} of {short(a.path)}"
    return f"between scrape {a.scrape + 1} of {short(a.path)} and scrape {b.scrape + 1} of {short(b.path)}"


def _diff(a: ScrapePoint, b: ScrapePoint) -> dict[tuple, float]:
    return {k: v - a.counters[k] for k, v in b.counters.items() if k in a.counters}


def _window(series: str, engine: Any, model: Any, pts: list[ScrapePoint]) -> CounterWindow:
    """The window of one series: the longest run of scrapes with no restart between them (the latest on a tie)."""
    if len(pts) == 1:
        return CounterWindow(series, engine, model, pts, None, pts[0], dict(pts[0].counters),
                             f"since server start: one scrape of {short(pts[0].path)}")  # fmt: skip
    resets = [(i, why) for i, (a, b) in enumerate(itertools.pairwise(pts)) if (why := _restart(a, b))]
    cuts = [0, *[i + 1 for i, _ in resets], len(pts)]
    segments = [pts[s:e] for s, e in itertools.pairwise(cuts)]
    seg = max(reversed(segments), key=len)  # the longest; max keeps the first of equals: the latest
    reset = (
        "; ".join(f"counter reset {_between(pts[i], pts[i + 1])} ({why}): the server restarted, so the "
                  "difference across it is not the run's" for i, why in resets[:3])
        + (f"; {len(resets) - 3} more resets" if len(resets) > 3 else "")
        or None
    )  # fmt: skip
    if len(seg) < 2:
        return CounterWindow(series, engine, model, pts, None, pts[-1], {},
                             f"no two scrapes of one server process to difference: {reset}", reset, True)  # fmt: skip
    basis = _between(seg[0], seg[-1])
    if len(seg) > 2:
        basis += f" ({len(seg) - 1} intervals)"
    if reset:
        basis += f"; {reset}"
    return CounterWindow(series, engine, model, pts, seg[0], seg[-1], _diff(seg[0], seg[-1]), basis, reset,
                         segment=seg)  # fmt: skip


def counter_windows(ctx: Context) -> list[CounterWindow]:
    """One CounterWindow per /metrics series (engine and model labels), over every /metrics input: files of the
    same labels are read as scrapes of one server, in the order given (by time when every scrape is timed)."""

    def compute() -> list[CounterWindow]:
        if not ctx.scalar("SELECT EXISTS (SELECT 1 FROM metric_samples)"):
            return []
        out = []
        for (engine, model), pts in _scrape_points(ctx).items():
            files = list(dict.fromkeys(short(p.path) for p in pts))  # in the sequence's order
            label = ", ".join(files) + (f" engine {engine}" if engine is not None else "")
            out.append(_window(label, engine, model, pts))
        return out

    return ctx.once("counter_windows", compute)
