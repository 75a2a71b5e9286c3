"""The α–β fit of the tensor-parallel collectives: one sample per call (its payload, bus bytes and time), and the
robust fit τ = α + V/B per group size. COL003 reads it for T*, PATH002 for the measured bus bandwidth, the
communication section for its chart."""

from __future__ import annotations

from collections import defaultdict

from tracediag.analyses.stragglers import matched_views
from tracediag.analyses.tp_collectives import SEQUENCE_PARALLEL, tp_allreduce_where, tp_sp_where
from tracediag.context import Context
from tracediag.model import tpmath

# One fit sample per call: the call's group size g (p when unrecorded), its full [T, H] side S (the input of an
# all-reduce or a reduce-scatter, g × the input of an all-gather) and its bus bytes V = S × 2(g−1)/g (an
# all-reduce, or a reduce-scatter the backend ran as one) or S × (g−1)/g. Calls of another group size are
# left out, and so are, in a sequence-parallel run, the logits all-gathers (input width V/g, not H).
# `calls` is a subquery with the columns rank, step_id, ts_ns, call_name, work_event, op, exec_op, in_width,
# group_size, payload_bytes, dur_ns and an `ord` to order by. Parameters: p, p, the subquery's, p, sp, vocab, H,
# vocab.
SAMPLES_SQL = """
WITH x AS (
    SELECT *, coalesce(nullif(group_size, 0), ?) AS g,
           CASE WHEN op = 'all_gather' THEN payload_bytes * coalesce(nullif(group_size, 0), ?)
                ELSE payload_bytes END AS full_bytes
    FROM ({calls}) c
)
SELECT rank, step_id AS step, ts_ns, call_name AS name, work_event, op, g AS group_size,
       full_bytes AS payload_bytes,
       CASE WHEN op = 'all_reduce' OR exec_op = 'all_reduce' THEN 2 * (g - 1) / g ELSE (g - 1) / g END
           * full_bytes AS bus_bytes,
       dur_ns
FROM x
WHERE g = ?
  AND NOT (? AND op = 'all_gather' AND coalesce(in_width, 0) <> 0 AND coalesce(?, 0) <> 0
           AND in_width IS DISTINCT FROM ? AND in_width * g = ?)
ORDER BY ord
"""
# The shortest call of each matched set (tracediag/derive/matched_collectives.sql) of the fitted ops whose
# ranks agree on one payload; `ops` is bound as a list.
MATCHED_CALLS_SQL = """
SELECT short_rank AS rank, short_step_id AS step_id, short_ts_ns AS ts_ns, short_call_name AS call_name,
       short_work_event AS work_event, short_op AS op, short_exec_op AS exec_op, short_in_width AS in_width,
       short_group_size AS group_size, short_payload_bytes AS payload_bytes, min_dur_ns AS dur_ns,
       set_no AS ord, calls
FROM matched_sets
WHERE list_contains(?::VARCHAR[], op) AND distinct_payloads = 1 AND NOT payload_missing
"""


# Each call's own time, of the TP all-reduces (False) or, sequence-parallel, the reduce-scatters and all-gathers
# (True); parameter: p.
_OWN_CALLS_SQL = {
    sp: "SELECT rank, step_id, ts_ns, call_name, coalesce(kernel_name, exec_name) AS work_event, op, exec_op, "
    "in_width, group_size, payload_bytes, dur_ns, row_number() OVER (ORDER BY rank, ts_ns) AS ord "
    f"FROM collectives WHERE {where} AND payload_bytes IS NOT NULL AND dur_ns IS NOT NULL"
    for sp, where in ((False, tp_allreduce_where()), (True, tp_sp_where()))
}
# The fixed set of sample queries (SAMPLES_SQL over each calls subquery), composed once
SAMPLES_MATCHED_SQL = SAMPLES_SQL.format(calls=MATCHED_CALLS_SQL)
SAMPLES_OWN_SQL = {sp: SAMPLES_SQL.format(calls=q) for sp, q in _OWN_CALLS_SQL.items()}
FIRST_SET_SQL = f"SELECT calls FROM ({MATCHED_CALLS_SQL}) ORDER BY ord LIMIT 1"


def allreduce_samples(ctx: Context, p: int, scheme: str = "all_reduce") -> tuple[list[dict], str]:
    """Collective call times for the fit (the TP all-reduces, or the reduce-scatters and all-gathers of a
    sequence-parallel run): per matched call (several ranks given) the shortest rank's time — the last
    arriver's, closest to the transfer itself; else each call's own time. Each sample carries its full
    payload S and its bus bytes V. Queried once per memoized stretch (COL003, PATH002 and the communication
    section read them; often more rows than the query memo keeps): the list is shared, not to be changed."""
    return ctx.once(("allreduce_samples", p, scheme), lambda: _allreduce_samples(ctx, p, scheme))


def allreduce_fits(ctx: Context, p: int, scheme: str = "all_reduce") -> dict[int, tpmath.AlphaBetaFit | None]:
    """fit_by_group_size of allreduce_samples, once per memoized stretch (a Theil–Sen fit is O(n²) pairs)."""
    samples, _ = allreduce_samples(ctx, p, scheme)
    return ctx.once(("allreduce_fits", p, scheme), lambda: fit_by_group_size(samples))


def _allreduce_samples(ctx: Context, p: int, scheme: str) -> tuple[list[dict], str]:
    sp = scheme == SEQUENCE_PARALLEL
    ops = ["reduce_scatter", "all_gather"] if sp else ["all_reduce"]
    m = ctx.model
    H, vocab = (m.H if m else None), (getattr(m, "vocab_size", None) if m else None)

    def samples(sql: str, params: list) -> list[dict]:
        return ctx.rows(sql, [p, p, *params, p, sp, vocab, H, vocab])

    matched_views(ctx)
    first_set = ctx.scalar(FIRST_SET_SQL, [ops])
    if first_set is not None:
        out = samples(SAMPLES_MATCHED_SQL, [ops])
        if out:
            return out, f"shortest rank's time of each call matched across {first_set} ranks"
    return samples(SAMPLES_OWN_SQL[sp], [p]), "each call's own time (one rank: includes waiting for the other ranks)"


def fit_by_group_size(samples: list[dict]) -> dict[int, tpmath.AlphaBetaFit | None]:
    groups: dict[int, list[dict]] = defaultdict(list)
    for s in samples:
        groups[int(s["group_size"])].append(s)
    return {
        g: tpmath.fit_alpha_beta(
            [s["payload_bytes"] for s in ss],
            [s["dur_ns"] / 1e9 for s in ss],
            g,
            bus_bytes=[s.get("bus_bytes", tpmath.allreduce_bus_bytes(s["payload_bytes"], g)) for s in ss],
        )
        for g, ss in sorted(groups.items())
    }
