"""The annotated Chrome trace of `tracediag check --annotated-trace`.

Checked here: every finding is a range on exactly the steps / events it is about (times equal to the
store's, to the ns); the file loads back through our Kineto ingester with the same events; no track
gains a partially overlapping slice (Perfetto drops those as `slice_drop_overlapping_complete_event`,
see Perfetto's docs/faq.md); and, when a trace_processor binary is available, Perfetto's own trace
processor imports it (the `perfetto` package downloads that binary on first use, which cannot happen
offline: set PERFETTO_TRACE_PROCESSOR to a trace_processor_shell to run that part).
"""

from __future__ import annotations

import gzip
import json
from collections import Counter, defaultdict
from decimal import Decimal
from pathlib import Path

import duckdb
import orjson
import pytest
import typer
from conftest import SAMPLES, kineto_file
from typer.testing import CliRunner

from tracediag.analysis import analyze
from tracediag.cli import check as check_cmd
from tracediag.gate.annotate import us, write_annotated_trace
from tracediag.ingest.kineto import parse_kineto

FP32 = SAMPLES / "fault_fp32_comm_tp2"


def ns(v) -> int:
    return int(Decimal(str(v)) * 1000)


def load_exact(path: Path) -> list[dict]:
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    doc = json.loads(raw, parse_float=Decimal)
    return doc["traceEvents"] if isinstance(doc, dict) else doc


def partial_overlaps(events: list[dict]) -> int:
    """X events per (pid, tid) that start inside another and end after it (not properly nested)."""
    by_track = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and "ts" in e:
            t0 = ns(e["ts"])
            by_track[(e.get("pid"), e.get("tid"))].append((t0, t0 + ns(e.get("dur", 0))))
    bad = 0
    for spans in by_track.values():
        stack: list[int] = []
        for start, end in sorted(spans, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1] <= start:
                stack.pop()
            if stack and end > stack[-1]:
                bad += 1
                continue
            stack.append(end)
    return bad


def cli(*args):
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @app.callback()
    def _main() -> None:
        """tracediag (commands under test)."""

    check_cmd.register(app)
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def fp32_annotated(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("annotate")
    out, trace = tmp / "out", tmp / "annotated.json"
    r = cli("check", FP32, "-m", FP32 / "config.json", "--out", out, "--annotated-trace", trace)
    assert r.exit_code == 1, r.stdout + r.stderr
    assert f"annotated trace: {trace}" in r.stdout
    return trace, out


def test_us_is_exact():
    assert orjson.dumps(us(5105400142122189)) == b"5105400142122.189"
    assert orjson.dumps(us(7)) == b"0.007"
    assert orjson.dumps(us(-1500)) == b"-1.500"


def test_finding_ranges_cover_its_steps_and_evidence(fp32_annotated):
    trace, out = fp32_annotated
    events = load_exact(trace)
    ours = [e for e in events if e.get("cat") == "tracediag" and e["ph"] == "X"]
    col002 = [e for e in ours if e["name"].startswith("COL002 warning: All-reduce runs in fp32")]
    con = duckdb.connect(str(out / "trace.duckdb"), read_only=True)
    steps = con.execute("SELECT rank, step_id, ts_ns, dur_ns FROM steps ORDER BY rank, step_id").fetchall()
    assert len(col002) == len(steps) == 14  # 7 steps on each of 2 ranks: every step carries fp32 all-reduces
    assert sorted((ns(e["ts"]), ns(e["dur"])) for e in col002) == sorted((s[2], s[3]) for s in steps)
    assert all(e["args"]["severity"] == "warning" and "row" in e["args"] for e in col002)
    # evidence: the example calls, at the collective's exact start and duration
    findings = json.loads((out / "findings.json").read_text())["findings"]
    evidence = next(f for f in findings if f["rule"] == "COL002")["evidence"]
    marked = [e for e in ours if e["name"].startswith("COL002 evidence")]
    assert len(marked) == len(evidence) == 5
    for ev, m in zip(evidence, sorted(marked, key=lambda e: ns(e["ts"]))):
        dur = con.execute(
            "SELECT dur_ns FROM collectives WHERE rank = ? AND ts_ns = ?", [ev["rank"], ev["ts_ns"]]
        ).fetchone()[0]
        assert (ns(m["ts"]), ns(m["dur"])) == (ev["ts_ns"], dur)
    # steps track on each rank, processes named per rank
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"rank 0 · tracediag findings", "rank 1 · tracediag findings"} <= names
    assert any(n.startswith("rank 0 · host pid ") for n in names)
    con.close()


def test_no_partial_overlaps_added(fp32_annotated):
    trace, _ = fp32_annotated
    events = load_exact(trace)
    assert partial_overlaps([e for e in events if e.get("cat") == "tracediag"]) == 0
    original = sum(partial_overlaps(load_exact(p)) for p in sorted(FP32.glob("rank*.json.gz")))
    assert partial_overlaps(events) <= original


def test_loads_back_through_kineto_ingester(fp32_annotated):
    trace, out = fp32_annotated
    parsed = parse_kineto(trace)
    con = duckdb.connect(str(out / "trace.duckdb"), read_only=True)
    for table in ("cpu_ops", "annotations"):
        stored = Counter(con.execute(f"SELECT name, ts_ns, dur_ns FROM {table}").fetchall())
        t = parsed.tables[table]
        again = Counter(
            zip(t.column("name").to_pylist(), t.column("ts_ns").to_pylist(), t.column("dur_ns").to_pylist())
        )
        assert again == stored, table
    dims = parsed.tables["cpu_ops"].column("input_dims").to_pylist()
    assert sum(1 for d in dims if d) == con.execute("SELECT count(input_dims) FROM cpu_ops").fetchone()[0]
    con.close()


def test_gpu_trace_kernels_runtime_flows_round_trip(tmp_path):
    # A real A100 trace (NCCL kernels with collective args, runtime calls, ac2g flows). No rule finds
    # anything on it without a model, so the finding here is a stand-in built from one of its kernels.
    src = kineto_file("hta_a100_rank0of2_nccl_args.json.gz")
    db = tmp_path / "trace.duckdb"
    analyze([src], db_path=db)
    con = duckdb.connect(str(db), read_only=True)
    k = con.execute(
        "SELECT rank, ts_ns, dur_ns, name FROM kernels WHERE klass = 'collective' ORDER BY dur_ns DESC LIMIT 1"
    ).fetchone()
    finding = {
        "rule": "TEST",
        "step": 3,
        "status": "finding",
        "severity": "info",
        "title": "stand-in finding on the longest collective kernel",
        "values": {},
        "evidence": [{"rank": k[0], "step": None, "ts_ns": k[1], "name": k[3]}],
    }
    trace = tmp_path / "annotated.json"
    stats = write_annotated_trace(db, [finding], trace)
    events = load_exact(trace)
    assert stats["events"] == len(events)
    mark = next(e for e in events if e.get("cat") == "tracediag" and e["name"].startswith("TEST evidence"))
    assert (ns(mark["ts"]), ns(mark["dur"])) == (k[1], k[2])
    whole = [e for e in events if e.get("cat") == "tracediag" and e["name"].startswith("TEST info")]
    assert len(whole) == 1 and whole[0]["args"]["scope"] == "whole trace"
    parsed = parse_kineto(trace)
    for table in ("kernels", "runtime", "memops", "flows", "cpu_ops", "annotations"):
        n = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        got = parsed.tables[table].num_rows if table in parsed.tables else 0
        assert got == n, table
    kern = parsed.tables["kernels"]
    assert sorted(kern.column("correlation").to_pylist(), key=str) == sorted(
        (r[0] for r in con.execute("SELECT correlation FROM kernels").fetchall()), key=str
    )
    assert partial_overlaps([e for e in events if e.get("cat") == "tracediag"]) == 0
    assert partial_overlaps(events) <= partial_overlaps(load_exact(src))
    con.close()


def test_nsys_export_round_trips(tmp_path):
    # An Nsight Systems export (2×H100, nsys-ai fixtures) written as one Chrome trace: both ranks, NVTX
    # ranges as Kineto user annotations.
    from conftest import EXTERNAL

    from tracediag.ingest import parser_for

    src = EXTERNAL / "nsys" / "nsysai_2xh100_after.sqlite"
    parser_for("nsys-sqlite")
    db = tmp_path / "trace.duckdb"
    analyze([src], db_path=db)
    trace = tmp_path / "annotated.json"
    write_annotated_trace(db, [], trace)
    parsed = parse_kineto(trace)
    con = duckdb.connect(str(db), read_only=True)
    for table in ("kernels", "runtime", "memops", "cpu_ops", "annotations"):
        n = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        assert (parsed.tables[table].num_rows if table in parsed.tables else 0) == n, table
    ranks = con.execute("SELECT count(DISTINCT rank) FROM kernels").fetchone()[0]
    names = {e["args"]["name"] for e in load_exact(trace) if e["ph"] == "M" and e["name"] == "process_name"}
    assert sum(1 for n in names if n.endswith("tracediag findings")) == ranks == 2
    con.close()
