"""SHP004 Fits on one card.

Hypothesis: the model would fit on one GPU, yet it is served with tensor parallelism; then the fair
baseline for throughput is p replicas of TP=1 on the same p cards, compared by per-card goodput —
not TP=1 vs TP=p latency (separate "it fits" from "it runs fast"; vLLM's deployment guidance
starts from single-GPU serving when the model fits). Capacity is necessary, not proof of speed.

Formula: M_rank(p) = M_weight(p) + M_KV(p) + M_runtime ≤ M_usable. M_weight(p): every module group's
parameters at its real format (tracediag.model.accounting: MXFP4 experts at 4.25 bits, AWQ at 4 + 20/G, FP8
block at 8.002, bf16 attention / router / embeddings ...), split the Megatron/vLLM way (attention by heads,
MLPs and experts by p, router and norms replicated, vocab-parallel embeddings and lm_head). M_KV(p) = the
KV of one full context (max_position_embeddings tokens) on one rank: 2·ceil(H_kv/p)·D·b per token per
full-attention layer (KV heads replicate when p > H_kv), sliding-window layers capped at their window, MLA
one latent of kv_lora_rank + qk_rope_head_dim per layer (not split by p); b from the engine log, an FP8-KV
kernel name or the config. M_runtime an allowance for activations, CUDA graphs and communication buffers;
M_usable = GPU memory × 0.9 (vLLM's default gpu_memory_utilization). G_card = SLO-meeting output tokens /
(time × GPUs) is the comparison to run.

Evidence: GPU memory (the trace's deviceProperties, else the topology snapshot), the per-group weight table
(parameters, format, bits per weight, bytes per rank), the per-p capacity table (weights, KV per token, KV
tokens that fit, fits?), the smallest p that fits, p in use.

What to do: when the model fits at p = 1 and p > 1 is in use, benchmark p replicas of TP=1 against
TP=p at the same arrival process and SLO, and compare per-card goodput; TP is justified if it wins there,
or if a TP=1 replica cannot meet the single-request latency SLO (a long prompt's TTFT, the per-token
latency of one stream). Informational until per-card goodput data shows TP losing.
"""

from __future__ import annotations

from tracediag.analyses.kernels import kv_cache_dtype, served_formats
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model import accounting

RULE = RuleMeta(
    id="SHP004",
    step=1,
    title="Fits on one card: capacity per p, and the p-replicas baseline",
    requires_model=("L", "H"),
    may_be_downstream_of=("SHP001", "SHP002", "SHP003"),
    enabled_by=("--topology topo.json",),
)
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of GPU memory it may use (EngineArgs gpu_memory_utilization)
RUNTIME_BYTES = 2 * 1024**3  # allowance for activations, CUDA graphs, NCCL buffers (assumption, stated in values)
GiB = 1024**3


def gpu_memory(ctx: Context) -> tuple[int | None, str]:
    row = ctx.rows(
        "SELECT min(device_total_mem_bytes) AS mem, any_value(device_name) AS name FROM inputs "
        "WHERE rank IS NOT NULL AND device_total_mem_bytes IS NOT NULL"
    )
    if row and row[0]["mem"]:
        return int(row[0]["mem"]), f"trace deviceProperties ({row[0]['name'] or 'GPU'})"
    row = ctx.rows("SELECT min(memory_total_bytes) AS mem, any_value(name) AS name FROM topo_gpus")
    if row and row[0]["mem"]:
        return int(row[0]["mem"]), f"topology snapshot ({row[0]['name']})"
    return None, ""


def capacity(m, kv_b: float, mem: float, p: int, ctx_len: int | None, fmts: dict | None = None) -> dict:
    """One row of the per-p table: weights (in `fmts`, default as declared) and KV of one rank against its
    usable memory."""
    usable = mem * GPU_MEMORY_UTILIZATION
    weights = accounting.weight_bytes(m, p, fmts)
    per_token = accounting.kv_bytes_per_token(m, p, kv_b) or 0.0
    need = ctx_len or 1
    kv_need = accounting.kv_bytes(m, p, kv_b, need) or 0.0
    free = usable - weights - RUNTIME_BYTES
    capped = (accounting.kv_bytes(m, p, kv_b, need) or 0.0) - per_token * need  # sliding layers: a fixed part
    # every layer keeps a bounded window (per_token = 0): the token count does not limit the context
    tokens = (max(int((free - max(capped, 0.0)) // per_token), 0) if free > 0 else 0) if per_token else None
    return {
        "p": p,
        "weights_gib": round(weights / GiB, 3),
        "kv_bytes_per_token": per_token,
        "kv_gib_one_context": round(kv_need / GiB, 3),
        "kv_tokens_that_fit": tokens,
        "usable_gib": round(usable / GiB, 3),
        "fits": free >= kv_need,
    }


def _sizing_title(
    ps: list[int], p_used: int, min_p: int | None, one: dict, gpu_gib: float, ctx_len: int | None
) -> tuple[str, str | None]:
    """The passing title: how the TP degree in use compares with the smallest p that holds the weights and one
    context of KV; and a note for the values when p is more than capacity needs."""
    note = None
    if min_p is None:
        title = f"Even at p = {ps[-1]} the estimate leaves no room for one context of KV: check the config/quantization"
    elif p_used == 1:
        title = (
            f"TP not in use and the model fits on one card ({one['weights_gib']:.1f} GiB weights of {gpu_gib:.0f} GiB)"
        )
    elif p_used == min_p:
        below = max(p for p in ps if p < min_p)
        title = (
            f"TP={p_used} is needed for capacity: the model does not fit at p = {below} (smallest p that fits: {min_p})"
        )
    elif p_used > min_p:
        title = (
            f"TP={p_used} is more than capacity needs: the smallest p that fits is {min_p}; compare "
            f"{p_used // min_p if p_used % min_p == 0 else 'several'} TP={min_p} replicas by per-card goodput"
        )
        note = f"p = {p_used} is more than the {min_p} capacity needs: compare TP={min_p} replicas too"
    else:
        title = (
            f"TP={p_used} runs, but the estimate says it needs p = {min_p} to hold one full context "
            f"({ctx_len or 1:,} tokens) of KV: the deployment may serve shorter contexts, or check the config"
        )
    return title, note


def check(ctx: Context) -> Check:
    m = ctx.model
    absent = m.missing("h", "H_kv", "D", "vocab_size")
    if absent or (m.I is None and m.moe is None):
        what = ", ".join(absent) or "I"
        return not_applicable(RULE, f"missing {what} in {m.path}: the parameter count cannot be estimated")
    mem, mem_source = gpu_memory(ctx)
    if mem is None:
        return not_applicable(
            RULE,
            "missing GPU memory: no deviceProperties in the trace (a CPU trace?) and no topology snapshot "
            "(--topology from `tracediag env`)",
        )
    kv = kv_cache_dtype(ctx)
    fmts, fmts_how = served_formats(ctx)
    ctx_len = m.max_position_embeddings
    p_used = ctx.tp.p if ctx.tp else 1
    ps = sorted({1, 2, 4, 8, p_used})
    table = [capacity(m, kv.b, mem, p, ctx_len, fmts) for p in ps]
    by_p = {r["p"]: r for r in table}
    min_p = next((r["p"] for r in table if r["fits"]), None)
    one = by_p[1]
    params = accounting.total_params(m)
    groups = accounting.weights(m, 1, fmts)
    unknown = [g.group for g in groups if g.fmt.bits_per_weight is None]
    values = {
        "p": p_used,
        "p_source": ctx.tp.source if ctx.tp else "no TP degree known: p = 1 assumed",
        "gpu_memory_gib": round(mem / GiB, 3),
        "gpu_memory_source": mem_source,
        "gpu_memory_utilization": GPU_MEMORY_UTILIZATION,
        "runtime_allowance_gib": RUNTIME_BYTES / GiB,
        "params_estimate": params,
        "weights_from": fmts_how,
        "bytes_per_weight": round(accounting.weight_bytes(m, 1, fmts) / params, 4),
        "weight_groups": [g.row() for g in groups],
        "kv_bytes_per_element": kv.b,
        "kv_element_source": kv.source,
        "kv_layout": accounting.kv_layout(m),
        "context_tokens_required": ctx_len,
        "context_source": "max_position_embeddings" if ctx_len else "unknown (one token required)",
        "min_p_that_fits": min_p,
        "weights_gib_at_p1": one["weights_gib"],
        "kv_tokens_that_fit_at_p1": one["kv_tokens_that_fit"],
        "per_card_goodput_data": "none given: informational",
    }
    notes = [n for n in m.notes if n.startswith(("MoE", "MLA", "tie_word", "intermediate_size"))]
    if unknown:
        notes.append(f"{', '.join(unknown)}: format unknown, counted at 16 bits (an upper bound)")
    if notes:
        values["notes"] = notes
    formula = (
        "M_weight(p) + M_KV(p) + M_runtime ≤ 0.9 × GPU memory; M_weight = Σ_groups params × bits/8 per rank, "
        "M_KV = one context of KV per rank"
    )
    big = sorted(groups, key=lambda g: -g.bytes_per_rank)[:3]
    substituted = (
        f"p=1: {one['weights_gib']:.2f} GiB weights ({params / 1e9:.2f} B params: "
        + ", ".join(f"{g.group} {g.params / 1e9:.3g} B × {g.fmt.bits_per_weight or 16:g} bit" for g in big)
        + f") + {RUNTIME_BYTES / GiB:g} GiB runtime ≤ {one['usable_gib']:.2f} GiB usable leaves KV for "
        f"{one['kv_tokens_that_fit'] or 0:,} tokens ({one['kv_bytes_per_token']:,.0f} B/token, {values['kv_layout']}) "
        f"vs {ctx_len or 1:,} needed ({one['kv_gib_one_context']:.2f} GiB)"
    )
    common = {"formula": formula, "substituted": substituted, "values": values, "table": table}
    if p_used > 1 and one["fits"]:
        return finding(
            RULE,
            **common,
            severity="info",
            confidence="medium",
            impact=0.0,
            title=(
                f"The model fits on one card ({one['weights_gib']:.1f} GiB weights, KV for "
                f"{one['kv_tokens_that_fit'] or 0:,} tokens on {values['gpu_memory_gib']:.0f} GiB) but runs with "
                f"TP={p_used}: compare {p_used} replicas of TP=1 by per-card goodput"
            ),
            evidence=[
                {"rank": None, "ts_ns": None, "name": f"GPU memory {values['gpu_memory_gib']} GiB from {mem_source}"}
            ],
            next_check=(
                f"Benchmark {p_used} TP=1 replicas against TP={p_used} with the same arrival process and SLO; compare "
                "G_card = SLO-meeting output tokens / (time × GPUs). TP is justified if it wins there, or if a TP=1 "
                "replica cannot meet the single-request latency SLO."
            ),
        )
    title, note = _sizing_title(ps, p_used, min_p, one, values["gpu_memory_gib"], ctx_len)
    if note:
        values["note"] = note
    return passed(RULE, **common, confidence="medium", title=title)
