"""KRN005 Decode roofline.

Hypothesis: a decode step cannot be faster than reading its weights and the active sequences' KV once
from memory (nor than its FLOPs at peak); a decode step far above that floor loses its time elsewhere —
launch and host overhead, synchronisation, idle gaps (KRN006), or kernels far from bandwidth.

Formula: floor = max(bytes/BW, FLOPs/peak) per decode step and rank; efficiency = floor / measured decode
t_step (≤ 1; "measured / floor" is its inverse). bytes = W + Σ K: W = weights read at their
format as they run (tracediag.model.accounting: the checkpoint's formats when low-bit kernels ran in decode,
else 16-bit; MoE experts only the expected E·(1 − (1 − k/E)^T) touched, an estimate), K = KV bytes of each
sequence (MLA latent, sliding layers capped at the window, b from the engine log / kernel names / config);
FLOPs = 2·N_active·T + 4·L·(h/p)·D·S·B (N_active: dense groups, k experts per MoE layer, lm_head). BW:
--hbm-bandwidth (a measured, sustained achievable bandwidth is what the floor means; docs/method.md) else
the device properties' spec peak, else the GPU catalogue's datasheet bandwidth for the trace's GPU
(tracediag/catalog/gpus.json), each labelled as such — a spec or datasheet peak makes the floor optimistic and
the efficiency understated. Peak from --peak-tflops, else the catalogue's dense peak for the GEMM activation type
(an upper bound too), else the floor is the byte term alone. Example (docs/method.md): 14 GB of weights at
1 TB/s → 14 ms. Finding when efficiency < 0.3; its impact (what the verdict ranks) is the decode time above the
floor, Σ (t_decode − floor), / the window's step time (analyses/basis.py).

Evidence: per decode step: B, S, bytes, FLOPs, floor and measured time; BW and peak with their source; the
per-group weight table behind W.

What to do: low efficiency → look at the GPU idle share and launch counts inside decode steps (KRN006):
CUDA graphs, fewer host syncs, larger batches; efficiency near 1 → decode is at the memory floor and
only fewer bytes help (W4A16 where weights dominate — KRN004 — or KV quantization).
"""

from __future__ import annotations

from tracediag.analyses import gpu
from tracediag.analyses.basis import window_time
from tracediag.analyses.decode_floor import decode_floors
from tracediag.analyses.kernels import (
    NO_DECODE_STEPS,
    SOURCE_LABEL,
    SPEC_PEAK,
    bandwidth,
    decode_steps,
    kv_cache_dtype,
    median,
    served_formats,
    source_of,
    step_events,
    tp_degree,
)
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model import accounting

RULE = RuleMeta(
    id="KRN005",
    step=5,
    title="Decode step time vs the floor max(bytes/BW, FLOPs/peak)",
    requires_tables=("steps",),
    requires_window="steady",
    requires_model=("L", "H", "I", "h", "H_kv", "D"),
    may_be_downstream_of=("KRN001", "KRN003", "KRN006"),
    enabled_by=("--hbm-bandwidth GB/s",),
)
LOW_EFFICIENCY = 0.3  # floor / measured below this: the step loses most of its time off the roofline
CATALOGUE = "datasheet peak (GPU catalogue)"


def references(ctx: Context) -> tuple[float | None, str, str, float | None, str]:
    """(BW bytes/s, its source, its kind, peak FLOP/s or None, its source): the flags first, then the device
    properties' spec bandwidth, then the GPU catalogue's datasheet figures for the trace's GPU."""
    bw, bw_source = bandwidth(ctx)
    kind = "spec peak (device properties)" if SPEC_PEAK in bw_source else "given (--hbm-bandwidth)"
    if bw is None:
        bw, from_catalogue = gpu.bandwidth(ctx)
        if bw is not None:
            bw_source, kind = from_catalogue, CATALOGUE
        elif "catalogue" in from_catalogue:  # a GPU is named, the catalogue lacks it: say so in the reason
            bw_source = bw_source.replace("; pass --hbm-bandwidth", f"; {from_catalogue}; pass --hbm-bandwidth")
    peak, peak_source = gpu.peak_flops(ctx)
    if peak is None:
        peak_source = "not given: byte term only" + (
            f" ({peak_source}; pass --peak-tflops)" if "catalogue" in peak_source else ""
        )
    return bw, bw_source, kind, peak, peak_source


def _floor_caveats(m, kv_known: bool, eff: float, bw_kind: str, peak_source: str) -> list[str]:
    """What the floor leaves out or overstates here: uncounted KV reads, a measured time under the floor, the
    MoE experts-touched estimate, a catalogue figure taken as the bandwidth or peak."""
    notes = []
    if not kv_known:
        notes.append("KV reads not counted for steps without a known context length S: their floor is low")
    if eff > 1.0:
        notes.append(
            "measured faster than the floor: the bandwidth is above the one used here, or the byte count overcounts "
            "(the MoE experts-touched estimate assumes uniform routing; skewed routing reads fewer experts)"
        )
    if m.moe:
        notes.append("MoE experts read: expected touched E·(1−(1−k/E)^T), an estimate")
    if bw_kind == CATALOGUE or peak_source.startswith("from the GPU catalogue"):
        notes.append(f"BW or peak from the GPU catalogue: {gpu.UPPER_BOUND}")
    return notes


def _slowest_steps(steps: list[dict], table: list[dict]) -> list[dict]:
    """The decode steps as evidence, least efficient first."""
    events = step_events(steps)
    return [
        events[(r["rank"], r["step"])]
        | {
            "floor_ns": round(r["floor_ns"]),
            "step_ns": r["step_ns"],
            "efficiency": round(r["efficiency"], 4),
        }
        for r in sorted(table, key=lambda r: r["efficiency"])
    ]


def check(ctx: Context) -> Check:
    m = ctx.model
    steps = decode_steps(ctx)
    if not steps:
        return not_applicable(RULE, NO_DECODE_STEPS)
    bw, bw_source, bw_kind, peak, peak_source = references(ctx)
    if bw is None:
        return not_applicable(RULE, bw_source)
    p, p_source = tp_degree(ctx)
    kv = kv_cache_dtype(ctx)
    fmts, w_how = served_formats(ctx, "decode")
    source = source_of(ctx)
    c = accounting.kv_bytes_per_token(m, p, kv.b)
    table = decode_floors(ctx, steps, bw, peak, p, kv.b, fmts)
    if not table:
        return not_applicable(RULE, "missing decode step times")
    eff = median([r["efficiency"] for r in table])
    mid = min(table, key=lambda r: abs(r["efficiency"] - eff))
    kv_known = all(r["S"] for r in table)
    values = {
        "bandwidth_bytes_per_s": bw,
        "bandwidth_source": bw_source,
        "bandwidth_kind": bw_kind,
        "peak_flops_per_s": peak,
        "peak_source": peak_source,
        "p": p,
        "p_source": p_source,
        "weights_bytes": mid["weights_bytes"],
        "weights_counted_as": w_how,
        "weight_groups": accounting.decode_reads(m, p, mid["T"], fmts).rows,
        "kv_element_bytes": kv.b,
        "kv_element_source": kv.source,
        "kv_layout": accounting.kv_layout(m),
        "c_bytes_per_token": c,
        "kv_counted": kv_known,
        "time_source": SOURCE_LABEL[source],
        "floor_ns_median": median([r["floor_ns"] for r in table]),
        "step_ns_median": median([r["step_ns"] for r in table]),
        "efficiency_median": eff,
        "decode_steps": len(table),
    }
    notes = _floor_caveats(m, kv_known, eff, bw_kind, peak_source)
    if notes:
        values["note"] = "; ".join(notes)
    formula = "floor = max(bytes/BW, FLOPs/peak), bytes = W + B·K(S); efficiency = floor / t_decode"
    substituted = (
        f"rank {mid['rank']} step {mid['step']}: bytes = {mid['weights_bytes']:,} + {mid['kv_bytes']:,} = "
        f"{mid['bytes']:,} B → {mid['t_bytes_ns'] / 1e6:.3g} ms at {bw / 1e9:.4g} GB/s"
        + (f"; FLOPs {mid['flops']:.3g} → {mid['t_flops_ns'] / 1e6:.3g} ms" if mid["t_flops_ns"] else "")
        + f"; floor {mid['floor_ns'] / 1e6:.3g} ms / measured {mid['step_ns'] / 1e6:.3g} ms = {mid['efficiency']:.3f}"
    )
    evidence = _slowest_steps(steps, table)[: ctx.settings.max_evidence]
    if eff < LOW_EFFICIENCY:
        # ranked on the window's time like every trace-side finding: the decode time above the floor
        wt = window_time(ctx)
        above = sum(max(0.0, r["step_ns"] - r["floor_ns"]) for r in table)
        values |= {"decode_ns_above_floor": round(above)} | wt.values(above)
        substituted += f"; impact (Σ decode time above the floor) {wt.text(above)}"
        return finding(
            RULE,
            severity="warning",
            confidence="high" if kv_known else "medium",
            impact=wt.share(above),
            impact_basis=wt.basis,
            title=(
                f"Decode steps run at {eff:.1%} of their memory floor: {values['step_ns_median'] / 1e6:.3g} ms "
                f"measured vs {values['floor_ns_median'] / 1e6:.3g} ms floor at {bw / 1e9:.4g} GB/s "
                f"({values['bandwidth_kind']})"
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
            f"Decode steps at {eff:.0%} of their memory floor ({values['step_ns_median'] / 1e6:.3g} ms measured vs "
            f"{values['floor_ns_median'] / 1e6:.3g} ms floor at {bw / 1e9:.4g} GB/s, {values['bandwidth_kind']})"
        ),
        formula=formula,
        substituted=substituted,
        values=values,
        table=table,
        evidence=evidence,
    )
