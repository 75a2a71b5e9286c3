"""COL004 Exposed communication.

Hypothesis: what costs step time is not the sum of collective kernel time but the part of it that no
computation hides: GPU time during which a collective kernel runs and no compute kernel runs on any
stream of the same rank is on the critical path (the time a collective sits on the critical path, not the sum
of all kernel time; docs/method.md, step 4). Decode TP all-reduces are usually fully exposed (they depend on the GEMM
before them); overlap exists only where the engine runs communication on its own stream.

Formula: per rank and step window W (first to last GPU work the step launched, clipped at the next
window's start so that windows never overlap: a window sum is a union), with C = union of collective
kernel intervals and K = union of compute kernel intervals (every other kernel; memcpy/memset are not
compute): exposed = |C ∩ W| − |C ∩ K ∩ W|; exposed share of step time = exposed / |W|; exposed share of
GPU busy time = exposed / |busy ∩ W| (when the GPU idles, a small share of step time can still be a large
share of the work); overlapped share of communication = |C ∩ K| / |C|. Finding when either exposed share
is ≥ 0.15; its impact (what the verdict ranks) is exposed / the window's step time (analyses/basis.py).

Evidence: per rank and step, the window, collective time, exposed time and shares; the collective
kernels with the most exposed time. With HolisticTraceAnalysis installed (the `hta` extra), its
communication/computation overlap per rank on the same trace files is reported beside ours.

What to do: a high exposed share with low bus bandwidth → fix the path and the collective first
(PATH001/PATH002, COL003); a high share with good bandwidth → overlap communication (async TP,
sequence parallel, comm on a side stream) or reduce the number of calls; a low share but poor TP
scaling → look at the narrow GEMMs (walk step 5).
"""

from __future__ import annotations

import contextlib
import io
from collections import defaultdict
from pathlib import Path

import numpy as np

from tracediag.analyses.basis import window_time
from tracediag.context import Context
from tracediag.derive.intervals import clip as _clip
from tracediag.derive.intervals import merge_intervals, overlap_each
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="COL004",
    step=4,
    title="Exposed communication: collective GPU time not overlapped by compute",
    requires_tables=("collectives",),
    requires_window="steady",
    may_be_downstream_of=("COL001", "COL002", "COL003", "COL005"),
    share_of_steady="span",
)
EXPOSED_SHARE_FINDING = 0.15  # exposed collective time above this share of step time is a finding


def exposure_by_step(ctx: Context) -> tuple[list[dict], list[dict]]:
    """Per (rank, step): window, collective union, exposed time. Also the per-kernel exposed times."""
    ranks = [r[0] for r in ctx.con.execute("SELECT DISTINCT rank FROM kernels ORDER BY rank").fetchall()]
    steps_all = ctx.rows(
        "SELECT rank, step_id, phase, T, win_ts_ns AS w0, win_end_ns AS w1 FROM steps "
        "WHERE win_ts_ns IS NOT NULL ORDER BY rank, step_id"
    )
    by_rank: dict[int, list[dict]] = defaultdict(list)
    for s in steps_all:
        by_rank[s["rank"]].append(s)
    rows, kernels_out = [], []
    for rank in ranks:
        k = ctx.con.execute(
            "SELECT ts_ns AS s, ts_ns + dur_ns AS e, klass = 'collective' AS c, name, stream FROM kernels "
            "WHERE rank = ? AND dur_ns > 0 ORDER BY ts_ns",
            [rank],
        ).fetchnumpy()
        ts, te = k["s"].astype(np.int64), k["e"].astype(np.int64)
        is_coll = np.asarray(k["c"], dtype=bool)
        cs, ce = ts[is_coll], te[is_coll]
        ks, ke = merge_intervals(ts[~is_coll], te[~is_coll])
        busy_s, busy_e = merge_intervals(ts, te)
        exp_each = (ce - cs) - overlap_each(cs, ce, ks, ke)
        names, streams = k["name"][is_coll], k["stream"][is_coll]
        for i in np.argsort(-exp_each)[: ctx.settings.max_evidence]:
            kernels_out.append(
                {
                    "rank": rank,
                    "ts_ns": int(cs[i]),
                    "name": str(names[i]),
                    "stream": int(streams[i]),
                    "dur_ns": int(ce[i] - cs[i]),
                    "exposed_ns": int(exp_each[i]),
                }
            )
        us, ue = merge_intervals(cs, ce)
        windows = by_rank.get(rank) or [
            {"rank": rank, "step_id": None, "phase": None, "T": None, "w0": int(ts.min()), "w1": int(te.max())}
        ]
        for w in windows:
            w0, w1 = int(w["w0"]), int(w["w1"])
            a_s, a_e = _clip(us, ue, w0, w1)
            comm = int((a_e - a_s).sum())
            hidden = int(overlap_each(a_s, a_e, ks, ke).sum())
            bs_, be_ = _clip(busy_s, busy_e, w0, w1)
            busy = int((be_ - bs_).sum())
            rows.append(
                {
                    "rank": rank,
                    "step": w["step_id"],
                    "phase": w["phase"],
                    "T": w["T"],
                    "window_ns": w1 - w0,
                    "gpu_busy_ns": busy,
                    "collective_ns": comm,
                    "exposed_ns": comm - hidden,
                    "exposed_share_of_step": round((comm - hidden) / (w1 - w0), 4) if w1 > w0 else None,
                    "exposed_share_of_busy": round((comm - hidden) / busy, 4) if busy else None,
                    "overlapped_share_of_collective": round(hidden / comm, 4) if comm else None,
                }
            )
    return rows, sorted(kernels_out, key=lambda r: -r["exposed_ns"])


def whole_trace_collective_ns(ctx: Context) -> int:
    """Σ over ranks of the union of collective kernel intervals in the whole trace."""
    total = 0
    for (rank,) in ctx.con.execute("SELECT DISTINCT rank FROM kernels WHERE klass = 'collective'").fetchall():
        k = ctx.con.execute(
            "SELECT ts_ns AS s, ts_ns + dur_ns AS e FROM kernels "
            "WHERE rank = ? AND klass = 'collective' AND dur_ns > 0",
            [rank],
        ).fetchnumpy()
        s, e = merge_intervals(k["s"].astype(np.int64), k["e"].astype(np.int64))
        total += int((e - s).sum())
    return total


def whole_trace_overlap(ctx: Context) -> dict[int, float]:
    """Per rank, |C ∩ K| / |C| over the whole trace (HTA's scope, for the cross-check)."""
    out = {}
    for (rank,) in ctx.con.execute("SELECT DISTINCT rank FROM kernels ORDER BY rank").fetchall():
        k = ctx.con.execute(
            "SELECT ts_ns AS s, ts_ns + dur_ns AS e, klass = 'collective' AS c FROM kernels "
            "WHERE rank = ? AND dur_ns > 0",
            [rank],
        ).fetchnumpy()
        c = np.asarray(k["c"], dtype=bool)
        cs, ce = merge_intervals(k["s"][c].astype(np.int64), k["e"][c].astype(np.int64))
        ks, ke = merge_intervals(k["s"][~c].astype(np.int64), k["e"][~c].astype(np.int64))
        total = int((ce - cs).sum())
        if total:
            out[int(rank)] = float(overlap_each(cs, ce, ks, ke).sum()) / total
    return out


def hta_cross_check(ctx: Context, ours: dict[int, float]) -> dict:
    """HolisticTraceAnalysis's comm/comp overlap on the same Kineto files, when HTA is installed."""
    try:
        from hta.trace_analysis import TraceAnalysis  # optional: the `hta` extra
    except ImportError:
        return {"status": "not run: HolisticTraceAnalysis is not installed (pip install 'tracediag[hta]')"}
    files = {
        r["rank"]: str(Path(r["path"]).resolve())
        for r in ctx.rows("SELECT rank, path FROM inputs WHERE format = 'kineto' AND rank IS NOT NULL ORDER BY rank")
    }
    if not files:
        return {"status": "not run: HTA reads Kineto traces only"}
    try:
        # HTA logs its parsing progress; a rule does not print
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            ta = TraceAnalysis(
                trace_files=files,
                trace_dir=str(Path(next(iter(files.values()))).parent),
                include_last_profiler_step=True,  # same scope as ours: every kernel of the trace
            )
            df = ta.get_comm_comp_overlap(visualize=False)
    except Exception as exc:  # HTA's own failure must not fail the analysis
        return {"status": f"failed: {type(exc).__name__}: {exc}"}
    per_rank = {}
    # HTA returns ["rank", "comp_comm_overlap_pctg"] (hta/analyzers/communication_analysis.py, HTA 0.5.0)
    for rank, pct in zip(df["rank"], df["comp_comm_overlap_pctg"]):
        mine = ours.get(int(rank))
        per_rank[str(int(rank))] = {
            "hta_overlapped_share_of_collective": round(float(pct) / 100, 4),
            "tracediag_overlapped_share_of_collective_whole_trace": round(mine, 4) if mine is not None else None,
        }
    return {"status": "ok", "method": "hta TraceAnalysis.get_comm_comp_overlap (whole trace)", "per_rank": per_rank}


def check(ctx: Context) -> Check:
    n_kernels = ctx.scalar("SELECT count(*) FROM kernels")
    if not n_kernels:
        backend = ctx.scalar("SELECT any_value(backend) FROM inputs WHERE rank IS NOT NULL")
        return not_applicable(
            RULE,
            "missing GPU kernels: a CPU-only trace"
            + (f" ({backend} collectives run on worker threads, not on GPU streams)" if backend else "")
            + ", so there is no GPU time on which collectives and compute could overlap",
        )
    if not ctx.scalar("SELECT count(*) FROM kernels WHERE klass = 'collective'"):
        return not_applicable(RULE, "missing collective kernels: the trace's collectives ran no GPU kernel")
    rows, kernels = exposure_by_step(ctx)
    if not rows:
        return not_applicable(RULE, "missing step GPU windows: no step launched GPU work in the trace")
    window = sum(r["window_ns"] for r in rows)
    busy = sum(r["gpu_busy_ns"] for r in rows)
    comm = sum(r["collective_ns"] for r in rows)
    exposed = sum(r["exposed_ns"] for r in rows)
    share = exposed / window if window else 0.0
    share_busy = exposed / busy if busy else 0.0
    whole = whole_trace_collective_ns(ctx)
    per_rank: dict[int, dict] = defaultdict(lambda: {"comm": 0, "exposed": 0, "window": 0})
    for r in rows:
        d = per_rank[r["rank"]]
        d["comm"] += r["collective_ns"]
        d["exposed"] += r["exposed_ns"]
        d["window"] += r["window_ns"]
    values = {
        "step_windows": len(rows),
        "window_ns": window,
        "gpu_busy_ns": busy,
        "collective_ns": comm,
        "collective_ns_whole_trace": whole,
        "collective_ns_outside_steps": whole - comm,
        "exposed_ns": exposed,
        "exposed_share_of_step": round(share, 4),
        "exposed_share_of_busy": round(share_busy, 4),
        "overlapped_share_of_collective": round((comm - exposed) / comm, 4) if comm else None,
        "per_rank_exposed_share": {
            str(rk): round(d["exposed"] / d["window"], 4) if d["window"] else None for rk, d in sorted(per_rank.items())
        },
        "threshold": EXPOSED_SHARE_FINDING,
        "window": "step GPU window (first to last GPU work launched in the step, clipped at the next window)",
        "hta_cross_check": hta_cross_check(ctx, whole_trace_overlap(ctx)),
    }
    formula = (
        "exposed = |C ∩ W| − |C ∩ K ∩ W|, share = exposed / |W| and exposed / |busy ∩ W| "
        "(C collective kernels, K compute kernels, W the step windows, disjoint)"
    )
    substituted = (
        f"Σ over {len(rows)} rank-steps: exposed {exposed / 1e6:.3f} ms of {comm / 1e6:.3f} ms collective time, "
        f"over {window / 1e6:.3f} ms of step windows = {share:.1%}, over {busy / 1e6:.3f} ms of GPU busy time = "
        f"{share_busy:.1%}"
    )
    evidence = [k | {"step": None} for k in kernels[: ctx.settings.max_evidence]]
    common = {
        "formula": formula,
        "substituted": substituted,
        "values": values,
        "table": rows,
        "evidence": evidence,
    }
    overlapped = values["overlapped_share_of_collective"]
    if share < EXPOSED_SHARE_FINDING and share_busy < EXPOSED_SHARE_FINDING:
        return passed(
            RULE,
            **common,
            confidence="high",
            title=(
                f"Communication is mostly hidden or small: exposed collective time is {share:.1%} of step time and "
                f"{share_busy:.1%} of GPU busy time"
                + (f" ({overlapped:.0%} of collective time overlaps compute)" if overlapped is not None else "")
            ),
        )
    # ranked on the window's time like every trace-side finding (the shares of the step windows and of GPU busy
    # time judge the finding)
    wt = window_time(ctx)
    common["values"] = values | wt.values(exposed)
    common["substituted"] = f"{substituted}; impact {wt.text(exposed)}"
    return finding(
        RULE,
        **common,
        severity="warning",
        confidence="high",
        impact=wt.share(exposed),
        impact_basis=wt.basis,
        cost_ns=int(exposed),
        cost_per_step_ns=int(exposed / len(rows)) if rows else None,
        title=(
            f"Collectives are on the critical path: {exposed / 1e6:.2f} ms of {comm / 1e6:.2f} ms collective time "
            f"runs with no compute — {share:.1%} of step time, {share_busy:.1%} of GPU busy time"
            + (f" ({overlapped:.0%} overlapped)" if overlapped is not None else "")
        ),
        next_check=(
            "Check the achieved bus bandwidth against the link class and nccl-tests (PATH001/PATH002, COL003): if "
            "low, fix the path first; if normal, reduce or overlap the collectives (fewer, larger calls; comm on a "
            "side stream; sequence parallel)."
        ),
    )
