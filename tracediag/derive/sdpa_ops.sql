-- requires: cpu_ops, steps, steps.T
-- provides: sdpa_ops
--
-- The scaled-dot-product-attention ops inside engine steps, with their recorded shapes and types: KRN001 reads
-- the dtype, head dim and mask per phase, the decode context (KRN005 and others) the key length S and batch B.
-- One row per op and step holding its start (as a join of cpu_ops with the steps' host ranges would give);
-- the step's phase is read from steps at query time. A Parquet store holds it: the rules do not scan cpu_ops.
-- The ops take q as [B, h, Sq, D]: the dispatcher, and the backend ops compiled graphs call directly.
CREATE OR REPLACE TABLE sdpa_ops AS
SELECT o.rank,                      -- global rank
       s.step_id,                   -- engine step (steps.step_id) holding the op's start
       o.name,                      -- aten::scaled_dot_product_attention or a backend op called directly
       o.ts_ns,                     -- host start, ns
       o.input_dims,                -- 'Input Dims' verbatim JSON: q, k, v, [mask], ...
       o.input_types                -- 'Input type' verbatim JSON
FROM cpu_ops o JOIN steps s ON s.rank = o.rank AND o.ts_ns >= s.ts_ns AND o.ts_ns < s.ts_ns + s.dur_ns
WHERE o.name IN ('aten::scaled_dot_product_attention', 'aten::_scaled_dot_product_flash_attention',
                 'aten::_scaled_dot_product_efficient_attention', 'aten::_scaled_dot_product_cudnn_attention',
                 'aten::_scaled_dot_product_flash_attention_for_cpu', 'aten::_scaled_dot_product_attention_math',
                 'aten::_scaled_dot_product_fused_attention_overrideable')
  AND o.input_dims IS NOT NULL;
