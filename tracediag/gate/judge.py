"""Judging a check run: every selected rule is one outcome; a finding at or above `fail_on` fails the
check unless the baseline already had it (same identity, no worse); then expectations and baseline measures.

A check has three outcomes: **passed** (exit 0), **failed** (exit 1: something new at or above `fail_on`) and
**inconclusive** (exit 4: nothing failed, but the check could not say: a required rule could not run, the
run cannot be diagnosed — no selected rule could run, or the verdict says the trace is unfit — or the baseline
cannot be compared with the run). A failure wins over inconclusive: a new finding is a result whatever else could
not be checked.

The baseline is compared only when it can be: the two runs' fingerprints (model, layout, GPU, engine, step shapes,
workload, window fitness) must pass diff's comparability test (tracediag/diff/comparability.py). A baseline of
another model, layout or load would call a finding "known" or a measure "no worse" on the strength of a different
deployment: then every finding is judged as new, no measure is compared, and the check says why.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tracediag.errors import UsageError
from tracediag.findings import SEVERITY_ORDER, coverage
from tracediag.gate.baseline import MeasureChange, compare_measures, judge_baseline
from tracediag.gate.config import FAIL_ON_LEVELS, CheckConfig, Tolerances
from tracediag.gate.expectations import judge_expectations
from tracediag.gate.outcome import Outcome, at_or_above, finding_id
from tracediag.runs import RunData

CHECK_SCHEMA_ID = "tracediag/check-v1"

# Exit status of `tracediag check` per outcome (2 and 3 are usage and internal errors, as for every command).
EXIT_CODES = {"passed": 0, "failed": 1, "inconclusive": 4}

# Verdict statuses that say the run cannot be diagnosed (findings.verdict: "nothing_ran"; "inconclusive" when the
# profiled window is unfit and nothing was found — tracediag/derive/fitness.py; "undetermined" kept for others).
UNDIAGNOSABLE = ("nothing_ran", "inconclusive", "undetermined")

REQUIRED_NOT_RUN = "required, but could not run: "  # the message of a required rule's outcome, before its reason


def _vs_baseline(c: dict[str, Any], base: dict[str, Any] | None, tol: Tolerances) -> str:
    if base is None or base.get("status") != "finding":
        return "new"
    sc, sb = SEVERITY_ORDER.get(c.get("severity") or "info", 2), SEVERITY_ORDER.get(base.get("severity") or "info", 2)
    if sc < sb:
        return "worsened"
    ic, ib = c.get("impact"), base.get("impact")
    if ic is not None and ib is not None and ic - ib > tol.impact + 1e-12:
        return "worsened"
    if sc > sb or (ic is not None and ib is not None and ib - ic > tol.impact + 1e-12):
        return "improved"
    return "known"


def rule_titles() -> dict[str, str]:
    """Rule id -> the rule's fixed title (RuleMeta.title): stable test-case names across runs."""
    from tracediag.engine import load_rules

    return {m.RULE.id: m.RULE.title for m in load_rules()}


def judge_rules(
    checks: list[dict[str, Any]],
    fail_on: str,
    baseline_doc: dict[str, Any] | None,
    tol: Tolerances,
    titles: dict[str, str] | None = None,
    required: set[str] | frozenset[str] = frozenset(),
) -> list[Outcome]:
    """One outcome per check. A required rule that could not run is skipped with `required` set and the reason
    it could not: it makes the check inconclusive, it does not fail it."""
    base = {finding_id(c): c for c in baseline_doc["checks"]} if baseline_doc else None
    titles = rule_titles() if titles is None else titles
    out = []
    for c in checks:
        fixed = titles.get(c["rule"]) or (c["title"] if c["status"] == "not_applicable" else "")
        name = f"{c['rule']} {fixed}".strip()
        if c["status"] == "pass":
            out.append(Outcome("rules", c["rule"], c["rule"], c["step"], name, "pass", c["title"]))
            continue
        if c["status"] == "not_applicable":
            must = c["rule"] in required
            msg = (REQUIRED_NOT_RUN if must else "") + (c.get("reason") or "")
            out.append(Outcome("rules", c["rule"], c["rule"], c["step"], name, "skipped", msg, required=must))
            continue
        fid = finding_id(c)
        vs = _vs_baseline(c, base.get(fid), tol) if base is not None else None
        fails = at_or_above(c.get("severity"), fail_on) and vs in (None, "new", "worsened")
        out.append(
            Outcome(
                "rules",
                fid,
                c["rule"],
                c["step"],
                name,
                "fail" if fails else "finding",
                c["title"],
                severity=c.get("severity"),
                vs_baseline=vs,
                check=c,
            )
        )
    return out


@dataclass
class CheckResult:
    config: CheckConfig
    fail_on: str
    rules_selected: list[str]
    outcomes: list[Outcome]
    doc: dict[str, Any]  # findings.json of this run (selected rules only)
    measures: dict[str, Any]
    baseline: RunData | None = None
    changes: list[MeasureChange] = field(default_factory=list)
    elapsed_s: float = 0.0
    required: list[str] = field(default_factory=list)  # rules that must run (config `require`, --require)
    comparability: dict[str, Any] | None = None  # the baseline's against this run (diff's test); None: no baseline

    @property
    def baseline_not_comparable(self) -> str | None:
        """The comparability verdict when a baseline was given and cannot be compared with the run, else None."""
        comp = self.comparability
        return comp["verdict"] if comp is not None and not comp["comparable"] else None

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == "fail"]

    @property
    def not_run_required(self) -> list[Outcome]:
        """Required rules that could not run (each makes the check inconclusive)."""
        return [o for o in self.outcomes if o.required and o.status == "skipped"]

    @property
    def undiagnosable(self) -> str | None:
        """Why the run cannot be diagnosed (the verdict's headline), or None."""
        v = self.doc.get("verdict") or {}
        return (v.get("headline") or v["status"]) if v.get("status") in UNDIAGNOSABLE else None

    @property
    def outcome(self) -> str:
        """'failed' (something new at or above fail_on), 'inconclusive' (nothing failed, but a required rule
        could not run or the run cannot be diagnosed), else 'passed'."""
        if self.failed:
            return "failed"
        inconclusive = self.not_run_required or self.undiagnosable or self.baseline_not_comparable
        return "inconclusive" if inconclusive else "passed"

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.outcome]

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"

    @property
    def coverage(self) -> dict[str, Any]:
        """How many of the selected rules ran, and what input would enable the others: the document's own
        coverage block (made from the rules' declared inputs, tracediag.findings.coverage)."""
        return (self.doc.get("verdict") or {}).get("coverage") or coverage(self.doc["checks"])

    def inconclusive_reasons(self) -> list[str]:
        """What the check could not establish, one line each (empty when it could)."""
        out = [
            f"required rule {o.id} could not run: {o.message.removeprefix(REQUIRED_NOT_RUN)}"
            for o in self.not_run_required
        ]
        if self.undiagnosable:
            out.append(f"the run cannot be diagnosed: {self.undiagnosable}")
        if self.baseline_not_comparable:
            out.append(
                f"the baseline cannot be compared with this run ({self.baseline_not_comparable}): every finding was "
                "judged as new and no measure was compared; `tracediag diff` shows the differences — update the "
                "baseline when the deployment changed on purpose"
            )
        return out

    def findings(self) -> list[dict[str, Any]]:
        """Every finding of the run: rules, unmet expectations and baseline regressions (findings.json shape)."""
        return [o.check | {"new": o.vs_baseline not in ("known", "improved")} for o in self.outcomes if o.check]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": CHECK_SCHEMA_ID,
            "passed": self.passed,
            "outcome": self.outcome,
            "inconclusive": self.inconclusive_reasons(),
            "fail_on": self.fail_on,
            "config": str(self.config.path) if self.config.path else None,
            "rules_selected": self.rules_selected,
            "rules_required": self.required,
            "coverage": self.coverage,
            "baseline": (
                {"path": self.baseline.label, "kind": self.baseline.kind, "comparability": self.comparability}
                if self.baseline
                else None
            ),
            "counts": {
                s: sum(1 for o in self.outcomes if o.status == s) for s in ("pass", "fail", "finding", "skipped")
            },
            "outcomes": [o.to_dict() for o in self.outcomes],
            "measures": self.measures,
            "measure_changes": [c.to_dict() for c in self.changes],
        }


def judge(
    doc: dict[str, Any],
    measures: dict[str, Any],
    cfg: CheckConfig,
    *,
    fail_on: str | None = None,
    baseline: RunData | None = None,
    db_path: Path | None = None,
    rules_selected: list[str] | None = None,
    required: list[str] | None = None,
) -> CheckResult:
    """Judge one analysed run (its findings.json document and measures) against config and baseline."""
    level = fail_on or cfg.fail_on
    if level not in FAIL_ON_LEVELS:
        raise UsageError(f"--fail-on must be one of {', '.join(FAIL_ON_LEVELS)}, got '{level}'")
    cfg = dataclasses.replace(cfg, fail_on=level)
    comp = None
    if baseline is not None:
        from tracediag.diff.comparability import comparability
        from tracediag.diff.fingerprint import fingerprint

        this_run = RunData(label="this run", kind="inputs", doc=doc, db_path=db_path, measures=measures)
        comp = comparability(fingerprint(baseline), fingerprint(this_run))
    usable = baseline if comp is not None and comp["comparable"] else None
    outcomes = judge_rules(
        doc["checks"], level, usable.doc if usable else None, cfg.tolerances, required=set(required or ())
    )
    outcomes += judge_expectations(cfg.all_expectations(), doc, measures, level)
    changes: list[MeasureChange] = []
    if usable is not None:
        changes = compare_measures(usable.measures, measures, cfg.tolerances)
        outcomes += judge_baseline(changes, cfg, usable.label, db_path)
    return CheckResult(
        config=cfg,
        fail_on=level,
        rules_selected=rules_selected if rules_selected is not None else [c["rule"] for c in doc["checks"]],
        required=list(required or ()),
        outcomes=outcomes,
        doc=doc,
        measures=measures,
        baseline=baseline,
        changes=changes,
        comparability=comp,
    )
