"""JUnit XML from `tracediag check --junit`: read back with junitparser (a maintained JUnit XML library)
and checked against the constraints of the common JUnit schema.

The schema is Jenkins' `junit-10.xsd` (jenkinsci/xunit-plugin,
src/main/resources/org/jenkinsci/plugins/xunit/types/model/xsd/junit-10.xsd, MIT), the one GitLab,
Jenkins and pytest's own --junitxml follow. Its text is not vendored here: `assert_junit10` restates
its element and attribute rules (which elements may appear where, required and allowed attributes, the
numeric `time` format) and checks every element of the file against them.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from functools import cache
from pathlib import Path

import pytest
import typer
from conftest import SAMPLES
from junitparser import Failure, JUnitXml, Skipped
from typer.testing import CliRunner

from tracediag.cli import check as check_cmd
from tracediag.gate.config import CheckConfig
from tracediag.gate.judge import judge
from tracediag.gate.junit import junit_xml
from tracediag.measures import run_measures

# junit-10.xsd, restated: element -> (required attributes, allowed attributes, allowed child elements)
_CASE_CHILDREN = {
    "skipped", "error", "failure", "rerunFailure", "rerunError", "flakyFailure", "flakyError", "system-out",
    "system-err",
}  # fmt: skip
JUNIT10 = {
    "testsuites": (set(), {"name", "time", "tests", "failures", "errors"}, {"testsuite"}),
    "testsuite": (
        {"name", "tests", "failures", "errors"},
        {
            "name",
            "tests",
            "failures",
            "errors",
            "group",
            "time",
            "skipped",
            "timestamp",
            "hostname",
            "id",
            "package",
            "file",
            "log",
            "url",
        },
        {"testsuite", "properties", "testcase", "system-out", "system-err"},
    ),
    "properties": (set(), set(), {"property"}),
    "property": ({"name", "value"}, {"name", "value"}, set()),
    "testcase": ({"name"}, {"name", "time", "classname", "group"}, _CASE_CHILDREN),
    "failure": (set(), {"type", "message"}, set()),
    "error": (set(), {"type", "message"}, set()),
    "skipped": (set(), {"type", "message"}, set()),
    "system-out": (set(), set(), set()),
    "system-err": (set(), set(), set()),
}
# SUREFIRE_TIME: digits (thousands may be comma-grouped), optional decimals.
_TIME = re.compile(r"^[0-9,]*(\.[0-9]*)?$")


def assert_junit10(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()
    assert root.tag == "testsuites"

    def walk(el: ET.Element) -> None:
        assert el.tag in JUNIT10, f"element <{el.tag}> is not in junit-10.xsd"
        required, allowed, children = JUNIT10[el.tag]
        assert required <= set(el.attrib), f"<{el.tag}> lacks {required - set(el.attrib)}"
        assert set(el.attrib) <= allowed, f"<{el.tag}> has {set(el.attrib) - allowed}"
        if el.tag in ("testsuites", "testsuite") and "time" in el.attrib:
            assert _TIME.match(el.get("time")), el.get("time")
        for child in el:
            assert child.tag in children, f"<{child.tag}> may not appear in <{el.tag}>"
            walk(child)

    walk(root)
    for suite in root.iter("testsuite"):
        cases = suite.findall("testcase")
        assert int(suite.get("tests")) == len(cases)
        assert int(suite.get("failures")) == sum(1 for c in cases if c.find("failure") is not None)
        assert int(suite.get("skipped")) == sum(1 for c in cases if c.find("skipped") is not None)
    return root


def cli(*args):
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @app.callback()
    def _main() -> None:
        """tracediag (commands under test)."""

    check_cmd.register(app)
    return CliRunner().invoke(app, [str(a) for a in args])


@cache
def junit_of(tmp: str, name: str, *extra: str) -> tuple[int, Path]:
    d = SAMPLES / name
    path = Path(tmp) / f"{name}{'_'.join(extra).replace('/', '_')}.xml"
    r = cli("check", d, "--junit", path, *extra)
    return r.exit_code, path


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("junit"))


def test_failure_case_per_rule(tmp_module):
    cfg = str(SAMPLES / "fault_fp32_comm_tp2" / "config.json")
    code, path = junit_of(tmp_module, "fault_fp32_comm_tp2", "-m", cfg, "--rules", "SHP001,SHP002,COL001,COL002")
    assert code == 1
    assert_junit10(path)
    xml = JUnitXml.fromfile(str(path))
    suites = list(xml)
    assert [s.name for s in suites] == ["tracediag.rules"]
    rules = suites[0]
    assert (rules.tests, rules.failures, rules.errors, rules.skipped) == (4, 1, 0, 0)
    props = {p.name: p.value for p in rules.properties()}
    assert props["fail_on"] == "warning" and props["rules"] == "SHP001, SHP002, COL001, COL002"
    cases = {c.name.split(" ", 1)[0]: c for c in rules}
    assert cases["COL002"].name == "COL002 All-reduce payload = T·H·e_a"  # the rule's fixed title: stable name
    assert cases["COL002"].classname == "tracediag.rules.step3"
    (failure,) = cases["COL002"].result
    assert isinstance(failure, Failure) and failure.type == "warning"
    assert failure.message.startswith("COL002: All-reduce runs in fp32: payload is 2× T·H·e_a in 112 of 126 calls")
    assert "numbers: rank 0 step 0: 49,152 / (48×256×2 = 24,576) = 2.000" in failure.text
    assert "evidence (ts in µs as the trace file writes it):" in failure.text
    assert all(c.is_passed for r, c in cases.items() if r != "COL002")


def test_not_applicable_rules_are_skipped_with_reason(tmp_module):
    # no --model: the model-shaped rules cannot run
    code, path = junit_of(tmp_module, "healthy_tp2", "--rules", "SHP001,SHP002,COL001,COL002")
    assert code == 4  # none of the selected rules could run: inconclusive, not a pass
    assert_junit10(path)
    (rules,) = list(JUnitXml.fromfile(str(path)))
    skipped = {c.name.split(" ", 1)[0]: c.result[0] for c in rules if c.is_skipped}
    assert set(skipped) == {"SHP001", "SHP002", "COL001", "COL002"} and rules.skipped == 4
    for s in skipped.values():
        assert isinstance(s, Skipped)
        assert s.message.startswith("not applicable: missing model config")


def test_baseline_and_expectation_suites(tmp_module, tmp_path):
    d = SAMPLES / "fault_extra_allreduce_tp2"
    base = SAMPLES / "healthy_tp2"
    cfg = tmp_path / "tracediag.toml"
    cfg.write_text("expected_tp = 2\n[[expect]]\nrule = 'COL001'\nvalue = 'all_reduce_per_step_mode'\nmax = 10\n")
    path = tmp_path / "j.xml"
    r = cli("check", d, "-m", d / "config.json", "--baseline", base, "--config", cfg, "--junit", path)
    assert r.exit_code == 1
    assert_junit10(path)
    suites = {s.name: s for s in JUnitXml.fromfile(str(path))}
    assert set(suites) == {"tracediag.rules", "tracediag.expectations", "tracediag.baseline"}
    exp = {c.name.split(" ", 1)[0]: c for c in suites["tracediag.expectations"]}
    assert exp["EXPECT:run.tp"].is_passed
    (f,) = exp["EXPECT:COL001.all_reduce_per_step_mode"].result
    assert isinstance(f, Failure) and f.type == "error" and "the run has 13" in f.message
    base_cases = {c.name.split(" ", 1)[0]: c for c in suites["tracediag.baseline"]}
    case = base_cases["BASELINE:collectives_per_step[decode,all_reduce]"]
    assert case.classname == "tracediag.baseline.collectives_per_step"
    (f,) = case.result
    assert "all_reduce calls per decode step (median): 9 → 13 (+4, tolerance 0.5)" in f.message
    assert "before = 9" in f.text and "after = 13" in f.text


def test_untrusted_text_is_escaped_and_xml_safe(tmp_module):
    # A finding title with markup and control characters (kernel names are untrusted text): a real
    # findings.json with COL002's title edited, since no trace carries such a name.
    out = Path(tmp_module) / "fp32out"
    r = cli("check", SAMPLES / "fault_fp32_comm_tp2", "-m", SAMPLES / "fault_fp32_comm_tp2" / "config.json", "-o", out)
    assert r.exit_code == 1
    doc = json.loads((out / "findings.json").read_text())
    nasty = 'kernel <script>alert("x")</script> & \x07\x1b[31m ]]> done'
    for c in doc["checks"]:
        if c["rule"] == "COL002":
            c["title"] = nasty
    result = judge(doc, run_measures(doc, None), CheckConfig())
    path = Path(tmp_module) / "nasty.xml"
    path.write_bytes(junit_xml(result, ["in<put>"]))
    root = assert_junit10(path)
    failure = next(tc.find("failure") for tc in root.iter("testcase") if tc.find("failure") is not None)
    assert "<script>alert" in failure.get("message")  # round-trips as text, escaped in the file
    assert "\x07" not in failure.get("message") and "\x1b" not in failure.text
    raw = path.read_text()
    assert "<script>" not in raw and "&lt;script&gt;" in raw
    assert JUnitXml.fromfile(str(path)).failures == 1
