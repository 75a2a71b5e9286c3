"""Tests for tracediag.catalog: the pattern data file and the classifier built on it."""

from __future__ import annotations

import gzip
import json
import re
from importlib import resources
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from conftest import EXTERNAL

from tracediag.catalog import (
    CATALOG_VERSION,
    COLLECTIVE_OPS,
    KLASSES,
    Classification,
    classify_cpu_op,
    classify_kernel,
    failures,
    family_label,
    family_labels,
    load_patterns,
    normalize_collective_name,
)

NCCL_ARGS_TRACE = EXTERNAL / "kineto" / "hta_a100_rank0of2_nccl_args.json.gz"

REQUIRED_KEYS = {"id", "klass", "family", "applies_to", "regex", "phase_hint", "source", "pos", "neg"}
OPTIONAL_KEYS = {"collective_op", "note"}

RAW = json.loads(resources.files("tracediag.catalog").joinpath("kernel_patterns.json").read_text("utf-8"))
PATTERNS = load_patterns()
BY_ID = {p.id: p for p in PATTERNS}

# Expected collective op of every collective pos name, written by hand from what each name is
# (NCCL kernel collective, c10d op, PGNCCL/Gloo annotation ...), independently of the classifier.
OP_OF_PATTERN = {
    "nccl_kernel_le_2_7": "all_reduce",
    "rccl_generic_kernel": "unknown",
    "nccl_dev_kernel_generic": "unknown",
    "nccl_symmetric_kernel": None,
    "aiter_custom_ar_kernel": "all_reduce",
    "vllm_custom_ar_kernel": "all_reduce",
    "quickreduce_kernel": "all_reduce",
    "trtllm_ar_kernel": "all_reduce",
    "mscclpp_collective_kernel": "all_reduce",
    "mscclpp_execution_kernel": "unknown",
    "symm_mem_kernel": "all_reduce",
    "record_param_comms": "unknown",
    "symm_mem_op": "all_reduce",
    "vllm_custom_ar_op": "all_reduce",
    "quickreduce_op": "all_reduce",
    "trtllm_ar_op": "all_reduce",
    "deepep_dispatch_combine": "all_to_all",
    "deepep_notify": "barrier",
}
OP_OF_NAME = {
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)": "all_reduce",
    "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)": "all_reduce",
    "ncclKernel_Broadcast_RING_LL_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)": "broadcast",
    "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)": "send_recv",
    "ncclKernel_ReduceScatter_RING_LL_Sum___nv_bfloat16(ncclDevComm*, unsigned long, ncclWork*)": ("reduce_scatter"),
    "ncclKernel_AllReduce": "all_reduce",
    "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)": "all_reduce",
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<(unsigned long)4096>)": "all_reduce",
    "ncclDevKernel_AllGather_RING_LL": "all_gather",
    "ncclDevKernel_SendRecv": "send_recv",
    "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)": "reduce_scatter",
    "_Z40ncclDevKernel_AllReduce_Sum_bf16_RING_LL24ncclDevKernelArgsStorageILm4096EE": "all_reduce",
    "ncclSymDevKernel_AllReduce_AGxLLMC_R_sum_bf16": "all_reduce",
    "ncclSymkDevKernel_AllGather_LLMC": "all_gather",
    "c10d::allreduce_": "all_reduce",
    "c10d::allgather_": "all_gather",
    "c10d::_allgather_base_": "all_gather",
    "c10d::allgather_into_tensor_coalesced_": "all_gather",
    "c10d::reduce_scatter_": "reduce_scatter",
    "c10d::_reduce_scatter_base_": "reduce_scatter",
    "c10d::reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "c10d::alltoall_": "all_to_all",
    "c10d::alltoall_base_": "all_to_all",
    "c10d::broadcast_": "broadcast",
    "c10d::send": "send",
    "c10d::recv_": "recv",
    "c10d::barrier": "barrier",
    "c10d::reduce_": "reduce",
    "c10d::gather_": "unknown",
    "nccl:all_reduce": "all_reduce",
    "nccl:_all_gather_base": "all_gather",
    "nccl:all_to_all": "all_to_all",
    "nccl:broadcast": "broadcast",
    "nccl:_reduce_scatter_base": "reduce_scatter",
    "nccl:reduce_scatter_tensor_coalesced": "reduce_scatter",
    "nccl:send 0->1": "send",
    "nccl:recv 1<-0": "recv",
    "nccl:coalesced": "unknown",
    "gloo:all_reduce": "all_reduce",
    "gloo:all_to_all": "all_to_all",
    "gloo:barrier": "barrier",
    "gloo:recv": "recv",
    "gloo:recvAnySource": "recv",
    "vllm::all_reduce": "all_reduce",
    "vllm::reduce_scatter": "reduce_scatter",
    "vllm::all_gather": "all_gather",
}


def _classify(name: str, kind: str) -> Classification:
    return classify_kernel(name) if kind == "kernel" else classify_cpu_op(name)


def _pos_cases() -> list[tuple[str, str, str]]:
    return [(p.id, kind, n) for p in PATTERNS for kind in sorted(p.applies_to) for n in p.pos]


def _neg_cases() -> list[tuple[str, str]]:
    return [(p.id, n) for p in PATTERNS for n in p.neg]


# ------------------------------------------------------------------ data file structure


def test_top_level_structure() -> None:
    assert set(RAW) >= {"version", "patterns"}
    assert isinstance(RAW["version"], int) and RAW["version"] == CATALOG_VERSION
    assert isinstance(RAW["patterns"], list) and len(RAW["patterns"]) == len(PATTERNS) > 0


@pytest.mark.parametrize("entry", RAW["patterns"], ids=lambda e: e.get("id", "?"))
def test_pattern_entry_schema(entry: dict) -> None:
    assert set(entry) >= REQUIRED_KEYS, REQUIRED_KEYS - set(entry)
    assert set(entry) <= REQUIRED_KEYS | OPTIONAL_KEYS, set(entry) - REQUIRED_KEYS - OPTIONAL_KEYS
    assert re.fullmatch(r"[a-z0-9_]+", entry["id"])
    assert entry["klass"] in KLASSES and entry["klass"] != "other"
    assert isinstance(entry["family"], str) and entry["family"]
    assert entry["applies_to"] and set(entry["applies_to"]) <= {"kernel", "cpu_op"}
    assert entry["phase_hint"] in {"prefill", "decode", "any", "mixed"}
    assert isinstance(entry["source"], str) and entry["source"].strip()
    assert entry["pos"], "every pattern needs at least one real name it must match"
    assert all(isinstance(n, str) and n for n in entry["pos"] + entry["neg"])
    rx = re.compile(entry["regex"])
    if entry["klass"] == "collective":
        # either the regex names the collective or the pattern fixes it
        assert ("coll" in rx.groupindex) != ("collective_op" in entry)
        if "collective_op" in entry:
            assert entry["collective_op"] in COLLECTIVE_OPS
    else:
        assert "collective_op" not in entry and "coll" not in rx.groupindex


def test_ids_unique() -> None:
    ids = [e["id"] for e in RAW["patterns"]]
    assert len(ids) == len(set(ids))


# ------------------------------------------------------------------ pos / neg names


@pytest.mark.parametrize(("pid", "kind", "name"), _pos_cases(), ids=lambda v: v[:60])
def test_pos_name_classifies_to_its_pattern(pid: str, kind: str, name: str) -> None:
    p = BY_ID[pid]
    got = _classify(name, kind)
    assert (got.pattern_id, got.klass, got.family, got.phase_hint) == (pid, p.klass, p.family, p.phase_hint)
    if p.klass == "collective":
        expected = OP_OF_NAME[name] if name in OP_OF_NAME else OP_OF_PATTERN[pid]
        assert expected is not None, f"no expected op written down for {name!r}"
        assert got.collective_op == expected
    else:
        assert got.collective_op is None


@pytest.mark.parametrize(("pid", "name"), _neg_cases(), ids=lambda v: v[:60])
def test_neg_name_does_not_match_its_pattern(pid: str, name: str) -> None:
    assert BY_ID[pid].regex.search(name) is None


def test_every_collective_pos_has_an_expected_op() -> None:
    missing = [
        (p.id, n)
        for p in PATTERNS
        if p.klass == "collective"
        for n in p.pos
        if n not in OP_OF_NAME and OP_OF_PATTERN.get(p.id) is None
    ]
    assert not missing


def test_unknown_names_are_other() -> None:
    for name in ("", "my_custom_kernel", "void foo::bar<int>(int)", "aten::empty"):
        assert classify_kernel(name) == Classification("other", None, None, None, None)
        assert classify_cpu_op(name).klass == "other"


def test_kernel_and_cpu_op_namespaces_are_separate() -> None:
    # nccl:* is a host annotation, ncclKernel_* a GPU kernel
    assert classify_kernel("nccl:all_reduce").klass == "other"
    assert classify_cpu_op("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)").klass == "other"


def test_first_match_wins_specific_before_generic() -> None:
    ids = [p.id for p in PATTERNS]
    for specific, generic in [
        ("rccl_generic_kernel", "nccl_dev_kernel_generic"),
        ("inductor_norm", "inductor_pointwise"),
        ("vllm_elementwise_kernel", "sglang_elementwise_kernel"),
        ("gptq_reconstruct", "exllamav2_reconstruct"),
    ]:
        assert ids.index(specific) < ids.index(generic)
    # an RCCL-only signature lands on the rccl pattern although the generic one also matches it
    name = "ncclDevKernel_Generic(ncclDevComm*, channelMasks, ncclWork*)"
    assert BY_ID["nccl_dev_kernel_generic"].regex.search(name)
    assert classify_kernel(name).family == "rccl"


def test_classifiers_are_cached() -> None:
    classify_kernel.cache_clear()
    classify_kernel("ampere_sgemm_128x64_nn")
    classify_kernel("ampere_sgemm_128x64_nn")
    assert classify_kernel.cache_info().hits == 1
    assert load_patterns() is load_patterns()


# ------------------------------------------------------------------ collective name normalization

# Values as PyTorch writes them: RECORD_PARAM_COMMS collective names and profilingTitle strings in
# torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp, ProcessGroupGloo.cpp titles, c10d ops (Ops.cpp).
NORMALIZE_CASES = [
    ("allreduce", "all_reduce"),
    ("allreduce_coalesced", "all_reduce"),
    ("_allgather_base", "all_gather"),
    ("all_gather", "all_gather"),
    ("allgather_into_tensor_coalesced", "all_gather"),
    ("reduce_scatter", "reduce_scatter"),
    ("_reduce_scatter_base", "reduce_scatter"),
    ("reduce_scatter_tensor_coalesced", "reduce_scatter"),
    ("all_to_all", "all_to_all"),
    ("all_to_allv", "all_to_all"),
    ("alltoall_base", "all_to_all"),
    ("broadcast", "broadcast"),
    ("_broadcast_oop", "broadcast"),
    ("reduce", "reduce"),
    ("_reduce_oop", "reduce"),
    ("send", "send"),
    ("recv", "recv"),
    ("barrier", "barrier"),
    ("gather", "unknown"),
    ("scatter", "unknown"),
    ("wait", "unknown"),
    ("nccl:all_reduce", "all_reduce"),
    ("gloo:all_reduce", "all_reduce"),
    ("nccl:_all_gather_base", "all_gather"),
    ("nccl:_reduce_scatter_base", "reduce_scatter"),
    ("nccl:all_to_all", "all_to_all"),
    ("nccl:send 0->1", "send"),
    ("nccl:recv 1<-0", "recv"),
    ("nccl:coalesced", "unknown"),
    ("gloo:recvAnySource", "recv"),
    ("c10d::allreduce_", "all_reduce"),
    ("c10d::monitored_barrier_", "barrier"),
    ("SendRecv", "send_recv"),
    ("Generic", "unknown"),
    ("", "unknown"),
]


@pytest.mark.parametrize(("value", "expected"), NORMALIZE_CASES)
def test_normalize_collective_name(value: str, expected: str) -> None:
    assert normalize_collective_name(value) == expected


# ------------------------------------------------------------------ real trace


def test_real_trace_nccl_kernels_match_collective_name_arg() -> None:
    with gzip.open(NCCL_ARGS_TRACE, "rt") as f:
        events = json.load(f)["traceEvents"]
    nccl = [e for e in events if e.get("cat") == "kernel" and e["name"].startswith("nccl")]
    assert len(nccl) == 21
    ops = set()
    for e in nccl:
        got = classify_kernel(e["name"])
        assert got.klass == "collective", e["name"]
        assert got.family == "nccl"
        want = normalize_collective_name(e["args"]["Collective name"])
        assert got.collective_op == want, (e["name"], e["args"]["Collective name"])
        ops.add(want)
    assert ops == {"all_reduce", "broadcast"}
    # host side of the same trace: annotations and dispatcher ops are collectives too
    host_cats = ("cpu_op", "user_annotation", "gpu_user_annotation")
    host = {e["name"] for e in events if e.get("cat") in host_cats}
    for name in (
        "record_param_comms",
        "c10d::allreduce_",
        "c10d::broadcast_",
        "nccl:all_reduce",
        "nccl:broadcast",
    ):
        assert name in host and classify_cpu_op(name).klass == "collective"
    assert {
        normalize_collective_name(e["args"]["Collective name"])
        for e in events
        if e["name"] == "record_param_comms" and "Collective name" in e.get("args", {})
    } == {"all_reduce", "broadcast", "unknown"}  # "wait" records normalize to unknown


# ------------------------------------------------------------------ family labels


def test_every_family_has_a_label_and_every_label_a_pattern() -> None:
    from tracediag.catalog import DERIVED_FAMILIES

    used = {p.family for p in PATTERNS} | set(DERIVED_FAMILIES)
    labels = family_labels()
    assert used == set(labels), (used - set(labels), set(labels) - used)
    assert all(isinstance(v, str) and v for v in labels.values())
    assert family_label("pytorch_flash") == "FlashAttention-2 (PyTorch SDPA's bundled copy)"
    assert family_label(None) == "unclassified"
    assert family_label("not_a_family") == "not_a_family"


# ------------------------------------------------------------------ real GPU traces and CPU sample traces

# (trace, expected (klass, family) of every kernel whose name starts with the prefix) — the names are the
# traces' own (TraceLens test traces: H100 HF Qwen1.5-0.5B, vLLM gpt-oss and SGLang Qwen3-8B on MI300X).
GPU_TRACE_EXPECTATIONS = [
    ("tracelens_h100_hf_qwen1.5-0.5b.json.gz", "void pytorch_flash::flash_fwd_kernel<", ("attention", "pytorch_flash")),
    ("tracelens_h100_hf_qwen1.5-0.5b.json.gz", "sm90_xmma_gemm_bf16bf16", ("gemm", "cublas")),
    ("tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz", "kernel_unified_attention_2d",
     ("attention", "triton_attention")),
    ("tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz", "_matmul_ogs_NNT_bf16xbf16xmxfp4",
     ("wo_gemm", "triton_matmul_ogs")),
    ("tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz", "Cijk_Alik_Bljk_BBS", ("gemm", "hipblaslt")),
    ("tracelens_mi300x_sglang_qwen3-8b_prefilldecode.json.gz",
     "_ZN7ck_tile6kentryILi2ENS_38FmhaBatchPrefillWithPagedKVCacheKernel", ("attention", "ck_attention")),
    ("tracelens_mi300x_sglang_qwen3-8b_prefilldecode.json.gz", "Cijk_Alik_Bljk_BBS", ("gemm", "hipblaslt")),
    # ROCm convolutions of a ResNet step (were "other"): MIOpen's implicit-GEMM asm and Composable Kernel's grouped conv
    ("tracelens_mi300x_rank0of8_rccl_ddp.json.gz", "igemm_", ("conv", "miopen")),
    ("tracelens_mi300x_rank0of8_rccl_ddp.json.gz", "_ZN2ck16tensor_operation6device12_GLOBAL__N_1",
     ("conv", "ck_conv")),
]  # fmt: skip


@pytest.mark.parametrize(("trace", "prefix", "expected"), GPU_TRACE_EXPECTATIONS, ids=lambda v: str(v)[:40])
def test_real_gpu_trace_kernels_classify(trace: str, prefix: str, expected: tuple[str, str]) -> None:
    with gzip.open(EXTERNAL / "kineto" / trace, "rt") as f:
        names = {e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "kernel"}
    hits = [n for n in names if n.startswith(prefix)]
    assert hits, prefix
    for n in hits:
        got = classify_kernel(n)
        assert (got.klass, got.family) == expected, n
    # these traces run fused attention only: nothing in them may read as the math fallback
    assert not [n for n in names if classify_kernel(n).klass == "attention_fallback"]


# CPU op names as torch 2.13.0+cpu writes them in sample_traces/ (real profiler output).
CPU_SAMPLE_OPS = [
    ("healthy_tp2", "aten::_scaled_dot_product_flash_attention_for_cpu", ("attention", "sdpa_flash_cpu")),
    ("math_decode_tp2", "aten::_scaled_dot_product_attention_math", ("attention_fallback", "sdpa_math")),
    ("w4_int4mm_tp2", "aten::_weight_int4pack_mm_for_cpu", ("wo_gemm", "tinygemm_int4")),
    ("w4_dense_tp2", "aten::mm", ("gemm", "aten")),
]


@pytest.mark.parametrize(("scenario", "name", "expected"), CPU_SAMPLE_OPS)
def test_cpu_sample_trace_ops_classify(scenario: str, name: str, expected: tuple[str, str]) -> None:
    path = Path(__file__).resolve().parents[1] / "sample_traces" / scenario / "rank0.pt.trace.json.gz"
    with gzip.open(path, "rt") as f:
        names = {e["name"] for e in json.load(f)["traceEvents"] if e.get("cat") == "cpu_op"}
    assert name in names
    got = classify_cpu_op(name)
    assert (got.klass, got.family) == expected


# ------------------------------------------------------------------ GEMM precision (an attribute, not a class)

GEMM_PRECISION = json.loads(resources.files("tracediag.catalog").joinpath("kernel_patterns.json").read_text("utf-8"))[
    "gemm_precision"
]


@pytest.mark.parametrize("entry", GEMM_PRECISION, ids=lambda e: e["id"])
def test_gemm_precision_pos_and_neg(entry: dict) -> None:
    from tracediag.catalog import gemm_precision

    assert entry["source"].strip() and entry["pos"]
    for name in entry["pos"]:
        got = gemm_precision(name)
        assert got is not None and got.id == entry["id"], name
        assert classify_kernel(name).klass == "gemm", name  # a GEMM the class patterns know
    for name in entry["neg"]:
        assert re.search(entry["regex"], name) is None, name


def test_softmax_alone_is_not_attention() -> None:
    # a sampler's or router's softmax is elementwise work; the fallback needs QK^T -> softmax -> PV
    name = "void (anonymous namespace)::softmax_warp_forward<float, float, float, 1, false, false>(float*, float const*, int, int, int, bool const*, int, bool)"  # noqa: E501
    assert (classify_kernel(name).klass, classify_kernel(name).family) == ("elementwise", "softmax")
    assert classify_cpu_op("aten::_softmax").klass == "elementwise"
    assert classify_cpu_op("aten::_scaled_dot_product_attention_math").klass == "attention_fallback"


def test_eager_attention_needs_qk_softmax_pv_shapes() -> None:
    from tracediag.derive.attention import is_attention_triple

    # shapes as torch 2.13 records them inside aten::_scaled_dot_product_attention_math (math_decode_tp2)
    assert is_attention_triple(
        "[[2, 4, 1, 25], [], []]", "[[2, 4, 1, 32], [2, 4, 32, 25]]", "[[2, 4, 1, 25], [2, 4, 25, 32]]"
    )
    # a sampler's softmax over logits [2, 1] (hta_sampled_rank-0): no QK^T before it
    assert not is_attention_triple("[[2, 1], [], []]", "[[2, 64], [64, 1]]", "[[4, 8], [8, 8]]")
    assert not is_attention_triple("[[2, 4, 1, 25], [], []]", None, "[[2, 4, 1, 25], [2, 4, 25, 32]]")


REAL_ATTENTION_NAMES = [
    # ROCm vLLM custom paged attention in the SGLang MI300X decode trace
    ("void paged_attention_ll4mi_QKV_mfma16_kernel<0, __hip_bfloat16, __hip_bfloat16, (vllm::Fp8KVCacheDataType)0, 1, "
     "128, 256, false, 4, 1, ck_tile::ComposedAttention<0u, false> >(__hip_bfloat16 const*", "rocm_paged_attention"),
    ("attn_fwd", "aotriton"),
    ("fmhaSm100fKernel_QkvBfloat16OBfloat16H128PagedKvCausalP64MultiCtasKvCgaVarSeqQ8Kv128StaticSwapsAbForGen",
     "trtllm_attention"),
    ("void flash::flash_fwd_splitkv_mla_kernel<Flash_fwd_kernel_traits_mla<576, 64, 64, 8, cutlass::bfloat16_t, 512, "
     "true, 0, ...>, true, ...>(Flash_fwd_mla_params)", "flashmla"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "family"), REAL_ATTENTION_NAMES, ids=lambda v: str(v)[:30])
def test_attention_families_2025(name: str, family: str) -> None:
    got = classify_kernel(name)
    assert (got.klass, got.family) == ("attention", family)


# ------------------------------------------------------------------ failure messages (engine_failures.json)


FAILURE_DATA = json.loads((Path(failures.__file__).parent / "engine_failures.json").read_text(encoding="utf-8"))
HEALTHY_LOGS = [  # real logs of servers that did not fail: no line may match a failure pattern
    "sglang/log_excerpts/sglang-10053_healthy_low_load.log",
    "sglang/log_excerpts/sglang-36081_tp0_ep0_spec_accept_len_rate_healthy.log",
    "sglang/log_excerpts/sglang-17392_dp_tp_ep_pd_decode_uneven_running.log",
    "sglang/log_excerpts/sglang-20766_dp8_to_dp15_balanced_decode.log",
    "vllm/log_excerpts/vllm-6689_v0_healthy_idle.log",
    "vllm/log_excerpts/vllm-37307_v1_2026-03_waiting_drains_under_prefill.log",
    "vllm/log_excerpts/vllm-45288_v1_healthy_sigterm_shutdown_force_kill_parent_exited.log",
]


@pytest.mark.parametrize("entry", FAILURE_DATA["patterns"], ids=lambda e: e["id"])
def test_failure_pattern_has_its_source_and_matches_its_real_example(entry: dict) -> None:
    assert entry["kind"] in failures.KINDS
    assert entry["printed_by"].strip() and entry["source_ref"].strip()
    assert re.search(entry["regex"], entry["example"]), entry["id"]
    # the bulk readers may run the patterns in RE2: no look-around, no back-reference
    assert pc.match_substring_regex(pa.array([entry["example"]]), entry["regex"])[0].as_py() is True


def test_failure_ids_unique_and_loaded_in_file_order() -> None:
    ids = [e["id"] for e in FAILURE_DATA["patterns"]]
    assert len(ids) == len(set(ids)) == len(failures.patterns())
    assert [p.id for p in failures.patterns()] == ids


@pytest.mark.parametrize("name", HEALTHY_LOGS)
def test_no_failure_pattern_matches_a_healthy_log(name: str) -> None:
    text = (EXTERNAL / name).read_text(encoding="utf-8")
    hits = [(i, line[:80]) for i, line in enumerate(text.splitlines(), 1) for eng in ("vllm", "sglang")
            if failures.match(line, eng)]  # fmt: skip
    assert not hits


def test_a_device_error_comes_before_the_messages_that_repeat_it() -> None:
    line = "RuntimeError: Worker failed with error 'CUDA error: an illegal memory access was encountered'"
    hit = failures.match(line, "vllm")
    assert hit is not None and hit.kind == "device_error"
