"""What each `tracediag mcp` tool does, as plain functions from paths to JSON-ready dicts: the library calls the
CLI makes (analysis.analyze, runs, diff.run_diff, gate.run.run_check), without MCP. Errors are the library's
own TracediagError (a UsageError or InputError naming the input), which the server turns into tool errors.

A *run* is what `analyze` (or `check --out`) wrote: an output folder, its findings.json, or its trace.duckdb. A
Parquet store from `tracediag ingest` is a run too: it is analysed once (into the workspace), not re-parsed.
"""

from __future__ import annotations

import io
import itertools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tracediag.errors import InputError, UsageError
from tracediag.findings import WALK_STEPS, impact_text
from tracediag.findings import verdict as build_verdict
from tracediag.gate.outcome import finding_id

Progress = Callable[[str], None]

TABLE_ROWS = 20  # rows of a finding's per-rank/per-step table that `explain` returns (the count says how many)
VERDICT_KEYS = ("status", "headline", "rule", "severity", "confidence", "cost", "next_check", "explains")


def jsonable(v: Any) -> Any:
    """A document as strict JSON: a non-finite float (a request rate of inf) as its text, not null."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    return v


def summary(doc: dict[str, Any], run: Path) -> dict[str, Any]:
    """The verdict, the coverage and the ranked findings (id, title, impact) of one run's findings.json."""
    v = doc.get("verdict") or build_verdict(doc["checks"])
    cov = v.get("coverage") or {}
    return {
        "run": str(run),
        "verdict": {k: v.get(k) for k in VERDICT_KEYS},
        "coverage": {
            "rules": cov.get("rules"),
            "ran": cov.get("ran"),
            "could_not_run": cov.get("could_not_run"),
            "text": v.get("coverage_text"),
            "enable": cov.get("enable") or [],
        },
        "findings": [
            {
                "id": finding_id(c),
                "rule": c["rule"],
                "severity": c.get("severity"),
                "title": c["title"],
                "impact": c.get("impact"),
                "cost": impact_text(c),
                "confidence": c.get("confidence"),
                "downstream_of": c.get("downstream_of") or [],
            }
            for c in doc.get("findings") or []
        ],
        "tp": (doc.get("tp") or {}).get("p"),
        "model": (doc.get("model") or {}).get("path"),
    }


class Workspace:
    """The tools over one folder of runs: `analyze` without `out` writes `runs_dir/run-N`; a Parquet store given
    as a run is analysed into it once."""

    def __init__(self, runs_dir: Path) -> None:
        self.runs_dir = Path(runs_dir)
        self._stores: dict[Path, Path] = {}

    def _new_run_dir(self) -> Path:
        self.runs_dir.mkdir(parents=True, exist_ok=True)
        for n in itertools.count(1):
            p = self.runs_dir / f"run-{n}"
            if not p.exists():
                return p
        raise AssertionError("unreachable")

    # --- runs -------------------------------------------------------------------------------------------
    def resolve(self, run: str, progress: Progress | None = None) -> tuple[Path, dict[str, Any], Path | None]:
        """(output folder, findings.json document, trace.duckdb or None) of a run given as a path."""
        from tracediag.runs import read_findings
        from tracediag.store.parquet import is_store

        p = Path(run)
        if not p.exists():
            raise InputError(p, "no such file or directory")
        if p.is_dir() and is_store(p):
            p = self._analysed_store(p, progress)
        if p.is_file() and p.suffix == ".duckdb":
            p = p.parent
        folder = p.parent if p.is_file() else p
        findings = p if p.is_file() else p / "findings.json"
        if not findings.is_file():
            raise InputError(
                p, "not a run: no findings.json here (give an analyze or check --out folder; analyze first)"
            )
        db = folder / "trace.duckdb"
        return folder, read_findings(findings), db if db.is_file() else None

    def _analysed_store(self, store: Path, progress: Progress | None) -> Path:
        key = store.resolve()
        if key not in self._stores:
            from tracediag.analysis import analyze
            from tracediag.output import staged_outputs

            out = self._new_run_dir()
            staged_outputs(out, lambda staging: analyze([], db_path=staging / "trace.duckdb", store=store,
                                                        progress=progress))  # fmt: skip
            self._stores[key] = out
        return self._stores[key]

    # --- the tools --------------------------------------------------------------------------------------
    def analyze(
        self,
        inputs: list[str],
        model: str | None = None,
        out: str | None = None,
        log: str | None = None,
        metrics: str | None = None,
        bench: str | None = None,
        tp: int | None = None,
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """Analyse traces and telemetry into `out` (default: a new folder of the workspace), as `tracediag
        analyze` does; the run's verdict, coverage and ranked findings."""
        import orjson

        from tracediag.analysis import analyze
        from tracediag.files import OutputGuard
        from tracediag.output import staged_outputs

        if tp is not None and tp < 1:
            raise UsageError(f"tp must be at least 1, got {tp}")
        extra = [(Path(p), fmt) for p, fmt in ((log, "vllm-log"), (metrics, "prometheus"), (bench, "vllm-bench")) if p]
        out_dir = Path(out) if out else self._new_run_dir()

        def produce(staging: Path):
            return analyze([Path(p) for p in inputs], model=model, tp=tp, db_path=staging / "trace.duckdb",
                           extra_inputs=extra, progress=progress)  # fmt: skip

        if out is not None and not out.strip():
            raise UsageError("out: empty path; give a folder, or leave it out for a new one")
        guard = OutputGuard.of(inputs, model, [p for p, _ in extra])  # never an input, never a file not ours
        staged_outputs(out_dir, produce, guard=guard)
        return summary(orjson.loads((out_dir / "findings.json").read_bytes()), out_dir)

    def findings(self, run: str, progress: Progress | None = None) -> dict[str, Any]:
        folder, doc, _ = self.resolve(run, progress)
        return summary(doc, folder)

    def explain(self, run: str, rule: str) -> dict[str, Any]:
        """One rule's outcome on a run: its status, formula, values plugged in, evidence events, next check."""
        from tracediag.engine import load_rules

        folder, doc, _ = self.resolve(run)
        want = rule.strip().upper()
        matches = [c for c in doc["checks"] if want in (c["rule"].upper(), finding_id(c).upper())]
        if not matches:
            known = ", ".join(sorted({c["rule"] for c in doc["checks"]}))
            raise UsageError(f"explain: no rule '{rule}' in {folder} (rules: {known})")
        c = matches[0]
        module = next((m for m in load_rules() if m.RULE.id == c["rule"]), None)
        table = c.get("table") or []
        return {
            "run": str(folder),
            "id": finding_id(c),
            "rule": c["rule"],
            "status": c["status"],
            "title": c["title"],
            "step": c.get("step"),
            "walk_step": WALK_STEPS.get(c.get("step")),
            "rule_title": module.RULE.title if module else None,
            "severity": c.get("severity"),
            "confidence": c.get("confidence"),
            "impact": c.get("impact"),
            "cost": impact_text(c) if c["status"] == "finding" else None,
            "formula": c.get("formula"),
            "substituted": c.get("substituted"),
            "values": c.get("values") or {},
            "evidence": c.get("evidence") or [],
            "next_check": c.get("next_check"),
            "reason": c.get("reason"),
            "downstream_of": c.get("downstream_of") or [],
            "table": table[:TABLE_ROWS],
            "table_rows": len(table),
            "also": [finding_id(x) for x in matches[1:]],
            "about": (module.__doc__ or "").strip() if module else None,
        }

    def query(self, run: str, sql: str, max_rows: int | None = None, time_limit_s: float | None = None) -> dict:
        """One read-only SELECT over the run's trace.duckdb (readonly_sql)."""
        from tracediag.agent.readonly_sql import MAX_ROWS, TIME_LIMIT_S, read_only_query

        folder, _, db = self.resolve(run)
        if db is None:
            raise InputError(folder, "no trace.duckdb beside findings.json: nothing to query")
        res = read_only_query(db, sql, max_rows or MAX_ROWS, time_limit_s or TIME_LIMIT_S)
        return {"run": str(folder)} | res

    def diff(
        self,
        before: str,
        after: str,
        model: str | None = None,
        force_compare: bool = False,
        out: str | None = None,
    ) -> dict[str, Any]:
        """`tracediag diff` of two runs (output folders, findings.json, traces or stores): the comparability
        verdict with both fingerprints, and — when comparable or forced — what changed."""
        from tracediag.diff import run_diff

        m = Path(model) if model else None
        d = run_diff(Path(before), Path(after), before_model=m, after_model=m, out=Path(out) if out else None,
                     force_compare=force_compare)  # fmt: skip
        return jsonable(d | {"out": out})

    def check(
        self,
        inputs: list[str],
        model: str | None = None,
        tp: int | None = None,
        fail_on: str | None = None,
        baseline: str | None = None,
        rules: str | None = None,
        require: str | None = None,
        config: str | None = None,
        out: str | None = None,
        log: str | None = None,
        metrics: str | None = None,
        bench: str | None = None,
        progress: Progress | None = None,
    ) -> dict[str, Any]:
        """The gate as `tracediag check` gives it: outcome (passed / failed / inconclusive), its exit status,
        the judged items that are not plain passes, and the command's own text."""
        from tracediag.gate.run import run_check
        from tracediag.gate.text import print_result

        extra = [(Path(p), fmt) for p, fmt in ((log, "vllm-log"), (metrics, "prometheus"), (bench, "vllm-bench")) if p]
        result, warnings = run_check(
            [Path(p) for p in inputs],
            model=Path(model) if model else None,
            tp=tp,
            fail_on=fail_on,
            baseline=Path(baseline) if baseline else None,
            rules=rules,
            require=require,
            config=Path(config) if config else None,
            out=Path(out) if out else None,
            extra_inputs=extra,
            progress=progress,
        )
        text = io.StringIO()
        print_result(result, file=text, out=out)
        d = result.to_dict()
        return {
            "outcome": result.outcome,
            "exit_code": result.exit_code,
            "fail_on": result.fail_on,
            "inconclusive": d["inconclusive"],
            "counts": d["counts"],
            "coverage": d["coverage"],
            "verdict": {k: result.doc["verdict"].get(k) for k in VERDICT_KEYS},
            # the items that are not plain passes, without the full finding (explain gives that)
            "outcomes": [
                {k: v for k, v in o.to_dict().items() if k != "check"} for o in result.outcomes if o.status != "pass"
            ],
            "warnings": warnings,
            "text": text.getvalue(),
            "out": out,
        }
