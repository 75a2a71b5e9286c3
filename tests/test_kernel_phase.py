"""A step's phase inferred from its attention kernels (tracediag/derive/kernel_phase.py) when no annotation gives
it, on vendored real traces; and what KRN006 calls steps whose phase nothing tells."""

from __future__ import annotations

import functools
import gzip
import json

import duckdb
from conftest import REPO, kineto_file

from tracediag.analysis import analyze

NSYS = REPO / "tests" / "data" / "external" / "nsys"
R1_DECODE = "tracelens_mi300x_sglang_r1distill_dense32_decode_cudagraph.json.gz"
UNANNOTATED = ("user_annotation", "gpu_user_annotation", "python_function")


def _unannotated(src, dst):
    """The trace as a capture without the engine's record_function annotations and without with_stack would
    write it: the events of the categories UNANNOTATED are left out, every other byte of each event is kept."""
    with gzip.open(src, "rt") as f:
        doc = json.load(f)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in UNANNOTATED]
    with gzip.open(dst, "wt") as f:
        json.dump(doc, f)
    return doc


@functools.cache
def _steps(path: str, db: str):
    r = analyze([path], db_path=db)
    con = duckdb.connect(db, read_only=True)
    try:
        steps = con.execute("SELECT step_id, phase, phase_source FROM steps ORDER BY step_id").fetchall()
        inferred = con.execute(
            "SELECT step_id, phase, decode_kernels, prefill_kernels, decode_names FROM step_kernel_phase"
        ).fetchall()
    finally:
        con.close()
    return r, steps, inferred


def _check(report, rule):
    (c,) = [c for c in report.checks if c.rule == rule]
    return c


def test_unannotated_decode_step_is_inferred_decode_from_its_paged_attention_kernels(tmp_path):
    """SGLang decode step on MI300X without its annotations. Before: KRN006 "idle 9.3% of unknown phase steps",
    SCH001 "missing phase", KRN001 "unknown phase". Its 64 attention kernels are ROCm paged attention (ll4mi
    QKV + reduce), decode-only kernels."""
    doc = _unannotated(kineto_file(R1_DECODE), tmp_path / "r1.json.gz")
    paged = [e["name"] for e in doc["traceEvents"] if e.get("cat") == "kernel" and "paged_attention_ll4mi" in e["name"]]
    assert len(paged) == 64
    r, steps, inferred = _steps(str(tmp_path / "r1.json.gz"), str(tmp_path / "r1.duckdb"))
    assert steps == [(0, "decode", "inferred from kernels")]
    ((_, phase, decode_kernels, prefill_kernels, names),) = inferred
    assert (phase, decode_kernels, prefill_kernels) == ("decode", 64, 0)
    assert set(names) == set(paged)
    assert "of decode steps (inferred from kernels)" in _check(r, "KRN006").title
    sch = _check(r, "SCH001")
    assert sch.status == "pass" and sch.evidence[0]["phase_from"] == "inferred from kernels"
    assert sch.evidence[0]["phase_kernels"]["decode_kernels"] == 64


def test_kernels_agree_with_the_annotation_where_both_exist(tmp_path):
    """On the annotated traces the annotation keeps its word, and the kernels call for the same phase."""
    for name in (R1_DECODE, "tracelens_b300_sglang_qwen3-30b-a3b_moe_decode_cudagraph.json.gz"):
        _, steps, inferred = _steps(str(kineto_file(name)), str(tmp_path / f"{name}.duckdb"))
        assert steps == [(0, "decode", "annotation")]
        assert [row[1] for row in inferred] == ["decode"]


def test_training_forward_is_not_prefill_and_krn006_says_training(tmp_path):
    """2×H100 training window: its forward runs FlashAttention-2's prefill kernel (flash_fwd_kernel), which does
    not make it a prefill. Before: KRN006 "unknown phase step time"."""
    r, steps, inferred = _steps(str(NSYS / "nsysai_2xh100_after.sqlite"), str(tmp_path / "h100.duckdb"))
    assert inferred == [] and all(s[1] is None for s in steps)
    assert "(training step time 597 ms with it, 587 ms without)" in _check(r, "KRN006").title
    # KRN002 names the same steps alike (before: "Attention is 41% of unknown phase step time")
    krn002 = _check(r, "KRN002")
    assert krn002.title.startswith("Attention is 41% of training step time") and "unknown" not in krn002.title
    assert list(krn002.values["f"]) == ["training"] and {e["phase"] for e in krn002.evidence} == {"training"}
    assert "other phases" not in krn002.next_check  # a training window has one kind of step


def test_trace_without_attention_is_not_called_unknown_phase():
    """pipit MPI saxpy: no attention kernel at all. Before: KRN006 "GPU idle 66% of unknown phase step time"."""
    c = _check(analyze([NSYS / "pipit_saxpy_mpi_nvtx.sqlite"]), "KRN006")
    assert "unknown phase" not in c.title
    assert c.title.startswith(
        "GPU idle 66% of step time (no attention kernel in the trace: not a prefill/decode workload)"
    )
