"""`tracediag check`: the rules in CI. Exit 0 when nothing at or above --fail-on is new, 1 when something
is, 2 on usage or input errors (one line on stderr), 3 on an internal error."""

from __future__ import annotations

import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import orjson
import typer

from tracediag import cli_options as opt

EXIT_FAILED = 1
_MARK = {"fail": "FAIL", "finding": "note", "pass": "pass", "skipped": "skip"}


def register(app: typer.Typer) -> None:
    app.command("check")(check)


def check(
    inputs: opt.Inputs = None,
    model: opt.Model = None,
    tp: opt.Tp = None,
    fail_on: Annotated[
        str | None,
        typer.Option(
            "--fail-on", help="Lowest severity that fails: info, warning or error (config: fail_on; default warning)."
        ),
    ] = None,
    baseline: Annotated[
        Path | None,
        typer.Option(
            "--baseline",
            help="A previous run: its findings.json (or analyze output folder), or its traces. Only new or "
            "worsened findings and regressed key measures fail.",
        ),
    ] = None,
    junit: Annotated[
        Path | None, typer.Option("--junit", help="Write JUnit XML here (one test case per rule).")
    ] = None,
    annotated_trace: Annotated[
        Path | None,
        typer.Option("--annotated-trace", help="Write a Chrome-trace JSON with each finding marked (Perfetto UI)."),
    ] = None,
    rules: Annotated[
        str | None, typer.Option("--rules", help="Rules to run: ids or globs, e.g. 'COL*,SHP001' (config: rules).")
    ] = None,
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            help="tracediag.toml or pyproject.toml ([tool.tracediag]); default: found from the current folder up.",
        ),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="Also write report.html, findings.json, trace.duckdb and check.json here."),
    ] = None,
    metrics: opt.Metrics = None,
    log: opt.Log = None,
    bench: opt.Bench = None,
    nccl_tests: opt.NcclTests = None,
    topology: opt.Topology = None,
    keep_python: opt.KeepPython = False,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="Parallel parser processes.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Only the verdict line.")] = False,
    debug: opt.Debug = False,
) -> None:
    """Run the rules as a CI gate: exit 1 when a finding at or above --fail-on is new (vs --baseline)."""
    from tracediag.cli import _guard, extra_inputs_from

    extra = extra_inputs_from(metrics=metrics, log=log, bench=bench, nccl_tests=nccl_tests, topology=topology)
    result, warnings = _guard(
        lambda: run(
            inputs or [],
            model=model,
            tp=tp,
            fail_on=fail_on,
            baseline=baseline,
            junit=junit,
            annotated_trace=annotated_trace,
            rules=rules,
            config=config,
            out=out,
            extra_inputs=extra,
            keep_python=keep_python,
            jobs=jobs,
        ),
        debug,
    )
    for w in warnings:
        typer.echo(f"tracediag: warning: {w}", err=True)
    print_result(result, quiet=quiet, junit=junit, annotated_trace=annotated_trace, out=out)
    raise typer.Exit(0 if result.passed else EXIT_FAILED)


def run(
    inputs: list[Path],
    *,
    model: Path | None = None,
    tp: int | None = None,
    fail_on: str | None = None,
    baseline: Path | None = None,
    junit: Path | None = None,
    annotated_trace: Path | None = None,
    rules: str | None = None,
    config: Path | None = None,
    out: Path | None = None,
    extra_inputs: list[tuple[Path, str]] = (),
    keep_python: bool = False,
    jobs: int | None = None,
):
    """The whole check; returns (CheckResult, warnings). Raises TracediagError on what the user can fix."""
    from tracediag.analysis import analyze
    from tracediag.annotate import write_annotated_trace
    from tracediag.checkrun import (
        FAIL_ON_LEVELS,
        judge,
        load_config,
        load_run,
        parse_rule_globs,
        run_measures,
        select_rules,
    )
    from tracediag.engine import load_rules
    from tracediag.errors import UsageError
    from tracediag.junit import write_junit
    from tracediag.output import findings_json, staged_outputs

    t0 = time.monotonic()
    if not inputs and not extra_inputs:
        raise UsageError("no inputs given: pass the traces of the run to check")
    if fail_on is not None and fail_on not in FAIL_ON_LEVELS:
        raise UsageError(f"--fail-on must be one of {', '.join(FAIL_ON_LEVELS)}, got '{fail_on}'")
    cfg = load_config(config)
    patterns = parse_rule_globs(rules) if rules is not None else cfg.rules
    if patterns is None:
        raise UsageError(f"--rules: {rules!r} is not rule ids or globs such as COL*,SHP001")
    known = [m.RULE.id for m in load_rules()]
    selected, unmatched = select_rules(patterns, known)
    warnings = []
    if patterns and not selected:
        raise UsageError(f"--rules {','.join(patterns)} matches no rule (rules: {', '.join(known)})")
    for p in unmatched:
        warnings.append(f"rule selection '{p}' matches no rule in this version (rules: {', '.join(known)})")
    for p in (junit, annotated_trace):
        if p is not None and Path(p).is_dir():
            raise UsageError(f"{p} is a folder; give a file path")
    holder = {}
    with tempfile.TemporaryDirectory(prefix="tracediag-check-") as tmp:
        base = None
        if baseline is not None:
            base = load_run(
                baseline,
                Path(tmp) / "baseline",
                model=model,
                tp=tp,
                jobs=jobs,
                keep_python=keep_python,
                settings=cfg.settings,
            )

        def produce(staging: Path):
            db = staging / "trace.duckdb"
            report = analyze(
                inputs,
                model=model,
                tp=tp,
                db_path=db,
                keep_python=keep_python,
                jobs=jobs,
                settings=cfg.settings,
                extra_inputs=list(extra_inputs),
            )
            report = dataclasses.replace(report, checks=[c for c in report.checks if c.rule in selected])
            doc = orjson.loads(findings_json(report))
            result = judge(
                doc, run_measures(doc, db), cfg, fail_on=fail_on, baseline=base, db_path=db, rules_selected=selected
            )
            result.elapsed_s = time.monotonic() - t0
            (staging / "check.json").write_bytes(
                orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str)
                + b"\n"
            )
            holder["result"] = result
            return report

        if out is not None:
            staged_outputs(out, produce)
            db_path = Path(out) / "trace.duckdb"
        else:
            work = Path(tmp) / "run"
            work.mkdir()
            produce(work)
            db_path = work / "trace.duckdb"
        result = holder["result"]
        try:
            if annotated_trace is not None:
                write_annotated_trace(db_path, result.findings(), annotated_trace)
            if junit is not None:
                write_junit(result, junit, [str(p) for p in inputs])
        except OSError as exc:
            raise UsageError(f"cannot write {exc.filename or 'output'}: {exc.strerror or exc}") from None
    return result, warnings


def print_result(result, *, quiet: bool = False, junit=None, annotated_trace=None, out=None, file=None) -> None:
    file = file or sys.stdout
    c = {s: [o for o in result.outcomes if o.status == s] for s in ("fail", "finding", "pass", "skipped")}
    if not quiet:
        base = f", baseline {result.baseline.label}" if result.baseline else ""
        cfg = f", config {result.config.path}" if result.config.path else ""
        print(f"tracediag check: {len(result.rules_selected)} rule(s), fail on {result.fail_on}{base}{cfg}", file=file)
        for o in result.outcomes:
            if o.suite == "baseline" and o.status in ("pass", "skipped"):
                continue  # many measures: only regressions are listed; counts below
            vs = f" [{o.vs_baseline}]" if o.vs_baseline and o.status in ("fail", "finding") else ""
            sev = f" {o.severity}" if o.severity and o.status in ("fail", "finding") else ""
            print(f"  {_MARK[o.status]:<5} {o.id}{sev}{vs}: {o.message}", file=file)
        measured = [o for o in result.outcomes if o.suite == "baseline"]
        if measured:
            ok = sum(1 for o in measured if o.status == "pass")
            print(f"  baseline: {ok} of {len(measured)} key measures within tolerance", file=file)
        for label, path in (("junit", junit), ("annotated trace", annotated_trace), ("outputs", out)):
            if path is not None:
                print(f"  {label}: {path}", file=file)
    if result.passed:
        known = len(c["finding"])
        tail = f" ({known} finding(s) known or below {result.fail_on})" if known else ""
        print(f"PASSED: nothing new at or above {result.fail_on}{tail}", file=file)
    else:
        ids = ", ".join(o.id for o in c["fail"])
        print(f"FAILED: {len(c['fail'])} new at or above {result.fail_on}: {ids}", file=file)
