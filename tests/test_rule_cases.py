"""The per-rule case files in tests/cases/*.toml (inputs are real traces), run by tracediag.testing, the case
runner a rule outside the package uses too."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from conftest import REPO

from tracediag import testing
from tracediag.engine import BUILTIN_RULES
from tracediag.rules import module_name

CASES_DIR = Path(__file__).parent / "cases"


def _cases():
    for rule, case in testing.load_cases(CASES_DIR):
        yield pytest.param(rule, case, id=f"{rule.lower()}: {case['name']}")


def rule_module(rule_id: str) -> str:
    return module_name(rule_id)


def _report(trace, model, tp, rule, inputs: tuple[tuple[str, str], ...] = (), settings: tuple = ()):
    """The analysis of a case's inputs with the rule added (tracediag.testing.analysis, shared between cases)."""
    return testing.analysis(REPO, trace, model, tp, rule_module(rule), inputs, settings)


@pytest.mark.parametrize(("rule", "case"), list(_cases()))
def test_case(rule, case):
    """The runner a rule outside the package uses too (tracediag.testing.run_cases)."""
    testing.check_case(rule, case, root=REPO)


# Statuses no real input in the repository can produce; each is exercised on a documented
# synthetic input instead (a real `tracediag scrape` of a local server with chosen values).
SYNTHETIC_ONLY = {
    ("SCH003", "finding"): "tests/test_scrape.py::test_scraped_growing_queue_is_an_sch003_finding",
    ("SCH008", "finding"): "tests/test_scrape.py::test_scraped_open_requests_break_littles_law",
    ("SCH008", "pass"): "tests/test_scrape.py::test_scraped_steady_server_satisfies_littles_law",
    ("SCH012", "finding"): "tests/test_serving_phases.py::test_overloaded_server_ttft_is_queueing",
    ("SCH012", "pass"): "tests/test_serving_phases.py::test_lightly_loaded_server_ttft_is_prefill",
}


def test_every_rule_has_pass_finding_and_na_cases():
    statuses: dict[str, set[str]] = {}
    for f in CASES_DIR.glob("*.toml"):
        statuses[f.stem.upper()] = {c["status"] for c in tomllib.loads(f.read_text())["case"]}
    for module in BUILTIN_RULES:
        rule_id = module.rsplit(".", 1)[1].split("_")[0].upper()
        covered = statuses.get(rule_id, set()) | {st for (r, st) in SYNTHETIC_ONLY if r == rule_id}
        assert covered >= {"pass", "finding", "not_applicable"}, rule_id


def test_a_rule_outside_the_package_runs_its_cases_with_the_same_runner(tmp_path, monkeypatch):
    """docs/extending.md: a rule of another package (here a module on sys.path, id XYZ990) and its case file,
    paths relative to the root given."""
    from test_adding_a_rule import SCRATCH_CASES, SCRATCH_RULE

    (tmp_path / "outside_rule.py").write_text(SCRATCH_RULE.replace("KRN990", "XYZ990"))
    na = SCRATCH_CASES[SCRATCH_CASES.index('[[case]]\nname = "no model config"') :]
    (tmp_path / "xyz990.toml").write_text(na)
    monkeypatch.syspath_prepend(str(tmp_path))
    (check,) = testing.run_cases(tmp_path / "xyz990.toml", module="outside_rule", root=REPO)
    assert check.rule == "XYZ990" and check.status == "not_applicable"
    (tmp_path / "xyz990.toml").write_text(na.replace('status = "not_applicable"', 'status = "pass"'))
    with pytest.raises(AssertionError, match="no model config"):  # a failed expectation names its case
        testing.run_cases(tmp_path, module="outside_rule", root=REPO)
