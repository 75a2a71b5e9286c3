"""KRN005 Decode roofline.

Hypothesis: a decode step cannot be faster than reading its weights and the active sequences' KV once
from memory (nor than its FLOPs at peak); a decode step far above that floor loses its time elsewhere —
launch and host overhead, synchronisation, idle gaps (KRN006), or kernels far from bandwidth.

Formula: floor = max(bytes/BW, FLOPs/peak) per decode step and rank, bytes = W + B·S·c (W: weights as
they run — 4-bit when W4A16 kernels ran in decode, else the config dtype; c = 2·L·H_kv·D·b),
FLOPs = 2·N_params·T + 4·L·(h/p)·D·S·B; efficiency = floor / measured decode t_step (median).
Seed: 14 GB of weights at 1 TB/s → 14 ms. BW from the device properties, else --hbm-bandwidth;
peak from --peak-tflops (else the floor is the byte term alone). Finding when efficiency < 0.3.

Evidence: per decode step: B, S, bytes, FLOPs, floor and measured time; BW and peak with their source.

What to do: low efficiency → look at the GPU idle share and launch counts inside decode steps (KRN006):
CUDA graphs, fewer host syncs, larger batches; efficiency near 1 → decode is at the memory floor and
only fewer bytes help (W4A16 where weights dominate — KRN004 — or KV quantization).
"""

from __future__ import annotations

from tracediag.engine import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.rules._kernels import (
    NO_DECODE_STEPS,
    SOURCE_LABEL,
    bandwidth,
    decode_reads,
    decode_steps,
    median,
    source_of,
    step_events,
    weight_params,
)

RULE = RuleMeta(
    id="KRN005",
    step=5,
    title="Decode step time vs the floor max(bytes/BW, FLOPs/peak)",
    requires_tables=("steps",),
    requires_model=("L", "H", "I", "h", "H_kv", "D"),
    may_be_downstream_of=("KRN001", "KRN003", "KRN006"),
)
LOW_EFFICIENCY = 0.3  # floor / measured below this: the step loses most of its time off the roofline


def check(ctx: Context) -> Check:
    m = ctx.model
    steps = decode_steps(ctx)
    if not steps:
        return not_applicable(RULE, NO_DECODE_STEPS)
    bw, bw_source = bandwidth(ctx)
    if bw is None:
        return not_applicable(RULE, bw_source)
    reads = decode_reads(ctx)
    p, p_source, dtype_b, w, c = reads.p, reads.p_source, reads.b, reads.w, reads.c
    source = source_of(ctx)
    params = weight_params(m, p)
    n_params = params["projections"] + params["lm_head"]
    w4_in_decode = ctx.scalar("SELECT count(*) FROM kernel_steps WHERE phase = 'decode' AND klass = 'wo_gemm'")
    if w4_in_decode:
        w_bytes, w_how = w["W4_bytes"], "W4 (W4A16 kernels ran in decode)"
    else:
        w_bytes, w_how = n_params * dtype_b, f"all projection + lm_head weights at {dtype_b} B ({m.dtype or 'assumed'})"
    peak = ctx.settings.peak_tflops * 1e12 if ctx.settings.peak_tflops else None
    measured = {
        (r["rank"], r["step_id"]): r["step_ns"]
        for r in ctx.rows("SELECT rank, step_id, step_ns FROM step_activity WHERE phase = 'decode'")
    }
    table = []
    for s in steps:
        t = measured.get((s["rank"], s["step_id"]))
        if not t:
            continue
        kv = s["B"] * s["S"] * c if s["S"] else 0
        bytes_ = w_bytes + kv
        flops = 2 * n_params * (s["T"] or s["B"] or 1) + (4 * m.L * (m.h // p) * m.D * s["S"] * s["B"] if s["S"] else 0)
        t_bytes = bytes_ / bw * 1e9
        t_flops = flops / peak * 1e9 if peak else None
        floor = max(t_bytes, t_flops or 0.0)
        table.append(
            {
                "rank": s["rank"],
                "step": s["step_id"],
                "B": s["B"],
                "S": s["S"],
                "bytes": round(bytes_),
                "flops": flops,
                "t_bytes_ns": t_bytes,
                "t_flops_ns": t_flops,
                "floor_ns": floor,
                "step_ns": t,
                "efficiency": floor / t,
            }
        )
    if not table:
        return not_applicable(RULE, "missing decode step times")
    eff = median([r["efficiency"] for r in table])
    mid = min(table, key=lambda r: abs(r["efficiency"] - eff))
    kv_known = all(r["S"] for r in table)
    values = {
        "bandwidth_bytes_per_s": bw,
        "bandwidth_source": bw_source,
        "peak_flops_per_s": peak,
        "peak_source": f"--peak-tflops {ctx.settings.peak_tflops:g}" if peak else "not given: byte term only",
        "p": p,
        "p_source": p_source,
        "weights_bytes": w_bytes,
        "weights_counted_as": w_how,
        "c_bytes_per_token": c,
        "kv_counted": kv_known,
        "time_source": SOURCE_LABEL[source],
        "floor_ns_median": median([r["floor_ns"] for r in table]),
        "step_ns_median": median([r["step_ns"] for r in table]),
        "efficiency_median": eff,
        "decode_steps": len(table),
    }
    if not kv_known:
        values["note"] = "KV reads not counted for steps without a known context length S: their floor is low"
    formula = "floor = max(bytes/BW, FLOPs/peak), bytes = W + B·S·c; efficiency = floor / t_decode"
    substituted = (
        f"rank {mid['rank']} step {mid['step']}: bytes = {w_bytes:,} + {mid['B']}·{mid['S'] or 0:g}·{c:,} = "
        f"{mid['bytes']:,} B → {mid['t_bytes_ns'] / 1e6:.3g} ms at {bw / 1e9:.4g} GB/s"
        + (f"; FLOPs {mid['flops']:.3g} → {mid['t_flops_ns'] / 1e6:.3g} ms" if mid["t_flops_ns"] else "")
        + f"; floor {mid['floor_ns'] / 1e6:.3g} ms / measured {mid['step_ns'] / 1e6:.3g} ms = {mid['efficiency']:.3f}"
    )
    events = step_events(steps)
    evidence = [
        events[(r["rank"], r["step"])]
        | {
            "floor_ns": round(r["floor_ns"]),
            "step_ns": r["step_ns"],
            "efficiency": round(r["efficiency"], 4),
        }
        for r in sorted(table, key=lambda r: r["efficiency"])
    ][: ctx.settings.max_evidence]
    if eff < LOW_EFFICIENCY:
        return finding(
            RULE,
            severity="warning",
            confidence="high" if kv_known else "medium",
            impact=1.0 - eff,
            title=(
                f"Decode steps run at {eff:.1%} of their memory floor: {values['step_ns_median'] / 1e6:.3g} ms "
                f"measured vs {values['floor_ns_median'] / 1e6:.3g} ms floor"
            ),
            formula=formula,
            substituted=substituted,
            values=values,
            table=table,
            evidence=evidence,
            next_check=(
                "The time is not in reading bytes: check the GPU idle share, launch count and host syncs inside "
                "decode steps (KRN006) — CUDA graphs, fewer synchronisations, larger batches."
            ),
        )
    return passed(
        RULE,
        confidence="high" if kv_known else "medium",
        title=(
            f"Decode steps near their floor: {eff:.0%} efficiency ({values['step_ns_median'] / 1e6:.3g} ms vs "
            f"{values['floor_ns_median'] / 1e6:.3g} ms floor)"
        ),
        formula=formula,
        substituted=substituted,
        values=values,
        table=table,
        evidence=evidence,
    )
