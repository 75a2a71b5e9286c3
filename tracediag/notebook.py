"""tracediag in a notebook or a SQL shell: open an output folder (`analyze`/`check --out`) and get the
report, DataFrames of the main tables and SQL on the store.

    import tracediag
    run = tracediag.open("tracediag-out")
    run                      # in Jupyter: the verdict and the ranked findings
    run.verdict["headline"]
    run.findings             # DataFrame: rule, severity, impact, title, ... ranked by impact
    run.steps.head()         # DataFrame of the `steps` table (also .collectives, .kernels, .step_activity, ...)
    run.sql("SELECT phase, median(step_ns) FROM step_activity GROUP BY phase")
    run.columns("steps")     # each column's type, unit and meaning (the store's column comments)

The store is opened read-only; nothing is written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import pandas as pd

from tracediag.errors import InputError
from tracediag.findings import ranked_findings
from tracediag.findings import verdict as build_verdict

MAIN_TABLES = ("steps", "step_activity", "collectives", "kernels", "kernel_steps", "cpu_ops", "inputs", "op_roofline")


class OpenedRun:
    """An analysis output folder: findings.json (the report) and trace.duckdb (the store)."""

    def __init__(self, path: str | Path) -> None:
        from tracediag.runs import read_findings

        p = Path(path)
        folder = p.parent if p.is_file() else p
        findings = p if p.is_file() else p / "findings.json"
        if not findings.is_file():
            raise InputError(findings, "no findings.json here: pass an analyze or check --out folder")
        self.path = folder
        self.doc: dict[str, Any] = read_findings(findings)
        db = folder / "trace.duckdb"
        self.db_path: Path | None = db if db.is_file() else None
        self._con: duckdb.DuckDBPyConnection | None = None

    # --- the report -------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return self.doc

    @property
    def verdict(self) -> dict[str, Any]:
        return self.doc.get("verdict") or build_verdict(self.doc["checks"], fitness=self.doc.get("fitness"))

    @property
    def checks(self) -> pd.DataFrame:
        """Every rule's outcome in walk order: rule, step, status, severity, impact, title, reason."""
        cols = ["rule", "step", "status", "severity", "confidence", "impact", "title", "reason", "next_check"]
        return pd.DataFrame([{k: c.get(k) for k in cols} for c in self.doc["checks"]], columns=cols)

    @property
    def findings(self) -> pd.DataFrame:
        """The findings ranked by impact, each cause followed by the findings folded under it."""
        cols = ["rule", "severity", "impact", "confidence", "downstream_of", "title", "next_check"]
        rows = [{k: c.get(k) for k in cols} for c in ranked_findings(self.doc["checks"])]
        return pd.DataFrame(rows, columns=cols)

    def section(self, name: str) -> dict[str, pd.DataFrame]:
        """A report section's tables (as findings.json holds them, every row) by caption."""
        s = (self.doc.get("sections") or {}).get(name)
        if s is None:
            raise KeyError(f"no section {name!r}; sections: {', '.join(self.doc.get('sections') or {})}")
        return {caption: pd.DataFrame(rows) for caption, rows in s["tables"].items()}

    # --- the store --------------------------------------------------------------------------------------
    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        if self.db_path is None:
            raise InputError(self.path / "trace.duckdb", "no store beside findings.json (tables need trace.duckdb)")
        if self._con is None:
            from tracediag.store.readback import open_read_back

            # a folder attached to a ticket may come from anyone: its store is read as data (read-only, external
            # access off, nothing but tables and tracediag's own views), never as code
            self._con = open_read_back(self.db_path)
        return self._con

    def sql(self, query: str, params: list[Any] | None = None) -> pd.DataFrame:
        """A query on trace.duckdb as a DataFrame (parameters bound)."""
        return self.con.execute(query, params or []).df()

    def table(self, name: str) -> pd.DataFrame:
        if name not in self.tables():
            raise KeyError(f"no table {name!r} in {self.db_path}; tables: {', '.join(self.tables())}")
        return self.con.execute(f'SELECT * FROM "{name}"').df()  # a name checked against the store's own list

    def tables(self) -> list[str]:
        """Tables and views of the store."""
        q = (
            "SELECT table_name FROM duckdb_tables() UNION ALL "
            "SELECT view_name FROM duckdb_views() WHERE NOT internal ORDER BY 1"
        )
        return [r[0] for r in self.con.execute(q).fetchall()]

    def columns(self, table: str) -> pd.DataFrame:
        """Column, type and comment (unit and meaning) of a table."""
        return self.sql(
            "SELECT column_name AS column, data_type AS type, comment FROM duckdb_columns() "
            "WHERE table_name = ? ORDER BY column_index",
            [table],
        )

    def __getattr__(self, name: str) -> pd.DataFrame:
        if name in MAIN_TABLES:
            return self.table(name)
        raise AttributeError(name)

    def close(self) -> None:
        if self._con is not None:
            self._con.close()
            self._con = None

    def __enter__(self) -> OpenedRun:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        v = self.verdict
        return f"<tracediag run {self.path}: {v['status']}: {v['headline'][:100]}>"

    def _repr_html_(self) -> str:
        from tracediag.reports.html import render_fragment

        return render_fragment(self.doc)


def open_run(path: str | Path) -> OpenedRun:
    """Open an `analyze`/`check --out` folder (or its findings.json)."""
    return OpenedRun(path)
