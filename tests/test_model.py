"""Hugging Face config.json -> model symbols; missing fields are named."""

from __future__ import annotations

import json

import pytest

from tracediag.errors import InputError
from tracediag.model import load_model_config


def test_sample_config(samples):
    m = load_model_config(samples / "healthy_tp2" / "config.json")
    raw = json.loads((samples / "healthy_tp2" / "config.json").read_text())
    assert (m.L, m.H, m.I, m.h, m.H_kv) == (
        raw["num_hidden_layers"],
        raw["hidden_size"],
        raw["intermediate_size"],
        raw["num_attention_heads"],
        raw["num_key_value_heads"],
    )
    assert raw.get("head_dim", m.H // m.h) == m.D
    assert m.dtype_bytes == 2


def test_missing_hidden_size_is_named(tmp_path, samples):
    raw = json.loads((samples / "healthy_tp2" / "config.json").read_text())
    del raw["hidden_size"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(InputError) as e:
        load_model_config(p)
    assert "hidden_size" in str(e.value) and str(p) in str(e.value)


def test_kv_heads_default_and_aliases(tmp_path):
    p = tmp_path / "gpt2.json"
    # GPT-2's real config keys (n_embd, n_layer, n_head, n_inner null)
    p.write_text(
        json.dumps(
            {"n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None, "vocab_size": 50257, "torch_dtype": "float32"}
        )
    )
    m = load_model_config(p)
    assert (m.H, m.L, m.h, m.H_kv, m.D, m.I) == (768, 12, 12, 12, 64, None)
    assert any("n_embd" in n for n in m.notes)


def test_not_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text("hidden_size: 4096\n")
    with pytest.raises(InputError, match="not valid JSON"):
        load_model_config(p)
