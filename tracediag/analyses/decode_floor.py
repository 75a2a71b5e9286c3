"""The memory floor of each decode step (KRN005 judges it): the bytes a decode step must read, weights W (the
experts touched, for MoE) plus B·K(S) of KV cache, at the memory bandwidth, and its FLOPs at the peak; floor =
max(bytes/BW, FLOPs/peak), efficiency = floor / the step's measured time (step_activity)."""

from __future__ import annotations

from tracediag.context import Context
from tracediag.model import accounting
from tracediag.model.quant import Format


def decode_floors(
    ctx: Context,
    steps: list[dict],
    bw: float,
    peak: float | None,
    p: int,
    kv_element_bytes: float,
    fmts: dict[str, Format],
) -> list[dict]:
    """Per decode step with a measured time: its bytes (weights, KV), FLOPs, the time of each at BW and peak,
    the floor and the efficiency. `steps` are decode_steps' rows (rank, step_id, B, S, T), `kv_element_bytes` the
    KV cache element size, `fmts` the served weight formats."""
    m = ctx.model
    active = accounting.active_params_per_token(m, p)
    qk = m.attention.q_head_dim if m.attention and m.attention.q_head_dim else m.D
    measured = {
        (r["rank"], r["step_id"]): r["step_ns"]
        for r in ctx.rows("SELECT rank, step_id, step_ns FROM step_activity WHERE phase = 'decode'")
    }
    table = []
    for s in steps:
        t = measured.get((s["rank"], s["step_id"]))
        if not t:
            continue
        T = s["T"] or s["B"] or 1
        w_bytes = accounting.decode_reads(m, p, T, fmts).total
        kv_b = s["B"] * accounting.kv_bytes(m, p, kv_element_bytes, s["S"]) if s["S"] else 0
        bytes_ = w_bytes + kv_b
        flops = 2 * active * T + (4 * m.L * (m.h // p) * qk * s["S"] * s["B"] if s["S"] else 0)
        t_bytes = bytes_ / bw * 1e9
        t_flops = flops / peak * 1e9 if peak else None
        floor = max(t_bytes, t_flops or 0.0)
        table.append(
            {
                "rank": s["rank"],
                "step": s["step_id"],
                "B": s["B"],
                "S": s["S"],
                "T": T,
                "weights_bytes": round(w_bytes),
                "kv_bytes": round(kv_b),
                "bytes": round(bytes_),
                "flops": flops,
                "t_bytes_ns": t_bytes,
                "t_flops_ns": t_flops,
                "floor_ns": floor,
                "step_ns": t,
                "efficiency": floor / t,
            }
        )
    return table
