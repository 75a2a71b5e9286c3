"""Kernels replayed from HIP graphs, and their capturing ops (tracediag/derive/graph_capture.py), on the vendored
vLLM gpt-oss pair from TraceLens: the replay (one mixed step, 25 `hipGraphLaunch`) and the trace of its
piecewise graph capture (tests/data/external/kineto/capture/, batch size 8192)."""

from __future__ import annotations

import gzip
import json

import pytest
import real_traces
from conftest import REPO, kineto_file
from test_real_traces_doc import _report

from tracediag.analysis import analyze
from tracediag.context import Settings
from tracediag.errors import InputError

REPLAY = "tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz"
CAPTURE = kineto_file("capture/tracelens_mi300x_vllm_gptoss_piecewise_graph_capture_rank0.pt.trace.json.gz")
CONFIG = REPO / "tests" / "data" / "configs" / "openai__gpt-oss-20b.config.json"  # H 2880, 24 layers, 32 experts


def _events(path):
    with gzip.open(path, "rt") as f:
        return [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]


@pytest.fixture(scope="module")
def counted():
    """Straight from the files: kernels per graph launch (replay, launch order) and launch calls per capture."""
    rep = _events(kineto_file(REPLAY))
    launches = sorted((e for e in rep if e["name"] == "hipGraphLaunch"), key=lambda e: e["ts"])
    kernels = [e for e in rep if e.get("cat") == "kernel"]
    per_launch = [[k for k in kernels if k["args"]["correlation"] == g["args"]["correlation"]] for g in launches]
    cap = _events(CAPTURE)
    begins = sorted(e["ts"] for e in cap if e["name"] == "hipStreamBeginCapture")
    ends = sorted(e["ts"] for e in cap if e["name"] == "hipStreamEndCapture")
    calls = [e for e in cap if e["name"] in ("hipLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel")]
    per_capture = [sum(b <= c["ts"] <= e for c in calls) for b, e in zip(begins, ends)]
    replayed = sum(k["dur"] for ks in per_launch for k in ks) / sum(k["dur"] for k in kernels)
    return [len(ks) for ks in per_launch], per_capture, replayed


@pytest.fixture(scope="module")
def with_capture():
    """The pair analysed with the capture and the served model's config."""
    return analyze([kineto_file(REPLAY)], model=CONFIG, settings=Settings(graph_capture=str(CAPTURE)))


def test_unattributed_share_without_the_capture(counted):
    per_launch, _, replayed = counted
    path = {p.name: str(p) for p in real_traces.TRACES}[REPLAY]
    g = _report(path)["fitness"]["graph_replay"]
    assert g["graph_launches"] == len(per_launch) == 25 and g["replayed_kernels"] == sum(per_launch) == 361
    assert g["unattributed_share"] == pytest.approx(replayed, abs=1e-4) and "--graph-capture" in g["why"]
    assert "96.1% of GPU kernel time" in g["why"]


def test_capture_attributes_every_replayed_kernel(counted, with_capture):
    per_launch, per_capture, _ = counted
    assert per_capture == per_launch == [4] + [15] * 23 + [12]  # the same graphs, in the same order
    g = with_capture.fitness["graph_replay"]
    assert (g["graphs_matched"], g["graphs_unmatched"], g["kernels_attributed"]) == (25, 0, 361)
    assert g["unattributed_share"] == 0
    ops = {o["op"]: o for o in g["by_op"]}
    assert g["by_op"][0]["op"] == "vllm::moe_forward" and ops["vllm::moe_forward"]["kernels"] == 72  # 3 per layer
    assert ops["aten::addmm"]["kernels"] == 72 and ops["_C::rotary_embedding"]["kernels"] == 24


def test_shp002_sees_the_captured_gemm_shapes(with_capture):
    """The replay's only GEMM op with shapes is lm_head (outside the graphs); the 72 `aten::addmm` the capture
    recorded with Input Dims (qkv, o_proj and router of 24 layers, under `aten::linear`) reach SHP002 through the
    graph launches that replayed them."""
    captured = [e for e in _events(CAPTURE) if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm"]
    assert len(captured) == 72 and all(e["args"].get("Input Dims") for e in captured)
    without = analyze([kineto_file(REPLAY)], model=CONFIG)
    shp = {c.rule: c for c in without.checks}["SHP002"]
    assert (shp.values["hidden_size_gemm_calls"], shp.values["gemm_shapes_distinct"]) == (1, 1)
    shp = {c.rule: c for c in with_capture.checks}["SHP002"]
    assert shp.status == "pass" and (shp.values["hidden_size_gemm_calls"], shp.values["matched_calls"]) == (73, 73)
    roles = {(r["K"], r["N"]): (r["role"], r["calls"], r["example_op"]) for r in shp.table}
    assert roles[(2880, 5120)] == ("qkv_proj (fused)", 24, "aten::addmm")  # (64 + 2·8)·64 at p = 1
    assert roles[(4096, 2880)] == ("o_proj", 24, "aten::addmm")
    assert roles[(2880, 32)] == ("router (replicated)", 24, "aten::addmm")


def test_a_capture_of_other_graphs_attributes_nothing():
    """The SGLang B300 decode replays one graph of 713 kernels; the vLLM capture's first graph holds 4: no match,
    nothing guessed."""
    g = analyze(
        [kineto_file("tracelens_b300_sglang_qwen3-30b-a3b_moe_decode_cudagraph.json.gz")],
        settings=Settings(graph_capture=str(CAPTURE)),
    ).fitness["graph_replay"]
    assert (g["graphs_matched"], g["graphs_unmatched"], g["kernels_attributed"]) == (0, 1, 0)
    assert g["unattributed_share"] == pytest.approx(g["replayed_share"])


def test_a_capture_that_is_no_trace_is_a_one_line_error():
    bad = REPO / "tests" / "data" / "external" / "nccl-tests" / "h100x2_all_reduce_perf.txt"
    with pytest.raises(InputError, match="graph-capture trace is not valid JSON") as e:
        analyze([kineto_file(REPLAY)], settings=Settings(graph_capture=str(bad)))
    assert str(bad) in str(e.value)


def test_the_capture_is_matched_once_per_analysis(monkeypatch):
    """The GEMM overlay and the window summary both read the match: it is made once per connection and capture file
    (it was made three times, 0.2 s each, on this pair), and a second analysis makes its own."""
    from tracediag.derive import graph_capture

    calls = []
    real = graph_capture._attribute
    monkeypatch.setattr(graph_capture, "_attribute", lambda con, path: calls.append(path) or real(con, path))
    first = analyze([kineto_file(REPLAY)], settings=Settings(graph_capture=str(CAPTURE)))
    assert len(calls) == 1 and first.fitness["graph_replay"]["kernels_attributed"] == 361
    second = analyze([kineto_file(REPLAY)], settings=Settings(graph_capture=str(CAPTURE)))
    assert len(calls) == 2 and second.fitness["graph_replay"] == first.fitness["graph_replay"]


def _mutated(tmp_path, name, change):
    """The real capture with one kind of malformed event (what a hostile or broken producer writes)."""
    with gzip.open(CAPTURE, "rt") as f:
        doc = json.load(f)
    change([e for e in doc["traceEvents"] if e.get("ph") == "X"])
    out = tmp_path / f"{name}.json"
    out.write_text(json.dumps(doc))
    return out


def _nth(events, n, cat=None, name=None):
    """The n-th event of a category or name: each mutation below hits an event of its own."""
    return [e for e in events if (cat is None or e.get("cat") == cat) and (name is None or e["name"] == name)][n]


def _deep(n):
    v = [1]
    for _ in range(n):
        v = [v]
    return v


HOSTILE = {  # kind -> the mutation of one event of the real capture
    "args a string": lambda es: _nth(es, 0, "cpu_op").__setitem__("args", "not an object"),
    "External id a list": lambda es: _nth(es, 1, "cpu_op")["args"].__setitem__("External id", [1, 2]),
    "dur a string": lambda es: _nth(es, 2, "cpu_op").__setitem__("dur", "12"),
    "name an int": lambda es: _nth(es, 3, "cpu_op").__setitem__("name", 7),
    "ts a string": lambda es: _nth(es, 0, name="hipLaunchKernel").__setitem__("ts", "1"),
    "kernel name an object": lambda es: _nth(es, 1, name="hipLaunchKernel")["args"].__setitem__("kernel", {"a": 1}),
    "Input Dims 400 deep": lambda es: _nth(es, 0, "cpu_op", "aten::addmm")["args"].__setitem__(
        "Input Dims", _deep(400)
    ),
}


@pytest.fixture(scope="module")
def replay_store(tmp_path_factory):
    db = tmp_path_factory.mktemp("replay") / "trace.duckdb"
    analyze([kineto_file(REPLAY)], db_path=str(db))
    return db


def test_malformed_capture_events_are_counted_not_an_internal_error(tmp_path, replay_store):
    """Each field the matching reads is checked for its type (one event of each kind of HOSTILE, each its own):
    every one is left out and counted in capture_bad_records, the other captures still match (the replay's store
    matched against the mutated capture as an analysis does)."""
    import duckdb

    from tracediag.derive import graph_capture

    bad = _mutated(tmp_path, "hostile", lambda es: [change(es) for change in HOSTILE.values()])
    con = duckdb.connect(str(replay_store))
    try:
        g = graph_capture.statement(con, str(bad))
    finally:
        con.close()
    assert g["capture_read"] and g["capture_bad_records"] == len(HOSTILE)
    assert g["graphs_matched"] + g["graphs_unmatched"] == 25 and g["graphs_matched"] >= 20


def test_a_replay_without_graph_launches_does_not_read_the_capture(monkeypatch):
    """The H100 HF trace launches no graph: the capture given beside it is not opened (an unreadable path proves it)."""
    from tracediag.derive import graph_capture

    monkeypatch.setattr(graph_capture, "_read_capture", lambda p: pytest.fail("the capture was read"))
    report = analyze(
        [kineto_file("tracelens_h100_hf_qwen1.5-0.5b.json.gz")], settings=Settings(graph_capture=str(CAPTURE))
    )
    assert report.fitness.get("graph_replay") is None


def test_matching_is_n_log_n_in_captures_and_launches():
    """20,000 captures of 10 launches each, matched to nothing: the launches inside each capture found by bisection,
    in well under the time the pairwise scan took (over two minutes for 20k × 200k)."""
    import time

    from tracediag.derive import graph_capture

    events = []
    for i in range(20_000):
        t = i * 100.0
        events.append({"ph": "X", "name": "hipStreamBeginCapture", "ts": t, "dur": 1})
        events += [{"ph": "X", "name": "hipLaunchKernel", "ts": t + 1 + j, "dur": 1, "args": {"kernel": "k"}}
                   for j in range(10)]  # fmt: skip
        events.append({"ph": "X", "name": "hipStreamEndCapture", "ts": t + 50, "dur": 1})
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "captures.json"
        p.write_text(json.dumps({"traceEvents": events}))
        start = time.process_time()
        caps = graph_capture._read_capture(p)
        took = time.process_time() - start
    assert len(caps) == 20_000 and all(len(c) == 10 for c in caps) and took < 10
