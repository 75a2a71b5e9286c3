"""vLLM serving telemetry: every real file in tests/data/external/vllm/ ingests; logs, /metrics and benchmark results
land in the store as vLLM wrote them; telemetry-only analyses run the serving rules and the serving section.

Inputs no real file provides (a --save-detailed result, a log whose queue grows) are made by documented
builders below that use vLLM's own formats (cited), never by editing the real files in place.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from conftest import EXTERNAL

from tracediag.analysis import analyze
from tracediag.context import Settings
from tracediag.errors import InputError
from tracediag.ingest import detect_format
from tracediag.ingest.aiperf import parse_aiperf
from tracediag.ingest.base import IngestOptions
from tracediag.ingest.prometheus import parse_prometheus
from tracediag.ingest.sglang_bench import parse_sglang_bench
from tracediag.ingest.sglang_log import parse_sglang_log
from tracediag.ingest.vllm_bench import parse_vllm_bench
from tracediag.ingest.vllm_log import parse_vllm_log
from tracediag.rules import RULE_MODULES

VLLM = EXTERNAL / "vllm"
SGLANG = EXTERNAL / "sglang"
FORMAT_OF = {
    ("vllm", "log_excerpts"): "vllm-log",
    ("vllm", "metrics"): "prometheus",
    ("vllm", "bench"): "vllm-bench",
    ("sglang", "log_excerpts"): "sglang-log",
    ("sglang", "metrics"): "prometheus",
    ("sglang", "bench"): "sglang-bench",
    ("external", "aiperf"): "aiperf",
}
PARSER = {
    "vllm-log": parse_vllm_log,
    "prometheus": parse_prometheus,
    "vllm-bench": parse_vllm_bench,
    "sglang-log": parse_sglang_log,
    "sglang-bench": parse_sglang_bench,
    "aiperf": parse_aiperf,
}
# every real file (the PR description with two message bodies, vllm-15902_*.txt, is read message by message)
ALL_FILES = sorted(
    (p, FORMAT_OF[(p.parent.parent.name, p.parent.name)])
    for p in [*VLLM.glob("*/*"), *SGLANG.glob("*/*"), *(EXTERNAL / "aiperf").glob("*")]
    if p.is_file() and p.suffix != ".txt"
)
SERVING_RULES = [  # SCH002-SCH013 (SCH001 is another module's)
    m for m in RULE_MODULES if m.rpartition(".")[2].startswith("sch") and not m.rpartition(".")[2].startswith("sch001")
]
LOG_V1 = VLLM / "log_excerpts" / "vllm-37307_v1_2026-03_waiting_drains_under_prefill.log"
LOG_TP2 = VLLM / "log_excerpts" / "vllm-27313_v1_tp2_startup_worker_tp_prefixes.log"
BENCH = VLLM / "bench"
OPTS = IngestOptions()


def _table(parsed, name):
    return parsed.tables[name].to_pylist()


def _check(report, rule):
    (c,) = [c for c in report.checks if c.rule == rule]
    return c


# ------------------------------------------------------------------------------------------ every real file


def test_the_data_folder_has_the_files_this_suite_expects():
    kinds = {}
    for _, fmt in ALL_FILES:
        kinds[fmt] = kinds.get(fmt, 0) + 1
    assert kinds == {
        "vllm-log": 45,
        "prometheus": 5,
        "vllm-bench": 5,
        "sglang-log": 32,
        "sglang-bench": 3,
        "aiperf": 1,
    }, kinds


# Stats records the file itself truncates (the record is cut in the source text, not by the parser).
TRUNCATED_IN_SOURCE = {"tt-inference-server-0246_terminal_hardwrap_and_glued_record.log": 1}
STATS_START = re.compile(r"Avg prompt throughput:|\] Throughput: |(?:Prefill|Decode) batch[.,] #")
# A sample line of the Prometheus text exposition format: name, optional {labels}, value, optional timestamp.
PROM_SAMPLE = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?[ \t]+\S+(?:[ \t]+-?\d+)?[ \t]*$", re.M)
BENCH_RESULT_TABLE = re.compile(r"=+ Serving Benchmark Result =+")


def _events_in_text(path: Path, fmt: str) -> int:
    """What events_total counts, read from the file without the parser: a scrape's sample lines; a benchmark's
    requests when it saved them per request (`ttfts`), else its runs (JSON objects, JSONL lines, result tables)."""
    text = path.read_text(encoding="utf-8", errors="replace")
    if fmt == "prometheus":
        return len(PROM_SAMPLE.findall(text))
    if path.suffix == ".log":
        return len(BENCH_RESULT_TABLE.findall(text))
    docs = (
        [json.loads(line) for line in text.splitlines() if line.strip()]
        if path.suffix == ".jsonl"
        else [json.loads(text)]
    )
    return sum(len(d.get("ttfts") or []) for d in docs) or len(docs)  # an AIPerf summary: one run


@pytest.mark.parametrize(("path", "fmt"), ALL_FILES, ids=[p.name for p, _ in ALL_FILES])
def test_every_real_file_ingests(path, fmt):
    parsed = PARSER[fmt](path, 0, OPTS)
    row = parsed.inputs_rows[0]
    assert row["rank"] is None
    meta = json.loads(row["meta_json"])
    assert meta.get("malformed_lines", 0) == TRUNCATED_IN_SOURCE.get(path.name, 0), meta
    assert sum(t.num_rows for t in parsed.tables.values()) > 0
    if fmt.endswith("-log"):  # 0 dropped stats lines, counted independently of the parser
        in_text = len(STATS_START.findall(path.read_text(encoding="utf-8", errors="replace")))
        assert (
            parsed.tables["serving_stats"].num_rows + meta["malformed_lines"]
            == in_text
            == meta["stats_lines"] + (meta["malformed_lines"])
        )
        assert row["events_total"] >= in_text  # every stats line is a record
    else:
        assert row["events_total"] == _events_in_text(path, fmt) > 0


def test_all_real_files_together_telemetry_only_analysis():
    """No trace at all: the core derivations are empty, every serving rule and the section still run."""
    report = analyze(
        [], extra_inputs=ALL_FILES, extra_rules=SERVING_RULES, extra_sections=["tracediag.reports.sections.serving"]
    )
    assert {i["format"] for i in report.inputs} == {
        "vllm-log",
        "prometheus",
        "vllm-bench",
        "sglang-log",
        "sglang-bench",
        "aiperf",
    }
    ids = {c.rule for c in report.checks}
    assert {f"SCH{n:03d}" for n in range(2, 12)} <= ids
    (section,) = [s for s in report.sections if s.id == "serving"]
    assert len(section.svgs) == 5 and all("<polyline" in s for s in section.svgs)
    assert json.dumps(report.to_dict(), allow_nan=False, default=str)  # findings.json stays strict JSON


DETECTED = {p.name: fmt for p, fmt in ALL_FILES}


# A log of uvicorn lines and a traceback only (#5060) is read when passed with --log, but nothing in it says vLLM.
NOT_DETECTED = {"vllm-5060_health_500_engine_dead_aggregator_prefix.log"}


@pytest.mark.parametrize(("path", "fmt"), ALL_FILES, ids=[p.name for p, _ in ALL_FILES])
def test_format_detection_of_real_files(path, fmt):
    assert detect_format(path) == (None if path.name in NOT_DETECTED else fmt)


# ------------------------------------------------------------------------------------------ logs


def test_v1_log_one_stats_row_per_stats_line():
    text = LOG_V1.read_text(encoding="utf-8")
    lines = re.findall(r"Engine 000: Avg prompt throughput.*", text)
    parsed = parse_vllm_log(LOG_V1, 3, OPTS)
    rows = _table(parsed, "serving_stats")
    assert len(rows) == len(lines) == 5
    assert [r["running"] for r in rows] == [10, 16, 22, 28, 34]
    assert [r["waiting"] for r in rows] == [90, 84, 78, 72, 66]
    assert [r["kv_usage_pct"] for r in rows] == [19.3, 30.9, 42.5, 54.2, 65.4]
    assert [r["t_s"] for r in rows] == [0.0, 10.0, 20.0, 30.0, 40.0]
    assert rows[0]["ts_text"] == "03-17 15:38:10" and rows[0]["process"] == "APIServer" and rows[0]["pid"] == 11574
    assert {r["engine"] for r in rows} == {0} and {r["log_format"] for r in rows} == {"v1"}
    assert all(r["input_id"] == 3 and r["run"] == 0 for r in rows)


def test_every_stats_dialect_since_2023():
    """scheduler.py `Throughput:` (PR #90), llm_engine.py without `INFO ` (#1734), the application's own logging
    layout (#11517), a hard wrap mid-word (#1492) and at 130 columns with a glued record (tt-inference-server #246)."""
    old = _table(
        parse_vllm_log(VLLM / "log_excerpts/vllm-0090_oldest_scheduler_throughput_format.log", 0, OPTS), "serving_stats"
    )
    assert [(r["tput_tok_s"], r["running"], r["waiting"], r["kv_usage_pct"]) for r in old] == [
        (765.8, 22, 0, 33.3),
        (1327.3, 40, 0, 86.5),
        (1373.8, 35, 8, 99.2),
        (1450.2, 31, 10, 99.9),
    ]
    assert {r["log_format"] for r in old} == {"v0-2023"}
    no_level = _table(
        parse_vllm_log(VLLM / "log_excerpts/vllm-1734_2023_llm_engine_no_period_pending.log", 0, OPTS), "serving_stats"
    )
    assert len(no_level) == 3 and no_level[0]["gen_tput_tok_s"] == 122.2
    app = parse_vllm_log(VLLM / "log_excerpts/vllm-11517_app_python_logging_layout.log", 0, OPTS)
    (row,) = _table(app, "serving_stats")
    assert (row["running"], row["waiting"], row["kv_usage_pct"], row["ts_text"]) == (1, 3, 3.1, "2024-12-23 18:28:10")
    facts = {f["key"]: f["value"] for f in _table(app, "serving_startup")}
    assert facts["num_gpu_blocks"] == "50231" and facts["max_concurrency_x"] == "24.53"
    (wrapped,) = _table(
        parse_vllm_log(VLLM / "log_excerpts/vllm-1492_2023_llm_engine_hang_last_stats_hardwrapped.log", 0, OPTS),
        "serving_stats",
    )
    assert (wrapped["waiting"], wrapped["kv_usage_pct"], wrapped["cpu_kv_usage_pct"]) == (20, 98.7, 0.0)
    tt = parse_vllm_log(VLLM / "log_excerpts/tt-inference-server-0246_terminal_hardwrap_and_glued_record.log", 0, OPTS)
    assert [r["kv_usage_pct"] for r in _table(tt, "serving_stats")] == [17.6, 20.2, 24.8, 27.3, 29.6]
    meta = json.loads(tt.inputs_rows[0]["meta_json"])
    assert meta["malformed_lines"] == 1 and "truncated" in meta["malformed_examples"][0]["text"]  # cut in the source


def test_tp2_startup_facts_and_worker_prefixes():
    facts = {}
    for f in _table(parse_vllm_log(LOG_TP2, 0, OPTS), "serving_startup"):
        facts.setdefault(f["key"], f)
    assert {k: facts[k]["value"] for k in ("kv_cache_memory_gib", "kv_cache_tokens", "max_concurrency_x")} == {
        "kv_cache_memory_gib": "11.17",
        "kv_cache_tokens": "162,704",
        "max_concurrency_x": "10.17",
    }
    assert facts["kv_cache_tokens"]["value_num"] == 162_704 and facts["kv_cache_tokens"]["unit"] == "tokens"
    assert (
        facts["kv_cache_memory_gib"]["process"] == "Worker_TP0"
        and facts["kv_cache_tokens"]["process"] == "EngineCore_DP0"
    )


def test_runs_events_and_hang_messages():
    restart = parse_vllm_log(VLLM / "log_excerpts/vllm-11834_shutdown_then_restart_banner_k8s_prefix.log", 0, OPTS)
    meta = json.loads(restart.inputs_rows[0]["meta_json"])
    assert meta["runs"] == 2 and meta["run_starts"][1]["why"] == "startup banner"
    facts = [(f["run"], f["key"], f["value"]) for f in _table(restart, "serving_startup")]
    assert (1, "vllm_version", "0.6.4.post1") in facts
    kinds = {
        name: sorted(
            {e["kind"] for e in _table(parse_vllm_log(VLLM / "log_excerpts" / name, 0, OPTS), "serving_events")}
        )
        for name in (
            "vllm-10024_engine_loop_died_then_mqllmengine_dead.log",
            "vllm-2734_stats_running1_zero_then_nccl_watchdog_ray.log",
            "vllm-6042_worker_died_nccl_watchdog.log",
            "vllm-51986_shm_broadcast_line802_new_suffix.log",
            "vllm-ascend-7384_v1_enginedeaderror.log",
            "vllm-17972_v1_debug_stats_running1_zero_tput_health.log",
        )
    }
    assert "engine_dead" in kinds["vllm-10024_engine_loop_died_then_mqllmengine_dead.log"]
    assert kinds["vllm-2734_stats_running1_zero_then_nccl_watchdog_ray.log"] == ["collective_timeout"]
    assert kinds["vllm-6042_worker_died_nccl_watchdog.log"] == ["collective_timeout", "worker_died"]
    assert kinds["vllm-51986_shm_broadcast_line802_new_suffix.log"] == ["shm_broadcast_wait"]
    assert "engine_dead" in kinds["vllm-ascend-7384_v1_enginedeaderror.log"]
    assert kinds["vllm-17972_v1_debug_stats_running1_zero_tput_health.log"] == ["access", "health_check"]
    dp = parse_vllm_log(VLLM / "log_excerpts/vllm-ascend-12521_dp_engines_external_prefix_specdecode.log", 0, OPTS)
    assert json.loads(dp.inputs_rows[0]["meta_json"])["runs"] == 1  # two API servers interleaving are one run


def test_glued_records_and_v0_formats():
    glued = _table(
        parse_vllm_log(VLLM / "log_excerpts/vllm-18115_v1_2025-07_lines_glued_no_newline.log", 0, OPTS), "serving_stats"
    )
    assert [r["kv_usage_pct"] for r in glued] == [91.2, 91.6, 91.9] and [r["line"] for r in glued] == [1, 2, 2]
    v0 = _table(
        parse_vllm_log(VLLM / "log_excerpts/vllm-1935_v0_2023_llm_engine_format_pending.log", 0, OPTS), "serving_stats"
    )
    assert [r["waiting"] for r in v0] == [507, 503, 501, 499, 489]  # V0 "Pending" is the waiting queue
    assert {r["log_format"] for r in v0} == {"v0"} and {r["swapped"] for r in v0} == {0}
    p = parse_vllm_log(VLLM / "log_excerpts/vllm-5578_v0_preemption_warning_swapped_pending.log", 0, OPTS)
    stats, events = _table(p, "serving_stats"), _table(p, "serving_events")
    assert [(r["running"], r["swapped"], r["waiting"]) for r in stats] == [(34, 100, 9832), (37, 137, 9779)]
    assert [(e["seq_group"], e["mode"], e["cumulative"]) for e in events] == [("165", "SWAP", 151)]


def test_three_speculative_decoding_formats():
    v0 = _table(
        parse_vllm_log(VLLM / "log_excerpts/vllm-7540_v0_spec_decode_speculative_metrics.log", 0, OPTS), "spec_decode"
    )
    assert [(r["num_spec_tokens"], r["accepted_tokens"], r["draft_tokens"], r["emitted_tokens"]) for r in v0] == [
        (4, 1735, 2648, 2149),
        (4, 3268, 4980, 4074),
    ]
    assert all(r["cumulative"] and r["log_format"] == "v0" for r in v0)
    assert v0[0]["system_efficiency"] == pytest.approx(2149 / (662 * 5), abs=1e-3)  # emitted / (rounds·(k+1))
    for name in (
        "vllm-19254_v0.9.0.1_ngram_specdecode_waiting633.log",
        "vllm-42363_v0.20.2_mm_cache_specdecode.log",
        "vllm-ascend-12521_dp_engines_external_prefix_specdecode.log",
    ):
        rows = _table(parse_vllm_log(VLLM / "log_excerpts" / name, 0, OPTS), "spec_decode")
        assert rows and all(r["log_format"] == "v1" and not r["cumulative"] for r in rows)
        for r in rows:  # vLLM: mean acceptance length = 1 + Σ per-position rates (both rounded in the log)
            assert 1 + sum(r["per_position"]) == pytest.approx(r["mean_acceptance_length"], abs=0.011)
    dp = parse_vllm_log(VLLM / "log_excerpts/vllm-ascend-12521_dp_engines_external_prefix_specdecode.log", 0, OPTS)
    assert [(r["engine"], r["pid"], r["external_prefix_hit_pct"]) for r in _table(dp, "serving_stats")] == [
        (2, 95669, 100.0),
        (4, 95673, 100.0),
    ]
    assert [(r["engine"], r["accepted_tokens"]) for r in _table(dp, "spec_decode")] == [(2, 282), (4, 299)]


def _vllm_colour(line: str) -> str:
    """vLLM's ColoredFormatter (vllm/logging_utils/formatter.py): level in its colour, time and [file:line] grey."""
    colours = {"INFO": "\033[32m", "WARNING": "\033[33m", "DEBUG": "\033[37m", "ERROR": "\033[31m"}
    grey, reset = "\033[90m", "\033[0m"
    return re.sub(
        r"(INFO|WARNING|DEBUG|ERROR) (\d\d-\d\d \d\d:\d\d:\d\d) (\[[^\]]+\])",
        lambda m: f"{colours[m[1]]}{m[1]}{reset} {grey}{m[2]}{reset} {grey}{m[3]}{reset}",
        line,
    )


def test_ansi_coloured_log_parses_like_the_plain_one(tmp_path):
    """A real V1 log re-rendered with vLLM's colour codes (a transformation of real lines, not new data)."""
    coloured = tmp_path / "coloured.log"
    raw = LOG_V1.read_bytes().decode("utf-8")
    coloured.write_bytes("\n".join(_vllm_colour(x) for x in raw.split("\n")).encode("utf-8"))
    assert "\033[32mINFO\033[0m" in coloured.read_text()
    plain = _table(parse_vllm_log(LOG_V1, 0, OPTS), "serving_stats")
    assert _table(parse_vllm_log(coloured, 0, OPTS), "serving_stats") == plain


@pytest.mark.parametrize(
    ("old", "new", "why"),
    [
        ("Running: 22 reqs, Waiting: 78 reqs", "Running: ?? reqs", "truncated"),  # a cut record
        ("Running: 22 reqs", "Running: " + "9" * 401 + " reqs", "out of range"),  # a 401-digit number
        ("Running: 22 reqs", "Running: 99999999999999999999 reqs", "out of range"),  # beyond 64 bits
        ("Avg prompt throughput: 23999.8", "Avg prompt throughput: 1e999", "not a finite number"),
    ],
)
def test_one_bad_number_costs_one_line_not_the_log(tmp_path, old, new, why):
    lines = LOG_V1.read_bytes().decode("utf-8").split("\n")
    i = 2
    assert old in lines[i]
    f = tmp_path / "broken.log"
    f.write_bytes("\n".join([*lines[:i], lines[i].replace(old, new), *lines[i + 1 :]]).encode("utf-8"))
    p = parse_vllm_log(f, 0, OPTS)
    meta = json.loads(p.inputs_rows[0]["meta_json"])
    assert meta["malformed_lines"] == 1 and meta["malformed_examples"][0]["line"] == i + 1
    assert why in meta["malformed_examples"][0]["text"]
    assert len(_table(p, "serving_stats")) == 4


def test_spec_line_with_drafted_but_no_accepted_is_kept_or_counted():
    from tracediag.ingest.vllm_log import parse_spec

    row = parse_spec("SpecDecoding metrics: Draft acceptance rate: nan%, Drafted: 12 tokens")
    assert row["draft_tokens"] == 12 and row["accepted_tokens"] is None and row["acceptance_rate"] is None
    pr = (VLLM / "log_excerpts/vllm-15902_v1_spec_line_before_after_pr.txt").read_text().splitlines()
    before, after = parse_spec(pr[1].strip()), parse_spec(pr[4].strip())  # the maintainer's examples, verbatim
    assert (before["accepted_tokens"], before["draft_tokens"], before["acceptance_rate"]) == (66, 66, 1.0)
    assert (after["accepted_tokens"], after["draft_tokens"], after["acceptance_rate"]) == (66, 66, 1.0)


# ------------------------------------------------------------------------------------------ /metrics


def test_metrics_canonical_names_labels_and_histograms():
    p618 = parse_prometheus(VLLM / "metrics/production-stack-617_vllm0.10.0_v1_engine_label_excerpt.prom", 0, OPTS)
    rows = _table(p618, "metric_samples")
    kv = [r for r in rows if r["canonical"] == "kv_usage"]
    assert [(r["name"], r["engine"], r["model_name"], r["value"]) for r in kv] == [
        ("vllm:kv_cache_usage_perc", "0", "zai-org/GLM-4.5", 9.75010481363281e-06)
    ]
    created = [r for r in rows if r["part"] == "created"]
    assert {r["canonical"] for r in created} == {"prefix_cache_queries", "prefix_cache_hits"}
    buckets = [r for r in rows if r["canonical"] == "queue_time_seconds"]
    assert len(buckets) == 14 and {r["part"] for r in buckets} == {"bucket"} and buckets[0]["le"] == 1.0
    early = _table(
        parse_prometheus(VLLM / "metrics/production-stack-318_v1_early2025_no_engine_label_excerpt.prom", 0, OPTS),
        "metric_samples",
    )
    (old_kv,) = [r for r in early if r["canonical"] == "kv_usage"]
    assert old_kv["name"] == "vllm:gpu_cache_usage_perc" and old_kv["engine"] is None and old_kv["name_rank"] == 1
    dp = _table(
        parse_prometheus(VLLM / "metrics/vllm-22227_dp_engine1_decode_time_buckets_excerpt.prom", 0, OPTS),
        "metric_samples",
    )  # no # TYPE lines: the histogram is recognised from _bucket + le
    assert {(r["canonical"], r["type"], r["engine"]) for r in dp} == {("decode_time_seconds", "histogram", "1")}
    assert dp[-1]["le"] == float("inf")


def test_deprecated_and_current_names_in_one_scrape_keep_one_preferred(tmp_path):
    text = (VLLM / "metrics/production-stack-318_v1_early2025_no_engine_label_excerpt.prom").read_text()
    text += (
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.\n"
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        'vllm:kv_cache_usage_perc{model_name="Qwen/Qwen2.5-Coder-32B-Instruct"} 0.0\n'
    )  # both names, as vLLM 0.9-0.10 exposed them (vllm/v1/metrics/loggers.py)
    f = tmp_path / "both.prom"
    f.write_text(text)
    kv = [r for r in _table(parse_prometheus(f, 0, OPTS), "metric_samples") if r["canonical"] == "kv_usage"]
    assert sorted((r["name"], r["preferred"]) for r in kv) == [
        ("vllm:gpu_cache_usage_perc", False),
        ("vllm:kv_cache_usage_perc", True),
    ]


def test_malformed_metric_lines_are_counted_and_reported(tmp_path):
    good = (VLLM / "metrics/production-stack-617_vllm0.10.0_v1_engine_label_excerpt.prom").read_text().splitlines()
    bad = [
        *good[:6],
        'vllm:kv_cache_usage_perc{engine="0" 0.5',
        *good[6:12],
        "vllm:broken_metric not-a-number",
        "# TYPE vllm:num_requests_running",
        *good[12:],
    ]
    f = tmp_path / "some_bad_lines.prom"
    f.write_text("\n".join(bad) + "\n")
    p = parse_prometheus(f, 0, OPTS)
    meta = json.loads(p.inputs_rows[0]["meta_json"])
    assert meta["malformed_lines"] == 3
    assert [e["line"] for e in meta["malformed_examples"]] == [7, 14, 15]
    assert p.tables["metric_samples"].num_rows == 19  # every good sample kept
    report = analyze([], extra_inputs=[(f, "prometheus")], extra_sections=["tracediag.reports.sections.serving"])
    (section,) = report.sections
    assert any("3 malformed line(s) skipped" in n and "line 7" in n for n in section.notes)


def test_metrics_file_of_many_scrapes_without_markers(tmp_path):
    one = (VLLM / "metrics/production-stack-318_v1_early2025_no_engine_label_excerpt.prom").read_text()
    f = tmp_path / "two_curls.prom"
    f.write_text(one + one)  # two `curl /metrics` outputs appended: the repeated # HELP starts scrape 2
    rows = _table(parse_prometheus(f, 0, OPTS), "metric_samples")
    assert {r["scrape"] for r in rows} == {0, 1} and len(rows) == 14


# ------------------------------------------------------------------------------------------ bench results


def test_bench_stdout_table_and_namespace():
    p = parse_vllm_bench(BENCH / "vllm-0.33.0_rateinf_stdout.log", 0, OPTS)
    (run,) = _table(p, "bench_runs")
    assert run["source"] == "result table (stdout), summary only" and run["request_rate_rps"] == float("inf")
    assert (run["completed"], run["failed"], run["num_prompts"]) == (40, 0, 40)
    assert run["dataset_name"] == "random" and run["max_concurrency"] is None
    lat = {(r["metric"], r["stat"]): r["value_ms"] for r in _table(p, "bench_latency")}
    assert {("ttft", "p99"), ("tpot", "mean"), ("itl", "median")} <= set(lat)


def test_bench_save_result_json_keys():
    p = parse_vllm_bench(BENCH / "vllm-0.33.0_rate2_save-result.json", 0, OPTS)
    (run,) = _table(p, "bench_runs")
    d = json.loads((BENCH / "vllm-0.33.0_rate2_save-result.json").read_text())
    assert run["request_rate_rps"] == 2.0 and run["date"] == d["date"] and run["burstiness"] == 1.0
    assert (run["completed"], run["failed"], run["duration_s"]) == (60, 0, d["duration"])
    assert run["max_concurrent_requests"] == d["max_concurrent_requests"] and not run["has_requests"]
    assert p.tables["bench_requests"].num_rows == 0
    detailed = parse_vllm_bench(BENCH / "vllm-0.33.0_rate6_save-detailed.json", 0, OPTS)
    reqs = _table(detailed, "bench_requests")
    assert len(reqs) == 60 and all(r["success"] and r["start_s"] is not None for r in reqs)
    assert all(r["itl_count"] == r["output_len"] - 1 for r in reqs)  # one gap per streamed token after the first


def test_sglang_bench_jsonl_infinity_and_table():
    inf = parse_sglang_bench(SGLANG / "bench/sglang-0.5.23_rateinf_output-details.jsonl", 0, OPTS)
    (run,) = _table(inf, "bench_runs")
    assert run["request_rate_rps"] == float("inf")  # the bare `Infinity` token SGLang writes
    assert run["failed"] == 0 and run["completed"] == 40 and run["has_requests"]
    assert len(_table(inf, "bench_requests")) == 40
    lat = {(r["metric"], r["stat"]) for r in _table(inf, "bench_latency")}
    assert {("e2el", "mean"), ("e2el", "p99"), ("ttft", "p95"), ("itl", "p95")} <= lat
    (r2,) = _table(parse_sglang_bench(SGLANG / "bench/sglang-0.5.23_rate2.jsonl", 0, OPTS), "bench_runs")
    assert r2["failed"] is None and r2["num_prompts"] is None  # SGLang does not count failures without details
    (tab,) = _table(parse_sglang_bench(SGLANG / "bench/sglang-0.5.23_rate2_stdout.log", 0, OPTS), "bench_runs")
    assert (tab["request_rate_rps"], tab["completed"]) == (2.0, 60)


def test_append_result_file_holds_several_runs(tmp_path):
    """--append-result writes each run's JSON after a newline (vllm/benchmarks/serve.py main_async)."""
    a = (BENCH / "vllm-0.33.0_rate2_save-result.json").read_text()
    b = (BENCH / "vllm-0.33.0_rateinf_save-result.json").read_text()
    f = tmp_path / "appended.json"
    f.write_text(a + "\n" + b)
    runs = _table(parse_vllm_bench(f, 0, OPTS), "bench_runs")
    assert [(r["run"], r["request_rate_rps"]) for r in runs] == [(0, 2.0), (1, float("inf"))]


def test_old_benchmark_serving_keys(tmp_path):
    """benchmarks/benchmark_serving.py before `vllm bench serve`: no 'failed', input_throughput, *_latency_ms
    for the end-to-end latency. Built from a real result by renaming its keys the old way."""
    d = json.loads((BENCH / "vllm-0.33.0_rate6_save-detailed.json").read_text())
    d["p99_e2el_ms"] = d["p99_itl_ms"]  # this run did not report e2el percentiles: borrow a real value to rename
    old = {k.replace("_e2el_ms", "_latency_ms"): v for k, v in d.items() if k not in ("failed", "errors")}
    old["input_throughput"] = d["total_input_tokens"] / d["duration"]
    f = tmp_path / "old.json"
    f.write_text(json.dumps(old))
    p = parse_vllm_bench(f, 0, OPTS)
    (run,) = _table(p, "bench_runs")
    assert run["failed"] == 0  # num_prompts − completed
    lat = {(r["metric"], r["stat"]): r["value_ms"] for r in _table(p, "bench_latency")}
    assert lat[("e2el", "p99")] == pytest.approx(d["p99_e2el_ms"])


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("request_throughput", None),
        ("completed", 1e400),
        ("duration", "NaN"),
        ("total_output_tokens", 2**70),
        ("max_concurrency", -1e30),
        ("request_rate", "trace"),
    ],
)
def test_odd_values_in_a_bench_result_are_not_a_crash(tmp_path, key, value):
    d = json.loads((BENCH / "vllm-0.33.0_rate2_save-result.json").read_text())
    d[key] = value
    f = tmp_path / "odd.json"
    f.write_text(json.dumps(d))
    report = analyze(
        [], extra_inputs=[(f, "vllm-bench")], settings=Settings(slo_ms=(("ttft", 50.0),)), extra_rules=SERVING_RULES
    )
    assert json.dumps(report.to_dict(), allow_nan=False, default=str)
    sch009 = _check(report, "SCH009")
    if key == "request_throughput":  # computed from completed / duration instead
        assert sch009.status == "pass" and sch009.values["achieved_rate_rps"] == pytest.approx(60 / d["duration"])


def detailed_result(n: int = 40, seed: int = 1, stall_every: int = 10, errors: int = 2) -> dict:
    """A `vllm bench serve --save-result --save-detailed` result (keys and units of vllm/benchmarks/serve.py:
    ttfts and itls in seconds, errors '' when none, failed requests with ttft 0, itl [], output_len 0).

    SYNTHETIC: no detailed result exists among the real files. Every `stall_every`-th request has one 500 ms gap
    among 10 ms gaps — docs/method.md's stall example (SCH002) — and the first `errors` requests fail."""
    import random

    rng = random.Random(seed)
    ttfts, itls, outs, ins, errs, starts = [], [], [], [], [], []
    for i in range(n):
        ins.append(rng.randint(100, 2000))
        starts.append(i * 0.25)
        if i < errors:  # a failed request as vLLM records it
            ttfts.append(0.0)
            itls.append([])
            outs.append(0)
            errs.append("ClientConnectorError: timeout")
            continue
        o = rng.randint(20, 120)
        gaps = [0.010] * (o - 1)
        if i % stall_every == 0:
            gaps[len(gaps) // 2] = 0.500
        ttfts.append(rng.uniform(0.05, 0.4))
        itls.append(gaps)
        outs.append(o)
        errs.append("")
    good = n - errors
    return {
        "date": "20260101-120000",
        "backend": "openai",
        "model_id": "m",
        "num_prompts": n,
        "request_rate": 4.0,
        "burstiness": 1.0,
        "max_concurrency": None,
        "duration": n * 0.25 + 3,
        "completed": good,
        "failed": errors,
        "total_input_tokens": sum(ins),
        "total_output_tokens": sum(outs),
        "request_throughput": good / (n * 0.25 + 3),
        "request_goodput": None,
        "output_throughput": 0.0,
        "total_token_throughput": 0.0,
        "input_lens": ins,
        "output_lens": outs,
        "ttfts": ttfts,
        "itls": itls,
        "start_times": starts,
        "generated_texts": [""] * n,
        "errors": errs,
        "mean_ttft_ms": 200.0,
        "p99_ttft_ms": 390.0,
    }


def test_save_detailed_per_request_rows_and_rules(tmp_path):
    f = tmp_path / "detailed.json"
    f.write_text(json.dumps(detailed_result()))
    p = parse_vllm_bench(f, 0, OPTS)
    reqs = _table(p, "bench_requests")
    assert len(reqs) == 40 and sum(not r["success"] for r in reqs) == 2
    r10 = reqs[10]
    assert r10["itl_max_s"] == 0.5 and r10["e2el_source"] == "ttft+sum(itl)"
    assert r10["tpot_s"] == pytest.approx((r10["e2el_s"] - r10["ttft_s"]) / (r10["output_len"] - 1))
    slo = Settings(slo_ms=(("ttft", 500.0), ("itl", 100.0)))
    report = analyze([], extra_inputs=[(f, "vllm-bench")], settings=slo, extra_rules=SERVING_RULES)
    sch010 = _check(report, "SCH010")
    # 38 succeed, 4 of them (requests 10, 20, 30 and 0 is an error) stall 500 ms > 100 ms; errors count as misses
    assert sch010.values["attainment"] == pytest.approx(35 / 40) and sch010.values["n"] == 40
    assert sch010.status == "finding" and sch010.values["method"].startswith("per-request")
    sch002 = _check(report, "SCH002")
    assert sch002.status == "finding" and sch002.values["requests_over_budget"] == 3
    assert sch002.values["max_stall_ms"] == pytest.approx(500.0) and sch002.values["p99_gap_nearest_rank_ms"] == 10.0
    sch009 = _check(report, "SCH009")
    assert sch009.status == "finding" and "errors dropped" in sch009.values["issue"]
    assert sch009.table[0]["achieved_send_rate_rps"] == pytest.approx(4.0)


# ------------------------------------------------------------------------------------------ queue trend


def growing_queue_log(path: Path, waiting: list[int]) -> Path:
    """SYNTHETIC: the real logs have no growing Waiting series (vllm-37307 drains, the others are flat or too
    short). This renders one with vLLM's own logger format and V1 stats message (vllm/logger.py _FORMAT,
    _DATE_FORMAT; vllm/v1/metrics/loggers.py LoggingStatLogger.log) through Python's logging."""
    handler = logging.FileHandler(path, mode="w", encoding="utf-8")
    handler.setFormatter(
        logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s", "%m-%d %H:%M:%S")
    )
    log = logging.getLogger(f"vllm-synthetic-{path.name}")
    log.propagate = False
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        for i, w in enumerate(waiting):
            record = log.makeRecord(
                log.name,
                logging.INFO,
                "loggers.py",
                259,
                "Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: "
                "%.1f tokens/s, Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, "
                "Prefix cache hit rate: %.1f%%",
                (0, 900.0, 450.0, 32, w, 80.0 + i, 0.0),
                None,
            )
            record.created = 1_700_000_000 + 10 * i
            record.msecs = 0
            log.handle(record)
    finally:
        handler.close()
        log.removeHandler(handler)
    return path


def test_growing_waiting_series_is_a_finding_with_slope_and_significance(tmp_path):
    f = growing_queue_log(tmp_path / "growing.log", [10, 25, 41, 58, 70, 89, 102, 120])
    report = analyze([], extra_inputs=[(f, "vllm-log")], extra_rules=SERVING_RULES)
    c = _check(report, "SCH003")
    assert c.status == "finding"
    assert c.values["n"] == 8 and c.values["S"] == 28 and c.values["alpha"] == 0.05
    assert c.values["p_increase"] == pytest.approx(1 / 40320)  # exact: 1 of 8! orders is this rising
    assert c.values["sen_slope_per_s"] == pytest.approx(1.5625, rel=0.05)
    assert "Mann-Kendall p" in c.title and "/s" in c.title


def test_real_queue_series_without_growth_pass():
    for path, word in (
        (VLLM / "log_excerpts/vllm-6689_v0_healthy_idle.log", "No queue"),
        (VLLM / "log_excerpts/vllm-37307_v1_2026-03_waiting_drains_under_prefill.log", "draining"),
    ):
        c = _check(analyze([], extra_inputs=[(path, "vllm-log")], extra_rules=SERVING_RULES), "SCH003")
        assert c.status == "pass" and word in c.title, c.title


# ------------------------------------------------------------------------------------------ wrong kind of file


@pytest.mark.parametrize(
    ("path", "fmt", "message"),
    [
        (BENCH / "vllm-0.33.0_rate2_save-result.json", "prometheus", "not Prometheus text exposition"),
        (VLLM / "metrics/production-stack-318_v1_early2025_no_engine_label_excerpt.prom", "vllm-log", "not a vLLM log"),
        (LOG_V1, "vllm-bench", "not a `vllm bench serve` result"),
        (EXTERNAL / "nccl-tests/h100x2_all_reduce_perf.txt", "vllm-bench", "not a `vllm bench serve` result"),
    ],
)
def test_a_file_of_the_wrong_kind_is_one_clear_error(path, fmt, message):
    with pytest.raises(InputError) as exc:
        analyze([], extra_inputs=[(path, fmt)])
    assert message in str(exc.value) and path.name in str(exc.value)


def test_json_that_is_not_a_bench_result(tmp_path):
    f = tmp_path / "config.json"
    f.write_text('{"hidden_size": 4096}')
    with pytest.raises(InputError, match="no 'completed'"):
        parse_vllm_bench(f, 0, OPTS)


def test_coloured_log_is_detected_as_a_vllm_log(tmp_path):
    coloured = tmp_path / "coloured.log"
    raw = LOG_V1.read_bytes().decode("utf-8")
    coloured.write_bytes("\n".join(_vllm_colour(x) for x in raw.split("\n")).encode("utf-8"))
    assert detect_format(coloured) == "vllm-log"


def test_message_level_formats_no_real_file_has():
    """Messages assembled from vLLM's own format strings (vllm/v1/metrics/loggers.py log_parts, the aggregated
    data-parallel logger, V0 CacheEngine '# GPU blocks', the quantized-kernel choice), parsed one message at a
    time: no real log among the data files prints them."""
    from tracediag.ingest.vllm_log import parse_stats as _parse_stats
    from tracediag.ingest.vllm_log import startup_facts as _startup_facts

    cols, extra = _parse_stats(
        "Engine 001: Avg prompt throughput: 10.0 tokens/s, Avg generation throughput: 5.0 tokens/s, Running: 3 reqs, "
        "Waiting: 7 reqs, Deferred: 2 reqs, Preemptions: 4, GPU KV cache usage: 97.5%, Prefix cache hit rate: 12.0%, "
        "Corrupted: 0 reqs, External prefix cache hit rate: 3.0%, MM cache hit rate: 50.0%"
    )
    assert (cols["engine"], cols["waiting"], cols["deferred"], cols["preemptions"]) == (1, 7, 2, 4)
    assert (cols["kv_usage_pct"], cols["external_prefix_hit_pct"], cols["mm_hit_pct"]) == (97.5, 3.0, 50.0)
    assert extra == {"Corrupted": 0.0}
    agg, _ = _parse_stats(
        "2 Engines Aggregated: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, "
        "Running: 5 reqs, Waiting: 0 reqs, GPU KV cache usage: 40.0%, Prefix cache hit rate: 0.0%"
    )
    assert agg["engine"] == -1 and agg["running"] == 5
    facts = {k: v for k, v, _, _ in _startup_facts("# GPU blocks: 2048, # CPU blocks: 512")}
    assert facts == {"num_gpu_blocks": "2048", "num_cpu_blocks": "512"}
    facts = {k: v for k, v, _, _ in _startup_facts("Using MarlinLinearKernel for CompressedTensorsWNA16")}
    assert facts == {"quant_kernel": "Using MarlinLinearKernel for CompressedTensorsWNA16"}


def test_v1_preemptions_field_feeds_sch004(tmp_path):
    """SYNTHETIC log (vLLM's logger format, see growing_queue_log) whose stats lines carry 'Preemptions: N'."""
    f = tmp_path / "preempting.log"
    handler = logging.FileHandler(f, mode="w", encoding="utf-8")
    handler.setFormatter(
        logging.Formatter("%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s", "%m-%d %H:%M:%S")
    )
    log = logging.getLogger("vllm-synthetic-preempt")
    log.propagate = False
    log.addHandler(handler)
    try:
        for i, n in enumerate([0, 3, 5]):
            parts = "Running: %d reqs, Waiting: %d reqs" + (", Preemptions: %d" if n else "")
            args = (40, 2, n) if n else (40, 2)
            rec = log.makeRecord(
                log.name,
                logging.INFO,
                "loggers.py",
                259,
                "Engine 000: Avg prompt throughput: 1.0 tokens/s, Avg generation throughput: 2.0 "
                "tokens/s, " + parts + ", GPU KV cache usage: %.1f%%, Prefix cache hit rate: 0.0%%",
                (*args, 96.0 + i),
                None,
            )
            rec.created = 1_700_000_000 + 10 * i
            log.handle(rec)
    finally:
        handler.close()
        log.removeHandler(handler)
    c = _check(analyze([], extra_inputs=[(f, "vllm-log")], extra_rules=SERVING_RULES), "SCH004")
    assert c.status == "finding" and c.values["preemptions_v1_intervals"] == 8 and "8 preemptions" in c.title


@pytest.mark.parametrize("ts", ["NaN", str(2**70), "-5", "+Inf"])
def test_prometheus_sample_with_an_impossible_timestamp_is_one_bad_sample(tmp_path, ts):
    text = (VLLM / "metrics/production-stack-318_v1_early2025_no_engine_label_excerpt.prom").read_text().splitlines()
    i = next(n for n, x in enumerate(text) if x.startswith("vllm:gpu_cache_usage_perc"))
    text[i] = f"{text[i]} {ts}"
    f = tmp_path / "ts.prom"
    f.write_text("\n".join(text) + "\n")
    p = parse_prometheus(f, 0, OPTS)
    meta = json.loads(p.inputs_rows[0]["meta_json"])
    assert meta["malformed_lines"] == 1 and p.tables["metric_samples"].num_rows == 6


def test_sch007_skips_a_non_numeric_position_label(tmp_path):
    """A per-position counter whose `position` label is not a number (seen by a fuzzer) is skipped, not a crash."""
    text = (
        "# TYPE vllm:spec_decode_num_drafts counter\n"
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 100\n'
        "# TYPE vllm:spec_decode_num_draft_tokens counter\n"
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300\n'
        "# TYPE vllm:spec_decode_num_accepted_tokens counter\n"
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 150\n'
        "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter\n"
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 80\n'
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="first"} 50\n'
    )  # vLLM's names (vllm/v1/spec_decode/metrics.py SpecDecodingProm); the odd label is the mutation
    f = tmp_path / "spec.prom"
    f.write_text(text)
    c = _check(analyze([], extra_inputs=[(f, "prometheus")], extra_rules=SERVING_RULES), "SCH007")
    assert c.status in ("pass", "finding") and c.values["per_position_joint"] == [0.8]


def test_python_default_logging_layout(tmp_path):
    """vLLM records through logging.basicConfig's default layout (logging.BASIC_FORMAT, `LEVEL:logger:message`):
    the real V0 stats line of #8378 re-emitted by Python's logging under vLLM's logger name (a transformation of
    a real line, not new data)."""
    line = (VLLM / "log_excerpts/vllm-8378_pending_growing_zero_throughput_with_health.log").read_text().splitlines()[0]
    msg = line.split("] ", 1)[1]
    f = tmp_path / "basic.log"
    handler = logging.FileHandler(f, mode="w", encoding="utf-8")
    handler.setFormatter(logging.Formatter(logging.BASIC_FORMAT))
    log = logging.getLogger("vllm.engine.metrics")
    log.propagate, log.level = False, logging.INFO
    log.addHandler(handler)
    try:
        log.info(msg)
    finally:
        handler.close()
        log.removeHandler(handler)
    assert f.read_text().startswith("INFO:vllm.engine.metrics:Avg prompt throughput")
    (row,) = _table(parse_vllm_log(f, 0, OPTS), "serving_stats")
    assert (row["running"], row["waiting"], row["t_s"]) == (2, 0, None)
