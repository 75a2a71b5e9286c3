"""Kernel dispatch per step and phase (tables kernel_steps / step_activity), the kernel rules' formulas
(seed examples), bandwidth sources, what the roofline rule computes from --hbm-bandwidth / --peak-tflops,
and the kernels report section — on real traces."""

from __future__ import annotations

import contextlib
import functools
import sqlite3

import pytest
from conftest import EXTERNAL, REPO, kineto_file

from tracediag.analyses.kernels import bandwidth
from tracediag.analysis import analyze
from tracediag.context import Context, Settings
from tracediag.ingest import load, parse_all
from tracediag.pipeline import build_store, input_files
from tracediag.rules import module_name
from tracediag.rules.step5_kernels.krn002_attention_share import amdahl
from tracediag.rules.step5_kernels.krn003_w4a16_dispatch import dequant_budget
from tracediag.rules.step5_kernels.krn004_w4_read_bound import s_read
from tracediag.store import open_store, query_dicts

SAMPLES = REPO / "sample_traces"
PHASES_DATA = REPO / "tests" / "data" / "phases"
VLLM = "tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz"
SGLANG = "tracelens_mi300x_sglang_qwen3-8b_prefilldecode.json.gz"
QWEN = "tracelens_h100_hf_qwen1.5-0.5b.json.gz"


@functools.cache
def _store(path: str):
    return build_store(input_files([path]))


def _rows(path, sql: str, params=None) -> list[dict]:
    return query_dicts(_store(str(path)), sql, params)


# ------------------------------------------------------------------ kernel_steps / step_activity


def test_cuda_graph_replays_count_in_the_step_that_launched_them():
    (act,) = _rows(kineto_file(VLLM), "SELECT * FROM step_activity")
    assert act["kernels"] == 413 and act["graphs_used"]
    assert act["graph_launches"] == 25 and act["graph_kernels"] == 361  # 25 hipGraphLaunch -> 361 kernels
    fams = {
        r["family"]: r["c"]
        for r in _rows(kineto_file(VLLM), "SELECT family, sum(graph_calls) AS c FROM kernel_steps GROUP BY 1")
    }
    assert fams["hipblaslt"] == 72 and fams["triton_matmul_ogs"] == 48  # GEMMs replayed inside the graphs
    assert fams["triton_attention"] == 0  # piecewise graphs: attention runs eagerly between the pieces


def test_kernels_whose_launch_is_not_in_the_trace_are_outside_every_step():
    # the H100 trace starts while the previous step's kernels still run: 436 kernels have no launch record
    rows = _rows(
        kineto_file(QWEN),
        "SELECT step_id, sum(calls) AS n FROM kernel_steps WHERE klass NOT IN ('memcpy', 'memset') GROUP BY 1",
    )
    assert {r["step_id"]: r["n"] for r in rows} == {0: 1029, None: 436}


def test_blocking_copy_in_the_sglang_step_waits_for_queued_gpu_work():
    (act,) = _rows(kineto_file(SGLANG), "SELECT * FROM step_activity")
    # hipMemcpyWithStream of a [15] tensor inside aten::copy_ blocks the host 493 ms while the GPU idles, but the GPU
    # holds resolve_future_token_ids, launched 49 µs into the gap: the copy waits for the GPU, no host stall
    assert _rows(kineto_file(SGLANG), "SELECT * FROM host_stalls") == []
    assert act["stall_ns"] == 0 and act["step_ns"] == act["step_ns_with_stalls"] == act["gpu_span_ns"]
    assert act["step_ns"] == pytest.approx(987.3e6, rel=1e-3)
    # the idle is the step's own, nearly all of it with work already launched, and the longest gap is that wait
    assert act["queued_idle_ns"] == pytest.approx(493.19e6, rel=1e-3) and act["queued_idle_ns"] <= act["gpu_idle_ns"]
    assert act["max_gap_ns"] == pytest.approx(493.28e6, rel=1e-3)
    assert act["sync_calls"] >= 1 and act["sync_ns"] > 490e6


def test_cpu_only_trace_counts_outermost_ops():
    rows = _rows(
        SAMPLES / "math_decode_tp2",
        "SELECT phase, name, sum(calls) AS calls FROM kernel_steps WHERE rank = 0 GROUP BY ALL",
    )
    got = {(r["phase"], r["name"]): r["calls"] for r in rows}
    L, decode_steps = 4, 6
    assert got[("decode", "aten::_scaled_dot_product_attention_math")] == L * decode_steps
    assert got[("prefill", "aten::_scaled_dot_product_flash_attention_for_cpu")] == L
    # bmm/softmax inside the math op, mm inside linear, and the SDPA dispatcher are not counted again
    names = {n for _, n in got}
    assert not names & {"aten::bmm", "aten::_safe_softmax", "aten::mm", "aten::scaled_dot_product_attention"}
    (src,) = _rows(SAMPLES / "math_decode_tp2", "SELECT DISTINCT source FROM kernel_steps")
    assert src["source"] == "cpu_op"


# ------------------------------------------------------------------ formulas (worked examples)


def test_amdahl_example():
    assert amdahl(0.3, 2) == pytest.approx(1.1765, abs=1e-4)  # docs/method.md: f = 0.3, s = 2 -> 1.18


def test_s_read_table():
    gib = 2**30
    # W16 = 14 GiB, W4 = 4 GiB, K = 1 GiB per sequence; B = 1, 8, 32 sequences
    assert [round(s_read(14 * gib, 4 * gib, b * gib), 2) for b in (1, 8, 32)] == [3.0, 1.83, 1.28]


def test_dequant_budget_example():
    gib, tib = 2**30, 2**40
    # (14 − 4) GiB / 1 TiB/s ≈ 9.77 ms
    assert dequant_budget(14 * gib, 4 * gib, tib) * 1e3 == pytest.approx(9.77, abs=0.01)


# ------------------------------------------------------------------ bandwidth


def test_bandwidth_from_settings_and_missing():
    con = _store(str(SAMPLES / "healthy_tp2"))
    bw, src = bandwidth(Context(con=con, model=None, tp=None, settings=Settings(hbm_bandwidth_gbs=3350)))
    assert bw == 3350e9 and "--hbm-bandwidth" in src
    bw, why = bandwidth(Context(con=con, model=None, tp=None))
    assert bw is None and "--hbm-bandwidth" in why


def test_bandwidth_from_nsight_device_properties():
    path = EXTERNAL / "nsys" / "nsysai_rtx3080_minimal.sqlite"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as src_db:
        ((name, in_file),) = src_db.execute("SELECT name, memoryBandwidth FROM TARGET_INFO_GPU").fetchall()
    con = open_store()
    load(con, parse_all([(path, None)]))
    bw, src = bandwidth(Context(con=con, model=None, tp=None))
    assert in_file == 760_080_000_000 and name == "NVIDIA GeForce RTX 3080"  # B/s, as the export holds it
    assert bw == in_file and "device properties" in src


# ------------------------------------------------------------------ rule values with settings


def _check(path, rule: str, model=None, **settings):
    report = analyze([path], model=model, settings=Settings(**settings), extra_rules=[module_name(rule.split("_")[0])])
    (c,) = [c for c in report.checks if c.rule == rule.split("_")[0].upper()]
    return c


def test_krn005_decode_far_above_its_floor_with_a_given_bandwidth():
    d = SAMPLES / "healthy_tp2"
    c = _check(d, "krn005_decode_roofline", model=d / "config.json", hbm_bandwidth_gbs=20.0)
    assert c.status == "finding" and c.severity == "warning"
    v = c.values
    assert v["weights_bytes"] == 3_473_408 and v["c_bytes_per_token"] == 1024 and v["kv_counted"]
    # recompute one step's floor from the table: (W + B·S·c) / BW
    row = c.table[0]
    assert row["floor_ns"] == pytest.approx((3_473_408 + row["B"] * row["S"] * 1024) / 20e9 * 1e9)
    assert v["efficiency_median"] < 0.05
    assert all({"rank", "ts_ns", "name"} <= set(e) for e in c.evidence)


def test_krn005_uses_w4_bytes_when_w4a16_kernels_ran_and_the_flop_term_with_peak():
    d = SAMPLES / "w4_int4mm_tp2"
    c = _check(d, "krn005_decode_roofline", model=d / "config.json", hbm_bandwidth_gbs=20.0, peak_tflops=1.0)
    assert c.values["weights_counted_as"].startswith("W4")
    assert c.values["peak_flops_per_s"] == 1e12
    row = c.table[0]
    assert row["t_flops_ns"] == pytest.approx(row["flops"] / 1e12 * 1e9)
    assert row["floor_ns"] == pytest.approx(max(row["t_bytes_ns"], row["t_flops_ns"]))


def test_krn003_w4_trace_without_bandwidth_still_passes():
    d = SAMPLES / "w4_int4mm_tp2"
    assert _check(d, "krn003_w4a16_dispatch", model=d / "config.json").status == "pass"


def test_rules_without_model_config_say_why():
    for rule in (
        "krn003_w4a16_dispatch",
        "krn004_w4_read_bound",
        "krn005_decode_roofline",
        "shp003_quantization_applied",
    ):
        c = _check(kineto_file(SGLANG), rule)
        assert c.status == "not_applicable" and "missing model config" in c.reason, rule


# ------------------------------------------------------------------ kernels section


def test_kernels_section_on_a_gpu_trace_without_model():
    report = analyze([kineto_file(QWEN)], extra_sections=["tracediag.reports.sections.kernels"])
    (sec,) = [s for s in report.sections if s.id == "kernels"]
    fams = sec.tables["families per phase"]
    attn = [r for r in fams if r["class"] == "attention"]
    assert [(r["phase"], r["family"], r["calls"]) for r in attn] == [
        ("prefill", "FlashAttention-2 (PyTorch SDPA's bundled copy)", 24)
    ]
    kernels = sec.tables["kernels per phase"]
    assert any(r["kernel"].startswith("void pytorch_flash::flash_fwd_kernel") for r in kernels)
    assert any("436 kernels and 73 copies/memsets" in n for n in sec.notes)  # launched before the profiled step


def test_kernels_section_on_a_cpu_trace_labels_op_time():
    report = analyze([SAMPLES / "math_decode_tp2"], extra_sections=["tracediag.reports.sections.kernels"])
    (sec,) = [s for s in report.sections if s.id == "kernels"]
    assert "CPU op time" in sec.notes[0]
    decode = [r for r in sec.tables["families per phase"] if r["phase"] == "decode"]
    assert "math fallback (bmm + softmax, SDPA MATH backend)" in {r["family"] for r in decode}


def test_krn009_without_the_gpu_model_is_not_applicable(tmp_path):
    """HTA's GP100 trace (compute capability 6.0: no tensor cores) with its deviceProperties removed: its fp32 SIMT
    GEMMs (maxwell/pascal sgemm names, no tensor-core name) are 71 % of GEMM time, and nothing says whether the GPU
    has tensor cores. KRN009 says so as not applicable (it passed with low confidence: a guess); with the
    properties it passes, on a GPU without tensor cores."""
    import gzip
    import json

    src = kineto_file("hta_gp100_gpu_user_annotation.json.gz")
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    assert doc.pop("deviceProperties")[0]["computeMajor"] == 6
    stripped = tmp_path / "gp100_no_device_properties.json"
    stripped.write_text(json.dumps(doc))
    c = {c.rule: c for c in analyze([stripped]).checks}["KRN009"]
    assert c.status == "not_applicable"
    assert c.reason.startswith("missing the GPU model: whether it has tensor cores is not in the trace")
    assert "fp32 SIMT GEMMs are 71.4% of GEMM time" in c.reason
    c = {c.rule: c for c in analyze([src]).checks}["KRN009"]
    assert c.status == "pass" and "on a GPU without tensor cores (Quadro GP100, compute capability 6.0" in c.title


def test_awq_dequantize_path_is_applied_quantization_and_its_prefill_cost_is_measured():
    """w4_awq_tp2 runs vLLM's AWQ linear method: 256-token prefill steps dequantize each projection weight
    (`_C::awq_dequantize`) and multiply it dense (`aten::matmul` on the full-size [K, N] weight), 2-token decode
    steps run the fused `_C::awq_gemm`. The dense matmuls are the dequantize path, not quantization left unapplied
    (SHP003 said "not applied", error, before); KRN003 measures Δ in the prefill steps and does not judge it
    against the bandwidth budget of decode."""
    import gzip
    import json

    d = SAMPLES / "w4_awq_tp2"
    r = analyze([d], model=d / "config.json")
    checks = {c.rule: c for c in r.checks}
    shp = checks["SHP003"]
    assert shp.status == "pass"
    groups = {g["group"]: g for g in shp.values["groups"]}
    # per group: 2 ranks x 4 layers x 2 projections (qkv, o / gate_up, down) in the one prefill step
    assert {g: (v["verdict"], v["dense_projection_calls"], v["dequantized_projection_calls"]) for g, v in
            groups.items()} == {"attention": ("applied", 0, 16), "dense_mlp": ("applied", 0, 16)}  # fmt: skip
    krn = checks["KRN003"]
    assert krn.status == "finding" and krn.severity == "info"
    assert list(krn.values["delta_ns_per_step"]) == ["prefill"] and krn.values["budget"].startswith("not applied")
    assert krn.title.endswith("; decode steps run the fused low-bit kernel")
    # Δ from the files: the dequantize ops' time inside the prefill annotations, per (rank, prefill step)
    total, steps = 0.0, 0
    for path in sorted(d.glob("rank*.pt.trace.json.gz")):
        with gzip.open(path, "rt") as f:
            xs = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
        for st in (e for e in xs if e["name"].startswith("execute_context_") and "_generation_0(" in e["name"]):
            inside = [
                e for e in xs if e["name"] == "_C::awq_dequantize" and st["ts"] <= e["ts"] <= st["ts"] + st["dur"]
            ]
            assert len(inside) == 16  # 4 projections x 4 layers
            total, steps = total + sum(e["dur"] for e in inside) * 1000, steps + 1
    assert steps == 2 and krn.values["delta_ns_per_step"]["prefill"] == pytest.approx(total / steps, abs=2000)
