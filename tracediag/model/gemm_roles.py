"""The GEMM shapes a model's projections have on one rank: (K, N) per projection role at TP degree p, from the
config alone. SHP002 matches the trace's GEMMs against them, KRN007 and the kernel analysis name a GEMM's role
by its shape."""

from __future__ import annotations

import math


def _dense_roles(roles: dict[str, tuple[int, int]], prefix: str, H: int, width: int | None, p: int) -> None:
    if width and width % p == 0:
        roles[f"{prefix}gate_proj/up_proj"] = (H, width // p)
        roles[f"{prefix}gate_up_proj (fused)" if not prefix else f"{prefix}gate_up_proj"] = (H, 2 * width // p)
        roles[f"{prefix}down_proj"] = (width // p, H)


def expected_roles(m, p: int) -> dict[str, tuple[int, int]]:
    """(K, N) per projection role on one rank at TP degree p; roles whose inputs are unknown are left out."""
    roles: dict[str, tuple[int, int]] = {}
    H = m.H
    a = m.attention
    if a is not None and a.kind == "MLA" and m.h and m.h % p == 0:
        hp, qh, v = m.h // p, a.q_head_dim or 0, a.v_head_dim or 0
        kv_a = (a.kv_lora_rank or 0) + (a.qk_rope_head_dim or 0)
        if a.q_lora_rank:
            roles["q_a_proj"] = (H, a.q_lora_rank)
            roles["q_b_proj"] = (a.q_lora_rank, hp * qh)
            roles["fused_qkv_a_proj"] = (H, a.q_lora_rank + kv_a)
        else:
            roles["q_proj"] = (H, hp * qh)
        roles["kv_a_proj_with_mqa"] = (H, kv_a)
        roles["kv_b_proj"] = (a.kv_lora_rank or 0, hp * ((a.qk_nope_head_dim or 0) + v))
        roles["o_proj"] = (hp * v, H)
    elif m.h and m.D and m.h % p == 0:
        q = m.h // p * m.D
        roles["q_proj"] = (H, q)
        roles["o_proj"] = (q, H)
        if m.H_kv:
            kv = math.ceil(m.H_kv / p) * m.D
            roles["k_proj/v_proj"] = (H, kv)
            roles["qkv_proj (fused)"] = (H, q + 2 * kv)
    _dense_roles(roles, "", H, m.dense_I if m.moe else m.I, p)
    if m.moe:
        roles["router (replicated)"] = (H, m.moe.experts)
        _dense_roles(roles, "expert ", H, m.moe.expert_I, p)
        if p > 1:  # expert parallelism: whole experts per rank
            roles["expert gate_up_proj (EP)"] = (H, 2 * m.moe.expert_I)
            roles["expert down_proj (EP)"] = (m.moe.expert_I, H)
        if m.moe.shared_experts and m.moe.shared_I:
            _dense_roles(roles, "shared_expert ", H, m.moe.shared_I, p)
    if m.vocab_size:
        roles["lm_head (vocab-parallel)"] = (H, math.ceil(m.vocab_size / p))
        roles["lm_head (replicated)"] = (H, m.vocab_size)
    return roles


PAD_ALIGNMENTS = (64, 128, 256)  # kernels round H / I up to these (vLLM MXFP4 MoE: 256)


def padded_roles(m, p: int) -> dict[str, tuple[int, int]]:
    """The roles again with H (and the expert width) rounded up to a kernel alignment, where that changes them."""
    out: dict[str, tuple[int, int]] = {}
    base = expected_roles(m, p)
    for align in PAD_ALIGNMENTS:
        Hp = -(-m.H // align) * align
        if Hp == m.H:
            continue
        sub = {m.H: Hp}
        if m.moe:
            Ip = -(-m.moe.expert_I // align) * align
            sub[m.moe.expert_I] = Ip
            sub[2 * m.moe.expert_I] = 2 * Ip
            if p > 1:
                sub[m.moe.expert_I // p] = Ip // p
                sub[2 * m.moe.expert_I // p] = 2 * Ip // p
        for role, (k, n) in base.items():
            kn = (sub.get(k, k), sub.get(n, n))
            if kn != (k, n) and kn not in base.values():
                out.setdefault(f"{role} (H padded to {Hp})", kn)
    return out
