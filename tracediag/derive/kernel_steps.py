"""Per-step dispatch and GPU activity: tables `kernel_steps` and `step_activity` (SQL in kernel_steps.sql).

Registered in tracediag.derive.REGISTRY (it needs `steps` with their GPU windows); `build(con)` runs it.
"""

from __future__ import annotations

import duckdb

from tracediag.store import run_sql_file

TABLES = ("kernel_steps", "step_activity")


def build(con: duckdb.DuckDBPyConnection) -> None:
    run_sql_file(con, "tracediag.derive", "kernel_steps.sql")
