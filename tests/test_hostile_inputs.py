"""Hostile inputs: a bad record is counted and the rest of the file still counts; what never ends (a named pipe,
a device), what would not fit (a 3 GiB sparse file, a gzip bomb, an export that joins n × m) is refused with one
line naming the file, fast, never a hang or a traceback.

Every input is built here from a real file of the repository (tests/data/external/, sample_traces/) with the one
hostile edit the test is about. Exit-code tests run the real CLI as a subprocess, with a timeout.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import EXTERNAL, SAMPLES

from tracediag.errors import InputError
from tracediag.ingest.base import IngestOptions

HEALTHY = SAMPLES / "healthy_tp2"
NCCL_TRACE = EXTERNAL / "kineto" / "hta_a100_rank0of2_nccl_args.json.gz"  # rank 0 of 2, with kernels
NSYS = EXTERNAL / "nsys" / "nsysai_2xh100_before.sqlite"
NSYS_WRAPPED = EXTERNAL / "nsys" / "pipit_saxpy_mpi_nvtx.sqlite"  # CUDA calls recorded twice, one inside the other
PROM = EXTERNAL / "vllm" / "metrics" / "production-stack-617_vllm0.10.0_v1_engine_label_excerpt.prom"
VLLM_LOG = EXTERNAL / "vllm" / "log_excerpts" / "vllm-10024_engine_loop_died_then_mqllmengine_dead.log"
SGLANG_LOG = EXTERNAL / "sglang" / "log_excerpts" / "sglang-10053_healthy_low_load.log"
BENCH = EXTERNAL / "vllm" / "bench" / "vllm-0.33.0_rate6_save-detailed.json"
NCCL_TESTS = EXTERNAL / "nccl-tests" / "h100x2_all_reduce_perf.txt"
TOPOLOGY = Path(__file__).parent / "data" / "topology" / "h100x2_nvswitch.topo.json"
MODEL = HEALTHY / "config.json"
GIB = 1 << 30
MIB = 1 << 20


def cli(*args, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run(
        [sys.executable, "-m", "tracediag", *map(str, args)],
        capture_output=True, text=True, timeout=timeout, env=env,
    )  # fmt: skip


def one_error_line(r: subprocess.CompletedProcess, path: Path, *needles: str) -> str:
    """The run's one stderr line: exit 2, `tracediag: error: <path>: ...` holding every needle."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, (r.returncode, r.stderr[-2000:])
    assert lines[0].startswith(f"tracediag: error: {path}: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def kineto_doc(path: Path = NCCL_TRACE) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def bad_fields(parsed) -> dict:
    return json.loads(parsed.inputs_rows[0]["meta_json"] or "{}").get("bad_records", {}).get("fields", {})


# --- 1. one bad event is a counted bad record, not a rejected trace ---------------------------------------------


def test_events_that_are_null_numbers_lists_or_have_a_bad_ph_or_args_are_counted(tmp_path):
    from tracediag.ingest.kineto import parse_kineto

    doc = kineto_doc()
    events = doc["traceEvents"]
    kernels = [i for i, e in enumerate(events) if e.get("cat") == "kernel"]
    events[kernels[0]]["ph"] = 5
    events[kernels[1]]["ph"] = None
    events[kernels[2]]["args"] = "a string"
    for i, item in ((3, None), (10, 7), (20, [1, 2])):
        events.insert(i, item)
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(doc))
    base, parsed = parse_kineto(NCCL_TRACE), parse_kineto(f)  # raised `Expected str, got null` before
    assert parsed.tables["kernels"].num_rows == base.tables["kernels"].num_rows - 2  # the two without a ph
    fields = bad_fields(parsed)
    assert fields["traceEvents"]["count"] == 3 and fields["traceEvents.ph"]["count"] == 2
    assert fields["traceEvents.args"]["count"] == 1 and parsed.inputs_rows[0]["bad_records"] == 6
    # the event whose args was a string is kept, without its args (device/stream from pid/tid, as Kineto writes)
    kept = events[kernels[2] + 3]
    names = parsed.tables["kernels"].column("name").to_pylist()
    assert kept["name"] in names


def test_bad_events_in_a_later_chunk_are_counted_once(tmp_path):
    """The chunked decode (a 1 MiB chunk budget: many chunks) counts the same bad records as a whole-file read."""
    from tracediag.ingest.kineto import parse_kineto

    doc = kineto_doc()
    n = len(doc["traceEvents"])
    for i in (n - 5, n // 2, 7):
        doc["traceEvents"].insert(i, None)
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(doc))
    parsed = parse_kineto(f, 0, IngestOptions(memory_limit=8 * MIB))  # chunks of 1 MiB
    assert bad_fields(parsed)["traceEvents"]["count"] == 3 and parsed.inputs_rows[0]["bad_records"] == 3
    assert parsed.tables["kernels"].num_rows == parse_kineto(NCCL_TRACE).tables["kernels"].num_rows


@pytest.mark.parametrize("memory_limit", [None, 8 * MIB], ids=["whole", "chunked"])
@pytest.mark.parametrize("edit", ["nested", "utf8"])
def test_an_item_nested_too_deep_or_with_invalid_utf8_after_a_non_event_is_an_input_error(tmp_path, edit, memory_limit):
    """A long fuzz run found both as tracebacks: after an item that is not an event (a number here) the events are
    decoded one by one, inside the error handler of the first decode, and an item nested past the interpreter's
    recursion limit or with an invalid UTF-8 byte in a string raised from there, where no clause caught it."""
    from tracediag.ingest.kineto import parse_kineto

    doc = kineto_doc()
    doc["traceEvents"].insert(3, 7)
    doc["traceEvents"][10]["name"] = "MARKER"
    data = json.dumps(doc).encode()
    if edit == "nested":  # an array 20,000 levels deep as the event's name
        data = data.replace(b'"MARKER"', b"[" * 20_000 + b"]" * 20_000)
    else:  # a byte that is not UTF-8 inside the event's name
        data = data.replace(b'"MARKER"', b'"bad ' + bytes([0xFF]) + b' byte"')
    f = tmp_path / "rank0.json"
    f.write_bytes(data)
    want = "JSON nested too deep to be a trace" if edit == "nested" else "not valid JSON (Invalid UTF-8"
    with pytest.raises(InputError, match=want.replace("(", r"\(")):
        parse_kineto(f, 0, IngestOptions(memory_limit=memory_limit))


def test_a_negative_kernel_duration_is_counted(tmp_path):
    from tracediag.ingest.kineto import parse_kineto

    doc = kineto_doc()
    kernels = [e for e in doc["traceEvents"] if isinstance(e, dict) and e.get("cat") == "kernel"]
    kernels[0]["dur"] = -3.5
    kernels[1]["dur"] = -0.0001  # a tenth of a ns below 0: float rounding of an ns clock, not a bad record
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(doc))
    parsed = parse_kineto(f)
    field = bad_fields(parsed)["kernels.dur"]
    assert field["count"] == 1 and field["examples"] == ["-3.5"] and "set to 0" in field["action"]
    assert parsed.inputs_rows[0]["bad_records"] == 1
    assert parsed.tables["kernels"].num_rows == parse_kineto(NCCL_TRACE).tables["kernels"].num_rows


def test_a_rank_not_below_world_size_is_a_reported_bad_record(tmp_path):
    from tracediag.analysis import analyze

    doc = kineto_doc()
    doc["distributedInfo"]["rank"] = 2  # of world_size 2
    f = tmp_path / "rank2.json"
    f.write_text(json.dumps(doc))
    report = analyze([f])
    (inp,) = report.inputs
    assert inp["counts"]["bad_records"] == 1 and inp["world_size"] is None and inp["ranks"] == [2]
    from tracediag.ingest.kineto import parse_kineto

    field = bad_fields(parse_kineto(f))["inputs.distributedInfo.world_size"]
    assert field["examples"] == ["'rank 2 of world_size 2'"]


# --- 2. numbers out of range --------------------------------------------------------------------------------


@pytest.mark.parametrize("stamp", ["1" + "0" * 400, "1e400"])
def test_a_metrics_timestamp_beyond_a_float_is_one_bad_sample(tmp_path, stamp):
    """A 400-digit timestamp raised OverflowError inside prometheus_client's parser (it divides by 1000)."""
    from tracediag.ingest.prometheus import parse_prometheus

    lines = PROM.read_text().splitlines()
    i = next(n for n, ln in enumerate(lines) if ln and not ln.startswith("#"))
    lines[i] += f" {stamp}"
    f = tmp_path / "metrics.prom"
    f.write_text("\n".join(lines) + "\n")
    parsed = parse_prometheus(f, 0, IngestOptions())
    assert (
        parsed.tables["metric_samples"].num_rows
        == parse_prometheus(PROM, 0, IngestOptions()).tables["metric_samples"].num_rows - 1
    )
    assert parsed.inputs_rows[0]["bad_records"] == 1 and "metric_samples.timestamp" in bad_fields(parsed)
    r = cli("analyze", "--metrics", f, "-o", tmp_path / "out", "-q")
    assert r.returncode in (0, 1), r.stderr


# --- 3. never-ending inputs ---------------------------------------------------------------------------------

SIDE_FLAGS = ["--log", "--metrics", "--bench", "--nccl-tests", "--topology"]


@pytest.fixture
def fifo(tmp_path) -> Path:
    p = tmp_path / "rank0.pt.trace.json"
    os.mkfifo(p)
    return p


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
@pytest.mark.parametrize("flag", [None, *SIDE_FLAGS, "--model"])
def test_a_named_pipe_is_refused_before_it_is_opened(tmp_path, fifo, flag):
    out = tmp_path / "out"
    args = [fifo] if flag is None else ([HEALTHY, flag, fifo] if flag == "--model" else [flag, fifo])
    t0 = time.monotonic()
    r = cli("analyze", *args, "-o", out, "-q", timeout=60)  # blocked forever before (no writer comes)
    one_error_line(r, fifo, "named pipe", "not a regular file")
    assert time.monotonic() - t0 < 60 and not out.exists()


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="a character device")
@pytest.mark.parametrize("flag", [None, "--log", "--metrics", "--model"])
def test_a_character_device_is_refused(tmp_path, flag):
    zero = Path("/dev/zero")
    args = [zero] if flag is None else ([HEALTHY, flag, zero] if flag == "--model" else [flag, zero])
    r = cli("analyze", *args, "-o", tmp_path / "out", "-q", timeout=60)  # read without end (or OOM) before
    one_error_line(r, zero, "character device")


# --- 4. bounded reads ---------------------------------------------------------------------------------------


def sparse_copy(src: Path, dst: Path, size: int = 3 * GIB) -> Path:
    """The real file, then a hole up to `size` bytes (no disk used: NULs when read)."""
    shutil.copyfile(src, dst)
    with open(dst, "r+b") as f:
        f.truncate(size)
    return dst


@pytest.mark.parametrize(
    ("flag", "seed", "what"),
    [
        ("--metrics", PROM, "metrics file"),
        ("--bench", BENCH, "benchmark result"),
        ("--nccl-tests", NCCL_TESTS, "nccl-tests output"),
        ("--topology", TOPOLOGY, "topology snapshot"),
        ("--model", MODEL, "model config"),
    ],
)
def test_a_side_input_beyond_the_read_budget_is_refused_before_it_is_read(tmp_path, flag, seed, what):
    """A 3 GiB sparse file was read whole (4-5 GB of memory); now one line names the budget and the option."""
    f = sparse_copy(seed, tmp_path / seed.name)
    args = [HEALTHY, flag, f] if flag == "--model" else [flag, f]
    t0 = time.monotonic()
    r = cli("analyze", *args, "-o", tmp_path / "out", "-q", timeout=120)
    one_error_line(r, f, f"{what} is 3 GiB", "64 MiB", "--memory-limit 512 MiB", "raise --memory-limit")
    assert time.monotonic() - t0 < 60


def test_the_read_budget_follows_the_memory_limit(tmp_path):
    from tracediag.inputfile import read_input

    f = sparse_copy(PROM, tmp_path / "metrics.prom", 12 * MIB)
    with pytest.raises(InputError, match="more than the 8 MiB one file may take under --memory-limit 64 MiB"):
        read_input(f, "metrics file", 64 * MIB)
    assert len(read_input(f, "metrics file", 128 * MIB)) == 12 * MIB


def test_the_memory_limit_travels_from_the_command_line_to_the_parser(tmp_path):
    """--memory-limit is a value handed down to the parser (IngestOptions), not a setting of the process: the same
    file is too large under 64 MiB and read under the default."""
    from tracediag import analyze

    f = sparse_copy(PROM, tmp_path / "metrics.prom", 12 * MIB)
    r = cli("analyze", "--metrics", f, "-o", tmp_path / "out", "-q", "--memory-limit", "64MiB")
    assert r.returncode == 2 and "more than the 8 MiB one file may take under --memory-limit 64 MiB" in r.stderr
    with pytest.raises(InputError, match="more than the 8 MiB"):
        analyze([], extra_inputs=[(f, "prometheus")], memory_limit=64 * MIB)
    assert "TRACEDIAG_MEMORY_LIMIT" not in os.environ
    assert analyze([], extra_inputs=[(f, "prometheus")]).inputs[0]["format"] == "prometheus"


def gzip_bomb(seed: Path, dst: Path, expanded: int) -> Path:
    """The real file as one gzip member, then members of its own last line repeated to `expanded` bytes."""
    line = seed.read_bytes().rstrip(b"\n").rsplit(b"\n", 1)[-1] + b"\n"
    block = line * max(1, (4 * MIB) // len(line))
    with open(dst, "wb") as f:
        f.write(gzip.compress(seed.read_bytes()))
        for _ in range(expanded // len(block) + 1):
            f.write(gzip.compress(block, compresslevel=9))
    return dst


def test_a_gzip_bomb_given_as_metrics_stops_at_the_read_budget(tmp_path):
    f = gzip_bomb(PROM, tmp_path / "metrics.prom.gz", 40 * MIB)
    r = cli("analyze", "--metrics", f, "-o", tmp_path / "out", "-q", "--memory-limit", "64MiB")
    one_error_line(r, f, "expands (gzip) to more than 8 MiB", "raise --memory-limit")


def test_a_gzip_bomb_given_as_a_log_stops_at_its_ratio(tmp_path):
    """A streamed log holds a line at a time, but a gzip of one line repeated expands ~1000x: stopped at
    GZIP_MAX_RATIO times the file (beyond the read budget), with the way out (decompress it)."""
    from tracediag.inputfile import GZIP_MAX_RATIO

    f = gzip_bomb(VLLM_LOG, tmp_path / "server.log.gz", 100 * MIB)
    assert f.stat().st_size * GZIP_MAX_RATIO < 100 * MIB
    r = cli("analyze", "--log", f, "-o", tmp_path / "out", "-q", "--memory-limit", "64MiB")
    one_error_line(r, f, f"over {GZIP_MAX_RATIO} times its", "decompress it")


def test_a_real_gzip_log_within_the_ratio_is_read(tmp_path):
    from tracediag.ingest.vllm_log import parse_vllm_log

    f = tmp_path / "server.log.gz"
    f.write_bytes(gzip.compress(VLLM_LOG.read_bytes()))
    assert (
        parse_vllm_log(f, 0, IngestOptions()).inputs_rows[0]["events_total"]
        == parse_vllm_log(VLLM_LOG, 0, IngestOptions()).inputs_rows[0]["events_total"]
    )


def test_a_trace_that_is_a_bracket_and_a_hole_is_refused_with_bounded_memory(tmp_path):
    """`[` then 3 GiB of hole: the chunker found no item end and grew its buffer with the file."""
    f = tmp_path / "rank0.pt.trace.json"
    f.write_bytes(b"[")
    with open(f, "r+b") as fh:
        fh.truncate(3 * GIB)
    # the child's own peak: VmHWM of its address space (ru_maxrss keeps the forking test worker's peak across exec)
    code = (
        "import re, sys\n"
        "from tracediag.ingest.kineto import parse_kineto\n"
        "from tracediag.errors import InputError\n"
        "try:\n    parse_kineto(sys.argv[1])\nexcept InputError as e:\n    print(e)\n"
        "print(re.search(r'VmHWM:\\s+(\\d+) kB', open('/proc/self/status').read()).group(1))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-c", code, str(f)], capture_output=True, text=True, timeout=120, env=env)
    msg, peak_kib = r.stdout.strip().splitlines()
    assert "not valid JSON" in msg and str(f) in msg, r.stdout + r.stderr
    assert int(peak_kib) < 1 << 20, peak_kib  # under 1 GiB (was the whole 3 GiB and more)


def test_a_gzip_trace_followed_by_a_hole_is_read_in_seconds(tmp_path):
    """gzip(1) skips zero padding after a member; Python's GzipFile reads it a byte per call (3 GiB: 25 minutes)."""
    f = sparse_copy(NCCL_TRACE, tmp_path / "rank0.pt.trace.json.gz")
    code = (
        "import sys\nfrom tracediag.ingest.kineto import parse_kineto\n"
        "print(parse_kineto(sys.argv[1]).tables['kernels'].num_rows)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    r = subprocess.run([sys.executable, "-c", code, str(f)], capture_output=True, text=True, timeout=60, env=env)
    from tracediag.ingest.kineto import parse_kineto

    assert r.stdout.strip() == str(parse_kineto(NCCL_TRACE).tables["kernels"].num_rows), r.stderr[-2000:]


def test_a_log_followed_by_a_hole_is_read_in_seconds(tmp_path):
    from tracediag.ingest.vllm_log import parse_vllm_log

    f = sparse_copy(VLLM_LOG, tmp_path / "server.log")
    t0 = time.monotonic()
    parsed = parse_vllm_log(f, 0, IngestOptions())  # 64 MiB "lines" of NULs through every regex before
    assert time.monotonic() - t0 < 30
    meta = json.loads(parsed.inputs_rows[0]["meta_json"])
    assert meta["nul_run_bytes"] == 3 * GIB - VLLM_LOG.stat().st_size
    base = parse_vllm_log(VLLM_LOG, 0, IngestOptions())
    assert parsed.inputs_rows[0]["events_total"] == base.inputs_rows[0]["events_total"]


def test_a_bench_result_beyond_the_budget_is_refused_and_one_within_is_read_as_columns(tmp_path):
    from tracediag.ingest.vllm_bench import parse_vllm_bench

    doc = json.loads(BENCH.read_text())
    n = len(doc["ttfts"])
    per_request = [k for k, v in doc.items() if isinstance(v, list) and len(v) == n]
    big = {k: (v * 2000 if k in per_request else v) for k, v in doc.items()}  # 120,000 requests, ~40 MiB
    f = tmp_path / "result.json"
    f.write_text(json.dumps(big))
    r = cli("analyze", "--bench", f, "-o", tmp_path / "out", "-q", "--memory-limit", "64MiB")
    one_error_line(r, f, "benchmark result is", "more than the 8 MiB", "raise --memory-limit")
    parsed = parse_vllm_bench(f, 0, IngestOptions())  # within the default budget
    assert parsed.tables["bench_requests"].num_rows == n * 2000
    small = parse_vllm_bench(BENCH, 0, IngestOptions()).tables["bench_requests"]
    assert parsed.tables["bench_requests"].slice(0, n).drop(["req"]).equals(small.drop(["req"]))


def nsys_sharing_one_correlation(dst: Path, src: Path = NSYS) -> Path:
    shutil.copyfile(src, dst)
    con = sqlite3.connect(dst)
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"):
        con.execute(f"UPDATE {table} SET correlationId = 7")
    con.commit()
    con.close()
    return dst


def _joined_rows(parsed) -> tuple[int, int]:
    """(kernels, kernels joined to their runtime call on (rank, correlation)) in a store of the parsed input."""
    from tracediag.ingest import load
    from tracediag.store import open_store

    con = open_store()
    try:
        load(con, [parsed])
        kernels = con.execute("SELECT count(*) FROM kernels").fetchone()[0]
        joined = con.execute(
            "SELECT count(*) FROM kernels k JOIN runtime r ON r.rank = k.rank AND r.correlation = k.correlation"
        ).fetchone()[0]
    finally:
        con.close()
    return kernels, joined


def test_an_nsys_export_whose_calls_share_one_correlation_joins_one_to_one(tmp_path):
    """4,010 kernels × 7,466 calls with one correlationId: 30 M rows in every join of the derivations before."""
    from tracediag.ingest.nsys import parse_nsys_sqlite

    parsed = parse_nsys_sqlite(nsys_sharing_one_correlation(tmp_path / "export.sqlite"))
    kernels, joined = _joined_rows(parsed)
    assert joined <= kernels
    field = bad_fields(parsed)["CUPTI_ACTIVITY_KIND_RUNTIME.correlationId"]
    kept = parsed.tables["runtime"].column("correlation").drop_null().to_pylist()
    assert kept == [7] * len(parsed.ranks)  # the first call of each process keeps it; the others are NULL, counted
    assert field["count"] == parsed.tables["runtime"].num_rows - len(kept)


def test_an_nsys_call_recorded_inside_its_wrapper_is_no_bad_record():
    """pipit's export has 38 calls recorded twice, the second record inside the first, with one correlation id:
    the inner call keeps it, quietly; each kernel still joins one call."""
    from tracediag.ingest.nsys import parse_nsys_sqlite

    parsed = parse_nsys_sqlite(NSYS_WRAPPED)
    kernels, joined = _joined_rows(parsed)
    assert joined == kernels == 5
    assert "CUPTI_ACTIVITY_KIND_RUNTIME.correlationId" not in bad_fields(parsed)


def test_a_kineto_trace_whose_calls_share_one_correlation_joins_one_to_one(tmp_path):
    from tracediag.ingest.kineto import parse_kineto

    doc = kineto_doc()
    calls = 0
    for e in doc["traceEvents"]:
        if isinstance(e.get("args"), dict) and "correlation" in e["args"]:
            e["args"]["correlation"] = 7
            calls += e.get("cat") in ("cuda_runtime", "cuda_driver")
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(doc))
    parsed = parse_kineto(f, 0, IngestOptions(memory_limit=8 * MIB))  # several chunks: the ids seen carry over
    kernels, joined = _joined_rows(parsed)
    assert joined <= kernels
    assert bad_fields(parsed)["runtime.args.correlation"]["count"] == calls - 1


# --- 5. logs with a NUL head --------------------------------------------------------------------------------


@pytest.mark.parametrize("head", [100_000, 3 * GIB])
def test_a_vllm_log_that_starts_with_nul_bytes_is_read(tmp_path, head):
    """logrotate copytruncate: the server writes on at its old offset, the file starts with that many NULs (a hole
    of 3 GiB, skipped without reading it)."""
    from tracediag.ingest.vllm_log import parse_vllm_log

    f = tmp_path / "server.log"
    with open(f, "wb") as fh:
        if head < MIB:
            fh.write(b"\x00" * head)
        else:
            fh.truncate(head)
        fh.seek(head)
        fh.write(VLLM_LOG.read_bytes())
    t0 = time.monotonic()
    parsed = parse_vllm_log(f, 0, IngestOptions())  # "not a log: binary content" before
    assert time.monotonic() - t0 < 30
    meta = json.loads(parsed.inputs_rows[0]["meta_json"])
    base = parse_vllm_log(VLLM_LOG, 0, IngestOptions())
    assert meta["nul_head_bytes"] == head
    assert parsed.inputs_rows[0]["events_total"] == base.inputs_rows[0]["events_total"]
    for name, t in base.tables.items():
        assert parsed.tables[name].num_rows == t.num_rows, name


def test_an_sglang_log_with_a_nul_head_given_as_log_is_detected_and_read(tmp_path):
    f = tmp_path / "sglang.log"
    f.write_bytes(b"\x00" * 200_000 + SGLANG_LOG.read_bytes())  # more NULs than the format sniffer reads
    r = cli("analyze", "--log", f, "-o", tmp_path / "out", "-q")
    assert r.returncode in (0, 1), r.stderr
    doc = json.loads((tmp_path / "out" / "findings.json").read_text())
    assert [i["format"] for i in doc["inputs"]] == ["sglang-log"]


def test_a_log_line_beyond_the_read_budget_is_cut_and_counted(tmp_path):
    from tracediag.ingest.sglang_log import parse_sglang_log
    from tracediag.ingest.vllm_log import parse_vllm_log

    # the log readers take the run's budget (IngestOptions.memory_limit): lines of at most 8 MiB under 64 MiB
    lines = VLLM_LOG.read_bytes().split(b"\n")
    lines.insert(2, b"x" * (20 * MIB))
    f = tmp_path / "server.log"
    f.write_bytes(b"\n".join(lines))
    parsed = parse_vllm_log(f, 0, IngestOptions(memory_limit=64 * MIB))
    meta = json.loads(parsed.inputs_rows[0]["meta_json"])
    assert meta["lines_cut"] == 1
    # the default budget (512 MiB: lines of 64 MiB) keeps the 20 MiB line whole
    assert "lines_cut" not in json.loads(parse_vllm_log(f, 0, IngestOptions()).inputs_rows[0]["meta_json"])
    lines = SGLANG_LOG.read_bytes().split(b"\n")
    lines.insert(2, b"x" * (20 * MIB))
    g = tmp_path / "sglang.log"
    g.write_bytes(b"\n".join(lines))
    for limit, cut in ((64 * MIB, 1), (None, 0)):
        meta = json.loads(parse_sglang_log(g, 0, IngestOptions(memory_limit=limit)).inputs_rows[0]["meta_json"])
        assert meta.get("lines_cut", 0) == cut, (limit, meta)
    assert (
        parsed.inputs_rows[0]["events_total"]
        == parse_vllm_log(VLLM_LOG, 0, IngestOptions()).inputs_rows[0]["events_total"]
    )


def test_a_log_of_100000_hard_wrapped_lines_is_joined_in_linear_time(tmp_path):
    """Each line continues the one before (80 columns, lower case): the join copied the whole so far per line."""
    from tracediag.ingest.vllm_log import parse_vllm_log

    f = tmp_path / "server.log"
    f.write_bytes(VLLM_LOG.read_bytes() + (b"x" * 79 + b"\n") * 100_000)
    t0 = time.monotonic()
    parsed = parse_vllm_log(f, 0, IngestOptions())
    assert time.monotonic() - t0 < 30
    assert (
        parsed.inputs_rows[0]["events_total"]
        == parse_vllm_log(VLLM_LOG, 0, IngestOptions()).inputs_rows[0]["events_total"]
    )


# --- 6. wording of nsys errors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "column"),
    [("CUPTI_ACTIVITY_KIND_KERNEL", "deviceId"), ("CUPTI_ACTIVITY_KIND_RUNTIME", "nameId"), ("StringIds", "value")],
)
def test_an_nsys_export_without_a_column_is_refused_naming_table_and_column(tmp_path, table, column):
    f = tmp_path / "export.sqlite"
    shutil.copyfile(NSYS, f)
    con = sqlite3.connect(f)
    con.execute(f'ALTER TABLE "{table}" DROP COLUMN "{column}"')
    con.commit()
    con.close()
    r = cli("analyze", f, "-o", tmp_path / "out", "-q")
    line = one_error_line(r, f, f"table {table} has no column {column}")
    assert "corrupt" not in line


# --- 7. degenerate scale ------------------------------------------------------------------------------------


def test_100000_identical_kernels_in_one_step_analyse_in_seconds(tmp_path):
    """One real kernel and its launch, copied 10^5 times with their correlation id, inside one ProfilerStep: the
    launches sharing the id joined 10^10 rows (past 300 s at 2 × 10^5); each id is now one call's."""
    import copy

    from tracediag.analysis import analyze

    doc = kineto_doc(EXTERNAL / "kineto" / "hta_sampled_rank-0.json.gz")
    events = doc["traceEvents"]
    step = next(e for e in events if str(e.get("name", "")).startswith("ProfilerStep"))
    kernel = next(e for e in events if e.get("cat") == "kernel" and e["ts"] > step["ts"])
    corr = kernel["args"]["correlation"]
    launch = next(e for e in events if e.get("cat") == "cuda_runtime" and e["args"].get("correlation") == corr)
    n = 100_000
    copies = []
    for i in range(n):
        for e, offset, dur in ((launch, 0.0, 1), (kernel, 0.5, 2)):
            c = copy.copy(e)
            c["ts"], c["dur"] = step["ts"] + 1 + 5 * i + offset, dur
            copies.append(c)
    doc["traceEvents"] = [e for e in events if e.get("ph") == "M"] + copies + [step | {"dur": 5 * n + 10}]
    f = tmp_path / "rank0.json"
    f.write_text(json.dumps(doc))
    t0 = time.monotonic()
    report = analyze([f])
    assert time.monotonic() - t0 < 60
    (inp,) = report.inputs
    assert inp["counts"]["kernels"] == n and inp["counts"]["steps"] == 1
    assert inp["counts"]["bad_records"] == n - 1  # the launches that reuse the id


def test_an_nsys_export_with_one_device_per_kernel_analyses_in_seconds(tmp_path):
    """4,010 kernels, each on its own device: 4,010 ranks. The step windows queried every table once per rank
    (26 s); the tables are read once (3 s). The window-fitness rows were then inserted one by one (8 s); now as one
    table."""
    from tracediag.analysis import analyze

    f = tmp_path / "export.sqlite"
    shutil.copyfile(NSYS, f)
    con = sqlite3.connect(f)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = rowid")
    con.commit()
    con.close()
    t0 = time.monotonic()
    report = analyze([f])
    assert time.monotonic() - t0 < 20  # about 7 s here; the per-rank queries and inserts took 26 s and more
    assert len(report.inputs[0]["ranks"]) >= 4010


def test_a_denormal_throughput_in_a_log_is_charted(tmp_path):
    """A stats line whose generation throughput reads 4.9e-324 (a denormal; from a long fuzz run) made the serving
    chart take log10(0) for its axis: a traceback. The analysis now runs to its report."""
    text = VLLM_LOG.read_text()
    first = text.index("Avg generation throughput: ") + len("Avg generation throughput: ")
    value = text[first : text.index(" tokens/s", first)]
    f = tmp_path / "server.log"
    f.write_text(text[:first] + "4.9e-324" + text[first + len(value) :])
    r = cli("analyze", "--log", f, "-o", tmp_path / "out", "-q")
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "out" / "report.html").stat().st_size > 0
