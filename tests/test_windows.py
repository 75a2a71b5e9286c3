"""Step GPU windows never overlap, collective time is a union, and host-blocking stalls are measured once —
on real traces (windows.py, COL004, step_activity)."""

from __future__ import annotations

import functools
import itertools

import numpy as np
import pytest
from conftest import EXTERNAL, REPO

from tracediag.context import Context
from tracediag.derive import kernel_steps, windows
from tracediag.derive.intervals import merge_intervals
from tracediag.derive.layout import detect_layout
from tracediag.pipeline import build_store, input_files
from tracediag.rules.step4_application import col004_exposed_communication as col004

GPU_TRACES = sorted((EXTERNAL / "kineto").glob("*.json.gz")) + sorted((EXTERNAL / "nsys").glob("*.sqlite"))
DDP = EXTERNAL / "kineto" / "tracelens_mi300x_rank0of8_rccl_ddp.json.gz"


def _store(path):
    return build_store(input_files([path]))


@functools.cache
def _cached(path: str):
    return _store(path)


def _union_ns(con, where: str, params=()) -> int:
    total = 0
    for (rank,) in con.execute(f"SELECT DISTINCT rank FROM kernels WHERE {where}", list(params)).fetchall():
        k = con.execute(
            f"SELECT ts_ns, ts_ns + dur_ns FROM kernels WHERE rank = ? AND dur_ns > 0 AND {where}",
            [rank, *params],
        ).fetchnumpy()
        a, b = (v.astype(np.int64) for v in k.values())
        s, e = merge_intervals(a, b)
        total += int((e - s).sum())
    return total


@pytest.mark.parametrize("path", GPU_TRACES, ids=lambda p: p.name)
def test_step_windows_never_overlap(path):
    con = _cached(str(path))
    rows = con.execute(
        "SELECT rank, win_ts_ns, win_end_ns FROM steps WHERE win_ts_ns IS NOT NULL ORDER BY rank, win_ts_ns"
    ).fetchall()
    for (r0, _, e0), (r1, s1, _) in itertools.pairwise(rows):
        if r0 == r1:
            assert e0 <= s1
    assert all(s <= e for _, s, e in rows)


def _col004(con):
    ctx = Context(con=con, model=None, tp=detect_layout(con).tp)
    return col004.check(ctx)


def test_col004_collective_time_is_the_union_of_collective_kernels_when_windows_overlap():
    """The MI300X DDP trace's GPU lags its host by ~30 ms and its three steps' GPU spans touch end to end.
    Make step 0's span run to the end of step 1's (what a late side-stream kernel launched in step 0 does): the
    raw spans overlap; the windows are clipped, and COL004's collective time stays the union of the collective
    kernel intervals inside them (a sum of the raw spans would count step 1's collectives twice)."""
    con = _store(DDP)
    (g1_end,) = con.execute("SELECT gpu_end_ns FROM steps WHERE step_id = 1").fetchone()
    con.execute("UPDATE steps SET gpu_end_ns = ? WHERE step_id = 0", [g1_end])
    raw = con.execute("SELECT step_id, gpu_ts_ns, gpu_end_ns FROM steps ORDER BY step_id").fetchall()
    assert raw[0][2] > raw[1][1]  # the raw spans overlap
    windows.build(con)
    kernel_steps.build(con)
    check = _col004(con)
    w0, w1 = con.execute("SELECT min(win_ts_ns), max(win_end_ns) FROM steps").fetchone()
    union = _union_ns(con, "klass = 'collective' AND ts_ns < ? AND ts_ns + dur_ns > ?", (w1, w0))
    # clip to the windows' range for the kernels that straddle its edges
    k = con.execute("SELECT ts_ns, ts_ns + dur_ns FROM kernels WHERE klass = 'collective' AND dur_ns > 0").fetchnumpy()
    a, b = (v.astype(np.int64) for v in k.values())
    s, e = merge_intervals(np.maximum(a, w0), np.minimum(b, w1))
    inside = int(np.clip(e - s, 0, None).sum())
    assert check.values["collective_ns"] == pytest.approx(inside, rel=0.01)
    assert check.values["collective_ns"] <= union <= check.values["collective_ns_whole_trace"]
    # summing the raw (overlapping) spans, as a per-step sum would, counts more than the file holds in them
    naive = 0
    for _, g0, g1 in raw:
        sc, ec = merge_intervals(np.maximum(a, g0), np.minimum(b, g1))
        naive += int(np.clip(ec - sc, 0, None).sum())
    assert naive > 1.05 * check.values["collective_ns"]


def test_col004_collective_time_on_the_real_ddp_trace_equals_the_union_inside_the_steps():
    con = _cached(str(DDP))
    check = _col004(con)
    v = check.values
    # 5 of the 17 RCCL kernels ran before the first step's launches (their launch is not in the trace)
    assert v["collective_ns_whole_trace"] == pytest.approx(_union_ns(con, "klass = 'collective'"), rel=1e-9)
    assert v["collective_ns"] + v["collective_ns_outside_steps"] == v["collective_ns_whole_trace"]
    assert v["exposed_share_of_busy"] >= v["exposed_share_of_step"]


def test_sglang_prefill_copy_waits_for_queued_gpu_work():
    # the 493 ms hipMemcpyWithStream: resolve_future_token_ids was launched (after a hipStreamWaitEvent) 49 µs into
    # the gap and ran 493 ms later; the GPU held queued work the whole time, so the copy waits for the GPU: no stall
    con = _cached(str(EXTERNAL / "kineto" / "tracelens_mi300x_sglang_qwen3-8b_prefilldecode.json.gz"))
    (tl,) = con.execute(
        "SELECT span_ns, busy_ns, stall_ns, idle_in_windows_ns, idle_between_ns, queued_idle_in_windows_ns "
        "FROM gpu_timeline"
    ).fetchall()
    span, busy, stall, idle_in, between, queued = tl
    assert stall == 0 and con.execute("SELECT count(*) FROM host_stalls").fetchone()[0] == 0
    assert queued == pytest.approx(493.19e6, rel=1e-3) and queued <= idle_in
    # every idle ns of the span is in exactly one bucket
    assert span - busy == stall + idle_in + between
    (a,) = con.execute("SELECT step_ns, step_ns_with_stalls, queued_idle_ns FROM step_activity").fetchall()
    assert a[0] == a[1] == pytest.approx(987.3e6, rel=1e-3) and a[2] == queued


def test_queued_gaps_start_after_the_launch_of_the_work_that_ends_them():
    from tracediag.derive.fitness import QUEUE_LATENCY_NS
    from tracediag.derive.windows import island_launches, queued_gaps

    bs, be = np.array([0, 1_000_000, 3_000_000]), np.array([100, 1_000_100, 3_000_100])
    # island 1 launched 500 µs into its gap (host-starved until then), island 2 before its gap began (queued)
    ts, launch = np.array([3_000_000, 0, 1_000_000]), np.array([-5, -10, 600_000])
    first_launch, _ = island_launches(bs, ts, launch, np.array([3, 1, 2]))
    assert first_launch.tolist() == [-10, 600_000, -5]
    qs, qe = queued_gaps(bs, be, first_launch)
    assert qs.tolist() == [600_000 + QUEUE_LATENCY_NS, 1_000_100] and qe.tolist() == [1_000_000, 3_000_000]


def test_cpu_sample_trace_has_no_windows_and_no_stalls():
    con = _cached(str(REPO / "sample_traces" / "healthy_tp2"))
    assert con.execute("SELECT count(*) FROM steps WHERE win_ts_ns IS NOT NULL").fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM host_stalls").fetchone()[0] == 0
    (basis,) = con.execute("SELECT DISTINCT time_basis FROM step_activity").fetchone()
    assert basis == "host duration of the step (no GPU kernels)"


def _reference_window_facts(bs, be, ss, se, w0, w1):
    """The per-window computation windows.build made before it was vectorised (clip / gaps / subtract)."""
    from tracediag.derive import intervals as iv

    busy = iv.total(*iv.clip(bs, be, w0, w1))
    st = iv.total(*iv.clip(ss, se, w0, w1))
    gs, ge = iv.subtract(*iv.gaps(bs, be, w0, w1), ss, se)
    longest = int(np.argmax(ge - gs)) if gs.size else None
    return (
        busy,
        st,
        int(ge[longest] - gs[longest]) if longest is not None else 0,
        (int(gs[longest]) if longest is not None else None),
    )


@pytest.mark.parametrize("seed", range(40))
def test_vectorised_window_facts_equal_the_per_window_computation(seed):
    """overlap_each / longest_gap_each over all windows at once give what clip, gaps and subtract gave per window:
    random busy unions, stalls inside their gaps, disjoint windows (empty ones, ones past the data) — exactly."""
    from tracediag.derive import intervals as iv

    rng = np.random.default_rng(seed)
    n = int(rng.integers(0, 60))
    starts = np.sort(rng.integers(0, 10_000, n))
    bs, be = iv.merge_intervals(starts, starts + rng.integers(1, 400, n))
    gaps_s, gaps_e = iv.gaps(bs, be, -500, 11_000)
    pick = rng.random(gaps_s.size) < 0.3
    a, b = gaps_s[pick], gaps_e[pick]
    cut = a + (b - a) * rng.random(a.size) * 0.5
    ss, se = iv.merge_intervals(cut.astype(np.int64), (cut + (b - cut) * rng.random(a.size)).astype(np.int64) + 1)
    ss, se = np.minimum(ss, se - 1), se  # positive length
    ss, se = iv.merge_intervals(ss, se)
    edges = np.sort(rng.integers(-1_000, 12_000, 2 * int(rng.integers(0, 12))))
    w0s, w1s = edges[0::2], edges[1::2]
    us, ue = iv.merge_intervals(np.concatenate((bs, ss)), np.concatenate((be, se)))
    busy, st = iv.overlap_each(w0s, w1s, bs, be), iv.overlap_each(w0s, w1s, ss, se)
    glen, gstart = iv.longest_gap_each(us, ue, w0s, w1s)
    for i, (w0, w1) in enumerate(zip(w0s.tolist(), w1s.tolist(), strict=True)):
        got = (int(busy[i]), int(st[i]), int(glen[i]), int(gstart[i]) if glen[i] > 0 else None)
        assert got == _reference_window_facts(bs, be, ss, se, w0, w1), (seed, i, w0, w1)


def test_a_synchronize_after_the_last_step_is_the_profilers_stop():
    # V100 training (the GPU 76 ms behind the host): cudaDeviceSynchronize starts 76 µs after the last
    # ProfilerStep's host range ends and waits 89 ms for the queued work: the profiler closing the window
    from tracediag.derive.windows import _profiler_stop_sync, stall_kind

    con = _cached(str(EXTERNAL / "kineto" / "hta_v100_ns_resolution.pt.trace.json.gz"))
    name, ts = con.execute(
        "SELECT name, ts_ns FROM runtime WHERE name = 'cudaDeviceSynchronize' ORDER BY dur_ns DESC LIMIT 1"
    ).fetchone()
    (last_end,) = con.execute("SELECT max(ts_ns + dur_ns) FROM steps").fetchone()
    sync = {"kind": stall_kind(name), "ts_ns": ts}
    assert 0 < ts - last_end < 100_000 and _profiler_stop_sync(sync, last_end)
    assert not _profiler_stop_sync(sync, ts + 1)  # inside a step's host range: the workload's own sync
    assert not _profiler_stop_sync({"kind": "synchronous copy", "ts_ns": ts}, last_end)
