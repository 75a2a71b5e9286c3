"""GPU time windows of the steps, host-blocking stalls, the window's start-up and profiler-stop segments, and idle
time between steps.

Tables and columns it builds (after `steps` and `collectives`, before `kernel_steps`):

* `steps.win_ts_ns`, `steps.win_end_ns` — the step's GPU window: from the first start to the last end of
  the GPU work the step launched, **clipped at the next window's start** so that windows never overlap
  (when the GPU lags the host, or a side stream runs past the next step's first kernel, the raw spans
  overlap; every GPU instant belongs to one window at most). NULL for a step that launched no GPU work.
  `steps.win_busy_ns` = union of all GPU activity (kernels, copies, memsets) inside the window;
  `steps.stall_ns` = GPU idle time inside the window during host-blocking stalls (below);
  `steps.startup_idle_ns` = GPU idle time inside the window that start-up work or the profiler's stop holds;
  `steps.idle_gap_ns` / `idle_gap_start_ns` = the longest idle gap in the window outside both.
* `host_stalls` — a host runtime/driver call that blocked the host while the GPU was idle: a
  synchronous copy (cudaMemcpy, hipMemcpyWithStream, a pageable copy), a synchronize API, a kernel launch
  that took milliseconds (lazy module loading, JIT), an allocation (cudaMalloc/cudaFree, host
  registration), an initialisation call (stream creation, device queries). A call is a stall when it lasted
  ≥ 1 ms and the GPU was idle for ≥ 1 ms and ≥ half of it; a synchronize that waits for busy GPU work is not
  a stall, and nor is a call that waits for queued GPU work (below: most of its idle time the GPU had work
  launched by another call and did not run it, the host ahead of the GPU: a device-side wait). A synchronize
  that starts after the last step's host range has ended is the profiler's stop (segment "profiler stop").
  Each is measured once and is its own evidence; its idle time comes out of the step time that phase
  statistics use (`step_activity.step_ns`). Module loading, initialisation calls and first launches that load
  a module or compile are **start-up calls** (KRN010's, wherever they happen), and so are allocations outside the
  steady segment; the others — an allocation in the steady segment among them (the caching allocator growing or
  emptied in the steady state) — are host-blocking stalls of the steady state (KRN006's) there. Only the
  first launch of a kernel (by name, on the rank) can load its module or compile it: a slow launch of a kernel
  that ran before is host contention or a full launch queue, a host-blocking stall of kind REPEAT_LAUNCH.
* Segments of each rank's window (tracediag/derive/fitness.py says how they are chosen): **start-up** from the
  trace start to the first GPU work, extended through the start-up calls after which the window is still mostly
  start-up; **profiler stop** from the end of the last GPU work to the trace end (the final synchronisation and
  the flush); **steady** between them. Idle time in the start-up and stop segments and during start-up calls is
  start-up idle: kept out of step times and out of KRN006's shares, as stalls are.
* **Idle with work queued** (the causal direction of idle time): in an idle gap of the GPU, the GPU work that ends
  it was launched at some instant; idle before that launch (and up to QUEUE_LATENCY_NS after it) is the host not
  giving the GPU work (host-starved), idle after it is the GPU not running work it already holds — a stream or
  event dependency, a collective waiting for another rank, a side stream: a device-side wait the host cannot
  shorten. `steps.queued_idle_ns` is that part of the window's idle (stalls and start-up excluded).
* `gpu_timeline` — per rank: the profiled GPU span (first to last GPU activity) and its busy union; the
  segments; over the steady segment, its busy time, how much of it lies in step windows, the idle time inside
  windows and *between* them (the host loop between engine steps: scheduling, sampling, detokenizing,
  synchronous output copies), and the host-blocking stalls' idle time.
"""

from __future__ import annotations

import re

import duckdb
import numpy as np
import pyarrow as pa

from tracediag.derive import intervals as iv
from tracediag.derive.fitness import QUEUE_LATENCY_NS, REPEAT_LAUNCH, startup_end

# The derivation's declaration (tracediag/derive/__init__.py reads it from this source).
REQUIRES = ("kernels", "cpu_ops", "runtime", "memops", "inputs", "steps")
PROVIDES = ("host_stalls", "gpu_timeline")
UPDATES = ("steps.windows",)

STALL_MIN_NS = 1_000_000  # a host call shorter than 1 ms, or idling the GPU < 1 ms, is not a stall
STALL_IDLE_SHARE = 0.5  # ... nor one during which the GPU was busy most of the time
_NO_LAUNCH = np.iinfo(np.int64).max  # GPU work with no launching call recorded: never counted as queued

_KINDS = (
    (re.compile(r"Synchronize", re.I), "synchronize API"),
    (re.compile(r"^(?:cuda|hip)Memcpy(?!Async)\w*$|^cuMemcpy(?:HtoD|DtoH|DtoD)?(?:_v2)?$"), "synchronous copy"),
    (re.compile(r"Memcpy|Memset", re.I), "blocking copy/memset"),
    (re.compile(r"Launch", re.I), "slow kernel launch (lazy module loading or JIT)"),
    (re.compile(r"Module|Library|Load", re.I), "module loading"),
    (re.compile(r"Malloc|Free|HostAlloc|HostRegister|MemPool|Alloc", re.I), "allocation"),
)
# stalls of these kinds are host work of the steady state (KRN006's); every other kind is start-up work (KRN010's)
HOST_BLOCKING_KINDS = ("synchronize API", "synchronous copy", "blocking copy/memset", REPEAT_LAUNCH)
# runtime calls of >= 1 ms, each with whether every kernel it launched had been launched before on the rank (a
# repeat launch: by kernel name, the first launch of each name is the only one that can load a module or compile)
_CALLS_SQL = """
WITH launched AS (
    SELECT r.rank, r.ts_ns, k.name FROM runtime r JOIN kernels k ON k.rank = r.rank AND k.correlation = r.correlation
    WHERE r.correlation > 0
),
first_launch AS (SELECT rank, name, min(ts_ns) AS first_ts FROM launched GROUP BY ALL),
slow AS (SELECT rank, name, ts_ns, dur_ns, tid, correlation FROM runtime WHERE dur_ns >= ?)
SELECT s.rank, s.name, s.ts_ns, s.dur_ns, s.tid,
       coalesce(bool_and(f.first_ts < s.ts_ns), false) AS repeat_launch, s.correlation
FROM slow s
LEFT JOIN kernels k ON k.rank = s.rank AND k.correlation = s.correlation AND s.correlation > 0
LEFT JOIN first_launch f ON f.rank = s.rank AND f.name = k.name
GROUP BY s.rank, s.name, s.ts_ns, s.dur_ns, s.tid, s.correlation
ORDER BY s.rank
"""
STARTUP, STEADY, STOP = "start-up", "steady", "profiler stop"
# GPU activity per rank with the instant and correlation id of the runtime call that launched it (the sentinel $1
# when none is recorded)
_ACTIVITY_SQL = """
WITH launches AS (SELECT rank, correlation, min(ts_ns) AS launch_ns FROM runtime WHERE correlation > 0 GROUP BY ALL),
act AS (
    SELECT rank, ts_ns, ts_ns + dur_ns AS end_ns, correlation FROM kernels WHERE dur_ns > 0
    UNION ALL SELECT rank, ts_ns, ts_ns + dur_ns, correlation FROM memops WHERE dur_ns > 0
)
SELECT a.rank, a.ts_ns, a.end_ns, coalesce(l.launch_ns, $1) AS launch_ns, coalesce(a.correlation, -1) AS correlation
FROM act a LEFT JOIN launches l ON l.rank = a.rank AND l.correlation = a.correlation AND a.correlation > 0
ORDER BY a.rank
"""

HOST_STALLS_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),  # global rank
        ("stall_id", pa.int32()),  # per-rank ordinal
        ("step_id", pa.int32()),  # step whose host range holds the call's start (NULL: between steps)
        ("kind", pa.string()),  # synchronize API, synchronous copy, kernel launch (...), allocation, ...
        ("name", pa.string()),  # the runtime/driver call
        ("ts_ns", pa.int64()),  # host start, ns
        ("dur_ns", pa.int64()),  # host duration, ns
        ("gpu_idle_ns", pa.int64()),  # GPU idle time during the call, ns (what the stall costs)
        ("in_window_ns", pa.int64()),  # of it, inside step GPU windows (excluded from step_ns), ns
        ("op_name", pa.string()),  # innermost CPU op around the call (aten::copy_, aten::item, ...)
        ("op_dims", pa.string()),  # its Input Dims, JSON
        ("segment", pa.string()),  # segment of the window the call starts in: start-up, steady, profiler stop
        ("startup_call", pa.bool_()),  # a start-up call (allocation, module loading, initialisation, cold launch)
    ]
)
GPU_TIMELINE_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),  # global rank
        ("gpu_ts_ns", pa.int64()),  # first GPU activity (or host-blocking stall) start, ns
        ("gpu_end_ns", pa.int64()),  # last GPU activity (or stall) end, ns
        ("span_ns", pa.int64()),  # profiled GPU span, ns
        ("busy_ns", pa.int64()),  # union of GPU activity, ns
        ("startup_end_ns", pa.int64()),  # end of the start-up segment (from the trace start), ns
        ("stop_ts_ns", pa.int64()),  # start of the profiler-stop segment (end of the last GPU activity), ns
        ("steady_span_ns", pa.int64()),  # the steady segment between them, ns
        ("steady_busy_ns", pa.int64()),  # union of GPU activity in the steady segment, ns
        ("steady_kernels", pa.int64()),  # kernels that start in the steady segment
        ("windows", pa.int32()),  # steps with a GPU window
        ("window_ns", pa.int64()),  # union of the step windows, ns
        ("window_busy_ns", pa.int64()),  # GPU busy inside windows, ns
        ("idle_in_windows_ns", pa.int64()),  # GPU idle inside windows, stalls and start-up idle excluded, ns
        ("idle_between_ns", pa.int64()),  # steady GPU idle outside every window, stalls and start-up excluded, ns
        ("queued_idle_in_windows_ns", pa.int64()),  # of idle_in_windows_ns, idle with work already launched, ns
        ("queued_idle_between_ns", pa.int64()),  # of idle_between_ns, idle with work already launched, ns
        ("stall_ns", pa.int64()),  # steady GPU idle during host-blocking stalls (not start-up calls), ns
        ("startup_idle_ns", pa.int64()),  # GPU idle in the start-up and stop segments and during start-up calls, ns
    ]
)


def stall_kind(name: str) -> str:
    for rx, kind in _KINDS:
        if rx.search(name):
            return kind
    return "host call"


def _outermost(calls: list[tuple]) -> list[tuple]:
    """Drop calls nested in an earlier call on the same thread (a driver call inside its runtime call)."""
    out, ends = [], {}
    for c in sorted(calls, key=lambda c: (c[1], -c[2])):
        _, ts, dur, tid = c[:4]
        if ends.get(tid, -1) >= ts + dur:
            continue
        ends[tid] = max(ends.get(tid, -1), ts + dur)
        out.append(c)
    return out


def _rank_windows(rows: list[tuple]) -> list[dict]:
    """The step windows of one rank from its steps (step_id, gpu_ts_ns, gpu_end_ns, ts_ns, dur_ns) by ts_ns."""
    with_gpu = sorted((r for r in rows if r[1] is not None), key=lambda r: (r[1], r[0]))
    out = []
    for k, (sid, g0, g1, *_) in enumerate(with_gpu):
        nxt = with_gpu[k + 1][1] if k + 1 < len(with_gpu) else None
        w1 = min(g1, nxt) if nxt is not None else g1
        if out and g0 < out[-1]["w1"]:  # same start as the previous window: nothing left to this one
            g0 = out[-1]["w1"]
        out.append({"step_id": sid, "w0": g0, "w1": max(w1, g0)})
    return out


def _union(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    if not parts:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    return iv.merge_intervals(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))


def _inside(s: np.ndarray, e: np.ndarray, w0: int, w1: int) -> int:
    return iv.total(*iv.clip(s, e, w0, w1)) if s.size and w1 > w0 else 0


def _by_rank(rows: list[tuple]) -> dict[int, list[tuple]]:
    """Rows whose first value is the rank -> {rank: the rest of each row, in order}."""
    out: dict[int, list[tuple]] = {}
    for r in rows:
        out.setdefault(r[0], []).append(r[1:])
    return out


def _int64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.int64)


def build(con: duckdb.DuckDBPyConnection) -> None:
    # each table is read once for every rank, then split (a query per rank scanned every table once per rank: an
    # export with 4,010 ranks, one kernel each, spent 21 of its 26 s here)
    ranks = [r[0] for r in con.execute("SELECT DISTINCT rank FROM kernels ORDER BY rank").fetchall()]
    act = con.execute(_ACTIVITY_SQL, [int(_NO_LAUNCH)]).fetchnumpy()
    act_rank, act_ts, act_end = np.asarray(act["rank"]), _int64(act["ts_ns"]), _int64(act["end_ns"])
    act_launch, act_corr = _int64(act["launch_ns"]), _int64(act["correlation"])
    kern = con.execute("SELECT rank, ts_ns FROM kernels ORDER BY rank, ts_ns").fetchnumpy()
    kern_rank, kern_ts = np.asarray(kern["rank"]), _int64(kern["ts_ns"])
    steps_of = _by_rank(
        con.execute(
            "SELECT rank, step_id, gpu_ts_ns, gpu_end_ns, ts_ns, dur_ns FROM steps ORDER BY rank, ts_ns"
        ).fetchall()
    )
    calls_of = _by_rank(con.execute(_CALLS_SQL, [STALL_MIN_NS]).fetchall())
    trace_span = dict(
        (r[0], (r[1], r[2]))
        for r in con.execute("SELECT rank, min(trace_start_ns), max(trace_end_ns) FROM inputs GROUP BY rank").fetchall()
    )
    stalls: list[dict] = []
    timeline: list[dict] = []
    updates: list[tuple] = []
    for rank in ranks:
        lo, hi = np.searchsorted(act_rank, rank, "left"), np.searchsorted(act_rank, rank, "right")
        bs, be = iv.merge_intervals(act_ts[lo:hi], act_end[lo:hi])
        launch, by = island_launches(bs, act_ts[lo:hi], act_launch[lo:hi], act_corr[lo:hi])
        step_rows = steps_of.get(rank, [])
        windows = _rank_windows(step_rows)
        w0s = np.array([w["w0"] for w in windows], dtype=np.int64)
        w1s = np.array([w["w1"] for w in windows], dtype=np.int64)
        steps_host = [(sid, ts, ts + dur) for sid, _, _, ts, dur in step_rows]
        last_step_end = max((b for _, _, b in steps_host), default=None)
        found = _rank_stalls(con, rank, bs, be, calls_of.get(rank, []), steps_host, (launch, by), last_step_end)
        # --- segments: start-up (to the first GPU work, through the start-up calls that still dominate the window),
        # steady, profiler stop (after the last GPU work)
        t_start, t_end = trace_span.get(rank, (None, None))
        g_first = int(bs[0]) if bs.size else None
        g_last = int(be[-1]) if bs.size else None
        cold = [(r["ts_ns"], r["ts_ns"] + r["dur_ns"], gs, ge) for r, gs, ge in found if r["startup_call"]]
        s0 = startup_end(g_first, cold, g_last) if g_first is not None else None
        s1 = g_last
        startup_parts, stall_parts = [], []
        if s0 is not None:
            lo = min(t_start, g_first) if t_start is not None else g_first
            hi = max(t_end, g_last) if t_end is not None else g_last
            startup_parts += [iv.gaps(bs, be, lo, s0), iv.gaps(bs, be, s1, max(hi, s1))]
        for r, gs, ge in found:
            stop = r["ts_ns"] >= s1 or _profiler_stop_sync(r, last_step_end)
            r["segment"] = STARTUP if s0 is not None and r["ts_ns"] < s0 else STOP if stop else STEADY
            if r["segment"] == STEADY and r["kind"] == "allocation":  # the allocator growing in the steady state
                r["startup_call"] = False
            (stall_parts if r["segment"] == STEADY and not r["startup_call"] else startup_parts).append((gs, ge))
        cs, ce = _union(startup_parts)  # start-up idle
        ks, ke = _union(stall_parts)
        ks, ke = iv.subtract(ks, ke, cs, ce) if cs.size else (ks, ke)  # host-blocking stall idle, disjoint from it
        ss, se = _union([(ks, ke), (cs, ce)])
        qs, qe = queued_gaps(bs, be, launch)  # idle with work already launched, stalls and start-up taken out
        qs, qe = iv.subtract(qs, qe, ss, se) if ss.size and qs.size else (qs, qe)
        queued_each = iv.overlap_each(w0s, w1s, qs, qe)
        for r, gs, ge in found:
            r["in_window_ns"] = int(iv.overlap_each(w0s, w1s, gs, ge).sum())  # windows are disjoint and sorted
            stalls.append(r)
        # --- windows: GPU busy, stall and start-up idle in each, and its longest idle gap outside both (the idle
        # parts of [w0, w1) that neither GPU work nor a stall nor start-up covers: the gaps of their union)
        win_busy = win_idle = 0
        busy_each = iv.overlap_each(w0s, w1s, bs, be)
        stall_each = iv.overlap_each(w0s, w1s, ks, ke)
        startup_each = iv.overlap_each(w0s, w1s, cs, ce)
        us, ue = iv.merge_intervals(np.concatenate((bs, ss)), np.concatenate((be, se)))
        gap_len, gap_start = iv.longest_gap_each(us, ue, w0s, w1s)
        for i, w in enumerate(windows):
            w0, w1 = w["w0"], w["w1"]
            busy, st, cold_i = int(busy_each[i]), int(stall_each[i]), int(startup_each[i])
            updates.append(
                (
                    w0,
                    w1,
                    busy,
                    st,
                    cold_i,
                    int(gap_len[i]),
                    int(gap_start[i]) if gap_len[i] > 0 else None,
                    int(queued_each[i]),
                    rank,
                    w["step_id"],
                )
            )
            win_busy += busy
            win_idle += (w1 - w0) - busy - st - cold_i
        if bs.size:
            k_lo, k_hi = np.searchsorted(kern_rank, rank, "left"), np.searchsorted(kern_rank, rank, "right")
            intervals = {"busy": (bs, be), "stall": (ks, ke), "startup": (cs, ce), "queued": (qs, qe)}
            in_windows = (win_busy, win_idle, int(queued_each.sum()))
            timeline.append(_timeline_row(rank, intervals, found, (s0, s1), kern_ts[k_lo:k_hi], windows, in_windows))
    _write(con, updates, stalls, timeline)


def _timeline_row(
    rank: int,
    intervals: dict[str, tuple[np.ndarray, np.ndarray]],
    found: list[tuple],
    segment: tuple[int, int],
    rank_ts: np.ndarray,
    windows: list[dict],
    in_windows: tuple[int, int, int],
) -> dict:
    """The rank's gpu_timeline row: its profiled span, the steady segment [s0, s1) and the busy, idle, queued,
    stall and start-up time in and between its step windows. `intervals`: GPU busy, host-blocking stall, start-up
    idle and queued idle (each disjoint, sorted); `rank_ts`: the rank's kernel start times, sorted; `in_windows`:
    busy, free idle and queued idle summed over the windows."""
    bs, be = intervals["busy"]
    ks, ke = intervals["stall"]
    cs, ce = intervals["startup"]
    qs, qe = intervals["queued"]
    s0, s1 = segment
    win_busy, win_idle, queued_in = in_windows
    # the profiled span: first to last GPU activity, widened to the stalls (a cold start idles the GPU
    # before its first kernel)
    all_s = np.array([r["ts_ns"] for r, _, _ in found], dtype=np.int64)
    all_e = np.array([r["ts_ns"] + r["dur_ns"] for r, _, _ in found], dtype=np.int64)
    g0 = int(min(bs[0], all_s.min())) if all_s.size else int(bs[0])
    g1 = int(max(be[-1], all_e.max())) if all_s.size else int(be[-1])
    steady = max(0, s1 - s0)
    steady_busy = _inside(bs, be, s0, s1)
    # steady idle that no stall and no start-up call holds: inside windows or between them
    steady_free = steady - steady_busy - _inside(ks, ke, s0, s1) - _inside(cs, ce, s0, s1)
    # sorted: the kernels starting in [s0, s1)
    kernels_steady = int(np.searchsorted(rank_ts, s1, "left") - np.searchsorted(rank_ts, s0, "left"))
    return {
        "rank": rank,
        "gpu_ts_ns": g0,
        "gpu_end_ns": g1,
        "span_ns": g1 - g0,
        "busy_ns": iv.total(bs, be),
        "startup_end_ns": s0,
        "stop_ts_ns": s1,
        "steady_span_ns": steady,
        "steady_busy_ns": steady_busy,
        "steady_kernels": kernels_steady,
        "windows": len(windows),
        "window_ns": sum(w["w1"] - w["w0"] for w in windows),
        "window_busy_ns": win_busy,
        "idle_in_windows_ns": win_idle,
        "idle_between_ns": max(0, steady_free - win_idle),
        "queued_idle_in_windows_ns": queued_in,
        "queued_idle_between_ns": max(0, _inside(qs, qe, s0, s1) - queued_in),
        "stall_ns": iv.total(ks, ke),
        "startup_idle_ns": _inside(cs, ce, g0, g1),
    }


def _rank_stalls(
    con: duckdb.DuckDBPyConnection,
    rank: int,
    bs: np.ndarray,
    be: np.ndarray,
    calls: list,
    steps_host: list,
    islands: tuple[np.ndarray, np.ndarray],
    last_step_end: int | None,
) -> list[tuple[dict, np.ndarray, np.ndarray]]:
    """The rank's host-blocking calls that idle the GPU (row, idle gap starts, idle gap ends), outermost first. A
    call during most of whose idle time the GPU held work another call had launched waits for the GPU: no stall; a
    synchronize after the last step is kept whatever the GPU held (the profiler's stop: its idle is the stop's)."""
    found: list[tuple[dict, np.ndarray, np.ndarray]] = []
    launch, by = islands
    for name, ts, dur, tid, repeat_launch, corr in _outermost(calls):
        gs, ge = iv.gaps(bs, be, ts, ts + dur)
        idle = iv.total(gs, ge)
        if idle < STALL_MIN_NS or idle < STALL_IDLE_SHARE * dur:
            continue
        # the call's own work (a pageable copy the host stages) waits for the call: only others' work is queued
        qs, qe = queued_gaps(bs, be, np.where(by == (corr or -1), _NO_LAUNCH, launch))
        stop = _profiler_stop_sync({"kind": stall_kind(name), "ts_ns": ts}, last_step_end)
        if not stop and iv.total(*iv.clip(qs, qe, ts, ts + dur)) >= STALL_IDLE_SHARE * idle:
            continue
        step = next((sid for sid, a, b in steps_host if a <= ts < b), None)
        op = con.execute(
            "SELECT name, input_dims FROM cpu_ops WHERE rank = ? AND tid = ? AND ts_ns <= ? "
            "AND ts_ns + dur_ns >= ? ORDER BY dur_ns LIMIT 1",
            [rank, tid, ts, ts + dur],
        ).fetchall()
        op = op[0] if op else None
        kind = stall_kind(name)
        if repeat_launch and kind.startswith("slow kernel launch"):
            kind = REPEAT_LAUNCH
        row = {
            "rank": rank,
            "stall_id": len(found),
            "step_id": step,
            "kind": kind,
            "name": name,
            "ts_ns": ts,
            "dur_ns": dur,
            "gpu_idle_ns": idle,
            "op_name": op[0] if op else None,
            "op_dims": op[1] if op else None,
            "startup_call": kind not in HOST_BLOCKING_KINDS,
        }
        found.append((row, gs, ge))
    return found


def island_launches(
    bs: np.ndarray, ts: np.ndarray, launch: np.ndarray, corr: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """For each busy island of the union (bs, be) of the activities (ts, launch instant, correlation id), the launch
    instant and correlation of the activity that starts it (the earliest launched of those starting there)."""
    if not bs.size:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    order = np.lexsort((launch, ts))
    ts_o, launch_o, corr_o = ts[order], launch[order], corr[order]
    first = np.minimum(np.searchsorted(ts_o, bs, "left"), ts_o.size - 1)
    return launch_o[first], corr_o[first]


def queued_gaps(bs: np.ndarray, be: np.ndarray, launch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The parts of the idle gaps of the busy union (bs, be) during which the GPU held work already launched: in the
    gap before island k, from its first activity's launch (`launch[k]`) plus QUEUE_LATENCY_NS to the island."""
    if bs.size < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    ready = np.where(launch[1:] < _NO_LAUNCH - QUEUE_LATENCY_NS, launch[1:] + QUEUE_LATENCY_NS, _NO_LAUNCH)
    qs, qe = np.maximum(be[:-1], ready), bs[1:]
    keep = qe > qs
    return qs[keep], qe[keep]


def _profiler_stop_sync(stall: dict, last_step_end: int | None) -> bool:
    """A synchronize that starts once the last step's host range has ended: the profiler's stop (torch.profiler
    synchronizes the device when the window closes), never a stall of the workload's steps."""
    return last_step_end is not None and stall["kind"] == "synchronize API" and stall["ts_ns"] >= last_step_end


def _write(con: duckdb.DuckDBPyConnection, updates: list[tuple], stalls: list[dict], timeline: list[dict]) -> None:
    """The steps' window columns (one UPDATE joined to the values), host_stalls and gpu_timeline."""
    if updates:  # one UPDATE joined to the values (an UPDATE per step scanned the table per step)
        names = ("w0", "w1", "busy", "stall", "startup", "gap", "gap_start", "queued", "rank", "step_id")
        values = pa.table({n: pa.array(c, pa.int64()) for n, c in zip(names, zip(*updates))})
        con.register("_win_in", values)
        try:
            con.execute(
                "UPDATE steps SET win_ts_ns = u.w0, win_end_ns = u.w1, win_busy_ns = u.busy, stall_ns = u.stall, "
                "startup_idle_ns = u.startup, idle_gap_ns = u.gap, idle_gap_start_ns = u.gap_start, "
                "queued_idle_ns = u.queued FROM _win_in u "
                "WHERE steps.rank = u.rank AND steps.step_id = u.step_id"
            )
        finally:
            con.unregister("_win_in")
    tables = (("host_stalls", stalls, HOST_STALLS_SCHEMA), ("gpu_timeline", timeline, GPU_TIMELINE_SCHEMA))
    for name, rows, schema in tables:
        t = pa.table({f.name: [r[f.name] for r in rows] for f in schema}, schema=schema)
        con.register("_t_in", t)
        con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM _t_in")
        con.unregister("_t_in")
