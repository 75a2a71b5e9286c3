"""Quantization per module group: which weight format (and activation format) each part of the model runs.

A checkpoint rarely quantizes everything: gpt-oss keeps attention, router, embeddings and lm_head in bf16 and
only its MoE experts in MXFP4; NVIDIA's NVFP4 checkpoints exclude the router gates and lm_head; Kimi-K2.5's
W4A16 leaves attention, shared experts and the dense MLP 16-bit. So the result is a table

    module group (attention, dense_mlp, experts, shared_experts, router, embeddings, lm_head)
        -> weight format, nominal bits, bits per weight including scales, activation format, why

Fields and matching rules per method, read from the readers of vLLM (`model_executor/layers/quantization/`),
transformers (`utils/quantization_config.py`, `quantizers/quantizers_utils.py`) and compressed-tensors
(`quantization/quant_args.py`, `utils/match.py`):

- awq: `bits`/`w_bit`, `group_size`/`q_group_size`, `zero_point`; `modules_to_not_convert` by substring.
- gptq (gptq_marlin, auto_gptq): `bits`, `group_size` (-1 = per channel), `lm_head`; `dynamic` keys
  `-:<regex>` skip modules; `modules_in_block_to_quantize` is a whitelist.
- fp8: `weight_block_size` ([128, 128]) or per-tensor, `activation_scheme`; `ignored_layers` /
  `modules_to_not_convert` by exact full name. W8A8.
- compressed-tensors: `config_groups.*.{targets, weights, input_activations}`, `ignore` (exact name, or `re:`
  regex anchored at the start; target `Linear` = every linear layer), `kv_cache_scheme`.
- mxfp4 (gpt-oss): MoE experts only (vLLM's Mxfp4Config quantizes no Linear layer), e2m1 + e8m0 scale per 32.
- modelopt: `quant_algo` FP8 / NVFP4 / MXFP8 / W4A8_AWQ, `group_size`, `exclude_modules` or `ignore` (exact,
  substring, fnmatch wildcard), `kv_cache_quant_algo` / `kv_cache_scheme`; in config.json or in the
  `hf_quant_config.json` beside it.
- bitsandbytes: `load_in_4bit` (nf4/fp4, blocks of 64, `bnb_4bit_use_double_quant`) / `load_in_8bit`;
  `llm_int8_skip_modules` (prefix, suffix or regex); lm_head is never converted.
- hqq: `quant_config.weight_quant_params.{nbits, group_size}`, `skip_modules`.
- quark: `global_quant_config.{weight, input_tensors}.dtype`, `exclude`.

Bits per weight include the scales and zero points: AWQ/GPTQ 4 + 20/G (4.156 at G = 128), MXFP4 4 + 8/32 = 4.25,
NVFP4 4 + 8/16 = 4.5, FP8 block 128×128 8 + 32/16384, bitsandbytes nf4 4 + 32/64 = 4.5 (4.127 double-quant).
Embeddings are gathered, never quantized by these methods. MoE routers are linear layers that stay 16-bit where
the checkpoint excludes them (all published ones do); DeepSeek-family gates are built without a quant method.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tracediag.errors import InputError

if TYPE_CHECKING:
    from tracediag.model.config import ModelConfig

GROUPS = ("attention", "dense_mlp", "experts", "shared_experts", "router", "embeddings", "lm_head")
GROUP_LABEL = {
    "attention": "attention projections (q/k/v/o)",
    "dense_mlp": "dense MLP",
    "experts": "MoE experts",
    "shared_experts": "shared experts",
    "router": "MoE router",
    "embeddings": "embeddings",
    "lm_head": "lm_head",
}


@dataclass(frozen=True)
class Format:
    """A weight storage format and the activation format its kernels take."""

    name: str  # "bf16", "int4", "fp8_e4m3", "mxfp4", "nvfp4", "nf4", "int8", ...
    weight_bits: int | None  # nominal bits per weight (16, 8, 4); None = unknown method
    bits_per_weight: float | None  # including scales / zero points
    act_bits: int | None  # bits of the activations the GEMM consumes (16 = unquantized)
    act_format: str  # "bf16", "fp8", "int8", "nvfp4", ...
    detail: str = ""  # group size, scale type...

    @property
    def quantized(self) -> bool:
        return self.weight_bits is None or self.weight_bits < 16

    @property
    def scheme(self) -> str:
        """W4A16 / W8A8 / W4A4 / W16A16 ..., or '?' for an unknown method."""
        if self.weight_bits is None:
            return "?"
        return f"W{self.weight_bits}A{self.act_bits or 16}"


@dataclass(frozen=True)
class GroupQuant:
    group: str
    fmt: Format
    why: str  # "quantized: awq bits 4", "excluded: modules_to_not_convert 'model.layers.*.self_attn'", ...
    excluded_share: float = 0.0  # share of the group's layers whose modules the exclusion list matched

    @property
    def quantized(self) -> bool:
        return self.fmt.quantized

    def row(self) -> dict[str, Any]:
        return {
            "group": self.group,
            "format": self.fmt.name,
            "scheme": self.fmt.scheme,
            "weight_bits": self.fmt.weight_bits,
            "bits_per_weight": round(self.fmt.bits_per_weight, 4) if self.fmt.bits_per_weight else None,
            "activations": self.fmt.act_format,
            "detail": self.fmt.detail,
            "why": self.why,
        }


@dataclass(frozen=True)
class Quantization:
    method: str | None  # quant_method (lower case), None for a 16-bit checkpoint
    source: str | None  # where the config came from
    groups: dict[str, GroupQuant]
    kv_cache: str | None = None  # "fp8" when the checkpoint declares an FP8 KV cache
    notes: tuple[str, ...] = ()

    @property
    def quantized_groups(self) -> list[GroupQuant]:
        return [g for g in self.groups.values() if g.quantized]

    @property
    def main_bits(self) -> int | None:
        """Nominal weight bits of the quantized groups: the experts' for a MoE checkpoint, else the first."""
        q = self.quantized_groups
        if not q:
            return None
        g = self.groups.get("experts")
        return (g if g is not None and g.quantized else q[0]).fmt.weight_bits

    def describe(self) -> str:
        """One line: 'mxfp4: experts MXFP4 (W4A16); attention, router, embeddings, lm_head bf16'."""
        if not self.quantized_groups:
            return "no quantized module group"
        by: dict[str, list[str]] = {}
        for g in self.groups.values():
            key = f"{g.fmt.name} ({g.fmt.scheme})" if g.quantized else g.fmt.name
            by.setdefault(key, []).append(g.group)
        return f"{self.method}: " + "; ".join(f"{', '.join(v)} {k}" for k, v in by.items())

    def table(self) -> list[dict[str, Any]]:
        return [g.row() for g in self.groups.values()]


# ------------------------------------------------------------------ module names per group

_STD_ATTN = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj")
_GATED = ("gate_proj", "up_proj", "down_proj")


def _family(m: ModelConfig) -> str:
    mt = m.model_type or ""
    if mt == "gpt_oss":
        return "gpt_oss"
    if mt.startswith("mixtral"):
        return "mixtral"
    if mt.startswith("llama4"):
        return "llama4"
    if (m.attention is not None and m.attention.kind == "MLA") or mt.startswith(("deepseek", "kimi")):
        return "deepseek"
    if mt == "qwen2_moe":
        return "qwen2_moe"
    return "default"


def module_templates(m: ModelConfig) -> dict[str, tuple[str, ...]]:
    """Hugging Face module names per group, relative to a decoder layer (`{e}` = an expert index)."""
    fam = _family(m)
    a = m.attention
    if a is not None and a.kind == "MLA":
        q = ("self_attn.q_a_proj", "self_attn.q_b_proj") if a.q_lora_rank else ("self_attn.q_proj",)
        attn = (*q, "self_attn.kv_a_proj_with_mqa", "self_attn.kv_b_proj", "self_attn.o_proj")
    else:
        attn = _STD_ATTN
    mlp = "feed_forward" if fam == "llama4" else "mlp"
    out: dict[str, tuple[str, ...]] = {"attention": attn, "dense_mlp": tuple(f"{mlp}.{x}" for x in _GATED)}
    if fam == "mixtral":
        out["experts"] = tuple(f"block_sparse_moe.experts.{{e}}.{w}" for w in ("w1", "w2", "w3"))
        out["router"] = ("block_sparse_moe.gate",)
    elif fam == "gpt_oss":
        out["experts"] = ("mlp.experts",)
        out["router"] = ("mlp.router",)
    elif fam == "llama4":
        out["experts"] = ("feed_forward.experts",)
        out["router"] = ("feed_forward.router",)
        out["shared_experts"] = tuple(f"feed_forward.shared_expert.{x}" for x in _GATED)
    else:
        out["experts"] = tuple(f"mlp.experts.{{e}}.{x}" for x in _GATED)
        out["router"] = ("mlp.gate",)
        shared = "shared_experts" if fam == "deepseek" else "shared_expert"
        out["shared_experts"] = tuple(f"mlp.{shared}.{x}" for x in _GATED)
    return out


def _layer_prefixes(m: ModelConfig, i: int) -> tuple[str, ...]:
    base = f"model.layers.{i}."
    if not m.multimodal:
        return (base,)
    return (base, f"language_model.{base}", f"model.language_model.layers.{i}.")


def _top_names(m: ModelConfig, group: str) -> tuple[str, ...]:
    name = "model.embed_tokens" if group == "embeddings" else "lm_head"
    if not m.multimodal:
        return (name,)
    return (name, f"language_model.{name}", f"model.language_model.{name.removeprefix('model.')}")


def _layers_of(m: ModelConfig, group: str) -> list[int]:
    moe_layers = set(m.moe.moe_layers) if m.moe else set()
    if group == "attention":
        return list(range(m.L))
    if group == "dense_mlp":
        return [i for i in range(m.L) if i not in moe_layers]
    if group == "shared_experts":
        return sorted(moe_layers) if m.moe and m.moe.shared_experts else []
    return sorted(moe_layers)


def present_groups(m: ModelConfig) -> list[str]:
    out = ["attention"]
    if _layers_of(m, "dense_mlp") and m.dense_I:
        out.append("dense_mlp")
    if m.moe:
        out.append("experts")
        if m.moe.shared_experts:
            out.append("shared_experts")
        out.append("router")
    out += ["embeddings", "lm_head"]
    return out


# ------------------------------------------------------------------ formats


def base_format(m: ModelConfig) -> Format:
    dt = (m.dtype or "bfloat16").lower()
    if dt in ("float32", "float", "fp32"):
        return Format("fp32", 32, 32.0, 32, "fp32")
    name = "fp16" if dt in ("float16", "half", "fp16") else "bf16"
    note = "" if m.dtype else "no torch_dtype in the config: bf16 assumed"
    return Format(name, 16, 16.0, 16, name, note)


def _act(bits: int | None, kind: str, base: Format) -> tuple[int, str]:
    return (16, base.act_format) if not bits or bits >= 16 else (bits, kind)


class _Matcher:
    """Whether a full module name is excluded, by the method's matching rule."""

    def __init__(self, entries: list[str], mode: str, notes: list[str], label: str) -> None:
        self.entries = [e for e in entries if isinstance(e, str) and e]
        self.mode = mode
        self.label = label
        self._rx: list[tuple[str, re.Pattern[str]]] = []
        if mode in ("regex", "ct", "bnb", "quark"):
            for e in self.entries:
                pat = e.removeprefix("re:") if mode in ("ct", "quark") and e.startswith("re:") else None
                src = pat if pat is not None else (re.escape(e) if mode in ("ct", "quark") else e)
                try:
                    self._rx.append((e, re.compile(src)))
                except re.error:
                    notes.append(f"{label} entry {e!r} is not a valid regex: ignored")

    def hit(self, name: str) -> str | None:
        """The entry that excludes `name`, or None."""
        for e in self.entries:
            if self.mode == "substring" and e in name:
                return e
            if self.mode == "exact" and name == e:
                return e
            if self.mode == "modelopt" and (name == e or e in name or fnmatch.fnmatchcase(name, e)):
                return e
            if self.mode == "bnb" and (name == e or name.startswith(e + ".") or name.endswith(e)):
                return e
        for e, rx in self._rx:
            if self.mode == "regex" and (rx.match(name) or name.endswith(e)):
                return e  # transformers should_convert_module: re.match(key) or name.endswith(key)
            if self.mode in ("ct", "quark"):
                if e.startswith("re:") and rx.match(name):
                    return e
                if not e.startswith("re:") and name == e:
                    return e
            if self.mode == "bnb" and rx.fullmatch(name):
                return e
        return None


def _excluded_share(m: ModelConfig, group: str, matcher: _Matcher | None) -> tuple[float, str | None]:
    """Share of the group's layers whose every module the matcher excludes, and an entry that matched."""
    if matcher is None or not matcher.entries:
        return 0.0, None
    if group in ("embeddings", "lm_head"):
        for n in _top_names(m, group):
            e = matcher.hit(n)
            if e:
                return 1.0, e
        return 0.0, None
    layers = _layers_of(m, group)
    if not layers:
        return 0.0, None
    rel = module_templates(m).get(group, ())
    excluded, entry = 0, None
    for i in layers:
        names = [rel_name.format(e=0) for rel_name in rel]
        hits = []
        for r in names:
            hit = None
            for pre in _layer_prefixes(m, i):
                hit = hit or matcher.hit(pre + r)
            hits.append(hit)
        if hits and all(hits):
            excluded += 1
            entry = entry or hits[0]
    return excluded / len(layers), entry


def _assign(
    m: ModelConfig,
    method: str,
    fmt: Format,
    applies: tuple[str, ...],
    matcher: _Matcher | None,
    why: str,
    not_by_method: str,
) -> dict[str, GroupQuant]:
    base = base_format(m)
    out: dict[str, GroupQuant] = {}
    for g in present_groups(m):
        if g not in applies:
            out[g] = GroupQuant(
                g,
                base,
                f"{base.name}: {not_by_method if g != 'embeddings' else 'embeddings are gathered, not quantized'}",
            )
            continue
        share, entry = _excluded_share(m, g, matcher)
        if share >= 1.0:
            out[g] = GroupQuant(g, base, f"{base.name}: excluded by {matcher.label} {entry!r}", 1.0)
        elif share > 0:
            out[g] = GroupQuant(
                g, fmt, f"quantized ({why}); {share:.0%} of its layers excluded by {matcher.label} {entry!r}", share
            )
        else:
            out[g] = GroupQuant(g, fmt, f"quantized: {why}")
    return out


_LINEAR = ("attention", "dense_mlp", "experts", "shared_experts", "router", "lm_head")


def _router_rule(m: ModelConfig, applies: tuple[str, ...]) -> tuple[str, ...]:
    # vLLM deepseek_v2.py builds the MoE gate as ReplicatedLinear(..., quant_config=None)
    return tuple(g for g in applies if not (g == "router" and _family(m) == "deepseek"))


def _int_or(d: dict[str, Any], *keys: str, default: Any = None) -> Any:
    for k in keys:
        v = d.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return default


def _awq(m, qc, notes):
    bits = _int_or(qc, "bits", "w_bit", default=4)
    g = _int_or(qc, "group_size", "q_group_size", default=128)
    zp = qc.get("zero_point", True) is not False
    bpw = bits + (16 + (bits if zp else 0)) / g if g and g > 0 else float(bits)
    fmt = Format(
        f"int{bits}",
        bits,
        bpw,
        *_act(16, "bf16", base_format(m)),
        f"AWQ G={g}, 16-bit scale" + (" + zero" if zp else ""),
    )
    matcher = _Matcher(list(qc.get("modules_to_not_convert") or []), "substring", notes, "modules_to_not_convert")
    applies = _LINEAR if qc.get("lm_head") is True else _LINEAR[:-1]
    return _assign(m, "awq", fmt, _router_rule(m, applies), matcher, f"awq bits {bits}", "not quantized by awq")


def _gptq(m, qc, notes):
    bits = _int_or(qc, "bits", default=4)
    g = _int_or(qc, "group_size", default=128)
    per = g if g and g > 0 else m.H
    bpw = bits + 20 / per
    detail = f"GPTQ G={g}" if g and g > 0 else "GPTQ per-channel scales (group_size -1)"
    fmt = Format(f"int{bits}", bits, bpw, 16, base_format(m).act_format, detail)
    skips = [k[2:] for k in (qc.get("dynamic") or {}) if isinstance(k, str) and k.startswith("-:")]
    matcher = _Matcher(skips, "regex", notes, "dynamic '-:'")
    applies = _LINEAR if qc.get("lm_head") is True else _LINEAR[:-1]
    block = qc.get("modules_in_block_to_quantize")
    if isinstance(block, list) and block:
        flat = {x for grp in block for x in (grp if isinstance(grp, list) else [grp]) if isinstance(x, str)}
        tmpl = module_templates(m)
        applies = tuple(
            g2 for g2 in applies if g2 not in tmpl or any(any(t.endswith(f) for f in flat) for t in tmpl[g2])
        )
    return _assign(m, "gptq", fmt, _router_rule(m, applies), matcher, f"gptq bits {bits}", "not quantized by gptq")


def _fp8(m, qc, notes):
    block = qc.get("weight_block_size")
    if isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block):
        bpw, detail = 8 + 32 / (block[0] * block[1]), f"block {block[0]}×{block[1]}, fp32 scale per block"
    else:
        bpw, detail = 8.0, "per-tensor fp32 scale"
    detail += f"; activations {qc.get('activation_scheme', '?')}"
    fmt = Format("fp8_e4m3", 8, bpw, 8, "fp8", detail)
    ignored = qc.get("ignored_layers") or qc.get("modules_to_not_convert") or []
    matcher = _Matcher(list(ignored), "exact", notes, "modules_to_not_convert")
    return _assign(m, "fp8", fmt, _router_rule(m, _LINEAR[:-1]), matcher, "fp8 e4m3", "not quantized by fp8 (vLLM)")


def _ct_format(m, w: dict[str, Any], a: dict[str, Any] | None) -> Format:
    bits = _int_or(w, "num_bits", default=8)
    typ = str(w.get("type", "int"))
    strategy = str(w.get("strategy", "tensor"))
    g = _int_or(w, "group_size")
    if typ == "float" and bits == 4:
        name = "mxfp4" if g == 32 else "nvfp4"
        bpw = bits + 8 / (g or 16)
    elif typ == "float" and bits == 8:
        name = "fp8_e4m3"
        blk = w.get("block_structure")
        bpw = 8 + 32 / (blk[0] * blk[1]) if isinstance(blk, list) and len(blk) == 2 else 8.0
    else:
        name = f"int{bits}"
        scale = 16 / g if strategy == "group" and g else 0.0
        zp = 0.0 if w.get("symmetric", True) else bits / (g or m.H)
        bpw = bits + scale + zp
    if a:
        ab = _int_or(a, "num_bits", default=8)
        at = str(a.get("type", "int"))
        act = (ab, ("nvfp4" if ab == 4 else "fp8") if at == "float" else f"int{ab}")
    else:
        act = (16, base_format(m).act_format)
    detail = f"{typ} {bits}-bit, strategy {strategy}" + (f", group {g}" if g else "")
    return Format(name, bits, bpw, act[0], act[1], detail)


def _compressed_tensors(m, qc, notes):
    groups = qc.get("config_groups") or {}
    ignore = _Matcher(list(qc.get("ignore") or []), "ct", notes, "ignore")
    schemes = []
    for gname, grp in groups.items():
        if not isinstance(grp, dict) or not isinstance(grp.get("weights"), dict):
            continue
        targets = [t for t in grp.get("targets") or [] if isinstance(t, str)]
        schemes.append((gname, targets, _ct_format(m, grp["weights"], grp.get("input_activations"))))
    out = _assign(m, "compressed-tensors", Format("?", None, None, None, "?"), (), None, "", "")
    base = base_format(m)
    tmpl = module_templates(m)
    for g in present_groups(m):
        if g == "embeddings":
            continue
        names = (
            list(_top_names(m, g))
            if g == "lm_head"
            else [pre + r.format(e=0) for i in _layers_of(m, g)[:1] for pre in _layer_prefixes(m, i) for r in tmpl[g]]
        )
        if g == "router" and _family(m) == "deepseek":
            out[g] = GroupQuant(g, base, f"{base.name}: DeepSeek-family MoE gate is not a Linear layer")
            continue
        chosen = None
        for gname, targets, fmt in schemes:
            for t in targets:
                hit = t == "Linear" or any(
                    (t.startswith("re:") and re.match(t[3:], n)) or t == n or n.endswith("." + t) for n in names
                )
                if hit:
                    chosen = (gname, fmt)
                    break
            if chosen:
                break
        if chosen is None:
            out[g] = GroupQuant(g, base, f"{base.name}: no config_group targets it")
            continue
        share, entry = _excluded_share(m, g, ignore)
        if share >= 1.0:
            out[g] = GroupQuant(g, base, f"{base.name}: excluded by ignore {entry!r}", 1.0)
        else:
            extra = f"; {share:.0%} of its layers ignored ({entry!r})" if share else ""
            out[g] = GroupQuant(g, chosen[1], f"quantized: config_groups.{chosen[0]}{extra}", share)
    return out


def _mxfp4(m, qc, notes):
    fmt = Format("mxfp4", 4, 4.25, 16, base_format(m).act_format, "e2m1, e8m0 scale per 32")
    matcher = _Matcher(list(qc.get("modules_to_not_convert") or []), "regex", notes, "modules_to_not_convert")
    return _assign(m, "mxfp4", fmt, ("experts",), matcher, "mxfp4 (MoE experts)", "mxfp4 quantizes only MoE experts")


def _modelopt(m, qc, notes):
    algo = str(qc.get("quant_algo") or "").upper()
    g = _int_or(qc, "group_size")
    if algo == "FP8":
        fmt = Format("fp8_e4m3", 8, 8.0, 8, "fp8", "per-tensor scales (ModelOpt FP8)")
    elif algo == "NVFP4":
        g = g or 16
        fmt = Format("nvfp4", 4, 4 + 8 / g, 4, "nvfp4", f"e2m1, e4m3 scale per {g} + fp32 per tensor")
    elif algo == "MXFP8":
        fmt = Format("mxfp8", 8, 8.25, 8, "mxfp8", "e4m3, e8m0 scale per 32")
    elif algo.startswith("W4A8"):
        g = g or 128
        fmt = Format("int4", 4, 4 + 16 / g, 8, "fp8", f"{algo} G={g}")
    else:
        fmt = Format(f"modelopt {algo or '?'}", None, None, None, "?", "quant_algo not known to tracediag")
        notes.append(f"modelopt quant_algo {algo or '(none)'} unknown: its groups' bytes cannot be counted")
    excl = qc.get("exclude_modules") or qc.get("ignore") or []
    matcher = _Matcher(list(excl), "modelopt", notes, "exclude_modules" if "exclude_modules" in qc else "ignore")
    return _assign(m, "modelopt", fmt, _router_rule(m, _LINEAR), matcher, f"modelopt {algo}", "")


def _bnb(m, qc, notes):
    if qc.get("load_in_4bit") is True or qc.get("_load_in_4bit") is True:
        kind = str(qc.get("bnb_4bit_quant_type", "fp4"))
        dq = qc.get("bnb_4bit_use_double_quant") is True
        bpw = 4 + 8 / 64 + 32 / (64 * 256) if dq else 4 + 32 / 64
        fmt = Format(kind, 4, bpw, 16, base_format(m).act_format, "blocks of 64" + (", double quant" if dq else ""))
    elif qc.get("load_in_8bit") is True or qc.get("_load_in_8bit") is True:
        fmt = Format("int8", 8, 8 + 32 / m.H, 8, "int8", "LLM.int8 (fp16 outliers)")
    else:
        return _assign(m, "bitsandbytes", base_format(m), (), None, "", "neither load_in_4bit nor load_in_8bit")
    matcher = _Matcher(list(qc.get("llm_int8_skip_modules") or []), "bnb", notes, "llm_int8_skip_modules")
    return _assign(m, "bitsandbytes", fmt, _router_rule(m, _LINEAR[:-1]), matcher, f"bitsandbytes {fmt.name}", "")


def _hqq(m, qc, notes):
    wq = (
        ((qc.get("quant_config") or {}).get("weight_quant_params") or {})
        if isinstance(qc.get("quant_config"), dict)
        else {}
    )
    bits = _int_or(wq, "nbits", default=4)
    g = _int_or(wq, "group_size", default=64)
    fmt = Format(f"int{bits}", bits, bits + 32 / g, 16, base_format(m).act_format, f"HQQ G={g}")
    matcher = _Matcher(list(qc.get("skip_modules") or ["lm_head"]), "substring", notes, "skip_modules")
    return _assign(m, "hqq", fmt, _router_rule(m, _LINEAR), matcher, f"hqq nbits {bits}", "")


_QUARK_BITS = {"int4": 4, "uint4": 4, "fp4": 4, "int8": 8, "uint8": 8, "fp8_e4m3": 8, "fp8_e5m2": 8}


def _quark(m, qc, notes):
    glob = qc.get("global_quant_config") or {}
    w = glob.get("weight") or {}
    w = w[0] if isinstance(w, list) and w else w
    a = glob.get("input_tensors") or {}
    dt = str((w or {}).get("dtype", "?"))
    bits = _QUARK_BITS.get(dt)
    g = _int_or(w or {}, "group_size")
    if dt == "fp4":
        name, bpw = ("mxfp4", 4.25) if g == 32 else ("nvfp4", 4.5)
    elif bits:
        name, bpw = dt, bits + (16 / g if g else 0.0)
    else:
        name, bpw = f"quark {dt}", None
    adt = str((a or {}).get("dtype", "")) if isinstance(a, dict) else ""
    act = (_QUARK_BITS.get(adt, 16), adt or base_format(m).act_format)
    fmt = Format(name, bits, bpw, act[0], act[1], f"quark weight dtype {dt}" + (f", group {g}" if g else ""))
    matcher = _Matcher(list(qc.get("exclude") or []), "quark", notes, "exclude")
    return _assign(m, "quark", fmt, _router_rule(m, _LINEAR), matcher, f"quark {dt}", "")


_METHODS = {
    "awq": _awq,
    "awq_marlin": _awq,
    "auto_awq": _awq,
    "gptq": _gptq,
    "gptq_marlin": _gptq,
    "auto_gptq": _gptq,
    "fp8": _fp8,
    "compressed-tensors": _compressed_tensors,
    "compressed_tensors": _compressed_tensors,
    "mxfp4": _mxfp4,
    "modelopt": _modelopt,
    "modelopt_fp4": _modelopt,
    "bitsandbytes": _bnb,
    "hqq": _hqq,
    "quark": _quark,
}


def _method_of(qc: dict[str, Any]) -> str:
    method = str(qc.get("quant_method") or "").lower()
    if method:
        return method
    # quantize_config.json files carry no quant_method: tell GPTQ (desc_act, damp_percent) from AWQ (w_bit, version)
    if "w_bit" in qc or "zero_point" in qc or "version" in qc:
        return "awq"
    if "desc_act" in qc or "damp_percent" in qc or "checkpoint_format" in qc:
        return "gptq"
    if "quant_algo" in qc:
        return "modelopt"
    return "?"


def _kv_cache(qc: dict[str, Any]) -> str | None:
    algo = qc.get("kv_cache_quant_algo")
    if isinstance(algo, str) and algo.upper().startswith("FP8"):
        return "fp8"
    scheme = qc.get("kv_cache_scheme")
    if isinstance(scheme, dict) and scheme.get("num_bits") == 8:
        return "fp8" if scheme.get("type") == "float" else "int8"
    return None


def resolve(m: ModelConfig, qc: dict[str, Any] | None, source: str | None, path: Path) -> Quantization:
    """The format of every module group of `m` under the quantization config `qc` (None: 16-bit checkpoint)."""
    base = base_format(m)
    if qc is None:
        groups = {g: GroupQuant(g, base, f"{base.name}: no quantization config") for g in present_groups(m)}
        return Quantization(None, None, groups)
    method = _method_of(qc)
    notes: list[str] = []
    fn = _METHODS.get(method)
    if fn is None:
        fmt = Format(f"{method} (unknown)", None, None, None, "?", "quant_method not known to tracediag")
        groups = {
            g: GroupQuant(g, fmt if g in _LINEAR[:-1] else base, f"{method}: method not known to tracediag")
            for g in present_groups(m)
        }
        notes.append(f"quant_method {method!r} not known: quantized groups' bytes cannot be counted")
        return Quantization(method, source, groups, _kv_cache(qc), tuple(notes))
    try:
        groups = fn(m, qc, notes)
    except (TypeError, AttributeError, ValueError, ZeroDivisionError) as exc:
        raise InputError(path, f"quantization config ({source}) is malformed for {method}: {exc}") from None
    if not any(g.quantized for g in groups.values()):
        notes.append(f"{method}: the config quantizes no module group of this architecture")
    return Quantization(method, source, groups, _kv_cache(qc), tuple(notes))
