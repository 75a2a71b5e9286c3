"""Derived tables built once after ingest: steps, gemm_shapes, collectives (+ step_collectives view).

Each step is SQL in a `.sql` file beside this module; Python only does what SQL says badly
(shape-list arithmetic on JSON dims, dtype spellings).
"""

from __future__ import annotations

import importlib

import duckdb

from tracediag.store import run_sql_file, transaction

# Core derivations in order: a `.sql` file is executed; a Python module name is imported and its build(con) called.
CORE: tuple[str, ...] = (
    "tracediag.derive.attention",
    "tracediag.derive.step_markers",
    "steps.sql",
    "gemm_shapes.sql",
    "step_shapes.sql",
)
# Derivations that build on the core tables (steps, gemm_shapes, collectives), in this order:
# a `.sql` file is executed; a Python module name is imported and its build(con) called.
POST_DERIVATIONS: tuple[str, ...] = (
    "tracediag.derive.kernel_phase",
    "tracediag.derive.windows",
    "tracediag.derive.fitness",
    "tracediag.derive.kernel_steps",
    "sdpa_ops.sql",
)
# Derivations that sort a whole canonical table (every CPU op of a CPU-only trace), each in a transaction of its
# own after the others are committed: a file store has written the derived tables out by then, so the sort does
# not share the memory budget with them (a 4 GB rank: 1.66 GiB peak inside the one transaction).
LATE_DERIVATIONS: tuple[str, ...] = ("eager_ops.sql",)


def _run(con: duckdb.DuckDBPyConnection, step: str) -> None:
    if step.endswith(".sql"):
        run_sql_file(con, "tracediag.derive", step)
    else:
        importlib.import_module(step).build(con)


def build_all(con: duckdb.DuckDBPyConnection) -> None:
    """Build every derived table, in dependency order: one transaction (one commit of a file store) for all but
    the LATE_DERIVATIONS, which get one each."""
    with transaction(con):
        _build_all(con)
    for step in LATE_DERIVATIONS:
        with transaction(con):
            _run(con, step)


def _build_all(con: duckdb.DuckDBPyConnection) -> None:
    from tracediag.derive.collectives import build_collectives

    for step in CORE:
        _run(con, step)
    build_collectives(con)
    for step in POST_DERIVATIONS:
        _run(con, step)
    con.execute(
        "DROP TABLE IF EXISTS step_markers; DROP TABLE IF EXISTS coll_cand; DROP TABLE IF EXISTS coll_outer;"
        "DROP TABLE IF EXISTS coll_kern; DROP TABLE IF EXISTS coll_calls; DROP TABLE IF EXISTS coll_meta;"
        "DROP TABLE IF EXISTS coll_gpu; DROP TABLE IF EXISTS coll_dispatch; DROP TABLE IF EXISTS coll_detached;"
        "DROP TABLE IF EXISTS coll_pair"
    )
