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
SELECT o.rank, s.step_id, o.name, o.ts_ns, o.dur_ns,
    CASE WHEN o.name = 'aten::addmm' THEN json_extract(o.input_dims, '$[1]')
         ELSE json_extract(o.input_dims, '$[0]') END AS act_dims,   -- activation dims, JSON
    CASE WHEN o.name = 'aten::addmm' THEN json_extract(o.input_dims, '$[2]')
         ELSE json_extract(o.input_dims, '$[1]') END AS w_dims,     -- weight dims, JSON ([N,K] for linear)
    CASE WHEN o.name = 'aten::addmm' THEN json_extract_string(o.input_types, '$[1]')
         ELSE json_extract_string(o.input_types, '$[0]') END AS act_type -- activation element type
FROM outermost o
LEFT JOIN steps s ON s.rank = o.rank AND o.ts_ns >= s.ts_ns AND o.ts_ns < s.ts_ns + s.dur_ns;
