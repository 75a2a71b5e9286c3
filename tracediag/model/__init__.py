"""The served model and the formulas the rules use.

- `config`: reading a Hugging Face `config.json` into the symbols of docs/method.md (L, H, I, h, H_kv, D, ...) and the
  architecture (MoE, MLA, sliding windows);
- `quant`: the quantization format of each module group (attention, dense MLP, experts, router, ...);
- `accounting`: weight and KV bytes per group, per rank and per decode step (MoE experts touched), and the
  projection FLOPs per token (dense or MoE-active);
- `kernel_formats`: the weight / activation format a GEMM kernel reads, from its name;
- `dtypes`: element types as profilers spell them, and their sizes;
- `tpmath`: tensor-parallel collective cost model (α–β, break-even T*, projection FLOPs);
- `servingmath`: serving formulas (KV bytes per token, trend tests, Little's law, goodput, acceptance).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from tracediag.model.config import DTYPE_BYTES, ModelConfig, read_config
from tracediag.model.quant import resolve

__all__ = ["DTYPE_BYTES", "ModelConfig", "load_model_config"]


def load_model_config(path: str | Path) -> ModelConfig:
    """Read and check a Hugging Face config.json, with the quantization format of each module group; InputError
    (naming the file) when it cannot be used."""
    p = Path(path)
    model, qc, q_source, notes = read_config(p)
    quant = resolve(model, qc, q_source, p)  # reads the architecture fields of `model`
    return replace(model, quant=quant, notes=(*notes, *quant.notes))
