"""Library entry point: `analyze(paths, model=...) -> Report`. The CLI is a thin layer over this."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb

from tracediag import __version__
from tracediag.derive import build_all
from tracediag.engine import Context, Settings, TPDegree, run_rules
from tracediag.errors import UsageError
from tracediag.findings import WALK_STEPS, Check
from tracediag.ingest import discover_inputs, load, parse_all
from tracediag.model import ModelConfig, load_model_config
from tracediag.store import open_store, query_dicts

SCHEMA_ID = "tracediag/findings-v1"


@dataclass
class Report:
    """Everything the renderers need; `to_dict()` is the findings.json document."""

    inputs: list[dict[str, Any]]
    model: ModelConfig | None
    tp: TPDegree | None
    checks: list[Check]
    steps: list[dict[str, Any]] = field(default_factory=list)
    collectives_by_rank: list[dict[str, Any]] = field(default_factory=list)

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
            "steps": self.steps,
            "collectives_by_rank": self.collectives_by_rank,
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
        return TPDegree(n, "number of rank traces given")
    return None


def _input_rows(con: duckdb.DuckDBPyConnection) -> list[dict[str, Any]]:
    rows = con.execute("""
        SELECT i.path, i.format, i.profiler, i.rank, i.rank_source, i.world_size, i.backend, i.device_name,
            i.events_total, i.events_python_skipped,
            (SELECT count(*) FROM kernels k WHERE k.rank = i.rank) AS kernels,
            (SELECT count(*) FROM cpu_ops o WHERE o.rank = i.rank) AS cpu_ops,
            (SELECT count(*) FROM collectives c WHERE c.rank = i.rank) AS collectives,
            (SELECT count(*) FROM steps s WHERE s.rank = i.rank) AS steps
        FROM inputs i ORDER BY i.input_id""").fetchall()
    out = []
    for r in rows:
        (
            path,
            fmt,
            profiler,
            rank,
            rank_source,
            world,
            backend,
            device,
            total,
            skipped,
            kernels,
            cpu_ops,
            colls,
            steps,
        ) = r
        out.append(
            {
                "path": path,
                "format": fmt,
                "profiler": profiler,
                "ranks": [rank],
                "rank_source": rank_source,
                "world_size": world,
                "backend": backend,
                "device": device,
                "counts": {
                    "kernels": kernels,
                    "cpu_ops": cpu_ops,
                    "collectives": colls,
                    "steps": steps,
                    "events_total": total,
                    "python_events_skipped": skipped,
                },
            }
        )
    return out


def analyze(
    paths: list[str | Path],
    model: str | Path | ModelConfig | None = None,
    tp: int | None = None,
    db_path: str | Path | None = None,
    keep_python: bool = False,
    jobs: int | None = None,
    settings: Settings | None = None,
) -> Report:
    """Ingest the traces into a DuckDB store (file `db_path` or in memory), derive, run the rules."""
    files = discover_inputs(paths)
    model_cfg = load_model_config(model) if isinstance(model, (str, Path)) else model
    parsed = parse_all(files, keep_python=keep_python, jobs=jobs)
    con = open_store(db_path)
    try:
        load(con, parsed)
        del parsed
        build_all(con)
        tpd = detect_tp(con, tp)
        ctx = Context(con=con, model=model_cfg, tp=tpd, settings=settings or Settings())
        checks = run_rules(ctx)
        steps = query_dicts(
            con,
            """
            SELECT s.rank, s.step_id, s.name, s.marker_source, s.phase, s.T, s.t_source, s.ts_ns, s.dur_ns,
                   s.gpu_end_ns - s.gpu_ts_ns AS gpu_span_ns, s.kernel_count,
                   count(c.op) FILTER (WHERE c.op = 'all_reduce') AS all_reduces,
                   count(c.op) AS collectives, sum(c.dur_ns) AS collective_ns
            FROM steps s LEFT JOIN collectives c USING (rank, step_id)
            GROUP BY ALL ORDER BY s.rank, s.step_id""",
        )
        colls = query_dicts(
            con,
            """
            SELECT rank, op, dtype, group_size, count(*) AS calls, count(payload_bytes) AS sized_calls,
                   min(payload_bytes) AS min_payload_bytes, max(payload_bytes) AS max_payload_bytes,
                   sum(payload_bytes) AS total_payload_bytes, sum(dur_ns) AS total_ns,
                   any_value(evidence) AS size_from, count(kernel_name) AS with_kernel
            FROM collectives GROUP BY ALL ORDER BY rank, calls DESC""",
        )
        return Report(
            inputs=_input_rows(con), model=model_cfg, tp=tpd, checks=checks, steps=steps, collectives_by_rank=colls
        )
    finally:
        con.close()
