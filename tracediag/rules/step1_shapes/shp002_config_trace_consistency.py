"""SHP002 Config ↔ trace consistency.

Hypothesis: the trace was taken from another model or another sharding than the config and p say,
so every later number would be computed with the wrong H, I or p.

Formula: the projection GEMMs of a Megatron-sharded layer have (input width K, output width N) of
  QKV  (H, (h/p + 2·ceil(H_kv/p))·D)  or q (H, h·D/p), k/v (H, ceil(H_kv/p)·D)
  O    (h·D/p, H)      gate_up (H, 2I/p) or gate/up (H, I/p)      down (I/p, H)      lm_head (H, V/p)
MLA (DeepSeek): q_a (H, q_lora_rank) and kv_a (H, kv_lora_rank + qk_rope_head_dim) replicated, q_b
(q_lora_rank, h/p·(qk_nope + qk_rope)), kv_b (kv_lora_rank, h/p·(qk_nope + v_head_dim)), O (h/p·v_head_dim, H).
MoE: router (H, E) replicated (not sharded); experts (H, 2·I_e/p) / (I_e/p, H) under TP, or (H, 2·I_e) /
(I_e, H) under expert parallelism; shared experts like a dense MLP of their width. Kernels may pad H (and I)
to a multiple of 64/128/256 (vLLM's MXFP4 MoE pads 2880 to 3072): such a GEMM matches its role "padded to
3072", said so, not silently. Every GEMM whose K or N is H (or padded H) should match one of these roles.

Evidence: GEMM CPU ops with recorded shapes (aten::linear / mm / addmm / matmul, outermost only),
counted by (K, N); the roles matched (padding named); unmatched shapes with example events.

What to do: make sure --model is the served model's config.json and --tp the engine's
tensor_parallel_size; if shapes fit another p, the trace is from another deployment.
"""

from __future__ import annotations

import orjson

from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model.gemm_roles import expected_roles, padded_roles

RULE = RuleMeta(
    id="SHP002",
    step=1,
    title="GEMM shapes in the trace match the model config and p",
    requires_tables=("gemm_shapes",),
    requires_model=("H",),
    requires_tp=True,
    may_be_downstream_of=("SHP001",),
)
MATCH_SHARE = 0.9  # share of hidden-size GEMM calls that must match a role


def _kn(name: str, act: list[int], w: list[int]) -> tuple[int, int] | None:
    if not act or not w:
        return None
    if name == "aten::linear" and len(w) == 2:
        return act[-1], w[0]
    if len(w) >= 2:
        return act[-1], w[-1]
    return None


def _match(shapes: dict[tuple[int, int], dict], roles: dict[str, tuple[int, int]], H: int):
    """Shapes with K or N = H, plus those a padded-H role explains (an unexplained padded width is not counted:
    it may be anything)."""
    role_of = {kn: [r for r, v in roles.items() if v == kn] for kn in shapes}
    relevant = {kn: s for kn, s in shapes.items() if H in kn or any("padded to" in r for r in role_of[kn])}
    by_role = {kn: role_of[kn] for kn in relevant}
    matched = sum(s["calls"] for kn, s in relevant.items() if by_role[kn])
    total = sum(s["calls"] for s in relevant.values())
    return relevant, by_role, matched, total


def _shape_evidence(kn: tuple[int, int], s: dict, **extra) -> dict:
    """Evidence for one GEMM (K, N): the first call with that shape, then `extra`."""
    ex = s["example"]
    event = {"rank": ex["rank"], "step": ex["step_id"], "ts_ns": ex["ts_ns"], "name": ex["name"]}
    return event | {"K": kn[0], "N": kn[1]} | extra


def _distinct_shapes(ctx: Context) -> dict[tuple[int, int], dict]:
    """The trace's GEMMs by (K, N), each with its call count and the first call as the example; calls whose
    shapes were not recorded or do not parse are left out."""
    rows = ctx.rows(
        "SELECT name, act_dims, w_dims, count(*) AS calls, min(rank) AS rank, min(step_id) AS step_id, "
        "min(ts_ns) AS ts_ns FROM gemm_shapes GROUP BY name, act_dims, w_dims ORDER BY ts_ns, name, act_dims, w_dims"
    )
    shapes: dict[tuple[int, int], dict] = {}
    for r in rows:
        try:
            kn = _kn(r["name"], orjson.loads(r["act_dims"] or "[]"), orjson.loads(r["w_dims"] or "[]"))
        except (orjson.JSONDecodeError, TypeError):
            kn = None
        if kn is None:
            continue
        s = shapes.setdefault(kn, {"calls": 0, "example": r})
        s["calls"] += r["calls"]
    return shapes


def _share_at_other_p(shapes: dict[tuple[int, int], dict], m, p: int) -> dict[int, float]:
    """The share of hidden-size calls that match the roles at each other usual TP degree: a shape mismatch at p
    that fits another degree points at a wrong --tp rather than another model."""
    alt = {}
    for q in (1, 2, 4, 8, 16):
        if q != p:
            _, _, mq, tq = _match(shapes, expected_roles(m, q) | padded_roles(m, q), m.H)
            alt[q] = mq / tq if tq else 0.0
    return alt


def check(ctx: Context) -> Check:
    m, p = ctx.model, ctx.tp.p
    shapes = _distinct_shapes(ctx)
    roles = expected_roles(m, p) | padded_roles(m, p)
    relevant, by_role, matched, total = _match(shapes, roles, m.H)
    table = [
        {
            "K": kn[0],
            "N": kn[1],
            "calls": s["calls"],
            "role": ", ".join(by_role.get(kn, [])) or None,
            "example_op": s["example"]["name"],
            "rank": s["example"]["rank"],
        }
        for kn, s in sorted(shapes.items(), key=lambda kv: -kv[1]["calls"])
    ]
    values = {
        "H": m.H,
        "p": p,
        "p_source": ctx.tp.source,
        "gemm_shapes_distinct": len(shapes),
        "hidden_size_gemm_calls": total,
        "matched_calls": matched,
        "matched_share": matched / total if total else None,
        "expected_roles": {r: list(v) for r, v in roles.items()},
        "padded_calls": sum(s["calls"] for kn, s in relevant.items() if any("padded to" in r for r in by_role[kn])),
    }
    formula = "share = calls whose (K, N) matches a role at p / calls with K = H or N = H"
    evidence = [
        _shape_evidence(kn, s, calls=s["calls"])
        for kn, s in sorted(relevant.items(), key=lambda kv: -kv[1]["calls"])
        if not by_role[kn]
    ][: ctx.settings.max_evidence]
    if not shapes:
        return not_applicable(RULE, "missing GEMM input shapes (trace recorded without record_shapes=True)")
    if total == 0:
        widths = sorted({d for kn in shapes for d in kn})
        return finding(
            RULE,
            severity="error",
            confidence="high",
            impact=1.0,
            title=f"No GEMM in the trace has the config's hidden size H={m.H}: trace and config are from "
            "different models",
            formula=formula,
            substituted=f"0 of {sum(s['calls'] for s in shapes.values())} GEMM calls have K or N = {m.H}",
            values=values | {"gemm_widths_seen": widths[:20]},
            table=table[:20],
            evidence=[_shape_evidence(kn, s) for kn, s in list(shapes.items())[: ctx.settings.max_evidence]],
            next_check="Pass the served model's config.json; every later rule would use the wrong H.",
            cost_model_applies=False,
        )
    share = matched / total
    substituted = f"share = {matched} / {total} = {share:.2f} (need ≥ {MATCH_SHARE})"
    common = {"formula": formula, "substituted": substituted, "table": table[:20], "evidence": evidence}
    if share >= MATCH_SHARE:
        pads = sorted(
            {r.rsplit("padded to ", 1)[1].rstrip(")") for rs in by_role.values() for r in rs if "padded to" in r}
        )
        padded = (
            f" ({values['padded_calls']} with H padded to {', '.join(pads)})" if pads and values["padded_calls"] else ""
        )
        return passed(
            RULE,
            confidence="high",
            title=f"{matched} of {total} hidden-size GEMM calls match the config's roles at p={p}{padded}",
            values=values,
            **common,
        )
    alt = _share_at_other_p(shapes, m, p)
    best = max(alt, key=alt.get) if alt else None
    hint = f"; the shapes fit p={best} ({alt[best]:.0%} of calls)" if best and alt[best] >= MATCH_SHARE else ""
    return finding(
        RULE,
        severity="error" if hint else "warning",
        confidence="medium",
        impact=1 - share,
        title=f"Only {share:.0%} of hidden-size GEMM calls match the config's sharded shapes at p={p}{hint}",
        values=values | {"share_at_other_p": alt},
        next_check=(
            "Check --tp against the engine's tensor_parallel_size and --model against the served checkpoint; "
            "unmatched shapes are listed with example events."
        ),
        cost_model_applies=False,
        **common,
    )
