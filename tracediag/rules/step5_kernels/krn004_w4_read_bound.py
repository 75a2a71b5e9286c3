"""KRN004 What 4-bit weights can buy in decode.

Hypothesis: a decode step reads the weights once and every active sequence's KV history; 4-bit weights
shrink only the first term, and only for the groups not already at 4 bits. When the KV term dominates
(long contexts, many sequences), or the weights that matter are already 4-bit (MXFP4 / NVFP4 / AWQ experts),
weight quantization cannot speed decode steps much, whatever the kernel.

Formula: read bytes ≈ W + B·K per decode step and rank (tracediag.model.accounting): W = weights read at
their format as served (attention, dense MLP, shared experts, router, lm_head in full; MoE experts only the
expected E·(1 − (1 − k/E)^T) touched by the step's T tokens — an estimate, exact only for uniform independent
routing); K = KV bytes of one sequence of S tokens (2·ceil(H_kv/p)·D·b per full layer, sliding layers capped at
their window, MLA one latent of kv_lora_rank + qk_rope_head_dim), b the KV element bytes (engine log, FP8-KV
kernel name or config; 4-bit weights do not make the KV 4-bit). W4 = the same reads with every 16-bit
projection group at 4 bits + one 16-bit scale per G (docs/method.md: (1 − f) + f/4 + f/G, f = 0.9, G = 128 → 0.332);
groups already ≤ 4.5 bits stay. S_read = (W + B·K) / (W4 + B·K). Each branch checks its own premise:
"already 4-bit" is decided per module group (attention, dense MLP, MoE experts, embeddings/lm_head;
accounting.four_bit_groups): the 4-bit groups (≤ 5 bits per weight with scales: MXFP4, NVFP4, AWQ/GPTQ) hold
at least half of the projection parameters, or W4 is within 5 % of W — a pass, no 4-bit saving offered for
them (MXFP4 experts beside bf16 attention are 4-bit weights). Finding when S_read ≤ 1.25 and KV traffic
actually dominates: B·K ≥ half of the decode reads (K with sliding layers capped at their window and MLA
latents); S_read ≤ 1.25 with less KV is a pass naming the groups 4-bit leaves as they are (lm_head, router). The
finding's impact (what the verdict ranks) is the decode time of the KV reads, Σ step time · KV share of its reads,
over the window's step time (analyses/basis.py); the KV share of the reads judges it and is shown beside it.

Evidence: per decode step: B active sequences and S tokens of KV each (from the attention op's key shape or
the vLLM annotation, with the source named), K, W, W4, S_read; the per-group byte table behind W.

What to do: when KV dominates, weight quantization is the wrong lever for decode speed: reduce KV bytes
(KV-cache quantization, fewer/shorter contexts per step, GQA/MLA models) or accept it; when 16-bit weights
dominate, W4A16 (with fused kernels, KRN003) can cut decode reads by up to S_read.
"""

from __future__ import annotations

from tracediag.analyses.basis import WindowTime, window_time
from tracediag.analyses.kernels import (
    NO_DECODE_STEPS,
    decode_steps,
    kv_cache_dtype,
    median,
    served_formats,
    step_events,
    tp_degree,
    w16_formats,
)
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model import accounting

RULE = RuleMeta(
    id="KRN004",
    step=5,
    title="Decode read traffic: what 4-bit weights can buy, S_read = (W + B·K)/(W4 + B·K)",
    requires_tables=("steps",),
    requires_model=("L", "H", "I", "h", "H_kv", "D"),
    may_be_downstream_of=("SHP001", "SHP002", "SHP003"),
)
KV_DOMINATES = 1.25  # S_read at or below this: weight quantization buys ≤ 25 % of decode reads
KV_SHARE_DOMINATES = 0.5  # ... and KV is "dominant" only when it is at least half of the decode reads
PROJECTION_GROUPS = accounting.QUANTIZABLE_GROUPS  # what 4-bit quantization covers
ALREADY_4BIT = 0.05  # W4 within 5 % of W: the weights that matter are 4-bit already
FOUR_BIT_SHARE = 0.5  # ... or the 4-bit groups hold at least half of the projection parameters


def s_read(w16: float, w4: float, bk: float) -> float:
    return (w16 + bk) / (w4 + bk)


def four_bit_share(groups: list[dict]) -> float:
    """Share of the projection parameters (accounting.four_bit_groups) held by 4-bit groups."""
    return sum(g["share_of_projection_params"] or 0.0 for g in groups if g["quantizable"] and g["four_bit"])


def verdict(sr: float, kv_share: float, w4_over_w: float, groups: list[dict]) -> str:
    """'already_4bit', 'kv_dominates', 'unquantizable_dominate' (S_read ≤ 1.25 without a KV majority: the groups
    4-bit leaves as served hold the reads) or 'weights_dominate' — each branch checks its own premise."""
    if 1 - w4_over_w < ALREADY_4BIT or four_bit_share(groups) >= FOUR_BIT_SHARE:
        return "already_4bit"
    if sr <= KV_DOMINATES:
        return "kv_dominates" if kv_share >= KV_SHARE_DOMINATES else "unquantizable_dominate"
    return "weights_dominate"


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
    p, p_source = tp_degree(ctx)
    kv = kv_cache_dtype(ctx)
    served, served_how = served_formats(ctx, "decode")
    w4_fmts, G, G_source = accounting.hypothetical_w4(m)
    c = accounting.kv_bytes_per_token(m, p, kv.b)
    step_ns = {
        (r["rank"], r["step_id"]): r["step_ns"]
        for r in ctx.rows("SELECT rank, step_id, step_ns FROM step_activity WHERE phase = 'decode'")
    }
    table = []
    for s in known:
        T = s["T"] or s["B"]
        W = accounting.decode_reads(m, p, T, served).total
        W16 = accounting.decode_reads(m, p, T, w16_formats(m)).total
        W4 = accounting.decode_reads(m, p, T, w4_fmts).total
        K = accounting.kv_bytes(m, p, kv.b, s["S"])
        bk = s["B"] * K
        table.append(
            {
                "rank": s["rank"],
                "step": s["step_id"],
                "B": s["B"],
                "S": s["S"],
                "T": T,
                "K_bytes": round(K),
                "BK_bytes": round(bk),
                "W_bytes": round(W),
                "W16_bytes": round(W16),
                "W4_bytes": round(W4),
                "S_read": s_read(W, W4, bk),
                "kv_share_of_reads": bk / (W + bk),
                "step_ns": step_ns.get((s["rank"], s["step_id"])),
            }
        )
    sr = median([t["S_read"] for t in table])
    mid = min(table, key=lambda t: abs(t["S_read"] - sr))
    reads = accounting.decode_reads(m, p, mid["T"], served)
    values = {
        "p": p,
        "p_source": p_source,
        "b": kv.b,
        "b_source": kv.source,
        "kv_layout": accounting.kv_layout(m),
        "c_bytes_per_token": c,
        "W_bytes": mid["W_bytes"],
        "W_counted_as": served_how,
        "W16_bytes": mid["W16_bytes"],
        "W4_bytes": mid["W4_bytes"],
        "W4_over_W": mid["W4_bytes"] / mid["W_bytes"],
        "f": sum(r["bytes_read"] for r in reads.rows if r["group"] in PROJECTION_GROUPS) / mid["W_bytes"],
        "G": G,
        "G_source": G_source,
        "experts_touched_per_moe_layer": reads.experts_touched,
        "experts_touched_note": (
            "estimate E·(1−(1−k/E)^T) for uniform independent routing; skewed routing touches fewer" if m.moe else None
        ),
        "weight_groups": reads.rows,
        "B_median": median([t["B"] for t in table]),
        "S_median": median([t["S"] for t in table]),
        "B_source": known[0]["B_source"],
        "S_source": known[0]["S_source"],
        "S_read_median": sr,
        "kv_share_median": median([t["kv_share_of_reads"] for t in table]),
        "decode_steps": len(steps),
        "decode_steps_with_S": len(known),
    }
    formula = "S_read = (W + B·K) / (W4 + B·K), K = KV bytes of one sequence of S tokens"
    moe = (
        f"; experts: {reads.experts_touched:.1f} of {m.moe.experts} touched per MoE layer at T = {mid['T']:g} "
        "(estimate)"
        if m.moe
        else ""
    )
    substituted = (
        f"rank {mid['rank']} step {mid['step']}: W = {mid['W_bytes']:,} B{moe}; B·K = {mid['B']}·{mid['K_bytes']:,} = "
        f"{mid['BK_bytes']:,} B ({values['kv_layout']}, b = {kv.b:g}); S_read = ({mid['W_bytes']:,} + "
        f"{mid['BK_bytes']:,}) / ({mid['W4_bytes']:,} + {mid['BK_bytes']:,}) = {mid['S_read']:.3f}"
    )
    events = step_events(steps)
    evidence = [
        events[(t["rank"], t["step"])] | {"B": t["B"], "S": t["S"], "S_read": round(t["S_read"], 4)} for t in table
    ][: ctx.settings.max_evidence]
    common = {"formula": formula, "substituted": substituted, "values": values, "table": table, "evidence": evidence}
    groups = accounting.four_bit_groups(m, p, served)
    return _judge(groups, reads, mid, sr, known[0]["S_source"], common | {"window": window_time(ctx)})


def _kv_time(common: dict, wt: WindowTime) -> dict:
    """The finding's impact on the window's time: the decode time of the KV reads, Σ step time · KV share of its
    reads (both paths bandwidth-bound, the rule's own premise); the KV share of the reads judges it."""
    kv_ns = sum((t["step_ns"] or 0) * t["kv_share_of_reads"] for t in common["table"])
    common["values"] |= {"decode_kv_read_ns": round(kv_ns)} | wt.values(kv_ns)
    common["substituted"] += f"; impact (Σ decode step time · KV share of its reads) {wt.text(kv_ns)}"
    return {"impact": wt.share(kv_ns), "impact_basis": wt.basis}


def _judge(groups: list[dict], reads: accounting.StepReads, mid: dict, sr: float, s_source, common: dict) -> Check:
    wt = common.pop("window")
    values = common["values"]
    kv_pct = values["kv_share_median"]
    values["module_groups"] = groups
    values["four_bit_share_of_projection_params"] = four_bit_share(groups)
    kind = verdict(sr, kv_pct, values["W4_over_W"], groups)
    values["verdict"] = kind
    if kind == "already_4bit":
        four = [g["group"] for g in groups if g["four_bit"]]
        rest = [f"{g['group']} {g['format']}" for g in groups if g["quantizable"] and not g["four_bit"]]
        big = max(reads.rows, key=lambda r: r["bytes_read"])
        return passed(
            RULE,
            confidence="high",
            title=(
                f"No 4-bit saving left: {', '.join(four) or 'the weights'} already run 4-bit "
                f"({values['four_bit_share_of_projection_params']:.0%} of the projection weights"
                + (f"; {', '.join(rest)} as the checkpoint serves them" if rest else "")
                + f"; {big['group']} {big['format']} is {big['bytes_read'] / mid['W_bytes']:.0%} of weight reads); "
                f"KV {kv_pct:.0%} of decode reads (B = {values['B_median']:g}, S = {values['S_median']:g})"
            ),
            **common,
        )
    if kind == "unquantizable_dominate":
        kept = [r["group"] for r in reads.rows if r["group"] not in PROJECTION_GROUPS and r["bytes_read"] > 0]
        return passed(
            RULE,
            confidence="high",
            title=(
                f"4-bit projection weights would cut decode reads only {sr:.2f}×: "
                f"{', '.join(kept) or 'groups 4-bit leaves as served'} and KV ({kv_pct:.0%} of reads, not a "
                f"majority) stay (B = {values['B_median']:g}, S = {values['S_median']:g})"
            ),
            **common,
        )
    if kind == "kv_dominates":
        return finding(
            RULE,
            severity="info",
            confidence="high" if s_source else "medium",
            **_kv_time(common, wt),
            title=(
                f"Weight quantization cannot speed these decode steps much: KV traffic dominates "
                f"({kv_pct:.0%} of reads), S_read = {sr:.2f} "
                f"(B = {values['B_median']:g} sequences × S = {values['S_median']:g} tokens)"
            ),
            next_check=(
                "Cut KV bytes instead: KV-cache quantization, fewer or shorter contexts per step, a GQA/MLA model; "
                "4-bit weights still save memory (more sequences fit) but not decode time."
            ),
            **common,
        )
    sixteen = [r["group"] for r in reads.rows if r["bits_per_weight"] > 5 and r["bytes_read"] > 0.05 * mid["W_bytes"]]
    return passed(
        RULE,
        confidence="high",
        title=(
            f"16-bit weights dominate decode reads ({', '.join(sixteen)}): 4-bit weights could cut them up to "
            f"{sr:.2f}× (KV {kv_pct:.0%} of reads, B = {values['B_median']:g}, S = {values['S_median']:g})"
        ),
        **common,
    )
