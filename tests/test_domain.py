"""The workload's domain (tracediag/derive/domain.py) on vendored real traces, and what follows from it: advice
fit to the domain (KRN008), concatenation not labelled RoPE, all-to-all groups named by what else ran
(derive/layout.py). The counts behind each label are also read straight from the files by tests/real_traces.py."""

from __future__ import annotations

import json

import pytest
import real_traces
from test_real_traces_doc import _kernel_names, _report  # the real-traces page's cached analyses and names


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
    from tracediag.rules.step5_kernels.krn008_unfused_elementwise import advice

    k = _check(reports["ddp"], "KRN008")
    # its BatchNorm kernels are fused norms: what is left unfused (4 %) is no finding; the advice it would give
    assert k["status"] == "pass" and "batch_norm" in str(k["values"].get("fused_families_ns"))

    class _Run:  # the rule's advice reads the analysis's domain only
        fitness = staticmethod(lambda: reports["ddp"]["fitness"])

    text = advice(_Run())
    assert "vLLM" not in text and "FlashInfer" not in text
    assert "training" in text and "torch.compile" in text
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


@pytest.fixture(scope="module")
def more_reports():
    names = {
        "hf_qwen": "tracelens_h100_hf_qwen1.5-0.5b.json.gz",
        "nsys_attention": "nsysai_2xh100_after.sqlite",
        "capture": "tracelens_mi300x_vllm_gptoss_piecewise_graph_capture_rank0.pt.trace.json.gz",
        "simple_add": "hta_a100_simple_add.json.gz",
    }
    path = {p.name: str(p) for p in real_traces.TRACES}
    return {k: _report(path[v]) for k, v in names.items()}


def test_llm_only_on_a_causal_decoders_evidence(reports, more_reports):
    """Attention alone is no LLM: Hugging Face Qwen's SDPA flash kernels say Is_causal = true in their template
    (34 of them); the nsys-ai export's FlashAttention-2 kernels say (bool)0, and nothing else there is a decoder's,
    so it is a transformer encoder; a vLLM graph capture is an LLM by its KV-cache writes and paged attention."""
    qwen = more_reports["hf_qwen"]["fitness"]["domain"]
    assert qwen["label"] == "LLM inference" and qwen["causal_attention"] == 34
    assert qwen["workload_why"] == "a causal decoder: 34 causal attention kernels"
    enc = more_reports["nsys_attention"]["fitness"]["domain"]
    assert enc["label"] == "transformer encoder training" and enc["causal_attention"] == 0
    assert enc["attention_kernels"] == 60 and "no engine step, KV-cache write" in enc["workload_why"]
    cap = more_reports["capture"]["fitness"]["domain"]
    assert cap["label"] == "LLM inference" and cap["kv_cache_writes"] == 48 and cap["paged_attention"] == 24
    assert reports["gptoss"]["fitness"]["domain"]["lm_head_gemms"] == 1  # gpt-oss's 201,088-wide vocabulary


def test_training_and_convolutions_from_kernel_names(reports):
    """The ResNet DDP step's kernels say training and convolution by themselves (a GPU-only trace has no CPU ops):
    MIOpen igemm_fwd/bwd/wrw and Composable Kernel grouped convolutions, batch_norm_backward_kernel."""
    d = reports["ddp"]["fitness"]["domain"]
    assert d["conv_kernels"] == 241 and d["backward_kernels"] == 125
    assert "241 convolution kernels" in d["workload_why"] and "125 backward-pass or optimizer kernels" in d["mode_why"]
    # inference traces launch none of them (SGLang's _foreach_ kernels are no optimizer)
    assert reports["sglang_moe"]["fitness"]["domain"]["backward_kernels"] == 0


def _phase_words(d) -> set[str]:
    import re

    return set(re.findall(r'"phase": "([^"]+)"', json.dumps(d)))


def test_steps_are_named_by_the_workload(reports, more_reports):
    """No 'unknown phase' where the workload is known: a training job's steps are training (findings and report
    sections alike), a vision model's forward passes are forward, and SCH001 says why there is nothing to split."""
    assert _phase_words(reports["ddp"]) == {"training"}
    assert _phase_words(more_reports["nsys_attention"]) == {"training"}
    assert _phase_words(more_reports["simple_add"]) == {"forward"}
    k6 = _check(more_reports["simple_add"], "KRN006")
    assert "forward steps" in k6["title"] and "unknown phase" not in json.dumps(more_reports["simple_add"])
    sch = _check(reports["ddp"], "SCH001")
    assert sch["status"] == "not_applicable" and "no prefill/decode phase" in sch["reason"]


def test_causal_flag_read_from_the_kernel_template():
    """Is_causal from real names: PyTorch's bundled FlashAttention-2 (Kineto), flash-attn's own (nsys rendering),
    FA3's compute_attn_ws (DeepSeek's profile); a name without the flag says nothing."""
    from tracediag.catalog import load_patterns
    from tracediag.derive.domain import causal_flag

    ws = next(p for p in load_patterns() if p.id == "fa3_compute_attn_ws").pos[0]
    assert causal_flag(ws) is True
    names = _kernel_names(next(str(p) for p in real_traces.TRACES if p.name.startswith("tracelens_h100")))
    assert {causal_flag(n) for n in names if "flash_fwd" in n} == {True}
    nsys = _kernel_names(next(str(p) for p in real_traces.TRACES if p.name == "nsysai_2xh100_after.sqlite"))
    assert {causal_flag(n) for n in nsys if "flash_fwd" in n} == {False}
    assert causal_flag("kernel_unified_attention_2d") is None


def test_gpu_only_trace_says_the_host_side_is_missing(reports):
    """pipit's MPI + CUDA saxpy export holds kernels, copies and runtime calls but no CPU op: the window is every GPU
    event, not every event, and the fitness names the rules the missing host side leaves without an input."""
    d = _report(next(str(p) for p in real_traces.TRACES if p.name == "pipit_saxpy_mpi_nvtx.sqlite"))
    host = d["fitness"]["host_side"]
    assert host["cpu_ops"] == 0 and host["runtime_calls"] == 95
    assert host["rules_disabled"] == ["KRN007", "KRN012", "SHP002"]
    assert host["why"].startswith("the host side is missing: 5 kernels and no CPU ops")
    assert d["fitness"]["why"].endswith("every GPU event recorded, no CPU op")
    assert "host_side" not in reports["ddp"]["fitness"]  # 8,004 CPU ops


def test_batch_norm_is_a_fused_norm_and_layout_transposes_are_named():
    """Every BatchNorm kernel of the vendored CNN traces is a norm kernel (ATen's batch_norm_* and the
    batch_norm_update_stats_and_invert TensorIterator kernel, cuDNN's bn_fw / bn_bw), and every NCHW <-> NHWC copy
    (cuDNN nchwToNhwc / nhwcToNchw, MIOpen batched_transpose / transpose_NCHW2CNHW) is a named layout transpose whose
    label says channels-last; on the ResNet DDP step KRN008 counts BatchNorm with the fused kernels, not as eager."""
    import re

    from tracediag.catalog import classify_kernel, family_label

    names = set().union(*(_kernel_names(str(p)) for p in real_traces.TRACES if p.name.endswith(".json.gz")))
    bn = [n for n in names if re.search(r"batch_norm|bn_fw|bn_bw", n)]
    layout = [n for n in names if re.search(r"transpose|nchwTo|nhwcTo", n)]
    assert len(bn) == 12 and len(layout) == 11
    assert {classify_kernel(n).klass for n in bn} == {"norm"}
    assert {classify_kernel(n).family for n in layout} == {"layout_transpose"}
    assert "channels_last" in family_label("layout_transpose")
    ddp = _report(next(str(p) for p in real_traces.TRACES if p.name.startswith("tracelens_mi300x_rank0of8")))
    k = _check(ddp, "KRN008")
    assert k["values"]["fused_families_ns"]["aten_batch_norm"] == 6465671
    assert k["values"]["fused_families_ns"]["layout_transpose"] == 4214740
    assert k["values"]["by_kind_ns"]["norm"] == 40274  # was 6,505,945 with BatchNorm counted as eager
