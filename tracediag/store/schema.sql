-- tracediag canonical schema: `inputs` (one row per file, or per rank of a file, from every ingester) and the
-- profiler-trace tables the Kineto JSON and Nsight Systems ingesters write (serving telemetry, nccl-tests,
-- topology and Nsight-only detail are in the other schema_*.sql files); rules read only these tables and the
-- derived views, never the source format.
-- Units are in column names: *_ns = integer nanoseconds on the profiler's clock, *_bytes = bytes.
-- `rank` is the global rank of the process that wrote the input file.

CREATE TABLE inputs (
    input_id INTEGER,              -- ordinal of the input file in this analysis (0-based); one row per rank it holds
    path VARCHAR,                  -- the path as the user gave it
    format VARCHAR,                -- input format: 'kineto', 'nsys-sqlite', 'prometheus', 'vllm-log', ...
    profiler VARCHAR,              -- what wrote it: 'pytorch-profiler (kineto)', 'nsys 2026.2.1', ...
    file_bytes BIGINT,             -- size of the file on disk, bytes
    rank INTEGER,                  -- global rank of this input's process (NULL for telemetry inputs)
    rank_source VARCHAR,           -- where rank came from: 'distributedInfo', 'file name', 'input order'
    world_size INTEGER,            -- distributedInfo.world_size (NULL when absent)
    backend VARCHAR,               -- distributedInfo.backend ('nccl', 'gloo', ...)
    nccl_version VARCHAR,          -- distributedInfo.nccl_version
    device_name VARCHAR,           -- deviceProperties[device].name of the GPU this rank used
    device_total_mem_bytes BIGINT, -- deviceProperties[device].totalGlobalMem, bytes
    device_num_sms INTEGER,        -- deviceProperties[device].numSms
    device_compute_capability VARCHAR, -- 'major.minor'
    trace_start_ns BIGINT,         -- first event start, ns
    trace_end_ns BIGINT,           -- last event end, ns
    events_total BIGINT,           -- traceEvents entries in the file
    events_python_skipped BIGINT,  -- python_function events not stored (kept only with --keep-python)
    bad_records BIGINT,            -- records (events, rows, lines) with an out-of-range, wrongly typed or undecodable value: dropped, or the value set to NULL (meta_json.bad_records: per field)
    distributed_info_json VARCHAR, -- distributedInfo verbatim, JSON
    device_properties_json VARCHAR, -- deviceProperties verbatim, JSON
    meta_json VARCHAR              -- format-specific facts of the input (versions, capture settings), JSON
);

CREATE TABLE process_groups (
    rank INTEGER,                  -- rank whose trace listed the group
    pg_name VARCHAR,               -- distributedInfo.pg_config[].pg_name
    pg_desc VARCHAR,               -- pg_config[].pg_desc ('default_pg', user description, 'undefined')
    backend_config VARCHAR,        -- pg_config[].backend_config ('cuda:nccl', 'cpu:gloo,cuda:gloo')
    pg_size INTEGER,               -- number of ranks in the group
    ranks INTEGER[]                -- global ranks of the group (may be truncated by the profiler)
);

CREATE TABLE kernels (
    rank INTEGER,                  -- global rank
    name VARCHAR,                  -- demangled kernel name as the profiler wrote it (untrusted text)
    ts_ns BIGINT,                  -- GPU start, ns
    dur_ns BIGINT,                 -- GPU duration, ns (never negative)
    device INTEGER,                -- GPU ordinal (args.device, else pid)
    stream BIGINT,                 -- stream id (args.stream, else tid)
    correlation BIGINT,            -- CUPTI/roctracer correlation id; equals the launching runtime call's
    external_id BIGINT,            -- Kineto 'External id': the CPU op that was open at launch
    grid INTEGER[],                -- launch grid [x, y, z]
    block INTEGER[],               -- launch block [x, y, z]
    klass VARCHAR,                 -- catalog class: attention, gemm, wo_gemm, collective, ... (see catalog)
    family VARCHAR,                -- catalog family: nccl, vllm_custom_ar, fa2, cublas, ...
    collective_op VARCHAR,         -- for collectives: all_reduce, all_gather, reduce_scatter, ... else NULL
    coll_name VARCHAR,             -- args 'Collective name' (NCCL kernels, PyTorch >= 2.4)
    in_nelems BIGINT,              -- args 'In msg nelems' (older 'In msg size'), elements
    out_nelems BIGINT,             -- args 'Out msg nelems', elements
    group_size INTEGER,            -- args 'Group size', ranks
    dtype VARCHAR,                 -- args 'dtype' (c10 ScalarType name: 'BFloat16', 'Float', ...)
    pg_name VARCHAR,               -- args 'Process Group Name' (or old 'Process Group ID')
    pg_desc VARCHAR,               -- args 'Process Group Description'
    pg_ranks VARCHAR,              -- args 'Process Group Ranks' as written ('[0, 1]')
    seq BIGINT                     -- args 'Seq': per-process-group collective sequence number
);

CREATE TABLE memops (
    rank INTEGER,
    kind VARCHAR,                  -- 'memcpy' or 'memset'
    name VARCHAR,                  -- e.g. 'Memcpy HtoD (Pageable -> Device)'
    ts_ns BIGINT,                  -- GPU start, ns
    dur_ns BIGINT,                 -- GPU duration, ns
    device INTEGER,
    stream BIGINT,
    correlation BIGINT,
    external_id BIGINT,
    bytes BIGINT                   -- bytes copied or set (args.bytes)
);

CREATE TABLE runtime (
    rank INTEGER,
    cat VARCHAR,                   -- 'cuda_runtime' or 'cuda_driver' (ROCm traces use the same cats)
    name VARCHAR,                  -- e.g. 'cudaLaunchKernel', 'cudaGraphLaunch', 'hipMemcpyAsync'
    ts_ns BIGINT,                  -- host start, ns
    dur_ns BIGINT,                 -- host duration, ns
    pid VARCHAR,
    tid VARCHAR,
    correlation BIGINT,            -- links to kernels/memops.correlation
    external_id BIGINT             -- the CPU op that was open when the call was made
);

CREATE TABLE cpu_ops (
    rank INTEGER,
    name VARCHAR,                  -- op name (aten::mm, c10d::allreduce_, record_param_comms, ...)
    ts_ns BIGINT,                  -- host start, ns
    dur_ns BIGINT,                 -- host duration, ns
    pid VARCHAR,
    tid VARCHAR,
    external_id BIGINT,            -- 'External id'
    input_dims VARCHAR,            -- 'Input Dims' verbatim JSON (record_shapes=True), e.g. [[48, 256], [768, 256]]
    input_types VARCHAR,           -- 'Input type' verbatim JSON, e.g. ["c10::BFloat16", "c10::BFloat16"]
    klass VARCHAR,                 -- catalog class of the op name
    family VARCHAR,
    collective_op VARCHAR,
    coll_name VARCHAR,             -- record_param_comms args (see kernels for meaning)
    in_nelems BIGINT,
    out_nelems BIGINT,
    group_size INTEGER,
    dtype VARCHAR,
    pg_name VARCHAR,
    pg_desc VARCHAR,
    pg_ranks VARCHAR,
    seq BIGINT
);

CREATE TABLE annotations (
    rank INTEGER,
    name VARCHAR,                  -- record_function / NVTX range name (untrusted text)
    source VARCHAR,                -- 'user_annotation', 'gpu_user_annotation', 'python_function'
    ts_ns BIGINT,
    dur_ns BIGINT,
    pid VARCHAR,
    tid VARCHAR,
    external_id BIGINT,
    input_dims VARCHAR,            -- 'Input Dims' when the range records them (gloo:* collectives do), JSON
    input_types VARCHAR,           -- 'Input type' verbatim JSON
    klass VARCHAR,                 -- catalog class of the name ('collective' for nccl:*/gloo:*)
    collective_op VARCHAR
);

CREATE TABLE flows (
    rank INTEGER,
    flow_id BIGINT,                -- flow id (Kineto ac2g: the correlation id)
    cat VARCHAR,                   -- 'ac2g' (CPU launch -> GPU), 'fwdbwd', ...
    phase VARCHAR,                 -- 's' start or 'f' finish
    ts_ns BIGINT,
    pid VARCHAR,
    tid VARCHAR
);
