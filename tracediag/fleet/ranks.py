"""Which ranks get the deep (per-kernel) analysis, and the rules evaluated one tensor-parallel group at a time.

A fleet run holds many ranks; the cheap tables (inputs, process groups, steps, step activity, collectives) are
read on every rank, the per-kernel and per-op tables (kernels, runtime, cpu_ops, annotations, gemm_shapes,
kernel_steps, ...) only on the *deep* ranks:

- `--ranks all`: every rank; `--ranks 0,3,8-15`: those ranks;
- default: every rank when there are at most 8; otherwise one per TP group (its lowest rank) plus the straggler
  COL005 names in each group (its check run on that group's collectives).

With more than one TP group the rules run once per group, on views of the store restricted to the group's ranks
(so collectives are matched within their group, whatever the process-group names say), and the results are
merged: each rule keeps its worst group's check (a finding before a pass before not applicable; then severity,
then impact) and says which group it came from and how every group fared. Cross-group summaries: each group's
median step time, the slowest group and the data-parallel imbalance (slowest / fastest − 1).

The restriction is a set of temporary views with the tables' own names over the connection's tables
(`restricted`), so every rule and section runs unchanged; on a Parquet store the groups can run as separate
tasks (`evaluate_group`) in local processes or on a Dask cluster.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import duckdb

from tracediag.analyses.stragglers import dominant_straggler
from tracediag.errors import UsageError

DEFAULT_ALL_UP_TO = 8  # default: every rank is deep-analysed when there are at most this many
# tables read on every rank (one row per rank, step or collective call)
CHEAP_TABLES = ("inputs", "process_groups", "steps", "step_activity", "collectives", "step_annotations_unparsed")
# per-kernel / per-op tables: read on the deep ranks only
DEEP_TABLES = (
    "kernels",
    "runtime",
    "cpu_ops",
    "annotations",
    "gemm_shapes",
    "kernel_steps",
    "kernel_op_class",
    "memops",
    "gpu_sync",
    "gpu_timeline",
    "flows",
    "nvtx_events",
    "host_stalls",
    "eager_cpu_ops",
    "sdpa_ops",
    "op_roofline",
)

_RANGE = re.compile(r"^\s*(\d+)\s*(?:-\s*(\d+)\s*)?$")


def parse_ranks(text: str | None) -> str | list[int] | None:
    """'--ranks' value: None (default), 'all', or the sorted ranks of a list like '0,3,8-15'."""
    if text is None:
        return None
    if text.strip().lower() == "all":
        return "all"
    out: set[int] = set()
    for part in text.split(","):
        m = _RANGE.match(part)
        if not m:
            raise UsageError(f"--ranks: '{part.strip()}' is not a rank or a range like 8-15 (or give 'all')")
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            raise UsageError(f"--ranks: range '{part.strip()}' ends before it starts")
        if hi - lo > 1_000_000:
            raise UsageError(f"--ranks: range '{part.strip()}' is larger than any fleet")
        out.update(range(lo, hi + 1))
    return sorted(out)


def compact(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5, 8, 9] -> '0-2,5,8-9'."""
    rs = sorted(set(ranks))
    parts, i = [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ",".join(parts)


@dataclass(frozen=True)
class RankGroup:
    name: str  # "TP group 0", ...
    ranks: tuple[int, ...]  # ranks of the group present in the inputs
    expected: tuple[int, ...]  # ranks the group should have (from the process group or the block of p)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "ranks": list(self.ranks), "expected": list(self.expected)}


@dataclass
class RankPlan:
    """Which ranks are present, expected, missing, failed, and which get the deep analysis (and why)."""

    present: list[int]
    expected: list[int] | None
    expected_source: str
    failed: list[dict[str, Any]]
    groups: list[RankGroup]
    groups_source: str
    selection: str  # how the deep ranks were chosen, in words
    requested: str | list[int] | None
    deep: list[int] = field(default_factory=list)
    deep_by_group: bool = False  # the default with many ranks: each group's lowest rank + its straggler
    why: dict[int, str] = field(default_factory=dict)
    group_summaries: list[dict[str, Any]] = field(default_factory=list)
    cross_group: dict[str, Any] = field(default_factory=dict)

    @property
    def missing(self) -> list[int]:
        return sorted(set(self.expected or ()) - set(self.present))

    @property
    def not_deep(self) -> list[int]:
        return sorted(set(self.present) - set(self.deep))

    @property
    def all_deep(self) -> bool:
        return set(self.deep) >= set(self.present)

    def to_dict(self) -> dict[str, Any]:
        return {
            "selection": self.selection,
            "present": self.present,
            "analysed": sorted(self.deep),
            "not_deep_analysed": self.not_deep,
            "missing": self.missing,
            "expected": self.expected,
            "expected_source": self.expected_source,
            "failed": self.failed,
            "why": {str(r): w for r, w in sorted(self.why.items())},
            "groups": [g.to_dict() for g in self.groups],
            "groups_source": self.groups_source,
            "group_summaries": self.group_summaries,
            "cross_group": self.cross_group,
        }


def present_ranks(con: duckdb.DuckDBPyConnection) -> list[int]:
    return [
        r[0] for r in con.execute("SELECT DISTINCT rank FROM inputs WHERE rank IS NOT NULL ORDER BY rank").fetchall()
    ]


def _expected(con: duckdb.DuckDBPyConnection, present: list[int]) -> tuple[list[int] | None, str]:
    world = con.execute("SELECT max(world_size) FROM inputs WHERE rank IS NOT NULL").fetchone()[0]
    if world and world > 0:
        return list(range(int(world))), f"distributedInfo.world_size = {world}"
    listed = con.execute("SELECT list(DISTINCT r) FROM (SELECT unnest(ranks) AS r FROM process_groups)").fetchone()[0]
    if listed:
        return sorted(set(listed)), "the ranks the process groups list (distributedInfo.pg_config)"
    return None, "unknown (no world size or process-group ranks recorded)"


def tp_groups(
    con: duckdb.DuckDBPyConnection, layout: Any, present: list[int], expected: list[int] | None
) -> tuple[list[RankGroup], str]:
    """The TP groups: the process groups the layout calls TP, by their recorded ranks; else blocks of p
    consecutive ranks (tensor parallelism innermost, as vLLM, SGLang and Megatron place it)."""
    p = layout.tp.p if layout is not None and layout.tp is not None else None
    if not p or p <= 1:
        why = "p = 1: no tensor parallelism, the ranks are one group" if p == 1 else "no TP degree known: one group"
        return [RankGroup("all ranks", tuple(present), tuple(expected or present))], why
    named = [g for g in (layout.groups if layout is not None else ()) if g.kind == "TP" and g.name is not None]
    listed: dict[tuple[int, ...], None] = {}
    for g in named:
        rows = con.execute(
            "SELECT DISTINCT ranks FROM process_groups WHERE pg_name = ? AND ranks IS NOT NULL", [g.name]
        ).fetchall()
        for (ranks,) in rows:
            listed[tuple(sorted(ranks))] = None
    covered = {r for t in listed for r in t}
    # a listed group of another size than p is not a TP group of this run (the world group a trace without
    # process-group names calls TP, when --tp says otherwise)
    if (
        listed
        and set(present) <= covered
        and sum(len(t) for t in listed) == len(covered)
        and all(len(t) == p for t in listed)
    ):
        groups = [
            RankGroup(f"TP group {i}", tuple(r for r in t if r in present), t) for i, t in enumerate(sorted(listed))
        ]
        return [g for g in groups if g.ranks], "the TP process groups' ranks (distributedInfo.pg_config)"
    universe = sorted(set(expected or ()) | set(present))
    blocks: dict[int, list[int]] = {}
    for r in universe:
        blocks.setdefault(r // p, []).append(r)
    groups = [
        RankGroup(f"TP group {b}", tuple(r for r in rs if r in present), tuple(rs)) for b, rs in sorted(blocks.items())
    ]
    return (
        [g for g in groups if g.ranks],
        f"blocks of p = {p} consecutive ranks (TP innermost; the process groups do not list the TP ranks)",
    )


def make_plan(
    con: duckdb.DuckDBPyConnection,
    layout: Any,
    requested: str | list[int] | None,
    failed: Sequence[dict[str, Any]] = (),
) -> RankPlan:
    """The plan before any rule runs (the deep ranks of the default selection are filled in per group)."""
    present = present_ranks(con)
    expected, exp_source = _expected(con, present)
    groups, g_source = tp_groups(con, layout, present, expected)
    plan = RankPlan(
        present=present,
        expected=expected,
        expected_source=exp_source,
        failed=list(failed),
        groups=groups,
        groups_source=g_source,
        selection="",
        requested=requested,
    )
    if requested == "all":
        plan.selection = "--ranks all"
        plan.deep = list(present)
        plan.why = {r: "--ranks all" for r in present}
    elif isinstance(requested, list):
        absent = sorted(set(requested) - set(present))
        if absent and not set(requested) & set(present):
            raise UsageError(f"--ranks {compact(requested)}: none of these ranks is in the inputs ({compact(present)})")
        plan.selection = f"--ranks {compact(requested)}" + (f" ({compact(absent)} not in the inputs)" if absent else "")
        plan.deep = sorted(set(requested) & set(present))
        plan.why = {r: "named by --ranks" for r in plan.deep}
    elif len(present) <= DEFAULT_ALL_UP_TO:
        plan.selection = f"every rank (default with at most {DEFAULT_ALL_UP_TO} ranks)"
        plan.deep = list(present)
        plan.why = {r: f"default: {len(present)} ranks ≤ {DEFAULT_ALL_UP_TO}" for r in present}
    else:
        plan.selection = "one rank per TP group (its lowest) plus the straggler COL005 names in each group (default)"
        plan.deep_by_group = True
    return plan


def default_deep_for_group(con: duckdb.DuckDBPyConnection, ctx_factory: Any, group: RankGroup) -> dict[int, str]:
    """The default deep ranks of one group: its lowest rank, and the straggler when one dominates (the rank skew COL005
    reports; it reads only the cheap tables, so it is computed before the deep tables are chosen)."""
    out = {group.ranks[0]: f"representative of {group.name} (its lowest rank)"}
    if len(group.ranks) > 1 and con.execute("SELECT count(*) FROM collectives").fetchone()[0]:
        s = dominant_straggler(ctx_factory())
        if s is not None:
            out.setdefault(int(s), f"the straggler COL005 names in {group.name}")
    return out


@contextmanager
def restricted(con: duckdb.DuckDBPyConnection, ranks: Sequence[int], deep: Sequence[int]) -> Iterator[None]:
    """Temporary views named like the tables: rank tables hold `ranks` only, per-kernel tables `deep` only.
    Dropped on exit (the connection's own tables are untouched)."""
    db = con.execute("SELECT current_database()").fetchone()[0].replace('"', '""')
    existing = {
        r[0]
        for r in con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'main' AND table_catalog = ?",
            [con.execute("SELECT current_database()").fetchone()[0]],
        ).fetchall()
    }
    made = []
    everyone = {r[0] for r in con.execute(f'SELECT DISTINCT rank FROM "{db}".main.inputs').fetchall()} - {None}
    rank_list = ", ".join(str(int(r)) for r in sorted(set(ranks))) or "NULL"
    deep_list = ", ".join(str(int(r)) for r in sorted(set(deep) & set(ranks))) or "NULL"
    all_ranks, all_deep = set(ranks) >= everyone, set(deep) & set(ranks) >= everyone
    for table in (*CHEAP_TABLES, *DEEP_TABLES):
        if table not in existing:
            continue
        cols = {r[0] for r in con.execute(f'DESCRIBE "{db}".main.{table}').fetchall()}
        if "rank" not in cols:
            continue
        keep = deep_list if table in DEEP_TABLES else rank_list
        # every rank kept: no filter (a filter on a store's rank column costs more than the read); inputs
        # without a rank (telemetry) stay
        if all_deep if table in DEEP_TABLES else all_ranks:
            where = ""
        else:
            where = f" WHERE rank IN ({keep})" + (" OR rank IS NULL" if table == "inputs" else "")
        if not where:
            continue
        con.execute(f'CREATE OR REPLACE TEMP VIEW {table} AS SELECT * FROM "{db}".main.{table}{where}')
        made.append(table)
    try:
        yield
    finally:
        for table in made:
            con.execute(f"DROP VIEW IF EXISTS temp.main.{table}")


# Tables of a Parquet store with at most this many rows are copied into memory while the rules of a single
# group run on the whole store (`local_copies`): every query on a store view lists and opens its files again,
# a few ms per query on tables of a few hundred rows. The per-kernel/per-op tables of a large run stay views.
LOCAL_COPY_MAX_ROWS = 100_000


class LocalCopies:
    """Temporary tables named like a store's small tables (views over its Parquet files), copies of their rows,
    so that queries read memory; `drop()` removes them (the views are untouched and read again)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, tables: Sequence[str] = ()) -> None:
        self.con, self.tables = con, list(tables)

    @classmethod
    def of_store(cls, con: duckdb.DuckDBPyConnection, store: Any, max_rows: int = LOCAL_COPY_MAX_ROWS) -> LocalCopies:
        """Copies of the store's tables with 1..max_rows rows (their row counts from the store's manifest)."""
        from pathlib import Path

        from tracediag.store.parquet import read_manifest

        tables = read_manifest(Path(store)).tables
        small = [t for t, info in tables.items() if 0 < int(info.get("rows") or 0) <= max_rows]
        db = con.execute("SELECT current_database()").fetchone()[0].replace('"', '""')
        views = {
            r[0]
            for r in con.execute(
                "SELECT view_name FROM duckdb_views() WHERE NOT internal AND schema_name = 'main' "
                "AND database_name = current_database()"
            ).fetchall()
        }
        copies = cls(con)
        try:
            for table in small:
                if table in views:
                    con.execute(f'CREATE TEMP TABLE {table} AS SELECT * FROM "{db}".main.{table}')
                    copies.tables.append(table)
        except BaseException:
            copies.drop()
            raise
        return copies

    def drop(self) -> None:
        while self.tables:
            self.con.execute(f"DROP TABLE IF EXISTS temp.main.{self.tables.pop()}")


# --- merging the groups' checks ---------------------------------------------------------------------------------

_STATUS = {"finding": 0, "pass": 1, "not_applicable": 2}
_SEVERITY = {"error": 0, "warning": 1, "info": 2, None: 3}


def _worst_key(c: Any) -> tuple:
    return (_STATUS.get(c.status, 3), _SEVERITY.get(c.severity, 3), -(c.impact or 0.0))


def merge_group_checks(per_group: list[tuple[RankGroup, list[Any]]]) -> list[Any]:
    """One check per rule: the worst group's, with `values.tp_group` (where it came from) and
    `values.tp_groups` (every group's status, severity, impact)."""
    from dataclasses import replace

    if len(per_group) == 1:
        return per_group[0][1]
    by_rule: dict[str, list[tuple[RankGroup, Any]]] = {}
    order: list[str] = []
    for group, checks in per_group:
        for c in checks:
            if c.rule not in by_rule:
                order.append(c.rule)
            by_rule.setdefault(c.rule, []).append((group, c))
    merged = []
    for rule in order:
        entries = by_rule[rule]
        group, worst = min(entries, key=lambda e: _worst_key(e[1]))
        summary = [
            {
                "group": g.name,
                "ranks": compact(g.ranks),
                "status": c.status,
                "severity": c.severity if c.status == "finding" else None,
                "impact": c.impact if c.status == "finding" else None,
                "title": c.title,
            }
            for g, c in entries
        ]
        values = {**(worst.values or {}), "tp_group": {"name": group.name, "ranks": list(group.ranks)}}
        values["tp_groups"] = summary
        n_find = sum(1 for _, c in entries if c.status == "finding")
        if worst.status != "finding" and len({c.status for _, c in entries}) == 1:
            title = worst.title  # every group passed (or none could run): nothing group-specific to say
        else:
            title = f"{group.name} (ranks {compact(group.ranks)}): {worst.title}"
        if n_find > 1:
            title += f" — {n_find} of {len(entries)} TP groups have this finding"
        merged.append(replace(worst, values=values, title=title))
    return merged


def group_summary(con: duckdb.DuckDBPyConnection, group: RankGroup, checks: list[Any]) -> dict[str, Any]:
    """Per group: median step time over its ranks' steps, steps, the COL005 straggler."""
    row = con.execute("SELECT median(dur_ns), count(*) FROM steps").fetchone()
    col005 = next((c for c in checks if c.rule == "COL005"), None)
    return {
        "group": group.name,
        "ranks": list(group.ranks),
        "missing": sorted(set(group.expected) - set(group.ranks)),
        "median_step_ns": int(row[0]) if row[0] is not None else None,
        "steps": row[1],
        "straggler_rank": col005.values.get("straggler_rank")
        if col005 is not None and col005.status == "finding"
        else None,
        "findings": sorted(c.rule for c in checks if c.status == "finding"),
    }


def cross_group(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """The slowest group and the data-parallel imbalance (slowest median step time / fastest − 1)."""
    timed = [s for s in summaries if s["median_step_ns"]]
    if len(timed) < 2:
        return {}
    slow = max(timed, key=lambda s: s["median_step_ns"])
    fast = min(timed, key=lambda s: s["median_step_ns"])
    return {
        "groups": len(summaries),
        "slowest_group": slow["group"],
        "slowest_median_step_ns": slow["median_step_ns"],
        "fastest_group": fast["group"],
        "fastest_median_step_ns": fast["median_step_ns"],
        "dp_imbalance": round(slow["median_step_ns"] / fast["median_step_ns"] - 1, 4),
        "formula": "DP imbalance = max_g median step time / min_g median step time − 1",
    }


def ranks_section(plan: RankPlan) -> Any:
    """The report's "Ranks" section: analysed, present but not deep-analysed, missing, failed; the TP groups
    and, with several, the cross-group summary."""
    from tracediag.reports.sections import Section

    notes = [
        f"Deep (per-kernel) analysis on {len(plan.deep)} of {len(plan.present)} rank(s) present: "
        f"{compact(plan.deep) or 'none'} — {plan.selection}.",
    ]
    if plan.not_deep:
        notes.append(
            f"Present but not deep-analysed: {compact(plan.not_deep)} (their steps, step activity and collectives "
            "are read; their kernels and ops are not). `--ranks all` analyses every rank."
        )
    if plan.missing:
        notes.append(
            f"Missing: {compact(plan.missing)} — expected from {plan.expected_source}, but no trace file was given."
        )
    if plan.failed:
        notes.append("Failed: " + "; ".join(f"{f.get('path')}: {f.get('error')}" for f in plan.failed))
    notes.append(f"TP groups: {len(plan.groups)}, from {plan.groups_source}.")
    if plan.cross_group:
        cg = plan.cross_group
        notes.append(
            f"Slowest group: {cg['slowest_group']} (median step {cg['slowest_median_step_ns'] / 1e6:.3g} ms) vs the "
            f"fastest {cg['fastest_group']} ({cg['fastest_median_step_ns'] / 1e6:.3g} ms): DP imbalance "
            f"{cg['dp_imbalance']:.1%} ({cg['formula']})."
        )
    rows = [
        {
            "rank": r,
            "status": "deep-analysed" if r in plan.deep else "present, not deep-analysed",
            "why": plan.why.get(r, ""),
            "group": next((g.name for g in plan.groups if r in g.ranks), None),
        }
        for r in plan.present
    ]
    rows += [{"rank": r, "status": "missing", "why": plan.expected_source, "group": None} for r in plan.missing]
    tables: dict[str, list[dict[str, Any]]] = {"ranks": rows}
    if plan.group_summaries:
        tables["TP groups"] = [
            {
                "group": s["group"],
                "ranks": compact(s["ranks"]),
                "deep_ranks": compact(s.get("deep_ranks", [])),
                "missing": compact(s["missing"]),
                "median_step_ns": s["median_step_ns"],
                "steps": s["steps"],
                "straggler_rank": s["straggler_rank"],
                "findings": ", ".join(s["findings"]),
            }
            for s in plan.group_summaries
        ]
    return Section(
        id="ranks", step=3, title="Ranks: analysed, not deep-analysed, missing", tables=tables, notes=tuple(notes)
    )
