"""COL005 Rank skew.

Hypothesis: one rank of the group reaches the collectives late (host stalls, a slower GPU, uneven
work, a noisy neighbour); a blocking collective cannot finish before its last rank arrives, so the
other ranks' collective time is mostly waiting and the trace blames communication for a compute or
host problem on one rank.

Formula: the same collective on every rank of its process group is matched by the process group's
sequence number when the profiler recorded it, else by its order within (process group, op) on each
rank. Per matched call: spread = max_r start_r − min_r start_r; the latest-arriving rank is the
straggler of that call; rank r waits w_r = min(dur_r, max start − start_r). The wait a rank causes =
Σ w of the others over the calls it reached last; the straggler is the rank that causes the most (how
often it arrives last is secondary: a rank last half the time by a few µs costs less than one last the
other half by hundreds). Waiting share of the other ranks = Σ w_r / Σ dur_r over ranks ≠ straggler.
Finding: the others wait at least half their collective time, and the straggler causes at least half of
all the waiting and three times what any other rank causes.

Evidence: per rank, how often it arrived last and how late (median, when last), the wait it caused, its
collective time and the share of it spent waiting; the matched calls with the largest spread (rank, step,
timestamp, event).
Start times are compared across rank files as written (one host clock; traces from different hosts
need synchronised clocks — the end-time spread is shown as a check).

What to do: look at what the straggler does right before the late calls (host gaps, CPU ops, data
loading, Python GC, a sleep or lock, a slower or throttled GPU, NUMA placement of its process);
compare its step composition with the other ranks'. Fix the straggler before tuning the collective.
"""

from __future__ import annotations

from tracediag.analyses.basis import window_time
from tracediag.analyses.kernels import dur
from tracediag.analyses.stragglers import (
    CAUSED_SHARE_MIN,
    DOMINANCE,
    WAITING_SHARE_DOMINANT,
    collective_ranks,
    rank_skew,
)
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="COL005",
    step=4,
    title="Rank skew: a straggler rank makes the others wait in collectives",
    requires_tables=("collectives",),
    requires_window="complete",
    may_be_downstream_of=("SHP001", "PATH001"),
)

# Over the matched sets of tracediag.analyses.stragglers: the median spread by the phase of the straggler's step,
# and the widest sets (the evidence).
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


def _skew_values(ctx: Context, skew, ranks: list) -> dict:
    """The finding's values: the matched calls' start and end spread, the straggler's lateness and the waiting it
    causes, the others' waiting share, and the spread by phase (where the late arrivals happen)."""
    spread, straggler, s_row = skew.spread, skew.straggler, skew.straggler_row
    o_dur, o_wait, waiting_share = skew.others_collective_ns, skew.others_waiting_ns, skew.waiting_share
    mismatched = spread["mismatched"]
    caused_share = skew.caused_share
    # where the late arrivals happen: spread by phase of the straggler's step
    by_phase = {r["phase"]: int(r["median_spread_ns"]) for r in ctx.rows(SPREAD_BY_PHASE_SQL)}
    return {
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
        "straggler_median_late_when_last_ns": s_row["median_late_when_last_ns"],
        "straggler_wait_caused_ns": s_row["wait_caused_ns"],
        "straggler_wait_caused_share": caused_share,
        "others_collective_ns": o_dur,
        "others_waiting_ns": o_wait,
        "others_waiting_share": round(waiting_share, 4),
        "median_spread_ns_by_phase": dict(sorted(by_phase.items())),
        "calls_with_mismatched_payload": mismatched,
        "thresholds": {
            "others_waiting_share": WAITING_SHARE_DOMINANT,
            "wait_caused_share": CAUSED_SHARE_MIN,
            "dominance_over_next_rank": DOMINANCE,
        },
    }


def _note_matching_doubts(values: dict) -> bool:
    """Whether the order-based matching looks reliable (end spread no wider than the start spread); its doubts,
    and payloads that differ across ranks, go to values["note"]."""
    mismatched = values["calls_with_mismatched_payload"]
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
    return reliable


def check(ctx: Context) -> Check:
    ranks = collective_ranks(ctx)
    if len(ranks) < 2:
        return not_applicable(
            RULE,
            f"missing other ranks: the collectives come from rank {ranks[0] if ranks else '?'} only; skew needs "
            "the traces of at least two ranks of a process group",
        )
    skew = rank_skew(ctx)
    if skew is None:
        return not_applicable(RULE, "missing matching collectives: no call was found on two ranks of one group")
    spread, table, straggler, s_row = skew.spread, skew.table, skew.straggler, skew.straggler_row
    o_dur, o_wait, waiting_share = skew.others_collective_ns, skew.others_waiting_ns, skew.waiting_share
    caused_share = skew.caused_share
    other_steps = ctx.rows(
        "SELECT count(*) AS n FROM steps WHERE rank IN (SELECT DISTINCT rank FROM collectives) AND rank <> ?",
        [straggler],
    )[0]["n"]
    values = _skew_values(ctx, skew, ranks)
    reliable = _note_matching_doubts(values)
    formula = (
        "spread = max_r start_r − min_r start_r; waiting share = Σ_{r≠s} min(dur_r, max start − start_r) / Σ dur_r"
    )
    substituted = (
        f"{spread['sets']} matched calls: median spread {values['median_spread_ns'] / 1e3:.1f} µs; rank {straggler} "
        f"arrives last in {s_row['arrived_last']}/{s_row['matched_calls']} (median "
        f"{dur(s_row['median_late_when_last_ns'])} late then) and causes {dur(s_row['wait_caused_ns'])} = "
        f"{caused_share:.0%} of all the waiting; others wait {o_wait / 1e6:.2f} of {o_dur / 1e6:.2f} ms in collectives "
        f"= {waiting_share:.0%}"
    )
    evidence = ctx.rows(WORST_SETS_SQL, [ctx.settings.max_evidence])
    values["next_rank_wait_caused_ns"] = skew.runner_up_wait_caused_ns
    if not skew.dominant:
        return passed(
            RULE,
            confidence="medium" if reliable else "low",
            title=(
                f"No dominant straggler: median start spread {dur(values['median_spread_ns'])}; the rank whose late "
                f"arrivals cost the most (rank {straggler}) causes {caused_share:.0%} of the waiting, the other ranks "
                f"wait {waiting_share:.0%} of their collective time"
            ),
            formula=formula,
            substituted=substituted,
            values=values,
            table=table,
            evidence=evidence,
        )
    wt = window_time(ctx)
    values |= wt.values(o_wait)
    substituted += f"; impact {wt.text(o_wait)}"
    return finding(
        RULE,
        severity="warning",
        confidence=("high" if s_row["arrived_last_share"] >= 0.75 else "medium") if reliable else "low",
        # the others' waiting as a share of the window's step time, the basis of every trace-side impact
        impact=wt.share(o_wait),
        impact_basis=wt.basis,
        cost_ns=int(o_wait),
        cost_per_step_ns=int(o_wait / other_steps) if other_steps else None,
        title=(
            f"Rank {straggler} is the straggler: its late arrivals cause {caused_share:.0%} of the waiting at "
            f"collectives ({dur(s_row['wait_caused_ns'])}; last at {s_row['arrived_last_share']:.0%} of them, median "
            f"{dur(s_row['median_late_when_last_ns'])} late then); the other ranks spend {waiting_share:.0%} of their "
            "collective time waiting"
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
