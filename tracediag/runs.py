"""One earlier or current run as `check --baseline` and `diff` compare it: a findings.json, an output folder
(findings.json + trace.duckdb), or inputs analysed on the spot, with its key measures.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import orjson

from tracediag.context import Settings
from tracediag.errors import InputError
from tracediag.measures import run_measures

FINDINGS_SCHEMA_PREFIX = "tracediag/findings-"


@dataclass
class RunData:
    """One run as check/diff compare it: its findings.json document, its store when there is one."""

    label: str  # the path as given
    kind: Literal["findings", "output", "inputs"]
    doc: dict[str, Any]
    db_path: Path | None
    measures: dict[str, Any] = field(default_factory=dict)


def is_findings_json(path: Path) -> bool:
    if not path.is_file() or path.suffix != ".json":
        return False
    with open(path, "rb") as f:
        head = f.read(4096)
    return b'"schema"' in head and FINDINGS_SCHEMA_PREFIX.encode() in head


def read_findings(path: Path) -> dict[str, Any]:
    try:
        doc = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise InputError(path, f"not valid JSON ({exc})") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if not isinstance(schema, str) or not schema.startswith(FINDINGS_SCHEMA_PREFIX):
        raise InputError(path, "not a tracediag findings.json (no 'schema': 'tracediag/findings-v1')")
    if schema != "tracediag/findings-v1":
        raise InputError(path, f"findings schema {schema} is not supported (this version reads tracediag/findings-v1)")
    if not isinstance(doc.get("checks"), list):
        raise InputError(path, "findings.json without a 'checks' list")
    return doc


def load_run(
    path: str | Path,
    workdir: Path,
    *,
    model: str | Path | None = None,
    tp: int | None = None,
    jobs: int | None = None,
    keep_python: bool = False,
    settings: Settings | None = None,
) -> RunData:
    """A findings.json, an analyze output folder (findings.json + trace.duckdb), a Parquet store, or inputs."""
    p = Path(path)
    if not p.exists():
        raise InputError(p, "no such file or directory")
    if is_findings_json(p):
        db = p.parent / "trace.duckdb"
        run = RunData(str(path), "findings", read_findings(p), db if db.is_file() else None)
    elif p.is_dir() and (p / "findings.json").is_file():
        db = p / "trace.duckdb"
        run = RunData(str(path), "output", read_findings(p / "findings.json"), db if db.is_file() else None)
    else:
        from tracediag.analysis import analyze
        from tracediag.output import findings_json

        workdir.mkdir(parents=True, exist_ok=True)
        db = workdir / f"run{len(list(workdir.glob('run*.duckdb')))}.duckdb"
        from tracediag.store.parquet import is_store

        if is_store(p):  # a Parquet store from `tracediag ingest`: its tables, not re-parsed
            report = analyze([], model=model, tp=tp, db_path=db, settings=settings, store=p)
        else:
            report = analyze([p], model=model, tp=tp, db_path=db, jobs=jobs, keep_python=keep_python, settings=settings)
        run = RunData(str(path), "inputs", orjson.loads(findings_json(report)), db)  # exactly what findings.json holds
    run.measures = run_measures(run.doc, run.db_path)
    return run
