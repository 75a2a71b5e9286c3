"""SCH005 Reported KV capacity cross-check.

Hypothesis: the engine reports how many KV tokens it allocated ("GPU KV cache size: N tokens", or
num_gpu_blocks × block_size) from the memory it set aside ("Available KV cache memory: X GiB" per GPU).
Dividing that memory by the per-token KV bytes the model config implies must give the same number. A
large mismatch means the config is not the served model's (other head count or layers), the KV dtype is
not what the user thinks (fp8 halves the bytes), or the tensor-parallel split differs.

Formula: per-token KV bytes per GPU (tracediag.model.accounting) = (L/pp)·2·ceil(H_kv/p)·D·b for full
attention; MLA (DeepSeek V2/V3/R1, Kimi) (L/pp)·(kv_lora_rank + qk_rope_head_dim)·b — one latent per token
and layer, replicated on every TP rank, not 2·H_kv·D; b = KV element bytes (kv_cache_dtype from the log,
'auto' = the model dtype; else an FP8-KV kernel name or the checkpoint's declared KV quantization).
expected tokens = floor(X GiB / per-token bytes); ratio = reported / expected; match within ±5 %.
Models with sliding-window or chunked layers are not checked: the engine sizes those layers apart and
reports tokens as concurrency × max_model_len (vLLM kv_cache_utils), which per-token bytes cannot predict.

Evidence: the startup lines (KV cache memory, GPU KV cache size, num_gpu_blocks, tensor/pipeline
parallel size, dtype, kv_cache_dtype) with their line numbers, and the model config fields.

What to do: on a ratio ≈ H_kv(config)/H_kv(served) check that --model is the served model's config;
≈ 2 check kv_cache_dtype (fp8); ≈ p check the TP degree; otherwise look for memory reserved elsewhere.
"""

from __future__ import annotations

import math

from tracediag.analyses.kernels import kv_cache_dtype
from tracediag.analyses.serving import input_paths, log_evidence, short, startup_facts
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model import DTYPE_BYTES, accounting

RULE = RuleMeta(
    id="SCH005",
    step=6,
    title="Engine's reported KV capacity matches the model config",
    requires_model=("L", "H_kv", "D"),
    may_be_downstream_of=("SHP001", "SHP002"),
    enabled_by=("--log",),
)
TOLERANCE = 0.05
GIB = 1024**3


def _kv_element_bytes(ctx: Context, facts: dict, model) -> tuple[float | None, str]:
    kv = str((facts.get("kv_cache_dtype") or {}).get("value", "auto")).strip("'")
    if kv.startswith("fp8") or "float8" in kv:
        return 1, f"engine log: kv_cache_dtype={kv}"
    if kv not in ("auto", "None", ""):
        b = DTYPE_BYTES.get(kv.replace("torch.", ""))
        if b:
            return b, f"engine log: kv_cache_dtype={kv}"
    other = kv_cache_dtype(ctx)  # an FP8-KV kernel name, or the checkpoint's declared KV quantization
    if not other.source.startswith(("model dtype", "assumed", "engine log")):
        return other.b, f"kv_cache_dtype={kv} in the log; {other.source}"
    dt = str((facts.get("dtype") or {}).get("value", "")).replace("torch.", "")
    if DTYPE_BYTES.get(dt):
        return DTYPE_BYTES[dt], f"kv_cache_dtype=auto → engine dtype {dt}"
    if model.dtype_bytes:
        return model.dtype_bytes, f"kv_cache_dtype=auto → config torch_dtype {model.dtype}"
    return None, "unknown"


def _interpret(ratio: float, m, p: int, b: float) -> str:
    guesses = []
    for label, r in (
        ("KV element bytes half of the assumed (fp8 KV cache)", 2.0),
        ("KV element bytes twice the assumed", 0.5),
        (f"tensor-parallel degree differs (p = {p})", float(p) if p > 1 else 0),
    ):
        if r and abs(ratio / r - 1) <= 0.1:
            guesses.append(label)
    if m.H_kv and not guesses:
        for h in range(1, 4 * m.H_kv + 1):
            if abs(ratio - m.H_kv / h) / ratio <= 0.03 and h != m.H_kv:
                guesses.append(f"the served model has {h} KV heads, the config says {m.H_kv}")
                break
    return "; ".join(guesses) or "memory reserved elsewhere, or the config is not the served model's"


def _evaluate(ctx: Context, path: str, facts: dict) -> dict | str:
    """The cross-check of one log, or the reason it cannot be made."""
    m = ctx.model
    mem = facts.get("kv_cache_memory_gib")
    if mem is None or not mem["value_num"]:
        return "missing 'Available KV cache memory: X GiB' in the log: no memory to divide"
    tokens_row = facts.get("kv_cache_tokens")
    blocks_row = facts.get("num_gpu_blocks")
    if tokens_row is None:
        return "missing 'GPU KV cache size: N tokens' (num_gpu_blocks alone needs the block size, not logged)"
    reported = int(tokens_row["value_num"])
    tp_row = facts.get("tensor_parallel_size") or facts.get("arg_tensor_parallel_size")
    p = int(tp_row["value_num"]) if tp_row and tp_row["value_num"] else (ctx.tp.p if ctx.tp else 1)
    p_source = f"log line {tp_row['line']}" if tp_row else (ctx.tp.source if ctx.tp else "default 1 (not logged)")
    pp_row = facts.get("pipeline_parallel_size")
    pp = int(pp_row["value_num"]) if pp_row and pp_row["value_num"] else 1
    b, b_source = _kv_element_bytes(ctx, facts, m)
    if b is None:
        return "missing the KV element type: no dtype in the log and no torch_dtype in the config"
    full = accounting.kv_bytes_per_token(m, p, b)
    if full is None:
        return "missing the KV shape: the config lacks num_key_value_heads or head_dim"
    per_token = full / pp
    mla = m.attention is not None and m.attention.kind == "MLA"
    mem_bytes = mem["value_num"] * GIB
    expected = math.floor(mem_bytes / per_token)
    ratio = reported / expected
    tol = TOLERANCE + 0.005 / mem["value_num"]  # the log rounds the GiB to 2 decimals: widen by that rounding
    values = {
        "log": short(path),
        "reported_tokens": reported,
        "kv_cache_memory_gib": mem["value_num"],
        "L": m.L,
        "H_kv": m.H_kv,
        "D": m.D,
        "kv_element_bytes": b,
        "kv_element_source": b_source,
        "tensor_parallel_size": p,
        "tp_source": p_source,
        "pipeline_parallel_size": pp,
        "kv_heads_per_rank": math.ceil(m.H_kv / p) if not mla else None,
        "kv_layout": accounting.kv_layout(m),
        "bytes_per_token_per_gpu": per_token,
        "expected_tokens": expected,
        "ratio": round(ratio, 4),
        "tolerance": round(tol, 4),
        "implied_bytes_per_token_per_gpu": round(mem_bytes / reported, 1),
    }
    if blocks_row:
        values["num_gpu_blocks"] = int(blocks_row["value_num"])
        values["block_size_implied"] = round(reported / blocks_row["value_num"], 3)
    shape = (
        f"{m.L}/{pp}·({m.attention.kv_lora_rank} + {m.attention.qk_rope_head_dim})·{b:g}"
        if mla
        else f"2·{m.L}/{pp}·ceil({m.H_kv}/{p})·{m.D}·{b:g}"
    )
    substituted = (
        f"floor({mem['value_num']} GiB / ({shape} = {per_token:,.0f} B)) = {expected:,}; "
        f"{reported:,} / {expected:,} = {ratio:.4f}"
    )
    evidence = [
        log_evidence(path, r, name, value=r["value"])
        for name, r in (
            ("KV cache memory", mem),
            ("GPU KV cache size", tokens_row),
            ("num_gpu_blocks", blocks_row),
            ("tensor_parallel_size", tp_row),
        )
        if r is not None
    ]
    return {"values": values, "substituted": substituted, "evidence": evidence, "ok": abs(ratio - 1) <= tol}


def check(ctx: Context) -> Check:
    m = ctx.model
    paths = input_paths(ctx)
    candidates = [(i, f) for i, f in startup_facts(ctx).items() if "kv_cache_tokens" in f or "num_gpu_blocks" in f]
    if not candidates:
        return not_applicable(
            RULE, "missing the engine's reported KV size: no 'GPU KV cache size' / num_gpu_blocks line in the logs"
        )
    if any(c is not None for c in accounting.kv_layer_caps(m)):
        return not_applicable(
            RULE,
            f"not comparable: {accounting.kv_layout(m)} — the engine sizes windowed layers apart and reports tokens "
            "as concurrency × max_model_len, which per-token bytes cannot predict",
        )
    results, reasons = [], []
    for input_id, facts in candidates:
        r = _evaluate(ctx, paths.get(input_id, "?"), facts)
        (reasons if isinstance(r, str) else results).append(r)
    if not results:
        return not_applicable(RULE, reasons[0])
    table = [r["values"] for r in results]
    worst = max(results, key=lambda r: abs(r["values"]["ratio"] - 1))
    v = worst["values"]
    formula = "expected = floor(M_KV / (2·(L/pp)·ceil(H_kv/p)·D·b)); ratio = reported / expected"
    common = {"formula": formula, "substituted": worst["substituted"], "values": v, "evidence": worst["evidence"]}
    if len(results) > 1:
        common["table"] = table
    if worst["ok"]:
        return passed(
            RULE,
            confidence="high",
            title=(
                f"Reported KV capacity {v['reported_tokens']:,} tokens = config's {v['bytes_per_token_per_gpu']:,.0f} "
                f"B/token per GPU (ratio {v['ratio']:.3f})"
            ),
            **common,
        )
    why = _interpret(v["ratio"], m, v["tensor_parallel_size"], v["kv_element_bytes"])
    v["likely_cause"] = why
    return finding(
        RULE,
        severity="warning",
        confidence="high",
        impact=min(1.0, abs(v["ratio"] - 1)),
        title=(
            f"Reported KV capacity is {v['ratio']:.2f}× what the config implies ({v['reported_tokens']:,} vs "
            f"{v['expected_tokens']:,} tokens; {v['implied_bytes_per_token_per_gpu']:,.0f} vs "
            f"{v['bytes_per_token_per_gpu']:,.0f} B/token per GPU): {why}"
        ),
        next_check=(
            "Check that --model is the served model's config.json (KV heads, layers, head dim), the engine's "
            "kv_cache_dtype, and the TP/PP degree; capacity-based rules (SCH004) use the reported figure."
        ),
        **common,
    )
