-- Candidate engine-step markers per rank, one row per marker range, best source first.
-- Precedence (lower `precedence` wins per rank): vLLM per-step annotations, ProfilerStep#N,
-- vLLM `execute_model` frames, then the whole-trace fallback added in Python.
CREATE OR REPLACE TEMP TABLE step_markers AS
WITH ann AS (
    SELECT rank, name, ts_ns, dur_ns, tid, source FROM annotations WHERE source <> 'gpu_user_annotation'
    UNION ALL
    -- record_function ranges are cpu_op events in some exporters (e.g. ProfilerStep#N in older traces)
    SELECT rank, name, ts_ns, dur_ns, tid, 'cpu_op' FROM cpu_ops
    WHERE name LIKE 'ProfilerStep#%' OR name LIKE 'execute\_%' ESCAPE '\'
)
SELECT rank, name, ts_ns, dur_ns, tid,
    CASE
        WHEN regexp_matches(name, '^execute_context_\d+\(\d+\)_generation_\d+\(\d+\)$') THEN 1
        WHEN regexp_matches(name, '^execute_\d+_context_\d+\(sq\d+sk\d+[^)]*\)_generation_\d+\(sq\d+sk\d+[^)]*\)$') THEN 1
        WHEN regexp_matches(name, '^execute_new_\d+_cached_\d+$') THEN 1
        WHEN regexp_matches(name, '^ProfilerStep#\d+$') THEN 2
        WHEN source = 'python_function' THEN 3
    END AS precedence,
    CASE
        WHEN regexp_matches(name, '^execute_') THEN 'vllm step annotation'
        WHEN regexp_matches(name, '^ProfilerStep#') THEN 'ProfilerStep'
        ELSE 'execute_model frame'
    END AS marker_source,
    -- upstream vLLM: execute_context_{ctx_reqs}({ctx_tokens})_generation_{gen_reqs}({gen_tokens})
    -- (vllm/v1/worker/gpu_worker.py annotate_profile, vllm/v1/utils.py compute_iteration_details);
    -- ROCm fork seen in real MI300X traces: execute_{T}_context_{n}(sq{q}sk{k}..)_generation_{m}(sq{q}sk{k}..)
    coalesce(
        try_cast(regexp_extract(name, '^execute_context_(\d+)\(', 1) AS INTEGER),
        try_cast(regexp_extract(name, '^execute_\d+_context_(\d+)\(', 1) AS INTEGER),
        try_cast(regexp_extract(name, '^execute_new_(\d+)_', 1) AS INTEGER)
    ) AS ctx_reqs,
    coalesce(
        try_cast(regexp_extract(name, '^execute_context_\d+\((\d+)\)', 1) AS INTEGER),
        try_cast(regexp_extract(name, '^execute_\d+_context_\d+\(sq(\d+)', 1) AS INTEGER)
    ) AS ctx_tokens,
    coalesce(
        try_cast(regexp_extract(name, '_generation_(\d+)\(', 1) AS INTEGER),
        try_cast(regexp_extract(name, '_cached_(\d+)$', 1) AS INTEGER)
    ) AS gen_reqs,
    coalesce(
        try_cast(regexp_extract(name, '_generation_\d+\((\d+)\)$', 1) AS INTEGER),
        try_cast(regexp_extract(name, '_generation_\d+\(sq(\d+)', 1) AS INTEGER)
    ) AS gen_tokens
FROM ann
WHERE regexp_matches(name, '^(execute_|ProfilerStep#)') OR source = 'python_function';
