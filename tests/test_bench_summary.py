"""What a benchmark summary says on its own (issue 35, item 3), on the real `vllm bench serve` and
`sglang.bench_serving` results in tests/data/external (produced against tests/engine_server.py, whose model
tests/data/configs/tracediag-test-tiny.config.json describes): a TTFT far above a plausible prefill is waiting at
the server (SCH012), a p99 gap far above the budget is stalls (SCH002, from percentiles), a stream of several tokens
per chunk makes ITL per chunk (SCH009's caveat), and each input is named as a summary or per-request detail."""

from __future__ import annotations

import json

from conftest import REPO

from tracediag.analysis import analyze
from tracediag.context import Settings

EXTERNAL = REPO / "tests" / "data" / "external"
BENCH = EXTERNAL / "vllm" / "bench"
SGLANG_BENCH = EXTERNAL / "sglang" / "bench"
TINY = REPO / "tests" / "data" / "configs" / "tracediag-test-tiny.config.json"
# the test server runs on a CPU: peaks a user would give for it (the rule needs some; a summary names no GPU)
CPU_PEAKS = Settings(peak_tflops=0.5, hbm_bandwidth_gbs=20)


def _check(rule, bench, model=None, settings=None):
    report = analyze([], model=model, extra_inputs=[(bench, None)], settings=settings)
    return next(c for c in report.checks if c.rule == rule), report


def test_ttft_of_a_burst_far_above_a_plausible_prefill_is_waiting_at_the_server():
    """40 requests at t = 0 into a server of 8 slots: mean TTFT 1,139 ms against a prefill of 64 tokens that takes
    one engine step (mean TPOT 34.0 ms) — 33.5×, at least 97 % waiting."""
    c, report = _check("SCH012", BENCH / "vllm-0.33.0_rateinf_save-result.json", TINY, CPU_PEAKS)
    assert c.status == "finding" and c.severity == "warning"
    v = c.values
    assert v["mean_input_tokens"] == 64 and round(v["mean_ttft_ms"], 1) == 1139.1
    assert v["plausible_prefill_ms"] == v["one_step_ms"]  # the tiny model's compute is µs: one step bounds it
    assert round(v["ttft_over_plausible"], 1) == 33.5 and c.impact_basis == "mean TTFT"
    assert round(c.impact, 2) == 0.97
    # the burst is a caveat beside it (SCH009 qualifies SCH012), not its cause
    sch009 = next(x for x in report.checks if x.rule == "SCH009")
    assert sch009.severity == "info" and "SCH012" in sch009.qualifies
    assert report.verdict["rule"] == "SCH012"


def test_ttft_of_an_open_loop_run_is_a_prefill_not_waiting():
    """2 req/s open loop: mean TTFT 27.9 ms, one step 22.6 ms: 1.2×; a closed loop of 4 under 8 slots: 2.2×."""
    for name, ratio in (("vllm-0.33.0_rate2_save-result.json", 1.2), ("vllm-0.33.0_cap4_save-detailed.json", 2.2)):
        c, _ = _check("SCH012", BENCH / name, TINY, CPU_PEAKS)
        assert c.status == "pass" and round(c.values["ttft_over_plausible"], 1) == ratio, name


def test_ttft_of_a_summary_without_model_or_peaks_is_not_judged():
    c, _ = _check("SCH012", BENCH / "vllm-0.33.0_rateinf_save-result.json")
    assert c.status == "not_applicable" and "--model config.json" in c.reason and "1.14e+03 ms" in c.reason
    c, _ = _check("SCH012", BENCH / "vllm-0.33.0_rateinf_save-result.json", TINY)
    assert c.status == "not_applicable" and "--peak-tflops" in c.reason


def test_p99_gap_within_the_budget_passes_from_the_summary():
    """A save-result has no per-request gaps: p99 86.6 ms against 5 × the median 20.4 ms = 102 ms."""
    c, _ = _check("SCH002", BENCH / "vllm-0.33.0_rate2_save-result.json")
    assert c.status == "pass" and c.values["source"].startswith("benchmark summary percentiles")
    assert round(c.values["p99_gap_ms"], 1) == 86.6 and round(c.values["budget_ms"]) == 102
    c, _ = _check("SCH002", SGLANG_BENCH / "sglang-0.5.23_rate2_stdout.log")
    assert c.status == "pass" and round(c.values["p99_over_median"], 1) == 3.4


def test_p99_gap_over_an_itl_slo_is_stalls_from_the_summary():
    c, _ = _check("SCH002", BENCH / "vllm-0.33.0_rate2_save-result.json", settings=Settings(slo_ms=(("itl", 50.0),)))
    assert c.status == "finding" and c.severity == "warning" and c.confidence == "low"
    assert c.values["budget_source"] == "--slo itl=50 ms" and "at least 1 % of gaps" in c.title


def _chunked_copy(tmp_path, tokens_per_chunk=4):
    """The real rate-2 result as a server that streams 4 tokens per chunk would have it: vLLM's client times chunks
    (ITL ≈ tokens per chunk × TPOT; TensorRT-LLM PR #18432 measured median ITL / TPOT = 20 × tokens per iteration at
    stream_interval 20). Only the ITL statistics change; everything else is the real file."""
    d = json.loads((BENCH / "vllm-0.33.0_rate2_save-result.json").read_text())
    for k in [k for k in d if k.endswith("_itl_ms")]:
        d[k] = d[k] * tokens_per_chunk
    out = tmp_path / "chunked_stream_save-result.json"
    out.write_text(json.dumps(d))
    return out


def test_a_stream_of_several_tokens_per_chunk_is_a_caveat_on_itl(tmp_path):
    f = _chunked_copy(tmp_path)
    c, report = _check("SCH009", f)
    assert c.status == "finding" and c.severity == "info" and c.values["issue"] == "chunked streaming"
    assert set(c.qualifies) == {"SCH002", "SCH010"} and "4.0× mean TPOT" in c.title
    sch002 = next(x for x in report.checks if x.rule == "SCH002")
    assert sch002.status == "not_applicable" and "per streamed chunk" in sch002.reason
    assert report.verdict["status"] == "no_problem" and report.verdict["headline"] == "No finding; 1 caveat."


def test_each_bench_input_is_named_a_summary_or_per_request_detail():
    kinds = {}
    for f in (BENCH / "vllm-0.33.0_rate2_save-result.json", BENCH / "vllm-0.33.0_cap4_save-detailed.json",
              BENCH / "vllm-0.33.0_rateinf_stdout.log"):  # fmt: skip
        (inp,) = analyze([], extra_inputs=[(f, None)]).inputs
        kinds[f.name] = inp["profiler"]
    assert kinds["vllm-0.33.0_rate2_save-result.json"].endswith("(result json, summary only)")
    assert kinds["vllm-0.33.0_cap4_save-detailed.json"].endswith("(result json with per-request detail)")
    assert kinds["vllm-0.33.0_rateinf_stdout.log"].endswith("(result table (stdout), summary only)")
