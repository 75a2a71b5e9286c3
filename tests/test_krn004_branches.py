"""KRN004's branches check their own premises (docs/rules.md, KRN004), on the decode part of the vendored vLLM
gpt-oss trace (MI300X, TraceLens): its step annotation `execute_8192_context_9(…)_generation_37(sq37sk34489…)`
carries 37 decoding sequences holding 34,489 KV tokens in all, served by the published gpt-oss-20b config (MXFP4
experts, bf16 attention, 12 of 24 layers with a 128-token sliding window)."""

from __future__ import annotations

import gzip
import json
import re

import pytest
from conftest import REPO, kineto_file

from tracediag.model import accounting, load_model_config
from tracediag.rules.step5_kernels import krn004_w4_read_bound as krn004

CONFIG = REPO / "tests" / "data" / "configs" / "openai__gpt-oss-20b.config.json"
TRACE = "tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz"


@pytest.fixture(scope="module")
def decode_part() -> tuple[int, float]:
    """(B, S): decoding sequences and mean KV tokens each, read from the trace's step annotation."""
    with gzip.open(kineto_file(TRACE), "rt") as f:
        events = json.load(f)["traceEvents"]
    name = next(e["name"] for e in events if e.get("cat") == "user_annotation" and "_generation_" in e["name"])
    g = re.search(r"_generation_(\d+)\(sq(\d+)sk(\d+)", name)
    B, kv_tokens = int(g.group(1)), int(g.group(3))
    assert (B, kv_tokens) == (37, 34489)
    return B, kv_tokens / B


def _config_without_layer_types(tmp_path):
    raw = json.loads(CONFIG.read_text())
    del raw["layer_types"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(raw))
    return load_model_config(p)


def test_gptoss_sliding_layers_known_without_layer_types(tmp_path):
    """config.json without `layer_types`: gpt-oss alternates sliding and full layers (the config class default),
    so 12 of the 24 layers keep at most 128 tokens — the same per-layer caps as the published list."""
    m = _config_without_layer_types(tmp_path)
    full = load_model_config(CONFIG)
    assert m.sliding_layers == 12 and m.layer_types == full.layer_types and m.sliding_window == 128
    assert accounting.kv_bytes(m, 1, 2, 932) == 2 * 8 * 64 * 2 * (12 * 932 + 12 * 128)
    assert "12 full + 12 sliding (128 tokens)" in accounting.kv_layout(m)


def test_mxfp4_experts_beside_bf16_attention_are_already_4bit(tmp_path, decode_part):
    """The decode part at T = B = 37: W = 12.52 GB (experts MXFP4, nearly all 32 touched), W4 = 11.57 GB (only
    attention would shrink), B·K = 0.964 GB with the sliding layers capped (1.69 GB if every layer were full):
    KV 7.1 % of reads, S_read 1.075 ≤ 1.25. Not 'KV dominates': the experts are 4-bit (96.8 % of the projection
    parameters) — a pass, as the rule's specification says."""
    B, S = decode_part
    m = _config_without_layer_types(tmp_path)
    served = accounting.formats(m)
    w4, _, _ = accounting.hypothetical_w4(m)
    W = accounting.decode_reads(m, 1, B, served).total
    W4 = accounting.decode_reads(m, 1, B, w4).total
    bk = B * accounting.kv_bytes(m, 1, 2, S)
    kv_share = bk / (W + bk)
    assert bk == pytest.approx(2048 * (12 * S + 12 * 128) * B)
    assert kv_share == pytest.approx(0.0715, abs=0.001)
    sr = krn004.s_read(W, W4, bk)
    assert sr < krn004.KV_DOMINATES and 1 - W4 / W > krn004.ALREADY_4BIT  # the old test alone missed it
    groups = {g["group"]: g for g in accounting.four_bit_groups(m, 1, served)}
    assert groups["experts"]["four_bit"] and groups["experts"]["format"] == "mxfp4"
    assert not groups["attention"]["four_bit"] and not groups["lm_head"]["four_bit"]
    assert krn004.four_bit_share(list(groups.values())) == pytest.approx(0.968, abs=0.002)
    assert krn004.verdict(sr, kv_share, W4 / W, list(groups.values())) == "already_4bit"


def test_kv_dominates_needs_a_kv_majority(decode_part):
    """The same decode part served as bf16 (every group 16-bit): S_read > 1.25, so 16-bit weights dominate; and a
    low S_read with KV below half of the reads is not 'KV dominates' (the groups 4-bit leaves alone hold the
    reads) while a KV majority is."""
    B, S = decode_part
    m = load_model_config(CONFIG)
    bf16 = {g: accounting.W16 for g in accounting.formats(m)}
    groups = accounting.four_bit_groups(m, 1, bf16)
    assert krn004.four_bit_share(groups) == 0
    w4, _, _ = accounting.hypothetical_w4(m)
    W = accounting.decode_reads(m, 1, B, bf16).total
    W4 = accounting.decode_reads(m, 1, B, {g: w4[g] for g in bf16}).total
    bk = B * accounting.kv_bytes(m, 1, 2, S)
    assert krn004.verdict(krn004.s_read(W, W4, bk), bk / (W + bk), W4 / W, groups) == "weights_dominate"
    assert krn004.verdict(1.1, 0.2, 0.8, groups) == "unquantizable_dominate"
    assert krn004.verdict(1.1, 0.6, 0.8, groups) == "kv_dominates"


def test_mla_kv_is_one_latent_per_layer():
    """DeepSeek-R1 (published config): MLA caches kv_lora_rank 512 + qk_rope_head_dim 64 per token and layer,
    not split by TP."""
    m = load_model_config(REPO / "tests" / "data" / "configs" / "deepseek-ai__DeepSeek-R1.config.json")
    assert m.kv_elements_per_token_layer(8) == 576
    assert accounting.kv_bytes(m, 8, 1, 1000) == 61 * 576 * 1000
