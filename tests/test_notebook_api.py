"""The notebook API, `tracediag.analyze(...)`: the CLI's inputs as keyword arguments with the CLI's checks, each
enabling the rule it enables on the command line, and `Report.save(folder)` writing the files `analyze --out`
writes."""

from __future__ import annotations

import json

import duckdb
import pytest
from conftest import REPO, SAMPLES

import tracediag
from tracediag.errors import UsageError

EXT = REPO / "tests" / "data" / "external"
TRACE = SAMPLES / "healthy_tp2"


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"tp": 10**30}, "tp: must be an integer from 1 to 4096"),
        ({"tp": 0}, "tp: must be an integer from 1 to 4096"),
        ({"tp": "2"}, "tp: must be an integer"),
        ({"jobs": 0}, "jobs: must be an integer from 1 to 1024"),
        ({"peak_tflops": -1.0}, "peak_tflops: must be a number from 0.001"),
        ({"hbm_bandwidth": 1e9}, "hbm_bandwidth: must be a number from 0.001 to 100000"),
        ({"slo": ""}, "slo: empty"),
    ],
)
def test_the_clis_checks_apply(kwargs, word):
    with pytest.raises(UsageError, match=word.replace("(", r"\(")):
        tracediag.analyze([TRACE], **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "rule"),
    [
        ({"log": EXT / "vllm" / "log_excerpts" / "vllm-5578_v0_preemption_warning_swapped_pending.log"}, "SCH004"),
        ({"bench": [EXT / "vllm" / "bench" / "vllm-0.33.0_rate2_save-result.json"]}, "SCH009"),
        ({"nccl_tests": EXT / "nccl-tests" / "h100x2_all_reduce_perf.txt"}, "PATH002"),
        ({"topology": REPO / "tests" / "data" / "topology" / "h100x2_nvswitch.topo.json"}, "PATH001"),
    ],
)
def test_each_keyword_input_enables_its_rule(kwargs, rule):
    without = {c.rule: c.status for c in tracediag.analyze([TRACE], rules=(rule,)).checks}
    given = {c.rule: c.status for c in tracediag.analyze([TRACE], rules=(rule,), **kwargs).checks}
    assert without[rule] == "not_applicable" and given[rule] != "not_applicable"


def test_slo_keyword_is_the_settings_budget():
    bench = EXT / "vllm" / "bench" / "vllm-0.33.0_rate6_save-detailed.json"
    report = tracediag.analyze([], bench=bench, slo="ttft=500,tpot=50", rules=("SCH010",))
    (check,) = report.checks
    assert check.status != "not_applicable"
    with pytest.raises(UsageError, match="given both"):
        from tracediag.context import Settings

        tracediag.analyze([], bench=bench, slo="ttft=500", settings=Settings(slo_ms=(("ttft", 1.0),)))


def test_save_writes_what_analyze_out_writes(tmp_path):
    report = tracediag.analyze([TRACE], model=TRACE / "config.json", db_path=tmp_path / "t.duckdb")
    out = report.save(tmp_path / "run")
    assert sorted(p.name for p in out.iterdir()) == ["findings.json", "report.html", "trace.duckdb"]
    doc = json.loads((out / "findings.json").read_text())
    assert doc["verdict"]["headline"] == report.verdict["headline"]
    assert [c["rule"] for c in doc["checks"]] == [c.rule for c in report.checks]
    assert duckdb.connect(str(out / "trace.duckdb"), read_only=True).execute("SELECT count(*) FROM steps").fetchone()[0]
    with tracediag.open(out) as run:  # what the notebook reads back
        assert run.verdict["headline"] == report.verdict["headline"]
    # an in-memory analysis saves its report without a store
    bare = tracediag.analyze([TRACE]).save(tmp_path / "bare")
    assert sorted(p.name for p in bare.iterdir()) == ["findings.json", "report.html"]
