-- REFERENCE ONLY (tests/test_collective_calls_asof.py): the range self-join form of
-- tracediag/derive/collective_calls.sql before it was rewritten as ASOF joins. Quadratic in the calls of one
-- thread; kept to check the rewrite returns the same rows on every sample and vendored trace.

-- One row per collective *call* per rank, before payload arithmetic (done in Python).
--
-- A call shows up as several events:
--   NCCL: c10d::allreduce_ > record_param_comms > nccl:all_reduce on the calling thread, then a kernel;
--   gloo: c10d::allreduce_ on the calling thread, and the work itself as a `gloo:all_reduce` range on
--         ProcessGroupGloo's worker thread (with the tensor's Input Dims), later;
--   custom all-reduce: a framework op (vllm::all_reduce, _C_custom_ar::all_reduce) and its kernel, or
--         only the kernel (inside a CUDA graph).
-- Steps: (1) candidates nested in another candidate on the same thread fold into the outermost one,
-- merging metadata; (2) collective kernels attach to the call whose host range holds their launch;
-- (3) collective ranges that no call encloses (gloo worker) pair with kernel-less calls in order, by the
-- collective the backend runs for the call: ProcessGroupGloo runs _reduce_scatter_base as an all-reduce
-- of the whole input plus a local copy (reduce_scatter_tensor_coalesced: clone, allreduce(inp), then
-- copy_ of this rank's chunk at wait(); torch/csrc/distributed/c10d/ProcessGroupGloo.cpp), so a
-- `gloo:all_reduce` range is the work of a `c10d::_reduce_scatter_base_` call; (4) whatever is left is a
-- call of its own. One row per logical collective: the call keeps the op the program issued.
CREATE OR REPLACE TEMP TABLE coll_cand AS
SELECT row_number() OVER (ORDER BY rank, ts_ns, src, name) AS cid, * FROM (
    SELECT rank, tid, name, ts_ns, dur_ns, ts_ns + dur_ns AS end_ns, 'cpu_op' AS src, collective_op,
           coll_name, in_nelems, out_nelems, group_size, dtype, pg_name, pg_desc, pg_ranks, seq,
           input_dims, input_types
    FROM cpu_ops WHERE (klass = 'collective' OR coll_name IS NOT NULL) AND coalesce(coll_name, '') <> 'wait'
    UNION ALL
    SELECT rank, tid, name, ts_ns, dur_ns, ts_ns + dur_ns, 'annotation', collective_op,
           NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, input_dims, input_types
    FROM annotations WHERE source = 'user_annotation' AND klass = 'collective'
);

CREATE OR REPLACE TEMP TABLE coll_outer AS
-- outermost candidates per thread: sorted by start (longer first on ties, then cid), a candidate is
-- nested when an earlier one on the same thread ends at or after it ends.
SELECT * EXCLUDE (enclosing_end_ns) FROM (
    SELECT *, max(end_ns) OVER (
        PARTITION BY rank, tid ORDER BY ts_ns, end_ns DESC, cid ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
    ) AS enclosing_end_ns
    FROM coll_cand
) WHERE enclosing_end_ns IS NULL OR enclosing_end_ns < end_ns;

CREATE OR REPLACE TEMP TABLE coll_meta AS
SELECT c.cid,
    max(i.collective_op) FILTER (WHERE i.collective_op IS NOT NULL AND i.collective_op <> 'unknown') AS op,
    max(i.coll_name) AS coll_name, max(i.in_nelems) AS in_nelems, max(i.out_nelems) AS out_nelems,
    max(i.group_size) AS group_size, max(i.dtype) AS dtype, max(i.pg_name) AS pg_name,
    max(i.pg_desc) AS pg_desc, max(i.pg_ranks) AS pg_ranks, max(i.seq) AS seq,
    -- shapes of the dispatcher op (c10d::allreduce_ ...), a custom all-reduce op, or a gloo range
    max(i.input_dims) FILTER (WHERE i.name <> 'record_param_comms') AS input_dims,
    max(i.input_types) FILTER (WHERE i.name <> 'record_param_comms') AS input_types,
    bool_or(i.name = 'record_param_comms') AS has_param_comms
FROM coll_outer c
JOIN coll_cand i ON i.rank = c.rank AND i.tid = c.tid AND i.ts_ns >= c.ts_ns AND i.end_ns <= c.end_ns
GROUP BY c.cid;

CREATE OR REPLACE TEMP TABLE coll_kern AS
SELECT k.rank, k.name, k.ts_ns, k.dur_ns, k.correlation, k.collective_op, k.coll_name, k.in_nelems,
       k.out_nelems, k.group_size, k.dtype, k.pg_name, k.pg_desc, k.pg_ranks, k.seq,
       r.ts_ns AS launch_ts_ns, r.tid AS launch_tid
FROM kernels k LEFT JOIN runtime r ON r.rank = k.rank AND r.correlation = k.correlation
WHERE k.klass = 'collective';

CREATE OR REPLACE TEMP TABLE coll_gpu AS
SELECT c.cid, min(k.ts_ns) AS gpu_ts_ns, max(k.ts_ns + k.dur_ns) - min(k.ts_ns) AS gpu_dur_ns,
    count(*) AS kernel_count, min(k.name) AS kernel_name,
    max(k.collective_op) FILTER (WHERE k.collective_op <> 'unknown') AS k_op,
    max(k.coll_name) AS k_coll_name, max(k.in_nelems) AS k_in_nelems, max(k.out_nelems) AS k_out_nelems,
    max(k.group_size) AS k_group_size, max(k.dtype) AS k_dtype, max(k.pg_name) AS k_pg_name,
    max(k.seq) AS k_seq
FROM coll_outer c
JOIN coll_kern k ON k.rank = c.rank AND k.launch_tid = c.tid
                AND k.launch_ts_ns >= c.ts_ns AND k.launch_ts_ns <= c.end_ns
GROUP BY c.cid;

-- (3) calls made on a thread (dispatcher ops) vs collective ranges on threads that made no call
CREATE OR REPLACE TEMP TABLE coll_dispatch AS
SELECT *, row_number() OVER (PARTITION BY rank, exec_op ORDER BY ts_ns) AS nth FROM (
    SELECT c.*, coalesce(nullif(c.collective_op, 'unknown'), m.op, g.k_op, c.collective_op) AS call_op,
           CASE coalesce(nullif(c.collective_op, 'unknown'), m.op, g.k_op, c.collective_op) WHEN 'reduce_scatter' THEN 'all_reduce'
                ELSE coalesce(nullif(c.collective_op, 'unknown'), m.op, g.k_op, c.collective_op) END AS exec_op
    FROM coll_outer c JOIN coll_meta m USING (cid) LEFT JOIN coll_gpu g USING (cid)
    WHERE (c.src = 'cpu_op' OR c.tid IN (SELECT tid FROM coll_cand WHERE src = 'cpu_op' AND rank = c.rank))
      AND c.cid NOT IN (SELECT cid FROM coll_gpu)
);

CREATE OR REPLACE TEMP TABLE coll_detached AS
SELECT c.*, row_number() OVER (PARTITION BY c.rank, c.collective_op ORDER BY c.ts_ns) AS nth
FROM coll_outer c
WHERE NOT (c.src = 'cpu_op' OR c.tid IN (SELECT tid FROM coll_cand WHERE src = 'cpu_op' AND rank = c.rank));

CREATE OR REPLACE TEMP TABLE coll_pair AS
SELECT d.cid, x.cid AS exec_cid, x.ts_ns AS exec_ts_ns, x.dur_ns AS exec_dur_ns, x.name AS exec_name,
       x.collective_op AS exec_op,
       x.input_dims AS exec_dims, x.input_types AS exec_types
FROM coll_dispatch d
JOIN coll_detached x ON x.rank = d.rank AND x.collective_op = d.exec_op AND x.nth = d.nth
WHERE x.ts_ns >= d.ts_ns;

CREATE OR REPLACE TEMP TABLE coll_calls AS
SELECT c.rank, c.name AS call_name, c.tid, c.ts_ns AS cpu_ts_ns, c.dur_ns AS cpu_dur_ns,
    coalesce(nullif(c.collective_op, 'unknown'), m.op, g.k_op, c.collective_op) AS op,
    coalesce(m.coll_name, g.k_coll_name) AS coll_name,
    coalesce(m.in_nelems, g.k_in_nelems) AS in_nelems,
    coalesce(m.out_nelems, g.k_out_nelems) AS out_nelems,
    coalesce(m.group_size, g.k_group_size) AS group_size,
    coalesce(m.dtype, g.k_dtype) AS dtype,
    coalesce(m.pg_name, g.k_pg_name) AS pg_name, m.pg_desc, m.pg_ranks,
    coalesce(m.seq, g.k_seq) AS seq,
    coalesce(p.exec_dims, m.input_dims) AS input_dims, coalesce(p.exec_types, m.input_types) AS input_types,
    m.has_param_comms,
    g.gpu_ts_ns, g.gpu_dur_ns, coalesce(g.kernel_count, 0) AS kernel_count, g.kernel_name,
    p.exec_name, p.exec_ts_ns, p.exec_dur_ns,
    c.ts_ns AS anchor_ts_ns,
    coalesce(p.exec_op, g.k_op, nullif(c.collective_op, 'unknown'), m.op, g.k_op, c.collective_op) AS exec_op
FROM coll_outer c JOIN coll_meta m USING (cid) LEFT JOIN coll_gpu g USING (cid) LEFT JOIN coll_pair p USING (cid)
WHERE c.cid NOT IN (SELECT exec_cid FROM coll_pair)
UNION ALL
-- (4) collective kernels no call claimed (custom all-reduce in a CUDA graph, PyNccl, ...)
SELECT k.rank, k.name, k.launch_tid, k.launch_ts_ns, NULL, k.collective_op, k.coll_name, k.in_nelems,
    k.out_nelems, k.group_size, k.dtype, k.pg_name, k.pg_desc, k.pg_ranks, k.seq, NULL, NULL, FALSE,
    k.ts_ns, k.dur_ns, 1, k.name, NULL, NULL, NULL, coalesce(k.launch_ts_ns, k.ts_ns), k.collective_op
FROM coll_kern k
WHERE NOT EXISTS (
    SELECT 1 FROM coll_outer c
    WHERE c.rank = k.rank AND c.tid = k.launch_tid AND k.launch_ts_ns >= c.ts_ns AND k.launch_ts_ns <= c.end_ns
);
