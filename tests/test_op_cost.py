"""The per-op cost model (tracediag/model/op_cost.py) against hand-computed cases, and the op_roofline table
(tracediag/derive/op_roofline.py) on vendored real GPU traces recorded with shapes."""

from __future__ import annotations

import functools
import gzip
import json
import math

import duckdb
import pytest
from conftest import SAMPLES, kineto_file

import tracediag
from tracediag.analysis import analyze
from tracediag.derive import op_roofline as derive_op_roofline
from tracediag.model.op_cost import ATTENTION, CAUSAL_UNKNOWN, GEMM, MEMORY, causal_flag, op_cost, op_cost_json

BF16, F32, F16 = "c10::BFloat16", "float", "c10::Half"
H100_QWEN = "tracelens_h100_hf_qwen1.5-0.5b.json.gz"
MI300X_QWEN = "tracelens_mi300x_sglang_qwen3-8b_prefilldecode.json.gz"
MI300X_GPTOSS = "tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz"  # device name empty


def _cost(name, dims, types):
    return op_cost(name, dims, types)


# --- GEMMs ------------------------------------------------------------------------------------------------------


def test_mm():
    m, k, n = 48, 256, 768
    c = _cost("aten::mm", [[m, k], [k, n]], [BF16, BF16])
    assert (c.kind, c.flops, c.bytes, c.dtype) == (GEMM, 2 * m * n * k, (m * k + k * n + m * n) * 2, "bf16")


def test_addmm_counts_the_bias():
    m, k, n = 8944, 1024, 1024
    c = _cost("aten::addmm", [[n], [m, k], [k, n], [], []], [BF16, BF16, BF16, "Scalar", "Scalar"])
    assert c.flops == 2 * m * n * k + m * n
    assert c.bytes == (m * k + k * n + n + m * n) * 2
    full = _cost("aten::addmm", [[m, n], [m, k], [k, n], [], []], [F32, F32, F32, "Scalar", "Scalar"])
    assert full.bytes == (m * k + k * n + m * n + m * n) * 4


def test_bmm_and_baddbmm():
    b, m, k, n = 16, 559, 64, 559
    c = _cost("aten::bmm", [[b, m, k], [b, k, n]], [F16, F16])
    assert (c.flops, c.bytes) == (2 * b * m * n * k, b * (m * k + k * n + m * n) * 2)
    c = _cost("aten::baddbmm", [[b, m, n], [b, m, k], [b, k, n], [], []], [F32, F32, F32, "Scalar", "Scalar"])
    assert (c.flops, c.bytes) == (2 * b * m * n * k + b * m * n, (b * m * k + b * k * n + b * m * n + b * m * n) * 4)


def test_matmul_broadcasts_and_vectors():
    # [2, 3, 5, 4] @ [4, 6]: batch 6, M 5, K 4, N 6
    c = _cost("aten::matmul", [[2, 3, 5, 4], [4, 6]], [F32, F32])
    assert c.flops == 2 * 6 * 5 * 6 * 4 and c.bytes == (2 * 3 * 5 * 4 + 4 * 6 + 6 * 5 * 6) * 4
    v = _cost("aten::matmul", [[7], [7, 3]], [F32, F32])  # 1-D A is [1, K]
    assert v.flops == 2 * 1 * 3 * 7 and v.bytes == (7 + 21 + 3) * 4
    assert _cost("aten::matmul", [[2, 5, 4], [3, 4, 6]], [F32, F32]) is None  # batch 2 vs 3 does not broadcast


def test_linear_with_and_without_bias():
    x, w = [16, 559, 1024], [2816, 1024]
    m, k, n = 16 * 559, 1024, 2816
    c = _cost("aten::linear", [x, w, [n]], [BF16, BF16, BF16])
    assert c.flops == 2 * m * n * k + m * n and c.bytes == (m * k + n * k + n + m * n) * 2
    c = _cost("aten::linear", [x, w, []], [BF16, BF16, ""])
    assert c.flops == 2 * m * n * k and c.bytes == (m * k + n * k + m * n) * 2


def test_scaled_mm_fp8():
    m, k, n = 128, 4096, 1024
    fp8 = "c10::Float8_e4m3fn"
    dims = [[m, k], [k, n], [], [], [n], [], [], []]
    c = _cost("aten::_scaled_mm", dims, [fp8, fp8, F32, F32, BF16, "", "Scalar", "Scalar"])
    assert c.flops == 2 * m * n * k + m * n + m * n  # product, per-tensor scale, bias
    assert c.bytes == m * k + k * n + 4 + 4 + n * 2 + m * n * 2 and c.dtype == "fp8_e4m3,fp32,bf16"
    rowwise = _cost("aten::_scaled_mm", [[m, k], [k, n], [m, 1], [1, n], [n]], [fp8, fp8, F32, F32, BF16])
    assert rowwise.flops == 2 * m * n * k + 2 * m * n + m * n
    nobias = _cost("aten::_scaled_mm", [[m, k], [k, n], [], [], []], [fp8, fp8, F32, F32, ""])
    assert nobias.flops == 2 * m * n * k + m * n and nobias.bytes is None and "out_dtype" in nobias.note


def test_shapes_that_do_not_fit_get_no_cost():
    assert _cost("aten::mm", [[4, 5], [6, 7]], [F32, F32]) is None  # K differs
    assert _cost("aten::mm", [[4, 5]], [F32]) is None
    assert _cost("aten::mm", [[4, -5], [-5, 7]], [F32, F32]) is None
    assert _cost("aten::mm", [[4, 2**50], [2**50, 7]], [F32, F32]) is None
    assert _cost("aten::mm", [[4, 5], [5, 7]], ["TensorList", F32]) is None
    assert _cost("aten::mm", "garbage", None) is None
    assert op_cost_json("aten::mm", "[[4, 5], [5", '["float"]') is None


def test_unknown_ops_get_no_cost():
    for name in ("aten::cat", "aten::index_select", "aten::convolution", "aiter::rmsnorm", "aten::_softmax"):
        assert _cost(name, [[4, 5], [5, 7]], [F32, F32]) is None


# --- attention --------------------------------------------------------------------------------------------------


def test_sdpa_flash_bhsd():
    b, h, s, d = 16, 16, 559, 64
    q = [b, h, s, d]
    c = _cost("aten::_scaled_dot_product_flash_attention", [q, q, q, [], [], [], []], [BF16] * 3 + ["Scalar"] * 4)
    assert c.kind == ATTENTION and c.flops == 2 * b * h * s * s * d * 2  # Q·Kᵀ and P·V
    assert c.bytes == 4 * b * h * s * d * 2 + b * h * s * 4  # q, k, v, o in bf16 + the fp32 log-sum-exp
    assert c.causal is None and c.note == CAUSAL_UNKNOWN


def test_flash_forward_bshd_gqa_and_causal():
    b, sq, sk, hq, hkv, d = 2, 128, 1024, 32, 8, 128
    dims = [[b, sq, hq, d], [b, sk, hkv, d], [b, sk, hkv, d]] + [[]] * 12
    types = [BF16] * 3 + ["", ""] + ["Scalar"] * 6 + [""] * 4
    c = _cost("aten::_flash_attention_forward", dims, types)
    assert c.flops == 2 * b * hq * sq * sk * d * 2
    assert c.bytes == (b * sq * hq * d + 2 * b * sk * hkv * d + b * hq * sq * d) * 2 + b * hq * sq * 4
    concrete = ["", "", "", "", "", str(sq), str(sk), "0.", "True", "False", "0.125", "", "", "", ""]
    assert causal_flag("aten::_flash_attention_forward", concrete) is True
    causal = op_cost("aten::_flash_attention_forward", dims, types, concrete)
    assert causal.flops == c.flops / 2 and causal.causal is True and causal.note is None
    varlen = [[b * sq, hq, d], [b * sk, hkv, d], [b * sk, hkv, d], [b + 1], [b + 1]] + [[]] * 10
    assert _cost("aten::_flash_attention_forward", varlen, [BF16] * 3 + ["int", "int"] + [""] * 10) is None


def test_efficient_attention_reads_its_mask():
    b, h, s, d = 1, 8, 64, 64
    q = [b, h, s, d]
    c = _cost("aten::_scaled_dot_product_efficient_attention", [q, q, q, [b, h, s, s]], [F16, F16, F16, F16])
    assert c.flops == 2 * b * h * s * s * d * 2 and c.bytes == (4 * b * h * s * d + b * h * s * s) * 2
    assert causal_flag("aten::_scaled_dot_product_efficient_attention", ["", "", "", "", "False", "0.", "True"])
    assert causal_flag("aten::_efficient_attention_forward", [""] * 9 + ["0"]) is False
    assert causal_flag("aten::_scaled_dot_product_flash_attention", []) is None


def test_causal_flag_as_kineto_records_it():
    """The real H100 trace's 'Concrete Inputs' of the flash SDPA ops (the store does not keep them yet)."""
    with gzip.open(kineto_file(H100_QWEN), "rt") as f:
        events = json.load(f)["traceEvents"]
    flags = {
        e["name"]: causal_flag(e["name"], e["args"].get("Concrete Inputs"))
        for e in events
        if e.get("name") in ("aten::_scaled_dot_product_flash_attention", "aten::_flash_attention_forward")
    }
    assert flags == {"aten::_scaled_dot_product_flash_attention": True, "aten::_flash_attention_forward": True}


# --- memory-bound ops -------------------------------------------------------------------------------------------


def test_elementwise_bytes():
    c = _cost("aten::add", [[16, 559, 1024], [16, 559, 1024], []], [BF16, BF16, "Scalar"])
    assert (c.kind, c.flops, c.bytes) == (MEMORY, None, 3 * 16 * 559 * 1024 * 2)
    c = _cost("aten::mul", [[16, 16, 559, 64], [1, 1, 559, 64]], [BF16, BF16])  # broadcast: the small one read once
    assert c.bytes == (16 * 16 * 559 * 64 * 2 + 559 * 64) * 2
    assert _cost("aten::mul", [[1, 559, 64], []], [F32, "double"]).bytes == 2 * 559 * 64 * 4  # 0-dim: by value
    assert _cost("aten::mul", [[8, 4], [8, 4]], [BF16, F16]).bytes == 8 * 4 * (2 + 2 + 4)  # promoted to fp32
    assert _cost("aten::eq", [[16, 559], [16, 559]], ["long int", "long int"]).bytes == 16 * 559 * (8 + 8 + 1)
    assert _cost("aten::silu", [[16, 559, 2816]], [BF16]).bytes == 2 * 16 * 559 * 2816 * 2
    assert _cost("aten::add_", [[8, 4], [4]], [F32, F32]).bytes == (32 + 4 + 32) * 4
    assert _cost("aten::add_", [[4], [8, 4]], [F32, F32]) is None  # in place cannot grow self
    assert _cost("aten::add", [[8, 3], [8, 4]], [F32, F32]) is None


def test_copies_fill_reductions_norms():
    assert _cost("aten::copy_", [[16, 559, 1024], [16, 559, 1024], []], [BF16, F32, "Scalar"]).bytes == (
        16 * 559 * 1024 * (2 + 4)
    )
    assert _cost("aten::fill_", [[1024, 1024], []], [F32, "Scalar"]).bytes == 1024 * 1024 * 4
    assert _cost("aten::clone", [[10, 10], []], [F16, ""]).bytes == 2 * 100 * 2
    mean = _cost("aten::mean", [[16, 559, 1024], [], [], []], [F32, "ScalarList", "Scalar", ""])
    assert mean.bytes == 16 * 559 * 1024 * 4 and "write not counted" in mean.note
    rows, n = 16 * 559, 1024
    ln = _cost("aten::native_layer_norm", [[16, 559, n], [], [n], [n], []], [BF16, "ScalarList", BF16, BF16, "Scalar"])
    assert ln.bytes == 2 * rows * n * 2 + 2 * n * 2 + 2 * rows * 4
    rms = _cost("aten::_fused_rms_norm", [[rows, n], [], [n], []], [BF16, "ScalarList", BF16, "Scalar"])
    assert rms.bytes == 2 * rows * n * 2 + n * 2 + rows * 4
    assert _cost("aten::native_layer_norm", [[4, 6], [], [], [], []], [F32, "ScalarList", "", "", "Scalar"]) is None


# --- the table on real traces -----------------------------------------------------------------------------------


@functools.cache
def _store(name: str, tmp: str) -> str:
    db = f"{tmp}/{name}.duckdb"
    analyze([kineto_file(name)], db_path=db)
    return db


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    tmp = str(tmp_path_factory.mktemp("op_roofline"))
    return lambda name: duckdb.connect(_store(name, tmp), read_only=True)


def _rows(con, sql, params=()):
    cur = con.execute(sql, list(params))
    cols = [d[0] for d in cur.description]
    return [dict(zip(cols, r)) for r in cur.fetchall()]


def test_h100_gemm_and_attention_rows(stores):
    con = stores(H100_QWEN)
    rows = _rows(con, "SELECT * FROM op_roofline")
    ops = {r["op"] for r in rows}
    assert {"aten::mm", "aten::addmm", "aten::_flash_attention_forward"} <= ops
    for r in rows:
        if r["op"] in ("aten::mm", "aten::addmm"):
            assert r["model"] == GEMM and math.isfinite(r["intensity"]) and r["intensity"] > 0
            assert r["gpu"] == "NVIDIA H100 SXM5 80GB" and r["bound"] in ("compute", "memory")
            assert 0 < r["pct_of_roofline"] <= 100 and r["buyable_ns"] == pytest.approx(
                r["kernel_ns"] - r["roofline_ns"]
            )
    big = next(r for r in rows if r["op"] == "aten::mm" and r["shape"] == "[[8944,1024],[1024,2816]]")
    assert big["flops"] == 2 * 8944 * 2816 * 1024 and big["bytes"] == (8944 * 1024 + 1024 * 2816 + 8944 * 2816) * 2
    assert big["bound"] == "compute" and big["phase"] == "prefill" and big["dtype"] == "bf16"
    assert big["roofline_ns"] == pytest.approx(big["calls"] * big["flops"] / (big["peak_tflops"] * 1e12) * 1e9)
    assert big["tflops_s"] == pytest.approx(big["flops"] * big["calls"] / big["kernel_ns"] / 1e3)
    fa = next(r for r in rows if r["op"] == "aten::_flash_attention_forward")
    assert fa["model"] == ATTENTION and fa["causal"] is None and fa["note"] == CAUSAL_UNKNOWN
    tiny = [r for r in rows if r["launch_bound"]]
    assert tiny and all(r["kernel_ns"] < derive_op_roofline.LAUNCH_BOUND_NS * r["calls"] for r in tiny)
    assert {r["note"] for r in rows if r["op"] == "aten::cat"} == {"no cost model for this op"}


@pytest.mark.parametrize("name", [H100_QWEN, MI300X_QWEN, MI300X_GPTOSS])
def test_kernel_time_is_the_kernels_linked_to_ops(stores, name):
    """Every kernel whose External id names a CPU op, graph replays aside, counted once: in the op's row."""
    con = stores(name)
    want = con.execute(
        "SELECT count(*), sum(k.dur_ns) FROM kernels k WHERE k.external_id IN "
        "(SELECT external_id FROM cpu_ops o WHERE o.rank = k.rank) AND NOT EXISTS (SELECT 1 FROM runtime r "
        "WHERE r.rank = k.rank AND r.correlation = k.correlation AND r.name ILIKE '%GraphLaunch%')"
    ).fetchone()
    got = con.execute("SELECT sum(kernels), sum(kernel_ns) FROM op_roofline").fetchone()
    assert got == want and want[0] > 0
    per_op = con.execute(
        "SELECT o.name, sum(k.dur_ns) FROM kernels k JOIN cpu_ops o ON o.rank = k.rank AND o.external_id = "
        "k.external_id WHERE o.name = 'aten::mm' GROUP BY 1"
    ).fetchall()
    mm = con.execute("SELECT 'aten::mm', sum(kernel_ns) FROM op_roofline WHERE op = 'aten::mm' GROUP BY 1").fetchall()
    assert mm == per_op


def test_mi300x_rows_have_the_catalogued_gpu(stores):
    rows = _rows(stores(MI300X_QWEN), "SELECT * FROM op_roofline WHERE op = 'aten::mm'")
    assert rows and all(
        r["gpu"] == "AMD Instinct MI300X" and r["bound"] and math.isfinite(r["intensity"]) for r in rows
    )
    assert all(0 < r["pct_of_roofline"] <= 100 for r in rows if not r["launch_bound"])
    phases = {r["phase"] for r in rows}
    assert phases <= {"prefill", "decode", "mixed", None} and phases - {None}


def test_empty_device_name_still_gets_its_roofs(stores):
    """The vLLM MI300X trace carries name '': the catalogue infers the GPU from vendor, CU count and memory."""
    rows = _rows(stores(MI300X_GPTOSS), "SELECT * FROM op_roofline WHERE op = 'aten::mm'")
    assert rows and rows[0]["gpu"] == "AMD Instinct MI300X" and rows[0]["bound"] is not None


def test_cpu_only_trace_has_an_empty_table(tmp_path):
    db = tmp_path / "cpu.duckdb"
    analyze([SAMPLES / "healthy_tp1"], db_path=str(db))
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM op_roofline").fetchone() == (0,)


def test_reachable_from_open_with_column_docs(tmp_path):
    from typer.testing import CliRunner

    from tracediag.cli import app

    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["analyze", str(kineto_file(H100_QWEN)), "-o", str(out), "-q", "-j", "1"])
    assert r.exit_code == 0, r.output
    with tracediag.open(out) as run:
        assert "op_roofline" in run.tables()
        df = run.op_roofline
        assert len(df) > 0 and {"op", "phase", "shape", "dtype", "pct_of_roofline", "launch_bound"} <= set(df.columns)
        assert run.columns("op_roofline")["comment"].notna().all()


def test_in_the_parquet_store(tmp_path):
    from tracediag.fleet import ingest_store
    from tracediag.store import parquet as pq

    store = tmp_path / "store"
    ingest_store([kineto_file(H100_QWEN)], store)
    assert pq.read_manifest(store).tables["op_roofline"]["rows"] > 0


# --- buyable time (tracediag/analyses/roofline.py, KRN012) and the report's roofline --------------------------


def test_buyable_time_is_the_rows_above_their_roofline(stores):
    """Σ max(0, kernel − roofline) per family and phase over the rows that have a roofline, are not launch-bound and
    lie in a step, computed here from op_roofline directly; the share is of the summed step time."""
    from tracediag.analyses.roofline import amdahl, buyable
    from tracediag.context import Context

    con = stores(MI300X_QWEN)
    b = buyable(Context(con=con, model=None, tp=None))
    want = dict(
        con.execute(
            "SELECT family || '/' || phase, sum(greatest(buyable_ns, 0)) FROM op_roofline "
            "WHERE roofline_ns IS NOT NULL AND NOT launch_bound AND phase IS NOT NULL GROUP BY 1"
        ).fetchall()
    )
    assert {f"{g.family}/{g.phase}": g.buyable_ns for g in b.groups} == pytest.approx(want)
    assert b.basis_ns == con.execute("SELECT sum(steady_span_ns) FROM gpu_timeline").fetchone()[0]  # the window
    lead = b.groups[0]
    assert (lead.family, lead.phase) == ("GEMM", "prefill") and lead.best_pct == pytest.approx(48.1, abs=0.05)
    # at the family's best % of roofline each row would take roofline / best: the lower estimate
    assert lead.demonstrated_ns == pytest.approx(
        sum(max(0, r["kernel_ns"] - r["roofline_ns"] * 100 / lead.best_pct) for r in lead.rows)
    )
    assert 0 < lead.demonstrated_ns < lead.buyable_ns
    assert amdahl(0.5) == 2.0 and amdahl(1.0) is None


def test_the_report_draws_the_roofline_and_the_buyable_table(tmp_path):
    """One mark per GEMM / attention row with a roofline in the phase; both roofs; the table per family."""
    import re

    from typer.testing import CliRunner

    from tracediag.cli import app

    out = tmp_path / "run"
    r = CliRunner().invoke(app, ["analyze", str(kineto_file(H100_QWEN)), "-o", str(out), "-q", "-j", "1"])
    assert r.exit_code == 0, r.output
    html = (out / "report.html").read_text()
    (chart,) = [s for s in re.findall(r"<svg.*?</svg>", html, re.S) if "Roofline, prefill" in s]
    con = duckdb.connect(str(out / "trace.duckdb"), read_only=True)
    marks = con.execute(
        "SELECT count(*) FROM op_roofline WHERE flops > 0 AND roofline_ns IS NOT NULL AND phase = 'prefill' "
        "AND tflops_s > 0"
    ).fetchone()[0]
    assert chart.count("<circle") == marks > 0
    assert "memory roof 3.35 TB/s" in chart and "bf16 dense 989.5 TFLOP/s" in chart
    findings = json.loads((out / "findings.json").read_text())
    table = findings["sections"]["roofline"]["tables"]["buyable time per op family and phase"]
    assert {row["family"] for row in table} >= {"GEMM", "attention", "elementwise"}
    assert all(row["buyable_ns"] >= row["buyable_at_best_ns"] >= 0 for row in table)


def test_measured_roofs_by_flag_replace_the_catalogue(tmp_path):
    """--peak-tflops (the activation dtype's GEMM and attention rows) and --hbm-bandwidth (every row) reach
    op_roofline: the roofs, the bound, the roofline time and the % follow, and peak_source says they were given."""
    from tracediag.context import Settings

    db = tmp_path / "flags.duckdb"
    analyze([kineto_file(H100_QWEN)], db_path=str(db), settings=Settings(peak_tflops=700, hbm_bandwidth_gbs=3000))
    rows = _rows(duckdb.connect(str(db), read_only=True), "SELECT * FROM op_roofline WHERE roofline_ns IS NOT NULL")
    assert rows and all(r["peak_tb_s"] == 3.0 and "--hbm-bandwidth 3000" in r["peak_source"] for r in rows)
    for r in rows:
        if r["flops"] and r["dtype"].split(",")[0] == "bf16":
            assert r["peak_tflops"] == 700 and "--peak-tflops 700" in r["peak_source"]
        peak = r["peak_tflops"] * 1e12 if r["flops"] else None
        want = r["calls"] * max(r["flops"] / peak if peak else 0, r["bytes"] / 3e12) * 1e9
        assert r["roofline_ns"] == pytest.approx(want)
        assert r["pct_of_roofline"] == pytest.approx(100 * want / r["kernel_ns"])
