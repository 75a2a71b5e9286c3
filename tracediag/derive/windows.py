"""GPU time windows of the steps, host-blocking stalls, and idle time between steps.

Tables and columns it builds (after `steps` and `collectives`, before `kernel_steps`):

* `steps.win_ts_ns`, `steps.win_end_ns` — the step's GPU window: from the first start to the last end of
  the GPU work the step launched, **clipped at the next window's start** so that windows never overlap
  (when the GPU lags the host, or a side stream runs past the next step's first kernel, the raw spans
  overlap; every GPU instant belongs to one window at most). NULL for a step that launched no GPU work.
  `steps.win_busy_ns` = union of all GPU activity (kernels, copies, memsets) inside the window;
  `steps.stall_ns` = GPU idle time inside the window during host-blocking stalls (below);
  `steps.idle_gap_ns` / `idle_gap_start_ns` = the longest idle gap in the window outside stalls.
* `host_stalls` — a host runtime/driver call that blocked the host while the GPU was idle: a
  synchronous copy (cudaMemcpy, hipMemcpyWithStream, a pageable copy), a synchronize API, a kernel launch
  that took milliseconds (lazy module loading, JIT), an allocation (cudaMalloc/cudaFree, host
  registration). A call is a stall when it lasted ≥ 1 ms and the GPU was idle for ≥ 1 ms and ≥ half of it;
  a synchronize that waits for busy GPU work is not a stall. Each is measured once: its idle time comes out
  of the step time that phase statistics use (`step_activity.step_ns`), and the stall is its own evidence.
* `gpu_timeline` — per rank: the profiled GPU span (first to last GPU activity), its busy union, how much
  of it lies in step windows, the idle time inside windows and *between* them (the host loop between
  engine steps: scheduling, sampling, detokenizing, synchronous output copies), and the stall idle time.
"""

from __future__ import annotations

import re

import duckdb
import numpy as np
import pyarrow as pa

from tracediag.derive import intervals as iv

STALL_MIN_NS = 1_000_000  # a host call shorter than 1 ms, or idling the GPU < 1 ms, is not a stall
STALL_IDLE_SHARE = 0.5  # ... nor one during which the GPU was busy most of the time

_KINDS = (
    (re.compile(r"Synchronize", re.I), "synchronize API"),
    (re.compile(r"^(?:cuda|hip)Memcpy(?!Async)\w*$|^cuMemcpy(?:HtoD|DtoH|DtoD)?(?:_v2)?$"), "synchronous copy"),
    (re.compile(r"Memcpy|Memset", re.I), "blocking copy/memset"),
    (re.compile(r"Launch", re.I), "slow kernel launch (lazy module loading or JIT)"),
    (re.compile(r"Module|Library|Load", re.I), "module loading"),
    (re.compile(r"Malloc|Free|HostAlloc|HostRegister|MemPool|Alloc", re.I), "allocation"),
)

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
    ]
)
GPU_TIMELINE_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),  # global rank
        ("gpu_ts_ns", pa.int64()),  # first GPU activity (or host-blocking stall) start, ns
        ("gpu_end_ns", pa.int64()),  # last GPU activity (or stall) end, ns
        ("span_ns", pa.int64()),  # profiled GPU span, ns
        ("busy_ns", pa.int64()),  # union of GPU activity, ns
        ("windows", pa.int32()),  # steps with a GPU window
        ("window_ns", pa.int64()),  # union of the step windows, ns
        ("window_busy_ns", pa.int64()),  # GPU busy inside windows, ns
        ("idle_in_windows_ns", pa.int64()),  # GPU idle inside windows, stalls excluded, ns
        ("idle_between_ns", pa.int64()),  # GPU idle outside every window (between steps), stalls excluded, ns
        ("stall_ns", pa.int64()),  # GPU idle during host-blocking stalls, ns
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
        _, ts, dur, tid = c
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


def _by_rank(rows: list[tuple]) -> dict[int, list[tuple]]:
    """Rows whose first value is the rank -> {rank: the rest of each row, in order}."""
    out: dict[int, list[tuple]] = {}
    for r in rows:
        out.setdefault(r[0], []).append(r[1:])
    return out


def build(con: duckdb.DuckDBPyConnection) -> None:
    # each table read once for every rank, then split (a query per rank scanned every table once per rank: an
    # export with 4,010 ranks, one kernel each, spent 21 of its 26 s here)
    ranks = [r[0] for r in con.execute("SELECT DISTINCT rank FROM kernels ORDER BY rank").fetchall()]
    act = con.execute(
        "SELECT rank, ts_ns, ts_ns + dur_ns AS end_ns FROM kernels WHERE dur_ns > 0 "
        "UNION ALL SELECT rank, ts_ns, ts_ns + dur_ns FROM memops WHERE dur_ns > 0 ORDER BY rank"
    ).fetchnumpy()
    act_rank = np.asarray(act["rank"])
    act_ts, act_end = np.asarray(act["ts_ns"], dtype=np.int64), np.asarray(act["end_ns"], dtype=np.int64)
    steps_of = _by_rank(
        con.execute(
            "SELECT rank, step_id, gpu_ts_ns, gpu_end_ns, ts_ns, dur_ns FROM steps ORDER BY rank, ts_ns"
        ).fetchall()
    )
    calls_of = _by_rank(
        con.execute(
            "SELECT rank, name, ts_ns, dur_ns, tid FROM runtime WHERE dur_ns >= ? ORDER BY rank", [STALL_MIN_NS]
        ).fetchall()
    )
    stalls: list[dict] = []
    timeline: list[dict] = []
    updates: list[tuple] = []
    for rank in ranks:
        lo, hi = np.searchsorted(act_rank, rank, "left"), np.searchsorted(act_rank, rank, "right")
        bs, be = iv.merge_intervals(act_ts[lo:hi], act_end[lo:hi])
        step_rows = steps_of.get(rank, [])
        windows = _rank_windows(step_rows)
        w0s = np.array([w["w0"] for w in windows], dtype=np.int64)
        w1s = np.array([w["w1"] for w in windows], dtype=np.int64)
        steps_host = [(sid, ts, ts + dur) for sid, _, _, ts, dur in step_rows]
        # --- stalls
        calls = calls_of.get(rank, [])
        stall_s: list[int] = []
        stall_e: list[int] = []
        rank_stalls = 0
        for name, ts, dur, tid in _outermost(calls):
            gs, ge = iv.gaps(bs, be, ts, ts + dur)
            idle = iv.total(gs, ge)
            if idle < STALL_MIN_NS or idle < STALL_IDLE_SHARE * dur:
                continue
            in_win = int(iv.overlap_each(w0s, w1s, gs, ge).sum())  # windows are disjoint and sorted
            step = next((sid for sid, a, b in steps_host if a <= ts < b), None)
            op = con.execute(
                "SELECT name, input_dims FROM cpu_ops WHERE rank = ? AND tid = ? AND ts_ns <= ? "
                "AND ts_ns + dur_ns >= ? ORDER BY dur_ns LIMIT 1",
                [rank, tid, ts, ts + dur],
            ).fetchall()
            op = op[0] if op else None
            stalls.append(
                {
                    "rank": rank,
                    "stall_id": rank_stalls,
                    "step_id": step,
                    "kind": stall_kind(name),
                    "name": name,
                    "ts_ns": ts,
                    "dur_ns": dur,
                    "gpu_idle_ns": idle,
                    "in_window_ns": in_win,
                    "op_name": op[0] if op else None,
                    "op_dims": op[1] if op else None,
                }
            )
            rank_stalls += 1
            stall_s += gs.tolist()
            stall_e += ge.tolist()
        ss, se = iv.merge_intervals(np.array(stall_s, dtype=np.int64), np.array(stall_e, dtype=np.int64))
        # --- windows: GPU busy and stall time in each, and its longest idle gap outside stalls (the idle parts
        # of [w0, w1) that neither GPU work nor a stall covers: the gaps of their union)
        win_busy = win_idle = win_stall = 0
        busy_each = iv.overlap_each(w0s, w1s, bs, be)
        stall_each = iv.overlap_each(w0s, w1s, ss, se)
        us, ue = iv.merge_intervals(np.concatenate((bs, ss)), np.concatenate((be, se)))
        gap_len, gap_start = iv.longest_gap_each(us, ue, w0s, w1s)
        for i, w in enumerate(windows):
            w0, w1 = w["w0"], w["w1"]
            busy, st = int(busy_each[i]), int(stall_each[i])
            updates.append(
                (
                    w0,
                    w1,
                    busy,
                    st,
                    int(gap_len[i]),
                    int(gap_start[i]) if gap_len[i] > 0 else None,
                    rank,
                    w["step_id"],
                )
            )
            win_busy += busy
            win_stall += st
            win_idle += (w1 - w0) - busy - st
        if bs.size:
            # the profiled span: first to last GPU activity, widened to the stalls (a cold start idles the GPU
            # before its first kernel)
            g0 = int(min(bs[0], ss[0])) if ss.size else int(bs[0])
            g1 = int(max(be[-1], se[-1])) if ss.size else int(be[-1])
            busy = iv.total(bs, be)
            window_ns = sum(w["w1"] - w["w0"] for w in windows)
            stall_total = iv.total(ss, se)
            timeline.append(
                {
                    "rank": rank,
                    "gpu_ts_ns": g0,
                    "gpu_end_ns": g1,
                    "span_ns": g1 - g0,
                    "busy_ns": busy,
                    "windows": len(windows),
                    "window_ns": window_ns,
                    "window_busy_ns": win_busy,
                    "idle_in_windows_ns": win_idle,
                    "idle_between_ns": (g1 - g0 - busy) - win_idle - stall_total,
                    "stall_ns": stall_total,
                }
            )
    if updates:  # one UPDATE joined to the values (one per step row scanned the table per step)
        names = ("w0", "w1", "busy", "stall", "gap", "gap_start", "rank", "step_id")
        cols = list(zip(*updates))
        con.register("_win_in", pa.table({n: pa.array(c, pa.int64()) for n, c in zip(names, cols)}))
        con.execute(
            "UPDATE steps SET win_ts_ns = u.w0, win_end_ns = u.w1, win_busy_ns = u.busy, stall_ns = u.stall, "
            "idle_gap_ns = u.gap, idle_gap_start_ns = u.gap_start FROM _win_in u "
            "WHERE steps.rank = u.rank AND steps.step_id = u.step_id"
        )
        con.unregister("_win_in")
    tables = (("host_stalls", stalls, HOST_STALLS_SCHEMA), ("gpu_timeline", timeline, GPU_TIMELINE_SCHEMA))
    for name, rows, schema in tables:
        t = pa.table({f.name: [r[f.name] for r in rows] for f in schema}, schema=schema)
        con.register("_t_in", t)
        con.execute(f"CREATE OR REPLACE TABLE {name} AS SELECT * FROM _t_in")
        con.unregister("_t_in")
