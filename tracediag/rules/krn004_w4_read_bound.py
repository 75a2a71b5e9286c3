"""KRN004 What 4-bit weights can buy in decode.

Hypothesis: a decode step reads the weights once and every active sequence's KV history; 4-bit
weights shrink only the first term. When the KV term dominates (long contexts, many sequences),
weight quantization cannot speed decode steps much, whatever the kernel.

Formula: read bytes ≈ W + B·K per decode step and rank, K = S·c, c = 2·L·H_kv·D·b (KV heads held by
the rank, b bytes per KV element = the activation dtype: 4-bit weights do not make the KV 4-bit);
S_read = (W16 + B·K) / (W4 + B·K), W4/W16 ≈ (1 − f) + f/4 + f/G (f quantized share, G group size;
seed: f = 0.9, G = 128 → 0.332). Finding when S_read ≤ 1.25: KV traffic dominates.

Evidence: per decode step: B active sequences and S tokens of KV each (from the attention op's key
shape or the vLLM annotation, with the source named), K, W16, W4, S_read.

What to do: when KV dominates, weight quantization is the wrong lever for decode speed: reduce KV
bytes (KV-cache quantization, fewer/shorter contexts per step, GQA/MLA models) or accept it; when
weights dominate, W4A16 (with fused kernels, KRN003) can cut decode reads by up to S_read.
"""

from __future__ import annotations

from tracediag.engine import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.rules._kernels import NO_DECODE_STEPS, decode_reads, decode_steps, median, step_events

RULE = RuleMeta(
    id="KRN004",
    step=5,
    title="Decode read traffic: what 4-bit weights can buy, S_read = (W16 + B·K)/(W4 + B·K)",
    requires_tables=("steps",),
    requires_model=("L", "H", "I", "h", "H_kv", "D"),
    may_be_downstream_of=("SHP001", "SHP002"),
)
KV_DOMINATES = 1.25  # S_read at or below this: weight quantization buys ≤ 25 % of decode reads


def s_read(w16: float, w4: float, bk: float) -> float:
    return (w16 + bk) / (w4 + bk)


def check(ctx: Context) -> Check:
    m = ctx.model
    steps = decode_steps(ctx)
    if not steps:
        return not_applicable(RULE, NO_DECODE_STEPS)
    known = [s for s in steps if s["S"] and s["B"]]
    if not known:
        return not_applicable(
            RULE,
            "missing context length S of the decode steps: no aten::scaled_dot_product_attention with recorded "
            "key shapes and no vLLM annotation carrying KV lengths",
        )
    reads = decode_reads(ctx)
    p, p_source, b, w, c = reads.p, reads.p_source, reads.b, reads.w, reads.c
    table = []
    for s in known:
        bk = s["B"] * s["S"] * c
        table.append(
            {
                "rank": s["rank"],
                "step": s["step_id"],
                "B": s["B"],
                "S": s["S"],
                "K_bytes": round(s["S"] * c),
                "BK_bytes": round(bk),
                "W16_bytes": w["W16_bytes"],
                "W4_bytes": w["W4_bytes"],
                "S_read": s_read(w["W16_bytes"], w["W4_bytes"], bk),
                "kv_share_of_W16_reads": bk / (w["W16_bytes"] + bk),
            }
        )
    sr = median([t["S_read"] for t in table])
    mid = min(table, key=lambda t: abs(t["S_read"] - sr))
    values = {
        "p": p,
        "p_source": p_source,
        "b": b,
        "b_source": f"activation dtype {m.dtype}"
        if m.dtype_bytes
        else "assumed 2 bytes (no torch_dtype in the config)",
        "c_bytes_per_token": c,
        "W16_bytes": w["W16_bytes"],
        "W4_bytes": w["W4_bytes"],
        "W4_over_W16": w["ratio"],
        "f": w["quantized_share_f"],
        "G": w["G"],
        "G_source": w["G_source"],
        "B_median": median([t["B"] for t in table]),
        "S_median": median([t["S"] for t in table]),
        "B_source": known[0]["B_source"],
        "S_source": known[0]["S_source"],
        "S_read_median": sr,
        "kv_share_median": median([t["kv_share_of_W16_reads"] for t in table]),
        "decode_steps": len(steps),
        "decode_steps_with_S": len(known),
    }
    formula = "S_read = (W16 + B·K) / (W4 + B·K), K = S·c, c = 2·L·H_kv·D·b"
    substituted = (
        f"c = 2·{m.L}·{c // (2 * m.L * m.D * b)}·{m.D}·{b} = {c:,} B/token; e.g. rank {mid['rank']} step "
        f"{mid['step']}: B·K = {mid['B']}·{mid['S']:g}·{c:,} = {mid['BK_bytes']:,} B; "
        f"S_read = ({w['W16_bytes']:,} + {mid['BK_bytes']:,}) / ({w['W4_bytes']:,} + {mid['BK_bytes']:,}) "
        f"= {mid['S_read']:.3f}"
    )
    events = step_events(steps)
    evidence = [
        events[(t["rank"], t["step"])] | {"B": t["B"], "S": t["S"], "S_read": round(t["S_read"], 4)} for t in table
    ][: ctx.settings.max_evidence]
    if sr <= KV_DOMINATES:
        return finding(
            RULE,
            severity="info",
            confidence="high" if known[0]["S_source"] else "medium",
            impact=values["kv_share_median"],
            title=(
                f"Weight quantization cannot speed these decode steps much: KV traffic dominates "
                f"({values['kv_share_median']:.0%} of 16-bit reads), S_read = {sr:.2f} "
                f"(B = {values['B_median']:g} sequences × S = {values['S_median']:g} tokens)"
            ),
            formula=formula,
            substituted=substituted,
            values=values,
            table=table,
            evidence=evidence,
            next_check=(
                "Cut KV bytes instead: KV-cache quantization, fewer or shorter contexts per step, a GQA/MLA model; "
                "4-bit weights still save memory (more sequences fit) but not decode time."
            ),
        )
    return passed(
        RULE,
        confidence="high",
        title=(
            f"Weights dominate decode reads: 4-bit weights could cut them up to {sr:.2f}× "
            f"(KV {values['kv_share_median']:.0%} of 16-bit reads, B = {values['B_median']:g}, "
            f"S = {values['S_median']:g})"
        ),
        formula=formula,
        substituted=substituted,
        values=values,
        table=table,
        evidence=evidence,
    )
