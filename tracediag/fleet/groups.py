"""Rules evaluated one TP group at a time: in this process on any connection, or as tasks over a Parquet store
(a local process pool by default, a `dask.distributed` cluster with `scheduler=`), results merged.

A task is `evaluate_group_task(GroupTask)`: it opens the store's views itself (the store folder must be on a
file system every worker can reach), restricts them to its group, chooses the group's deep ranks, runs the
rules and returns the checks, the group summary and the deep ranks with the reason for each — plain data.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from tracediag.fleet.ranks import RankGroup, RankPlan, default_deep_for_group, group_summary, restricted


@dataclass(frozen=True)
class GroupTask:
    store: str
    group: RankGroup
    requested_deep: tuple[int, ...] | None  # None: the default choice (lowest rank + COL005's straggler)
    model: Any
    tp: int | None
    settings: Any
    extra_rules: tuple[str, ...]
    memory_limit: int | None = None  # the budget of the TP=1 baseline's store (tracediag.memory)
    rules: tuple[str, ...] | None = None  # rule ids to run (tracediag check --rules); None: every rule


@dataclass(frozen=True)
class GroupResult:
    group: RankGroup
    checks: list[Any]
    summary: dict[str, Any]
    deep: dict[int, str]
    worker_pid: int


def _rules(extra_rules: Sequence[str], only: Sequence[str] | None = None) -> list[Any]:
    from tracediag.engine import load_rules
    from tracediag.rules import RULE_MODULES

    return load_rules(only) + [importlib.import_module(m) for m in extra_rules if m not in RULE_MODULES]


def evaluate_group(
    con: duckdb.DuckDBPyConnection,
    group: RankGroup,
    requested_deep: Sequence[int] | None,
    model: Any,
    tp: int | None,
    settings: Any,
    rules: list[Any],
    baseline: Any = None,
) -> GroupResult:
    """The rules on one group's ranks (deep tables on its deep ranks only)."""
    from tracediag.context import Context
    from tracediag.derive.layout import detect_layout
    from tracediag.engine import run_rules

    with restricted(con, group.ranks, group.ranks):
        layout = detect_layout(con, tp)
        if requested_deep is None:
            deep = default_deep_for_group(
                con,
                lambda: Context(
                    con=con, model=model, tp=layout.tp, settings=settings, layout=layout, baseline=baseline
                ),
                group,
            )
        else:
            deep = {r: "selected" for r in requested_deep if r in group.ranks}
    with restricted(con, group.ranks, list(deep)):
        ctx = Context(con=con, model=model, tp=layout.tp, settings=settings, layout=layout, baseline=baseline)
        checks = run_rules(ctx, rules)
        summary = group_summary(con, group, checks)
    summary["deep_ranks"] = sorted(deep)
    return GroupResult(group, checks, summary, deep, os.getpid())


def evaluate_group_task(task: GroupTask) -> GroupResult:
    """One group on a worker: opens views over its ranks' partitions of the store, evaluates, closes."""
    from tracediag.context import Baseline
    from tracediag.fleet import open_store_views

    tp1 = task.settings.tp1_baseline if task.settings is not None else None
    baseline = Baseline(tp1, task.memory_limit) if tp1 else None
    con = open_store_views(task.store, ranks=task.group.ranks)
    try:
        return evaluate_group(
            con,
            task.group,
            task.requested_deep,
            task.model,
            task.tp,
            task.settings,
            _rules(task.extra_rules, task.rules),
            baseline,
        )
    finally:
        con.close()
        if baseline is not None:
            baseline.close()


def _requested(plan: RankPlan, group: RankGroup) -> tuple[int, ...] | None:
    if plan.deep_by_group:
        return None
    return tuple(r for r in plan.deep if r in group.ranks)


def evaluate_groups(
    con: duckdb.DuckDBPyConnection,
    plan: RankPlan,
    model: Any,
    tp: int | None,
    settings: Any,
    extra_rules: Sequence[str] = (),
    store: str | None = None,
    scheduler: Any = None,
    jobs: int | None = None,
    baseline: Any = None,
    memory_limit: int | None = None,
    rules: Sequence[str] | None = None,
) -> list[GroupResult]:
    """Every group of the plan: on `con` in this process, or — given a store and more than one group — as tasks
    in local processes (`jobs`, default the cores) or on the Dask cluster `scheduler`. `baseline`
    (context.Baseline) is the TP=1 baseline the groups of this process share; a task reads its own."""
    if store is None or (len(plan.groups) == 1 and scheduler is None):
        mods = _rules(extra_rules, rules)
        return [evaluate_group(con, g, _requested(plan, g), model, tp, settings, mods, baseline) for g in plan.groups]
    tasks = [
        GroupTask(
            str(store),
            g,
            _requested(plan, g),
            model,
            tp,
            settings,
            tuple(extra_rules),
            memory_limit,
            tuple(rules) if rules is not None else None,
        )
        for g in plan.groups
    ]
    if scheduler is not None:
        return _run_dask(tasks, scheduler)
    return _run_local(tasks, jobs)


def _run_local(tasks: list[GroupTask], jobs: int | None) -> list[GroupResult]:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    jobs = min(len(tasks), jobs or os.cpu_count() or 1)
    if jobs <= 1:
        return [evaluate_group_task(t) for t in tasks]
    # spawn, not fork: the parent holds a DuckDB connection (and its threads)
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        return list(pool.map(evaluate_group_task, tasks))


def _run_dask(tasks: list[GroupTask], scheduler: Any) -> list[GroupResult]:
    from tracediag.fleet import run_on_dask

    keys = [f"tracediag-group-{i}-{t.group.name}" for i, t in enumerate(tasks)]
    return run_on_dask(evaluate_group_task, tasks, keys, scheduler)
