"""What a rule, an analysis or a report section sees: the store, the model, the TP degree p, the settings
(Context), the settings themselves with their defaults (Settings), and the TP=1 baseline trace read once for all
of them (Baseline). Below the rules and the analyses; the engine (tracediag.engine) builds a Context and runs the
rules on it."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from tracediag.derive.layout import Layout, TPDegree
from tracediag.errors import UsageError
from tracediag.model import ModelConfig
from tracediag.store import query_dicts


@dataclass(frozen=True)
class Settings:
    """Tolerances and the facts the user supplies: set from the command line's flags, and by `tracediag check` from
    tracediag.toml (tracediag/gate/config.py); the defaults are documented in docs/rules.md."""

    collective_count_slack: int = 2  # COL001: calls beyond 2L still "≈ 2L" (embedding AR, logits AG)
    payload_tolerance: float = 0.10  # COL002: |ratio − 1| within this is a match
    max_evidence: int = 5  # example events per finding
    # Facts the user supplies on the command line (None: take them from the inputs, or not applicable).
    hbm_bandwidth_gbs: float | None = None  # GPU memory bandwidth, GB/s (--hbm-bandwidth)
    peak_tflops: float | None = None  # dense peak of the GPU for the activation dtype, TFLOP/s (--peak-tflops)
    slo_ms: tuple[tuple[str, float], ...] = ()  # latency budgets, e.g. (("ttft", 500.0),) ms (--slo)
    tp1_baseline: str | None = None  # a TP=1 trace of the same model for the projection slope (--tp1-baseline)
    graph_capture: str | None = None  # the graph-capture trace beside a graph replay (--graph-capture)
    # Expectations of the deployment (tracediag.toml): checked by `tracediag check`, readable by rules.
    expected_tp: int | None = None  # tensor-parallel degree the deployment must run with
    expected_attention_family: tuple[tuple[str, str], ...] = ()  # (phase or "any", catalog family)


SLO_KEYS = ("ttft", "tpot", "itl", "e2el")


_MAX_SLO_MS = 86_400_000.0  # one day: a budget beyond it (or inf, nan) is a typo, not a latency target


def parse_slo(text: str | None) -> tuple[tuple[str, float], ...]:
    """'ttft=500,tpot=50' -> (("ttft", 500.0), ("tpot", 50.0)); milliseconds. None: no budgets; an empty text
    is an error (a shell variable that was meant to hold the budgets and did not)."""
    if text is None:
        return ()
    if not text.strip():
        raise UsageError(f"--slo: empty; give budgets such as ttft=500,tpot=50 (keys: {', '.join(SLO_KEYS)})")
    out = []
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        try:
            ms = float(value.strip().removesuffix("ms"))
        except ValueError:
            ms = -1.0
        if not sep or key not in SLO_KEYS or not (0 < ms <= _MAX_SLO_MS):
            raise UsageError(
                f"--slo: '{part}' is not KEY=MS with KEY one of {', '.join(SLO_KEYS)} and 0 < MS ≤ 86400000 (a day)"
            )
        out.append((key, ms))
    return tuple(out)


class Baseline:
    """The TP=1 trace of --tp1-baseline, resolved once per analysis: parsed and derived (tracediag.pipeline) into
    its own in-memory store the first time a rule asks, then shared by every rule that reads it (COL003's
    projection slope, KRN007's GEMM FLOP rates)."""

    def __init__(self, path: str, memory_limit: int | None = None) -> None:
        self.path = path
        self.memory_limit = memory_limit
        self._con: duckdb.DuckDBPyConnection | None = None
        self._error: BaseException | None = None

    def store(self) -> duckdb.DuckDBPyConnection:
        """The baseline's store (owned by this object: close() closes it). Raises a TracediagError when its inputs
        cannot be read (a rule then says why and goes on without the baseline), each time it is asked."""
        if self._error is not None:
            raise self._error
        if self._con is None:
            from tracediag.ingest import discover_inputs
            from tracediag.ingest.base import IngestOptions
            from tracediag.pipeline import parse, store_from

            try:
                files = [(f, None) for f in discover_inputs([Path(self.path)])]
                parsed = parse(files, IngestOptions(memory_limit=self.memory_limit))
                self._con = store_from(parsed, memory_limit=self.memory_limit)
            except Exception as exc:
                self._error = exc
                raise
        return self._con

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None


MEMO_MAX_ROWS = 5000  # larger query results are not kept by Context.memoized (memory, and the copy per use)


@dataclass
class Context:
    """What a rule sees: the store, the model, p, settings. Rules must not mutate it."""

    con: duckdb.DuckDBPyConnection
    model: ModelConfig | None
    tp: TPDegree | None
    settings: Settings = field(default_factory=Settings)
    layout: Layout | None = None  # process groups and what they are (derive/layout.py)
    # the TP=1 baseline (default: the one settings.tp1_baseline names, read when first asked for)
    baseline: Baseline | None = None
    _memo: dict[Any, Any] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.baseline is None and self.settings.tp1_baseline:
            self.baseline = Baseline(self.settings.tp1_baseline)

    def rows(self, sql: str, params: list[Any] | None = None) -> list[dict[str, Any]]:
        memo = self._memo
        if memo is None:
            return query_dicts(self.con, sql, params)
        key = ("rows", sql, repr(params))
        kept = memo.get(key)
        if kept is None:
            fresh = query_dicts(self.con, sql, params)
            if len(fresh) > MEMO_MAX_ROWS:
                return fresh
            kept = memo[key] = fresh
        return [_copy_row(r) for r in kept]  # callers may change the rows they get

    def scalar(self, sql: str, params: list[Any] | None = None) -> Any:
        value = self.once(("scalar", sql, repr(params)), lambda: self._scalar(sql, params))
        return copy.deepcopy(value) if isinstance(value, (list, dict)) else value

    def _scalar(self, sql: str, params: list[Any] | None) -> Any:
        row = self.con.execute(sql, params or []).fetchone()
        return row[0] if row else None

    @contextmanager
    def memoized(self) -> Iterator[None]:
        """Within: a query asked again with the same parameters gets the first answer (fresh copies of its
        rows), and `once` computes each key once. For a stretch in which the store does not change (the
        rules and report sections read it; the temporary tables they build are built once per content)."""
        if self._memo is not None:
            yield
            return
        self._memo = {}
        try:
            yield
        finally:
            self._memo = None

    def fitness(self) -> dict[str, Any] | None:
        """The window's fitness (tracediag/derive/fitness.py summarize): its class, why, numbers per rank."""
        from tracediag.derive.fitness import summarize

        return self.once("window_fitness", lambda: summarize(self.con, self.settings.graph_capture))

    def once(self, key: Any, compute: Callable[[], Any]) -> Any:
        """compute(), once per key while memoized (every time otherwise); the value is shared, not copied."""
        memo = self._memo
        if memo is None:
            return compute()
        if key not in memo:
            memo[key] = compute()
        return memo[key]


def _copy_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: copy.deepcopy(v) if isinstance(v, (list, dict)) else v for k, v in row.items()}
