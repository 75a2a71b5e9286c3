"""A TP=1 baseline (--tp1-baseline): another trace of the same model, ingested into its own in-memory store, from
which COL003 fits the projection slope a and KRN007 reads the GEMM FLOP rates at full width."""

from __future__ import annotations

from pathlib import Path

import duckdb

from tracediag.derive import build_all
from tracediag.ingest import Parsed, discover_inputs, load, parse_all
from tracediag.store import open_store


def parse_baseline(path: str) -> list[Parsed]:
    """The baseline's inputs, parsed; a TracediagError when they cannot be read (the rule says why and goes on
    without the baseline)."""
    return parse_all(discover_inputs([Path(path)]))


def baseline_store(parsed: list[Parsed]) -> duckdb.DuckDBPyConnection:
    """A new in-memory store holding the parsed baseline and its derived tables; the caller closes it."""
    con = open_store()
    try:
        load(con, parsed)
        build_all(con)
    except BaseException:
        con.close()
        raise
    return con
