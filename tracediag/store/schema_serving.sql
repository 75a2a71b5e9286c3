-- Serving telemetry: vLLM and SGLang /metrics scrapes (ingest/prometheus.py), engine/server logs
-- (ingest/vllm_log/, ingest/sglang_log.py) and benchmark results (`vllm bench serve`: ingest/vllm_bench.py,
-- `python -m sglang.bench_serving`: ingest/sglang_bench.py). One comment per column with its unit.
-- input_id joins inputs.input_id. vLLM log times carry no year: t_s is seconds since the first timestamped record
-- of the same file, ts_text the time as the file wrote it. `run` numbers the server runs of one log (0-based): a
-- startup banner after activity, a new pid of a process, or the clock going back > 5 min starts the next.

CREATE TABLE metric_samples (
    input_id INTEGER,              -- inputs.input_id of the file
    scrape INTEGER,                -- ordinal of the scrape in the file (0-based); one exposition = one scrape
    ts_ns BIGINT,                  -- scrape time, ns since the Unix epoch (sample timestamp, else the scrape marker); NULL when the file has none
    t_s DOUBLE,                    -- seconds since the first timestamped scrape of the file; NULL when untimed
    line INTEGER,                  -- 1-based line of the sample in the file
    name VARCHAR,                  -- sample name as exposed, e.g. 'vllm:request_queue_time_seconds_bucket'
    family VARCHAR,                -- metric name without _total/_bucket/_sum/_count/_created
    canonical VARCHAR,             -- name across vLLM versions: 'kv_usage', 'requests_waiting', 'itl_seconds', ...; NULL for other metrics
    name_rank SMALLINT,            -- 0 = current vLLM name, 1 = deprecated alias of the same canonical metric
    preferred BOOLEAN,             -- the sample to use when several names of one canonical metric appear in one scrape
    type VARCHAR,                  -- counter / gauge / histogram / summary / untyped (from # TYPE, else inferred from the name)
    part VARCHAR,                  -- 'value', 'bucket', 'sum', 'count', 'created', 'quantile'
    le DOUBLE,                     -- histogram bucket upper bound, in the metric's unit (+Inf as infinity); NULL otherwise
    quantile DOUBLE,               -- summary quantile (0-1); NULL otherwise
    model_name VARCHAR,            -- label model_name
    engine VARCHAR,                -- label engine (data-parallel engine index); NULL on versions without it
    labels_json VARCHAR,           -- all labels, JSON object
    value DOUBLE                   -- sample value in the metric's unit: seconds (*_seconds), tokens, requests, fraction 0-1 (*_perc), count; Unix seconds for 'created'
);

CREATE TABLE serving_stats (
    input_id INTEGER,              -- inputs.input_id of the log
    run INTEGER,                   -- server run within the log (0-based)
    line INTEGER,                  -- 1-based line of the record in the file
    ts_text VARCHAR,               -- record time as written ('07-06 09:39:40'; vLLM logs carry no year)
    t_s DOUBLE,                    -- seconds since the first timestamped record of the file
    process VARCHAR,               -- process prefix ('APIServer', 'EngineCore_0', ...); NULL when absent
    pid INTEGER,                   -- process id from the prefix; NULL when absent
    engine INTEGER,                -- 'Engine NNN' index (data-parallel engine); -1 for 'N Engines Aggregated'; NULL on V0 lines
    log_format VARCHAR,            -- 'v0-2023' (scheduler.py Throughput), 'v0' (Running/Swapped/Pending), 'v1' (Engine NNN: ... Waiting), 'sglang-prefill', 'sglang-decode'
    tput_tok_s DOUBLE,             -- 2023 scheduler.py 'Throughput': prompt and generation tokens together, tokens/s
    prompt_tput_tok_s DOUBLE,      -- Avg prompt throughput over the logging interval, tokens/s
    gen_tput_tok_s DOUBLE,         -- Avg generation throughput over the logging interval, tokens/s
    running INTEGER,               -- requests running, count (SGLang #running-req)
    waiting INTEGER,               -- requests waiting (V1 Waiting, V0 Pending, SGLang #queue-req), count
    swapped INTEGER,               -- V0 Swapped requests, count
    deferred INTEGER,              -- V1 Deferred requests (also counted in Waiting), count
    preemptions INTEGER,           -- V1 Preemptions during the interval, count (printed only when > 0: NULL when absent)
    kv_usage_pct DOUBLE,           -- GPU KV cache usage, percent (SGLang token usage × 100; hybrid models: the full-attention pool)
    cpu_kv_usage_pct DOUBLE,       -- V0 CPU (swap) KV cache usage, percent
    prefix_hit_pct DOUBLE,         -- prefix cache hit rate (tokens, recent requests), percent
    external_prefix_hit_pct DOUBLE, -- KV-connector (external) prefix cache hit rate, percent
    mm_hit_pct DOUBLE,             -- multi-modal cache hit rate, percent
    extra_json VARCHAR             -- other 'Name: value' fields of the line, JSON object
);

CREATE TABLE serving_events (
    input_id INTEGER,              -- inputs.input_id of the log
    run INTEGER,                   -- server run within the log (0-based)
    line INTEGER,                  -- 1-based line of the record
    ts_text VARCHAR,               -- record time as written
    t_s DOUBLE,                    -- seconds since the first timestamped record of the file
    process VARCHAR,               -- process prefix, NULL when absent
    pid INTEGER,                   -- process id, NULL when absent
    kind VARCHAR,                  -- 'preemption' (V0 warning), 'retraction' (SGLang), 'shm_broadcast_wait', 'startup', 'ready', 'shutdown', 'health_check', 'request_finished', 'access', or a failure kind of tracediag/catalog/engine_failures.json ('device_error', 'fatal_signal', 'cpp_abort', 'oom', 'collective_timeout', 'engine_dead', 'worker_died', 'scheduler_exception', 'watchdog_timeout', 'health_check_failed', 'soft_watchdog', 'cascade')
    seq_group VARCHAR,             -- preempted sequence group id
    mode VARCHAR,                  -- preemption mode: SWAP or RECOMPUTE
    cumulative BIGINT,             -- total_num_cumulative_preemption at this record, count (SGLang: #retracted_reqs); NULL on versions without it
    http_status INTEGER,           -- access lines: HTTP status
    own_time BOOLEAN,              -- the line has its own timestamp (false: access and PyTorch lines take the previous record's)
    text VARCHAR,                  -- the message (at most 500 characters)
    pattern VARCHAR                -- failures: the id of the tracediag/catalog/engine_failures.json pattern it matched
);

CREATE TABLE serving_startup (
    input_id INTEGER,              -- inputs.input_id of the log
    run INTEGER,                   -- server run within the log (0-based)
    line INTEGER,                  -- 1-based line of the record
    process VARCHAR,               -- process prefix, NULL when absent
    pid INTEGER,                   -- process id, NULL when absent
    key VARCHAR,                   -- fact: vllm_version, tensor_parallel_size, kv_cache_tokens, kv_cache_memory_gib, ...
    value VARCHAR,                 -- value as written
    value_num DOUBLE,              -- numeric value when the fact is a number (unit in `unit`)
    unit VARCHAR,                  -- 'tokens', 'blocks', 'GiB', 'x' (concurrency multiple), NULL for plain values
    text VARCHAR                   -- the message the fact came from
);

CREATE TABLE spec_decode (
    input_id INTEGER,              -- inputs.input_id of the log
    run INTEGER,                   -- server run within the log (0-based)
    line INTEGER,                  -- 1-based line of the record
    ts_text VARCHAR,               -- record time as written
    t_s DOUBLE,                    -- seconds since the first timestamped record of the file
    process VARCHAR,               -- process prefix, NULL when absent
    pid INTEGER,                   -- process id, NULL when absent
    engine INTEGER,                -- engine of the stats line the record follows (same process); NULL if unknown
    log_format VARCHAR,            -- 'v0' (Speculative metrics, cumulative), 'v1' (SpecDecoding metrics, per interval)
    cumulative BOOLEAN,            -- counts are totals since start (V0) rather than per logging interval (V1)
    num_spec_tokens INTEGER,       -- k, draft tokens proposed per round (V0 field; V1: number of per-position rates)
    num_drafts DOUBLE,             -- rounds: draft_tokens / k (exact when every draft proposes k tokens)
    draft_tokens BIGINT,           -- drafted tokens, count
    accepted_tokens BIGINT,        -- accepted draft tokens, count
    emitted_tokens BIGINT,         -- V0 emitted tokens (accepted + bonus/correction), count
    acceptance_rate DOUBLE,        -- accepted / drafted, fraction 0-1
    system_efficiency DOUBLE,      -- V0 emitted / (rounds x (k+1)), fraction 0-1
    mean_acceptance_length DOUBLE, -- V1 tokens per round incl. the bonus token (= 1 + accepted / rounds)
    accepted_tput_tok_s DOUBLE,    -- V1 accepted throughput, tokens/s
    drafted_tput_tok_s DOUBLE,     -- V1 drafted throughput, tokens/s
    per_position DOUBLE[],         -- V1 per-position acceptance rate: rounds whose first i drafts were all accepted / rounds
    text VARCHAR                   -- the message
);

CREATE TABLE bench_runs (
    input_id INTEGER,              -- inputs.input_id of the result file
    run INTEGER,                   -- ordinal of the run in the file (0-based; --append-result files hold several)
    source VARCHAR,                -- 'result json, summary only', 'result json with per-request detail', 'result table (stdout), summary only'
    date VARCHAR,                  -- result 'date' (YYYYMMDD-HHMMSS, client local time, when saved)
    backend VARCHAR,               -- backend / endpoint type
    model_id VARCHAR,              -- model id
    tag VARCHAR,                   -- label or --metadata tag
    dataset_name VARCHAR,          -- --dataset-name when known (stdout Namespace line)
    num_prompts INTEGER,           -- requests planned, count
    request_rate_rps DOUBLE,       -- --request-rate, requests/s (infinity = all sent at t=0)
    burstiness DOUBLE,             -- --burstiness (1 = Poisson)
    max_concurrency INTEGER,       -- --max-concurrency, requests; NULL = no cap
    duration_s DOUBLE,             -- benchmark duration, s
    completed INTEGER,             -- successful requests, count
    failed INTEGER,                -- failed requests, count (NULL when the result does not say)
    total_input_tokens BIGINT,     -- tokens
    total_output_tokens BIGINT,    -- tokens
    request_throughput_rps DOUBLE, -- completed / duration, requests/s
    request_goodput_rps DOUBLE,    -- vLLM --goodput result, requests/s (NULL when not requested)
    output_tput_tok_s DOUBLE,      -- output tokens/s
    total_tput_tok_s DOUBLE,       -- (input + output) tokens/s
    max_output_tput_tok_s DOUBLE,  -- peak output tokens in one second, tokens/s
    max_concurrent_requests INTEGER, -- peak requests in flight in one second, count
    has_requests BOOLEAN,          -- per-request arrays present (--save-detailed)
    goodput_json VARCHAR,          -- --goodput SLOs when known, JSON {metric: ms}
    meta_json VARCHAR              -- other keys of the result, JSON
);

CREATE TABLE bench_latency (
    input_id INTEGER,              -- inputs.input_id of the result file
    run INTEGER,                   -- bench_runs.run
    metric VARCHAR,                -- 'ttft', 'tpot', 'itl', 'e2el'
    stat VARCHAR,                  -- 'mean', 'median', 'std', 'p99', ... as written
    percentile DOUBLE,             -- percentile of a pNN stat (vLLM: numpy linear interpolation); NULL for mean/std
    value_ms DOUBLE                -- value, ms
);

CREATE TABLE bench_requests (
    input_id INTEGER,              -- inputs.input_id of the result file
    run INTEGER,                   -- bench_runs.run
    req INTEGER,                   -- index of the request in the result arrays
    input_len INTEGER,             -- prompt tokens
    output_len INTEGER,            -- output tokens (0 for failed requests)
    success BOOLEAN,               -- no error recorded
    error VARCHAR,                 -- error text ('' / NULL when none)
    start_s DOUBLE,                -- send time, s on the client's clock (NULL when the result has no start_times)
    ttft_s DOUBLE,                 -- time to first token, s
    e2el_s DOUBLE,                 -- end-to-end latency, s
    e2el_source VARCHAR,           -- 'e2els'/'latencies' array, or 'ttft+sum(itl)' (ends at the last token chunk)
    tpot_s DOUBLE,                 -- (e2el - ttft) / (output_len - 1), s; NULL when output_len <= 1 or failed
    itl_count INTEGER,             -- inter-token gaps recorded, count
    itl_max_s DOUBLE,              -- largest inter-token gap (max stall), s
    itl_mean_s DOUBLE,             -- mean inter-token gap, s
    itls_s DOUBLE[]                -- the gaps, s (streamed chunk intervals as vLLM records them)
);
