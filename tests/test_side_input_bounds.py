"""Side inputs within the memory budget, their bad values counted (issue 38, item 11)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import EXTERNAL, SAMPLES

from tracediag.errors import InputError
from tracediag.ingest.base import IngestOptions

BENCH = EXTERNAL / "vllm" / "bench" / "vllm-0.33.0_rate6_save-detailed.json"
ROOT = Path(__file__).resolve().parents[1]


def dense_result(path: Path, requests: int, gaps: int) -> Path:
    """A --save-detailed result of the vendored one's requests repeated, each with `gaps` one-digit itls of 0: a
    JSON value every 2 bytes, the most objects a byte of JSON makes."""
    doc = json.loads(BENCH.read_text())
    n = len(doc["ttfts"])
    per_request = [k for k, v in doc.items() if isinstance(v, list) and len(v) == n]
    reps = -(-requests // n)
    doc = {k: (v * reps if k in per_request else v) for k, v in doc.items()}
    doc["itls"] = [[0] * gaps for _ in doc["ttfts"]]
    path.write_text(json.dumps(doc, separators=(",", ":")))
    return path


def test_a_bench_result_of_dense_values_beyond_the_budget_is_refused_naming_the_file_and_the_limit(tmp_path):
    from tracediag.ingest.vllm_bench import parse_vllm_bench

    f = dense_result(tmp_path / "result.json", 120, 20_000)  # 4.8 MB: within the 8 MiB read budget of 64 MiB
    with pytest.raises(InputError) as e:
        parse_vllm_bench(f, 0, IngestOptions(memory_limit=64 << 20))
    assert e.value.path == str(f)
    assert "JSON values" in e.value.problem and "more than --memory-limit 64 MiB" in e.value.problem
    parsed = parse_vllm_bench(f, 0, IngestOptions())  # the default budget holds it
    reqs = parsed.tables["bench_requests"]
    assert reqs.num_rows == 120 and reqs.column("itl_count").to_pylist() == [20_000] * 120
    assert reqs.column("itls_s")[0].as_py() == [0.0] * 20_000


def test_a_bench_result_whose_gaps_are_all_zero_is_analysed(tmp_path):
    f = dense_result(tmp_path / "result.json", 60, 3)
    r = subprocess.run(
        [sys.executable, "-m", "tracediag", "analyze", SAMPLES / "healthy_tp1", "--bench", f, "-o", tmp_path / "o",
         "-q", "--format", "json"],
        capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]


def test_a_failed_bulk_insert_in_a_transaction_raises_its_own_error():
    import duckdb
    import pyarrow as pa

    from tracediag.store import append_arrow

    con = duckdb.connect()
    con.execute("CREATE TABLE t (a INTEGER)")
    con.begin()  # as a store's load: the INSERT's failure aborts it, and unregistering then raised TransactionException
    with pytest.raises(duckdb.ConversionException):
        append_arrow(con, "t", pa.table({"a": ["x"]}))


PROM_617 = EXTERNAL / "vllm" / "metrics" / "production-stack-617_vllm0.10.0_v1_engine_label_excerpt.prom"


@pytest.mark.parametrize(
    ("name", "value", "why"),
    [
        ("kv_cache_usage_perc{", "-1e308", "beyond 1e300"),
        ("kv_cache_usage_perc{", "+Inf", "beyond 1e300"),
        ("kv_cache_usage_perc{", "7.5", "usage fraction"),
        ("kv_cache_usage_perc{", "NaN", "not a number"),
        ("_bucket{", "-3", "negative count"),
    ],
)
def test_a_scrape_value_no_metric_has_is_a_counted_bad_record(tmp_path, name, value, why):
    from tracediag.ingest.prometheus import parse_prometheus

    lines = PROM_617.read_text().splitlines()
    i = next(n for n, ln in enumerate(lines) if name in ln and not ln.startswith("#"))
    lines[i] = lines[i].rsplit(" ", 1)[0] + " " + value
    f = tmp_path / "metrics.prom"
    f.write_text("\n".join(lines) + "\n")
    good = parse_prometheus(PROM_617, 0, IngestOptions())
    assert good.inputs_rows[0]["bad_records"] == 0
    bad = parse_prometheus(f, 0, IngestOptions())
    assert bad.inputs_rows[0]["bad_records"] == 1
    field = json.loads(bad.inputs_rows[0]["meta_json"])["bad_records"]["fields"]["metric_samples.value"]
    assert field["count"] == 1 and why in field["action"], field
    samples = bad.tables["metric_samples"]
    assert samples.num_rows == good.tables["metric_samples"].num_rows  # kept, its value NULL
    row = samples.filter(samples.column("line").to_numpy() == i + 1)
    assert row.column("value").to_pylist() == [None]


def test_a_scrape_file_whose_lines_would_not_fit_the_budget_is_refused_naming_the_limit(tmp_path):
    from tracediag.ingest.prometheus import parse_prometheus

    f = tmp_path / "metrics.prom"
    f.write_text("".join(f"a{i} 1\n" for i in range(60_000)))  # 0.5 MB within the 8 MiB read budget of 64 MiB
    with pytest.raises(InputError) as e:
        parse_prometheus(f, 0, IngestOptions(memory_limit=64 << 20))
    assert e.value.path == str(f) and "60,001 lines" in e.value.problem and "--memory-limit 64 MiB" in e.value.problem
    assert parse_prometheus(f, 0, IngestOptions()).tables["metric_samples"].num_rows == 60_000


def test_a_log_of_a_run_and_a_process_a_line_keeps_a_bounded_record_of_them(tmp_path):
    """Every line from a process of its own name, the clock jumping back every other line: 10^6 such lines took 700
    MiB (the run starts and the pid of every name kept), 381 MiB once bounded (a log of one process: 344 MiB)."""
    from tracediag.ingest import vllm_log

    f = tmp_path / "server.log"
    line = (
        "(P{i} pid={pid}) INFO 07-29 {hh}:22:21 [loggers.py:310] Engine 000: Avg prompt throughput: 0.0 tokens/s, "
        "Avg generation throughput: 25.0 tokens/s, Running: 1 reqs, Waiting: 0 reqs, GPU KV cache usage: 1.0%, "
        "Prefix cache hit rate: 0.0%\n"
    )
    f.write_text("".join(line.format(i=i, pid=i % 7 + 1, hh=10 + 2 * (i % 2)) for i in range(10_000)))
    parsed = vllm_log.parse_vllm_log(f, 0, IngestOptions())
    meta = json.loads(parsed.inputs_rows[0]["meta_json"])
    assert meta["runs"] == 5_000 and len(meta["run_starts"]) == vllm_log.MAX_RUN_STARTS
    assert parsed.tables["serving_stats"].num_rows == 10_000


NSYS = EXTERNAL / "nsys" / "nsysai_2xh100_before.sqlite"


def test_an_nsys_export_with_widely_spread_device_ids_parses_as_the_dense_one(tmp_path):
    """deviceId 0 and 1,000,000 (and the GPU ids of TARGET_INFO_*) in place of 0 and 1: the same ranks, kernels and
    device properties, in about the same time (nothing is sized by the largest id)."""
    import shutil
    import sqlite3
    import time

    from tracediag.ingest.nsys import parse_nsys_sqlite

    f = tmp_path / "spread.sqlite"
    shutil.copyfile(NSYS, f)
    con = sqlite3.connect(f)
    for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
        cols = {r[1] for r in con.execute(f"PRAGMA table_info({table})")}
        for col in {"deviceId"} | ({"id", "cudaId", "gpuId", "cuDevice"} if table.startswith("TARGET_INFO") else set()):
            if col in cols:
                con.execute(f"UPDATE {table} SET {col} = {col} * 1000000")
    con.commit()
    con.close()
    t0 = time.process_time()
    dense = parse_nsys_sqlite(NSYS)
    t1 = time.process_time()
    spread = parse_nsys_sqlite(f)
    t2 = time.process_time()
    assert t2 - t1 < 3 * (t1 - t0) + 0.5
    a, b = dense.tables["kernels"], spread.tables["kernels"]
    assert a.column("rank").to_pylist() == b.column("rank").to_pylist()
    assert [d * 1_000_000 for d in a.column("device").to_pylist()] == b.column("device").to_pylist()
    assert a.drop(["device"]).equals(b.drop(["device"]))
    for x, y in zip(dense.inputs_rows, spread.inputs_rows):
        keys = ("rank", "rank_source", "device_name", "device_num_sms", "events_total", "bad_records")
        assert [x.get(k) for k in keys] == [y.get(k) for k in keys]
