"""The served model and the formulas the rules use.

- `config`: reading a Hugging Face `config.json` into the RULEBOOK's symbols (L, H, I, h, H_kv, D, ...);
- `dtypes`: element types as profilers spell them, and their sizes;
- `tpmath`: tensor-parallel collective cost model (α–β, break-even T*, projection FLOPs);
- `servingmath`: serving formulas (KV bytes per token, trend tests, Little's law, goodput, acceptance).
"""

from __future__ import annotations

from tracediag.model.config import DTYPE_BYTES, ModelConfig, load_model_config

__all__ = ["DTYPE_BYTES", "ModelConfig", "load_model_config"]
