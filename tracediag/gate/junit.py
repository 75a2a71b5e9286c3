"""JUnit XML for `tracediag check --junit`: one test case per rule, expectation and baseline measure.

The shape follows the common JUnit XML schema that Jenkins (xunit plugin `junit-10.xsd`), GitLab
(`artifacts:reports:junit`) and the GitHub Actions JUnit reporters read: `<testsuites>` holding one
`<testsuite>` per kind of check (`tracediag.rules`, `tracediag.expectations`, `tracediag.baseline`),
each with the required `name`, `tests`, `failures` and `errors` attributes; a `<testcase>` per item
with `<failure>` (a finding at or above --fail-on that is new or worse than the baseline: its title as
the message, values, formula and evidence as the text) or `<skipped>` (not applicable, with its reason: the
input that would let it run; a required rule that could not run is skipped too, with "required rule could not
run (check inconclusive)" and the reason — never a pass). The rules suite's properties say how many rules ran
(`coverage`) and the check's `outcome` (passed, failed, inconclusive).
Findings that do not fail the check (known from the baseline, or below --fail-on) pass and carry
their text in `<system-out>`.
"""

from __future__ import annotations

import re
import socket
import xml.etree.ElementTree as ET
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from tracediag.files import write_atomic
from tracediag.findings import coverage_sentence
from tracediag.gate.judge import REQUIRED_NOT_RUN, CheckResult
from tracediag.gate.outcome import Outcome
from tracediag.version import __version__

SUITES = (
    ("rules", "tracediag.rules"),
    ("expectations", "tracediag.expectations"),
    ("baseline", "tracediag.baseline"),
)
# Characters XML 1.0 cannot carry (control characters): kernel names and log lines are untrusted text.
_NOT_XML = re.compile("[^\x09\x0a\x0d\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_MAX_EVIDENCE_LINES = 10


def _x(s: Any) -> str:
    return _NOT_XML.sub("\ufffd", "" if s is None else str(s))


def _fmt_value(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (dict, list, tuple)):
        return orjson.dumps(v, default=str, option=orjson.OPT_NON_STR_KEYS).decode()
    return str(v)


def finding_text(c: dict[str, Any], vs_baseline: str | None = None) -> str:
    """The finding as plain text: what CI pages show under the failed test case."""
    lines = [f"{c['rule']} [{c.get('severity')}] {c['title']}"]
    meta = [f"{k}: {_fmt_value(c[k])}" for k in ("confidence", "impact") if c.get(k) is not None]
    if vs_baseline:
        meta.append(f"vs baseline: {vs_baseline}")
    if meta:
        lines.append("; ".join(meta))
    if c.get("formula"):
        lines.append(f"formula: {c['formula']}")
    if c.get("substituted"):
        lines.append(f"numbers: {c['substituted']}")
    if c.get("values"):
        lines.append("values:")
        lines += [f"  {k} = {_fmt_value(v)}" for k, v in c["values"].items()]
    ev = c.get("evidence") or []
    if ev:
        lines.append("evidence (ts in µs as the trace file writes it):")
        for e in ev[:_MAX_EVIDENCE_LINES]:
            ts = f"{e['ts_ns'] / 1000:.3f}" if isinstance(e.get("ts_ns"), int) else "—"
            extra = ", ".join(f"{k}={v}" for k, v in e.items() if k not in ("rank", "step", "ts_ns", "name"))
            lines.append(f"  rank {e.get('rank')} step {e.get('step')} ts {ts} {e.get('name')} {extra}".rstrip())
    if c.get("downstream_of"):
        lines.append(f"may be downstream of: {', '.join(c['downstream_of'])}")
    if c.get("next_check"):
        lines.append(f"next: {c['next_check']}")
    return "\n".join(lines)


def _classname(o: Outcome) -> str:
    if o.suite == "rules":
        return f"tracediag.rules.step{o.step}" if o.step else "tracediag.rules"
    if o.suite == "baseline":
        return f"tracediag.baseline.{o.id.split(':', 1)[-1].split('[', 1)[0]}"  # BASELINE:step_time[...] -> step_time
    return "tracediag.expectations"


def _testcase(parent: ET.Element, o: Outcome) -> None:
    name = o.name if o.name.startswith(o.id) else f"{o.id} {o.name}"  # stable: id first, then what it checks
    tc = ET.SubElement(parent, "testcase", {"classname": _classname(o), "name": _x(name), "time": "0"})
    if o.status == "fail":
        f = ET.SubElement(tc, "failure", {"type": _x(o.severity or "finding"), "message": _x(f"{o.id}: {o.message}")})
        f.text = _x(finding_text(o.check, o.vs_baseline) if o.check else o.message)
    elif o.status == "skipped" and o.required:
        # skipped, not passed: the rule did not run, and the check is inconclusive for it
        reason = o.message.removeprefix(REQUIRED_NOT_RUN)
        ET.SubElement(tc, "skipped", {"message": _x(f"required rule could not run (check inconclusive): {reason}")})
    elif o.status == "skipped":
        ET.SubElement(tc, "skipped", {"message": _x(f"not applicable: {o.message}")})
    elif o.status == "finding":
        why = (
            "known from the baseline"
            if o.vs_baseline in ("known", "improved")
            else "below --fail-on"
            if o.vs_baseline in (None, "new", "worsened")
            else o.vs_baseline
        )
        out = ET.SubElement(tc, "system-out")
        out.text = _x(f"finding that does not fail the check ({why}):\n" + finding_text(o.check, o.vs_baseline))
    else:
        out = ET.SubElement(tc, "system-out")
        out.text = _x(o.message)


def junit_xml(result: CheckResult, inputs: list[str] | None = None, name: str = "tracediag check") -> bytes:
    stamp = datetime.now(UTC).replace(tzinfo=None, microsecond=0).isoformat()
    host = socket.gethostname() or "localhost"
    root = ET.Element("testsuites", {"name": _x(name)})
    totals = {"tests": 0, "failures": 0}
    for suite, suite_name in SUITES:
        items = [o for o in result.outcomes if o.suite == suite]
        if not items and suite != "rules":
            continue
        failures = sum(1 for o in items if o.status == "fail")
        skipped = sum(1 for o in items if o.status == "skipped")
        ts = ET.SubElement(
            root,
            "testsuite",
            {
                "name": suite_name,
                "tests": str(len(items)),
                "failures": str(failures),
                "errors": "0",
                "skipped": str(skipped),
                "time": f"{result.elapsed_s:.3f}" if suite == "rules" else "0",
                "timestamp": stamp,
                "hostname": _x(host),
            },
        )
        if suite == "rules":
            props = ET.SubElement(ts, "properties")
            facts = {
                "tracediag.version": __version__,
                "fail_on": result.fail_on,
                "outcome": result.outcome,
                "inputs": ", ".join(inputs or []),
                "baseline": result.baseline.label if result.baseline else "",
                "config": str(result.config.path) if result.config.path else "",
                "rules": ", ".join(result.rules_selected),
                "rules_required": ", ".join(result.required),
                "coverage": coverage_sentence(result.coverage),
            }
            for k, v in facts.items():
                ET.SubElement(props, "property", {"name": k, "value": _x(v)})
        for o in items:
            _testcase(ts, o)
        totals["tests"] += len(items)
        totals["failures"] += failures
    root.set("tests", str(totals["tests"]))
    root.set("failures", str(totals["failures"]))
    root.set("errors", "0")
    root.set("time", f"{result.elapsed_s:.3f}")
    ET.indent(root)
    return ET.tostring(root, encoding="UTF-8", xml_declaration=True) + b"\n"


def write_junit(result: CheckResult, path: Path, inputs: list[str] | None = None) -> None:
    write_atomic(path, junit_xml(result, inputs))
