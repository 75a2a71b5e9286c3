"""The served model from a Hugging Face `config.json`: the symbols of docs/method.md (L, H, I, h, H_kv, D) and the
architecture the byte accounting needs — dense vs expert MLP widths and which layers are MoE, attention kind
(MHA/GQA/MQA/MLA) and per-layer KV shape, sliding windows, and the quantization of each module group.

Field names and the rules that place MoE layers and sliding windows are those of transformers 5.x and vLLM
(`transformers/models/<m>/configuration_<m>.py`, `vllm/model_executor/models/<m>.py`); every family is tested
on a published config in tests/data/configs/ (README there: source of each file).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tracediag.errors import InputError

# Bytes per element of the dtype names Hugging Face configs use.
DTYPE_BYTES = {
    "float32": 4,
    "float": 4,
    "fp32": 4,
    "float16": 2,
    "half": 2,
    "fp16": 2,
    "bfloat16": 2,
    "bf16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
    "float64": 8,
}

# Aliases across architectures (GPT-2 `n_embd`, T5/OPT-style `d_model`, Falcon `n_head`, ...).
_ALIASES: dict[str, tuple[str, ...]] = {
    "hidden_size": ("hidden_size", "n_embd", "d_model", "model_dim"),
    "num_hidden_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "intermediate_size": ("intermediate_size", "ffn_hidden_size", "n_inner", "ffn_dim"),
    "num_attention_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_key_value_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"),
}
REQUIRED = ("hidden_size", "num_hidden_layers")

# Upper bounds an order of magnitude or more above every published model (hidden 16384, vocab 262208,
# intermediate 53248, 128 heads, 256 experts, 126 layers): a larger value is a broken file, and letting it
# through would turn every byte count into nonsense (or 2**63 into an overflow in a numpy column).
_LIMITS = {
    "hidden_size": 1 << 20,
    "num_hidden_layers": 1 << 14,
    "intermediate_size": 1 << 22,
    "num_attention_heads": 1 << 14,
    "num_key_value_heads": 1 << 14,
    "head_dim": 1 << 16,
    "vocab_size": 1 << 24,
    "experts": 1 << 16,
    "experts_per_token": 1 << 16,
    "moe_intermediate_size": 1 << 22,
    "kv_lora_rank": 1 << 20,
    "qk_rope_head_dim": 1 << 16,
    "qk_nope_head_dim": 1 << 16,
    "v_head_dim": 1 << 16,
    "q_lora_rank": 1 << 20,
    "sliding_window": 1 << 40,
    "max_position_embeddings": 1 << 40,
}

# Defaults of the transformers config class, for nested text_config blocks that omit keys (Llava-1.5's
# text_config gives only vocab/max_position/eps/model_type; Gemma 3's omits vocab_size, max_position and the
# sliding-window pattern). transformers 5.x: models/llama/configuration_llama.py (LlamaConfig.__init__),
# models/gemma3/configuration_gemma3.py (Gemma3TextConfig.__init__).
_TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "vocab_size": 32000,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": False,
    },
    "gemma3_text": {
        "vocab_size": 262208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 256,
        "max_position_embeddings": 131072,
        "sliding_window": 4096,
        "sliding_window_pattern": 6,
        "tie_word_embeddings": True,
    },
}
# tie_word_embeddings when a config omits it: the config class default (PretrainedConfig's is True; Llama, Qwen2,
# Mistral... override it to False). True for the Gemma family (Gemma2Config, Gemma3TextConfig) and GPT-2/OPT/Bloom.
_TIED_BY_DEFAULT = frozenset({"gemma", "gemma2", "gemma3", "gemma3_text", "gpt2", "opt", "bloom", "gpt_bigcode"})
# MLP with two matrices (up, down) instead of the gated three (gate, up, down).
_UNGATED_MLP = frozenset({"gpt2", "gpt_neox", "gptj", "opt", "bloom", "falcon", "phi", "starcoder2", "gpt_bigcode"})


@dataclass(frozen=True)
class Attention:
    """Attention kind and the per-token shapes the byte accounting needs."""

    kind: str  # "MHA", "GQA", "MQA" or "MLA"
    q_head_dim: int | None  # query/key head dim (MLA: qk_nope_head_dim + qk_rope_head_dim)
    v_head_dim: int | None  # value head dim (MLA: v_head_dim; else = q_head_dim)
    kv_lora_rank: int | None = None  # MLA: width of the compressed KV latent
    qk_rope_head_dim: int | None = None  # MLA: rope part of the key, cached beside the latent
    qk_nope_head_dim: int | None = None  # MLA
    q_lora_rank: int | None = None  # MLA: None = plain q_proj (DeepSeek-V2-Lite)
    bias: bool = False  # q/k/v/o carry biases (gpt-oss attention_bias, Qwen2 qkv bias)
    sinks: bool = False  # gpt-oss: one learnable logit per head (no effect on the KV cache)


@dataclass(frozen=True)
class MoE:
    """Mixture-of-experts MLP: experts per layer, routing, widths, and which layers are MoE."""

    experts: int  # routed experts per MoE layer (E)
    top_k: int  # experts per token (k)
    expert_I: int  # intermediate width of one expert
    moe_layers: tuple[int, ...]  # indices of the MoE layers (the others are dense)
    shared_experts: int = 0  # always-on shared expert MLPs per MoE layer
    shared_I: int | None = None  # width of the shared-expert MLP (all shared experts together)
    router_bias: bool = False
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["moe_layers"] = len(self.moe_layers)
        d["notes"] = list(self.notes)
        return d


@dataclass(frozen=True)
class ModelConfig:
    """Shape symbols and architecture. Optional fields are None when the config lacks them (rules then say
    not applicable)."""

    path: str
    L: int  # layers
    H: int  # hidden size
    I: int | None  # MLP width the layers use: dense layers' width, else the expert width  # noqa: E741
    h: int | None  # attention heads
    H_kv: int | None  # KV heads
    D: int | None  # head dim (MLA: the q/k head dim qk_nope + qk_rope)
    dtype: str | None  # torch_dtype as written
    dtype_bytes: int | None
    quantization: dict[str, Any] | None  # the quantization config verbatim (wherever it was found)
    vocab_size: int | None
    architecture: str | None
    notes: tuple[str, ...] = ()  # how fields were resolved (aliases, defaults, nested text_config)
    model_type: str | None = None
    dense_I: int | None = None  # width of the dense (non-MoE) MLP layers; None when every layer is MoE
    moe: MoE | None = None
    attention: Attention | None = None
    layer_types: tuple[str, ...] = ()  # per layer: "full", "sliding" or "chunked"
    sliding_window: int | None = None  # tokens a sliding layer keeps
    chunk_size: int | None = None  # tokens a chunked-attention layer attends within (Llama 4)
    max_position_embeddings: int | None = None
    tie_word_embeddings: bool = False
    gated_mlp: bool = True
    quantization_source: str | None = None  # where the quantization config came from
    quant: Any = None  # tracediag.model.quant.Quantization: format per module group
    multimodal: bool = False  # the text model sits under text_config

    @property
    def weight_bits(self) -> int | None:
        """Weight bits of the quantized module groups (experts first for MoE checkpoints); None if none is."""
        return self.quant.main_bits if self.quant is not None else None

    @property
    def sliding_layers(self) -> int:
        return sum(t == "sliding" for t in self.layer_types)

    def kv_elements_per_token_layer(self, p: int = 1) -> int | None:
        """Elements one rank caches per token and layer: MLA one latent of kv_lora_rank + qk_rope_head_dim
        (replicated on every TP rank); otherwise K and V of ceil(H_kv/p) heads of D."""
        a = self.attention
        if a is not None and a.kind == "MLA":
            return (a.kv_lora_rank or 0) + (a.qk_rope_head_dim or 0)
        if self.H_kv is None or self.D is None:
            return None
        return 2 * math.ceil(self.H_kv / p) * self.D

    def missing(self, *fields: str) -> list[str]:
        return [f for f in fields if getattr(self, f) is None]

    def to_dict(self) -> dict[str, Any]:
        d = {
            k: getattr(self, k)
            for k in (
                "path",
                "L",
                "H",
                "I",
                "h",
                "H_kv",
                "D",
                "dtype",
                "dtype_bytes",
                "quantization",
                "vocab_size",
                "architecture",
            )
        }
        d["notes"] = list(self.notes)
        d |= {
            "model_type": self.model_type,
            "dense_I": self.dense_I,
            "moe": self.moe.to_dict() if self.moe else None,
            "attention": asdict(self.attention) if self.attention else None,
            "sliding_window": self.sliding_window,
            "sliding_layers": self.sliding_layers,
            "quantization_source": self.quantization_source,
            "quantization_groups": self.quant.table() if self.quant is not None else [],
        }
        return d


# ------------------------------------------------------------------ reading and validating


def _has_surrogates(s: str) -> bool:
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def _not_text(doc: Any) -> str | None:
    """The place ('architectures[0]') of the first key or string that cannot be written as UTF-8 (a lone
    surrogate escape such as \\ud800 is valid JSON but no text), or None."""
    todo: list[tuple[str, Any]] = [("", doc)]
    while todo:
        where, v = todo.pop()
        if isinstance(v, str):
            if _has_surrogates(v):
                return where or "the document"
        elif isinstance(v, dict):
            for k, x in v.items():
                name = f"{where}.{k}" if where else str(k)
                if _has_surrogates(str(k)):
                    return f"a key in {where or 'the document'}"
                todo.append((name, x))
        elif isinstance(v, list):
            todo.extend((f"{where}[{i}]", x) for i, x in enumerate(v))
    return None


def _read_json(p: Path, what: str) -> Any:
    doc = _decode_json(p, what)
    bad = _not_text(doc)
    if bad is not None:
        raise InputError(p, f"{what}: {bad} is not valid text (a lone surrogate escape such as \\ud800)")
    return doc


def _decode_json(p: Path, what: str) -> Any:
    from tracediag.inputfile import read_input

    raw = read_input(p, what)
    try:
        return json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(p, f"{what} is not valid JSON ({exc})") from None
    except RecursionError:  # the decoder's depth is the interpreter's: a config is a few levels deep
        raise InputError(p, f"{what} is not valid JSON (nested hundreds of levels deep)") from None
    except ValueError as exc:  # an integer of more than 4,300 digits (int_max_str_digits)
        raise InputError(p, f"{what} is not valid JSON ({str(exc).split(';', 1)[0]})") from None


def _int_field(p: Path, cfg: dict[str, Any], key: str, limit_key: str | None = None, strict: bool = True) -> int | None:
    """cfg[key] as a positive int within its limit; None when absent or null; InputError when malformed.

    strict=False (optional keys that only refine the accounting, e.g. a sliding window): a value that is not
    a positive integer counts as absent instead of stopping the analysis."""
    v = cfg.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            v = int(v)
        elif not strict:
            return None
        else:
            raise InputError(p, f"model config: {key} = {v!r} is not an integer")
    if not strict and v <= 0:
        return None
    lim = _LIMITS.get(limit_key or key, 1 << 40)
    if v <= 0:
        raise InputError(p, f"model config: {key} = {v} must be a positive integer")
    if v > lim:
        raise InputError(p, f"model config: {key} = {v} is implausibly large (limit {lim:,}): a corrupt config?")
    return v


def _first(p: Path, cfg: dict[str, Any], key: str) -> tuple[int | None, str | None]:
    for alias in _ALIASES[key]:
        v = _int_field(p, cfg, alias, key)
        if v is not None:
            return v, alias
    return None, None


def _text_block(raw: dict[str, Any], notes: list[str]) -> dict[str, Any]:
    """The language model's keys: top level, or text_config (with its class defaults for omitted keys)."""
    tc = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else None
    if tc is None or any(isinstance(raw.get(a), int) for a in _ALIASES["hidden_size"]):
        return raw
    defaults = _TEXT_DEFAULTS.get(str(tc.get("model_type")), {})
    used = sorted(k for k in defaults if k not in tc)
    if used:
        notes.append(f"text_config omits {', '.join(used)}: {tc.get('model_type')} config-class defaults used")
    notes.append("shape read from text_config")
    merged = {**defaults, **tc}
    for k in ("torch_dtype", "dtype", "architectures"):
        if k not in merged and k in raw:
            merged[k] = raw[k]
    return merged


def _find_quantization(p: Path, raw: dict[str, Any], cfg: dict[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """Where vLLM looks (model_loader/weight_utils.py get_quant_config): config.json quantization_config,
    text_config.quantization_config, compression_config, then the method's file beside config.json
    (hf_quant_config.json for NVIDIA ModelOpt, quantize_config.json / quant_config.json for AWQ/GPTQ)."""
    if isinstance(raw.get("quantization_config"), dict):
        return raw["quantization_config"], "config.json quantization_config"
    if cfg is not raw and isinstance(cfg.get("quantization_config"), dict):
        return cfg["quantization_config"], "config.json text_config.quantization_config"
    if isinstance(raw.get("compression_config"), dict):
        return raw["compression_config"], "config.json compression_config"
    for name in ("hf_quant_config.json", "quantize_config.json", "quant_config.json"):
        side = p.parent / name
        if not side.is_file():
            continue
        data = _read_json(side, name)
        if not isinstance(data, dict):
            raise InputError(side, f"{name} is not a JSON object")
        if name == "hf_quant_config.json":
            q = data.get("quantization")
            if not isinstance(q, dict):
                raise InputError(side, "hf_quant_config.json has no 'quantization' object")
            return {"quant_method": "modelopt", **q}, f"{name} beside config.json (ModelOpt)"
        return data, f"{name} beside config.json"
    return None, None


def _layer_types(p: Path, cfg: dict[str, Any], L: int, mt: str, notes: list[str]) -> tuple[tuple[str, ...], int | None]:
    """Per-layer attention type, the rules of transformers 5.x / vLLM; and the sliding window."""
    window = _int_field(p, cfg, "sliding_window", strict=False) or _int_field(
        p, cfg, "sliding_window_size", "sliding_window", strict=False
    )
    explicit = cfg.get("layer_types")
    if isinstance(explicit, list) and explicit:
        if len(explicit) != L:
            raise InputError(p, f"model config: layer_types lists {len(explicit)} layers, num_hidden_layers is {L}")
        kinds = {"sliding_attention": "sliding", "full_attention": "full", "chunked_attention": "chunked"}
        out = tuple(kinds.get(str(t), "full") for t in explicit)
        return out, window if "sliding" in out else None
    if mt == "gpt_oss" and window:  # configuration_gpt_oss.py: layer_types default (i+1) % 2 -> sliding
        notes.append("layer_types absent: gpt-oss alternates sliding (even layers) and full attention")
        return tuple("sliding" if (i + 1) % 2 else "full" for i in range(L)), window
    if mt == "gemma2" and window:  # configuration_gemma2.py: (i+1) % 2 -> sliding
        return tuple("sliding" if (i + 1) % 2 else "full" for i in range(L)), window
    if mt in ("gemma3", "gemma3_text") and window:  # "the pattern used to be a simple int", default 6
        pattern = _int_field(p, cfg, "sliding_window_pattern", "num_hidden_layers", strict=False) or 6
        return tuple("sliding" if (i + 1) % pattern else "full" for i in range(L)), window
    if mt.startswith("qwen"):
        # qwen2/qwen3 configuration: sliding_window is ignored unless use_sliding_window; then layers
        # i >= max_window_layers slide. The shipped configs set use_sliding_window false.
        if cfg.get("use_sliding_window") is True and window:
            mwl = _int_field(p, cfg, "max_window_layers", "num_hidden_layers", strict=False) or 0
            return tuple("sliding" if i >= mwl else "full" for i in range(L)), window
        if window:
            notes.append("sliding_window ignored: use_sliding_window is not true (Qwen rule)")
        return ("full",) * L, None
    chunk = _int_field(p, cfg, "attention_chunk_size", "sliding_window", strict=False)
    if chunk:  # Llama 4: layer_types[i] = chunked if no_rope_layers[i] else full (default every 4th full)
        nrl = cfg.get("no_rope_layers")
        if not (isinstance(nrl, list) and len(nrl) == L):
            nrl = [int((i + 1) % 4 != 0) for i in range(L)]
        return tuple("chunked" if nrl[i] else "full" for i in range(L)), None
    if window and mt in ("mistral", "mixtral", "phi3", "phi4", "starcoder2"):
        return ("sliding",) * L, window  # every layer uses the window when it is set
    return ("full",) * L, None


def _moe(p: Path, cfg: dict[str, Any], L: int, I: int | None, mt: str, notes: list[str]) -> MoE | None:  # noqa: E741
    E = None
    for key in ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts"):
        E = _int_field(p, cfg, key, "experts")
        if E:
            break
    if not E or E < 2:
        return None
    k = None
    for key in ("num_experts_per_tok", "experts_per_token", "moe_topk", "num_experts_per_token"):
        k = _int_field(p, cfg, key, "experts_per_token")
        if k:
            break
    if not k:
        raise InputError(p, f"model config: {E} experts but no num_experts_per_tok (top-k)")
    if k > E:
        raise InputError(p, f"model config: num_experts_per_tok = {k} exceeds the {E} experts")
    expert_I = _int_field(p, cfg, "moe_intermediate_size") or I
    if not expert_I:
        raise InputError(p, "model config: MoE without moe_intermediate_size or intermediate_size")
    moe_notes: list[str] = []
    if "n_routed_experts" in cfg or "first_k_dense_replace" in cfg:
        # vLLM deepseek_v2.py: MoE iff layer_idx >= first_k_dense_replace and layer_idx % moe_layer_freq == 0
        first = cfg.get("first_k_dense_replace") or 0
        freq = cfg.get("moe_layer_freq") or 1
        layers = tuple(i for i in range(L) if i >= first and i % freq == 0)
        n_shared = cfg.get("n_shared_experts") or 0
        shared_I = expert_I * n_shared if n_shared else None
        if cfg.get("num_nextn_predict_layers"):
            moe_notes.append(
                f"{cfg['num_nextn_predict_layers']} MTP layer(s) beyond num_hidden_layers not counted "
                "(loaded only for speculative decoding)"
            )
    elif mt.startswith("llama4"):
        ml = cfg.get("moe_layers")
        step = cfg.get("interleave_moe_layer_step") or 1
        layers = tuple(ml) if isinstance(ml, list) else tuple(range(step - 1, L, step))
        n_shared, shared_I = 1, expert_I  # Llama4TextMoe.shared_expert = Llama4TextMLP(config)
    else:
        # qwen2_moe / qwen3_moe: not in mlp_only_layers and (i+1) % decoder_sparse_step == 0; others: all
        only = set(cfg.get("mlp_only_layers") or [])
        step = cfg.get("decoder_sparse_step") or 1
        layers = tuple(i for i in range(L) if i not in only and (i + 1) % step == 0)
        sI = _int_field(p, cfg, "shared_expert_intermediate_size", "moe_intermediate_size")
        n_shared, shared_I = (1, sI) if sI else (0, None)
    return MoE(
        experts=E,
        top_k=k,
        expert_I=expert_I,
        moe_layers=layers,
        shared_experts=int(n_shared),
        shared_I=shared_I,
        router_bias=mt == "gpt_oss",
        notes=tuple(moe_notes),
    )


def _attention(p: Path, cfg: dict[str, Any], h: int | None, hkv: int | None, D: int | None) -> Attention:
    bias = cfg.get("attention_bias") is True or cfg.get("qkv_bias") is True
    sinks = cfg.get("model_type") == "gpt_oss"
    rank = _int_field(p, cfg, "kv_lora_rank")
    if rank:
        rope = _int_field(p, cfg, "qk_rope_head_dim") or 0
        nope = _int_field(p, cfg, "qk_nope_head_dim") or 0
        v = _int_field(p, cfg, "v_head_dim") or nope
        return Attention(
            kind="MLA",
            q_head_dim=nope + rope or D,
            v_head_dim=v,
            kv_lora_rank=rank,
            qk_rope_head_dim=rope,
            qk_nope_head_dim=nope,
            q_lora_rank=_int_field(p, cfg, "q_lora_rank"),
            bias=bias,
        )
    kind = "MHA" if hkv == h else ("MQA" if hkv == 1 else "GQA")
    return Attention(kind=kind, q_head_dim=D, v_head_dim=D, bias=bias, sinks=sinks)


def _attention_shape(
    p: Path, cfg: dict[str, Any], H: int, h: int | None, hkv: int | None, notes: list[str]
) -> tuple[int | None, int | None, Attention | None]:
    """(H_kv, D, the attention block) from the head counts, with the defaults HF applies when a field is absent
    (MHA or multi-query H_kv, D = H/h) noted; MLA's D is the query head width, not the cache's."""
    if hkv is None and h is not None:
        hkv = 1 if cfg.get("multi_query") is True else h
        notes.append(f"num_key_value_heads absent: using {hkv} ({'multi_query' if hkv == 1 else 'MHA'})")
    if h is not None and hkv is not None and (hkv > h or h % hkv):
        raise InputError(p, f"model config: num_key_value_heads = {hkv} does not divide num_attention_heads = {h}")
    D = _int_field(p, cfg, "head_dim")
    attention = None
    if h is not None:
        if D is None and _int_field(p, cfg, "kv_lora_rank") is None:
            if H % h:
                raise InputError(
                    p, f"model config: num_attention_heads = {h} does not divide hidden_size = {H} and no head_dim"
                )
            D = H // h
            notes.append("head_dim absent: using hidden_size / num_attention_heads")
        attention = _attention(p, cfg, h, hkv, D)
        if attention.kind == "MLA":
            D = attention.q_head_dim
            notes.append(
                f"MLA: D = qk_nope_head_dim + qk_rope_head_dim = {D}; the KV cache holds kv_lora_rank + "
                f"qk_rope_head_dim = {attention.kv_lora_rank + attention.qk_rope_head_dim} elements per token "
                "and layer, not 2·H_kv·D"
            )
    return hkv, D, attention


def _mlp_widths(
    p: Path, cfg: dict[str, Any], L: int, I_cfg: int | None, mt: str, notes: list[str]
) -> tuple[MoE | None, int | None, int | None]:
    """(the MoE block or None, the dense layers' MLP width, I): with MoE, I is the dense width when some layer is
    dense, else the expert width (llama4's dense layers read intermediate_size_mlp)."""
    moe = _moe(p, cfg, L, I_cfg, mt, notes)
    dense_I = I_cfg
    I = I_cfg  # noqa: E741
    if moe is not None:
        dense_layers = L - len(moe.moe_layers)
        if mt.startswith("llama4"):
            dense_I = _int_field(p, cfg, "intermediate_size_mlp", "intermediate_size") or I_cfg
        if dense_layers == 0:
            dense_I = None
            if I_cfg and I_cfg != moe.expert_I:
                notes.append(f"intermediate_size {I_cfg} is used by no layer: every layer is MoE")
        I = dense_I or moe.expert_I  # noqa: E741
        notes.append(
            f"MoE: {moe.experts} experts, top-{moe.top_k}, expert width {moe.expert_I}, "
            f"{len(moe.moe_layers)} of {L} layers MoE"
            + (f", {moe.shared_experts} shared expert(s) of width {moe.shared_I}" if moe.shared_experts else "")
        )
    return moe, dense_I, I


def read_config(path: str | Path) -> tuple[ModelConfig, dict[str, Any] | None, str | None, list[str]]:
    """Read and check a Hugging Face config.json: (the model without its quantization, the quantization config
    and where it was found, notes); InputError (naming the file) when it cannot be used. The quantization is
    resolved from them by tracediag.model.load_model_config (tracediag.model.quant reads the fields here)."""
    p = Path(path)
    raw = _read_json(p, "model config")
    if not isinstance(raw, dict):
        raise InputError(p, "model config is not a JSON object (expected a Hugging Face config.json)")
    notes: list[str] = []
    cfg = _text_block(raw, notes)
    vals: dict[str, Any] = {}
    for key in _ALIASES:
        v, alias = _first(p, cfg, key)
        vals[key] = v
        if alias and alias != key:
            notes.append(f"{key} read from '{alias}'")
    missing = [k for k in REQUIRED if vals[k] is None]
    if missing:
        tried = "; ".join(f"{k} (also tried {', '.join(_ALIASES[k][1:])})" for k in missing)
        raise InputError(p, f"model config lacks {tried}")
    H, L = vals["hidden_size"], vals["num_hidden_layers"]
    h, hkv = vals["num_attention_heads"], vals["num_key_value_heads"]
    mt = str(cfg.get("model_type") or raw.get("model_type") or "")
    hkv, D, attention = _attention_shape(p, cfg, H, h, hkv, notes)
    moe, dense_I, I = _mlp_widths(p, cfg, L, vals["intermediate_size"], mt, notes)  # noqa: E741
    layer_types, window = _layer_types(p, cfg, L, mt, notes)
    chunk = (
        _int_field(p, cfg, "attention_chunk_size", "sliding_window", strict=False) if "chunked" in layer_types else None
    )
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or raw.get("torch_dtype") or raw.get("dtype")
    dtype = dtype if isinstance(dtype, str) else None
    dtype = dtype.removeprefix("torch.") if dtype else None
    qc, q_source = _find_quantization(p, raw, cfg)
    arch = raw.get("architectures")
    vocab = _int_field(p, cfg, "vocab_size")
    tie = cfg.get("tie_word_embeddings")
    if not isinstance(tie, bool):
        tie = mt in _TIED_BY_DEFAULT
        if tie:
            notes.append(f"tie_word_embeddings absent: {mt} ties lm_head to the embeddings by default")
    model = ModelConfig(
        path=str(p),
        L=L,
        H=H,
        I=I,
        h=h,
        H_kv=hkv,
        D=D,
        dtype=dtype,
        dtype_bytes=DTYPE_BYTES.get(dtype.lower()) if dtype else None,
        quantization=qc,
        vocab_size=vocab,
        architecture=arch[0] if isinstance(arch, list) and arch and isinstance(arch[0], str) else None,
        notes=(),
        model_type=mt or None,
        dense_I=dense_I,
        moe=moe,
        attention=attention,
        layer_types=layer_types,
        sliding_window=window,
        chunk_size=chunk,
        max_position_embeddings=_int_field(p, cfg, "max_position_embeddings", strict=False),
        tie_word_embeddings=tie is True,
        gated_mlp=mt not in _UNGATED_MLP,
        quantization_source=q_source,
        multimodal=cfg is not raw,
    )
    return model, qc, q_source, notes


__all__ = ["DTYPE_BYTES", "Attention", "MoE", "ModelConfig", "read_config"]
