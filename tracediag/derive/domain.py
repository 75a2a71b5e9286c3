"""The workload's domain: training or inference, and which kind of model — from what the trace holds.

Table `workload_domain` (workload_domain.sql: one row for the analysis), built beside the window fitness
(derive/fitness.py), which reports it (findings.json `fitness.domain`, the report header):

* **mode** — `training` when the trace holds an autograd backward pass or optimizer work (`training_evidence`,
  which derive/layout.py's `workload` shares: `autograd::engine::evaluate_function…`, `*Backward*` ops, FSDP2's
  post-backward hook (applied in a forward pass only while autograd records for a backward one: a window of forward
  passes alone is still training), `Optimizer.step#…` / `Optimizer.zero_grad#…`, DDP's annotations, and kernels
  that only a backward pass or an optimizer launches (BACKWARD_KERNEL: `*_backward*`, FlashAttention's `flash_bwd` /
  `FlashAttnBwd`, cuDNN / MIOpen weight-gradient convolutions, Adam) — a GPU-only trace has no CPU ops to say so;
  `aten::_foreach_*` ops are counted but alone prove nothing: inference engines run them too); `inference` when it
  holds inference-engine step annotations (vLLM `execute_…`, SGLang `step[…]`), or a causal decoder's evidence and no
  backward pass; else `unknown`;
* **workload** — `recommender` when embedding-bag ops or kernels ran (TorchRec / FBGEMM `embedding_bag`,
  table-batched embeddings) — checked first, a recommender may hold attention too; `llm` only on a causal decoder's
  evidence (DECODER_EVIDENCE: engine steps, KV-cache writes, paged or varlen attention, causal attention kernels,
  decode-shaped steps, an LM head of vocabulary width); attention without it is a transformer that is not an LLM:
  `diffusion` beside convolutions with group norms or upsampling (a UNet), `vision_transformer` beside
  convolutions (the patch embedding), else `encoder`; `vision` when convolutions ran and no attention; else
  `other`. Convolutions are counted from CPU ops and from kernel names (CONV_KERNEL), for GPU-only traces.

Rules fit their advice and their words to it: engine advice (vLLM, SGLang, FlashInfer) only for LLM inference,
steps named training or forward where there is no prefill or decode (analyses/kernels.py `phase_name`), and the
parallel layout names an all-to-all from the same evidence (derive/layout.py).
"""

from __future__ import annotations

import re
from typing import Any

import duckdb

from tracediag.store import query_dicts, run_sql_file

COLUMNS = (
    "mode",
    "mode_why",
    "workload",
    "workload_why",
    "backward_ops",
    "optimizer_marks",
    "foreach_ops",
    "engine_steps",
    "attention_kernels",
    "attention_ops",
    "embedding_bag_ops",
    "conv_ops",
    "moe_kernels",
    "backward_kernels",
    "conv_kernels",
    "kv_cache_writes",
    "paged_attention",
    "causal_attention",
    "decode_steps",
    "lm_head_gemms",
    "unet_ops",
)  # fmt: skip  (the columns of workload_domain.sql, in order)

# Kernels only a backward pass or an optimizer step launches: ATen's *_backward* kernels (softmax_warp_backward,
# batch_norm_backward_kernel, max_pool_backward_nchw, sigmoid_backward_kernel_cuda), LayerNorm's gradient kernels
# (GammaBetaBackwardCUDAKernel, layer_norm_grad_input_kernel), FlashAttention-2/3 backward (flash_bwd_*,
# flash::FlashAttnBwd), AITER fmha_bwd, cuDNN batch-norm backward (bn_bw_*), weight-gradient convolutions (cuDNN /
# CUTLASS `wgrad`, MIOpen `igemm_wrw`: a data-gradient `dgrad` kernel also runs a transposed convolution's forward,
# so it is no proof), Adam optimizers and FBGEMM's embedding backward (rowwise_adagrad)
BACKWARD_KERNEL = (
    r"backward|Backward|flash_bwd|FlashAttnBwd|fmha_bwd|_grad_input_|wgrad|Wgrad|igemm_wrw|bn_bw_|Adam|adagrad"
)
# Convolution kernels: cuDNN (implicit-GEMM fprop / wgrad, winograd, `*conv*`), CUTLASS conv in cuDNN
# (ImplicitGemmConvolution, s1688fprop), MIOpen (igemm_fwd/bwd/wrw_gtc, naive_conv), Composable Kernel grouped conv
CONV_KERNEL = (
    r"(?i)convolve|convolution|conv2d|conv3d|3dconv|grouped_conv|naive_conv|fprop|wgrad|winograd"
    r"|igemm_(?:fwd|bwd|wrw)_gtc"
)
# KV-cache writes: vLLM reshape_and_cache(_flash) / concat_and_cache_mla, SGLang store_kvcache / set_kv_buffer and
# its paged token-slot allocation, DeepSeek's rotary_embedding_with_kv_cache
KV_CACHE_WRITE = (
    r"(?i)reshape_and_cache|concat_and_cache|store_kvcache|set_kv_buffer|alloc_\w*token_slots|alloc_decode_kernel"
    r"|with_kv_cache"
)
# attention over a paged or variable-length KV cache (kernels and ops of the attention class): paged / varlen /
# split-KV kernels (FA2's split kernel is the one a block table forces), vLLM's unified attention, TRT-LLM's
# generation kernels, FlashInfer's batch kernels, FA3's varlen sequence traits
PAGED_ATTENTION = (
    r"(?i)paged|varlen|splitkv|kvcache|kv_cache|unified_(?:mla_)?attention|ForGen|BatchPrefill|BatchDecode"
    r"|SeqLenTraits<true>|_fwd_kernel_stage[12]"
)
# the Is_causal flag in an attention kernel's template arguments: FlashAttention-2's flash_fwd_kernel (and PyTorch's
# bundled copy) is <Kernel_traits, Is_dropout, Is_causal, ...>, its split-KV kernel <Kernel_traits, Is_causal, ...>
# (Dao-AILab/flash-attention csrc/flash_attn/src/flash_fwd_launch_template.h DEFINE_FLASH_FORWARD_KERNEL);
# FlashAttention-3's early compute_attn_ws is <Ktraits, Is_causal, TileScheduler, Seqlen_traits>
# (hopper/flash_fwd_launch_template.h); TensorRT-LLM-gen's fmha kernels spell `Causal` in the name
_BOOL = r"(?:\(bool\))?(true|false|1|0)"
# template arguments up to the parameter list; Nsight writes casts such as (int)128 inside them
_ARGS = r"(?:[^()]|\((?:int|bool|long|unsigned int|unsigned long)\))*?"
CAUSAL_FLAG = (
    re.compile(
        r"flash_fwd_kernel<"
        + _ARGS
        + r"Flash_fwd_kernel_traits<"
        + _ARGS
        + r">\s*>\s*,\s*"
        + _BOOL
        + r"\s*,\s*"
        + _BOOL
    ),
    re.compile(r"flash_fwd_splitkv_kernel<" + _ARGS + r"Flash_fwd_kernel_traits<" + _ARGS + r">\s*>\s*,\s*()" + _BOOL),
    re.compile(r"compute_attn_ws<[^<>]*?Flash_fwd_kernel_traits<[^<>]*>\s*,\s*()" + _BOOL),
)
LM_HEAD_MIN_N = 32000  # output width of a vocabulary projection (Llama-2 32,000; Qwen 151,936; BERT's 30,522 is not)
LM_HEAD_MIN_RATIO = 4  # ... and at least 4x the hidden size: an MLP's up projection is 2.7-4x it


def causal_flag(name: str) -> bool | None:
    """True / False when the kernel name states its Is_causal template argument or says `Causal`; else None."""
    if "Causal" in name and name.startswith("fmha"):
        return True
    for rx in CAUSAL_FLAG:
        m = rx.search(name)
        if m:
            return m.group(2) in ("true", "1")
    return None


# CPU ops and kernels are counted per distinct name (and class, family) first: a trace repeats a few thousand names
# hundreds of thousands of times, and each pattern is then matched once per name, not once per event
_COUNTS_SQL = r"""
WITH ops AS MATERIALIZED (SELECT name, klass, count(*) AS n FROM cpu_ops GROUP BY name, klass),
kn AS MATERIALIZED (SELECT name, klass, family, count(*) AS n FROM kernels GROUP BY name, klass, family)
SELECT
  (SELECT coalesce(sum(n), 0)::BIGINT FROM ops WHERE name LIKE 'aten::\_foreach\_%' ESCAPE '\') AS foreach_ops,
  (SELECT count(*) FROM annotations
     WHERE name LIKE 'execute\_%' ESCAPE '\' OR name LIKE '%step[%') AS engine_steps,
  (SELECT coalesce(sum(n), 0)::BIGINT FROM kn WHERE klass IN ('attention', 'attention_fallback')) AS attention_kernels,
  (SELECT coalesce(sum(n), 0)::BIGINT FROM ops WHERE regexp_matches(name,
     '(?i)scaled_dot_product_attention|flash_attn|unified_attention|::attention|_attention_forward|paged_attention'))
     AS attention_ops,
  (SELECT coalesce(sum(n), 0)::BIGINT FROM ops
     WHERE regexp_matches(name, '(?i)embedding_bag|torchrec|split_embedding|fbgemm::'))
   + (SELECT coalesce(sum(n), 0)::BIGINT FROM kn
     WHERE regexp_matches(name, '(?i)embedding_bag|split_embedding|batched_embedding')) AS embedding_bag_ops,
  (SELECT coalesce(sum(n), 0)::BIGINT FROM ops WHERE regexp_matches(name, '(?i)^aten::(?:cudnn_|miopen_)?conv'))
     AS conv_ops,
  (SELECT coalesce(sum(n), 0)::BIGINT FROM kn WHERE family IN
     ('ck_moe', 'fused_moe_op', 'moe_routing', 'triton_fused_moe', 'trtllm_gen_moe', 'deepep', 'cutlass_grouped'))
   + (SELECT coalesce(sum(n), 0)::BIGINT FROM kn
     WHERE family = 'deepgemm' AND regexp_matches(name, 'GemmType\)[1-9]')) AS moe_kernels,
  (SELECT coalesce(sum(n), 0)::BIGINT FROM kn WHERE regexp_matches(name, $backward)) AS backward_kernels,
  (SELECT coalesce(sum(n), 0)::BIGINT FROM kn WHERE regexp_matches(name, $conv)) AS conv_kernels,
  (SELECT coalesce(sum(n), 0)::BIGINT FROM kn WHERE regexp_matches(name, $kv))
   + (SELECT coalesce(sum(n), 0)::BIGINT FROM ops WHERE regexp_matches(name, $kv)) AS kv_cache_writes,
  (SELECT coalesce(sum(n), 0)::BIGINT FROM kn WHERE klass = 'attention' AND regexp_matches(name, $paged))
   + (SELECT coalesce(sum(n), 0)::BIGINT FROM ops WHERE klass = 'attention' AND regexp_matches(name, $paged))
     AS paged_attention,
  (SELECT coalesce(sum(n), 0)::BIGINT FROM ops
     WHERE regexp_matches(name, '^aten::(?:group_norm|native_group_norm|upsample_\w+)$')) AS unet_ops
"""


def _attention_kernel_names(con: duckdb.DuckDBPyConnection) -> list[tuple[str, int]]:
    return con.execute("SELECT name, count(*) FROM kernels WHERE klass = 'attention' GROUP BY name").fetchall()


def _optional_count(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> int:
    """A count over a derived table that a store read back from an older tracediag may lack (then 0)."""
    try:
        return int(con.execute(sql, params or []).fetchone()[0] or 0)
    except duckdb.Error:
        return 0


def decoder_counts(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Causal attention kernels (their template's Is_causal flag), decode steps (steps.phase) and LM-head GEMMs
    (a weight of vocabulary width: N >= LM_HEAD_MIN_N and N >= LM_HEAD_MIN_RATIO x K, gemm_shapes)."""
    causal = sum(n for name, n in _attention_kernel_names(con) if causal_flag(name))
    decode = _optional_count(con, "SELECT count(*) FROM steps WHERE phase = 'decode'")
    lm_head = _optional_count(
        con,
        """WITH w AS (
             SELECT name, json_extract(w_dims, '$[0]')::BIGINT AS d0, json_extract(w_dims, '$[1]')::BIGINT AS d1
             FROM gemm_shapes WHERE json_array_length(w_dims) = 2)
           SELECT count(*) FROM (
             SELECT CASE WHEN name = 'aten::linear' THEN d0 ELSE d1 END AS n,
                    CASE WHEN name = 'aten::linear' THEN d1 ELSE d0 END AS k FROM w)
           WHERE n >= ? AND n >= ? * k""",
        [LM_HEAD_MIN_N, LM_HEAD_MIN_RATIO],
    )
    return {"causal_attention": causal, "decode_steps": decode, "lm_head_gemms": lm_head}


def training_evidence(con: duckdb.DuckDBPyConnection) -> dict[str, int]:
    """Counts of autograd backward ops (`backward`), optimizer / DDP annotations (`marks`), backward-pass or
    optimizer kernels (`kernels`, BACKWARD_KERNEL) and inference-engine step annotations (`engine`) in the store."""
    row = con.execute(
        """SELECT
             -- the names matched once each, not once per op
             (SELECT coalesce(sum(n), 0)::BIGINT FROM (SELECT name, count(*) AS n FROM cpu_ops GROUP BY name)
                 WHERE name LIKE 'autograd::engine::evaluate_function%'
                 OR regexp_matches(name, '^[A-Za-z0-9_]+Backward[0-9]*$')
                 -- FSDP2's post-backward hook, applied in the forward pass only while autograd records for a
                 -- backward one (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py
                 -- _register_post_backward_hook returns early when torch.is_grad_enabled() is false or no input
                 -- requires grad): inference under no_grad / inference_mode never records it
                 OR name = 'RegisterPostBackwardFunction') AS backward,
             (SELECT count(*) FROM annotations WHERE name LIKE 'Optimizer.step#%' OR name LIKE 'Optimizer.zero_grad#%'
                 OR name IN ('## backward ##', '## optimizer ##') OR name LIKE 'DistributedDataParallel.%') AS marks,
             (SELECT coalesce(sum(n), 0)::BIGINT FROM (SELECT name, count(*) AS n FROM kernels GROUP BY name)
                 WHERE regexp_matches(name, ?)) AS kernels,
             (SELECT count(*) FROM annotations
                 WHERE name LIKE 'execute\\_%' ESCAPE '\\' OR name LIKE '%step[%') AS engine""",
        [BACKWARD_KERNEL],
    ).fetchone()
    return dict(zip(("backward", "marks", "kernels", "engine"), row))


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}{'' if n == 1 else 's'}"


def _words(counts: list[tuple[int, str]]) -> str:
    return ", ".join(_count(n, what) for n, what in counts if n)


DECODER_EVIDENCE = (
    ("engine_steps", "engine-step annotation"),
    ("kv_cache_writes", "KV-cache write"),
    ("paged_attention", "paged / varlen attention kernel or op"),
    ("causal_attention", "causal attention kernel"),
    ("decode_steps", "decode step"),
    ("lm_head_gemms", "LM-head GEMM of vocabulary width"),
)  # fmt: skip  (a causal decoder's evidence: (column, what one is called))
NO_DECODER = "no engine step, KV-cache write, paged / varlen or causal attention, decode step or LM head"


def _workload(row: dict[str, Any]) -> tuple[str, str]:
    """(workload, why) from the counts: recommender, llm, diffusion, vision_transformer, encoder, vision or other."""
    attention = row["attention_kernels"] + row["attention_ops"]
    conv = row["conv_ops"] + row["conv_kernels"]
    conv_words = _words([(row["conv_ops"], "convolution op"), (row["conv_kernels"], "convolution kernel")])
    attention_words = _words([(row["attention_kernels"], "attention kernel"), (row["attention_ops"], "attention op")])
    if row["embedding_bag_ops"]:
        return (
            "recommender",
            f"{_count(row['embedding_bag_ops'], 'embedding-bag op or kernel event')} (TorchRec / FBGEMM tables)",
        )
    decoder = [(row[k], what) for k, what in DECODER_EVIDENCE]
    if any(n for n, _ in decoder):
        return "llm", f"a causal decoder: {_words(decoder)}"
    if attention and conv and row["unet_ops"]:
        return "diffusion", (
            f"{attention_words} beside {conv_words} and {_count(row['unet_ops'], 'group-norm / upsampling op')} "
            f"(a UNet); {NO_DECODER}"
        )
    if attention and conv:
        return "vision_transformer", f"{attention_words} beside {conv_words} (a patch embedding); {NO_DECODER}"
    if attention:
        return "encoder", f"{attention_words} and no convolution; {NO_DECODER}"
    if conv:
        return "vision", f"{conv_words} and no attention"
    return "other", "no attention, embedding-bag or convolution work in the trace"


def classify(con: duckdb.DuckDBPyConnection) -> dict[str, Any]:
    """The domain row: mode and workload with why in words, and the counts behind them."""
    ev = training_evidence(con)
    row = query_dicts(
        con,
        _COUNTS_SQL,
        {"backward": BACKWARD_KERNEL, "conv": CONV_KERNEL, "kv": KV_CACHE_WRITE, "paged": PAGED_ATTENTION},
    )[0]
    row |= {"backward_ops": ev["backward"], "optimizer_marks": ev["marks"]} | decoder_counts(con)
    work, why = _workload(row)
    if ev["backward"] or ev["marks"] or ev["kernels"]:
        counts = [
            (ev["backward"], "autograd backward op"),
            (ev["marks"], "optimizer / DDP annotation"),
            (ev["kernels"], "backward-pass or optimizer kernel"),
            (row["foreach_ops"], "aten::_foreach_* op"),
        ]
        mode, mode_why = "training", _words(counts)
    elif row["engine_steps"]:
        mode, mode_why = "inference", "inference-engine steps and no backward pass or optimizer step"
    elif work == "llm":
        mode, mode_why = "inference", "a causal decoder's evidence and no backward pass or optimizer step"
    else:
        mode, mode_why = "unknown", "no backward pass, optimizer step or engine step annotation"
    return {"mode": mode, "mode_why": mode_why, "workload": work, "workload_why": why} | {
        k: row[k] for k in COLUMNS[4:]
    }


def build(con: duckdb.DuckDBPyConnection) -> None:
    run_sql_file(con, "tracediag.derive", "workload_domain.sql")
    has_trace = con.execute(
        "SELECT count(*) FROM inputs WHERE format IN ('kineto', 'nsys-sqlite', 'nsys-rep')"
    ).fetchone()[0]
    if not has_trace:
        return
    d = classify(con)
    con.execute(f"INSERT INTO workload_domain VALUES ({', '.join('?' for _ in COLUMNS)})", [d[c] for c in COLUMNS])


WORKLOAD_NAMES = {
    "llm": "LLM",
    "recommender": "recommender",
    "diffusion": "diffusion (UNet)",
    "vision_transformer": "vision transformer",
    "encoder": "transformer encoder",
    "vision": "vision",
    "other": "non-LLM",
}  # fmt: skip  (workload -> the word the label uses)


def read(con: duckdb.DuckDBPyConnection) -> dict[str, Any] | None:
    """The domain row, with `label` ('LLM inference', 'vision training', ...); None when there is none."""
    try:
        rows = query_dicts(con, "SELECT * FROM workload_domain")
    except duckdb.CatalogException:
        return None
    if not rows:
        return None
    d = rows[0]
    name = WORKLOAD_NAMES[d["workload"]]
    d["label"] = f"{name} {d['mode']}" if d["mode"] != "unknown" else f"{name} (training or inference unknown)"
    d["llm_inference"] = d["workload"] == "llm" and d["mode"] == "inference"
    return d


def label(d: dict[str, Any] | None) -> str:
    return d["label"] if d else "unknown"
