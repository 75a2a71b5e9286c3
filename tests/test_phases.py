"""Engine steps and phases: per-forward-pass split, the uncovered-forward fallback, T and phase per step,
the t = a·T + b fit and the phases report section — on real profiler traces.

tests/data/phases/ holds real torch.profiler traces made by tests/data/phases/generate.py (see its
docstring); scenario.json there records what each run did (phases, T, context length per step).
"""

from __future__ import annotations

import functools
import itertools
import json

import pytest
from conftest import REPO, kineto_file

from tracediag.analyses.kernels import fit_line, phase_table, step_rows, unphased_name
from tracediag.analysis import analyze
from tracediag.pipeline import build_store, input_files
from tracediag.reports.sections import phases as phases_section
from tracediag.store import query_dicts

PHASES_DATA = REPO / "tests" / "data" / "phases"


@functools.cache
def _store(path: str):
    return build_store(input_files([path]))


def _steps(path) -> list[dict]:
    return query_dicts(_store(str(path)), "SELECT * FROM steps ORDER BY rank, step_id")


def _planned(name: str) -> list[dict]:
    return json.loads((PHASES_DATA / name / "scenario.json").read_text())["steps"]


def test_profiler_step_wrapping_generate_is_split_per_forward_pass():
    steps = _steps(PHASES_DATA / "hf_generate")
    plan = _planned("hf_generate")
    assert len(steps) == len(plan) == 6
    assert [s["phase"] for s in steps] == [p["phase"] for p in plan]
    assert [s["T"] for s in steps] == [p["T"] for p in plan]  # 1024, then 1 per decode forward
    assert all(s["marker_source"] == "ProfilerStep, split per forward pass (aten::embedding)" for s in steps)
    assert [s["name"] for s in steps][:2] == ["ProfilerStep#1 forward 1/6", "ProfilerStep#1 forward 2/6"]
    # the pieces tile the profiler step: each starts where the previous ends
    for a, b in itertools.pairwise(steps):
        assert a["ts_ns"] + a["dur_ns"] == b["ts_ns"]


def test_forward_passes_outside_every_marker_get_their_own_steps():
    steps = _steps(PHASES_DATA / "annotated_prefill")
    plan = _planned("annotated_prefill")
    assert [s["phase"] for s in steps] == [p["phase"] for p in plan]
    assert [s["T"] for s in steps] == [p["T"] for p in plan]
    assert steps[0]["marker_source"] == "vllm step annotation" and steps[0]["t_source"] == "annotation"
    assert {s["marker_source"] for s in steps[1:]} == {"forward pass outside every marker (aten::embedding)"}
    for a, b in itertools.pairwise(steps):  # no overlap
        assert a["ts_ns"] + a["dur_ns"] <= b["ts_ns"]


@pytest.mark.parametrize("name", ["hf_generate", "annotated_prefill", "long_context_decode", "memory_bound_decode"])
def test_every_phase_trace_gives_the_planned_steps(name):
    steps = _steps(PHASES_DATA / name)
    plan = _planned(name)
    assert [(s["phase"], s["T"]) for s in steps] == [(p["phase"], p["T"]) for p in plan]


def test_vllm_annotated_steps_are_not_split():
    steps = _steps(REPO / "sample_traces" / "healthy_tp2")
    assert {s["marker_source"] for s in steps} == {"vllm step annotation"}
    assert len(steps) == 14


@pytest.mark.parametrize(
    ("name", "marker", "phase", "T"),
    [
        # one ProfilerStep, one forward (16 sequences x 559 tokens: sdpa query [16, 16, 559, 64])
        ("tracelens_h100_hf_qwen1.5-0.5b.json.gz", "ProfilerStep", "prefill", 16 * 559),
        # vLLM detailed annotation execute_8192_context_9(sq8155..)_generation_37(sq37..)
        (
            "tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz",
            "vllm step annotation (detailed)",
            "mixed",
            8192,
        ),
        # execute_15360_context_15(sq15360..)_generation_0(sq0..) around SGLang's step[EXTEND bs=15 toks=15360]
        (
            "tracelens_mi300x_sglang_qwen3-8b_prefilldecode.json.gz",
            "sglang scheduler annotation (detailed)",
            "prefill",
            15360,
        ),
        # SGLang decode under one CUDA graph: execute_16_context_0(..)_generation_16(sq16sk8193..) > step[DECODE bs=16]
        (
            "tracelens_b300_sglang_qwen3-30b-a3b_moe_decode_cudagraph.json.gz",
            "sglang scheduler annotation (detailed)",
            "decode",
            16,
        ),
    ],
)
def test_real_gpu_traces_steps(name, marker, phase, T):
    (s,) = _steps(kineto_file(name))
    assert (s["marker_source"], s["phase"], s["T"]) == (marker, phase, T)


def test_sglang_trace_has_one_forward_pass():
    # 36 attention kernels = Qwen3-8B's 36 layers once: the EXTEND batch is the only forward in the file
    con = _store(str(kineto_file("tracelens_mi300x_sglang_qwen3-8b_prefilldecode.json.gz")))
    assert con.execute("SELECT count(*) FROM kernels WHERE klass = 'attention'").fetchone()[0] == 36


def test_fit_line():
    fit = fit_line([(1, 3.0), (2, 5.0), (4, 9.0)])
    assert fit["a_ns_per_token"] == pytest.approx(2.0) and fit["b_ns"] == pytest.approx(1.0)
    assert fit["r2"] == pytest.approx(1.0)
    assert fit_line([(1, 3.0), (1, 4.0), (1, 5.0)]) is None  # one distinct T
    assert fit_line([(1, 3.0), (2, 4.0)]) is None  # too few steps


def test_phase_table_shares_add_up():
    con = _store(str(PHASES_DATA / "hf_generate"))
    from tracediag.context import Context

    ctx = Context(con=con, model=None, tp=None)
    table = phase_table(step_rows(ctx), unphased_name(ctx))
    assert [t["phase"] for t in table] == ["prefill", "decode"]
    assert sum(t["time_share"] for t in table) == pytest.approx(1.0)
    assert (table[1]["T_min"], table[1]["T_max"]) == (1, 1)


def test_t_histogram_bins():
    steps = [
        {"T": t, "phase": ph} for t, ph in ((1, "decode"), (1, "decode"), (2, "decode"), (3, "decode"), (9, "prefill"))
    ]
    bins = phases_section.t_histogram(steps)
    # one bin per integer T from 1 to 9 (few distinct values), shared by both phases
    assert [(a, b) for a, b, _ in bins["decode"]] == [(t - 0.5, t + 0.5) for t in range(1, 10)]
    assert [n for *_, n in bins["decode"]][:3] == [2, 1, 1] and sum(n for *_, n in bins["prefill"]) == 1
    assert phases_section.t_histogram([]) == {}


def test_phases_section_has_histogram_and_fit_chart():
    report = analyze([PHASES_DATA / "hf_generate"], extra_sections=["tracediag.reports.sections.phases"])
    (sec,) = [s for s in report.sections if s.id == "phases"]
    assert sec.step == 6
    # the T histogram (one chart, bars per phase) when T takes several values, else T in words; then the fit
    assert len(sec.svgs) in (1, 2) and all(s.startswith("<svg") for s in sec.svgs)
    assert "Step time against T" in sec.svgs[-1]
    assert any("Fit over 6 steps" in n for n in sec.notes)
    assert [r["phase"] for r in sec.tables["phases"]] == ["prefill", "decode"]


def test_phases_section_without_model_on_a_gpu_trace():
    report = analyze(
        [kineto_file("tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz")],
        extra_sections=["tracediag.reports.sections.phases"],
    )
    (sec,) = [s for s in report.sections if s.id == "phases"]
    (row,) = sec.tables["phases"]
    assert row["phase"] == "mixed" and row["T_median"] == 8192
    assert any("No fit" in n for n in sec.notes)
