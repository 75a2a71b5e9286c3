"""KRN006's longest GPU gap attributed to the host work that covers it (tracediag/analyses/host_gaps.py), on
vendored real traces; the shares are checked against the spans read straight from each file."""

from __future__ import annotations

import functools
import gzip
import json
import sqlite3

from conftest import REPO, kineto_file

from tracediag.analysis import analyze

NSYS = REPO / "tests" / "data" / "external" / "nsys"


@functools.cache
def _krn006(path: str, keep_python: bool = False):
    (c,) = [c for c in analyze([path], keep_python=keep_python).checks if c.rule == "KRN006"]
    return c


def _covered(spans: list[tuple[int, int]], t0: int, t1: int) -> int:
    """Union of the spans clipped to [t0, t1)."""
    total, end = 0, t0
    for s, e in sorted((max(s, t0), min(e, t1)) for s, e in spans if s < t1 and e > t0):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def test_mpi_gap_is_blamed_on_the_nvtx_ranges_that_cover_it_not_on_cudamalloc():
    """pipit saxpy: a 196 ms gap. Before: "host work in the longest gap (196 ms): cudaMalloc, cudaMalloc,
    cudaMalloc" — any three calls overlapping it, 1.86 ms of cudaMalloc in all. The MPI_Recv and MPI_Send NVTX
    ranges cover 58 ms of it, and no recorded span covers the rest."""
    c = _krn006(str(NSYS / "pipit_saxpy_mpi_nvtx.sqlite"))
    att = c.values["longest_gap"]["host_attribution"]
    t0, t1 = att["ts_ns"], att["ts_ns"] + att["gap_ns"]
    con = sqlite3.connect(f"file:{NSYS / 'pipit_saxpy_mpi_nvtx.sqlite'}?mode=ro", uri=True)
    try:
        ranges = con.execute(
            "SELECT coalesce(text, (SELECT value FROM StringIds WHERE id = textId)), start, end FROM NVTX_EVENTS "
            "WHERE end IS NOT NULL"
        ).fetchall()
    finally:
        con.close()
    want = {n: _covered([(s, e) for m, s, e in ranges if m == n], t0, t1) for n in ("MPI_Recv", "MPI_Send")}
    assert 57e6 < sum(want.values()) < 59e6
    got = {s["name"]: s["covered_ns"] for s in att["spans"]}
    assert got == want  # cudaMalloc (< 1 % of the gap) is not named
    assert "cudaMalloc" not in c.title and "MPI_Recv (NVTX range) 18%, MPI_Send (NVTX range) 11% of the gap" in c.title
    assert att["covered_share"] < 0.5 and "70% untraced host time" in c.title
    assert any(e["name"] == "untraced host time" for e in c.evidence)
    assert "NVTX ranges around the host loop" in c.next_check


def test_ddp_gap_names_the_innermost_op_and_the_op_around_it():
    """A100 DDP rank: a 15.7 ms gap inside aten::unflatten_dense_tensors, which spends most of it in 106
    aten::narrow calls; the shares are the ops' own time in the gap, counted from the JSON."""
    path = kineto_file("hta_a100_rank0of2_nccl_args.json.gz")
    att = _krn006(str(path)).values["longest_gap"]["host_attribution"]
    t0, t1 = att["ts_ns"], att["ts_ns"] + att["gap_ns"]
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    ops = [e for e in events if e.get("cat") == "cpu_op" and str(e.get("tid")) == att["thread"]]

    def share(name: str) -> float:
        us = [(e["ts"], e["ts"] + e["dur"]) for e in ops if e["name"] == name]
        return _covered([(round(s * 1000), round(e * 1000)) for s, e in us], t0, t1) / att["gap_ns"]

    lead, around = att["spans"][:2]
    assert (lead["name"], around["name"]) == ("aten::narrow", "aten::unflatten_dense_tensors")
    assert abs(lead["share_of_gap"] - share("aten::narrow")) < 0.002
    assert abs(around["share_of_gap"] - share("aten::unflatten_dense_tensors")) < 0.002
    assert att["covered_share"] > 0.95


def test_python_frames_are_used_when_kept_and_suggested_when_left_out():
    """SGLang B300 decode: the trace holds 2,142 Python frames. Without --keep-python the advice says so; with
    it, the Python frame around the graph launch that covers the gap is named."""
    path = kineto_file("tracelens_b300_sglang_qwen3-30b-a3b_moe_decode_cudagraph.json.gz")
    with gzip.open(path, "rt") as f:
        frames = sum(1 for e in json.load(f)["traceEvents"] if e.get("cat") == "python_function")
    assert frames == 2142
    kept = _krn006(str(path), keep_python=True).values["longest_gap"]["host_attribution"]
    assert kept["python_frames"] and kept["spans"][0]["name"] == "cudaGraphLaunch"
    assert kept["spans"][1]["kind"] == "python" and kept["spans"][1]["role"] == "around it"
    skipped = _krn006(str(path)).values["longest_gap"]["host_attribution"]
    assert not skipped["python_frames"] and skipped["spans"][0]["name"] == "cudaGraphLaunch"
    assert skipped["advice"].startswith("Run tracediag with --keep-python: the trace holds 2,142 Python frames")


def test_idle_over_the_whole_trace_of_a_non_llm_program_is_a_rate_and_heads_the_verdict():
    """pipit saxpy (MPI + CUDA, no step markers, no prefill or decode): its one 'step' is the whole trace, so GPU idle
    66 % of it is no one-step sample of an engine loop. Before: info with the one-step caveat, and copies at 26 % of
    the window headed the verdict; now a warning that heads it, on the same basis."""
    r = analyze([str(NSYS / "pipit_saxpy_mpi_nvtx.sqlite")])
    c = {c.rule: c for c in r.checks}
    idle, copies = c["KRN006"], c["KRN011"]
    assert idle.severity == "warning" and idle.confidence == "high" and "one_step_caveat" not in idle.values
    assert idle.impact_basis == copies.impact_basis == "the window's step time"
    assert idle.impact > 0.6 > 0.3 > copies.impact
    assert r.verdict["rule"] == "KRN006" and r.verdict["status"] == "problem"
