-- requires: kernels, cpu_ops, runtime, kernels.klass, cpu_ops.klass, memops, inputs, step_markers
-- provides: steps
--
-- steps: one row per engine step per rank (see step_markers.py for the markers and their precedence).
-- T is the number of tokens the step scheduled: from the engine's annotation when it carries token
-- counts (step_grammar.py says what each number means), else filled in step_shapes.sql from GEMM
-- activation shapes (t_source says which).
--
-- Forward passes (for engines without a per-step annotation, e.g. Hugging Face generate()):
-- a forward pass starts at an `aten::embedding` op (the token-embedding lookup) when attention or
-- GEMM work ran on that thread since the previous embedding (so GPT-2's wte + wpe pair is one start).
--   * A ProfilerStep (or the whole-trace fallback) holding >= 2 forward starts is split into one step
--     per forward pass: the first piece starts at the marker, the others at their embedding op.
--   * Forward starts outside every chosen marker on a rank that has markers (e.g. decode forwards
--     after an annotated prefill) become steps of their own, ending at the next forward start, the
--     next marker, or the thread's last op.
CREATE OR REPLACE TEMP TABLE _chosen_steps AS
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
)
SELECT rank, name, ts_ns, dur_ns, tid, marker_source, marker_form, ctx_reqs, ctx_tokens, gen_reqs, gen_tokens,
       marker_T, marker_phase, ctx_kv_tokens, gen_kv_tokens, engine_mode, marker_extra, fwd_name, fwd_ts_ns, fwd_dur_ns
FROM chosen
UNION ALL
SELECT rank, name, ts_ns, dur_ns, tid, marker_source, 'whole_trace', ctx_reqs, ctx_tokens, gen_reqs, gen_tokens,
       NULL::BIGINT, NULL, NULL::BIGINT, NULL::BIGINT, NULL, NULL, NULL, NULL::BIGINT, NULL::BIGINT
FROM fallback;

CREATE OR REPLACE TEMP TABLE _fwd_starts AS
WITH ev AS (
    SELECT rank, tid, ts_ns, 1 AS is_emb FROM cpu_ops WHERE name = 'aten::embedding'
    UNION ALL
    SELECT rank, tid, ts_ns, 0 AS is_emb FROM cpu_ops
    WHERE klass IN ('attention', 'attention_fallback', 'gemm', 'wo_gemm')
),
counted AS (
    SELECT *, sum(1 - is_emb) OVER (PARTITION BY rank, tid ORDER BY ts_ns, is_emb ROWS UNBOUNDED PRECEDING) AS work_before
    FROM ev
),
emb AS (
    SELECT rank, tid, ts_ns, work_before,
           lag(work_before) OVER (PARTITION BY rank, tid ORDER BY ts_ns) AS prev_work
    FROM counted WHERE is_emb = 1
)
SELECT rank, tid, ts_ns FROM emb WHERE prev_work IS NULL OR work_before > prev_work;

CREATE OR REPLACE TEMP TABLE _split_steps AS
WITH pieces AS (
    SELECT c.rank, c.name, c.ts_ns AS step_ts, c.dur_ns AS step_dur, c.tid, c.marker_source, f.ts_ns AS fwd_ts,
           row_number() OVER w AS k, count(*) OVER (PARTITION BY c.rank, c.ts_ns) AS n,
           lead(f.ts_ns) OVER w AS next_ts
    FROM _chosen_steps c
    JOIN _fwd_starts f ON f.rank = c.rank AND (c.tid IS NULL OR f.tid = c.tid)
        AND f.ts_ns >= c.ts_ns AND f.ts_ns < c.ts_ns + c.dur_ns
    WHERE c.marker_source IN ('ProfilerStep', 'whole trace (no step markers)')
    WINDOW w AS (PARTITION BY c.rank, c.ts_ns ORDER BY f.ts_ns)
)
SELECT rank, step_ts, name || ' forward ' || k || '/' || n AS name,
       CASE WHEN k = 1 THEN step_ts ELSE fwd_ts END AS ts_ns,
       coalesce(next_ts, step_ts + step_dur) - CASE WHEN k = 1 THEN step_ts ELSE fwd_ts END AS dur_ns,
       tid, marker_source || ', split per forward pass (aten::embedding)' AS marker_source
FROM pieces WHERE n >= 2;

CREATE OR REPLACE TEMP TABLE _uncovered_steps AS
WITH marked AS (
    SELECT DISTINCT rank FROM _chosen_steps WHERE marker_source <> 'whole trace (no step markers)'
),
loose AS (
    SELECT f.* FROM _fwd_starts f JOIN marked USING (rank)
    WHERE NOT EXISTS (
        SELECT 1 FROM _chosen_steps c WHERE c.rank = f.rank AND f.ts_ns >= c.ts_ns AND f.ts_ns < c.ts_ns + c.dur_ns
    )
),
bounds AS (
    SELECT l.rank, l.tid, l.ts_ns,
        (SELECT min(f2.ts_ns) FROM _fwd_starts f2 WHERE f2.rank = l.rank AND f2.tid = l.tid AND f2.ts_ns > l.ts_ns) AS next_fwd,
        (SELECT min(c.ts_ns) FROM _chosen_steps c WHERE c.rank = l.rank AND c.ts_ns > l.ts_ns) AS next_marker,
        (SELECT max(o.ts_ns + o.dur_ns) FROM cpu_ops o WHERE o.rank = l.rank AND o.tid = l.tid) AS thread_end
    FROM loose l
)
SELECT rank, 'forward pass (no marker)' AS name, ts_ns,
       least(coalesce(next_fwd, thread_end), coalesce(next_marker, thread_end), thread_end) - ts_ns AS dur_ns,
       tid, 'forward pass outside every marker (aten::embedding)' AS marker_source
FROM bounds;

CREATE OR REPLACE TABLE steps AS
WITH all_steps AS (
    SELECT c.* FROM _chosen_steps c
    WHERE NOT EXISTS (SELECT 1 FROM _split_steps s WHERE s.rank = c.rank AND s.step_ts = c.ts_ns)
    UNION ALL BY NAME
    SELECT rank, name, ts_ns, dur_ns, tid, marker_source, 'forward_split' AS marker_form FROM _split_steps
    UNION ALL BY NAME
    SELECT rank, name, ts_ns, dur_ns, tid, marker_source, 'forward_uncovered' AS marker_form FROM _uncovered_steps
)
SELECT
    rank,                                                             -- global rank
    (row_number() OVER (PARTITION BY rank ORDER BY ts_ns))::INTEGER - 1 AS step_id, -- per-rank ordinal
    name,                                                             -- marker name as written
    marker_source,                                                    -- which marker defined the step
    marker_form,                                                      -- the grammar form (step_grammar.py) or how it was made
    ts_ns,                                                            -- host start of the step, ns
    dur_ns,                                                           -- host duration of the step, ns
    ctx_reqs, ctx_tokens, gen_reqs, gen_tokens,                       -- from the engine annotation (NULL if absent)
    ctx_kv_tokens, gen_kv_tokens,                                     -- Σ KV length per phase (detailed annotations), tokens
    engine_mode,                                                      -- SGLang ForwardMode of the step (EXTEND, DECODE, ...)
    marker_extra,                                                     -- numbers in the annotation that are not interpreted
    fwd_name, fwd_ts_ns, fwd_dur_ns,                                  -- nested forward span (SGLang step[...]) and its host range
    marker_T AS T,                                                    -- tokens in the step
    CASE WHEN marker_T IS NOT NULL THEN 'annotation' END AS t_source, -- where T came from: 'annotation' (vLLM step annotation) or 'GEMM activation rows (mode)'
    marker_phase AS phase,                                            -- prefill / decode / mixed / NULL
    CASE WHEN marker_phase IS NOT NULL THEN 'annotation' END AS phase_source, -- where the phase came from: 'annotation', 'attention query length' or 'inferred from kernels' (derive/kernel_phase.py)
    NULL::BIGINT AS gpu_ts_ns,                                        -- first kernel start of the step, ns
    NULL::BIGINT AS gpu_end_ns,                                       -- last kernel end of the step, ns
    NULL::BIGINT AS kernel_count,                                     -- kernels launched inside the step
    NULL::BIGINT AS kernel_busy_ns,                                   -- summed kernel time (overlaps counted twice)
    NULL::BIGINT AS win_ts_ns,                                        -- GPU window: first kernel start, ns (windows.py)
    NULL::BIGINT AS win_end_ns,                                       -- GPU window end, clipped at the next window's start, ns
    NULL::BIGINT AS win_busy_ns,                                      -- union of GPU activity inside the window, ns
    NULL::BIGINT AS stall_ns,                                         -- GPU idle inside the window during host-blocking stalls, ns
    NULL::BIGINT AS startup_idle_ns,                                  -- GPU idle inside the window held by start-up work or the profiler stop, ns
    NULL::BIGINT AS idle_gap_ns,                                      -- longest GPU idle gap in the window outside stalls, ns
    NULL::BIGINT AS idle_gap_start_ns,                                -- where it starts, ns
    NULL::BIGINT AS queued_idle_ns                                    -- of the window's idle outside stalls, the time with work already launched (windows.py), ns
FROM all_steps;

DROP TABLE IF EXISTS _chosen_steps; DROP TABLE IF EXISTS _fwd_starts; DROP TABLE IF EXISTS _split_steps;
DROP TABLE IF EXISTS _uncovered_steps;

-- GPU work launched inside each step: runtime call in the step's host range -> kernel (or copy/memset) by
-- correlation. CUDA/HIP-graph replays are included (their kernels correlate to cudaGraphLaunch).
UPDATE steps SET gpu_ts_ns = g.g0, gpu_end_ns = g.g1, kernel_count = g.n, kernel_busy_ns = g.busy
FROM (
    SELECT s.rank, s.step_id, min(k.ts_ns) AS g0, max(k.ts_ns + k.dur_ns) AS g1,
           count(*) FILTER (WHERE k.is_kernel) AS n, sum(k.dur_ns) FILTER (WHERE k.is_kernel) AS busy
    FROM steps s
    JOIN runtime r ON r.rank = s.rank AND r.ts_ns >= s.ts_ns AND r.ts_ns < s.ts_ns + s.dur_ns
    JOIN (SELECT rank, correlation, ts_ns, dur_ns, TRUE AS is_kernel FROM kernels
          UNION ALL SELECT rank, correlation, ts_ns, dur_ns, FALSE FROM memops) k
      ON k.rank = r.rank AND k.correlation = r.correlation
    GROUP BY s.rank, s.step_id
) g
WHERE steps.rank = g.rank AND steps.step_id = g.step_id;
