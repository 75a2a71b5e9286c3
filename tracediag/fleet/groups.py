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
    request: Any  # the run's tracediag.request.Request (for_worker(): plain data that pickles)


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
    request: Any,
    rules: list[Any],
    baseline: Any = None,
) -> GroupResult:
    """The rules on one group's ranks (deep tables on its deep ranks only)."""
    from tracediag.derive.layout import detect_layout
    from tracediag.engine import run_rules

    with restricted(con, group.ranks, group.ranks):
        layout = detect_layout(con, request.tp)
        if requested_deep is None:
            deep = default_deep_for_group(con, lambda: request.context(con, layout, baseline), group)
        else:
            deep = {r: "selected" for r in requested_deep if r in group.ranks}
    with restricted(con, group.ranks, list(deep)):
        checks = run_rules(request.context(con, layout, baseline), rules)
        summary = group_summary(con, group, checks)
    summary["deep_ranks"] = sorted(deep)
    return GroupResult(group, checks, summary, deep, os.getpid())


def evaluate_group_task(task: GroupTask) -> GroupResult:
    """One group on a worker: opens views over its ranks' partitions of the store, evaluates, closes."""
    from tracediag.fleet import open_store_views

    request = task.request
    baseline = request.baseline()  # a worker reads its own, within the run's memory budget
    con = open_store_views(task.store, ranks=task.group.ranks)
    try:
        rules = _rules(request.extra_rules, request.rules)
        return evaluate_group(con, task.group, task.requested_deep, request, rules, baseline)
    finally:
        con.close()
        if baseline is not None:
            baseline.close()


def _requested(plan: RankPlan, group: RankGroup) -> tuple[int, ...] | None:
    if plan.deep_by_group:
        return None
    return tuple(r for r in plan.deep if r in group.ranks)


def evaluate_groups(
    con: duckdb.DuckDBPyConnection, plan: RankPlan, request: Any, baseline: Any = None
) -> list[GroupResult]:
    """Every group of the plan: on `con` in this process, or — given a store (request.store) and more than one
    group — as tasks in local processes (request.jobs, default the cores) or on the Dask cluster
    request.scheduler. `baseline` (context.Baseline) is the TP=1 baseline the groups of this process share; a
    task reads its own."""
    store, scheduler = request.store, request.scheduler
    if store is None or (len(plan.groups) == 1 and scheduler is None):
        mods = _rules(request.extra_rules, request.rules)
        return [evaluate_group(con, g, _requested(plan, g), request, mods, baseline) for g in plan.groups]
    worker = request.for_worker()
    tasks = [GroupTask(str(store), g, _requested(plan, g), worker) for g in plan.groups]
    if scheduler is not None:
        return _run_dask(tasks, scheduler)
    return _run_local(tasks, request.jobs)


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
