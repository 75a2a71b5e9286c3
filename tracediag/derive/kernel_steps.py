"""Per-step dispatch and GPU activity: tables `kernel_steps` and `step_activity` (SQL in kernel_steps.sql).

Built after the core derivations (it needs `steps`). `build(con)` is the POST_DERIVATIONS entry;
`ensure(con)` builds the tables only when they are absent, for callers that may run on a store made
before this derivation was registered.
"""

from __future__ import annotations

import duckdb

from tracediag.store import has_table, run_sql_file

TABLES = ("kernel_steps", "step_activity")


def build(con: duckdb.DuckDBPyConnection) -> None:
    run_sql_file(con, "tracediag.derive", "kernel_steps.sql")


def ensure(con: duckdb.DuckDBPyConnection) -> None:
    if not all(has_table(con, t) for t in TABLES):
        build(con)
