"""Runs rules: checks each rule's declared inputs, then calls it; orders and links the results. What the rules
see (Context, Settings) is in tracediag.context, below them."""

from __future__ import annotations

import importlib
from collections.abc import Collection
from dataclasses import replace
from importlib.metadata import entry_points
from types import ModuleType

from tracediag.context import Context
from tracediag.derive.fitness import unfit_reason
from tracediag.findings import (
    Check,
    RuleMeta,
    not_applicable,
    option_name,
    severity_follows_impact,
    steady_floor_reason,
    too_small_to_find,
    walk_key,
)
from tracediag.interrupt import checkpoint
from tracediag.rules import RULE_MODULES
from tracediag.store import table_count

BUILTIN_RULES = RULE_MODULES


def load_rules(only: Collection[str] | None = None) -> list[ModuleType]:
    """Built-in rules in order, then third-party modules from the `tracediag.rules` entry-point group; with
    `only` (rule ids), just those rules (`tracediag check --rules/--require`: the others never run)."""
    mods = [importlib.import_module(name) for name in BUILTIN_RULES]
    for ep in entry_points(group="tracediag.rules"):
        mods.append(ep.load())
    if only is None:
        return mods
    wanted = set(only)
    return [m for m in mods if m.RULE.id in wanted]


# What each table holds, in words, for "not applicable: missing ..." reasons.
TABLE_MEANING = {
    "steps": "engine steps",
    "collectives": "collective calls",
    "gemm_shapes": "GEMM input shapes (aten::linear/mm recorded with record_shapes=True)",
    "kernels": "GPU kernels",
    "memops": "GPU memory copies",
}


def _missing_input(ctx: Context, meta: RuleMeta) -> str | None:
    for table in meta.requires_tables:
        if not ctx.once(("table_count", table), lambda table=table: table_count(ctx.con, table)):
            return f"missing {TABLE_MEANING.get(table, table)}: none in the trace"
    unfit = unfit_reason(ctx.fitness(), meta.requires_window)
    if unfit:
        return unfit
    if meta.share_of_steady:
        empty = _empty_steady_segment(ctx, meta.share_of_steady)
        if empty:
            return empty
    if meta.requires_model:
        if ctx.model is None:
            fields = ", ".join(meta.requires_model)
            return f"missing model config ({fields}); pass --model config.json"
        absent = ctx.model.missing(*meta.requires_model)
        if absent:
            return f"missing {', '.join(absent)} in {ctx.model.path}"
    if meta.requires_tp and ctx.tp is None:
        return "missing tensor-parallel degree: not in the trace; pass --tp N"
    return None


def _empty_steady_segment(ctx: Context, of: str) -> str | None:
    """Why the steady segment holds too little (GPU work, `of` "busy", or time, "span") for a share of it
    (findings.MIN_STEADY_NS), else None;
    None on a trace without a GPU timeline (a CPU-only trace's rules use host time)."""

    def measure() -> tuple[int, int, int]:
        if not table_count(ctx.con, "gpu_timeline"):
            return 0, 0, 0
        sql = "SELECT coalesce(sum(steady_busy_ns), 0), coalesce(sum(steady_span_ns), 0), count(*) FROM gpu_timeline"
        busy, span, ranks = ctx.con.execute(sql).fetchone()
        return int(busy), int(span), int(ranks)

    busy, span, ranks = ctx.once(("steady_time",), measure)
    return steady_floor_reason(of, busy, span, ranks) if ranks else None


# The input options that each stand for files of some formats: a rule that could not run, declares such an
# option, and sits in a run with no file of those formats at all lacked that input, whatever its reason says.
INPUT_FORMATS = {
    "--log": ("vllm-log", "sglang-log"),
    "--metrics": ("prometheus",),
    "--bench": ("vllm-bench", "sglang-bench", "aiperf"),
}


def _with_absent_inputs(ctx: Context, meta: RuleMeta, check: Check) -> Check:
    """A rule that could not run, whose reason names none of its declared inputs (Check.enable), in a run that
    holds no file of any of its declared file inputs, lacked those inputs: a trace-only run's SCH003 ("no vLLM stats
    lines and no timed /metrics scrapes") is enabled by --log or --metrics. The coverage groups it there."""
    if check.status != "not_applicable" or check.enable:
        return check
    declared = tuple(e for e in meta.enabled_by if option_name(e) in INPUT_FORMATS)
    formats = ctx.once(
        ("input_formats",), lambda: {r[0] for r in ctx.con.execute("SELECT format FROM inputs").fetchall()}
    )
    # only when the run holds none of them: with a log given, SCH013's "no second engine" is not for want of a scrape
    held = any(formats.intersection(INPUT_FORMATS[option_name(e)]) for e in declared)
    return replace(check, enable=declared) if declared and not held else check


def run_rules(ctx: Context, rules: list[ModuleType] | None = None) -> list[Check]:
    """One Check per rule, in walk order. Findings get `downstream_of` (the findings among the rule's declared
    `may_be_downstream_of`); a rule that takes a share of steady time (RuleMeta.share_of_steady) does not run on a
    steady segment holding almost nothing, and a finding costing under 1 ms over the window is a pass
    (tracediag.findings.too_small_to_find); a finding under the severity floor (tracediag.findings.below_floor: a
    share below 1 %, or a cost below 1 ms over the window or 10 µs per step) is `info` whatever the rule said (its own
    severity stays in `rule_severity`, the floor in `floor`). Ranking by impact and folding under causes read these
    fields (tracediag.findings.fold / verdict). Links are made over the rules that ran: with a selection of rules
    (`tracediag check --rules`) a finding is never linked to a rule that was not run."""
    mods = rules if rules is not None else load_rules()
    checks: list[Check] = []
    with ctx.memoized():  # rules share queries (the TP scheme, the inputs, the step table...): each runs once
        for mod in mods:
            checkpoint()  # a cancelled call stops between rules
            meta: RuleMeta = mod.RULE
            reason = _missing_input(ctx, meta)
            if reason:
                check = not_applicable(meta, reason)
            else:
                check = severity_follows_impact(too_small_to_find(mod.check(ctx)))
            checks.append(_with_absent_inputs(ctx, meta, check))
    found = {c.rule for c in checks if c.status == "finding" and not c.qualifies}  # a caveat explains nothing
    linked = []
    for c, mod in zip(checks, mods):
        ups = tuple(r for r in mod.RULE.may_be_downstream_of if r in found and r != c.rule)
        linked.append(replace(c, downstream_of=ups) if c.status == "finding" and ups else c)
    return sorted(linked, key=walk_key)
