"""AIPerf's profile_export_aiperf.json read as a benchmark summary (tracediag/ingest/aiperf.py), on the real export
of ai-dynamo/aiperf examples/artifacts/run1 (gpt-oss-20b, 100 requests at concurrency 100 in a burst, 10 %
cancelled by the client on purpose), vendored in tests/data/external/aiperf/."""

from __future__ import annotations

import json

import pytest
from conftest import REPO

from tracediag.analysis import analyze
from tracediag.context import Settings
from tracediag.ingest import detect_format
from tracediag.pipeline import build_store

AIPERF = REPO / "tests" / "data" / "external" / "aiperf" / "aiperf-examples-run1_profile_export_aiperf.json"
GPT_OSS_20B = REPO / "tests" / "data" / "configs" / "openai__gpt-oss-20b.config.json"


def _store(path=AIPERF, fmt=None):
    return build_store([(path, fmt)])


def test_the_export_is_detected_and_read_into_the_benchmark_tables():
    assert detect_format(AIPERF) == "aiperf"
    con = _store()
    try:
        run = dict(zip([d[0] for d in con.execute("SELECT * FROM bench_runs").description],
                       con.execute("SELECT * FROM bench_runs").fetchone()))  # fmt: skip
        lat = {(m, s): v for m, s, v in con.execute("SELECT metric, stat, value_ms FROM bench_latency").fetchall()}
    finally:
        con.close()
    assert run["source"] == "AIPerf profile export json, summary only" and run["model_id"] == "openai/gpt-oss-20b"
    assert (run["completed"], run["failed"], run["num_prompts"], run["max_concurrency"]) == (89, 0, 100, 100)
    assert run["total_input_tokens"] == 48950 and run["total_output_tokens"] == 21624
    assert round(run["duration_s"], 4) == 9.3178 and round(run["request_throughput_rps"], 3) == 9.552
    assert run["request_rate_rps"] == float("inf")  # concurrency_burst: no arrival rate
    meta = json.loads(run["meta_json"])
    assert meta["cancelled_by_client"] == 11 and meta["request_rate_mode"] == "concurrency_burst"
    # AIPerf's inter_token_latency is per request (TPOT), inter_chunk_latency every streamed gap (ITL)
    assert round(lat[("tpot", "mean")], 2) == 27.76 and round(lat[("itl", "p99")], 2) == 140.53
    assert round(lat[("ttft", "median")], 1) == 2369.3 and round(lat[("e2el", "mean")], 1) == 9059.7


def test_given_as_bench_it_is_read_as_aiperf():
    (inp,) = analyze([], extra_inputs=[(AIPERF, "vllm-bench")]).inputs
    assert inp["format"] == "aiperf" and inp["profiler"] == "AIPerf (profile export json, summary only)"


def test_the_serving_rules_read_it():
    """A closed loop at 100 (a caveat); the p99 chunk gap 141 ms is 6.2x the median: stalls (the first chunks of
    each request wait ~135 ms while other requests' prefills run); the client's cancellations are not failures."""
    report = analyze([], extra_inputs=[(AIPERF, None)])
    by = {c.rule: c for c in report.checks}
    assert by["SCH009"].severity == "info" and by["SCH009"].values["issue"] == "closed loop"
    assert by["SCH009"].values["failed"] == 0
    assert by["SCH002"].status == "finding" and round(by["SCH002"].values["p99_over_median"], 1) == 6.2
    assert report.verdict["rule"] == "SCH002"


def test_with_the_model_the_ttft_is_waiting_at_the_server():
    """Mean TTFT 2,343 ms against one step of 27.8 ms (the mean TPOT; gpt-oss-20b's compute and weight read at
    H100 peaks are ~4 ms): 84x, the burst of 100 waits at the server."""
    s = Settings(peak_tflops=989, hbm_bandwidth_gbs=3350)
    report = analyze([], model=GPT_OSS_20B, extra_inputs=[(AIPERF, None)], settings=s)
    c = next(c for c in report.checks if c.rule == "SCH012")
    assert c.status == "finding" and round(c.values["ttft_over_plausible"]) == 84
    assert c.values["mean_input_tokens"] == 550


def test_the_current_layout_is_read_too(tmp_path):
    """Since schema 1.0 AIPerf writes each metric at the top level under its long tag (time_to_first_token) beside
    schema_version and aiperf_version (src/aiperf/common/models/export_models.py JsonExportData). The real export
    rewritten in that layout: the same numbers come out."""
    d = json.loads(AIPERF.read_text())
    rename = {"ttft": "time_to_first_token", "ttst": "time_to_second_token"}
    new = {"schema_version": "1.0", "aiperf_version": "0.6.0"}
    for tag, m in d.pop("records").items():
        new[rename.get(tag, tag)] = {k: v for k, v in m.items() if k not in ("tag", "header", "count")}
    new |= d
    f = tmp_path / "profile_export_aiperf.json"
    f.write_text(json.dumps(new, indent=2))
    assert detect_format(f) == "aiperf"
    con = _store(f)
    try:
        ttft = con.execute("SELECT value_ms FROM bench_latency WHERE metric = 'ttft' AND stat = 'mean'").fetchone()
        meta = json.loads(con.execute("SELECT meta_json FROM bench_runs").fetchone()[0])
    finally:
        con.close()
    assert round(ttft[0], 1) == 2343.2 and meta["aiperf_version"] == "0.6.0"


@pytest.mark.parametrize("text", ['{"aiperf_version": "0.6.0"}', '{"aiperf_version": "1", "request_count": 3}'])
def test_an_export_without_metrics_is_an_input_error(tmp_path, text):
    from tracediag.errors import InputError

    f = tmp_path / "profile_export_aiperf.json"
    f.write_text(text)
    with pytest.raises(InputError, match="not an AIPerf export"):
        _store(f, "aiperf")
