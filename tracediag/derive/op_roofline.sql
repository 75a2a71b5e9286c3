-- op_roofline: how far each CPU op's GPU kernels are from what the GPU can do (derive/op_roofline.py builds it).
-- One row per rank, op, phase, input shapes and dtype: the calls of the op that launched kernels (linked by the
-- kernel's External id, the CPU op open at its launch: the innermost one, e.g. aten::addmm inside aten::linear),
-- their summed kernel time, the per-call FLOPs and bytes of the cost model (tracediag/analyses/op_cost.py,
-- docs/method.md "Per-op cost model") and the roofline of the trace's GPU (the GPU catalogue). Kernels replayed
-- from a CUDA/HIP graph are not here: no op with shapes ran when they did.
CREATE OR REPLACE TABLE op_roofline (
    rank INTEGER,                  -- global rank
    op VARCHAR,                    -- the CPU op that launched the kernels, as recorded (aten::addmm, aten::_flash_attention_forward, ...)
    phase VARCHAR,                 -- phase of the engine step holding the op's start (prefill / decode / mixed; NULL: unknown or outside every step)
    shape VARCHAR,                 -- the op's 'Input Dims', compact JSON (NULL: the trace recorded no shapes)
    dtype VARCHAR,                 -- canonical dtypes of its tensor inputs, distinct, in input order ('bf16', 'fp32,bf16')
    model VARCHAR,                 -- the cost formula: 'gemm', 'attention' or 'memory' (bytes only); NULL: no cost (see note)
    family VARCHAR,                -- op family: GEMM, attention, elementwise, reduction, normalisation, copy / fill (NULL: an op the cost model does not know)
    calls BIGINT,                  -- calls of the op with this shape and dtype in the phase that launched kernels
    kernels BIGINT,                -- GPU kernels those calls launched
    kernel_ns BIGINT,              -- summed GPU time of those kernels, ns
    flops DOUBLE,                  -- FLOPs per call (NULL: not counted, memory-bound op; or unknown)
    bytes DOUBLE,                  -- compulsory bytes read and written per call (NULL: unknown)
    intensity DOUBLE,              -- flops / bytes, FLOP/byte
    tflops_s DOUBLE,               -- achieved rate: flops · calls / kernel_ns, TFLOP/s
    tb_s DOUBLE,                   -- achieved bandwidth: bytes · calls / kernel_ns, TB/s
    bound VARCHAR,                 -- 'compute' (intensity at or above the ridge, peak / bandwidth) or 'memory'
    roofline_ns DOUBLE,            -- calls · max(flops / peak, bytes / bandwidth), ns: the kernel time at the roofline
    pct_of_roofline DOUBLE,        -- 100 · roofline_ns / kernel_ns, % (against datasheet peaks: understated)
    buyable_ns DOUBLE,             -- kernel_ns − roofline_ns, ns: what kernels at the roofline would save (< 0: faster than the model's roofline)
    launch_bound BOOLEAN,          -- mean kernel time per call under 5 µs: bounded by launch latency, not by the roofline
    causal BOOLEAN,                -- attention: the causal flag when the trace records it (NULL: not recorded, or not attention)
    note VARCHAR,                  -- what the cost formula could not see, or why the row has no cost
    peak_tflops DOUBLE,            -- the compute roof: dense peak of the op's math class on the GPU, TFLOP/s
    peak_tb_s DOUBLE,              -- the memory roof: the GPU's memory bandwidth, TB/s
    gpu VARCHAR,                   -- the catalogue's GPU (else the device name the trace carries)
    peak_source VARCHAR            -- where the roofs come from, or why the roofline columns are NULL
);

INSERT INTO op_roofline
WITH rows AS (
    SELECT c.rank, c.name AS op, c.phase, x.shape, x.dtype, x.model, x.family, x.flops, x.bytes, x.causal, x.note,
           x.peak_flops_s, x.bandwidth_bytes_s, x.gpu, x.peak_source,
           sum(c.calls) AS calls, sum(c.kernels) AS kernels, sum(c.kernel_ns) AS kernel_ns
    FROM _op_calls c JOIN _op_cost x USING (sig)
    GROUP BY ALL
),
roof AS (
    SELECT *,
           CASE WHEN bytes > 0 AND bandwidth_bytes_s > 0 AND (flops IS NULL OR peak_flops_s > 0)
                THEN calls * greatest(coalesce(flops / peak_flops_s, 0), bytes / bandwidth_bytes_s) * 1e9 END AS roof_ns
    FROM rows
)
SELECT rank, op, phase, shape, dtype, model, family, calls, kernels, kernel_ns, flops, bytes,
       CASE WHEN bytes > 0 THEN flops / bytes END,
       CASE WHEN kernel_ns > 0 THEN flops * calls / kernel_ns / 1e3 END,
       CASE WHEN kernel_ns > 0 THEN bytes * calls / kernel_ns / 1e3 END,
       CASE WHEN model = 'memory' AND bytes IS NOT NULL THEN 'memory'
            WHEN flops IS NOT NULL AND bytes > 0 AND peak_flops_s > 0 AND bandwidth_bytes_s > 0
            THEN CASE WHEN flops / bytes >= peak_flops_s / bandwidth_bytes_s THEN 'compute' ELSE 'memory' END END,
       roof_ns,
       CASE WHEN kernel_ns > 0 THEN 100.0 * roof_ns / kernel_ns END,
       kernel_ns - roof_ns,
       kernel_ns < 5000 * calls,
       causal, note,
       peak_flops_s / 1e12, bandwidth_bytes_s / 1e12, gpu, peak_source
FROM roof;
