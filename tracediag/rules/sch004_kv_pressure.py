"""SCH004 KV pressure & preemption.

Hypothesis: when the KV cache is nearly full, the scheduler cannot admit waiting requests and preempts
running ones (V0 swaps or recomputes them, V1 recomputes): work is redone and latency jumps. KV usage
near 100 % with preemptions rising means KV capacity, not compute, limits the batch.

Formula: per-token KV bytes 2·L·H_kv·D·b (KV heads, not attention heads; 4-bit weights do not make the KV
4-bit); token capacity floor((M_total − weights − runtime − margin) / per-token); paged tail waste
< A·(B−1) tokens for A active sequences of block size B. Thresholds: KV usage ≥ 90 % is high,
≥ 95 % with requests waiting is admission limited by KV; any preemption is a finding.

Evidence: vLLM stats lines (GPU KV cache usage, V1 Preemptions, V0 Swapped/Pending), V0 preemption
warnings (total_num_cumulative_preemption), /metrics kv_cache_usage_perc (gpu_cache_usage_perc before
0.10) and num_preemptions; with a model config and the engine's reported KV size, the bytes per token,
capacity and tail-waste bound.

What to do: shorter contexts or max_tokens, fewer concurrent sequences (max_num_seqs), KV-cache
quantization (kv_cache_dtype fp8), more memory per replica (gpu_memory_utilization, larger TP), or more
replicas.
"""

from __future__ import annotations

from tracediag.engine import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model.servingmath import kv_bytes_per_token, paged_tail_waste_bound
from tracediag.rules._serving import (
    input_paths,
    log_evidence,
    log_series,
    metric_series,
    series_evidence,
    short,
    startup_facts,
)

RULE = RuleMeta(id="SCH004", step=6, title="KV cache has headroom and no request is preempted")
HIGH_PCT = 90.0
FULL_PCT = 95.0
FORMULA = "KV usage ≥ 90 % high; ≥ 95 % with Waiting > 0 limits admission; preemptions > 0 redo work"


def _capacity(ctx: Context) -> dict:
    """Bytes per token and the engine's reported capacity, when a model config and startup facts exist."""
    m = ctx.model
    out: dict = {}
    if m is None or m.missing("L", "H_kv", "D"):
        return out
    facts = next(iter(startup_facts(ctx).values()), {})
    p = int((facts.get("tensor_parallel_size") or {}).get("value_num") or (ctx.tp.p if ctx.tp else 1))
    kv_dtype = (facts.get("kv_cache_dtype") or {}).get("value", "auto")
    b = 1 if "fp8" in str(kv_dtype) else (m.dtype_bytes or 2)
    out["kv_bytes_per_token"] = kv_bytes_per_token(m.L, m.H_kv, m.D, b)
    out["kv_bytes_per_token_per_rank"] = kv_bytes_per_token(m.L, m.H_kv, m.D, b, p=p)
    tokens = (facts.get("kv_cache_tokens") or {}).get("value_num")
    blocks = (facts.get("num_gpu_blocks") or {}).get("value_num")
    if tokens:
        out["capacity_tokens"] = int(tokens)
    if tokens and blocks:
        out["block_size"] = round(tokens / blocks)
    return out


def check(ctx: Context) -> Check:
    paths = input_paths(ctx)
    kv_logs = [s for s in log_series(ctx, "kv_usage_pct") if any(p["value"] is not None for p in s.points)]
    kv_metrics = metric_series(ctx, "kv_usage")
    if not kv_logs and not kv_metrics:
        return not_applicable(RULE, "missing KV-cache usage: no vLLM stats lines and no kv_cache_usage_perc metric")
    table, evidence = [], []
    kv_max, full_waiting, high = 0.0, [], []
    for s in kv_logs:
        for p in s.points:
            if p["value"] is None:
                continue
            kv_max = max(kv_max, p["value"])
            if p["value"] >= FULL_PCT and (p["waiting"] or 0) > 0:
                full_waiting.append((s, p))
            if p["value"] >= HIGH_PCT:
                high.append((s, p))
    for s in kv_metrics:
        for p in s.points:
            pct = (p["value"] or 0) * 100  # vLLM exposes a fraction 0-1
            kv_max = max(kv_max, pct)
            if pct >= HIGH_PCT:
                high.append((s, {**p, "value": pct}))
    # preemptions: V1 per-interval counts, V0 swapped requests and warnings, /metrics counters
    v1 = ctx.rows("SELECT input_id, line, ts_text, t_s, preemptions FROM serving_stats WHERE preemptions > 0")
    swapped = ctx.rows("SELECT input_id, line, ts_text, t_s, swapped FROM serving_stats WHERE swapped > 0 ORDER BY t_s")
    warn = ctx.rows(
        "SELECT input_id, line, ts_text, t_s, cumulative, mode, seq_group FROM serving_events "
        "WHERE kind = 'preemption' ORDER BY input_id, t_s"
    )
    counters = [s for s in metric_series(ctx, "preemptions") if s.points]
    n_v1 = sum(r["preemptions"] for r in v1)
    n_warn = max((r["cumulative"] or 0 for r in warn), default=0) or len(warn)
    n_metric = sum(max(p["value"] or 0 for p in s.points) for s in counters)
    max_swapped = max((r["swapped"] for r in swapped), default=0)
    preempted = n_v1 + n_warn + n_metric
    for s in kv_logs + kv_metrics:
        _, ys = s.xy()
        ys = [y * 100 for y in ys] if s.source == "metrics" else ys
        table.append(
            {
                "series": s.label,
                "samples": len(ys),
                "kv_max_pct": max(ys, default=None),
                "kv_last_pct": ys[-1] if ys else None,
            }
        )
    values = {
        "kv_usage_max_pct": round(kv_max, 3),
        "high_threshold_pct": HIGH_PCT,
        "full_threshold_pct": FULL_PCT,
        "preemptions_v1_intervals": n_v1,
        "preemptions_v0_cumulative": n_warn,
        "preemptions_metric_total": n_metric,
        "swapped_max": max_swapped,
        "samples_full_with_waiting": len(full_waiting),
    } | _capacity(ctx)
    if values.get("block_size") and kv_logs:
        a = max((p["running"] or 0 for s in kv_logs for p in s.points), default=0)
        values["tail_waste_bound_tokens"] = paged_tail_waste_bound(a, values["block_size"])
        values["active_sequences_max"] = a
    for r in warn[:2]:
        evidence.append(log_evidence(paths[r["input_id"]], r, "preemption warning", value=r["cumulative"]))
    for r in swapped[:2]:
        evidence.append(log_evidence(paths[r["input_id"]], r, "stats line (Swapped)", value=r["swapped"]))
    for r in v1[:2]:
        evidence.append(log_evidence(paths[r["input_id"]], r, "stats line (Preemptions)", value=r["preemptions"]))
    for s, p in (full_waiting or high)[:3]:
        evidence.append(series_evidence(s, p, "KV usage sample (%)", value=p["value"]))
    evidence = evidence[: ctx.settings.max_evidence]
    formula = FORMULA
    substituted = (
        f"max KV usage {kv_max:.1f} %, preemptions {preempted:g} (V1 {n_v1}, V0 {n_warn}, metrics {n_metric:g}), "
        f"max swapped {max_swapped}, {len(full_waiting)} samples ≥ {FULL_PCT:g} % with requests waiting"
    )
    if "kv_bytes_per_token" in values:
        substituted += f"; per-token KV = 2·L·H_kv·D·b = {values['kv_bytes_per_token']:,.0f} B"
    nxt = (
        "Shorten contexts or max_tokens, lower max_num_seqs, quantize the KV cache (kv_cache_dtype=fp8), or give "
        "each replica more KV memory (gpu_memory_utilization, larger TP) or add replicas; check SCH005 for the "
        "capacity the engine actually got."
    )
    if preempted > 0 or max_swapped > 0:
        return finding(
            RULE,
            severity="warning",
            confidence="high",
            impact=min(1.0, kv_max / 100),
            formula=formula,
            substituted=substituted,
            values=values,
            table=table,
            evidence=evidence,
            next_check=nxt,
            title=(
                f"KV cache full and requests preempted: {preempted:g} preemptions"
                + (f", {max_swapped} swapped" if max_swapped else "")
                + f" at up to {kv_max:.1f} % KV usage"
            ),
        )
    if full_waiting:
        s, p = full_waiting[0]
        return finding(
            RULE,
            severity="warning",
            confidence="high",
            impact=len(full_waiting) / max(1, sum(len(s.points) for s in kv_logs)),
            formula=formula,
            substituted=substituted,
            values=values,
            table=table,
            evidence=evidence,
            next_check=nxt,
            title=(
                f"KV cache limits admission: {kv_max:.1f} % used while {p['waiting']} requests wait "
                f"({len(full_waiting)} samples ≥ {FULL_PCT:g} % with a queue, {short(s.path)})"
            ),
        )
    if high:
        return finding(
            RULE,
            severity="info",
            confidence="medium",
            impact=kv_max / 100,
            formula=formula,
            substituted=substituted,
            values=values,
            table=table,
            evidence=evidence,
            next_check="Watch for preemptions as load grows; " + nxt,
            title=f"KV cache usage high: up to {kv_max:.1f} % (no preemption, no request waiting yet)",
        )
    return passed(
        RULE,
        confidence="high",
        formula=formula,
        substituted=substituted,
        values=values,
        table=table,
        evidence=evidence,
        title=f"KV cache has headroom: max usage {kv_max:.1f} %, no preemption",
    )
