"""COL005 Rank skew.

Hypothesis: one rank of the group reaches the collectives late (host stalls, a slower GPU, uneven
work, a noisy neighbour); a blocking collective cannot finish before its last rank arrives, so the
other ranks' collective time is mostly waiting and the trace blames communication for a compute or
host problem on one rank.

Formula: the same collective on every rank of its process group is matched by the process group's
sequence number when the profiler recorded it, else by its order within (process group, op) on each
rank. Per matched call: spread = max_r start_r − min_r start_r; the latest-arriving rank is the
straggler of that call; rank r waits w_r = min(dur_r, max start − start_r). Waiting share of the
other ranks = Σ w_r / Σ dur_r over ranks ≠ straggler.

Evidence: per rank, how often it arrived last, its median lateness, its collective time and the
share of it spent waiting; the matched calls with the largest spread (rank, step, timestamp, event).
Start times are compared across rank files as written (one host clock; traces from different hosts
need synchronised clocks — the end-time spread is shown as a check).

What to do: look at what the straggler does right before the late calls (host gaps, CPU ops, data
loading, Python GC, a sleep or lock, a slower or throttled GPU, NUMA placement of its process);
compare its step composition with the other ranks'. Fix the straggler before tuning the collective.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import duckdb

from tracediag.analyses.kernels import dur
from tracediag.engine import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.store import _sql

RULE = RuleMeta(
    id="COL005",
    step=4,
    title="Rank skew: a straggler rank makes the others wait in collectives",
    requires_tables=("collectives",),
    may_be_downstream_of=("SHP001", "PATH001"),
)
WAITING_SHARE_FINDING = 0.5  # "the others' collective time is mostly waiting" (RULEBOOK COL005)
LAST_SHARE_MIN = 0.5  # the straggler must arrive last in at least this share of matched calls


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
# `rank_groups` for the report of a multi-group run); else all such calls form one group.
RANK_GROUPS = "rank_tp_group"
_PG_RECORDED = "coalesce(pg_name, pg_ranks, '') AS pg"
_PG_OR_GROUP = (
    f"coalesce(pg_name, pg_ranks, (SELECT g.tp_group FROM {RANK_GROUPS} g WHERE g.rank = collectives.rank), '') AS pg"
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
    sql = _sql("tracediag.derive", "matched_collectives.sql")
    if groups:
        if sql.count(_PG_RECORDED) != 1:
            raise AssertionError("matched_collectives.sql: the process-group key expression changed")
        sql = sql.replace(_PG_RECORDED, _PG_OR_GROUP)
    ctx.con.execute(sql)
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
        }
        for r in rows
    ]


# The spread of the matched sets: overall, and by the phase of the straggler's step.
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
SPREAD_BY_PHASE_SQL = """
SELECT CASE WHEN s.step_id IS NULL THEN 'outside steps' ELSE coalesce(s.phase, 'unknown') END AS phase,
       median(m.spread_ns) AS median_spread_ns
FROM matched_sets m LEFT JOIN steps s ON s.rank = m.last_rank AND s.step_id = m.last_step_id
GROUP BY ALL ORDER BY phase
"""
WORST_SETS_SQL = """
SELECT last_rank AS rank, last_step_id AS step, last_ts_ns AS ts_ns, last_call_name AS name,
       last_work_event AS work_event, op, key AS match_key, spread_ns, first_rank
FROM matched_sets ORDER BY spread_ns DESC, set_no LIMIT ?
"""


def check(ctx: Context) -> Check:
    ranks = [r[0] for r in ctx.con.execute("SELECT DISTINCT rank FROM collectives ORDER BY rank").fetchall()]
    if len(ranks) < 2:
        return not_applicable(
            RULE,
            f"missing other ranks: the collectives come from rank {ranks[0] if ranks else '?'} only; skew needs "
            "the traces of at least two ranks of a process group",
        )
    matched_views(ctx)
    spread = ctx.rows(SPREAD_SQL)[0]
    if not spread["sets"]:
        return not_applicable(RULE, "missing matching collectives: no call was found on two ranks of one group")
    table = rank_table(ctx)
    by_rank = {t["rank"]: t for t in table}
    straggler = max(table, key=lambda t: (t["arrived_last_share"], t["median_lateness_ns"]))["rank"]
    s_row = by_rank[straggler]
    others = [t for t in table if t["rank"] != straggler]
    o_dur = sum(t["collective_ns"] for t in others)
    o_wait = sum(t["waiting_ns"] for t in others)
    waiting_share = o_wait / o_dur if o_dur else 0.0
    mismatched = spread["mismatched"]
    step_ns = ctx.scalar(
        "SELECT sum(dur_ns) FROM steps WHERE rank IN (SELECT DISTINCT rank FROM collectives) AND rank <> ?",
        [straggler],
    )
    # where the late arrivals happen: spread by phase of the straggler's step
    by_phase = {r["phase"]: int(r["median_spread_ns"]) for r in ctx.rows(SPREAD_BY_PHASE_SQL)}
    values = {
        "matched_by": spread["matched_by"],
        "matched_calls": spread["sets"],
        "ranks": ranks,
        "median_spread_ns": int(spread["median_spread_ns"]),
        "p90_spread_ns": int(spread["p90_spread_ns"]),
        "max_spread_ns": spread["max_spread_ns"],
        "median_end_spread_ns": int(spread["median_end_spread_ns"]),
        "straggler_rank": straggler,
        "straggler_last_share": s_row["arrived_last_share"],
        "straggler_median_lateness_ns": s_row["median_lateness_ns"],
        "others_collective_ns": o_dur,
        "others_waiting_ns": o_wait,
        "others_waiting_share": round(waiting_share, 4),
        "median_spread_ns_by_phase": dict(sorted(by_phase.items())),
        "calls_with_mismatched_payload": mismatched,
    }
    notes = []
    reliable = values["median_end_spread_ns"] <= max(values["median_spread_ns"], 50_000)
    if not reliable:
        notes.append(
            "the matched calls' end times disagree more than their start times: the clocks of the rank files or "
            "the order-based matching are not reliable here"
        )
    if mismatched:
        notes.append(
            f"{mismatched} matched all-reduces have different payloads on different ranks: the order-based "
            "matching may be off (a rank ran extra collectives)"
        )
    if notes:
        values["note"] = "; ".join(notes)
    formula = (
        "spread = max_r start_r − min_r start_r; waiting share = Σ_{r≠s} min(dur_r, max start − start_r) / Σ dur_r"
    )
    substituted = (
        f"{spread['sets']} matched calls: median spread {values['median_spread_ns'] / 1e3:.1f} µs; rank {straggler} "
        f"arrives last in {s_row['arrived_last']}/{s_row['matched_calls']}; others wait "
        f"{o_wait / 1e6:.2f} of {o_dur / 1e6:.2f} ms in collectives = {waiting_share:.0%}"
    )
    evidence = ctx.rows(WORST_SETS_SQL, [ctx.settings.max_evidence])
    is_finding = waiting_share >= WAITING_SHARE_FINDING and s_row["arrived_last_share"] >= max(
        LAST_SHARE_MIN, 1.2 / len(ranks)
    )
    if not is_finding:
        return passed(
            RULE,
            confidence="medium" if reliable else "low",
            title=(
                f"No dominant straggler: median start spread {dur(values['median_spread_ns'])}, other "
                f"ranks wait {waiting_share:.0%} of their collective time"
            ),
            formula=formula,
            substituted=substituted,
            values=values,
            table=table,
            evidence=evidence,
        )
    return finding(
        RULE,
        severity="warning",
        confidence=("high" if s_row["arrived_last_share"] >= 0.75 else "medium") if reliable else "low",
        impact=min(1.0, o_wait / step_ns) if step_ns else waiting_share,
        title=(
            f"Rank {straggler} is the straggler: it arrives last at {s_row['arrived_last_share']:.0%} of the "
            f"collectives (median {dur(s_row['median_lateness_ns'])} late); the other ranks spend "
            f"{waiting_share:.0%} of their collective time waiting"
        ),
        formula=formula,
        substituted=substituted,
        values=values,
        table=table,
        evidence=evidence,
        next_check=(
            f"Open rank {straggler}'s trace just before the late calls above: host gaps, CPU work, sleeps or "
            "locks, data loading, a slower/throttled GPU or a badly placed process (NUMA). The collective "
            "itself is not slow; do not tune NCCL for this."
        ),
    )
