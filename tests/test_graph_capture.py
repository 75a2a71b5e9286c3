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


def test_unattributed_share_without_the_capture(counted):
    per_launch, _, replayed = counted
    path = {p.name: str(p) for p in real_traces.TRACES}[REPLAY]
    g = _report(path)["fitness"]["graph_replay"]
    assert g["graph_launches"] == len(per_launch) == 25 and g["replayed_kernels"] == sum(per_launch) == 361
    assert g["unattributed_share"] == pytest.approx(replayed, abs=1e-4) and "--graph-capture" in g["why"]
    assert "96.1% of GPU kernel time" in g["why"]


def test_capture_attributes_every_replayed_kernel(counted):
    per_launch, per_capture, _ = counted
    assert per_capture == per_launch == [4] + [15] * 23 + [12]  # the same graphs, in the same order
    g = analyze([kineto_file(REPLAY)], settings=Settings(graph_capture=str(CAPTURE))).fitness["graph_replay"]
    assert (g["graphs_matched"], g["graphs_unmatched"], g["kernels_attributed"]) == (25, 0, 361)
    assert g["unattributed_share"] == 0
    ops = {o["op"]: o for o in g["by_op"]}
    assert g["by_op"][0]["op"] == "vllm::moe_forward" and ops["vllm::moe_forward"]["kernels"] == 72  # 3 per layer
    assert ops["aten::addmm"]["kernels"] == 72 and ops["_C::rotary_embedding"]["kernels"] == 24


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
