"""One generic runner for the per-rule case files in tests/cases/*.toml (inputs are real traces)."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

import pytest
from conftest import REPO, SHARED

from tracediag.analysis import analyze
from tracediag.engine import BUILTIN_RULES

CASES_DIR = Path(__file__).parent / "cases"


def _resolve(p: str) -> Path:
    return SHARED / p.removeprefix("../shared/") if p.startswith("../shared/") else REPO / p


def _cases():
    for f in sorted(CASES_DIR.glob("*.toml")):
        for case in tomllib.loads(f.read_text())["case"]:
            yield pytest.param(f.stem.upper(), case, id=f"{f.stem}: {case['name']}")


def rule_module(rule_id: str) -> str:
    (path,) = (REPO / "tracediag" / "rules").glob(f"{rule_id.lower()}_*.py")
    return f"tracediag.rules.{path.stem}"


@functools.cache
def _report(trace: str, model: str | None, tp: int | None, rule: str):
    # a rule not yet registered runs after the registered ones (extra_rules)
    return analyze([_resolve(trace)], model=_resolve(model) if model else None, tp=tp, extra_rules=[rule_module(rule)])


@pytest.mark.parametrize(("rule", "case"), list(_cases()))
def test_case(rule, case):
    report = _report(case["trace"], case.get("model"), case.get("tp"), rule)
    (check,) = [c for c in report.checks if c.rule == rule]
    assert check.status == case["status"], check.to_dict()
    if "severity" in case:
        assert check.severity == case["severity"]
    if "reason_contains" in case:
        assert case["reason_contains"] in check.reason
    if "title_contains" in case:
        assert case["title_contains"] in check.title
    for key, want in case.get("values", {}).items():
        got = check.values[key]
        assert got == pytest.approx(want), f"{key}: {got} != {want}"
    if "cost_model_applies" in case:
        assert check.cost_model_applies is case["cost_model_applies"]
    if check.status == "finding":
        # every finding shows its numbers, formula and where in the trace to look
        assert check.formula and check.substituted and check.values and check.evidence and check.next_check
        assert all({"rank", "ts_ns", "name"} <= set(e) for e in check.evidence)


def test_every_rule_has_pass_finding_and_na_cases():
    statuses: dict[str, set[str]] = {}
    for f in CASES_DIR.glob("*.toml"):
        statuses[f.stem.upper()] = {c["status"] for c in tomllib.loads(f.read_text())["case"]}
    for module in BUILTIN_RULES:
        rule_id = module.rsplit(".", 1)[1].split("_")[0].upper()
        assert statuses.get(rule_id, set()) >= {"pass", "finding", "not_applicable"}, rule_id
