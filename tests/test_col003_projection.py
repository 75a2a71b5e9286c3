"""F_proj, the projection FLOPs per token COL003 reads its a against, on the published configs.

MoE models count their *active* weights (attention incl. MLA, dense layers at their own width, router, shared
experts, k of the E routed experts of the expert width), not docs/method.md's dense 4(H² + H·H_KV) + 6H·I with
`intermediate_size`. Every expected count below is written out by hand from the config fields
(tests/data/configs/README.md: source of each file), independently of tracediag.model.accounting; each MoE test
also checks that the dense formula would give another number, so it fails on a dense count.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from conftest import REPO, SAMPLES

from tracediag.analysis import analyze
from tracediag.context import Settings
from tracediag.model import accounting, load_model_config, tpmath
from tracediag.rules.step3_collectives.col003_alpha_beta_breakeven import MOE_TP_ASSUMPTION, projection_account

CONFIGS = REPO / "tests" / "data" / "configs"
LLAMA_8B = REPO / "tests" / "data" / "llama3.1-8b_config.json"


def _model(name: str):
    return load_model_config(CONFIGS / f"{name}.config.json")


# ------------------------------------------------------------------ dense: docs/method.md's formula, unchanged


def test_dense_llama_equals_the_method_formula():
    m = load_model_config(LLAMA_8B)
    fp = accounting.projection_flops(m)
    # 32 × (4(4096² + 4096·1024) + 6·4096·14336) = 32 × 436,207,616
    assert fp.kind == "dense" and fp.layers == 32 * 436_207_616 == 13_958_643_712
    dense = m.L * tpmath.proj_flops_per_layer(1, m.H, m.I, m.H_kv * m.D)
    assert fp.layers == dense == accounting.dense_formula_flops(m)
    assert fp.lm_head == 2 * 128256 * 4096  # untied lm_head, kept apart
    assert set(fp.by_group) == {"attention", "dense_mlp"}


def test_the_method_examples_shape_gives_its_a():
    # docs/method.md's check (H = 8192, I = 28672, H_KV = 1024, L = 80, the Llama-3.1-70B shape): F_proj per layer
    # 1,711,276,032 FLOP per token, a = 80·F_proj/120e12 = 1.141 ms. Built from the 8B config with the 70B shape.
    m = load_model_config(LLAMA_8B)
    m70 = replace(m, L=80, H=8192, h=64, H_kv=8, D=128, I=28672, dense_I=28672)
    fp = accounting.projection_flops(m70)
    assert fp.layers == 80 * 1_711_276_032
    assert round(fp.layers / 120e12 * 1e3, 3) == 1.141


# ------------------------------------------------------------------ MoE: active weights per token


def test_mixtral_counts_two_experts_not_one_mlp():
    m = _model("mistralai__Mixtral-8x7B-Instruct-v0.1")
    fp = accounting.projection_flops(m)
    attention = 2 * 32 * (2 * 4096 * 32 * 128 + 2 * 4096 * 8 * 128)  # q, o + k, v (GQA 8 KV heads)
    router = 2 * 32 * 4096 * 8
    experts = 2 * 32 * 2 * 3 * 4096 * 14336  # top-2 of 8, expert width = intermediate_size
    assert fp.kind == "MoE-active" and fp.by_group == {"attention": attention, "router": router, "experts": experts}
    assert fp.layers == 25_235_030_016
    # the dense formula with intermediate_size counts one expert's MLP per layer: 13.96e9, 1.81× too little
    dense = accounting.dense_formula_flops(m)
    assert dense == 13_958_643_712 and fp.layers / dense == pytest.approx(1.8078, abs=1e-4)
    assert fp.inputs.items() >= {"E": 8, "k": 2, "expert_I": 14336, "moe_layers": 32, "shared_experts": 0}.items()
    # 12.62e9 weights in the layers + 0.13e9 lm_head = 12.75e9; with the 0.13e9 embedding matrix 12.88e9, the
    # model card's "12.9B active"
    assert (fp.layers + fp.lm_head) / 2 == pytest.approx(accounting.active_params_per_token(m))


def test_deepseek_r1_mla_dense_layers_shared_expert():
    m = _model("deepseek-ai__DeepSeek-R1")  # DeepSeek-V3 architecture, identical fields
    fp = accounting.projection_flops(m)
    H = 7168
    # MLA per layer: q_a (H·1536) + its norm (1536) + q_b (1536·128·192) + kv_a (H·(512 + 64)) + its norm (512)
    # + kv_b (512·128·(128 + 128)) + o (128·128·H)
    mla = H * 1536 + 1536 + 1536 * 128 * 192 + H * 576 + 512 + 512 * 128 * 256 + 128 * 128 * H
    assert mla == 187_107_328
    want = {
        "attention": 2 * 61 * mla,
        "dense_mlp": 2 * 3 * 3 * H * 18432,  # first_k_dense_replace = 3 layers at intermediate_size
        "shared_experts": 2 * 58 * 3 * H * 2048,  # n_shared_experts 1 × moe_intermediate_size
        "router": 2 * 58 * H * 256,
        "experts": 2 * 58 * 8 * 3 * H * 2048,  # top-8 of 256 routed experts of 2048
    }
    assert fp.by_group == want and fp.layers == 71_396_085_760
    assert fp.inputs.items() >= {"dense_layers": 3, "moe_layers": 58, "k": 8, "E": 256, "shared_experts": 1}.items()
    # 36.6e9 + the 0.93e9 lm_head weights: "37B activated" (DeepSeek-V3 report)
    assert (fp.layers + fp.lm_head) / 2 / 1e9 == pytest.approx(36.62, abs=0.01)
    # the dense formula reads H_KV = 128·192 and I = 18432 for all 61 layers: 1.45× too much
    assert fp.layers / accounting.dense_formula_flops(m) == pytest.approx(0.6873, abs=1e-4)


def test_qwen3_30b_a3b_eight_narrow_experts():
    m = _model("Qwen__Qwen3-30B-A3B")
    fp = accounting.projection_flops(m)
    attention = 2 * 48 * (2 * 2048 * 32 * 128 + 2 * 2048 * 4 * 128)  # head_dim 128 ≠ 2048/32: h·D = 4096 ≠ H
    router = 2 * 48 * 2048 * 128
    experts = 2 * 48 * 8 * 3 * 2048 * 768
    assert fp.by_group == {"attention": attention, "router": router, "experts": experts}
    assert fp.layers == 5_460_983_808
    # the dense formula with I = 768 (ModelConfig.I: no dense layer) counts one narrow expert and H² attention
    assert fp.layers / accounting.dense_formula_flops(m) == pytest.approx(3.741, abs=1e-3)
    assert (fp.layers + fp.lm_head) / 2 / 1e9 == pytest.approx(3.04, abs=0.01)  # + 0.31e9 embeddings: "3.3B"


def test_gpt_oss_120b_biases_and_sinks():
    m = _model("openai__gpt-oss-120b")
    fp = accounting.projection_flops(m)
    H = 2880
    attention = 2 * 36 * (2 * H * 64 * 64 + 2 * H * 8 * 64 + (4096 + 2 * 512 + H) + 64)  # + q/k/v/o biases, sinks
    router = 2 * 36 * (H * 128 + 128)
    experts = 2 * 36 * 4 * (3 * H * 2880 + 2 * 2880 + H)  # top-4 of 128, gate_up and down with biases
    assert fp.by_group == {"attention": attention, "router": router, "experts": experts}
    assert fp.layers == 9_107_011_584
    assert (fp.layers + fp.lm_head) / 2 / 1e9 == pytest.approx(5.13, abs=0.01)  # model card: 5.1B active
    # biases and sinks counted at 2 FLOPs like the weights: well under the documented 0.05 %
    extra = 2 * 36 * ((4096 + 2 * 512 + H) + 64) + 2 * 36 * 128 + 2 * 36 * 4 * (2 * 2880 + H)
    assert extra / fp.layers < 5e-4
    assert fp.layers / accounting.dense_formula_flops(m) == pytest.approx(2.847, abs=1e-3)


def test_substituted_terms_evaluate_to_the_counts():
    for name in ("mistralai__Mixtral-8x7B-Instruct-v0.1", "deepseek-ai__DeepSeek-R1", "openai__gpt-oss-120b"):
        fp = accounting.projection_flops(_model(name))
        for g, term in fp.terms.items():
            expr = term.split(" (")[0] if "(q" in term else term
            expr = expr.replace("·", "*").replace(" biases", "").replace(" sinks", "")
            assert eval(expr) == fp.by_group[g], (name, g, term)  # the shown arithmetic gives the count
        assert f"{fp.layers:.4g}" in fp.substituted


def test_per_rank_share_shows_the_replicated_parts():
    r1 = _model("deepseek-ai__DeepSeek-R1")
    f1, f8 = accounting.projection_flops(r1), accounting.projection_flops(r1, 8)
    # replicated at TP=8: q_a, kv_a and their norms per layer, and the router
    repl = 2 * 61 * (7168 * 1536 + 1536 + 7168 * 576 + 512) + 2 * 58 * 7168 * 256
    assert f8.layers == pytest.approx(repl + (f1.layers - repl) / 8)
    assert f8.layers / f1.layers == pytest.approx(0.1502, abs=1e-4)
    llama = load_model_config(LLAMA_8B)
    assert accounting.projection_flops(llama, 8).layers == accounting.projection_flops(llama).layers / 8


# ------------------------------------------------------------------ the rule: F_proj beside a, the compute floor


def _t_star(m):
    return lambda a: tpmath.breakeven_tokens(m.L, 8e-6, a, 2, m.H, 2, 150e9)


def test_compute_floor_uses_the_active_count_mixtral():
    # At 989 TFLOP/s the floor is 25.5 µs per token MoE-active (14.1 µs by the dense formula). a = 20 µs is
    # below it: the GEMM time is not compute, the warning is withheld — the dense formula would have kept it.
    m = _model("mistralai__Mixtral-8x7B-Instruct-v0.1")
    a = 20e-6
    v, floor = projection_account(m, 2, a, "TP=1 baseline x: slope of ... lm_head excluded", 989.0, _t_star(m))
    assert floor == pytest.approx(25_235_030_016 / 989e12) and a < floor
    assert a > accounting.dense_formula_flops(m) / 989e12
    assert v["F_proj_kind"] == "MoE-active" and v["F_proj_vs_dense_formula"] == pytest.approx(1.8078)
    assert v["a_implied_tflops"] == pytest.approx(25_235_030_016 / a / 1e12, rel=1e-6)
    assert "is below it" in v["compute_floor_note"] and v["moe_tp_assumption"] == MOE_TP_ASSUMPTION
    assert v["T_star_at_compute_floor"] == pytest.approx(_t_star(m)(floor), abs=1e-3)


def test_compute_floor_deepseek_dense_formula_would_overcount():
    # The dense formula counts 103.9e9 FLOP per token for R1 (H_KV = 128·192, 18432 on every layer): with it a
    # = 90 µs at 989 TFLOP/s would look below the floor; the active count (71.4e9, 72.2 µs) keeps the warning.
    m = _model("deepseek-ai__DeepSeek-R1")
    a = 90e-6
    v, floor = projection_account(m, 2, a, "... lm_head excluded", 989.0, _t_star(m))
    assert a >= floor and a < accounting.dense_formula_flops(m) / 989e12
    assert "is below it" not in v["compute_floor_note"]


def test_lm_head_counted_when_the_gemm_time_includes_it():
    m = _model("Qwen__Qwen3-30B-A3B")
    src = "estimate: p × slope of GPU GEMM kernel time per step (gemm and weight-only GEMM classes, lm_head included)"
    v, _ = projection_account(m, 4, 1e-5, src, None, _t_star(m))
    assert v["F_compared_with_a"].startswith("F_proj + lm_head")
    assert v["a_implied_tflops"] == pytest.approx((5_460_983_808 + 2 * 151936 * 2048) / 1e-5 / 1e12, rel=1e-6)
    assert "peak_tflops" not in v and "a_compute_floor_ms_per_token" not in v


def test_dense_values_carry_no_moe_assumption():
    v, floor = projection_account(load_model_config(LLAMA_8B), 2, 1e-3, "x", None, lambda a: None)
    assert v["F_proj_kind"] == "dense" and "moe_tp_assumption" not in v and floor is None
    assert "attention scores" in v["F_proj_leaves_out"]


def _grafted_moe_config(tmp_path):
    """The healthy_tp2 sample's own config with Mixtral's routing fields (num_local_experts 8, num_experts_per_tok
    2, verbatim from its published config): the trace is the dense sample's, so this tests the rule's arithmetic on
    an MoE config, not an MoE deployment."""
    raw = json.loads((SAMPLES / "healthy_tp2" / "config.json").read_text())
    mixtral = json.loads((CONFIGS / "mistralai__Mixtral-8x7B-Instruct-v0.1.config.json").read_text())
    raw |= {k: mixtral[k] for k in ("num_local_experts", "num_experts_per_tok")}
    p = tmp_path / "config.json"
    p.write_text(json.dumps(raw))
    return p


def _col003(model, peak):
    d = SAMPLES / "healthy_tp2"
    r = analyze([d], model=model, settings=Settings(peak_tflops=peak))
    (c,) = [c for c in r.checks if c.rule == "COL003"]
    return c


def test_rule_end_to_end_moe_config_lowers_the_warning(tmp_path):
    # a = 8.98 µs per token (the trace's). F_proj dense 5.90e6 → floor 5.90 µs at 1 TFLOP/s: the warning stands.
    # MoE-active (top-2 of 8 experts of 704): 2·4·(2·256·256 + 2·256·128) + 2·4·256·8 + 2·4·2·3·256·704 = 10.24e6
    # → floor 10.24 µs > a: not decided (info). A dense count on the MoE config would have kept the warning.
    dense = _col003(SAMPLES / "healthy_tp2" / "config.json", 1.0)
    assert dense.status == "finding" and dense.severity == "warning"
    moe = _col003(_grafted_moe_config(tmp_path), 1.0)
    want = 2 * 4 * (2 * 256 * 256 + 2 * 256 * 128) + 2 * 4 * 256 * 8 + 2 * 4 * 2 * 3 * 256 * 704
    assert moe.values["F_proj_flop_per_token"] == want == 10_240_000
    assert moe.values["F_proj_kind"] == "MoE-active" and moe.values["F_proj_inputs"]["k"] == 2
    assert moe.status == "finding" and moe.severity == "info" and "not decided" in moe.title
    assert moe.values["T_star"] == dense.values["T_star"]  # a is measured: F_proj changes the verdict, not T*
    assert "MoE-active" in moe.formula and "experts 2·4·2·(3·256·704)" in moe.substituted
