"""A check result is data: ranking reads the fields, HTML/JSON/terminal all render `to_dict()`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

Status = Literal["pass", "finding", "not_applicable"]
Severity = Literal["error", "warning", "info"]
SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
CONFIDENCE_ORDER = {"high": 0, "medium": 1, "low": 2}

WALK_STEPS = {
    1: "Shapes & correctness",
    2: "Physical path",
    3: "Collectives in isolation",
    4: "Application vs micro-benchmark",
    5: "Kernels",
    6: "Scheduling & queueing",
}


@dataclass(frozen=True)
class RuleMeta:
    """What a rule module declares at its top; the engine reads it before running the rule."""

    id: str  # RULEBOOK id, e.g. "COL001"; never reused
    step: int  # walk step 1-6
    title: str  # what the rule checks, in plain words
    requires_tables: tuple[str, ...] = ()  # canonical/derived tables that must have rows
    requires_model: tuple[str, ...] = ()  # ModelConfig fields the rule needs (L, H, I, h, H_kv, D)
    requires_tp: bool = False  # needs the tensor-parallel degree p
    may_be_downstream_of: tuple[str, ...] = ()  # earlier rules whose findings can explain this one


@dataclass(frozen=True)
class Check:
    """The outcome of one rule on one analysis."""

    rule: str
    step: int
    status: Status
    title: str  # one line in plain words (the finding, or what passed)
    severity: Severity | None = None  # findings only
    confidence: str | None = None  # high / medium / low
    impact: float | None = None  # share (0-1) of steps/calls/time affected, for ranking
    formula: str | None = None  # the formula, with symbols
    substituted: str | None = None  # the formula with the values plugged in
    values: dict[str, Any] = field(default_factory=dict)  # the numbers, by name
    evidence: list[dict[str, Any]] = field(default_factory=list)  # example events: rank, step, ts_ns, name...
    table: list[dict[str, Any]] = field(default_factory=list)  # per-rank/per-step rows behind the values
    next_check: str | None = None  # what to look at next
    reason: str | None = None  # not_applicable: what is missing
    downstream_of: tuple[str, ...] = ()  # earlier findings that may explain this one (set by the engine)
    cost_model_applies: bool | None = None  # COL001/COL002: does the 2L / T·H·e_a accounting hold?

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"rule": self.rule, "step": self.step, "status": self.status, "title": self.title}
        if self.status == "not_applicable":
            d["reason"] = self.reason
            return d
        for key in ("severity", "confidence", "impact", "formula", "substituted", "next_check"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        d["values"] = self.values
        d["evidence"] = self.evidence
        if self.table:
            d["table"] = self.table
        if self.downstream_of:
            d["downstream_of"] = list(self.downstream_of)
        if self.cost_model_applies is not None:
            d["cost_model_applies"] = self.cost_model_applies
        return d


def not_applicable(meta: RuleMeta, reason: str) -> Check:
    return Check(rule=meta.id, step=meta.step, status="not_applicable", title=meta.title, reason=reason)


def finding(meta: RuleMeta, **fields: Any) -> Check:
    """A finding of the rule `meta` declares; `fields` are the other Check fields (title, severity, ...)."""
    return Check(rule=meta.id, step=meta.step, status="finding", **fields)


def passed(meta: RuleMeta, **fields: Any) -> Check:
    """A pass of the rule `meta` declares; `fields` are the other Check fields (title, confidence, ...)."""
    return Check(rule=meta.id, step=meta.step, status="pass", **fields)


def rank_key(c: Check) -> tuple:
    """Walk step, then severity, then impact (larger first), then confidence."""
    return (
        c.step,
        SEVERITY_ORDER.get(c.severity or "info", 3),
        -(c.impact or 0.0),
        CONFIDENCE_ORDER.get(c.confidence or "low", 3),
        c.rule,
    )
