"""A check result is data: ranking reads the fields, HTML/JSON/terminal all render `to_dict()`."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from tracediag.inputspec import BY_FLAG, advice

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

    id: str  # the rule id docs/rules.md lists, e.g. "COL001"; never reused
    step: int  # walk step 1-6
    title: str  # what the rule checks, in plain words
    requires_tables: tuple[str, ...] = ()  # canonical/derived tables that must have rows
    requires_model: tuple[str, ...] = ()  # ModelConfig fields the rule needs (L, H, I, h, H_kv, D)
    requires_tp: bool = False  # needs the tensor-parallel degree p
    # what the profiled window must be (tracediag/derive/fitness.py): None (anything), "complete" (every event
    # recorded: not sampled, not GPU-stripped, not too short) or "steady" (complete, with steady work after start-up)
    requires_window: str | None = None
    # what of the steady segment the rule takes a share of: "busy" (its GPU busy time) or "span" (its length); the
    # rule is not applicable when that holds almost nothing (MIN_STEADY_NS; the engine checks it)
    share_of_steady: str | None = None
    may_be_downstream_of: tuple[str, ...] = ()  # earlier rules whose findings can explain this one
    # The inputs of `tracediag analyze`/`check` that can let the rule run, each as the coverage line shows it
    # ("--topology topo.json", "--bench"), in the order the rule prefers them. "--model config.json" and "--tp N"
    # come first, from requires_model / requires_tp; a rule declares the rest. A not-applicable reason names
    # only inputs declared here (tests/test_coverage_contract.py); docs/rules.md lists them.
    enabled_by: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        derived = ("--model config.json",) * bool(self.requires_model) + ("--tp N",) * bool(self.requires_tp)
        declared = {option_name(e) for e in self.enabled_by}
        own = tuple(d for d in derived if option_name(d) not in declared)
        object.__setattr__(self, "enabled_by", own + tuple(self.enabled_by))


def option_name(enabling_input: str) -> str:
    """ "--topology topo.json" -> "--topology"."""
    return enabling_input.split(" ", 1)[0]


def named_inputs(meta: RuleMeta, reason: str | None) -> tuple[str, ...]:
    """The inputs of `meta.enabled_by` that a not-applicable reason names, in the rule's order: which of the
    declared inputs this analysis lacked. An option is named as a whole word ("--tp" is not "--tp1-baseline")."""
    text = reason or ""
    return tuple(e for e in meta.enabled_by if re.search(rf"(?<![\w-]){re.escape(option_name(e))}(?![\w-])", text))


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
    impact_basis: str | None = None  # what `impact` is a share of, in words ("decode step time"), when the rule says
    rule_severity: Severity | None = None  # the rule's own severity when the engine lowered it (SEVERITY_FLOOR)
    cost_ns: int | None = None  # what the effect costs over the profiled window, ns (time-based rules)
    cost_per_step_ns: int | None = None  # ... per step that carries it, ns
    floor: str | None = None  # why the engine lowered the severity: the floor the finding is under, in words
    undetermined: str | None = None  # the evidence cannot decide the hypothesis: what would (an input or a rerun)
    # a caveat: the rules whose claims this finding qualifies (SCH009's closed loop qualifies capacity claims). A
    # caveat is shown with them; it never heads the verdict, and nothing is folded under it as its consequence
    qualifies: tuple[str, ...] = ()
    # not_applicable: the rule's declared inputs (RuleMeta.enabled_by) this analysis lacked, what the coverage
    # line offers; not written to findings.json (its coverage block is)
    enable: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"rule": self.rule, "step": self.step, "status": self.status, "title": self.title}
        if self.status == "not_applicable":
            d["reason"] = self.reason
            return d
        for key in ("severity", "confidence", "impact", "impact_basis", "formula", "substituted", "next_check"):
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
        for key in ("cost_ns", "cost_per_step_ns", "rule_severity", "floor", "undetermined"):
            if getattr(self, key) is not None:
                d[key] = getattr(self, key)
        if self.qualifies:
            d["qualifies"] = list(self.qualifies)
        return d


def not_applicable(meta: RuleMeta, reason: str) -> Check:
    """The rule could not run; `enable` holds the inputs of its `enabled_by` the reason names as missing."""
    return Check(
        rule=meta.id,
        step=meta.step,
        status="not_applicable",
        title=meta.title,
        reason=reason,
        enable=named_inputs(meta, reason),
    )


def finding(meta: RuleMeta, **fields: Any) -> Check:
    """A finding of the rule `meta` declares; `fields` are the other Check fields (title, severity, ...)."""
    return Check(rule=meta.id, step=meta.step, status="finding", **fields)


def passed(meta: RuleMeta, **fields: Any) -> Check:
    """A pass of the rule `meta` declares; `fields` are the other Check fields (title, confidence, ...)."""
    return Check(rule=meta.id, step=meta.step, status="pass", **fields)


# --- Ranking, folding and the verdict ------------------------------------------------------------------------
#
# Everything below reads the data of the checks (status, severity, impact, confidence, downstream_of, reason),
# never a rule's wording, and works on Check objects and on their findings.json dicts alike.

# The severity floor: a warning or error must be worth a ticket, both as a share and as an absolute cost. A finding
# below either is `info` whatever the rule said (the rule's own severity stays in `rule_severity`, the floor it is
# under in `floor`); said in docs/method.md ("Severity floor").
IMPACT_FLOOR = 0.01  # a measured effect below 1 % (of step time, calls or requests) is `info`, never worse
COST_FLOOR_NS = 1_000_000  # ... and so is one that costs less than 1 ms over the whole profiled window
COST_FLOOR_PER_STEP_NS = 10_000  # ... or less than 10 µs per step that carries it


def _get(c: Check | dict[str, Any], key: str, default: Any = None) -> Any:
    return c.get(key, default) if isinstance(c, dict) else getattr(c, key, default)


def walk_key(c: Check | dict[str, Any]) -> tuple:
    """The troubleshooting walk's order: walk step, then severity, impact (larger first), confidence, id."""
    return (
        _get(c, "step") or 0,
        SEVERITY_ORDER.get(_get(c, "severity") or "info", 3),
        -(_get(c, "impact") or 0.0),
        CONFIDENCE_ORDER.get(_get(c, "confidence") or "low", 3),
        _get(c, "rule"),
    )


SERVING_STEP = 6
# The one basis of trace-side impacts (tracediag/analyses/basis.py): a share of the window's step time, or of the
# profiled span where the trace has no steps. A share of GPU busy time or of one phase's time is shown beside it.
WINDOW_STEP_TIME = "the window's step time"
PROFILED_SPAN = "the profiled span"
WINDOW_BASES = (WINDOW_STEP_TIME, PROFILED_SPAN)
TRACE_TIME_STEPS = (4, 5)  # walk steps whose findings measure the trace's time (application, kernels)
RANKED_BY = (
    "impact, larger first: trace findings (walk steps 4-5) as a share of the window's step time (of the profiled "
    "span where there are no steps), never of GPU busy or phase time (shown beside it); a trace finding without "
    "that basis ranks below them; serving findings (step 6) as a share of request time or of requests "
    "(impact_basis; without one they rank below); shape, path and collective checks (steps 1-3) as the share of "
    "what they check; then severity, confidence, walk step and id"
)


def on_window_basis(c: Check | dict[str, Any]) -> bool:
    """The finding's impact is a share of the window's step time (or of the profiled span)."""
    return _get(c, "impact_basis") in WINDOW_BASES


def ranked_impact(c: Check | dict[str, Any]) -> float:
    """The impact a finding is ranked by (RANKED_BY). A trace finding's impact counts only on the window basis (a
    share of GPU busy time would outrank a larger share of step time on a mostly idle GPU); a serving finding's
    only with its basis (a share of request time or of requests, `impact_basis`): without one it ranks by severity
    below those with one (1 − prefix reuse is no share of anything)."""
    step = _get(c, "step") or 0
    if step == SERVING_STEP and not _get(c, "impact_basis"):
        return 0.0
    if step in TRACE_TIME_STEPS and not on_window_basis(c):
        return 0.0
    return _get(c, "impact") or 0.0


def rank_key(c: Check | dict[str, Any]) -> tuple:
    """Findings by impact (larger first; a serving impact only with its basis), then severity, confidence, walk
    step and id."""
    return (
        -ranked_impact(c),
        SEVERITY_ORDER.get(_get(c, "severity") or "info", 3),
        CONFIDENCE_ORDER.get(_get(c, "confidence") or "low", 3),
        _get(c, "step") or 0,
        _get(c, "rule"),
    )


def below_floor(c: Check) -> str | None:
    """Why a finding is not worth a ticket (its share or its absolute cost under the severity floor), else None."""
    if c.impact is not None and c.impact < IMPACT_FLOOR:
        return f"impact {c.impact:.2%} < {IMPACT_FLOOR:.0%}"
    if c.cost_ns is not None and c.cost_ns < COST_FLOOR_NS:
        return f"cost {_ns(c.cost_ns)} over the profiled window < {_ns(COST_FLOOR_NS)}"
    if c.cost_per_step_ns is not None and c.cost_per_step_ns < COST_FLOOR_PER_STEP_NS:
        return f"cost {_ns(c.cost_per_step_ns)} per step < {_ns(COST_FLOOR_PER_STEP_NS)}"
    return None


# Absolute floors under which there is nothing to find: a share of a steady segment holding less GPU work than this
# says nothing (one 1.6 µs copy is "100 % of GPU busy time"), and an effect costing less over the whole window is
# no finding at any share (a capture analysed alone: "findings" on 11–16 µs of kernels). Said in docs/method.md.
MIN_STEADY_NS = 1_000_000
MIN_FINDING_COST_NS = 1_000_000


def steady_floor_reason(of: str, busy_ns: int, span_ns: int, ranks: int) -> str | None:
    """Why a rule that takes a share of the steady segment's GPU busy time (`of` "busy") or of its length ("span")
    cannot run on a steady segment this empty, else None."""
    held = busy_ns if of == "busy" else span_ns
    if held >= MIN_STEADY_NS:
        return None
    what = f"{_ns(busy_ns)} of GPU work" if of == "busy" else f"{_ns(span_ns)} of time ({_ns(busy_ns)} of GPU work)"
    return (
        f"missing steady GPU work: the steady segment holds {what} over {ranks} rank{'s' if ranks != 1 else ''} "
        f"(under {_ns(MIN_STEADY_NS)}), too little for a share of it to say anything"
    )


def too_small_to_find(c: Check) -> Check:
    """A finding whose effect costs less than MIN_FINDING_COST_NS over the whole window is a pass: a microsecond
    total is never a finding, whatever share of something it is. The rule's severity stays in `rule_severity`,
    the floor in `floor`."""
    if c.status != "finding" or c.cost_ns is None or c.cost_ns >= MIN_FINDING_COST_NS:
        return c
    why = f"cost {_ns(c.cost_ns)} over the profiled window < {_ns(MIN_FINDING_COST_NS)}: too little to be a finding"
    return replace(
        c,
        status="pass",
        title=f"{c.title} — {why}",
        rule_severity=c.severity,
        severity=None,
        impact=None,
        impact_basis=None,
        floor=why,
    )


def _ns(ns: float) -> str:
    return f"{ns / 1e6:.3g} ms" if abs(ns) >= 1e6 else f"{ns / 1e3:.3g} µs"


def severity_follows_impact(c: Check) -> Check:
    """A finding under the severity floor (below_floor) is `info`; the rule's own severity and the floor are kept."""
    if c.status != "finding" or c.severity in (None, "info"):
        return c
    why = below_floor(c)
    return replace(c, severity="info", rule_severity=c.severity, floor=why) if why else c


def fold(findings: list[Any]) -> list[tuple[Any, list[Any]]]:
    """(cause, [its possible consequences]) in rank order.

    A finding is a cause when no finding it may be downstream of (transitively) outranks it from outside
    its own cycle of links; every other finding is folded under the best-ranked cause among its ancestors.
    """
    ranked = sorted(findings, key=rank_key)
    by_rule: dict[str, int] = {}
    for i, c in enumerate(ranked):
        by_rule.setdefault(_get(c, "rule"), i)
    ups = [[by_rule[u] for u in (_get(c, "downstream_of") or ()) if u in by_rule and by_rule[u] != i]
           for i, c in enumerate(ranked)]  # fmt: skip
    ancestors: list[set[int]] = []
    for i in range(len(ranked)):
        seen: set[int] = set()
        todo = list(ups[i])
        while todo:
            j = todo.pop()
            if j not in seen:
                seen.add(j)
                todo.extend(ups[j])
        seen.discard(i)
        ancestors.append(seen)
    roots = [i for i in range(len(ranked)) if all(i in ancestors[a] and i < a for a in ancestors[i])]
    children: dict[int, list[int]] = {r: [] for r in roots}
    for i in range(len(ranked)):
        if i not in children:
            children[min(a for a in ancestors[i] if a in children)].append(i)
    return [(ranked[r], [ranked[k] for k in children[r]]) for r in roots]


def ranked_findings(checks: list[Any]) -> list[Any]:
    """The findings in display order: each cause followed by the findings folded under it."""
    out = []
    for cause, consequences in fold([c for c in checks if _get(c, "status") == "finding"]):
        out += [cause, *consequences]
    return out


def coverage(checks: list[Any]) -> dict[str, Any]:
    """How many rules ran, and for those that could not, the input that would enable them: the first of the
    rule's declared inputs this analysis lacked (Check.enable, from RuleMeta.enabled_by), grouped by option
    and shown in the fullest form a rule of the group declares ("--topology topo.json"). A rule that lacked
    none of its declared inputs is under `not_applicable_to_inputs`. Checks read back from findings.json
    carry no `enable`: their rules count there too (findings.json's own coverage block holds the grouping)."""
    total = len(checks)
    not_run = [c for c in checks if _get(c, "status") == "not_applicable"]
    groups: dict[str, list[str]] = {}  # option name -> rules
    shown: dict[str, str] = {}  # option name -> the most telling form seen ("--topology topo.json")
    other = []
    for c in not_run:
        forms = _get(c, "enable") or ()
        if not forms:
            other.append(_get(c, "rule"))
            continue
        opt = forms[0]
        name = option_name(opt)
        groups.setdefault(name, []).append(_get(c, "rule"))
        if len(opt) > len(shown.get(name, "")):
            shown[name] = opt
    enable = [_enable_entry(shown[k], v) for k, v in sorted(groups.items(), key=lambda kv: -len(kv[1]))]
    return {
        "rules": total,
        "ran": total - len(not_run),
        "passed": sum(1 for c in checks if _get(c, "status") == "pass"),
        "findings": sum(1 for c in checks if _get(c, "status") == "finding"),
        "could_not_run": len(not_run),
        "enable": enable,
        "not_applicable_to_inputs": other,
    }


def _enable_entry(form: str, rules: list[str]) -> dict[str, Any]:
    """One input that would enable `rules`: its CLI form, and how the other entry points give it (tracediag.inputspec):
    the argument of the notebook API and the MCP tools, the tracediag.toml key where a file may give it."""
    spec = BY_FLAG.get(option_name(form))
    return {"input": form, "argument": spec.name if spec else None, "config_key": spec.config_key if spec else None,
            "rules": rules}  # fmt: skip


def coverage_sentence(cov: dict[str, Any], limit: int = 4, audience: str = "cli") -> str:
    """'11 of 27 rules ran; 16 could not run: pass --model config.json to enable SHP001, SHP002… (9); …'; the
    inputs named as `audience` passes them (tracediag.inputspec.advice: "cli" flags, "mcp" tool arguments,
    "python" keywords)."""

    ran, total, n = cov["ran"], cov["rules"], cov["could_not_run"]
    if total == 0:
        return "No rule was selected."
    if n == 0:
        return f"All {total} rules ran."
    parts = []
    for i, g in enumerate(cov["enable"]):
        rules = g["rules"]
        shown = ", ".join(rules[:limit]) + ("…" if len(rules) > limit else "")
        lead = "pass " if i == 0 else ""
        named = advice(g["input"], audience)
        parts.append(f"{lead}{named} to enable {shown}" + (f" ({len(rules)})" if len(rules) > limit else ""))
    rest = len(cov["not_applicable_to_inputs"])
    if rest:
        parts.append(f"{rest} need what these inputs do not hold (see each rule's reason)")
    return f"{ran} of {total} rules ran; {n} could not run: " + "; ".join(parts) + "."


def _pct(x: float | None) -> str:
    if x is None:
        return "unknown"
    v = x * 100
    return f"{v:.0f}%" if v >= 10 or v == 0 else f"{v:.1f}%" if v >= 1 else f"{v:.2g}%"


def impact_text(c: Any) -> str:
    """'65% of decode step time' when the rule says what its impact is a share of, else 'impact 65%'."""
    basis = _get(c, "impact_basis")
    return f"{_pct(_get(c, 'impact'))} of {basis}" if basis else f"impact {_pct(_get(c, 'impact'))}"


def _is_problem(c: Any) -> bool:
    return (_get(c, "severity") or "info") != "info"


def _brief(c: Any) -> dict[str, Any]:
    return {
        "rule": _get(c, "rule"),
        "severity": _get(c, "severity"),
        "impact": _get(c, "impact"),
        "cost": impact_text(c),
        "title": _get(c, "title"),
    }


ALSO_MIN_IMPACT = 0.01  # an independent info finding worth naming beside the verdict: at least 1 % measured


def _also(problems: list[tuple[Any, list]], folded: list[tuple[Any, list]], cause: Any, limit: int) -> list[dict]:
    """Other independent causes: problems first (rank order), then info findings that are causes of their own
    with a measured effect of at least 1 % (a fallback at 4.9 % of decode time is worth a look, not a limit)."""
    out = [c for c, _ in problems]
    out += [
        c for c, _ in folded if c is not cause and not _is_problem(c) and (_get(c, "impact") or 0.0) >= ALSO_MIN_IMPACT
    ]
    return [_brief(c) for c in out[:limit]]


def verdict(checks: list[Any], also_limit: int = 3, fitness: dict[str, Any] | None = None) -> dict[str, Any]:
    """What most likely limits the run, its cost and next check, what it may explain, other independent
    problems, and the coverage.

    The cause named is the problem (a warning or error not downstream of another finding) with the largest
    impact; an `info` finding is context, not a limit, and is named only when there is no problem — or, as
    `largest_effect`, when its impact is far larger than the problem's (at least twice and 10 points more).

    `status`: "problem" (a warning or error was found), "no_problem" (only `info` findings, or none),
    "nothing_ran" (every rule was not applicable: an empty result that is not a clean one), "inconclusive" (no
    problem found, and either the profiled window is unfit — `fitness`, tracediag/derive/fitness.py — and the verdict
    says what to re-capture, or a rule that could decide one says its evidence cannot: `undetermined` lists them with
    what would decide each).
    """
    out = _verdict(checks, also_limit)
    if fitness and not fitness.get("fit", True) and out["status"] != "problem":
        return _inconclusive(out, fitness, checks, also_limit)
    return out


def _inconclusive(out: dict[str, Any], fitness: dict[str, Any], checks: list[Any], limit: int) -> dict[str, Any]:
    """An unfit window without a problem: why it cannot be judged and how to re-capture, not a clean result; the
    measured effects of the rules that could run are listed, as context."""
    info = [c for c in ranked_findings(checks) if (_get(c, "impact") or 0.0) >= ALSO_MIN_IMPACT]
    return {
        "coverage": out["coverage"],
        "coverage_text": out["coverage_text"],
        "ranked_by": out["ranked_by"],
        "status": "inconclusive",
        "headline": f"Inconclusive: this window can show neither a problem nor its absence — {fitness['why']}",
        "window": fitness["class"],
        "next_check": fitness.get("recapture"),
        "also": [_brief(c) for c in info[:limit]],
    }


def _caveats(checks: list[Any]) -> list[dict[str, Any]]:
    """Caveat findings (Check.qualifies), each with the rules that ran whose claims it qualifies."""
    ran = {_get(c, "rule") for c in checks if _get(c, "status") != "not_applicable"}
    return [
        _brief(c) | {"qualifies": [r for r in _get(c, "qualifies") if r in ran]}
        for c in checks
        if _get(c, "status") == "finding" and _get(c, "qualifies")
    ]


QUEUE_RULE = "SCH003"  # queue growth: demand exceeds capacity
LOAD_TEST_RULE = "SCH009"


def _queue_first(candidates: list[tuple[Any, list]]) -> tuple[list[tuple[Any, list]], dict[str, Any] | None]:
    """RULEBOOK's one exception to impact order: while the queue grows on a valid load test (SCH003 a problem,
    SCH009 not a broken test), the queue heads the verdict and the largest step-time finding comes second, as
    what would raise capacity. (candidates reordered, that second finding or None.)"""
    rules = [_get(c, "rule") for c, _ in candidates]
    if QUEUE_RULE not in rules or LOAD_TEST_RULE in rules:
        return candidates, None
    i = rules.index(QUEUE_RULE)
    ordered = [candidates[i], *candidates[:i], *candidates[i + 1 :]]
    step_time = [
        c for c, _ in ordered[1:] if "step" in str(_get(c, "impact_basis") or "") or (_get(c, "step") or 6) < 6
    ]
    second = step_time[0] if step_time else (ordered[1][0] if len(ordered) > 1 else None)
    return ordered, (_brief(second) if second is not None else None)


def _verdict(checks: list[Any], also_limit: int) -> dict[str, Any]:
    cov = coverage(checks)
    caveats = _caveats(checks)
    folded = fold([c for c in checks if _get(c, "status") == "finding" and not _get(c, "qualifies")])
    out: dict[str, Any] = {"coverage": cov, "coverage_text": coverage_sentence(cov), "ranked_by": RANKED_BY}
    if caveats:
        out["caveats"] = caveats
    if cov["ran"] == 0:
        return out | {
            "status": "nothing_ran",
            "headline": f"No rule could run on these inputs ({cov['rules']} not applicable): this is not a clean "
            "result.",
        }
    open_ = [
        {"rule": _get(c, "rule"), "title": _get(c, "title"), "decide": _get(c, "undetermined")}
        for c in checks
        if _get(c, "undetermined")
    ]
    if open_:
        out["undetermined"] = open_
    if not folded:
        said = f" (with {len(caveats)} caveat{'s' if len(caveats) > 1 else ''})" if caveats else ""
        passed_n = cov["passed"]
        if not passed_n:  # only caveats ran to a result
            n = len(caveats)
            return out | {"status": "no_problem", "headline": f"No finding; {n} caveat{'s' if n != 1 else ''}."}
        rules_txt = "the rule that ran passed" if passed_n == 1 else f"the {passed_n} rules that ran passed"
        return out | {"status": "no_problem", "headline": f"No finding: {rules_txt}{said}."}
    candidates = []  # (problem, what it may explain), in rank order
    for cause, consequences in folded:
        if _is_problem(cause):
            candidates.append((cause, consequences))
        else:  # an info cause: a problem folded under it still counts, on its own
            candidates += [(c, []) for c in consequences if _is_problem(c)]
    candidates, second = _queue_first(candidates)
    if candidates:
        cause, consequences = candidates[0]
        status, headline = "problem", _get(cause, "title")
        if second is not None:
            out["second"] = second
    elif open_:  # "no problem" needs the rules that decide it to have decided
        cause, consequences = next(((c, k) for c, k in folded if _get(c, "undetermined")), folded[0])
        status = "inconclusive"
        u = open_[0]
        headline = f"Not decided ({u['rule']}): {u['title']}"
    else:
        cause, consequences = folded[0]
        status = "no_problem"
        headline = f"No problem at warning or error; the largest measured effect: {_get(cause, 'title')}"
    out |= {
        "status": status,
        "headline": headline,
        "rule": _get(cause, "rule"),
        "severity": _get(cause, "severity"),
        "confidence": _get(cause, "confidence"),
        "impact": _get(cause, "impact"),
        "impact_basis": _get(cause, "impact_basis"),
        "cost": impact_text(cause),
        "next_check": _get(cause, "next_check"),
        "explains": [_get(c, "rule") for c in consequences],
        "also": _also(candidates[1:], folded, cause, also_limit),
    }
    if status == "inconclusive":
        out["next_check"] = f"To decide: {open_[0]['decide']}"
    if status == "problem":
        mine = ranked_impact(cause)  # compared on the basis the ranking uses
        big = [c for c, _ in folded if not _is_problem(c) and ranked_impact(c) >= max(2 * mine, mine + 0.1)]
        if big:
            out["largest_effect"] = _brief(big[0])
    return out


# --- huge strings in findings.json -----------------------------------------------------------------------

LONG_STRING = 4096  # characters: a longer string (a kernel name of 1 MiB) is kept in full once, not per use


def compact_long_strings(doc: dict[str, Any], limit: int = LONG_STRING) -> dict[str, Any]:
    """A copy of `doc` in which every string longer than `limit` is cut, with a pointer to its one full copy
    in `doc["long_strings"]` (a list; each distinct string once). Shorter strings are untouched."""
    table: list[str] = []
    index: dict[str, int] = {}

    def walk(v: Any) -> Any:
        if isinstance(v, str) and len(v) > limit:
            if v not in index:
                index[v] = len(table)
                table.append(v)
            return f"{v[:200]}… [{len(v):,} characters; in full: long_strings[{index[v]}]]"
        if isinstance(v, dict):
            return {k: walk(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [walk(x) for x in v]
        return v

    out = walk(doc)
    if table:
        out["long_strings"] = table
    return out
