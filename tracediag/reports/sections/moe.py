"""Mixture of experts: experts per layer and their format, the routing and expert-GEMM kernels with their share
of step time, the expected experts a decode step touches, and — where the trace has expert-parallel
all-to-all — its time and payload beside the tensor-parallel all-reduces."""

from __future__ import annotations

from tracediag.analyses.kernels import phase_name, phase_order, tp_degree, unphased_name
from tracediag.catalog import family_label
from tracediag.model import accounting
from tracediag.model.kernel_formats import kernel_format
from tracediag.reports.sections import Section

ROUTING_FAMILIES = ("moe_routing", "trtllm_gen_moe", "triton_kernels")


def _kernel_rows(ctx) -> list[dict]:
    rows = ctx.rows(
        """SELECT phase, source, klass, family, name, sum(calls) AS calls, sum(time_ns) AS time_ns
           FROM kernel_steps WHERE step_id IS NOT NULL GROUP BY ALL"""
    )
    out = []
    for r in rows:
        if r["family"] in ROUTING_FAMILIES:
            kind, scheme = "routing", None
        elif r["klass"] in ("gemm", "wo_gemm"):
            f = kernel_format(r["name"], r["source"])
            if f is None or not f.moe:
                continue
            kind, scheme = "expert GEMM", f.scheme
        else:
            continue
        out.append(r | {"kind": kind, "scheme": scheme})
    return out


def build(ctx) -> Section | None:
    m = ctx.model
    kernels = _kernel_rows(ctx)
    unphased = unphased_name(ctx)
    if (m is None or m.moe is None) and not kernels:
        return None
    phase_ns = {
        phase_name(r["phase"], unphased): r["t"]
        for r in ctx.rows("SELECT phase, sum(step_ns) AS t FROM step_activity GROUP BY 1")
    }
    notes = []
    tables: dict[str, list[dict]] = {}
    p, p_source = tp_degree(ctx)
    if m is not None and m.moe is not None:
        e = m.moe
        fmt = m.quant.groups.get("experts") if m.quant else None
        notes.append(
            f"{e.experts} experts per MoE layer, top-{e.top_k} per token, expert width {e.expert_I}, "
            f"{len(e.moe_layers)} of {m.L} layers MoE"
            + (f", {e.shared_experts} shared expert(s) of width {e.shared_I}" if e.shared_experts else "")
            + (
                f"; experts {fmt.fmt.name} ({fmt.fmt.scheme}, {fmt.fmt.bits_per_weight:g} bits per weight)"
                if fmt
                else ""
            )
            + "."
        )
        seen_T = sorted({r["T"] for r in ctx.rows("SELECT T FROM steps WHERE T IS NOT NULL")})
        Ts = sorted({1, 8, 32, *seen_T[:1], *seen_T[-1:]})
        tables["experts touched per MoE layer (estimate)"] = [
            {
                "tokens_T": T,
                "experts_touched": round(accounting.experts_touched(e.experts, e.top_k, T), 2),
                "share_of_experts": round(accounting.experts_touched(e.experts, e.top_k, T) / e.experts, 4),
                "expert_bytes_read_per_rank": round(
                    next(r["bytes_read"] for r in accounting.decode_reads(m, p, T).rows if r["group"] == "experts")
                ),
                "observed_in_trace": T in seen_T,
            }
            for T in Ts
        ]
        notes.append(
            "Experts touched by T tokens: E·(1 − (1 − k/E)^T), an estimate for uniform routing independent across "
            f"tokens (skewed routing touches fewer); bytes per rank at p = {p} ({p_source})."
        )
        tables["weights per module group (p = 1)"] = [g.row() for g in accounting.weights(m, 1)]
    if kernels:
        shares = []
        for ph in sorted({r["phase"] for r in kernels}, key=phase_order):
            rows = [r for r in kernels if r["phase"] == ph]
            gemm = sum(r["time_ns"] for r in rows if r["kind"] == "expert GEMM")
            route = sum(r["time_ns"] for r in rows if r["kind"] == "routing")
            total = phase_ns.get(phase_name(ph, unphased))
            shares.append(
                {
                    "phase": phase_name(ph, unphased),
                    "expert_gemm_ns": gemm,
                    "routing_ns": route,
                    "step_ns": total,
                    "expert_gemm_share": round(gemm / total, 4) if total else None,
                    "routing_share": round(route / total, 4) if total else None,
                }
            )
        tables["expert GEMM and routing time share per phase"] = shares
        tables["MoE kernels"] = [
            {
                "phase": phase_name(r["phase"], unphased),
                "kind": r["kind"],
                "family": family_label(r["family"]),
                "kernel": r["name"],
                "scheme": r["scheme"],
                "calls": r["calls"],
                "time_ns": r["time_ns"],
                "share_of_step_time": round(r["time_ns"] / phase_ns[phase_name(r["phase"], unphased)], 4)
                if phase_ns.get(phase_name(r["phase"], unphased))
                else None,
            }
            for r in sorted(kernels, key=lambda r: (phase_order(r["phase"]), -r["time_ns"], r["name"]))
        ]
    comm = ctx.rows(
        """SELECT op, count(*) AS calls, sum(dur_ns) AS time_ns, avg(payload_bytes) AS mean_payload_bytes,
                  sum(payload_bytes) AS total_payload_bytes, count(DISTINCT rank) AS ranks
           FROM collectives WHERE op IN ('all_to_all', 'all_reduce', 'all_gather', 'reduce_scatter')
           GROUP BY op ORDER BY time_ns DESC, op"""
    )
    if comm:
        tables["collectives: expert-parallel all-to-all beside tensor-parallel all-reduce"] = comm
        if not any(r["op"] == "all_to_all" for r in comm):
            notes.append("No all-to-all in the trace: experts are split by tensor parallelism (or not split), not EP.")
    elif m is not None and m.moe is not None:
        notes.append("No collectives in the trace (single rank): no expert-parallel all-to-all to show.")
    return Section(id="moe", step=5, title="Mixture of experts", tables=tables, notes=tuple(notes))
