-- steps: one row per engine step per rank (see step_markers.sql for the marker precedence).
-- T is the number of tokens the step scheduled: from the vLLM annotation when it carries token
-- counts, else filled in Python from GEMM activation shapes (t_source says which).
CREATE OR REPLACE TABLE steps AS
WITH best AS (
    SELECT rank, min(precedence) AS precedence FROM step_markers WHERE precedence IS NOT NULL GROUP BY rank
),
chosen AS (
    SELECT m.* FROM step_markers m JOIN best b USING (rank, precedence)
),
fallback AS (
    -- No marker on this rank: the whole trace is one step (documented fallback; T from shapes).
    SELECT i.rank, 'whole trace' AS name, i.trace_start_ns AS ts_ns,
           i.trace_end_ns - i.trace_start_ns AS dur_ns, NULL AS tid, 9 AS precedence,
           'whole trace (no step markers)' AS marker_source,
           NULL::INTEGER AS ctx_reqs, NULL::INTEGER AS ctx_tokens, NULL::INTEGER AS gen_reqs, NULL::INTEGER AS gen_tokens
    FROM inputs i
    WHERE i.rank IS NOT NULL AND i.trace_start_ns IS NOT NULL AND i.rank NOT IN (SELECT rank FROM best)
),
all_steps AS (
    SELECT rank, name, ts_ns, dur_ns, tid, marker_source, ctx_reqs, ctx_tokens, gen_reqs, gen_tokens FROM chosen
    UNION ALL
    SELECT rank, name, ts_ns, dur_ns, tid, marker_source, ctx_reqs, ctx_tokens, gen_reqs, gen_tokens FROM fallback
)
SELECT
    rank,                                                             -- global rank
    (row_number() OVER (PARTITION BY rank ORDER BY ts_ns))::INTEGER - 1 AS step_id, -- per-rank ordinal
    name,                                                             -- marker name as written
    marker_source,                                                    -- which marker defined the step
    ts_ns,                                                            -- host start of the step, ns
    dur_ns,                                                           -- host duration of the step, ns
    ctx_reqs, ctx_tokens, gen_reqs, gen_tokens,                       -- from the vLLM annotation (NULL if absent)
    CASE WHEN ctx_tokens IS NOT NULL OR gen_tokens IS NOT NULL
         THEN coalesce(ctx_tokens, 0) + coalesce(gen_tokens, 0) END AS T, -- tokens in the step
    CASE WHEN ctx_tokens IS NOT NULL OR gen_tokens IS NOT NULL THEN 'annotation' END AS t_source,
    CASE
        WHEN ctx_reqs > 0 AND gen_reqs > 0 THEN 'mixed'
        WHEN ctx_reqs > 0 THEN 'prefill'
        WHEN ctx_reqs = 0 AND gen_reqs > 0 THEN 'decode'
    END AS phase,                                                     -- prefill / decode / mixed / NULL
    CASE WHEN ctx_reqs IS NOT NULL THEN 'annotation' END AS phase_source,
    NULL::BIGINT AS gpu_ts_ns,                                        -- first kernel start of the step, ns
    NULL::BIGINT AS gpu_end_ns,                                       -- last kernel end of the step, ns
    NULL::BIGINT AS kernel_count,                                     -- kernels launched inside the step
    NULL::BIGINT AS kernel_busy_ns                                    -- summed kernel time (overlaps counted twice)
FROM all_steps;

-- Kernels launched inside each step: runtime call in the step's host range -> kernel by correlation.
-- CUDA-graph replays are included (their kernels correlate to cudaGraphLaunch).
UPDATE steps SET gpu_ts_ns = g.g0, gpu_end_ns = g.g1, kernel_count = g.n, kernel_busy_ns = g.busy
FROM (
    SELECT s.rank, s.step_id, min(k.ts_ns) AS g0, max(k.ts_ns + k.dur_ns) AS g1, count(*) AS n, sum(k.dur_ns) AS busy
    FROM steps s
    JOIN runtime r ON r.rank = s.rank AND r.ts_ns >= s.ts_ns AND r.ts_ns < s.ts_ns + s.dur_ns
    JOIN kernels k ON k.rank = r.rank AND k.correlation = r.correlation
    GROUP BY s.rank, s.step_id
) g
WHERE steps.rank = g.rank AND steps.step_id = g.step_id;
