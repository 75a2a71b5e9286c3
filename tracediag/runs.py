"""One earlier or current run as `check --baseline` and `diff` compare it: a findings.json, an output folder
(findings.json + trace.duckdb), or inputs analysed on the spot, with its key measures.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import msgspec
import orjson

from tracediag.errors import InputError, UsageError
from tracediag.measures import run_measures
from tracediag.request import Request

FINDINGS_SCHEMA_PREFIX = "tracediag/findings-"
FINDINGS_SCHEMA_VERSION = 1  # the findings.json layout this version writes and reads
_MAX_FINDINGS_BYTES = 512 * 1024 * 1024  # a findings.json is kilobytes to a few MB; beyond this it is not ours


# The parts of findings.json that check --baseline and diff read, with their types: a document edited by hand,
# cut short or written by another tool is refused naming the file, before anything reads a field of it.
class _CheckDoc(msgspec.Struct):
    rule: str
    status: Literal["pass", "finding", "not_applicable"]
    step: int | None = None
    title: str | None = None
    reason: str | None = None
    severity: Literal["info", "warning", "error"] | None = None
    confidence: str | None = None
    impact: float | None = None
    formula: str | None = None
    substituted: str | None = None
    next_check: str | None = None
    values: dict[str, Any] | None = None
    evidence: list[dict[str, Any]] | None = None
    table: list[dict[str, Any]] | None = None


class _InputDoc(msgspec.Struct):
    path: str | None = None
    format: str | None = None
    ranks: list[int | None] | None = None
    device: str | None = None
    counts: dict[str, Any] | None = None


class _TableSection(msgspec.Struct):
    tables: dict[str, list[dict[str, Any]]] | None = None


class _FindingsDoc(msgspec.Struct):
    schema: str
    checks: list[_CheckDoc]
    inputs: list[_InputDoc] = []
    findings: list[dict[str, Any]] = []
    sections: dict[str, _TableSection | None] | None = None
    model: dict[str, Any] | None = None
    tp: dict[str, Any] | int | None = None
    verdict: dict[str, Any] | None = None
    layout: dict[str, Any] | None = None
    ranks: dict[str, Any] | None = None


class ReadBackError(Exception):
    """A field of a document read back had a type that no tracediag writes (raised inside the comparison)."""


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
    """A findings.json read back (check --baseline, diff): its schema version checked, its structure validated."""
    from tracediag.files import require_regular_file

    require_regular_file(path)
    try:
        if path.stat().st_size > _MAX_FINDINGS_BYTES:
            raise InputError(path, f"{path.stat().st_size:,} bytes: too large for a tracediag findings.json")
        doc = orjson.loads(path.read_bytes())
    except orjson.JSONDecodeError as exc:
        raise InputError(
            path, f"not valid JSON ({exc}); cut short? rerun tracediag analyze to write it again"
        ) from None
    except OSError as exc:
        raise InputError(path, f"cannot read it ({exc.strerror or exc})") from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if not isinstance(schema, str) or not schema.startswith(FINDINGS_SCHEMA_PREFIX):
        raise InputError(path, "not a tracediag findings.json (no 'schema': 'tracediag/findings-v1')")
    version = schema.removeprefix(FINDINGS_SCHEMA_PREFIX).removeprefix("v")
    if version != str(FINDINGS_SCHEMA_VERSION):
        newer = version.isdigit() and int(version) > FINDINGS_SCHEMA_VERSION
        raise InputError(
            path,
            f"findings schema {schema} is not supported (this version reads "
            f"tracediag/findings-v{FINDINGS_SCHEMA_VERSION}): "
            + ("it is newer; upgrade tracediag" if newer else "rerun tracediag analyze on the run's traces"),
        )
    try:
        msgspec.convert(doc, _FindingsDoc)
    except msgspec.ValidationError as exc:
        raise InputError(path, f"not the findings.json tracediag writes ({exc}); was it edited?") from None
    return doc


def check_database(db: Path) -> None:
    """A trace.duckdb read back beside its findings.json: a DuckDB database with tracediag's tables."""
    import duckdb

    from tracediag.files import database_tables, missing_store_tables, require_regular_file

    require_regular_file(db)
    try:
        with open(db, "rb") as f:
            head = f.read(12)
    except OSError as exc:
        raise InputError(db, f"cannot read it ({exc.strerror or exc})") from None
    if head[8:12] != b"DUCK":
        raise InputError(db, "not a DuckDB database; remove it to compare findings.json alone, or rerun analyze")
    try:
        names = database_tables(db)
    except duckdb.Error as exc:
        raise InputError(db, f"cannot be opened as a DuckDB database ({str(exc).splitlines()[0][:200]})") from None
    missing = missing_store_tables(names) + (["steps"] if "steps" not in names else [])  # steps: derived
    if missing:
        raise InputError(db, f"not a tracediag store: no {', '.join(missing)} table(s); rerun tracediag analyze")


def load_run(
    path: str | Path,
    workdir: Path,
    *,
    request: Request | None = None,
    extra_inputs: Sequence[tuple[Path, str]] = (),
    side: str = "the run",
) -> RunData:
    """A findings.json, an analyze output folder (findings.json + trace.duckdb), a Parquet store, or inputs: analysed
    as `request` says (tracediag.request: model, tp, settings, memory budget…; its own traces and side inputs
    replaced by `path` and the (path, format) `extra_inputs`: logs, scrapes, benchmark results). An analysed run or
    a store already holds what it was analysed with: `extra_inputs` for it are refused, naming `side`."""
    p = Path(path)
    if not p.exists():
        raise InputError(p, "no such file or directory")
    analysed = is_findings_json(p) or (p.is_dir() and (p / "findings.json").is_file())
    if extra_inputs and analysed:
        given = ", ".join(str(x) for x, _ in extra_inputs)
        raise UsageError(
            f"{given}: {side} ({path}) is an analysed run, whose logs, scrapes and benchmark results were read "
            "when it was analysed; give them to `tracediag analyze`, or give the run's traces"
        )
    if is_findings_json(p):
        db = p.parent / "trace.duckdb"
        run = RunData(str(path), "findings", read_findings(p), db if db.exists() else None)
    elif p.is_dir() and (p / "findings.json").is_file():
        db = p / "trace.duckdb"
        run = RunData(str(path), "output", read_findings(p / "findings.json"), db if db.exists() else None)
    else:
        from tracediag.analysis import run as run_analysis
        from tracediag.output import findings_json

        workdir.mkdir(parents=True, exist_ok=True)
        db = workdir / f"run{len(list(workdir.glob('run*.duckdb')))}.duckdb"
        from tracediag.store.parquet import is_store

        if is_store(p) and extra_inputs:
            given = ", ".join(str(x) for x, _ in extra_inputs)
            raise UsageError(
                f"{given}: {side} ({path}) is a Parquet store, whose inputs were ingested with it; ingest the "
                "logs, scrapes and benchmark results with the traces"
            )
        template = dataclasses.replace(request or Request(), traces=(), side_inputs=(), store=None, scheduler=None)
        if is_store(p):  # a Parquet store from `tracediag ingest`: its tables, not re-parsed
            report = run_analysis(dataclasses.replace(template, store=p), db)
        else:
            report = run_analysis(dataclasses.replace(template, traces=(p,), side_inputs=tuple(extra_inputs)), db)
        run = RunData(str(path), "inputs", orjson.loads(findings_json(report)), db)  # exactly what findings.json holds
    if run.kind == "inputs":
        run.measures = run_measures(run.doc, run.db_path)
        return run
    if run.db_path is not None:
        check_database(run.db_path)
    with read_back(run):
        run.measures = run_measures(run.doc, run.db_path)
    return run


@contextlib.contextmanager
def read_back(*runs: RunData):
    """Reading the runs' documents and stores: a type or value no tracediag writes, deep inside a table of
    findings.json, or a table of trace.duckdb another version laid out differently, is the file's fault."""
    import duckdb

    try:
        yield
    except (TypeError, KeyError, AttributeError, ValueError, IndexError, duckdb.Error) as exc:
        stored = [r for r in runs if r.kind != "inputs"]
        if not stored or (isinstance(exc, duckdb.Error) and not any(r.db_path for r in stored)):
            raise
        where = " or ".join(f"{r.label}" for r in stored)
        raise InputError(
            where,
            f"does not hold what tracediag writes ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
            "rerun tracediag analyze on the run's traces",
        ) from None
