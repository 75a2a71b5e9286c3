"""The fitness stage before the rules (tracediag/derive/fitness.py), on vendored real traces: each class of window,
the segments, the store table, the rules it stops, the `inconclusive` verdict, the severity floor and the report
header that states it."""

from __future__ import annotations

import functools
from dataclasses import replace

import duckdb
import pytest
from conftest import REPO, kineto_file

from tracediag.analysis import analyze
from tracediag.findings import Check, below_floor, severity_follows_impact, verdict
from tracediag.reports.html import render_html
from tracediag.reports.terminal import verdict_lines

NSYS = REPO / "tests" / "data" / "external" / "nsys"


@functools.cache
def _report(path: str):
    return analyze([path])


def _check(report, rule: str):
    (c,) = [c for c in report.checks if c.rule == rule]
    return c


def test_sampled_rank_is_judged_sampled_on_its_id_gaps():
    r = _report(str(kineto_file("hta_sampled_rank-0.json.gz")))
    f = r.fitness
    assert f["class"] == "sampled" and not f["fit"]
    (rank,) = f["ranks"]
    assert rank["external_id_gap_median"] == 4 and rank["external_id_gap_p90"] == 50
    assert rank["correlation_gap_median"] == 36
    # idle gaps, overlap and counts of a sample are not the window's: the rules that need them say why
    for rule in ("KRN006", "COL004", "KRN008", "KRN011"):
        c = _check(r, rule)
        assert c.status == "not_applicable" and c.reason.startswith("window unfit: sampled"), rule
    # which kernels ran is true of a sample too
    assert _check(r, "KRN009").status == "finding"


def test_sampled_window_verdict_is_inconclusive_with_what_to_recapture():
    d = _report(str(kineto_file("hta_sampled_rank-1.json.gz"))).to_dict()
    v = d["verdict"]
    assert v["status"] == "inconclusive" and v["window"] == "sampled"
    assert "neither a problem nor its absence" in v["headline"] and "median of 37" in v["headline"]
    assert "schedule(wait=" in v["next_check"] and "--profiler-config" in v["next_check"]
    assert "VLLM_TORCH_PROFILER_DIR" in v["next_check"] and v["next_check"].startswith("Without sampling")
    assert "rule" not in v  # no cause is named: the window cannot show one
    assert d["fitness"]["class"] == "sampled"  # findings.json carries the class, its numbers and the advice
    assert d["fitness"]["recapture"] == v["next_check"]


def test_gpu_job_without_device_events_is_gpu_stripped():
    r = _report(str(kineto_file("hta_rank_not_found.json.gz")))
    assert r.fitness["class"] == "gpu_stripped"
    assert r.fitness["ranks"][0]["backend"] == "nccl" and r.fitness["ranks"][0]["gpu_events"] == 0
    # before: "Unfused elementwise work takes 14% of step time" from CPU op durations of a GPU job
    assert _check(r, "KRN008").status == "not_applicable"
    assert r.verdict["status"] == "inconclusive"


def test_two_event_trace_is_too_short_and_inconclusive():
    r = _report(str(kineto_file("hta_large_integer.pt.trace.json.gz")))
    assert r.fitness["class"] == "too_short" and r.fitness["ranks"][0]["events"] == 2
    # before: "Collectives are on the critical path ... 100.0% of step time" (warning)
    assert _check(r, "COL004").status == "not_applicable"
    assert r.verdict["status"] == "inconclusive"


def test_two_kernel_program_is_start_up_only():
    r = _report(str(NSYS / "nsysai_rtx3080_minimal.sqlite"))
    f = r.fitness
    assert f["class"] == "startup_only" and f["ranks"][0]["steady_kernels"] == 0
    # before: "launch-bound ... capture the step in CUDA graphs" for a program of two cold launches
    assert _check(r, "KRN006").status == "not_applicable"
    # a window of start-up only shows nothing of the run: the verdict says so and what to re-capture (before: the
    # verdict was KRN010's "Cold window ... 17% of the profiled span" warning, as if the run lost 17 %)
    assert r.verdict["status"] == "inconclusive" and r.verdict["window"] == "startup_only"
    assert "schedule(skip_first=" in r.verdict["next_check"]
    c = _check(r, "KRN010")
    assert c.severity == "info" and c.title.startswith("The window is start-up only, nothing steady to measure")
    assert "KRN010" in [a["rule"] for a in r.verdict["also"]]
    # its cold launches are the first (and only) launch of each kernel: counted from the file, not by tracediag
    launches = [e for e in c.evidence if e["kind"].startswith("kernel launch")]
    firsts = _first_launch_starts(NSYS / "nsysai_rtx3080_minimal.sqlite")
    assert len(launches) == 2 and {e["kernel"] for e in launches} == set(firsts)


def test_a_window_mostly_start_up_is_inconclusive_and_its_steady_part_still_measured():
    # HTA's A100 simple_add: 41.1 s of stream creation, frees and first launches, then 2.1 ms of kernels
    r = _report(str(kineto_file("hta_a100_simple_add.json.gz")))
    f = r.fitness
    rank = f["ranks"][0]
    assert f["class"] == "startup_dominated" and not f["fit"]
    assert rank["startup_ns"] >= 0.75 * rank["trace_ns"] and rank["steady_kernels"] == 9
    # before: the verdict was KRN010's "Cold window: start-up work takes 37.9 s = 91% of the profiled span" warning,
    # a cost of the capture put at the head of a ticket as if the run paid it
    assert r.verdict["status"] == "inconclusive" and r.verdict["window"] == "startup_dominated"
    assert "schedule(skip_first=" in r.verdict["next_check"]
    c = _check(r, "KRN010")
    assert c.severity == "info" and c.title.startswith("The window is mostly start-up, too little steady work")
    assert "KRN010" in [a["rule"] for a in r.verdict["also"]]
    # the steady segment is still there to measure: a rule that needs a steady window runs on it
    assert _check(r, "KRN006").status == "pass"


def _launches(path) -> list[tuple[int, str, int, int]]:
    """(pid, kernel name, launch start, launch duration) of every kernel launch in an nsys export, read with sqlite3
    (not tracediag), in launch order."""
    import sqlite3

    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return con.execute(
            "SELECT k.globalPid, s.value, r.start, r.end - r.start FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
            "JOIN CUPTI_ACTIVITY_KIND_KERNEL k ON k.correlationId = r.correlationId AND "
            "k.globalPid = (r.globalTid >> 24) << 24 JOIN StringIds s ON s.id = k.demangledName ORDER BY r.start"
        ).fetchall()
    finally:
        con.close()


def _first_launch_starts(path) -> dict[str, int]:
    first: dict[str, int] = {}
    for _pid, name, ts, _ in _launches(path):
        first.setdefault(name, ts)
    return first


def test_slow_launch_of_a_kernel_that_ran_before_is_not_start_up():
    """nsysai_2xh100_after: two launches of 1.26 and 1.55 ms with the GPU idle, of elementwise kernels launched 295
    and 45 times before on their rank. Before: KRN010 counted them as "kernel launch of ≥ 1 ms with the GPU idle
    (lazy module loading or JIT at first launch) 2.81 ms" and KRN006 kept their idle time out as start-up."""
    path = NSYS / "nsysai_2xh100_after.sqlite"
    seen: dict[tuple[int, str], int] = {}
    slow_repeats = []
    for pid, name, _ts, dur in _launches(path):
        if dur >= 1_000_000 and seen.get((pid, name), 0):
            slow_repeats.append((seen[(pid, name)], dur))
        seen[(pid, name)] = seen.get((pid, name), 0) + 1
    # three slow launches of kernels that ran before; the third (5 earlier launches) waited while the GPU was busy
    assert sorted(n for n, _ in slow_repeats) == [5, 45, 295]
    r = _report(str(path))
    c = _check(r, "KRN010")
    assert not any(k.startswith("kernel launch") for k in c.values["by_kind_ns"])
    assert c.values["slow_repeat_launches"] == 2
    assert c.values["slow_repeat_launch_ns"] == sum(d for n, d in slow_repeats if n in (45, 295))
    assert "host contention or a full launch queue" in c.title
    stalls = [e for e in _check(r, "KRN006").evidence if "ran before" in e.get("kind", "")]
    assert stalls and all(e["kind"].startswith("host-blocking stall: slow launch of a kernel") for e in stalls)


def test_window_cut_from_a_run_is_clipped_and_fit():
    r = _report(str(NSYS / "nsysai_2xh100_after.sqlite"))
    assert r.fitness["class"] == "clipped" and r.fitness["fit"]
    assert [x["launched_before_window"] for x in r.fitness["ranks"]] == [8, 8]
    assert r.verdict["status"] == "problem"


def test_cpu_sample_is_fit_and_unchanged():
    r = analyze([REPO / "sample_traces" / "healthy_tp2"])
    assert r.fitness["class"] == "cpu_only" and r.fitness["fit"]
    assert all(not (c.reason or "").startswith("window unfit") for c in r.checks)


def test_start_up_segment_holds_the_cold_calls_and_krn006_ignores_them():
    """simple_add: a 24.6 s stream-priority query, 474 ms stream creation and 8 s of cudaFree before 9 kernels of
    steady work. Before: KRN006 'host-blocking stall ... 92% of the profiled GPU time' (warning)."""
    r = _report(str(kineto_file("hta_a100_simple_add.json.gz")))
    (rank,) = r.fitness["ranks"]
    assert rank["startup_ns"] == 41139040000 and rank["steady_kernels"] == 9
    c = _check(r, "KRN006")
    assert c.status == "pass" and c.values["stalls"] == 0
    assert c.values["startup_and_stop_idle_ns"] > 0.99 * 41e9
    assert _check(r, "KRN010").status == "finding"  # start-up work is KRN010's alone


def test_window_fitness_is_a_store_table_with_commented_columns(tmp_path):
    db = tmp_path / "trace.duckdb"
    analyze([kineto_file("hta_sampled_rank-0.json.gz")], db_path=db)
    con = duckdb.connect(str(db), read_only=True)
    try:
        row = con.execute("SELECT fitness_class, events, correlation_gap_median FROM window_fitness").fetchall()
        assert row == [("sampled", 1154 + 50 + 1204 + 2329 + 73, 36.0)]  # kernels, copies, runtime, ops, annotations
        comments = dict(
            con.execute(
                "SELECT column_name, comment FROM duckdb_columns() WHERE table_name = 'window_fitness'"
            ).fetchall()
        )
        assert all(comments.values()), comments
        segment = con.execute("SELECT DISTINCT segment FROM host_stalls").fetchall()
        assert set(segment) <= {("start-up",), ("steady",), ("profiler stop",)}
    finally:
        con.close()


def test_report_header_states_the_window_and_the_recapture():
    html = render_html(_report(str(kineto_file("hta_sampled_rank-0.json.gz"))))
    assert 'id="window"' in html and "<b>Window (unfit):</b> sampled: the CPU ops" in html and "Re-capture:" in html
    assert "sampled (unfit) — sampled" not in html  # the class is said once
    assert "Verdict: inconclusive" in html
    fit = render_html(_report(str(NSYS / "nsysai_2xh100_after.sqlite")))
    assert "steady, clipped at its edges" in fit and "profiler stop" in fit


def test_terminal_verdict_of_an_unfit_window_says_what_to_recapture():
    lines = [str(t) for t in verdict_lines(_report(str(kineto_file("hta_large_integer.pt.trace.json.gz"))).verdict)]
    assert lines[0].startswith("Verdict: Inconclusive") and lines[1].startswith("  Re-capture:")


def test_verdict_with_a_problem_stays_a_problem_on_an_unfit_window():
    problem = Check(rule="SHP001", step=1, status="finding", title="t", severity="error", impact=1.0)
    unfit = {"class": "sampled", "fit": False, "why": "sampled: …", "recapture": "…"}
    assert verdict([problem], fitness=unfit)["status"] == "problem"
    assert verdict([], fitness=unfit)["status"] == "inconclusive"
    assert verdict([], fitness={"class": "steady", "fit": True, "why": "…"})["status"] == "nothing_ran"


# --- the severity floor ---------------------------------------------------------------------------------------


def test_four_microseconds_of_elementwise_work_is_no_share_at_all():
    # the steady segment holds one 1.63 µs copy: KRN008's "72 % of GPU busy time" (4.13 µs) was a share of nothing
    c = _check(_report(str(NSYS / "nsysai_rtx3080_minimal.sqlite")), "KRN008")
    assert c.status == "not_applicable"
    assert c.reason.startswith("missing steady GPU work: the steady segment holds 1.63 µs of GPU work over 1 rank")


def test_a_microsecond_total_is_never_a_finding():
    from tracediag.findings import too_small_to_find

    f = Check(rule="X", step=5, status="finding", title="t", severity="warning", impact=0.7, cost_ns=416_000)
    c = too_small_to_find(f)
    assert c.status == "pass" and c.severity is None and c.impact is None and c.rule_severity == "warning"
    assert c.floor == "cost 416 µs over the profiled window < 1 ms: too little to be a finding"
    assert too_small_to_find(replace(f, cost_ns=1_000_000)) == replace(f, cost_ns=1_000_000)


def test_floor_reads_share_window_cost_and_cost_per_step():
    def f(**kw):
        return Check(rule="X", step=5, status="finding", title="t", severity="warning", **kw)

    assert below_floor(f(impact=0.5, cost_ns=5_000_000, cost_per_step_ns=50_000)) is None
    assert below_floor(f(impact=0.005)).startswith("impact")
    assert below_floor(f(impact=0.5, cost_ns=900_000)).startswith("cost 900 µs over the profiled window")
    assert below_floor(f(impact=0.5, cost_ns=5_000_000, cost_per_step_ns=9_000)).endswith("per step < 10 µs")
    assert severity_follows_impact(f(impact=0.5, cost_per_step_ns=1)).severity == "info"


@pytest.mark.parametrize("name", ["hta_v100_ns_resolution.pt.trace.json.gz"])
def test_no_tf32_advice_on_volta(name):
    """V100 (compute capability 7.0): tensor cores take fp16; TF32 starts at 8.0. Before: 'allow TF32'."""
    c = _check(_report(str(kineto_file(name))), "KRN009")
    assert c.status == "finding" and c.values["tf32_available"] is False
    assert "allow TF32 (" not in c.next_check and "fp16" in c.next_check


def test_tf32_advice_on_ampere():
    c = _check(_report(str(kineto_file("hta_a100_simple_add.json.gz"))), "KRN009")
    assert c.values["tf32_available"] is True and "allow TF32 (torch.set_float32_matmul_precision" in c.next_check


CAPTURE = "tracelens_mi300x_vllm_gptoss_piecewise_graph_capture_rank0.pt.trace.json.gz"


def _capture_spans(path) -> list[tuple[float, float]]:
    """(begin start, end end) µs of each stream capture, paired per thread from the file (gzip + json)."""
    import gzip
    import json

    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    calls = sorted((e for e in events if e.get("cat") == "cuda_runtime"), key=lambda e: e["ts"])
    spans, open_ = [], {}
    for e in calls:
        if e["name"] == "hipStreamBeginCapture":
            open_[e["tid"]] = e["ts"]
        elif e["name"] == "hipStreamEndCapture":
            spans.append((open_.pop(e["tid"]), e["ts"] + e["dur"]))
    return spans


def test_a_graph_capture_trace_is_inconclusive_and_says_to_profile_the_replay():
    # vLLM's piecewise HIP-graph capture of gpt-oss on an MI300X (TraceLens): before, its verdict was KRN006's
    # "GPU idle 98% of step time … launch-bound", the capture's own idle (launches inside a capture do not run)
    path = kineto_file("capture/" + CAPTURE)
    r = _report(str(path))
    f = r.fitness
    (rank,) = f["ranks"]
    spans = _capture_spans(path)
    assert len(spans) == 25 and rank["graph_captures"] == 25
    assert f["class"] == "graph_capture" and not f["fit"]
    # the covered time is the captures' union inside the steady segment: at most their whole span, at least half
    whole_ns = (max(b for _, b in spans) - min(a for a, _ in spans)) * 1000
    assert 0.5 * rank["steady_ns"] <= rank["graph_capture_ns"] <= min(whole_ns, rank["steady_ns"])
    assert "25 stream captures (hipStreamBeginCapture … hipStreamEndCapture)" in f["why"]
    assert r.verdict["status"] == "inconclusive" and r.verdict["window"] == "graph_capture"
    assert "--graph-capture" in r.verdict["next_check"] and "/start_profile" in r.verdict["next_check"]
    krn006 = _check(r, "KRN006")
    assert krn006.status == "not_applicable" and "a graph capture" in krn006.reason
    # the replay of the same run holds no capture: its window stays steady and its rules run
    replay = _report(str(kineto_file("tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz")))
    assert replay.fitness["class"] == "steady" and replay.fitness["ranks"][0]["graph_captures"] == 0


def test_stream_captures_pair_per_thread_and_leave_open_or_broken_ones_out():
    """The capture spans (fitness._capture_cover): a begin call and the next end call on its thread; a capture left
    open, an end with no begin and a call without a duration count nothing; the union is clipped to the steady
    segment. Rows of the runtime table, ns."""
    from tracediag.derive import fitness
    from tracediag.store import open_store

    con = open_store()
    rows = [
        # thread 1: two whole captures, the second one running past the steady segment's end
        (0, "cudaStreamBeginCapture_v10000", 100, 5, "1"), (0, "cudaStreamEndCapture_v10000", 300, 10, "1"),
        (0, "cudaStreamBeginCapture_v10000", 800, 5, "1"), (0, "cudaStreamEndCapture_v10000", 1500, 10, "1"),
        # thread 2: overlaps thread 1's first capture (the union counts it once), then a capture left open
        (0, "cudaStreamBeginCapture_v10000", 200, 5, "2"), (0, "cudaStreamEndCapture_v10000", 400, 0, "2"),
        (0, "cudaStreamBeginCapture_v10000", 600, 5, "2"),
        # thread 3: an end with no begin, and a begin whose end has no duration
        (0, "cudaStreamEndCapture_v10000", 50, 5, "3"),
        (0, "cudaStreamBeginCapture_v10000", 700, 5, "3"), (0, "cudaStreamEndCapture_v10000", 750, None, "3"),
    ]  # fmt: skip
    con.executemany("INSERT INTO runtime (rank, name, ts_ns, dur_ns, tid) VALUES (?, ?, ?, ?, ?)", rows)
    cover = fitness._capture_cover(con, {0: (150, 1000, 850, 10)})
    # captures: [100, 310), [800, 1510), [200, 400): their union inside [150, 1000) is [150, 400) + [800, 1000)
    assert cover == {0: (3, 250 + 200, "cudaStreamBeginCapture")}
    con.close()


def test_a_trace_with_copies_and_no_kernel_is_judged_not_crashed_on(tmp_path):
    """A long fuzz run made this from a real trace: GPU copies and runtime calls, no kernel, so no GPU timeline and
    no steady segment; the window summary failed formatting the missing steady kernel count (a traceback)."""
    import gzip
    import json

    with gzip.open(kineto_file("tracelens_h100_hf_qwen1.5-0.5b.json.gz"), "rt") as f:
        doc = json.load(f)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "kernel"]
    copies = sum(1 for e in doc["traceEvents"] if e.get("cat") in ("gpu_memcpy", "gpu_memset"))
    assert copies == 242
    path = tmp_path / "copies_only.json"
    path.write_text(json.dumps(doc))
    r = _report(str(path))
    assert r.fitness["class"] == "startup_only" and not r.fitness["fit"]
    assert r.fitness["why"].startswith("start-up only: no kernel in the trace (242 GPU copies or memsets, ")
    assert r.verdict["status"] == "inconclusive"
