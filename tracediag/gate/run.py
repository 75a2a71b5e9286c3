"""A whole check run: config, rule selection, the analysis, the judgement, and the files it writes
(check.json in --out, --junit, --annotated-trace). The CLI (`tracediag check`) only parses options and prints."""

from __future__ import annotations

import dataclasses
import tempfile
import time
from pathlib import Path

import orjson

from tracediag.analysis import run as run_analysis
from tracediag.engine import load_rules
from tracediag.errors import UsageError
from tracediag.files import OutputGuard
from tracediag.findings import compact_long_strings, option_name
from tracediag.gate.annotate import write_annotated_trace
from tracediag.gate.config import FAIL_ON_LEVELS, parse_rule_globs, select_rules
from tracediag.gate.judge import judge
from tracediag.gate.junit import write_junit
from tracediag.measures import run_measures
from tracediag.output import OUTPUT_NAMES, staged_outputs
from tracediag.request import Request
from tracediag.runs import load_run, read_back


def check_json(result) -> bytes:
    """check.json: the judged result (also `tracediag check --format json`)."""
    return orjson.dumps(result.to_dict(), option=orjson.OPT_INDENT_2 | orjson.OPT_NON_STR_KEYS, default=str) + b"\n"


def _selection(cfg, rules: str | None, require: str | None) -> tuple[list[str], list[str], list[str]]:
    """(rule ids to run, rule ids that must run, warnings) from --rules / --require or the config's keys: the
    required rules run even when --rules leaves them out; a --rules glob matching nothing is a warning (a rule of a
    later version), a --require one an error (the check could not vouch for it)."""
    patterns = parse_rule_globs(rules) if rules is not None else cfg.rules
    if patterns is None:
        raise UsageError(f"--rules: {rules!r} is not rule ids or globs such as COL*,SHP001")
    known = [m.RULE.id for m in load_rules()]
    selected, unmatched = select_rules(patterns, known)
    if patterns and not selected:
        raise UsageError(f"--rules {','.join(patterns)} matches no rule (rules: {', '.join(known)})")
    warnings = [f"rule selection '{p}' matches no rule in this version (rules: {', '.join(known)})" for p in unmatched]
    req_patterns = parse_rule_globs(require) if require is not None else cfg.require
    if req_patterns is None:
        raise UsageError(f"--require: {require!r} is not rule ids or globs such as SHP*,COL*")
    required, req_unmatched = select_rules(req_patterns, known) if req_patterns else ([], [])
    if req_unmatched:
        raise UsageError(
            f"--require {','.join(req_unmatched)} matches no rule in this version (rules: {', '.join(known)})"
        )
    return [r for r in known if r in set(selected) | set(required)], required, warnings


def _check_outputs(guard: OutputGuard, junit: Path | None, annotated_trace: Path | None, out: Path | None) -> None:
    """Every output path is checked before anything runs: never an input, never a file tracediag did not write."""
    for option, p in (("--junit", junit), ("--annotated-trace", annotated_trace)):
        if p is not None:
            guard.check_file(p, option)
            if Path(p).is_dir():
                raise UsageError(f"{p} is a folder; give a file path")
    if junit is not None and annotated_trace is not None and Path(junit).absolute() == Path(annotated_trace).absolute():
        raise UsageError(f"--junit and --annotated-trace are both {junit}; give each its own file")
    if out is not None:
        guard.check_folder(out, OUTPUT_NAMES)


def run_check(
    request: Request,
    *,
    fail_on: str | None = None,
    baseline: Path | None = None,
    junit: Path | None = None,
    annotated_trace: Path | None = None,
    rules: str | None = None,
    require: str | None = None,
    out: Path | None = None,
    progress=None,
    force: bool = False,
):
    """The whole check; returns (CheckResult, warnings). Raises TracediagError on what the user can fix.

    `require` (or the config's `require`): rule globs that must run; a selected rule that could not run then
    makes the check inconclusive (CheckResult.outcome). Required rules are run even when `rules` leaves them out.

    Only the selected and required rules run (a rule reading another's verdict through
    `tracediag.rules.upstream_check` still gets it). What links findings (`downstream_of`), folds them and
    picks the verdict is computed over the rules that ran: a finding is never explained by a rule that was
    not selected, and the verdict and coverage count the selected rules only.

    Outputs (`junit`, `annotated_trace`, the files in `out`) never replace an input, nor a file tracediag did not
    write unless `force` (tracediag/files.py); both are checked before anything runs."""
    t0 = time.monotonic()
    if not request.traces and not request.side_inputs and request.store is None:
        raise UsageError("no inputs given: pass the traces of the run to check")
    if fail_on is not None and fail_on not in FAIL_ON_LEVELS:
        raise UsageError(f"--fail-on must be one of {', '.join(FAIL_ON_LEVELS)}, got '{fail_on}'")
    cfg = request.config
    selected, required, warnings = _selection(cfg, rules, require)
    request = dataclasses.replace(request, rules=tuple(selected))
    _check_outputs(OutputGuard.of(request.read_paths(), baseline, cfg.path, force=force), junit, annotated_trace, out)
    holder = {}
    with tempfile.TemporaryDirectory(prefix="tracediag-check-") as tmp:
        base = None
        if baseline is not None:
            base = load_run(baseline, Path(tmp) / "baseline", request=dataclasses.replace(request, rules=None))

        def produce(staging: Path):
            db = staging / "trace.duckdb"
            # without --out the store is read back by this check alone (its measures, the annotated trace), then
            # removed: its ~600 column comments (0.15 s of CPU) would be written for nobody
            report = run_analysis(request, db, progress=progress, column_comments=out is not None)
            holder["checks"] = report.checks
            doc = compact_long_strings(report.to_dict())  # what findings.json holds, judged without reading it back
            with read_back(*([base] if base is not None else [])):
                result = judge(
                    doc,
                    run_measures(doc, db),
                    cfg,
                    fail_on=fail_on,
                    baseline=base,
                    db_path=db,
                    rules_selected=selected,
                    required=required,
                )
            result.elapsed_s = time.monotonic() - t0
            (staging / "check.json").write_bytes(check_json(result))
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
        if request.model is None:
            blocked = [c.rule for c in holder["checks"] if c.status == "not_applicable"
                       and c.enable and option_name(c.enable[0]) == "--model"]  # fmt: skip
            if blocked:
                warnings.append(
                    f"no --model given: {len(blocked)} of {len(selected)} selected rules could not run "
                    f"({', '.join(blocked)}); pass --model config.json (the served model's Hugging Face config)"
                )
        try:
            if annotated_trace is not None:
                write_annotated_trace(db_path, result.findings(), annotated_trace)
            if junit is not None:
                names = [str(p) for p in request.traces] or ([str(request.store)] if request.store else [])
                write_junit(result, junit, names)
        except OSError as exc:
            raise UsageError(f"cannot write {exc.filename or 'output'}: {exc.strerror or exc}") from None
    return result, warnings
