-- requires: cpu_ops, steps, gemm_shapes
-- updates: steps.T
--
-- Fill T (and phase) for steps whose marker does not carry token counts.
-- T = the most common activation row count (product of leading dims) of the outermost GEMM ops in
-- the step; phase from the query length of the SDPA ops (Sq = 1 -> decode): the dispatcher
-- aten::scaled_dot_product_attention, or a backend op called directly (torch.compile'd graphs call
-- aten::_scaled_dot_product_flash_attention & co. without the dispatcher). All take q as [B, h, Sq, D].
UPDATE steps SET T = g.t, t_source = 'GEMM activation rows (mode)'
FROM (
    SELECT rank, step_id, mode(rows) AS t FROM (
        SELECT rank, step_id,
               CAST(list_aggregate(list_slice(d, 1, len(d) - 1), 'product') AS BIGINT) AS rows
        FROM (SELECT rank, step_id, try_cast(act_dims AS BIGINT[]) AS d FROM gemm_shapes WHERE step_id IS NOT NULL)
        WHERE len(d) >= 2
    ) GROUP BY rank, step_id
) g
WHERE steps.T IS NULL AND steps.rank = g.rank AND steps.step_id = g.step_id;

UPDATE steps SET phase = a.phase, phase_source = 'attention query length'
FROM (
    SELECT s.rank, s.step_id,
           CASE WHEN max(q) = 1 THEN 'decode' WHEN min(q) > 1 THEN 'prefill' ELSE 'mixed' END AS phase
    FROM steps s
    JOIN (
        SELECT rank, ts_ns, try_cast(json_extract(input_dims, '$[0]') AS BIGINT[]) AS d FROM cpu_ops
        WHERE name IN ('aten::scaled_dot_product_attention', 'aten::_scaled_dot_product_flash_attention',
                       'aten::_scaled_dot_product_efficient_attention', 'aten::_scaled_dot_product_cudnn_attention',
                       'aten::_scaled_dot_product_flash_attention_for_cpu', 'aten::_scaled_dot_product_attention_math',
                       'aten::_scaled_dot_product_fused_attention_overrideable')
          AND input_dims IS NOT NULL
    ) o ON o.rank = s.rank AND o.ts_ns >= s.ts_ns AND o.ts_ns < s.ts_ns + s.dur_ns,
    LATERAL (SELECT o.d[len(o.d) - 1] AS q)
    WHERE len(o.d) >= 3
    GROUP BY s.rank, s.step_id
) a
WHERE steps.phase IS NULL AND steps.rank = a.rank AND steps.step_id = a.step_id;
