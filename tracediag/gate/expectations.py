"""Expectations: facts of the run (`rule = "run"`: tp, world_size, ranks, attention_family) or a rule's
values compared with what the config expects; absolute, not baseline-relative.
"""

from __future__ import annotations

from typing import Any

from tracediag.findings import Check
from tracediag.gate.config import Expectation
from tracediag.gate.outcome import EXPECT_RULE, Outcome, OutcomeStatus, at_or_above


def resolve(values: Any, path: str) -> tuple[bool, Any]:
    cur = values
    for part in path.split("."):
        if isinstance(cur, dict) and part in cur:
            cur = cur[part]
        else:
            return False, None
    return True, cur


def _meets(e: Expectation, v: Any) -> bool:
    if isinstance(v, dict):  # e.g. attention_family per phase: every phase must meet it
        return bool(v) and all(_meets(e, x) for x in v.values())

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, str) and isinstance(b, str):
            return a.lower() == b.lower()
        return a == b

    if e.equals is not None and not same(v, e.equals):
        return False
    if e.one_of and not any(same(v, x) for x in e.one_of):
        return False
    numeric = isinstance(v, (int, float)) and not isinstance(v, bool)
    if e.min is not None and not (numeric and v >= e.min):
        return False
    return not (e.max is not None and not (numeric and v <= e.max))


def run_facts(doc: dict[str, Any], measures: dict[str, Any]) -> dict[str, Any]:
    """Facts of the run that expectations with rule = "run" compare."""
    attn = measures.get("dispatch", {}).get("attention", {})
    return {
        "tp": (doc.get("tp") or {}).get("p"),
        "world_size": max((i.get("world_size") or 0 for i in doc.get("inputs", [])), default=None) or None,
        "ranks": len({r for i in doc.get("inputs", []) for r in i.get("ranks", [])}),
        "attention_family": {phase: d["family"] for phase, d in attn.items() if phase != "unphased"}
        or ({"unphased": attn["unphased"]["family"]} if "unphased" in attn else {}),
    }


def _expectation_outcome(
    e: Expectation, status: OutcomeStatus, message: str, step: int | None = None, **more: Any
) -> Outcome:
    """One expectation's outcome: suite "expectations", id EXPECT:<key>, named by the expectation."""
    return Outcome("expectations", f"{EXPECT_RULE}:{e.key}", EXPECT_RULE, step, e.describe(), status, message, **more)


def judge_expectations(
    expectations: list[Expectation], doc: dict[str, Any], measures: dict[str, Any], fail_on: str
) -> list[Outcome]:
    facts = run_facts(doc, measures)
    by_rule = {c["rule"]: c for c in doc.get("checks", [])}
    out = []
    for e in expectations:
        if e.rule == "run":
            found, v = resolve(facts, e.value)
            if not found or v in (None, {}):
                why = {
                    "tp": "the TP degree is not known from the inputs; pass --tp or check the trace",
                    "attention_family": "no attention kernels or ops in the inputs",
                }.get(e.value.split(".")[0], f"the run has no fact '{e.value}'")
                out.append(_expectation_outcome(e, "skipped", why))
                continue
        else:
            c = by_rule.get(e.rule)
            if c is None:
                out.append(_expectation_outcome(e, "skipped", f"rule {e.rule} did not run"))
                continue
            if c["status"] == "not_applicable":
                out.append(_expectation_outcome(e, "skipped", f"{e.rule}: {c.get('reason')}"))
                continue
            found, v = resolve({"status": c["status"], "severity": c.get("severity"), **c.get("values", {})}, e.value)
            if not found:
                out.append(_expectation_outcome(e, "skipped", f"{e.rule} has no value '{e.value}'"))
                continue
        if _meets(e, v):
            out.append(_expectation_outcome(e, "pass", f"{e.key} = {v!r}"))
            continue
        title = f"Expected {e.describe()}; the run has {v!r}"
        chk = Check(
            rule=EXPECT_RULE,
            step=1 if e.value == "tp" else 5 if e.value.startswith("attention_family") else 1,
            status="finding",
            title=title,
            severity=e.severity,
            confidence="high",
            impact=1.0,
            values={
                "key": e.key,
                "expected": e.describe(),
                "actual": v,
                "config_key": e.source,
            },
            next_check="Compare the deployment's configuration with the expectation in the check config.",
        ).to_dict()
        status: OutcomeStatus = "fail" if at_or_above(e.severity, fail_on) else "finding"
        out.append(_expectation_outcome(e, status, title, chk["step"], severity=e.severity, check=chk))
    return out
