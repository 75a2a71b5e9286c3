-- One row per rank of a profiler trace: what its window holds and whether the rules can judge it
-- (tracediag/derive/fitness.py fills it after windows.py; the engine reads it before any rule).
CREATE OR REPLACE TABLE window_fitness (
    rank INTEGER,                    -- global rank
    format VARCHAR,                  -- input format of the rank's trace (kineto, nsys-sqlite)
    backend VARCHAR,                 -- distributed backend the trace names (nccl, gloo, ...), NULL if none
    events BIGINT,                   -- recorded events: kernels, copies/memsets, runtime calls, CPU ops, annotations
    gpu_events BIGINT,               -- kernels and copies/memsets
    kernels BIGINT,                  -- GPU kernels
    runtime_calls BIGINT,            -- runtime/driver API calls
    cpu_ops BIGINT,                  -- CPU ops
    trace_ns BIGINT,                 -- trace span (first to last event), ns
    startup_ns BIGINT,               -- start-up segment: from the trace start to its end (windows.py), ns
    steady_ns BIGINT,                -- steady segment: end of start-up to the end of the last GPU activity, ns
    stop_ns BIGINT,                  -- profiler-stop segment: end of the last GPU activity to the trace end, ns
    steady_kernels BIGINT,           -- kernels that start in the steady segment
    correlation_gap_median DOUBLE,   -- median step between consecutive correlation ids of runtime calls (NULL: < 20 calls)
    correlation_gap_p90 DOUBLE,      -- its 90th percentile
    external_id_gap_median DOUBLE,   -- median step between consecutive external ids of CPU ops (NULL: < 20 ops)
    external_id_gap_p90 DOUBLE,      -- its 90th percentile
    launched_before_window BIGINT,   -- GPU operations whose launch is older than every launch in the trace
    launches_after_window BIGINT,    -- launches newer than every GPU operation in the trace, their work not in it
    graph_captures BIGINT,           -- CUDA/HIP stream captures (a begin call and the next end call on its thread)
    graph_capture_ns BIGINT,         -- ns of the steady segment the captures cover (their union)
    fitness_class VARCHAR,           -- too_short, gpu_stripped, sampled, startup_only, startup_dominated, graph_capture,
                                     -- clipped, steady, cpu_only
    why VARCHAR                      -- the class in words, with the numbers it rests on
);
