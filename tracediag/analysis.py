"""Library entry point: `analyze(paths, model=...) -> Report`. The CLI is a thin layer over this."""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from tracediag import __version__
from tracediag.derive import build_all
from tracediag.engine import Context, Settings, TPDegree, load_rules, run_rules
from tracediag.errors import InputError, UsageError
from tracediag.findings import WALK_STEPS, Check
from tracediag.ingest import discover_inputs, load, parse_all
from tracediag.model import ModelConfig, load_model_config
from tracediag.reports.sections import Section, build_sections
from tracediag.rules import RULE_MODULES
from tracediag.store import open_store, query_dicts

SCHEMA_ID = "tracediag/findings-v1"


@dataclass
class Report:
    """Everything the renderers need; `to_dict()` is the findings.json document."""

    inputs: list[dict[str, Any]]
    model: ModelConfig | None
    tp: TPDegree | None
    checks: list[Check]
    sections: list[Section] = field(default_factory=list)

    @property
    def findings(self) -> list[Check]:
        return [c for c in self.checks if c.status == "finding"]

    @property
    def cost_model(self) -> dict[str, Any]:
        verdicts = {c.rule: c.cost_model_applies for c in self.checks if c.cost_model_applies is not None}
        against = [c for c in self.checks if c.cost_model_applies is False]
        return {
            "applies": (not against) if verdicts else None,
            "formula": "t_comm = 2L·τ_AR(T·H·e_a, p), τ_AR ≈ α_p + 2(p−1)S/(p·B_p)",
            "verdicts": verdicts,
            "reasons": [f"{c.rule}: {c.title}" for c in against],
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA_ID,
            "tool": {"name": "tracediag", "version": __version__},
            "inputs": self.inputs,
            "model": self.model.to_dict() if self.model else None,
            "tp": {"p": self.tp.p, "source": self.tp.source} if self.tp else None,
            "cost_model": self.cost_model,
            "walk": {str(k): v for k, v in WALK_STEPS.items()},
            "checks": [c.to_dict() for c in self.checks],
            "findings": [c.to_dict() for c in self.findings],
            "sections": {s.id: s.to_dict() for s in self.sections},
        }


def detect_tp(con: duckdb.DuckDBPyConnection, override: int | None) -> TPDegree | None:
    """p: --tp, else the group size of the all-reduces, their process group, world size, or rank files."""
    if override is not None:
        if override < 1:
            raise UsageError(f"--tp must be ≥ 1, got {override}")
        return TPDegree(override, "--tp option")
    row = con.execute(
        "SELECT group_size, count(*) n FROM collectives WHERE op = 'all_reduce' AND group_size IS NOT NULL "
        "GROUP BY group_size ORDER BY n DESC LIMIT 1"
    ).fetchone()
    if row:
        return TPDegree(int(row[0]), "group size of the trace's all-reduce calls")
    row = con.execute(
        "SELECT g.pg_size, count(*) n FROM collectives c JOIN process_groups g "
        "ON g.rank = c.rank AND g.pg_name = c.pg_name WHERE c.op = 'all_reduce' AND g.pg_size IS NOT NULL "
        "GROUP BY g.pg_size ORDER BY n DESC LIMIT 1"
    ).fetchone()
    if row:
        return TPDegree(int(row[0]), "size of the all-reduces' process group (distributedInfo.pg_config)")
    row = con.execute("SELECT max(world_size) FROM inputs").fetchone()
    if row and row[0]:
        return TPDegree(int(row[0]), "distributedInfo.world_size")
    n = con.execute("SELECT count(DISTINCT rank) FROM inputs").fetchone()[0]
    if n > 1:
        return TPDegree(n, "number of ranks in the inputs")
    return None


def _input_rows(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    """One entry per input file, with its ranks and what was ingested/derived from it."""
    rows = query_dicts(
        con,
        """
        SELECT i.input_id, any_value(i.path) AS path, any_value(i.format) AS format,
            any_value(i.profiler) AS profiler, list(i.rank ORDER BY i.rank) FILTER (WHERE i.rank IS NOT NULL) AS ranks,
            any_value(i.rank_source) AS rank_source, max(i.world_size) AS world_size,
            any_value(i.backend) AS backend, any_value(i.device_name) AS device,
            sum(i.events_total) AS events_total, sum(i.events_python_skipped) AS python_events_skipped,
            coalesce(sum(i.bad_records), 0) AS bad_records
        FROM inputs i GROUP BY i.input_id ORDER BY i.input_id""",
    )
    counts = {
        table: dict(
            con.execute(
                f"SELECT i.input_id, count(*) FROM {table} t JOIN inputs i USING (rank) GROUP BY i.input_id"
            ).fetchall()
        )
        for table in ("kernels", "cpu_ops", "collectives", "steps")
    }
    out = []
    for r in rows:
        c = {t: counts[t].get(r["input_id"], 0) for t in counts}
        c |= {"events_total": r.pop("events_total"), "python_events_skipped": r.pop("python_events_skipped")}
        c["bad_records"] = int(r.pop("bad_records"))
        r.pop("input_id")
        r["ranks"] = r["ranks"] or []
        out.append(r | {"counts": c})
    return out


def analyze(
    paths: list[str | Path],
    model: str | Path | ModelConfig | None = None,
    tp: int | None = None,
    db_path: str | Path | None = None,
    keep_python: bool = False,
    jobs: int | None = None,
    settings: Settings | None = None,
    extra_inputs: list[tuple[str | Path, str]] = (),
    extra_rules: list[str] = (),
    extra_sections: list[str] = (),
) -> Report:
    """Ingest inputs into a DuckDB store (file `db_path` or in memory), derive, run the rules.

    `paths` are traces or folders of traces (format detected from content); `extra_inputs` are
    (path, format) pairs given with an explicit format (CLI --metrics, --log, --bench, ...).
    `extra_rules` / `extra_sections` are module names run after the registered ones (development, plugins).
    """
    files: list[tuple[Path, str | None]] = [(f, None) for f in discover_inputs(paths)] if paths else []
    files += [(Path(p), fmt) for p, fmt in extra_inputs]
    if not files:
        raise UsageError("no inputs given: pass traces, or --metrics/--log/--bench files")
    for p, _ in files:
        if not p.exists():
            raise InputError(p, "no such file or directory")
    model_cfg = load_model_config(model) if isinstance(model, (str, Path)) else model
    parsed = parse_all(files, keep_python=keep_python, jobs=jobs)
    con = open_store(db_path)
    try:
        load(con, parsed)
        del parsed
        build_all(con)
        tpd = detect_tp(con, tp)
        ctx = Context(con=con, model=model_cfg, tp=tpd, settings=settings or Settings())
        rules = load_rules() + [importlib.import_module(m) for m in extra_rules if m not in RULE_MODULES]
        checks = run_rules(ctx, rules)
        return Report(
            inputs=_input_rows(con),
            model=model_cfg,
            tp=tpd,
            checks=checks,
            sections=build_sections(ctx, extra=extra_sections),
        )
    finally:
        con.close()
