-- Collective calls matched across the ranks of their process group (COL005 rank skew; COL003 and PATH002
-- take their call times from it; the report's waiting-per-rank chart). Temporary tables built from `collectives`
-- by tracediag.analyses.stragglers.matched_views() when a rule first needs them (again when `collectives`
-- changes: a view restricted to other ranks): every aggregate over the calls is done here, the rules read one
-- row per matched call set or per rank. A call whose process group is recorded nowhere takes the group the
-- macro unrecorded_pg(rank) names (its rank's TP group in a multi-group report; NULL otherwise), defined by
-- matched_views() before this runs.
--
-- Matching key: (process group, seq) when every call of the group carries the collective sequence number
-- (record_param_comms / NCCL kernel args 'Seq'), else (process group, op, ordinal of the call in host-call
-- order on its rank). A set is kept when it holds calls of at least two ranks.
CREATE OR REPLACE TEMP VIEW matched_keyed AS
WITH c AS (
    SELECT rank, call_id, step_id, op, exec_op, in_width, payload_bytes, group_size, ts_ns, dur_ns, seq,
           call_name, coalesce(kernel_name, exec_name) AS work_event,
           coalesce(cpu_ts_ns, ts_ns) AS order_ts,
           coalesce(pg_name, pg_ranks, unrecorded_pg(collectives.rank), '') AS pg
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
FROM k;

-- One row per matched call set. Ties: the set's op is its lowest rank's; the last arriver is the latest
-- start (the higher rank on equal starts), the first arriver the earliest (the lower rank); the shortest
-- call is the lowest rank's among equal durations. `set_no` orders the sets by (process group, op, key).
CREATE OR REPLACE TEMP TABLE matched_sets AS
SELECT row_number() OVER (ORDER BY pg, key_op, key) AS set_no, *,
       last_ts_ns - first_ts_ns AS spread_ns
FROM (
    SELECT pg, key_op, key,
        any_value(matched_by) AS matched_by,
        first(op ORDER BY rank) AS op,
        count(*) AS calls,
        count(DISTINCT rank) AS ranks,
        max(ts_ns) AS last_ts_ns,
        min(ts_ns) AS first_ts_ns,
        max(ts_ns + dur_ns) - min(ts_ns + dur_ns) AS end_spread_ns,
        min(dur_ns) AS min_dur_ns,
        count(DISTINCT payload_bytes) + max(CASE WHEN payload_bytes IS NULL THEN 1 ELSE 0 END) AS distinct_payloads,
        bool_or(payload_bytes IS NULL) AS payload_missing,
        first(rank ORDER BY ts_ns, rank) AS first_rank,
        -- the last arriver's call: the straggler of the set (evidence and the phase of its step)
        first(rank ORDER BY ts_ns DESC, rank DESC) AS last_rank,
        first(step_id ORDER BY ts_ns DESC, rank DESC) AS last_step_id,
        first(call_name ORDER BY ts_ns DESC, rank DESC) AS last_call_name,
        first(work_event ORDER BY ts_ns DESC, rank DESC) AS last_work_event,
        -- the shortest call: the closest to the transfer itself (the others include waiting)
        first(rank ORDER BY dur_ns, rank) AS short_rank,
        first(step_id ORDER BY dur_ns, rank) AS short_step_id,
        first(ts_ns ORDER BY dur_ns, rank) AS short_ts_ns,
        first(call_name ORDER BY dur_ns, rank) AS short_call_name,
        first(work_event ORDER BY dur_ns, rank) AS short_work_event,
        first(op ORDER BY dur_ns, rank) AS short_op,
        first(exec_op ORDER BY dur_ns, rank) AS short_exec_op,
        first(in_width ORDER BY dur_ns, rank) AS short_in_width,
        first(group_size ORDER BY dur_ns, rank) AS short_group_size,
        first(payload_bytes ORDER BY dur_ns, rank) AS short_payload_bytes
    FROM matched_keyed
    GROUP BY pg, key_op, key
    HAVING count(DISTINCT rank) >= 2
);

-- Every call of a matched set, with what it waited: w = min(dur, last start − own start), at least 0.
CREATE OR REPLACE TEMP TABLE matched_calls AS
SELECT k.*, s.set_no, k.rank = s.last_rank AS is_last,
       k.ts_ns - s.first_ts_ns AS lateness_ns,
       greatest(0, least(k.dur_ns, s.last_ts_ns - k.ts_ns)) AS waiting_ns
FROM matched_keyed k JOIN matched_sets s USING (pg, key_op, key);

-- Per rank: how often it arrived last, its lateness (median; p90 = the sorted value at index ⌊0.9·n⌋), its
-- collective time and its waiting; and what its late arrivals cost the others: in the sets it reached last, the
-- others' waiting (wait_caused_ns: the straggler is the rank whose lateness costs the others most) and how late it
-- was (the set's spread, median).
CREATE OR REPLACE TEMP TABLE matched_ranks AS
WITH caused AS (
    SELECT s.last_rank AS rank, sum(c.others_ns) AS wait_caused_ns, median(s.spread_ns) AS median_late_when_last_ns
    FROM matched_sets s
    JOIN (SELECT set_no, coalesce(sum(waiting_ns) FILTER (WHERE NOT is_last), 0) AS others_ns
          FROM matched_calls GROUP BY set_no) c USING (set_no)
    GROUP BY s.last_rank
)
SELECT m.*, coalesce(caused.wait_caused_ns, 0) AS wait_caused_ns, caused.median_late_when_last_ns
FROM (
    SELECT rank,
           count(*) AS matched_calls,
           count(*) FILTER (WHERE is_last) AS arrived_last,
           median(lateness_ns) AS median_lateness_ns,
           list_sort(list(lateness_ns))[least(count(*), CAST(floor(CAST(0.9 AS DOUBLE) * count(*)) AS BIGINT) + 1)] AS p90_lateness_ns,
           sum(dur_ns) AS collective_ns,
           sum(waiting_ns) AS waiting_ns
    FROM matched_calls
    GROUP BY rank
) m LEFT JOIN caused USING (rank);
