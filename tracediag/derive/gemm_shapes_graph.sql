-- gemm_shapes seen through CUDA/HIP graphs (derive/graph_capture.py overlay_gemm_shapes): a temporary table of the
-- same name over the stored one, its rows (source 'cpu op') plus one row per GEMM op a matched graph replayed
-- (source 'graph capture'): the capturing op's name, input dims and types from the capture trace, the graph
-- launch's host time and thread, the step it ran in, and the summed time of the op's replayed kernels. No host op
-- ran in the replay, so dur_ns is NULL. {base} is the stored table.
CREATE OR REPLACE TEMP TABLE gemm_shapes AS
SELECT *, 'cpu op' AS source FROM {base}
UNION ALL BY NAME
SELECT g.rank, s.step_id, g.op AS name, min(r.ts_ns) AS ts_ns, CAST(NULL AS BIGINT) AS dur_ns, min(r.tid) AS tid,
    CASE WHEN g.op = 'aten::addmm' THEN json_extract(g.op_input_dims, '$[1]')
         ELSE json_extract(g.op_input_dims, '$[0]') END AS act_dims,
    CASE WHEN g.op = 'aten::addmm' THEN json_extract(g.op_input_dims, '$[2]')
         ELSE json_extract(g.op_input_dims, '$[1]') END AS w_dims,
    CASE WHEN g.op = 'aten::addmm' THEN json_extract_string(g.op_input_types, '$[1]')
         ELSE json_extract_string(g.op_input_types, '$[0]') END AS act_type,
    sum(k.dur_ns) AS gpu_ns, 'graph capture' AS source
FROM graph_kernel_ops g
JOIN kernels k ON k.rank = g.rank AND k.correlation = g.correlation AND k.ts_ns = g.ts_ns AND k.name = g.kernel
JOIN runtime r ON r.rank = g.rank AND r.correlation = g.correlation AND r.name ILIKE '%GraphLaunch%'
LEFT JOIN steps s ON s.rank = g.rank AND r.ts_ns >= s.ts_ns AND r.ts_ns < s.ts_ns + s.dur_ns
WHERE g.op IN ('aten::linear', 'aten::mm', 'aten::addmm', 'aten::matmul')
  AND g.op_input_dims IS NOT NULL AND g.op_input_dims <> '[]'
GROUP BY g.rank, g.correlation, g.capture, g.op_id, g.op, g.op_input_dims, g.op_input_types, s.step_id;
