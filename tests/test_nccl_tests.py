"""nccl-tests ingest on the real `all_reduce_perf` output, and PATH002 (steps 3 vs 4) against it."""

from __future__ import annotations

import pytest
from conftest import EXTERNAL, REPO, SAMPLES

from tracediag.analysis import analyze
from tracediag.errors import InputError
from tracediag.ingest import detect_format
from tracediag.ingest.base import IngestOptions
from tracediag.ingest.nccl_tests import parse_nccl_tests

H100X2 = EXTERNAL / "nccl-tests" / "h100x2_all_reduce_perf.txt"
H100_TOPO = REPO / "tests" / "data" / "topology" / "h100x2_nvswitch.topo.json"  # synthetic, see test_env_command


def _rows(path):
    return parse_nccl_tests(path, 0, IngestOptions()).tables["nccl_tests"].to_pylist()


def test_detected_by_content():
    assert detect_format(H100X2) == "nccl-tests"


def test_real_h100x2_table():
    parsed = parse_nccl_tests(H100X2, 0, IngestOptions())
    rows = parsed.tables["nccl_tests"].to_pylist()
    # 21 sizes, 1 KiB .. 1 GiB, out-of-place and in-place
    assert len(rows) == 42
    assert {r["placement"] for r in rows} == {"out-of-place", "in-place"}
    first = rows[0]
    assert first | {"source_path": None} == {
        "source_path": None,
        "test": "all_reduce_perf",
        "op": "all_reduce",
        "nranks": 2,
        "placement": "out-of-place",
        "size_bytes": 1024,
        "count_elements": 256,
        "dtype": "float",
        "redop": "sum",
        "root": -1,
        "time_ns": 15750,
        "time_kind": "time",
        "algbw_gbs": 0.07,
        "busbw_gbs": 0.07,
        "wrong": 0,
    }
    big = [r for r in rows if r["size_bytes"] == 1073741824]
    assert [(r["placement"], r["time_ns"], r["busbw_gbs"]) for r in big] == [
        ("out-of-place", 2996100, 358.38),
        ("in-place", 3006400, 357.15),
    ]
    # busbw = algbw × 2(n−1)/n = algbw for n = 2 (nccl-tests doc/PERFORMANCE.md)
    assert all(r["busbw_gbs"] == r["algbw_gbs"] for r in rows)
    meta = parsed.inputs_rows[0]
    assert meta["rank"] is None and meta["device_name"] == "NVIDIA H100 80GB HBM3"
    assert '"avg_busbw_gbs": 125.437' in meta["meta_json"] and '"hosts": ["am4g2r31bm1"]' in meta["meta_json"]


def test_interleaved_log_lines_are_skipped(tmp_path):
    # the real table with NCCL_DEBUG=INFO-style lines between rows (a line as NCCL prints them)
    lines = H100X2.read_text().splitlines()
    at = next(i for i, line in enumerate(lines) if line.strip().startswith("1048576 "))
    lines.insert(at, "am4g2r31bm1:15386:15386 [0] NCCL INFO Connected all rings")
    f = tmp_path / "with_logs.txt"
    f.write_text("\n".join(lines) + "\n")
    parsed = parse_nccl_tests(f, 0, IngestOptions())
    assert parsed.tables["nccl_tests"].num_rows == 42
    assert '"lines_skipped": 1' in parsed.inputs_rows[0]["meta_json"]


def test_older_format_without_root_and_with_error_column(tmp_path):
    # verbatim header and row of nccl-tests 2.10.0 output, as quoted in an AWS ParallelCluster EFA
    # integration test (expected-output comment, Apache-2.0): no 'root' column, 'error' instead of '#wrong'
    f = tmp_path / "v2.10.txt"
    f.write_text(
        "#                                                       out-of-place                       in-place\n"
        "#       size         count      type   redop     time   algbw   busbw  error     time   algbw   busbw  error\n"
        "#        (B)    (elements)                       (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)\n"
        " 1073741824     268435456     float     sum    79531   13.50   26.58  2e-06    79371   13.53   26.63  2e-06\n"
    )
    rows = _rows(f)
    assert [(r["placement"], r["root"], r["time_ns"], r["busbw_gbs"], r["wrong"], r["test"]) for r in rows] == [
        ("out-of-place", None, 79531000, 26.58, None, None),
        ("in-place", None, 79371000, 26.63, None, None),
    ]


def test_not_an_nccl_tests_file_is_one_clear_error():
    log = EXTERNAL / "vllm" / "log_excerpts" / "vllm-37307_v1_2026-03_waiting_drains_under_prefill.log"
    with pytest.raises(InputError, match="no nccl-tests result table"):
        parse_nccl_tests(log, 0, IngestOptions())


def test_rows_reach_the_store():
    report = analyze([], extra_inputs=[(H100X2, "nccl-tests")], extra_sections=["tracediag.reports.sections.comm"])
    (inp,) = report.inputs
    assert inp["format"] == "nccl-tests" and inp["ranks"] == []
    comm = next(s for s in report.sections if s.id == "comm")
    assert len(comm.tables["nccl-tests (out-of-place)"]) == 21


# --- PATH002 --------------------------------------------------------------------------------------------------


def _path002(paths, extra, model=None, tp=None):
    r = analyze(
        paths, model=model, tp=tp, extra_inputs=extra, extra_rules=["tracediag.rules.step2_path.path002_bus_bandwidth"]
    )
    (c,) = [c for c in r.checks if c.rule == "PATH002"]
    return c


def test_step3_vs_step4_tp2_trace_against_the_h100_table():
    d = SAMPLES / "healthy_tp2"
    c = _path002([d], [(H100X2, "nccl-tests")], model=d / "config.json")
    assert c.status == "finding" and c.severity == "warning"
    by_size = {r["payload_bytes"]: r for r in c.table}
    # decode all-reduces: [2, 256] bf16 = 1,024 B, below the table's first size -> its 15.75 µs latency floor
    assert by_size[1024]["bench_ns"] == 15750 and by_size[1024]["bench_lookup"].startswith("below the table")
    # prefill: [48, 256] bf16 = 24,576 B, between 16 KiB (12.17 µs) and 32 KiB (12.68 µs), log-log interpolated
    assert 12170 < by_size[24576]["bench_ns"] < 12680
    assert c.values["app_over_bench_median"] == pytest.approx(20.804, rel=1e-3)
    assert "different paths" in c.values["note_paths"] and c.confidence == "low"


def test_step3_table_against_the_link_class():
    c = _path002([], [(H100X2, "nccl-tests"), (H100_TOPO, "topology")])
    assert c.status == "pass"
    assert c.values["nccl_tests_peak_busbw_gbs"] == 358.38 and c.values["link_expected_busbw_gbs"] == 450.0
    assert c.values["nccl_tests_share_of_link"] == pytest.approx(358.38 / 450, abs=1e-4)


def test_bench_time_interpolation_is_log_log():
    from tracediag.rules.step2_path.path002_bus_bandwidth import bench_time_ns

    rows = [{"size_bytes": 1024, "time_ns": 10_000}, {"size_bytes": 4096, "time_ns": 40_000}]
    assert bench_time_ns(rows, 2048)[0] == pytest.approx(20_000)
    assert bench_time_ns(rows, 512) == (10_000, "below the table: its smallest size's time")
    assert bench_time_ns(rows, 8192)[0] == pytest.approx(80_000)


# --- hostile values: the real table with one token edited (regressions of the fuzz suite, tests/fuzz/) ------------

ROW_1K = (
    "        1024           256     float     sum      -1    15.75    0.07    0.07      0    14.46    0.07    0.07"
    "      0"
)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("1024  ", "18446744073709551616  "),  # size beyond 64 bits: OverflowError in Arrow before
        ("15.75", "inf"),  # round(inf) raised OverflowError
        ("15.75", "1e30"),
        ("15.75", "nan"),
        ("0.07    0.07      0    14.46", "0.07    -3      0    14.46"),  # negative bus bandwidth
        ("256  ", "2²6  "),  # '²' is str.isdigit() but int() refuses it
    ],
)
def test_a_row_with_a_bad_value_is_a_counted_bad_record(tmp_path, old, new):
    text = H100X2.read_text()
    assert ROW_1K in text
    f = tmp_path / "all_reduce_perf.txt"
    f.write_text(text.replace(ROW_1K, ROW_1K.replace(old, new, 1)))
    import json

    parsed = parse_nccl_tests(f, 0, IngestOptions())
    assert parsed.tables["nccl_tests"].num_rows == 40  # 21 sizes x 2 placements, less the bad row's two
    row = parsed.inputs_rows[0]
    assert row["bad_records"] == 1
    assert json.loads(row["meta_json"])["bad_records"]["fields"]["result row"]["action"] == "row left out"


def test_a_bad_average_line_is_counted_not_fatal(tmp_path):
    f = tmp_path / "all_reduce_perf.txt"
    f.write_text(H100X2.read_text().replace("# Avg bus bandwidth    : 125.437", "# Avg bus bandwidth    : -"))
    parsed = parse_nccl_tests(f, 0, IngestOptions())  # ValueError before
    assert parsed.tables["nccl_tests"].num_rows == 42 and parsed.inputs_rows[0]["bad_records"] == 1
