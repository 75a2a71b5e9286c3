"""The workload's domain (tracediag/derive/domain.py) on vendored real traces, and what follows from it: advice
fit to the domain (KRN008), concatenation not labelled RoPE, all-to-all groups named by what else ran
(derive/layout.py). The counts behind each label are also read straight from the files by tests/real_traces.py."""

from __future__ import annotations

import pytest
import real_traces
from test_real_traces_doc import _report  # the same cached analyses as the real-traces page


@pytest.fixture(scope="module")
def reports():
    names = {
        "gptoss": "tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz",
        "sglang_moe": "tracelens_b300_sglang_qwen3-30b-a3b_moe_decode_cudagraph.json.gz",
        "recsys": "hta_rank_not_found.json.gz",
        "gp100": "hta_gp100_gpu_user_annotation.json.gz",
        "ddp": "tracelens_mi300x_rank0of8_rccl_ddp.json.gz",
    }
    path = {p.name: str(p) for p in real_traces.TRACES}
    return {k: _report(path[v]) for k, v in names.items()}


def _check(d, rule):
    return next(c for c in d["checks"] if c["rule"] == rule)


def test_domain_recorded_in_findings(reports):
    dom = {k: d["fitness"]["domain"] for k, d in reports.items()}
    assert dom["gptoss"]["label"] == "LLM inference" and dom["gptoss"]["attention_kernels"] == 24
    # SGLang runs aten::_foreach_* ops at inference: alone they are no optimizer step
    assert dom["sglang_moe"]["label"] == "LLM inference" and dom["sglang_moe"]["foreach_ops"] == 2
    assert dom["sglang_moe"]["moe_kernels"] > 0
    assert dom["recsys"]["label"] == "recommender training" and dom["recsys"]["embedding_bag_ops"] == 10
    assert dom["gp100"]["mode"] == "training" and dom["gp100"]["backward_ops"] == 130
    assert dom["ddp"]["label"] == "vision training" and dom["ddp"]["conv_ops"] > 0


def test_engine_advice_only_for_llm_inference(reports):
    """KRN008 on a training job (the MI300X DDP ResNet: eager norms, 16 % of GPU busy time) must not tell it to use
    vLLM / SGLang / FlashInfer kernels. (On HTA's GP100 step, 76 % eager elementwise, the steady segment holds
    0.291 ms of GPU work: too little for a share, so KRN008 does not run there.)"""
    k = _check(reports["ddp"], "KRN008")
    assert k["status"] == "finding"
    assert "vLLM" not in k["next_check"] and "FlashInfer" not in k["next_check"]
    assert "training" in k["next_check"] and "torch.compile" in k["next_check"]
    assert _check(reports["gp100"], "KRN008")["reason"].startswith("missing steady GPU work")
    # KRN006 on the same launch-bound training step: a larger batch, not more sequences per engine step
    h = _check(reports["gp100"], "KRN006")
    assert h["status"] == "finding" and "launch-bound" in h["title"]
    assert "sequences" not in h["next_check"] and "per-GPU batch size" in h["next_check"]


def test_concatenation_is_not_rope(reports):
    """The DDP ResNet trace's CatArrayBatchedCopy kernels are concatenation, not rotary embedding."""
    k = _check(reports["ddp"], "KRN008")
    kinds = k["values"]["by_kind_ns"]
    assert "concatenation (cat)" in kinds and not any(x.startswith("rope") for x in kinds)  # a CNN: no RoPE
    assert all("CatArray" not in r["name"] or r["kind"] == "concatenation (cat)" for r in k["table"])


def test_all_to_all_beside_embedding_bags_is_not_expert_parallel(reports):
    """HTA's rank_not_found trace: 6 all-to-alls beside embedding-bag ops, no MoE kernel — a TorchRec embedding
    exchange, not an EP group."""
    groups = reports["recsys"]["layout"]["groups"]
    assert [g["kind"] for g in groups] == ["EMB"] and "embedding-bag" in groups[0]["evidence"]
    assert "EP" not in reports["recsys"]["tp"]["source"]


def test_the_table_has_the_columns_the_classifier_fills():
    import duckdb

    from tracediag.derive.domain import COLUMNS
    from tracediag.store import run_sql_file

    con = duckdb.connect()
    run_sql_file(con, "tracediag.derive", "workload_domain.sql")
    assert tuple(r[0] for r in con.execute("DESCRIBE workload_domain").fetchall()) == COLUMNS
