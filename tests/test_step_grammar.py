"""The step-annotation grammar: every form the engines write, the meaning of its numbers, unknown variants
counted (tracediag/derive/step_grammar.py, step_markers.py) — the names are the real traces' own where a trace
holds the form, else the f-string of the source that writes it with numbers filled in."""

from __future__ import annotations

import pytest
from conftest import EXTERNAL

from tracediag.analysis import analyze
from tracediag.derive.step_grammar import ENGINE, EXECUTE_FRAME, PROFILER_STEP, looks_like_step, parse

FORMS = [
    # vLLM V1 Worker.annotate_profile (the sample traces write it)
    ("execute_context_2(48)_generation_0(0)", "vllm_v1", "prefill", 48, ENGINE),
    ("execute_context_0(0)_generation_2(2)", "vllm_v1", "decode", 2, ENGINE),
    ("execute_context_1(512)_generation_31(31)", "vllm_v1", "mixed", 543, ENGINE),
    # several underscore-separated numbers per parenthesis: the first is the tokens
    ("execute_context_1(512_4096)_generation_31(31_9000)", "vllm_v1", "mixed", 543, ENGINE),
    # detailed / roofline form (real: tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise)
    ("execute_8192_context_9(sq8155sk8430sqsq7475785sqsk7671310)_generation_37(sq37sk34489sqsq37sqsk34489)",
     "detailed", "mixed", 8192, ENGINE),
    ("execute_16_context_0(sq0sk0sqsq0sqsk0)_generation_16(sq16sk8193sqsq16sqsk8193)",
     "detailed", "decode", 16, ENGINE),
    ("execute_new_3_cached_5", "vllm_new_cached", "mixed", None, ENGINE),
    ("execute_new_0_cached_5", "vllm_new_cached", "decode", None, ENGINE),
    # SGLang build_step_span_name (real: step[DECODE bs=16], step[EXTEND bs=15 toks=15360])
    ("step[DECODE bs=16]", "sglang_step", "decode", 16, ENGINE),
    ("step[EXTEND bs=15 toks=15360]", "sglang_step", "prefill", 15360, ENGINE),
    ("step[DECODE bs=16 g_sqsq=16 g_sqsk=8193 g_sk=8193]", "sglang_step", "decode", 16, ENGINE),
    ("step[MIXED bs=4 c=1 g=3 c_sq=100 c_sk=100 c_sqsq=10000 c_sqsk=10000 g_sq=3 g_sk=300 g_sqsq=3 g_sqsk=300]",
     "sglang_step", "mixed", 103, ENGINE),
    # TensorRT-LLM PyExecutor._forward_step NVTX range
    ("[Executor] _forward_step 12: 2 ctx reqs, 30 gen reqs", "trtllm_forward_step", "mixed", None, ENGINE),
    ("_forward_step: 0 ctx reqs, 8 gen reqs", "trtllm_forward_step", "decode", None, ENGINE),
    ("ProfilerStep#6", "profiler_step", None, None, PROFILER_STEP),
    ("vllm/v1/worker/gpu_model_runner.py(3380): execute_model", "execute_model_frame", None, None, EXECUTE_FRAME),
]  # fmt: skip


@pytest.mark.parametrize(("name", "form", "phase", "T", "precedence"), FORMS, ids=lambda v: str(v)[:40])
def test_every_form_parses_with_its_numbers(name, form, phase, T, precedence):
    m = parse(name)
    assert m is not None and m.form == form and m.precedence == precedence
    assert m.step_phase() == phase
    assert m.step_tokens() == T
    assert looks_like_step(name) or form == "execute_model_frame"


def test_detailed_form_numbers():
    m = parse("execute_8192_context_9(sq8155sk8430sqsq7475785sqsk7671310)_generation_37(sq37sk34489sqsq37sqsk34489)")
    assert (m.ctx_reqs, m.ctx_tokens, m.ctx_kv_tokens) == (9, 8155, 8430)
    assert (m.gen_reqs, m.gen_tokens, m.gen_kv_tokens) == (37, 37, 34489)
    assert m.fields["c_sqsq"] == 7475785 and m.fields["g_sqsk"] == 34489


def test_numbers_not_interpreted_are_kept():
    assert parse("execute_context_1(512_4096)_generation_31(31_9000)").extra == "context: 4096; generation: 9000"


def test_draft_and_idle_iterations_are_not_steps():
    assert not parse("draft step[DECODE bs=16]").counts_as_step
    assert not parse("step[IDLE bs=0]").counts_as_step
    assert parse("step[TARGET_VERIFY bs=8]").step_phase() == "decode"


@pytest.mark.parametrize(
    "name", ["execute_context_2(48)", "step[DECODE batch=16]", "ProfilerStep#x", "execute_model_v2(3)"]
)
def test_unknown_variants_look_like_steps_but_do_not_parse(name):
    assert parse(name) is None and looks_like_step(name)


@pytest.mark.parametrize("name", ["nccl:all_reduce", "## forward ##", "Optimizer.step#SGD.step", "capture_32_FULL"])
def test_other_annotations_are_not_step_like(name):
    assert parse(name) is None and not looks_like_step(name)


def test_sglang_forward_span_folds_into_its_scheduler_step():
    # tracelens_b300: execute_16_...(sq16sk8193..) encloses SGLang's own step[DECODE bs=16]
    r = analyze([EXTERNAL / "kineto" / "tracelens_b300_sglang_qwen3-30b-a3b_moe_decode_cudagraph.json.gz"])
    (inp,) = r.inputs
    assert inp["counts"]["steps"] == 1 and inp["counts"]["step_annotations_not_understood"] == 0


@pytest.mark.parametrize("keep_python", [False, True])
def test_the_execute_model_frame_is_a_step_marker_with_python_kept_or_not(keep_python):
    """vLLM's `gpu_model_runner.py(N): execute_model` Python frame bounds a step. With --keep-python it was stored as
    one more Python frame among the CPU ops, and the step had no marker (issue 37)."""
    from pathlib import Path

    from tracediag.ingest import IngestOptions
    from tracediag.pipeline import build_store

    trace = Path(EXTERNAL / "kineto" / "tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz")
    con = build_store([(trace, None)], options=IngestOptions(keep_python=keep_python))
    try:
        marker = "name LIKE '%model_runner.py(%): execute_model'"
        assert con.execute(f"SELECT count(*) FROM annotations WHERE {marker}").fetchone() == (1,)
        assert con.execute(f"SELECT count(*) FROM cpu_ops WHERE {marker}").fetchone() == (0,)
    finally:
        con.close()
