"""One judged item of a check run (a rule, an expectation or a baseline measure: one JUnit test case),
and the identity of a finding across runs.

Identity of a finding across runs is its rule id plus `values["key"]` when a rule reports several
findings (BASELINE and EXPECT do: "BASELINE:step_time[decode,T=2]"), never the title wording.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from tracediag.findings import SEVERITY_ORDER

BASELINE_RULE = "BASELINE"


EXPECT_RULE = "EXPECT"


def finding_id(c: dict[str, Any]) -> str:
    """Identity across runs: rule id, plus values['key'] for rules that report several findings."""
    values = c.get("values") if isinstance(c.get("values"), dict) else {}
    key = values.get("key")
    return f"{c['rule']}:{key}" if key is not None else c["rule"]


def at_or_above(severity: str | None, level: str) -> bool:
    return SEVERITY_ORDER.get(severity or "info", 2) <= SEVERITY_ORDER[level]


OutcomeStatus = Literal["pass", "fail", "finding", "skipped"]


@dataclass(frozen=True)
class Outcome:
    """One judged item: a rule, an expectation or a baseline measure (one JUnit test case)."""

    suite: Literal["rules", "expectations", "baseline"]
    id: str  # stable identity (finding_id for rules)
    rule: str
    step: int | None
    name: str  # what is checked, in words
    status: OutcomeStatus  # fail: fails the check; finding: reported, does not fail (known or below fail_on)
    message: str  # one line
    severity: str | None = None
    vs_baseline: str | None = None  # new / worsened / known / improved (None: no baseline)
    check: dict[str, Any] | None = None  # the finding (rules, BASELINE, EXPECT), findings.json shape
    required: bool = False  # a rule the config or --require says must run

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        return {k: v for k, v in d.items() if v is not None and (k != "required" or v)}
