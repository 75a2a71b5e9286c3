"""Model shape from a Hugging Face `config.json`: the symbols of the RULEBOOK (L, H, I, h, H_kv, D)."""

from __future__ import annotations

import json
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


@dataclass(frozen=True)
class ModelConfig:
    """Shape symbols. Optional ones are None when the config lacks them (rules then say not applicable)."""

    path: str
    L: int  # layers
    H: int  # hidden size
    I: int | None  # MLP intermediate size  # noqa: E741 (the RULEBOOK's symbol)
    h: int | None  # attention heads
    H_kv: int | None  # KV heads
    D: int | None  # head dim
    dtype: str | None  # torch_dtype as written
    dtype_bytes: int | None
    quantization: dict[str, Any] | None  # quantization_config verbatim
    vocab_size: int | None
    architecture: str | None
    notes: tuple[str, ...] = ()  # how fields were resolved (aliases, defaults, nested text_config)

    @property
    def weight_bits(self) -> int | None:
        q = self.quantization or {}
        for key in ("bits", "w_bit", "weight_bits"):
            if isinstance(q.get(key), int):
                return q[key]
        return None

    def missing(self, *fields: str) -> list[str]:
        return [f for f in fields if getattr(self, f) is None]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["notes"] = list(self.notes)
        return d


def _first(cfg: dict[str, Any], key: str) -> tuple[Any, str | None]:
    for alias in _ALIASES[key]:
        if isinstance(cfg.get(alias), int) and not isinstance(cfg.get(alias), bool):
            return cfg[alias], alias
    return None, None


def load_model_config(path: str | Path) -> ModelConfig:
    p = Path(path)
    try:
        raw = json.loads(p.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(p, f"cannot read model config ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(p, f"model config is not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise InputError(p, "model config is not a JSON object (expected a Hugging Face config.json)")
    notes: list[str] = []
    cfg = raw
    # Multimodal wrappers (Llava, Qwen2-VL, Gemma 3...) keep the language model under text_config.
    if _first(raw, "hidden_size")[0] is None and isinstance(raw.get("text_config"), dict):
        cfg = {**raw["text_config"], **{k: v for k, v in raw.items() if k == "quantization_config"}}
        notes.append("shape read from text_config")
    vals: dict[str, Any] = {}
    for key in _ALIASES:
        v, alias = _first(cfg, key)
        vals[key] = v
        if alias and alias != key:
            notes.append(f"{key} read from '{alias}'")
    missing = [k for k in REQUIRED if vals[k] is None]
    if missing:
        tried = "; ".join(f"{k} (also tried {', '.join(_ALIASES[k][1:])})" for k in missing)
        raise InputError(p, f"model config lacks {tried}")
    h, hkv = vals["num_attention_heads"], vals["num_key_value_heads"]
    if hkv is None and h is not None:
        hkv = 1 if cfg.get("multi_query") is True else h
        notes.append(f"num_key_value_heads absent: using {hkv} ({'multi_query' if hkv == 1 else 'MHA'})")
    d = cfg.get("head_dim") if isinstance(cfg.get("head_dim"), int) else None
    if d is None and h:
        d = vals["hidden_size"] // h
        notes.append("head_dim absent: using hidden_size / num_attention_heads")
    dtype = cfg.get("torch_dtype") or cfg.get("dtype") or raw.get("torch_dtype")
    dtype = dtype if isinstance(dtype, str) else None
    q = raw.get("quantization_config") if isinstance(raw.get("quantization_config"), dict) else None
    arch = raw.get("architectures")
    return ModelConfig(
        path=str(p),
        L=vals["num_hidden_layers"],
        H=vals["hidden_size"],
        I=vals["intermediate_size"],
        h=h,
        H_kv=hkv,
        D=d,
        dtype=dtype,
        dtype_bytes=DTYPE_BYTES.get(dtype.lower()) if dtype else None,
        quantization=q,
        vocab_size=cfg.get("vocab_size") if isinstance(cfg.get("vocab_size"), int) else None,
        architecture=arch[0] if isinstance(arch, list) and arch and isinstance(arch[0], str) else None,
        notes=tuple(notes),
    )
