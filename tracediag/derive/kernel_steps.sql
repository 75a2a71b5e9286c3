-- What ran inside each engine step, by catalog class/family/name, and how busy the GPU was.
--
-- Source per rank: GPU kernels (+ memcpy/memset) when the rank has kernels, else CPU ops (CPU-only
-- traces: the profiler saw no GPU). Rules and report sections label which one they used.
--   * GPU activity belongs to the step whose host range holds its launching runtime call (matched by
--     correlation id). Kernels replayed from a CUDA/HIP graph correlate to the cudaGraphLaunch /
--     hipGraphLaunch call, so they count in the step that launched the graph although no aten op is
--     their parent. Activity whose launch is not in the trace (or outside every step) gets step_id NULL.
--   * CPU ops: the outermost classified op per thread (aten::linear, not the aten::mm inside it; the
--     SDPA backend op, not the bmm/softmax inside the math backend). The SDPA dispatcher op itself is
--     skipped so that its backend child is what counts. Ops are placed by their start time.

CREATE OR REPLACE TEMP TABLE _launch AS
SELECT rank, correlation, min(ts_ns) AS ts_ns, arg_min(name, ts_ns) AS api, arg_min(dur_ns, ts_ns) AS api_dur_ns
FROM runtime WHERE correlation IS NOT NULL GROUP BY rank, correlation;

CREATE OR REPLACE TEMP TABLE _gpu_act AS
WITH act AS (
    SELECT k.rank, k.name, coalesce(k.klass, 'other') AS klass, k.family, k.ts_ns, k.dur_ns, k.correlation
    FROM kernels k
    UNION ALL
    SELECT m.rank, m.name, m.kind AS klass, 'runtime' AS family, m.ts_ns, m.dur_ns, m.correlation FROM memops m
)
SELECT a.*, l.ts_ns AS launch_ts_ns, l.api, l.api_dur_ns
FROM act a LEFT JOIN _launch l ON l.rank = a.rank AND l.correlation = a.correlation;

CREATE OR REPLACE TEMP TABLE _gpu_placed AS
SELECT a.*, CASE WHEN a.launch_ts_ns < s.ts_ns + s.dur_ns THEN s.step_id END AS step_id
FROM _gpu_act a ASOF LEFT JOIN steps s ON a.rank = s.rank AND a.launch_ts_ns >= s.ts_ns;

CREATE OR REPLACE TEMP TABLE _cpu_top AS
WITH c AS (
    SELECT rank, tid, name, klass, family, ts_ns, dur_ns FROM cpu_ops
    WHERE klass IS NOT NULL AND klass <> 'other' AND coalesce(family, '') <> 'sdpa'
      AND rank NOT IN (SELECT DISTINCT rank FROM kernels)
),
w AS (
    SELECT *, max(ts_ns + dur_ns) OVER (
        PARTITION BY rank, tid ORDER BY ts_ns, dur_ns DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
    ) AS enclosing_end
    FROM c
)
SELECT w.rank, w.tid, w.name, w.klass, w.family, w.ts_ns, w.dur_ns,
       CASE WHEN w.ts_ns < s.ts_ns + s.dur_ns THEN s.step_id END AS step_id
FROM w ASOF LEFT JOIN steps s ON w.rank = s.rank AND w.ts_ns >= s.ts_ns
WHERE w.enclosing_end IS NULL OR w.enclosing_end < w.ts_ns + w.dur_ns;

CREATE OR REPLACE TABLE kernel_steps AS
WITH rows AS (
    SELECT rank, step_id, 'gpu_kernel' AS source, klass, family, name, ts_ns, dur_ns,
           coalesce(api ILIKE '%GraphLaunch%', false) AS via_graph
    FROM _gpu_placed
    UNION ALL
    SELECT rank, step_id, 'cpu_op' AS source, klass, family, name, ts_ns, dur_ns, false FROM _cpu_top
)
SELECT r.rank,                                   -- global rank
       r.step_id,                                -- steps.step_id; NULL: launched outside every step / launch not in trace
       s.phase,                                  -- the step's phase (prefill / decode / mixed / NULL)
       r.source,                                 -- 'gpu_kernel' (kernels, memcpy, memset) or 'cpu_op' (CPU-only trace)
       r.klass,                                  -- catalog class (attention, attention_fallback, gemm, wo_gemm, dequant, ...)
       r.family,                                 -- catalog family (fa2, pytorch_flash, cublas, marlin, ...), NULL if unclassified
       r.name,                                   -- kernel / op name as written (untrusted text)
       count(*) AS calls,                        -- kernels (or outermost ops) of this name in the step
       sum(r.dur_ns) AS time_ns,                 -- their summed duration, ns (concurrent streams counted twice)
       min(r.ts_ns) AS first_ts_ns,              -- start of the first one, ns
       count(*) FILTER (WHERE r.via_graph) AS graph_calls -- of them, replayed from a CUDA/HIP graph
FROM rows r LEFT JOIN steps s ON s.rank = r.rank AND s.step_id = r.step_id
GROUP BY ALL;

-- Per step: time basis, GPU busy/idle, launch facts and time per class.
-- GPU time of a step is its window (steps.win_ts_ns .. win_end_ns, clipped so that windows never
-- overlap: windows.py); busy = union of all GPU activity inside it; host-blocking stalls inside the
-- window are measured once (host_stalls) and kept out of step_ns, the time phase statistics use, as is the idle
-- time that start-up work and the profiler's stop hold (windows.py: segments).
CREATE OR REPLACE TABLE step_activity AS
WITH g AS (
    SELECT rank, step_id, ts_ns, dur_ns, klass, api FROM _gpu_placed WHERE step_id IS NOT NULL
),
gpu AS (
    SELECT rank, step_id,
           count(*) FILTER (WHERE klass NOT IN ('memcpy', 'memset')) AS kernels,
           count(*) FILTER (WHERE dur_ns < 10000 AND klass NOT IN ('memcpy', 'memset')) AS short_kernels,
           count(DISTINCT api) FILTER (WHERE api ILIKE '%GraphLaunch%') > 0 AS graphs_used,
           count(*) FILTER (WHERE api ILIKE '%GraphLaunch%') AS graph_kernels
    FROM g GROUP BY rank, step_id
),
gaps AS (
    SELECT rank, step_id, count(*) FILTER (WHERE ts_ns - prev_end >= 10000) AS gaps_ge_10us FROM (
        SELECT rank, step_id, ts_ns, max(ts_ns + dur_ns) OVER (
            PARTITION BY rank, step_id ORDER BY ts_ns, dur_ns DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
        ) AS prev_end FROM g
    ) GROUP BY rank, step_id
),
launches AS (
    -- launch API calls made inside the step's host range (graph launches count once each)
    SELECT s.rank, s.step_id, count(*) AS launch_calls, sum(l.api_dur_ns) AS launch_api_ns,
           count(*) FILTER (WHERE l.api ILIKE '%GraphLaunch%') AS graph_launches
    FROM _launch l JOIN steps s ON s.rank = l.rank AND l.ts_ns >= s.ts_ns AND l.ts_ns < s.ts_ns + s.dur_ns
    WHERE l.correlation IN (SELECT correlation FROM _gpu_act a WHERE a.rank = l.rank)
    GROUP BY ALL
),
syncs AS (
    SELECT s.rank, s.step_id, count(*) AS sync_calls, sum(r.dur_ns) AS sync_ns
    FROM runtime r JOIN steps s ON s.rank = r.rank AND r.ts_ns >= s.ts_ns AND r.ts_ns < s.ts_ns + s.dur_ns
    -- blocking calls: cuda/hip*Synchronize, and the synchronous copies (cudaMemcpy, hipMemcpy,
    -- hipMemcpyWithStream: what a pageable host->device aten::copy_ becomes on ROCm)
    WHERE regexp_matches(r.name, '(Synchronize|^(cuda|hip)Memcpy(WithStream)?$|^cuMemcpy(HtoD|DtoH|DtoD)?(_v2)?$)')
    GROUP BY ALL
),
cls AS (
    SELECT rank, step_id, any_value(source) AS source,
           sum(time_ns) FILTER (WHERE klass = 'attention') AS attention_ns,
           sum(time_ns) FILTER (WHERE klass = 'attention_fallback') AS attention_fallback_ns,
           sum(time_ns) FILTER (WHERE klass = 'gemm') AS gemm_ns,
           sum(time_ns) FILTER (WHERE klass = 'wo_gemm') AS wo_gemm_ns,
           sum(time_ns) FILTER (WHERE klass = 'dequant') AS dequant_ns,
           sum(time_ns) FILTER (WHERE klass = 'collective') AS collective_ns,
           sum(time_ns) AS classified_or_all_ns
    FROM kernel_steps WHERE step_id IS NOT NULL GROUP BY rank, step_id
)
SELECT s.rank,                                                      -- global rank
       s.step_id,                                                   -- steps.step_id
       s.phase,                                                     -- prefill / decode / mixed / NULL
       s.T,                                                         -- tokens in the step (steps.T)
       coalesce(c.source, CASE WHEN s.rank IN (SELECT rank FROM kernels) THEN 'gpu_kernel' ELSE 'cpu_op' END)
           AS source,                                               -- 'gpu_kernel' or 'cpu_op'
       s.dur_ns AS host_dur_ns,                                     -- host duration of the step, ns
       coalesce(gpu.kernels, 0) AS kernels,                         -- GPU kernels launched in the step
       s.win_ts_ns AS gpu_ts_ns,                                    -- start of the step's GPU window, ns
       s.win_end_ns - s.win_ts_ns AS gpu_span_ns,                   -- GPU window (clipped: windows never overlap), ns
       s.win_busy_ns AS gpu_busy_ns,                                -- union of GPU activity in the window, ns
       CASE WHEN s.win_ts_ns IS NOT NULL
            THEN s.win_end_ns - s.win_ts_ns - s.win_busy_ns - coalesce(s.stall_ns, 0) - coalesce(s.startup_idle_ns, 0) END
           AS gpu_idle_ns,                                          -- GPU idle in the window outside stalls and start-up, ns
       coalesce(s.stall_ns, 0) AS stall_ns,                         -- GPU idle in the window during host-blocking stalls, ns
       coalesce(s.startup_idle_ns, 0) AS startup_idle_ns,           -- GPU idle in the window held by start-up work or the profiler stop, ns
       gaps.gaps_ge_10us,                                           -- idle gaps of at least 10 µs between the step's own GPU work
       s.idle_gap_ns AS max_gap_ns,                                 -- longest idle gap in the window outside stalls, ns
       s.idle_gap_start_ns AS max_gap_start_ns,                     -- where it starts, ns
       coalesce(s.queued_idle_ns, 0) AS queued_idle_ns,             -- of gpu_idle_ns, the time the GPU idled with work already launched (a device-side wait), ns
       gpu.short_kernels,                                           -- kernels shorter than 10 µs
       gpu.graphs_used,                                             -- some kernels were replayed from a graph
       gpu.graph_kernels,                                           -- kernels replayed from a graph
       la.launch_calls,                                             -- launch API calls in the step's host range
       la.launch_api_ns,                                            -- their summed host duration, ns
       la.graph_launches,                                           -- of them, graph launches
       sy.sync_calls,                                               -- blocking host calls (cuda/hip*Synchronize, synchronous memcpy)
       sy.sync_ns,                                                  -- their summed host duration, ns
       CASE WHEN s.win_ts_ns IS NOT NULL
            THEN s.win_end_ns - s.win_ts_ns - coalesce(s.stall_ns, 0) - coalesce(s.startup_idle_ns, 0) ELSE s.dur_ns END
           AS step_ns,                                              -- step time, ns: GPU window less stalls and start-up idle
       CASE WHEN s.win_ts_ns IS NOT NULL THEN s.win_end_ns - s.win_ts_ns - coalesce(s.startup_idle_ns, 0) ELSE s.dur_ns END
           AS step_ns_with_stalls,                                  -- the same with the host-blocking stalls, ns
       CASE WHEN s.win_ts_ns IS NOT NULL
            THEN 'GPU window of the step (first to last GPU work it launched, clipped at the next step), host-blocking stalls and start-up idle excluded'
            ELSE 'host duration of the step (no GPU kernels)' END AS time_basis,
       coalesce(c.attention_ns, 0) AS attention_ns,                 -- attention kernels/ops, ns
       coalesce(c.attention_fallback_ns, 0) AS attention_fallback_ns, -- math fallback (bmm + softmax), ns
       coalesce(c.gemm_ns, 0) AS gemm_ns,                           -- dense GEMMs, ns
       coalesce(c.wo_gemm_ns, 0) AS wo_gemm_ns,                     -- weight-only quantized GEMMs (W4A16...), ns
       coalesce(c.dequant_ns, 0) AS dequant_ns,                     -- separate dequantize kernels/ops, ns
       coalesce(c.collective_ns, 0) AS collective_ns                -- collectives, ns
FROM steps s
LEFT JOIN gpu USING (rank, step_id)
LEFT JOIN gaps USING (rank, step_id)
LEFT JOIN launches la USING (rank, step_id)
LEFT JOIN syncs sy USING (rank, step_id)
LEFT JOIN cls c USING (rank, step_id);

DROP TABLE IF EXISTS _launch; DROP TABLE IF EXISTS _gpu_act; DROP TABLE IF EXISTS _gpu_placed; DROP TABLE IF EXISTS _cpu_top;
