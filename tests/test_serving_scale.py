"""Long serving logs stay fast and bounded: a SYNTHETIC log of 200,000 V1 stats lines (vLLM's own layout, see
benchmarks/bench_sch003.py, which times 10^6 lines: docs in benchmarks/README.md) whose queue grows is analysed
in seconds, SCH003 reports the growth with the O(n log n) test, and the report stays small."""

from __future__ import annotations

import json
import sys
import time

from conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from bench_sch003 import write_log

from tracediag.analysis import analyze
from tracediag.output import staged_outputs


def test_a_long_log_with_a_growing_queue(tmp_path):
    log = tmp_path / "growing.log"
    write_log(log, 200_000)
    t0 = time.perf_counter()
    report = staged_outputs(
        tmp_path / "out", lambda d: analyze([], extra_inputs=[(log, "vllm-log")], db_path=d / "t.duckdb")
    )
    elapsed = time.perf_counter() - t0
    (sch003,) = [c for c in report.checks if c.rule == "SCH003"]
    assert sch003.status == "finding" and sch003.values["n"] == 200_000
    assert sch003.values["sen_slope_per_s"] > 0 and sch003.values["sen_method"].startswith("median of")
    assert elapsed < 60  # about 8 s on a 2-core machine; 10^6 lines take ~30 s (benchmarks/README.md)
    assert (tmp_path / "out" / "report.html").stat().st_size < 2_000_000  # thinned charts, cut tables
    assert json.loads((tmp_path / "out" / "findings.json").read_text())["checks"]
