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

import statistics
from collections import defaultdict

from tracediag.engine import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="COL005",
    step=4,
    title="Rank skew: a straggler rank makes the others wait in collectives",
    requires_tables=("collectives",),
    may_be_downstream_of=("SHP001", "PATH001"),
)
WAITING_SHARE_FINDING = 0.5  # "the others' collective time is mostly waiting" (RULEBOOK COL005)
LAST_SHARE_MIN = 0.5  # the straggler must arrive last in at least this share of matched calls


def matched_collectives(ctx: Context) -> list[dict]:
    """Collective calls matched across ranks: one dict per call of a process group with its per-rank rows.

    Matching key: (process group, seq) when every call of the group carries the collective sequence
    number (record_param_comms / NCCL kernel args 'Seq'), else (process group, op, ordinal of the call
    in host-call order on its rank). Only calls seen on at least two ranks are returned.
    """
    rows = ctx.rows(
        """
        WITH c AS (
            SELECT rank, call_id, step_id, op, exec_op, in_width, payload_bytes, group_size, ts_ns, dur_ns, seq,
                   call_name, coalesce(kernel_name, exec_name) AS work_event,
                   coalesce(cpu_ts_ns, ts_ns) AS order_ts,
                   coalesce(pg_name, pg_ranks, '') AS pg
            FROM collectives WHERE ts_ns IS NOT NULL AND dur_ns IS NOT NULL
        ),
        g AS (SELECT pg, bool_and(seq IS NOT NULL) AS by_seq FROM c GROUP BY pg),
        k AS (
            SELECT c.*, g.by_seq,
                   row_number() OVER (PARTITION BY c.rank, c.pg, c.op ORDER BY c.order_ts, c.call_id) - 1 AS ordinal
            FROM c JOIN g USING (pg)
        )
        SELECT rank, call_id, step_id, op, exec_op, in_width, payload_bytes, group_size, ts_ns, dur_ns, call_name,
               work_event, pg,
               CASE WHEN by_seq THEN 'sequence number' ELSE 'order within process group and op' END AS matched_by,
               CASE WHEN by_seq THEN '' ELSE op END AS key_op,
               CASE WHEN by_seq THEN seq ELSE ordinal END AS key
        FROM k ORDER BY pg, key_op, key, rank
        """
    )
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        groups[(r["pg"], r["key_op"], r["key"])].append(r)
    out = []
    for (pg, _, key), calls in groups.items():
        if len({c["rank"] for c in calls}) < 2:
            continue
        last_ts = max(c["ts_ns"] for c in calls)
        first_ts = min(c["ts_ns"] for c in calls)
        ends = [c["ts_ns"] + c["dur_ns"] for c in calls]
        last = max(calls, key=lambda c: (c["ts_ns"], c["rank"]))
        for c in calls:
            c["waiting_ns"] = max(0, min(c["dur_ns"], last_ts - c["ts_ns"]))
        out.append(
            {
                "pg": pg,
                "key": key,
                "op": calls[0]["op"],
                "matched_by": calls[0]["matched_by"],
                "calls": calls,
                "ranks": len(calls),
                "spread_ns": last_ts - first_ts,
                "end_spread_ns": max(ends) - min(ends),
                "last_rank": last["rank"],
                "first_ts_ns": first_ts,
                "min_dur_ns": min(c["dur_ns"] for c in calls),
                "payloads": {c["payload_bytes"] for c in calls},
            }
        )
    return out


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def _quantile(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def rank_table(sets: list[dict]) -> list[dict]:
    """Per rank: arrivals last, lateness, collective time and waiting (the report's skew table)."""
    per: dict[int, dict] = defaultdict(lambda: {"calls": 0, "last": 0, "late": [], "dur": 0, "wait": 0})
    for s in sets:
        for c in s["calls"]:
            d = per[c["rank"]]
            d["calls"] += 1
            d["last"] += c["rank"] == s["last_rank"]
            d["late"].append(c["ts_ns"] - s["first_ts_ns"])
            d["dur"] += c["dur_ns"]
            d["wait"] += c["waiting_ns"]
    return [
        {
            "rank": r,
            "matched_calls": d["calls"],
            "arrived_last": d["last"],
            "arrived_last_share": round(d["last"] / d["calls"], 3),
            "median_lateness_ns": int(_median(d["late"])),
            "p90_lateness_ns": int(_quantile(d["late"], 0.9)),
            "collective_ns": d["dur"],
            "waiting_ns": d["wait"],
            "waiting_share": round(d["wait"] / d["dur"], 3) if d["dur"] else None,
        }
        for r, d in sorted(per.items())
    ]


def check(ctx: Context) -> Check:
    ranks = [r[0] for r in ctx.con.execute("SELECT DISTINCT rank FROM collectives ORDER BY rank").fetchall()]
    if len(ranks) < 2:
        return not_applicable(
            RULE,
            f"missing other ranks: the collectives come from rank {ranks[0] if ranks else '?'} only; skew needs "
            "the traces of at least two ranks of a process group",
        )
    sets = matched_collectives(ctx)
    if not sets:
        return not_applicable(RULE, "missing matching collectives: no call was found on two ranks of one group")
    table = rank_table(sets)
    by_rank = {t["rank"]: t for t in table}
    straggler = max(table, key=lambda t: (t["arrived_last_share"], t["median_lateness_ns"]))["rank"]
    s_row = by_rank[straggler]
    others = [t for t in table if t["rank"] != straggler]
    o_dur = sum(t["collective_ns"] for t in others)
    o_wait = sum(t["waiting_ns"] for t in others)
    waiting_share = o_wait / o_dur if o_dur else 0.0
    spreads = [s["spread_ns"] for s in sets]
    mismatched = sum(1 for s in sets if len(s["payloads"]) > 1 and s["op"] == "all_reduce")
    step_ns = ctx.scalar(
        "SELECT sum(dur_ns) FROM steps WHERE rank IN (SELECT DISTINCT rank FROM collectives) AND rank <> ?",
        [straggler],
    )
    # where the late arrivals happen: spread by phase of the straggler's step
    phase_of = {
        (r["rank"], r["step_id"]): r["phase"]
        for r in ctx.rows("SELECT rank, step_id, coalesce(phase, 'unknown') AS phase FROM steps")
    }
    by_phase: dict[str, list[int]] = defaultdict(list)
    for s in sets:
        c = next(c for c in s["calls"] if c["rank"] == s["last_rank"])
        by_phase[phase_of.get((c["rank"], c["step_id"]), "outside steps")].append(s["spread_ns"])
    values = {
        "matched_by": sets[0]["matched_by"],
        "matched_calls": len(sets),
        "ranks": ranks,
        "median_spread_ns": int(_median(spreads)),
        "p90_spread_ns": int(_quantile(spreads, 0.9)),
        "max_spread_ns": max(spreads),
        "median_end_spread_ns": int(_median([s["end_spread_ns"] for s in sets])),
        "straggler_rank": straggler,
        "straggler_last_share": s_row["arrived_last_share"],
        "straggler_median_lateness_ns": s_row["median_lateness_ns"],
        "others_collective_ns": o_dur,
        "others_waiting_ns": o_wait,
        "others_waiting_share": round(waiting_share, 4),
        "median_spread_ns_by_phase": {k: int(_median(v)) for k, v in sorted(by_phase.items())},
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
        f"{len(sets)} matched calls: median spread {values['median_spread_ns'] / 1e3:.1f} µs; rank {straggler} "
        f"arrives last in {s_row['arrived_last']}/{s_row['matched_calls']}; others wait "
        f"{o_wait / 1e6:.2f} of {o_dur / 1e6:.2f} ms in collectives = {waiting_share:.0%}"
    )
    worst = sorted(sets, key=lambda s: -s["spread_ns"])[: ctx.settings.max_evidence]
    evidence = []
    for s in worst:
        c = next(c for c in s["calls"] if c["rank"] == s["last_rank"])
        evidence.append(
            {
                "rank": c["rank"],
                "step": c["step_id"],
                "ts_ns": c["ts_ns"],
                "name": c["call_name"],
                "work_event": c["work_event"],
                "op": s["op"],
                "match_key": s["key"],
                "spread_ns": s["spread_ns"],
                "first_rank": min(s["calls"], key=lambda x: x["ts_ns"])["rank"],
            }
        )
    is_finding = waiting_share >= WAITING_SHARE_FINDING and s_row["arrived_last_share"] >= max(
        LAST_SHARE_MIN, 1.2 / len(ranks)
    )
    if not is_finding:
        return passed(
            RULE,
            confidence="medium" if reliable else "low",
            title=(
                f"No dominant straggler: median start spread {values['median_spread_ns'] / 1e3:.0f} µs, other "
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
            f"collectives (median {s_row['median_lateness_ns'] / 1e3:.0f} µs late); the other ranks spend "
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
