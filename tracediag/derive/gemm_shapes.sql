-- requires: kernels, cpu_ops, runtime, kernels.klass, cpu_ops.klass, steps
-- provides: gemm_shapes
--
-- GEMM-like CPU ops with recorded input shapes (outermost only: aten::linear calls aten::mm inside,
-- which must not count twice), with the step each ran in.
--   aten::linear(x[..., K], w[N, K], b)   aten::mm(a[T, K], b[K, N])   aten::addmm(bias, a[T, K], b[K, N])
--   aten::matmul(a[..., K], b[K, N])
CREATE OR REPLACE TABLE gemm_shapes AS
WITH g AS (
    SELECT rank, tid, name, ts_ns, dur_ns, input_dims, input_types FROM cpu_ops
    WHERE name IN ('aten::linear', 'aten::mm', 'aten::addmm', 'aten::matmul')
      AND input_dims IS NOT NULL AND input_dims <> '[]'
),
nesting AS (
    -- ops on one thread nest like a stack: sorted by start (parents first on ties), an op is inside an
    -- earlier one exactly when some earlier op on the thread ends at or after it ends. O(n log n).
    SELECT *, max(ts_ns + dur_ns) OVER (
        PARTITION BY rank, tid ORDER BY ts_ns, dur_ns DESC ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING
    ) AS enclosing_end_ns
    FROM g
),
outermost AS (
    SELECT * FROM nesting WHERE enclosing_end_ns IS NULL OR enclosing_end_ns < ts_ns + dur_ns
)
SELECT o.rank,                      -- global rank
    s.step_id,                         -- engine step (steps.step_id) the GEMM op ran in
    o.name,                            -- aten::linear, aten::mm, aten::addmm or aten::matmul
    o.ts_ns,                           -- host start, ns
    o.dur_ns,                          -- host duration, ns
    o.tid,                             -- host thread
    CASE WHEN o.name = 'aten::addmm' THEN json_extract(o.input_dims, '$[1]')
         ELSE json_extract(o.input_dims, '$[0]') END AS act_dims,   -- activation dims, JSON
    CASE WHEN o.name = 'aten::addmm' THEN json_extract(o.input_dims, '$[2]')
         ELSE json_extract(o.input_dims, '$[1]') END AS w_dims,     -- weight dims, JSON ([N,K] for linear)
    CASE WHEN o.name = 'aten::addmm' THEN json_extract_string(o.input_types, '$[1]')
         ELSE json_extract_string(o.input_types, '$[0]') END AS act_type -- activation element type
FROM outermost o
LEFT JOIN steps s ON s.rank = o.rank AND o.ts_ns >= s.ts_ns AND o.ts_ns < s.ts_ns + s.dur_ns;

-- GPU time of each op: the kernels its runtime launch calls (on its thread, inside its host range) started
ALTER TABLE gemm_shapes ADD COLUMN gpu_ns BIGINT;  -- summed kernel time of the op, ns (NULL: no kernel)
UPDATE gemm_shapes SET gpu_ns = k.ns
FROM (
    SELECT g.rank, g.tid, g.ts_ns, sum(k.dur_ns) AS ns
    FROM gemm_shapes g
    JOIN runtime r ON r.rank = g.rank AND r.tid = g.tid AND r.ts_ns >= g.ts_ns AND r.ts_ns <= g.ts_ns + g.dur_ns
    JOIN kernels k ON k.rank = r.rank AND k.correlation = r.correlation
    GROUP BY g.rank, g.tid, g.ts_ns
) k
WHERE gemm_shapes.rank = k.rank AND gemm_shapes.tid = k.tid AND gemm_shapes.ts_ns = k.ts_ns;
