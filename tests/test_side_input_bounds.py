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
