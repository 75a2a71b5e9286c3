-- One row for the analysis (none without a profiler trace): the workload's domain, training or inference and
-- LLM or another kind of model (tracediag/derive/domain.py fills it; the fitness summary and the report read it).
CREATE OR REPLACE TABLE workload_domain (
    mode VARCHAR,                    -- training, inference or unknown
    mode_why VARCHAR,                -- the evidence the mode rests on, in words
    workload VARCHAR,                -- llm, recommender, diffusion, vision_transformer, encoder, vision or other
    workload_why VARCHAR,            -- the evidence the workload rests on, in words
    backward_ops BIGINT,             -- autograd backward ops (evaluate_function, *Backward*, FSDP's post-backward hook)
    optimizer_marks BIGINT,          -- Optimizer.step/zero_grad and DDP annotations
    foreach_ops BIGINT,              -- aten::_foreach_* ops (inference engines run them too: no proof alone)
    engine_steps BIGINT,             -- inference-engine step annotations (vLLM execute_..., SGLang step[...])
    attention_kernels BIGINT,        -- kernels of a catalogued attention family (kernels.klass attention)
    attention_ops BIGINT,            -- attention CPU ops (scaled_dot_product_attention, flash_attn, ...)
    embedding_bag_ops BIGINT,        -- embedding-bag ops and kernels (TorchRec, FBGEMM)
    conv_ops BIGINT,                 -- convolution ops (aten::conv*, cudnn/miopen convolutions)
    moe_kernels BIGINT,              -- MoE expert, routing and dispatch kernels of a catalogued family
    backward_kernels BIGINT,         -- kernels only a backward pass or optimizer launches (domain.BACKWARD_KERNEL)
    conv_kernels BIGINT,             -- convolution kernels by name (domain.CONV_KERNEL)
    kv_cache_writes BIGINT,          -- KV-cache write kernels and ops (reshape_and_cache, store_kvcache, ...)
    paged_attention BIGINT,          -- paged / varlen / split-KV attention kernels and ops
    causal_attention BIGINT,         -- attention kernels whose template says Is_causal (or `Causal`)
    decode_steps BIGINT,             -- steps of phase decode
    lm_head_gemms BIGINT,            -- GEMM ops with a weight of vocabulary width (an LM head)
    unet_ops BIGINT                  -- group-norm and upsampling ops (a UNet beside convolutions and attention)
);
