"""Model-aware byte accounting on real MoE and low-bit inputs (issue: no false alarm on a correctly deployed model).

Traces: vLLM gpt-oss on MI300X (TraceLens, one mixed prefill/decode step, piecewise HIP graphs) and SGLang
Qwen3-30B-A3B on B300 (TraceLens, one decode step of batch 16 in one CUDA graph), with the models' published
configs (tests/data/configs/README.md). Every expected byte count below is written out by hand from the config
fields, independently of tracediag.model.accounting.
"""

from __future__ import annotations

import json
import math

import pytest
from conftest import REPO, SAMPLES, kineto_file

from tracediag.analysis import analyze
from tracediag.catalog import classify_kernel
from tracediag.context import Settings
from tracediag.model import accounting, load_model_config
from tracediag.model.kernel_formats import kernel_format
from tracediag.rules.step1_shapes.shp004_fits_on_one_card import capacity

CONFIGS = REPO / "tests" / "data" / "configs"
GPTOSS_TRACE = "tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz"
QWEN_TRACE = "tracelens_b300_sglang_qwen3-30b-a3b_moe_decode_cudagraph.json.gz"
GiB = 1024**3
BYTE_RULES = ("SHP002", "SHP003", "SHP004", "KRN003", "KRN004", "KRN005")


def _checks(report) -> dict:
    return {c.rule: c for c in report.checks}


@pytest.fixture(scope="module")
def gptoss():
    return _checks(analyze([kineto_file(GPTOSS_TRACE)], model=CONFIGS / "openai__gpt-oss-20b.config.json"))


@pytest.fixture(scope="module")
def qwen():
    return analyze(
        [kineto_file(QWEN_TRACE)],
        model=CONFIGS / "Qwen__Qwen3-30B-A3B.config.json",
        settings=Settings(hbm_bandwidth_gbs=8000.0),
    )


# ------------------------------------------------------------------ which gpt-oss the MI300X trace serves


def test_gptoss_trace_is_the_20b_by_its_layer_count():
    """The recorded GEMM shapes cannot tell: the only one is the lm_head, [46, 2880] × [201088, 2880], and both
    models have H = 2880 and a 201,088 vocabulary; the KV cache tensor [2, 224304, 32, 8, 64] (8 KV heads of 64)
    fits both too. The per-step counts do: one forward step runs 24 attention kernels and 24 of each expert GEMM
    (gate_up + SwiGLU, down) — one per layer — and gpt-oss-20b has 24 layers, gpt-oss-120b 36."""
    import gzip

    with gzip.open(kineto_file(GPTOSS_TRACE), "rt") as f:
        events = json.load(f)["traceEvents"]
    kernels = [e["name"] for e in events if e.get("cat") == "kernel"]
    per_step = {
        "attention": sum(n == "kernel_unified_attention_2d" for n in kernels),
        "expert gate_up": sum(n.startswith("_matmul_ogs_") and n.endswith("_swiglu") for n in kernels),
        "expert down": sum(n.startswith("_matmul_ogs_") and not n.endswith("_swiglu") for n in kernels),
    }
    lm_head = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::linear"]
    assert [e["args"]["Input Dims"][:2] for e in lm_head] == [[[46, 2880], [201088, 2880]]]
    L20 = load_model_config(CONFIGS / "openai__gpt-oss-20b.config.json").L
    L120 = load_model_config(CONFIGS / "openai__gpt-oss-120b.config.json").L
    assert set(per_step.values()) == {L20} == {24} and L120 == 36


# ------------------------------------------------------------------ no false alarm on the real MoE traces


def test_gptoss_mxfp4_moe_no_finding_in_shapes_quantization_dispatch(gptoss):
    for rule in ("SHP002", "SHP003", "KRN003"):
        assert gptoss[rule].status == "pass", gptoss[rule].to_dict()
    assert "experts mxfp4 (W4A16)" in gptoss["SHP003"].title and "stay bf16 by design" in gptoss["SHP003"].title
    groups = {g["group"]: g for g in gptoss["SHP003"].values["groups"]}
    assert set(groups) == {"experts"} and groups["experts"]["verdict"] == "applied"


def test_qwen_moe_no_finding_in_shapes_quantization_dispatch(qwen):
    c = _checks(qwen)
    for rule in ("SHP002", "SHP003", "KRN003"):
        assert c[rule].status != "finding", c[rule].to_dict()


# ------------------------------------------------------------------ weight bytes against hand counts (±15 %)


def test_gptoss_20b_weights_hand_count(gptoss):
    # 24 layers × 32 experts × 3·2880·2880 params at 4.25 bits (MXFP4: 4-bit e2m1 + one 8-bit scale per 32)
    experts = 24 * 32 * 3 * 2880 * 2880 * 4.25 / 8
    # bf16: attention q/o 2·2880·(64·64) + k/v 2·2880·(8·64) per layer; embeddings and the untied lm_head
    rest = (24 * (2 * 2880 * 4096 + 2 * 2880 * 512) + 2 * 201088 * 2880) * 2
    hand = experts + rest  # ≈ 13.74e9 B = 12.8 GiB (the model card: 12.8 GiB)
    got = gptoss["SHP004"].values["weights_gib_at_p1"] * GiB
    assert got == pytest.approx(hand, rel=0.15) and got / GiB == pytest.approx(12.81, abs=0.01)
    assert gptoss["SHP004"].status == "pass" and "fits on one card" in gptoss["SHP004"].title
    # KRN004/KRN005 need a decode step; this trace has one mixed step (9 prompts + 37 decoding requests)
    assert gptoss["KRN004"].status == "not_applicable" and "decode step" in gptoss["KRN004"].reason


def test_gptoss_20b_decode_reads_hand_count():
    """What KRN004 would count for the trace's 37 decoding requests, by hand: every expert of a layer is touched
    (32·(1 − (1 − 4/32)^37) = 31.98), so all 10.15 GB of MXFP4 experts plus the bf16 attention, router, lm_head."""
    m = load_model_config(CONFIGS / "openai__gpt-oss-20b.config.json")
    touched = 32 * (1 - (1 - 4 / 32) ** 37)
    hand = (
        24 * touched * 3 * 2880 * 2880 * 4.25 / 8
        + 24 * (2 * 2880 * 4096 + 2 * 2880 * 512) * 2
        + 24 * 2880 * 32 * 2
        + 201088 * 2880 * 2
    )
    reads = accounting.decode_reads(m, 1, 37)
    assert reads.experts_touched == pytest.approx(touched) and reads.total == pytest.approx(hand, rel=0.15)
    assert {r["group"]: r["format"] for r in reads.rows}["experts"] == "mxfp4"


def test_qwen_weights_and_decode_reads_hand_count(qwen):
    c = _checks(qwen)
    # 48 layers × 128 experts × 3·2048·768 + attention 48·(2·2048·4096 + 2·2048·512) + 2 × 151936·2048, bf16
    params = 48 * 128 * 3 * 2048 * 768 + 48 * (2 * 2048 * 4096 + 2 * 2048 * 512) + 2 * 151936 * 2048
    assert c["SHP004"].values["weights_gib_at_p1"] * GiB == pytest.approx(params * 2, rel=0.15)
    assert c["SHP004"].values["params_estimate"] == pytest.approx(30.5e9, rel=0.01)  # "30.5B" on the model card
    # decode: T = 16 tokens, top-8 of 128 → 128·(1 − (120/128)^16) = 82.4 experts touched per layer (estimate)
    touched = 128 * (1 - (120 / 128) ** 16)
    hand = (
        48 * touched * 3 * 2048 * 768 * 2
        + 48 * (2 * 2048 * 4096 + 2 * 2048 * 512) * 2
        + 48 * 2048 * 128 * 2
        + 151936 * 2048 * 2
    )  # ≈ 39.8e9 B per step; the old dense count (one MLP of intermediate_size 6144 per layer) was ≈ 6.0e9
    krn4 = c["KRN004"]
    assert krn4.values["experts_touched_per_moe_layer"] == pytest.approx(touched)
    assert krn4.values["W_bytes"] == pytest.approx(hand, rel=0.15)
    assert c["KRN005"].values["weights_bytes"] == pytest.approx(hand, rel=0.15)
    # the floor is at most the measured step: efficiency ≤ 1, and the bandwidth kind is stated
    assert 0 < c["KRN005"].values["efficiency_median"] <= 1
    assert c["KRN005"].values["bandwidth_kind"] == "given (--hbm-bandwidth)"


def test_every_byte_rule_shows_its_per_group_table(qwen):
    doc = qwen.to_dict()
    by = {c["rule"]: c for c in doc["checks"]}
    for rule, key in (("SHP004", "weight_groups"), ("KRN004", "weight_groups"), ("KRN005", "weight_groups")):
        groups = {r["group"] for r in by[rule]["values"][key]}
        assert {"attention", "experts", "router", "lm_head"} <= groups, rule
    assert doc["model"]["moe"]["experts"] == 128 and doc["model"]["quantization_groups"]
    moe = doc["sections"]["moe"]["tables"]
    share = moe["expert GEMM and routing time share per phase"][0]
    assert share["phase"] == "decode" and 0.3 < share["expert_gemm_share"] < 0.6  # 3.38 ms of 7.51 ms


# ------------------------------------------------------------------ gpt-oss-120b: 61-65 GiB, one card


def test_gpt_oss_120b_fits_on_one_141_or_180_gb_card():
    m = load_model_config(CONFIGS / "openai__gpt-oss-120b.config.json")
    # by hand: 36 × 128 experts × (3·2880² + 3·2880 biases) = 114.70e9 params at 4.25 bits = 60.94e9 B, plus
    # 2.13e9 bf16 params (attention 0.956e9, router 0.013e9, embeddings + lm_head 1.158e9) = 4.26e9 B:
    # 65.19e9 B = 60.7 GiB. The model card: 116.8B parameters, experts MXFP4; the checkpoint's safetensors shards
    # (4.63 / 4.12 GB alternating) total ≈ 65 GB; vLLM logs "Model loading took 65.9651 GiB" for it on an H100
    # (issue vllm-project/vllm#23278: weights plus kernel padding and loader buffers).
    hand = (
        36 * 128 * (3 * 2880 * 2880 + 3 * 2880) * 4.25 / 8
        + (36 * (2 * 2880 * 4096 + 2 * 2880 * 512 + 8000 + 64) + 36 * (2880 * 128 + 128) + 2 * 201088 * 2880) * 2
    ) / GiB
    w = accounting.weight_bytes(m, 1) / GiB
    assert w == pytest.approx(hand, rel=0.001) and 60.5 <= w <= 65
    assert accounting.total_params(m) == pytest.approx(116.8e9, rel=0.005)
    for card in (141e9, 180e9):  # H200 141 GB, B200 180 GB
        row = capacity(m, 2, card, 1, m.max_position_embeddings)
        assert row["fits"], row
    # one 131,072-token context: 18 full layers × 2·8·64·2 B per token, 18 sliding layers capped at 128 tokens
    kv = 18 * 2 * 8 * 64 * 2 * 131072 + 18 * 2 * 8 * 64 * 2 * 128
    assert accounting.kv_bytes(m, 1, 2, 131072) == kv


# ------------------------------------------------------------------ KV accounting: MLA, sliding, per-rank heads


def test_kv_bytes_per_token_mla_sliding_and_tp():
    r1 = load_model_config(CONFIGS / "deepseek-ai__DeepSeek-R1.config.json")
    assert accounting.kv_bytes_per_token(r1, 1, 2) == 61 * 576 * 2 == accounting.kv_bytes_per_token(r1, 8, 2)
    q3 = load_model_config(CONFIGS / "Qwen__Qwen3-30B-A3B.config.json")
    assert accounting.kv_bytes_per_token(q3, 1, 2) == 48 * 2 * 4 * 128 * 2
    assert accounting.kv_bytes_per_token(q3, 8, 1) == 48 * 2 * 1 * 128 * 1  # p > H_kv: one replicated head, fp8
    oss = load_model_config(CONFIGS / "openai__gpt-oss-20b.config.json")
    assert accounting.kv_bytes_per_token(oss, 1, 2) == 12 * 2 * 8 * 64 * 2  # only the 12 full-attention layers grow


def test_experts_touched_estimate():
    assert accounting.experts_touched(128, 8, 1) == pytest.approx(8)
    assert accounting.experts_touched(128, 8, 10_000) == pytest.approx(128)
    assert accounting.experts_touched(32, 4, 2) == pytest.approx(32 * (1 - (28 / 32) ** 2))
    assert accounting.experts_touched(8, 2, 0) == 0


def test_no_4bit_saving_offered_for_4bit_weights():
    m = load_model_config(CONFIGS / "openai__gpt-oss-120b.config.json")
    w4, _, _ = accounting.hypothetical_w4(m)
    assert w4["experts"].name == "mxfp4"  # already 4-bit: kept, not replaced by a hypothetical int4
    assert w4["attention"].weight_bits == 4  # bf16 attention is what 4-bit could still shrink
    served = accounting.decode_reads(m, 1, 64).rows
    hypo = accounting.decode_reads(m, 1, 64, w4).rows
    assert {r["group"]: r["bytes_read"] for r in served}["experts"] == {r["group"]: r["bytes_read"] for r in hypo}[
        "experts"
    ]
    report = analyze([SAMPLES / "w4_int4mm_tp2"], model=SAMPLES / "w4_int4mm_tp2" / "config.json")
    krn4 = _checks(report)["KRN004"]
    assert krn4.status == "pass" and "No 4-bit saving left" in krn4.title


# ------------------------------------------------------------------ a missed quantization is still caught


def _graft(tmp_path, sample: str, config: str, key: str = "quantization_config"):
    """The sample trace's own config with the quantization block of a published checkpoint (the trace's shapes
    are the sample's; the quantization fields are the real checkpoint's, verbatim)."""
    raw = json.loads((SAMPLES / sample / "config.json").read_text())
    raw[key] = json.loads((CONFIGS / config).read_text())["quantization_config"]
    p = tmp_path / "config.json"
    p.write_text(json.dumps(raw))
    return p


@pytest.mark.parametrize(
    ("config", "declared"),
    [
        ("casperhansen__deepseek-r1-distill-llama-8b-awq.config.json", "int4"),
        ("Qwen__Qwen3-30B-A3B-FP8.config.json", "fp8"),
    ],
)
def test_real_quant_configs_on_dense_kernels_are_caught(tmp_path, config, declared):
    model = _graft(tmp_path, "w4_dense_tp2", config)
    c = _checks(analyze([SAMPLES / "w4_dense_tp2"], model=model))
    shp3, krn3 = c["SHP003"], c["KRN003"]
    assert shp3.status == "finding" and shp3.severity == "error" and "Quantization not applied" in shp3.title
    assert declared in shp3.title and shp3.values["dense_projection_calls"] == 224
    assert krn3.status == "finding" and krn3.values["lowbit_calls"] == 0


def test_real_awq_config_on_int4_kernels_passes_and_fp8_on_int4_is_caught(tmp_path):
    ok = _checks(
        analyze(
            [SAMPLES / "w4_int4mm_tp2"],
            model=_graft(tmp_path, "w4_int4mm_tp2", "casperhansen__deepseek-r1-distill-llama-8b-awq.config.json"),
        )
    )
    assert ok["SHP003"].status == "pass" and ok["KRN003"].status == "pass"
    wrong = _checks(
        analyze(
            [SAMPLES / "w4_int4mm_tp2"], model=_graft(tmp_path, "w4_int4mm_tp2", "Qwen__Qwen3-30B-A3B-FP8.config.json")
        )
    )
    assert wrong["SHP003"].status == "finding" and "int4 weights, not fp8_e4m3" in wrong["SHP003"].title


# ------------------------------------------------------------------ catalog: the traces' MoE kernels


def test_real_moe_kernels_classify_with_their_format():
    import gzip

    seen = {}
    for trace in (GPTOSS_TRACE, QWEN_TRACE):
        with gzip.open(kineto_file(trace), "rt") as f:
            for e in json.load(f)["traceEvents"]:
                if e.get("cat") == "kernel":
                    seen[e["name"]] = classify_kernel(e["name"])
    bmm = [n for n in seen if n.startswith("bmm_Bfloat16_Bfloat16Bfloat16")]
    assert len(bmm) == 2 and all(seen[n].pattern_id == "trtllm_gen_bmm_bf16" for n in bmm)
    f = kernel_format(bmm[0])
    assert (f.weight, f.scheme, f.moe) == ("16-bit", "W16A16", True)
    routing = [n for n in seen if n.startswith("void moe::dev::")]
    assert len(routing) == 2 and {seen[n].family for n in routing} == {"trtllm_gen_moe"}
    for n in ("_finalize_matmul_scatter_bf16", "_combined_routing_compute", "_topk_forward", "_sum_bitmatrix_rows"):
        assert seen[n].pattern_id == "triton_kernels_moe_aux"
    f = kernel_format("_matmul_ogs_NNT_bf16xbf16xmxfp4_128x128x128x1_swiglu")
    assert (f.weight, f.scheme, f.moe) == ("mxfp4", "W4A16", True)
    w4a8 = (  # a FlashInfer trtllm-gen MXFP4 x MXFP8 expert GEMM (catalog pattern trtllm_gen_bmm_mxfp4, pos)
        "bmm_Bfloat16_MxE2m1MxE4m3_Fp32_Ab32_Bb32_t128x8x256_s4_et128x8_m128x8x32_c1x1x1_rM_TN_transOut_schPd2x1x2x3_"
        "biasFp32M_bN_rgTma_clmp_dynB_sm100f"
    )
    assert kernel_format(w4a8).scheme == "W4A8" and kernel_format(w4a8).weight == "mxfp4"


def test_kv_cache_dtype_source_is_named(gptoss, qwen):
    src = gptoss["SHP004"].values["kv_element_source"]
    assert src.startswith("kernel name: Fp8KVCacheDataType 0") and gptoss["SHP004"].values["kv_bytes_per_element"] == 2
    q = _checks(qwen)["KRN004"].values
    assert q["b_source"].startswith("kernel name: Bfloat16 KV (fmhaSm100f") and q["b"] == 2
    assert math.isclose(q["c_bytes_per_token"], 48 * 2 * 4 * 128 * 2)


# ------------------------------------------------------------------ SHP002 roles for MoE, MLA, padded widths


def test_shp002_roles_know_router_experts_mla_and_padding():
    from tracediag.model.gemm_roles import expected_roles, padded_roles

    q = load_model_config(CONFIGS / "Qwen__Qwen3-30B-A3B.config.json")
    r = expected_roles(q, 1)
    assert r["router (replicated)"] == (2048, 128) and r["qkv_proj (fused)"] == (2048, 4096 + 2 * 512)
    assert r["expert gate_up_proj"] == (2048, 2 * 768) and r["expert down_proj"] == (768, 2048)
    assert expected_roles(q, 4)["router (replicated)"] == (2048, 128)  # the router is not sharded
    assert expected_roles(q, 4)["expert gate_up_proj (EP)"] == (2048, 1536)  # whole experts under EP
    oss = load_model_config(CONFIGS / "openai__gpt-oss-120b.config.json")
    pads = padded_roles(oss, 1)  # vLLM's MXFP4 MoE pads 2880 to 3072 (a multiple of 256)
    assert pads["expert gate_up_proj (H padded to 3072)"] == (3072, 6144)
    assert pads["expert down_proj (H padded to 3072)"] == (3072, 3072)
    r1 = expected_roles(load_model_config(CONFIGS / "deepseek-ai__DeepSeek-R1.config.json"), 8)
    assert r1["q_a_proj"] == (7168, 1536) and r1["kv_a_proj_with_mqa"] == (7168, 576)  # replicated
    assert (
        r1["q_b_proj"] == (1536, 16 * 192) and r1["kv_b_proj"] == (512, 16 * 256) and r1["o_proj"] == (16 * 128, 7168)
    )
