"""Per-step dispatch and GPU activity: tables `kernel_steps` and `step_activity` (SQL in kernel_steps.sql).

Declared by REQUIRES / PROVIDES below (it needs `steps` with their GPU windows); `build(con)` runs it.
"""

from __future__ import annotations

import duckdb

from tracediag.store import run_sql_file

# The derivation's declaration (tracediag/derive/__init__.py reads it from this source).
REQUIRES = (
    "kernels",
    "cpu_ops",
    "runtime",
    "kernels.klass",
    "cpu_ops.klass",
    "memops",
    "steps",
    "steps.T",
    "steps.phase",
    "steps.windows",
)
PROVIDES = ("kernel_steps", "step_activity")

TABLES = ("kernel_steps", "step_activity")


def build(con: duckdb.DuckDBPyConnection) -> None:
    run_sql_file(con, "tracediag.derive", "kernel_steps.sql")
