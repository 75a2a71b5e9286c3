"""SHP004 Fits on one card.

Hypothesis: the model would fit on one GPU, yet it is served with tensor parallelism; then the fair
baseline for throughput is p replicas of TP=1 on the same p cards, compared by per-card goodput —
not TP=1 vs TP=p latency ("TP article": 先把“放得下”和“跑得快”拆开; vLLM's deployment guidance
starts from single-GPU serving when the model fits). Capacity is necessary, not proof of speed.

Formula: M_rank(p) = M_weight(p) + M_KV(p) + M_runtime ≤ M_usable, with M_weight(p) ≈ params ×
bytes_per_weight / p, M_KV(p) = tokens × 2·L·ceil(H_kv/p)·D·b (KV heads replicate when p > H_kv, so
M_KV does not always shrink by p), M_runtime an allowance for activations, CUDA graphs and
communication buffers, and M_usable = GPU memory × 0.9 (vLLM's default gpu_memory_utilization). "Fits"
means one full context (max_position_embeddings tokens) of KV fits beside the weights.
G_card = SLO-meeting output tokens / (time × GPUs) is the comparison to run.

Evidence: GPU memory (the trace's deviceProperties, else the topology snapshot), the parameter
estimate from config.json, bytes per weight (quantization), the per-p capacity table (weights, KV per
token, KV tokens that fit, fits?), the smallest p that fits, p in use.

What to do: when the model fits at p = 1 and p > 1 is in use, benchmark p replicas of TP=1 against
TP=p at the same arrival process and SLO, and compare per-card goodput; keep TP only if it wins or if
one replica cannot meet the latency SLO. Informational until per-card goodput data shows TP losing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tracediag.engine import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="SHP004",
    step=1,
    title="Fits on one card: capacity per p, and the p-replicas baseline",
    requires_model=("L", "H"),
    may_be_downstream_of=("SHP001", "SHP002", "SHP003"),
)
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of GPU memory it may use (EngineArgs gpu_memory_utilization)
RUNTIME_BYTES = 2 * 1024**3  # allowance for activations, CUDA graphs, NCCL buffers (assumption, stated in values)
GiB = 1024**3


def _raw_config(path: str) -> dict:
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if isinstance(raw, dict) and "hidden_size" not in raw and isinstance(raw.get("text_config"), dict):
        return {**raw, **raw["text_config"]}
    return raw if isinstance(raw, dict) else {}


def param_count(m, raw: dict) -> tuple[int, list[str]]:
    """Dense decoder estimate: embeddings (+ untied lm_head) + L × (attention + MLP + norms)."""
    notes = []
    q = m.h * m.D
    kv = m.H_kv * m.D
    experts = raw.get("num_local_experts") or raw.get("num_experts") or 1
    mlp = 3 * m.H * m.I * experts
    if experts > 1:
        notes.append(f"MoE: {experts} experts counted in every layer's MLP (router and shared experts ignored)")
    per_layer = m.H * q + 2 * m.H * kv + q * m.H + mlp + 2 * m.H
    tied = bool(raw.get("tie_word_embeddings", False))
    emb = m.vocab_size * m.H * (1 if tied else 2)
    return emb + m.L * per_layer + m.H, notes


def gpu_memory(ctx: Context) -> tuple[int | None, str]:
    row = ctx.rows(
        "SELECT min(device_total_mem_bytes) AS mem, any_value(device_name) AS name FROM inputs "
        "WHERE rank IS NOT NULL AND device_total_mem_bytes IS NOT NULL"
    )
    if row and row[0]["mem"]:
        return int(row[0]["mem"]), f"trace deviceProperties ({row[0]['name']})"
    row = ctx.rows("SELECT min(memory_total_bytes) AS mem, any_value(name) AS name FROM topo_gpus")
    if row and row[0]["mem"]:
        return int(row[0]["mem"]), f"topology snapshot ({row[0]['name']})"
    return None, ""


def capacity(m, params: int, w_bytes: float, kv_bytes: int, mem: int, p: int, ctx_len: int | None) -> dict:
    usable = mem * GPU_MEMORY_UTILIZATION
    weights = params * w_bytes / p
    kv_per_token = 2 * m.L * math.ceil(m.H_kv / p) * m.D * kv_bytes
    free = usable - weights - RUNTIME_BYTES
    tokens = int(free // kv_per_token) if free > 0 else 0
    need = ctx_len or 1
    return {
        "p": p,
        "weights_gib": round(weights / GiB, 3),
        "kv_bytes_per_token": kv_per_token,
        "kv_tokens_that_fit": tokens,
        "usable_gib": round(usable / GiB, 3),
        "fits": tokens >= need,
    }


def check(ctx: Context) -> Check:
    m = ctx.model
    absent = m.missing("I", "h", "H_kv", "D", "vocab_size")
    if absent:
        return not_applicable(RULE, f"missing {', '.join(absent)} in {m.path}: the parameter count cannot be estimated")
    mem, mem_source = gpu_memory(ctx)
    if mem is None:
        return not_applicable(
            RULE,
            "missing GPU memory: no deviceProperties in the trace (a CPU trace?) and no topology snapshot "
            "(--topology from `tracediag env`)",
        )
    raw = _raw_config(m.path)
    params, notes = param_count(m, raw)
    if m.weight_bits and m.weight_bits < 16:
        w_bytes, w_source = m.weight_bits / 8, f"{m.weight_bits}-bit weights (quantization_config; scales ignored)"
    elif m.dtype_bytes:
        w_bytes, w_source = m.dtype_bytes, f"{m.dtype} weights"
    else:
        w_bytes, w_source = 2, "2 bytes per weight assumed (no torch_dtype)"
    kv_bytes = m.dtype_bytes or 2
    ctx_len = raw.get("max_position_embeddings") if isinstance(raw.get("max_position_embeddings"), int) else None
    p_used = ctx.tp.p if ctx.tp else 1
    ps = sorted({1, 2, 4, 8, p_used})
    table = [capacity(m, params, w_bytes, kv_bytes, mem, p, ctx_len) for p in ps]
    by_p = {r["p"]: r for r in table}
    min_p = next((r["p"] for r in table if r["fits"]), None)
    one = by_p[1]
    values = {
        "p": p_used,
        "p_source": ctx.tp.source if ctx.tp else "no TP degree known: p = 1 assumed",
        "gpu_memory_gib": round(mem / GiB, 3),
        "gpu_memory_source": mem_source,
        "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
        "runtime_allowance_gib": RUNTIME_BYTES / GiB,
        "params_estimate": params,
        "bytes_per_weight": w_bytes,
        "weights_from": w_source,
        "kv_bytes_per_element": kv_bytes,
        "context_tokens_required": ctx_len,
        "context_source": "max_position_embeddings" if ctx_len else "unknown (one token required)",
        "min_p_that_fits": min_p,
        "weights_gib_at_p1": one["weights_gib"],
        "kv_tokens_that_fit_at_p1": one["kv_tokens_that_fit"],
        "per_card_goodput_data": "none given: informational",
    }
    if notes:
        values["notes"] = notes
    formula = "M_weight(p) + M_KV(p) + M_runtime ≤ 0.9 × GPU memory; M_KV(p) = tokens × 2L·ceil(H_kv/p)·D·b"
    substituted = (
        f"p=1: {one['weights_gib']:.2f} GiB weights ({params / 1e9:.2f} B params × {w_bytes:g} B) + "
        f"{RUNTIME_BYTES / GiB:g} GiB runtime ≤ {one['usable_gib']:.2f} GiB usable leaves KV for "
        f"{one['kv_tokens_that_fit']:,} tokens ({one['kv_bytes_per_token']:,} B/token) vs {ctx_len or 1:,} needed"
    )
    common = {
        "formula": formula,
        "substituted": substituted,
        "values": values,
        "table": table,
    }
    if p_used > 1 and one["fits"]:
        return finding(
            RULE,
            **common,
            severity="info",
            confidence="medium",
            impact=0.0,
            title=(
                f"The model fits on one card ({one['weights_gib']:.1f} GiB weights, KV for "
                f"{one['kv_tokens_that_fit']:,} tokens on {values['gpu_memory_gib']:.0f} GiB) but runs with "
                f"TP={p_used}: compare {p_used} replicas of TP=1 by per-card goodput"
            ),
            evidence=[
                {"rank": None, "ts_ns": None, "name": f"GPU memory {values['gpu_memory_gib']} GiB from {mem_source}"}
            ],
            next_check=(
                f"Benchmark {p_used} TP=1 replicas against TP={p_used} with the same arrival process and SLO; compare "
                "G_card = SLO-meeting output tokens / (time × GPUs). Keep TP only if it wins or a replica misses the "
                "latency SLO."
            ),
        )
    if min_p is None:
        title = f"Even at p = {ps[-1]} the estimate leaves no room for one context of KV: check the config/quantization"
    elif p_used == 1:
        title = f"TP not in use and the model fits on one card ({one['weights_gib']:.1f} GiB weights)"
    else:
        title = f"TP={p_used} is needed for capacity: the smallest p that fits is {min_p}"
        if p_used > min_p:
            values["note"] = f"p = {p_used} is more than the {min_p} capacity needs: compare TP={min_p} replicas too"
    return passed(RULE, **common, confidence="medium", title=title)
