"""Rank skew: the same collective matched across the ranks of its process group, who arrives last and how long
the others wait for it. COL005 reports it; COL003 and PATH002 take their call times from the matched sets; the
report's skew table and chart and the rank planner (the straggler it analyses in depth) read it too.

Tables (tracediag/derive/matched_collectives.sql): the view `matched_keyed` and the temporary tables
`matched_sets` (one row per matched call set), `matched_calls` (one row per call of a set) and `matched_ranks`
(one row per rank).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import duckdb

from tracediag.context import Context
from tracediag.store import _sql

# A straggler dominates when the other ranks' collective time is mostly waiting (docs/method.md, COL005), and it
# causes at least CAUSED_SHARE_MIN of all the waiting at matched calls and DOMINANCE times what any other rank
# causes (two ranks: 75 % of it). How often it arrives last is secondary: a rank last half the time by a few µs
# costs less than one last the other half by hundreds.
WAITING_SHARE_DOMINANT = 0.5
CAUSED_SHARE_MIN = 0.5
DOMINANCE = 3.0


def matched_views(ctx: Context) -> None:
    """Build the temporary view `matched_keyed` and tables `matched_sets`, `matched_calls`, `matched_ranks` from the
    store's collectives (tracediag/derive/matched_collectives.sql): every call matched across the ranks of
    its process group, one row per matched set, one row per rank.

    Matching key: (process group, seq) when every call of the group carries the collective sequence
    number (record_param_comms / NCCL kernel args 'Seq'), else (process group, op, ordinal of the call
    in host-call order on its rank). Only calls seen on at least two ranks are matched.
    """
    # built once per content of `collectives` (the rules and the report sections all read them; a per-group
    # evaluation restricts `collectives` to other ranks, which changes the fingerprint); checked once per
    # memoized stretch of a context (the store does not change within one)
    ctx.once("matched_views", lambda: _build_matched(ctx))


# Calls whose process group is recorded nowhere (gloo traces: no name, no ranks) are matched within the TP group
# of their rank when the evaluation says which that is (temp table RANK_GROUPS: rank -> group name, made by
# `rank_groups` for the report of a multi-group run); else all such calls form one group. The SQL asks the
# macro `unrecorded_pg(rank)` for that group: NULL, or the rank's group while RANK_GROUPS exists.
RANK_GROUPS = "rank_tp_group"
_UNRECORDED_PG_NONE = "CREATE OR REPLACE TEMP MACRO unrecorded_pg(r) AS NULL"
_UNRECORDED_PG_BY_RANK = (
    f"CREATE OR REPLACE TEMP MACRO unrecorded_pg(r) AS (SELECT g.tp_group FROM {RANK_GROUPS} g WHERE g.rank = r)"
)


def _build_matched(ctx: Context) -> None:
    fingerprint = ctx.con.execute(
        "SELECT count(*), sum(rank), min(ts_ns), max(ts_ns), sum(call_id), sum(dur_ns) FROM collectives"
    ).fetchone()
    groups = _has_rank_groups(ctx.con)
    key = "|".join(map(str, fingerprint)) + ("|by rank group" if groups else "")
    try:
        built = ctx.con.execute("SELECT key FROM temp.main.matched_fingerprint").fetchone()[0]
    except duckdb.CatalogException:
        built = None
    if built == key:
        return
    ctx.con.execute(_UNRECORDED_PG_BY_RANK if groups else _UNRECORDED_PG_NONE)
    ctx.con.execute(_sql("tracediag.derive", "matched_collectives.sql"))
    ctx.con.execute("CREATE OR REPLACE TEMP TABLE matched_fingerprint AS SELECT ? AS key", [key])


def _has_rank_groups(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(
        con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = ?", [RANK_GROUPS]
        ).fetchone()[0]
    )


@contextlib.contextmanager
def rank_groups(con: duckdb.DuckDBPyConnection, groups: dict[int, str]) -> Iterator[None]:
    """Within the block, calls of an unrecorded process group are matched within their rank's group
    (`groups`: rank -> group name)."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {RANK_GROUPS} (rank INTEGER, tp_group VARCHAR)")
    con.executemany(f"INSERT INTO {RANK_GROUPS} VALUES (?, ?)", sorted(groups.items()))
    try:
        yield
    finally:
        con.execute(f"DROP TABLE IF EXISTS {RANK_GROUPS}")


def matched_summary(ctx: Context) -> dict | None:
    """How many call sets were matched and by what (None when none were): for the report's notes."""
    matched_views(ctx)
    row = ctx.rows(
        "SELECT count(*) AS sets, first(matched_by ORDER BY set_no) AS matched_by, "
        "max(calls) FILTER (WHERE set_no = 1) AS first_set_calls FROM matched_sets"
    )[0]
    return row if row["sets"] else None


def rank_table(ctx: Context) -> list[dict]:
    """Per rank: arrivals last, lateness, collective time and waiting (the report's skew table)."""
    matched_views(ctx)
    rows = ctx.rows("SELECT * FROM matched_ranks ORDER BY rank")
    total = sum(r["waiting_ns"] for r in rows)  # every wait at a matched call, each caused by its set's last arriver
    return [
        {
            "rank": r["rank"],
            "matched_calls": r["matched_calls"],
            "arrived_last": r["arrived_last"],
            "arrived_last_share": round(r["arrived_last"] / r["matched_calls"], 3),
            "median_lateness_ns": int(r["median_lateness_ns"]),
            "p90_lateness_ns": int(r["p90_lateness_ns"]),
            "collective_ns": int(r["collective_ns"]),
            "waiting_ns": int(r["waiting_ns"]),
            "waiting_share": round(r["waiting_ns"] / r["collective_ns"], 3) if r["collective_ns"] else None,
            "wait_caused_ns": int(r["wait_caused_ns"]),
            "wait_caused_share": round(r["wait_caused_ns"] / total, 3) if total else None,
            "median_late_when_last_ns": int(r["median_late_when_last_ns"])
            if r["median_late_when_last_ns"] is not None
            else None,
        }
        for r in rows
    ]


# The spread of the matched sets.
SPREAD_SQL = """
SELECT count(*) AS sets,
       first(matched_by ORDER BY set_no) AS matched_by,
       median(spread_ns) AS median_spread_ns,
       list_sort(list(spread_ns))[least(count(*), CAST(floor(CAST(0.9 AS DOUBLE) * count(*)) AS BIGINT) + 1)]
           AS p90_spread_ns,
       max(spread_ns) AS max_spread_ns,
       median(end_spread_ns) AS median_end_spread_ns,
       count(*) FILTER (WHERE distinct_payloads > 1 AND op = 'all_reduce') AS mismatched
FROM matched_sets
"""


def collective_ranks(ctx: Context) -> list[int]:
    """The ranks that ran collectives, in order."""
    return [r[0] for r in ctx.con.execute("SELECT DISTINCT rank FROM collectives ORDER BY rank").fetchall()]


@dataclass(frozen=True)
class RankSkew:
    """The matched collectives of two or more ranks: their spread, the per-rank table, the straggler (the rank
    whose late arrivals cause the others the most waiting; ties by how often it is last, then its median
    lateness) and what the other ranks wait."""

    ranks: list[int]
    spread: dict[str, Any]  # SPREAD_SQL's row
    table: list[dict]  # rank_table
    straggler: int
    others_collective_ns: int
    others_waiting_ns: int

    @property
    def straggler_row(self) -> dict:
        return next(t for t in self.table if t["rank"] == self.straggler)

    @property
    def waiting_share(self) -> float:
        """Σ_{r≠s} w_r / Σ_{r≠s} dur_r: the other ranks' collective time spent waiting."""
        return self.others_waiting_ns / self.others_collective_ns if self.others_collective_ns else 0.0

    @property
    def caused_share(self) -> float:
        return self.straggler_row["wait_caused_share"] or 0.0

    @property
    def runner_up_wait_caused_ns(self) -> int:
        """The most waiting any other rank causes."""
        return max((t["wait_caused_ns"] for t in self.table if t["rank"] != self.straggler), default=0)

    @property
    def dominant(self) -> bool:
        """The others mostly wait, and the straggler causes ≥ CAUSED_SHARE_MIN of the waiting and ≥ DOMINANCE × the
        next rank's."""
        return (
            self.waiting_share >= WAITING_SHARE_DOMINANT
            and self.caused_share >= CAUSED_SHARE_MIN
            and self.straggler_row["wait_caused_ns"] >= DOMINANCE * self.runner_up_wait_caused_ns
        )


def rank_skew(ctx: Context) -> RankSkew | None:
    """The rank skew of the store's collectives; None with fewer than two ranks or no call matched on two."""
    ranks = collective_ranks(ctx)
    if len(ranks) < 2:
        return None
    matched_views(ctx)
    spread = ctx.rows(SPREAD_SQL)[0]
    if not spread["sets"]:
        return None
    table = rank_table(ctx)
    straggler = max(table, key=lambda t: (t["wait_caused_ns"], t["arrived_last_share"], t["median_lateness_ns"]))[
        "rank"
    ]
    others = [t for t in table if t["rank"] != straggler]
    return RankSkew(
        ranks=ranks,
        spread=spread,
        table=table,
        straggler=straggler,
        others_collective_ns=sum(t["collective_ns"] for t in others),
        others_waiting_ns=sum(t["waiting_ns"] for t in others),
    )


def dominant_straggler(ctx: Context) -> int | None:
    """The straggler rank when one dominates (COL005's finding), else None."""
    skew = rank_skew(ctx)
    return skew.straggler if skew is not None and skew.dominant else None
