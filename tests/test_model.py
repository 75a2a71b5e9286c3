"""Hugging Face config.json -> model symbols; missing fields are named."""

from __future__ import annotations

import json
from pathlib import Path

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


# ------------------------------------------------------------------ published configs (tests/data/configs/README.md)

CONFIGS = Path(__file__).parent / "data" / "configs"


def _cfg(name: str):
    return load_model_config(CONFIGS / name)


def test_gpt_oss_120b_moe_sliding_sinks_and_mxfp4_experts():
    # openai/gpt-oss-120b config.json: num_local_experts 128, num_experts_per_tok 4, intermediate_size 2880 (the
    # expert width), head_dim 64 (not 2880/64 = 45), layer_types alternating sliding_attention/full_attention,
    # sliding_window 128, quantization_config mxfp4, modules_to_not_convert self_attn / router / embeddings / lm_head.
    m = _cfg("openai__gpt-oss-120b.config.json")
    assert (m.L, m.H, m.h, m.H_kv, m.D) == (36, 2880, 64, 8, 64)
    assert (m.moe.experts, m.moe.top_k, m.moe.expert_I, len(m.moe.moe_layers)) == (128, 4, 2880, 36)
    assert m.dense_I is None and m.I == 2880
    assert m.layer_types.count("sliding") == 18 and m.sliding_window == 128 and m.layer_types[0] == "sliding"
    assert m.attention.kind == "GQA" and m.attention.sinks and m.attention.bias
    g = m.quant.groups
    assert (g["experts"].fmt.name, g["experts"].fmt.bits_per_weight, g["experts"].fmt.scheme) == (
        "mxfp4",
        4.25,
        "W4A16",
    )
    for excluded in ("attention", "router", "embeddings", "lm_head"):
        assert not g[excluded].quantized and g[excluded].fmt.name == "bf16", excluded
    assert "only MoE experts" in g["attention"].why and m.weight_bits == 4  # vLLM Mxfp4Config: no Linear layer
    assert m.dtype is None  # the file has no torch_dtype: bf16 assumed for the unquantized groups


def test_qwen3_moe_every_layer_moe_and_explicit_head_dim():
    # Qwen/Qwen3-30B-A3B: num_experts 128, num_experts_per_tok 8, moe_intermediate_size 768, decoder_sparse_step 1,
    # mlp_only_layers [] -> all 48 layers MoE; intermediate_size 6144 is used by no layer; head_dim 128 != 2048/32.
    m = _cfg("Qwen__Qwen3-30B-A3B.config.json")
    assert (m.moe.experts, m.moe.top_k, m.moe.expert_I, len(m.moe.moe_layers)) == (128, 8, 768, 48)
    assert m.I == 768 and m.dense_I is None and m.D == 128 and m.moe.shared_experts == 0
    assert any("6144 is used by no layer" in n for n in m.notes)
    assert m.layer_types == ("full",) * 48  # sliding_window null, use_sliding_window false


def test_deepseek_r1_mla_dense_first_layers_shared_expert_and_block_fp8():
    # deepseek-ai/DeepSeek-R1: kv_lora_rank 512, qk_rope_head_dim 64, qk_nope_head_dim 128, v_head_dim 128,
    # q_lora_rank 1536, first_k_dense_replace 3, n_routed_experts 256, n_shared_experts 1, moe_intermediate_size 2048,
    # quantization_config fp8 with weight_block_size [128, 128].
    m = _cfg("deepseek-ai__DeepSeek-R1.config.json")
    assert m.attention.kind == "MLA" and m.D == 192 and m.attention.v_head_dim == 128
    assert m.kv_elements_per_token_layer(p=1) == m.kv_elements_per_token_layer(p=8) == 576
    assert m.moe.moe_layers[0] == 3 and len(m.moe.moe_layers) == 58 and m.dense_I == 18432
    assert (m.moe.shared_experts, m.moe.shared_I) == (1, 2048)
    g = m.quant.groups
    assert g["experts"].fmt.bits_per_weight == pytest.approx(8 + 32 / 16384) and g["experts"].fmt.scheme == "W8A8"
    assert not g["router"].quantized and not g["lm_head"].quantized


def test_mixtral_experts_use_intermediate_size():
    # mistralai/Mixtral-8x7B-Instruct-v0.1: num_local_experts 8, num_experts_per_tok 2, intermediate_size 14336
    # is the expert width, sliding_window null.
    m = _cfg("mistralai__Mixtral-8x7B-Instruct-v0.1.config.json")
    assert (m.moe.experts, m.moe.top_k, m.moe.expert_I, len(m.moe.moe_layers)) == (8, 2, 14336, 32)
    assert m.sliding_window is None and m.sliding_layers == 0


def test_qwen2_5_sliding_window_ignored_without_use_sliding_window_and_flat_vl():
    m = _cfg("Qwen__Qwen2.5-7B-Instruct.config.json")  # sliding_window 131072, use_sliding_window false
    assert m.sliding_layers == 0 and any("use_sliding_window" in n for n in m.notes)
    vl = _cfg("Qwen__Qwen2.5-VL-7B-Instruct.config.json")  # stored flat: text keys at the top level
    assert (vl.L, vl.H, vl.h, vl.H_kv) == (28, 3584, 28, 4) and vl.moe is None


def test_kimi_k2_5_compressed_tensors_inside_text_config():
    # moonshotai/Kimi-K2.5: text_config.quantization_config compressed-tensors, weights int 4-bit group 32,
    # ignore lm_head and re:.*self_attn.*, re:.*shared_experts.*, re:.*mlp\.(gate|up|gate_up|down)_proj.*
    m = _cfg("moonshotai__Kimi-K2.5.config.json")
    assert m.quantization_source == "config.json text_config.quantization_config"
    g = m.quant.groups
    assert g["experts"].fmt.name == "int4" and g["experts"].fmt.bits_per_weight == pytest.approx(4.5)
    assert g["experts"].fmt.scheme == "W4A16"
    for excluded in ("attention", "shared_experts", "dense_mlp", "lm_head"):
        assert not g[excluded].quantized, excluded
    assert m.attention.kind == "MLA"


def test_modelopt_nvfp4_from_hf_quant_config_beside_config():
    # nvidia/Qwen3-30B-A3B-NVFP4 hf_quant_config.json: quant_algo NVFP4, group_size 16, kv_cache_quant_algo FP8,
    # exclude_modules = the 48 router gates + lm_head.
    m = _cfg("nvidia__Qwen3-30B-A3B-NVFP4/config.json")
    assert m.quantization_source.startswith("hf_quant_config.json")
    g = m.quant.groups
    assert (g["experts"].fmt.name, g["experts"].fmt.bits_per_weight, g["experts"].fmt.scheme) == ("nvfp4", 4.5, "W4A4")
    assert not g["router"].quantized and not g["lm_head"].quantized and m.quant.kv_cache == "fp8"


def test_fp8_exact_module_names_exclude_the_gates():
    m = _cfg("Qwen__Qwen3-30B-A3B-FP8.config.json")  # modules_to_not_convert: model.layers.N.mlp.gate ..., lm_head
    g = m.quant.groups
    assert g["experts"].quantized and g["attention"].quantized and not g["router"].quantized
    assert "model.layers.0.mlp.gate" in g["router"].why


def test_awq_bits_per_weight_includes_scale_and_zero():
    m = _cfg("casperhansen__deepseek-r1-distill-llama-8b-awq.config.json")  # bits 4, group_size 128, zero_point true
    g = m.quant.groups
    assert g["attention"].fmt.bits_per_weight == pytest.approx(4 + 20 / 128) and g["dense_mlp"].quantized
    assert not g["lm_head"].quantized and m.weight_bits == 4


# ------------------------------------------------------------------ validation: no rule divides by zero


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("hidden_size", 0, "must be a positive integer"),
        ("num_hidden_layers", -4, "must be a positive integer"),
        ("num_attention_heads", 2**63, "implausibly large"),
        ("intermediate_size", 2**40, "implausibly large"),
        ("num_key_value_heads", 3, "does not divide num_attention_heads"),
        ("num_attention_heads", 7, "does not divide hidden_size"),
        ("head_dim", "32", "is not an integer"),
        ("vocab_size", True, "is not an integer"),
        ("num_attention_heads", 8.5, "is not an integer"),
    ],
)
def test_bad_values_are_input_errors(tmp_path, samples, key, value, message):
    raw = json.loads((samples / "healthy_tp2" / "config.json").read_text())
    raw[key] = value
    if key == "num_attention_heads" and value == 7:
        del raw["head_dim"]
        raw["num_key_value_heads"] = 7
    p = tmp_path / "config.json"
    p.write_text(json.dumps(raw))
    with pytest.raises(InputError, match=message) as e:
        load_model_config(p)
    assert str(p) in str(e.value)


def test_moe_top_k_above_experts_and_layer_types_length(tmp_path):
    raw = json.loads((CONFIGS / "openai__gpt-oss-20b.config.json").read_text())
    bad = dict(raw, num_experts_per_tok=64)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(bad))
    with pytest.raises(InputError, match="exceeds the 32 experts"):
        load_model_config(p)
    p.write_text(json.dumps(dict(raw, layer_types=raw["layer_types"][:5])))
    with pytest.raises(InputError, match="layer_types lists 5 layers"):
        load_model_config(p)


def test_malformed_hf_quant_config_names_its_file(tmp_path):
    (tmp_path / "config.json").write_text((CONFIGS / "Qwen__Qwen3-30B-A3B.config.json").read_text())
    (tmp_path / "hf_quant_config.json").write_text('{"producer": {"name": "modelopt"}}')
    with pytest.raises(InputError, match="no 'quantization' object") as e:
        load_model_config(tmp_path / "config.json")
    assert "hf_quant_config.json" in str(e.value)


def test_text_config_defaults_fill_omitted_keys(tmp_path):
    # Llava-1.5's text_config gives only max_position_embeddings, rms_norm_eps, vocab_size and model_type: the
    # shape comes from LlamaConfig's defaults (transformers models/llama/configuration_llama.py).
    p = tmp_path / "config.json"
    p.write_text(
        json.dumps(
            {
                "architectures": ["LlavaForConditionalGeneration"],
                "model_type": "llava",
                "text_config": {"model_type": "llama", "max_position_embeddings": 4096, "vocab_size": 32064},
                "torch_dtype": "float16",
            }
        )
    )
    m = load_model_config(p)
    assert (m.H, m.L, m.h, m.H_kv, m.I, m.vocab_size) == (4096, 32, 32, 32, 11008, 32064)
    assert any("config-class defaults" in n for n in m.notes) and m.dtype_bytes == 2
