"""SHP001 TP divisibility.

Hypothesis: the tensor-parallel degree p does not divide the model's attention heads h, MLP
intermediate size I or KV heads H_kv, so the engine pads, replicates KV heads, or refuses to load —
and the 2L·T·H·e_a accounting of the later rules may not hold.

Formula: h mod p, I mod p, H_kv mod p; with p > H_kv each rank holds ceil(H_kv/p) KV heads
(replicated), so KV memory per rank shrinks by ceil(H_kv/p)/H_kv instead of 1/p.

Evidence: p and where it came from (the tensor-parallel group found in the trace — process-group
descriptions, group sizes and what the collectives carry —, the engine log's tensor_parallel_size, p = 1
for a single process or a data-parallel job, or --tp), every parallel group named, the config values.

What to do: pick p among the divisors of h (and of H_kv, or accept replication knowingly); check the
engine's startup log for padding or replication messages; recompute KV capacity per rank.
"""

from __future__ import annotations

import math

from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, passed

RULE = RuleMeta(
    id="SHP001",
    step=1,
    title="TP degree divides heads, KV heads and MLP width",
    requires_model=("h", "H_kv", "I"),
    requires_tp=True,
)


def check(ctx: Context) -> Check:
    m, p = ctx.model, ctx.tp.p
    h, hkv, inter = m.h, m.H_kv, m.I
    kv_per_rank = math.ceil(hkv / p)
    values = {
        "p": p,
        "p_source": ctx.tp.source,
        "h": h,
        "H_kv": hkv,
        "I": inter,
        "h_mod_p": h % p,
        "I_mod_p": inter % p,
        "H_kv_mod_p": hkv % p,
        "kv_heads_per_rank": kv_per_rank,
        "kv_memory_share_per_rank": kv_per_rank / hkv,
        "ideal_share_per_rank": 1 / p,
    }
    if ctx.layout is not None:
        values["workload"] = ctx.layout.workload
        values["parallel_groups"] = [
            f"{g.kind}: {g.description or g.name or 'unnamed'} ({g.size or '?'} ranks) — {g.evidence}"
            for g in ctx.layout.groups
        ]
    formula = "h mod p, I mod p, H_kv mod p; KV heads per rank = ceil(H_kv / p)"
    substituted = (
        f"{h} mod {p} = {h % p}, {inter} mod {p} = {inter % p}, {hkv} mod {p} = {hkv % p}; "
        f"ceil({hkv}/{p}) = {kv_per_rank}"
    )
    problems: list[str] = []
    severity = None
    if h % p:
        problems.append(f"p={p} does not divide the {h} attention heads (engines refuse or pad)")
        severity = "error"
    if p <= hkv and hkv % p:
        problems.append(f"p={p} does not divide the {hkv} KV heads")
        severity = "error"
    if p > hkv:
        problems.append(
            f"p={p} > H_kv={hkv}: KV heads are replicated, each rank holds {kv_per_rank} "
            f"({kv_per_rank / hkv:.0%} of the KV cache per token, not 1/p = {1 / p:.0%})"
        )
        severity = severity or "warning"
    if inter % p:
        problems.append(f"p={p} does not divide I={inter}: the MLP shards are padded or uneven")
        severity = severity or "warning"
    common = {"formula": formula, "substituted": substituted, "values": values, "evidence": _evidence(ctx)}
    if not problems:
        return passed(
            RULE,
            confidence="high",
            title=f"p={p} divides h={h}, H_kv={hkv} and I={inter}",
            **common,
        )
    return finding(
        RULE,
        severity=severity,
        confidence="high",
        impact=1.0,
        title="; ".join(problems),
        next_check=(
            "Check the engine's startup log for padding / KV-head replication; choose p among the divisors "
            "of h and H_kv; recompute KV capacity per rank with the replicated head count (SCH004)."
        ),
        **common,
    )


def _evidence(ctx: Context) -> list[dict]:
    """Where p comes from on each rank, and the per-rank QKV GEMM whose width shows the KV heads held."""
    m, p = ctx.model, ctx.tp.p
    ev = [
        {
            "rank": r["rank"],
            "step": None,
            "ts_ns": r["trace_start_ns"],
            "name": "distributedInfo",
            "world_size": r["world_size"],
            "p": p,
            "p_source": ctx.tp.source,
        }
        for r in ctx.rows("SELECT rank, world_size, trace_start_ns FROM inputs ORDER BY rank")
    ][: ctx.settings.max_evidence]
    if m.D and m.h and m.h % p == 0:
        q_width = m.h // p * m.D
        rows = ctx.rows(
            "SELECT rank, step_id, ts_ns, name, act_dims, w_dims FROM gemm_shapes "
            "WHERE name = 'aten::linear' AND try_cast(json_extract(act_dims, '$[#-1]') AS BIGINT) = ? "
            "ORDER BY rank, ts_ns",
            [m.H],
        )
        seen: set[int] = set()
        for r in rows:
            w = r["w_dims"]
            n = int(w.strip("[]").split(",")[0]) if w else None
            if r["rank"] in seen or not n or n <= q_width or (n - q_width) % (2 * m.D):
                continue
            seen.add(r["rank"])
            ev.append(
                {
                    "rank": r["rank"],
                    "step": r["step_id"],
                    "ts_ns": r["ts_ns"],
                    "name": r["name"],
                    "weight_dims": w,
                    "kv_heads_held": (n - q_width) // (2 * m.D),
                    "note": f"fused QKV width {n} = ({m.h // p} q heads + 2 × kv heads) × D={m.D}",
                }
            )
    return ev
