"""Byte accounting in one place: weights per module group at their real format, KV bytes per token and per
sequence, the weights a decode step reads and the projection FLOPs a token costs — used by SHP004, KRN003,
KRN004, KRN005, SCH005 and COL003.

Weights. Parameters per group from the architecture (tracediag.model.config), bytes = parameters × bits per
weight of the group's format / 8 (tracediag.model.quant: scales and zero points included). Per rank at
tensor-parallel degree p, the Megatron/vLLM split: attention by heads (K/V replicated when p > H_kv; MLA's
q_a/kv_a down-projections replicated), dense and shared-expert MLPs by columns, experts by p (TP shards each
expert's width, expert parallelism shards the experts: the same bytes per rank), vocab-parallel embeddings and
lm_head, router and norms replicated.

Decode reads. One decode step of T tokens reads every weight of the rank once (a tied lm_head reads the
embedding matrix), except MoE experts, of which a batch touches an expected
    E·(1 − (1 − k/E)^T)   distinct experts per MoE layer (top-k routing over E experts),
an *estimate*: exact only for uniform routing independent across tokens; real routers are skewed, so the true
number is lower (fewer bytes, a lower floor). Norm weights ((2L+1)·H) and the T embedding rows gathered are
left out: negligible.

Projection FLOPs. F_proj per token (COL003) is 2 × the weights a token multiplies with in the decoder layers, from
the same groups: every attention projection, the dense layers' MLPs, and per MoE layer the router, the shared
experts and k of the E routed experts (active_share); the lm_head is kept apart.

KV. Full-attention layers cache 2·ceil(H_kv/p)·D elements per token; MLA caches one latent of kv_lora_rank +
qk_rope_head_dim per token and layer (not split by TP); sliding-window layers keep at most `sliding_window`
tokens and chunked layers at most `attention_chunk_size`, so their bytes stop growing with the context. The
plain per-token formula 2·L·H_kv·D·b (docs/method.md, SCH004) holds only for uniform full attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from tracediag.model.config import ModelConfig
from tracediag.model.quant import Format, base_format

W16 = Format("16-bit", 16, 16.0, 16, "bf16")
DEFAULT_G = 128  # group size assumed for the hypothetical 4-bit checkpoint when the config gives none


@dataclass(frozen=True)
class GroupBytes:
    """One module group: parameters and bytes, whole model and per rank."""

    group: str
    params: int  # whole model
    params_per_rank: float  # one rank at TP degree p
    fmt: Format
    sharding: str  # how the group splits over p ranks

    @property
    def bytes(self) -> float:
        return self.params * (self.fmt.bits_per_weight or 16.0) / 8

    @property
    def bytes_per_rank(self) -> float:
        return self.params_per_rank * (self.fmt.bits_per_weight or 16.0) / 8

    def row(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "params": self.params,
            "params_per_rank": round(self.params_per_rank),
            "format": self.fmt.name,
            "bits_per_weight": round(self.fmt.bits_per_weight, 4) if self.fmt.bits_per_weight else None,
            "bytes_per_rank": round(self.bytes_per_rank),
            "sharding": self.sharding,
        }


def _attention_params(m: ModelConfig, p: int) -> tuple[int, float]:
    """(whole model, per rank) parameters of the attention projections of all layers."""
    a = m.attention
    if a is None or m.h is None:
        return 0, 0.0
    H, h = m.H, m.h
    if a.kind == "MLA":
        qh, v, nope = a.q_head_dim or 0, a.v_head_dim or 0, a.qk_nope_head_dim or 0
        kv_a = H * ((a.kv_lora_rank or 0) + (a.qk_rope_head_dim or 0)) + (a.kv_lora_rank or 0)
        if a.q_lora_rank:
            repl = H * a.q_lora_rank + a.q_lora_rank + kv_a
            shard = a.q_lora_rank * h * qh
        else:
            repl, shard = kv_a, H * h * qh
        shard += (a.kv_lora_rank or 0) * h * (nope + v) + h * v * H
        return m.L * (repl + shard), m.L * (repl + shard / p)
    D, kv = m.D or 0, m.H_kv or h
    q_w, kv_w = h * D, kv * D
    whole = H * q_w + 2 * H * kv_w + q_w * H
    kv_rank = math.ceil(kv / p) * D
    rank = H * q_w / p + 2 * H * kv_rank + q_w / p * H
    if a.bias:
        whole += q_w + 2 * kv_w + H
        rank += q_w / p + 2 * kv_rank + H
    if a.sinks:
        whole += h
        rank += h / p
    return m.L * whole, m.L * rank


def group_params(m: ModelConfig, p: int = 1) -> dict[str, tuple[int, float, str]]:
    """group -> (parameters in the whole model, parameters one rank holds at TP degree p, how it shards)."""
    out: dict[str, tuple[int, float, str]] = {}
    H = m.H
    kv_note = " (K/V replicated: p > H_kv)" if m.H_kv and p > m.H_kv else ""
    aw, ar = _attention_params(m, p)
    out["attention"] = (
        aw,
        ar,
        f"heads / p{kv_note}"
        if m.attention and m.attention.kind != "MLA"
        else "MLA: up-projections / p, down-projections replicated",
    )
    mats = 3 if m.gated_mlp else 2
    moe_layers = len(m.moe.moe_layers) if m.moe else 0
    dense_layers = m.L - moe_layers
    if dense_layers and m.dense_I:
        w = dense_layers * mats * H * m.dense_I
        out["dense_mlp"] = (w, w / p, "columns / p")
    if m.moe:
        e = m.moe
        per_expert = 3 * H * e.expert_I + (2 * e.expert_I + H if m.model_type == "gpt_oss" else 0)
        w = moe_layers * e.experts * per_expert
        out["experts"] = (w, w / p, "experts / p (TP splits each expert, EP splits the experts)")
        if e.shared_experts and e.shared_I:
            w = moe_layers * (3 * H * e.shared_I + (H if m.model_type == "qwen2_moe" else 0))
            out["shared_experts"] = (w, w / p, "columns / p")
        w = moe_layers * (H * e.experts + (e.experts if e.router_bias else 0))
        out["router"] = (w, float(w), "replicated")
    if m.vocab_size:
        v_rank = math.ceil(m.vocab_size / p)
        out["embeddings"] = (m.vocab_size * H, float(v_rank * H), "vocab / p")
        head = 0 if m.tie_word_embeddings else m.vocab_size * H
        out["lm_head"] = (
            head,
            float(0 if m.tie_word_embeddings else v_rank * H),
            "vocab / p" + (" (tied to the embeddings)" if m.tie_word_embeddings else ""),
        )
    norms = (2 * m.L + 1) * H
    out["norms"] = (norms, float(norms), "replicated")
    return out


def formats(m: ModelConfig, as_served: bool = True) -> dict[str, Format]:
    """Format per group: the checkpoint's (as_served), or every group at the model dtype."""
    base = base_format(m)
    out: dict[str, Format] = {}
    for g in group_params(m):
        q = m.quant.groups.get(g) if (as_served and m.quant is not None) else None
        out[g] = q.fmt if q is not None else base
    return out


def weights(m: ModelConfig, p: int = 1, fmts: dict[str, Format] | None = None) -> list[GroupBytes]:
    """Per group: parameters and bytes held (memory), at TP degree p, in `fmts` (default: as served)."""
    fm = fmts or formats(m)
    return [GroupBytes(g, w, r, fm.get(g, base_format(m)), s) for g, (w, r, s) in group_params(m, p).items()]


def total_params(m: ModelConfig) -> int:
    return sum(w for w, _, _ in group_params(m).values())


def weight_bytes(m: ModelConfig, p: int = 1, fmts: dict[str, Format] | None = None) -> float:
    """Bytes of weights one rank holds (all groups, embeddings included)."""
    return sum(g.bytes_per_rank for g in weights(m, p, fmts))


# ------------------------------------------------------------------ MoE at decode


def experts_touched(E: int, k: int, T: float) -> float:
    """Expected distinct experts a batch of T tokens routes to, top-k of E, uniform independent routing:
    E·(1 − (1 − k/E)^T). An estimate: skewed real routing touches fewer."""
    if T <= 0:
        return 0.0
    return E * (1.0 - (1.0 - k / E) ** T)


@dataclass(frozen=True)
class StepReads:
    """Weight bytes one rank reads in one decode step of T tokens, by group."""

    T: float
    rows: list[dict[str, Any]]
    experts_touched: float | None  # per MoE layer (estimate)

    @property
    def total(self) -> float:
        return sum(r["bytes_read"] for r in self.rows)


def decode_reads(m: ModelConfig, p: int, T: float, fmts: dict[str, Format] | None = None) -> StepReads:
    """Weights read per decode step: every group once, MoE experts as the expected touched share; the gathered
    embedding rows and the norms are left out (negligible)."""
    touched = experts_touched(m.moe.experts, m.moe.top_k, T) if m.moe else None
    rows = []
    held = {g.group: g for g in weights(m, p, fmts)}
    for g in held.values():
        if g.group in ("norms", "embeddings"):
            continue
        share, how, size = 1.0, "all", g.bytes_per_rank
        if g.group == "experts" and m.moe:
            share = touched / m.moe.experts
            how = f"{touched:.1f} of {m.moe.experts} experts touched per MoE layer (estimate E·(1−(1−k/E)^T))"
        elif g.group == "lm_head" and m.tie_word_embeddings and "embeddings" in held:
            size, how = held["embeddings"].bytes_per_rank, "all (tied: the embedding matrix)"
        rows.append(
            {
                "group": g.group,
                "format": g.fmt.name,
                "bits_per_weight": round(g.fmt.bits_per_weight or 16.0, 4),
                "bytes_held": round(size),
                "read_share": round(share, 6),
                "bytes_read": size * share,
                "read": how,
            }
        )
    return StepReads(T, rows, touched)


def active_share(m: ModelConfig, group: str) -> float:
    """Share of a group's weights one token multiplies with: k/E of the routed experts, none of the embeddings
    (a row gather) and norms (elementwise), all of every other group."""
    if group in ("embeddings", "norms"):
        return 0.0
    if group == "experts" and m.moe:
        return m.moe.top_k / m.moe.experts
    return 1.0


def active_params_per_token(m: ModelConfig, p: int = 1) -> float:
    """Parameters one token multiplies with on one rank: dense groups, k experts per MoE layer, lm_head."""
    return sum(r * active_share(m, g) for g, (_, r, _) in group_params(m, p).items())


# ------------------------------------------------------------------ projection FLOPs per token (COL003)

# The groups of the decoder layers' projections, in the order F_proj lists them; the lm_head is kept apart (the
# dense F_proj of docs/method.md, step 3, is per layer × L), embeddings and norms do no multiply-adds.
PROJECTION_GROUPS = ("attention", "dense_mlp", "shared_experts", "router", "experts")


@dataclass(frozen=True)
class ProjectionFlops:
    """FLOPs one token costs in the projections, 2 per multiply-add with a weight it uses (group_params × the
    active share): at TP=1 the whole model's, at TP=p one rank's. Attention scores (Q·Kᵀ, P·V over the context),
    norms, sampling are not projections and are left out."""

    p: int
    kind: str  # "dense" or "MoE-active"
    by_group: dict[str, float]  # FLOPs per token, one rank at TP degree p, of the decoder layers
    lm_head: float  # FLOPs per token of the lm_head (2·V·H at TP=1), kept apart
    terms: dict[str, str]  # group -> its closed form at TP=1 with the config's values plugged in
    inputs: dict[str, Any]  # the config values the terms use

    @property
    def layers(self) -> float:
        """F_proj/T: all decoder layers, without the lm_head."""
        return sum(self.by_group.values())

    @property
    def formula(self) -> str:
        if self.kind == "dense":
            return (
                "F_proj/T = 2 FLOPs × the weights a token multiplies with in the L layers: attention projections "
                "+ MLP = L·(4(H·h·D + H·H_kv·D) + 2·m·H·I), m = 3 gated (2 plain) MLP matrices — docs/method.md's "
                "4(H² + H·H_KV) + 6H·I per layer when h·D = H"
            )
        return (
            "F_proj/T = 2 FLOPs × the weights a token multiplies with (MoE-active): attention projections of all "
            "L layers + the dense MLPs of the L − L_moe dense layers + per MoE layer the router (H·E), the shared "
            "experts and k of the E routed experts (3·H·I_e each)"
        )

    @property
    def substituted(self) -> str:
        parts = [f"{g} {self.terms[g]} = {self.by_group[g]:.4g}" for g in self.by_group]
        return "F_proj/T = " + " + ".join(parts) + f" = {self.layers:.4g} FLOP per token"


def _projection_terms(m: ModelConfig) -> tuple[dict[str, str], dict[str, Any]]:
    """Closed form of each projection group's FLOPs per token at TP=1 (what group_params counts, × 2 × the
    active share), with the values plugged in; and those values."""
    a, H, L = m.attention, m.H, m.L
    terms: dict[str, str] = {}
    inputs: dict[str, Any] = {"L": L, "H": H, "attention": a.kind if a else None}
    if a is not None and a.kind == "MLA":
        qr, kr, rope = a.q_lora_rank, a.kv_lora_rank or 0, a.qk_rope_head_dim or 0
        nope, v = a.qk_nope_head_dim or 0, a.v_head_dim or 0
        inputs |= {"h": m.h, "q_lora_rank": qr, "kv_lora_rank": kr, "qk_nope_head_dim": nope,
                   "qk_rope_head_dim": rope, "v_head_dim": v}  # fmt: skip
        q = f"{H}·{qr} + {qr} + {qr}·{m.h}·{nope + rope}" if qr else f"{H}·{m.h}·{nope + rope}"
        terms["attention"] = f"2·{L}·({q} + {H}·({kr} + {rope}) + {kr} + {kr}·{m.h}·({nope} + {v}) + {m.h}·{v}·{H})" + (
            " (q_a, kv_a and their latent norms, q_b, kv_b, o)" if qr else " (q, kv_a and its norm, kv_b, o)"
        )
    elif a is not None and m.h and m.D:
        kv = m.H_kv or m.h
        inputs |= {"h": m.h, "H_kv": kv, "D": m.D}
        extra = (f" + 2·{L}·({m.h * m.D} + 2·{kv * m.D} + {H}) biases" if a.bias else "") + (
            f" + 2·{L}·{m.h} sinks" if a.sinks else ""
        )
        terms["attention"] = f"2·{L}·(2·{H}·{m.h}·{m.D} + 2·{H}·{kv}·{m.D}){extra}"
    mats = 3 if m.gated_mlp else 2
    n_moe = len(m.moe.moe_layers) if m.moe else 0
    if L - n_moe and m.dense_I:
        inputs |= {"dense_layers": L - n_moe, "dense_I": m.dense_I}
        terms["dense_mlp"] = f"2·{L - n_moe}·{mats}·{H}·{m.dense_I}"
    if m.moe:
        e = m.moe
        inputs |= {"moe_layers": n_moe, "E": e.experts, "k": e.top_k, "expert_I": e.expert_I,
                   "shared_experts": e.shared_experts, "shared_I": e.shared_I}  # fmt: skip
        if e.shared_experts and e.shared_I:
            gate = f" + {H}" if m.model_type == "qwen2_moe" else ""
            terms["shared_experts"] = f"2·{n_moe}·(3·{H}·{e.shared_I}{gate})"
        terms["router"] = f"2·{n_moe}·({H}·{e.experts}" + (f" + {e.experts})" if e.router_bias else ")")
        bias = f" + 2·{e.expert_I} + {H}" if m.model_type == "gpt_oss" else ""
        terms["experts"] = f"2·{n_moe}·{e.top_k}·(3·{H}·{e.expert_I}{bias})"
    return terms, inputs


def projection_flops(m: ModelConfig, p: int = 1) -> ProjectionFlops | None:
    """F_proj per token from the shared accounting: 2 × group_params × active_share for the attention, dense
    MLP, shared-expert, router and routed-expert groups (MoE: k of E experts, only the MoE layers; dense layers
    at their own width); the lm_head apart. At p > 1 the FLOPs of one rank, split as group_params splits the
    weights (router and MLA down-projections replicated, K/V replicated when p > H_kv). Biases, gpt-oss's
    attention sinks and MLA's latent norms are counted at 2 FLOPs per weight like the matrices (below 0.05 % of
    F_proj on the published configs). None when the config lacks the attention shape or every MLP width."""
    groups = group_params(m, p)
    if m.h is None or m.attention is None or not groups.get("attention", (0,))[0]:
        return None
    if "dense_mlp" not in groups and "experts" not in groups:
        return None
    terms, inputs = _projection_terms(m)
    by_group = {g: 2 * groups[g][1] * active_share(m, g) for g in PROJECTION_GROUPS if g in groups}
    head = groups.get("lm_head")
    lm = 0.0
    if head is not None:
        lm = 2 * (groups["embeddings"][1] if m.tie_word_embeddings else head[1])
        inputs["vocab_size"] = m.vocab_size
    return ProjectionFlops(p, "MoE-active" if m.moe else "dense", by_group, lm, terms, inputs)


def dense_formula_flops(m: ModelConfig) -> float | None:
    """What the dense formula of docs/method.md (step 3), L·(4(H² + H·H_KV) + 6H·I), gives per token with the
    config's I (for an MoE model: ModelConfig.I, the dense layers' width, else one expert's) — for comparison
    with the MoE-active count, never used in its place."""
    from tracediag.model.tpmath import proj_flops_per_layer

    if m.I is None or m.H_kv is None or m.D is None:
        return None
    return m.L * proj_flops_per_layer(1, m.H, m.I, m.H_kv * m.D)


def hypothetical_w4(m: ModelConfig) -> tuple[dict[str, Format], int, str]:
    """Formats if every 16-bit projection group (attention, dense MLP, experts, shared experts) were 4-bit
    weight-only with one 16-bit scale per G (the quantized weight ratio (1−f) + f/4 + f/G of docs/method.md,
    KRN004); groups already at ≤ 4.5 bits, router, embeddings and lm_head stay as served. Returns (formats, G,
    where G came from)."""
    q = m.quantization or {}
    g = q.get("group_size", q.get("q_group_size"))
    if isinstance(g, int) and g > 0:
        G, src = g, "quantization_config.group_size"
    else:
        G, src = DEFAULT_G, f"assumed G = {DEFAULT_G} (no group_size in the config)"
    served = formats(m)
    w4 = Format("int4 (hypothetical)", 4, 4 + 16 / G, 16, "bf16", f"W4A16 G={G}")
    out = {}
    for grp, f in served.items():
        quantizable = grp in ("attention", "dense_mlp", "experts", "shared_experts")
        out[grp] = w4 if quantizable and (f.bits_per_weight or 16) > w4.bits_per_weight + 0.5 else f
    return out, G, src


# module groups a 4-bit weight-only checkpoint quantizes, and the bits at or below which a group counts as 4-bit
# (MXFP4 4.25, NVFP4 4.5, AWQ/GPTQ G=128 ≈ 4.16–4.25 bits per weight with scales and zero points)
QUANTIZABLE_GROUPS = ("attention", "dense_mlp", "experts", "shared_experts")
FOUR_BIT_MAX = 5.0
GROUP_KIND = {
    "attention": "attention",
    "dense_mlp": "dense MLP",
    "experts": "MoE experts",
    "shared_experts": "MoE experts",
    "router": "MoE experts",
    "embeddings": "embeddings/lm_head",
    "lm_head": "embeddings/lm_head",
}


def four_bit_groups(m: ModelConfig, p: int = 1, fmts: dict[str, Format] | None = None) -> list[dict[str, Any]]:
    """Per module group (norms left out): its format, bits per weight, whether it is 4-bit (≤ FOUR_BIT_MAX bits with
    its scales), whether a 4-bit weight-only checkpoint would quantize it, and its share of the projection
    parameters (attention, dense MLP, experts, shared experts) one rank holds."""
    held = [g for g in weights(m, p, fmts) if g.group != "norms" and g.params]
    proj = sum(g.params_per_rank for g in held if g.group in QUANTIZABLE_GROUPS) or 1.0
    return [
        {
            "group": g.group,
            "kind": GROUP_KIND.get(g.group, g.group),
            "format": g.fmt.name,
            "bits_per_weight": round(g.fmt.bits_per_weight or 16.0, 4),
            "four_bit": (g.fmt.bits_per_weight or 16.0) <= FOUR_BIT_MAX,
            "quantizable": g.group in QUANTIZABLE_GROUPS,
            "share_of_projection_params": g.params_per_rank / proj if g.group in QUANTIZABLE_GROUPS else None,
        }
        for g in held
    ]


# ------------------------------------------------------------------ KV cache


def kv_layer_caps(m: ModelConfig) -> list[int | None]:
    """Per layer: the most tokens it keeps (sliding window / attention chunk), None = the whole context."""
    out: list[int | None] = []
    for t in m.layer_types or ("full",) * m.L:
        if t == "sliding" and m.sliding_window:
            out.append(m.sliding_window)
        elif t == "chunked" and m.chunk_size:
            out.append(m.chunk_size)
        else:
            out.append(None)
    return out


def kv_bytes_per_token(m: ModelConfig, p: int, b: float) -> float | None:
    """Bytes one rank caches per token of context over the layers that keep every token (full attention).
    For a model with only full layers this is the per-token KV 2·L·ceil(H_kv/p)·D·b of docs/method.md, SCH004
    (MLA: L·(r + rope)·b)."""
    e = m.kv_elements_per_token_layer(p)
    if e is None:
        return None
    full = sum(cap is None for cap in kv_layer_caps(m))
    return full * e * b


def kv_bytes(m: ModelConfig, p: int, b: float, S: float) -> float | None:
    """Bytes of KV one sequence of S tokens holds on one rank: Σ_layers e·b·min(S, cap)."""
    e = m.kv_elements_per_token_layer(p)
    if e is None:
        return None
    return sum(e * b * (S if cap is None else min(S, cap)) for cap in kv_layer_caps(m))


def kv_layout(m: ModelConfig) -> str:
    """In words: 'MLA latent (512 + 64) per layer', '18 full + 18 sliding (128)', 'full attention, GQA'."""
    a = m.attention
    kind = a.kind if a else "?"
    if kind == "MLA":
        return f"MLA: one latent of kv_lora_rank {a.kv_lora_rank} + qk_rope_head_dim {a.qk_rope_head_dim} per layer"
    caps = kv_layer_caps(m)
    sliding = sum(c is not None for c in caps)
    if sliding:
        what = "sliding" if m.sliding_window else "chunked"
        cap = m.sliding_window or m.chunk_size
        return f"{m.L - sliding} full + {sliding} {what} ({cap} tokens) layers, {kind}"
    return f"full attention on all {m.L} layers, {kind}"
