"""KRN010 Cold window.

Hypothesis: the profiled window holds one-time start-up work — CUDA/HIP context and stream creation, lazy
module loading at a kernel's first launch (CUDA_MODULE_LOADING=LAZY loads each kernel's module when it first
runs), JIT compilation, allocator growth (cudaMalloc/cudaFree, host memory registration) — so it does not show
the steady state: step times, idle shares and stalls measured in it overstate what production pays.

Formula: cold time = Σ host time of the start-up calls in the trace: context/stream creation and first-call
initialisation (≥ 1 ms), module loading, first launches of a kernel that took ≥ 1 ms while the GPU idled (a
module load or a compile; a launch that blocks while the GPU is busy waits for room in the launch queue, and a
slow launch of a kernel that ran before has nothing left to load — host contention or a full launch queue, a
host stall of the steady state, KRN006's — neither is counted), and device/host allocations and registrations of
the start-up segment (one of the steady state is the caching allocator growing again, a host stall of KRN006's; one
after the last GPU work the teardown); cold share = cold time / profiled host span (first to last event of the
rank). The impact (what the verdict ranks) is the cold time inside the window the other rules measure (the steady
segment; all of it when there is none) / the window's step time (analyses/basis.py): start-up before the window is
left out of their shares already. Finding from 1 % of the profiled span (info), warning from 10 % when the cold work
reaches into the window (≥ 1 % of its time). When the whole window is start-up, or most of it (derive/fitness.py
classes startup_only and
startup_dominated), the finding says so and is info, its impact the cold share of the profiled span (the window's
step time holds almost nothing): the capture, not the run, is what to fix, and the verdict is
inconclusive with what to re-capture.

Evidence: the largest start-up calls with their kind, duration and, for a launch, the kernel it launched first.

What to do: profile after warm-up — run a few steps first (vLLM and SGLang warm up and capture graphs at
start; start the profiler after that, or with a schedule's wait/warmup steps), preload modules
(CUDA_MODULE_LOADING=EAGER for the measurement), and let the caching allocator reach its size before the window.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

from tracediag.analyses.basis import window_time
from tracediag.analyses.kernels import ms
from tracediag.context import Context
from tracediag.derive.fitness import REPEAT_LAUNCH
from tracediag.findings import PROFILED_SPAN, Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="KRN010",
    step=5,
    title="Cold window: start-up work (context, lazy module loading, JIT, allocation) inside the profile",
    requires_tables=("runtime",),
)
INFO_SHARE, WARNING_SHARE = 0.01, 0.10
SLOW_MS = 1_000_000  # ns
_INIT = re.compile(
    r"^(?:cuInit|cuCtxCreate\w*|cuDevicePrimaryCtxRetain|cudaSetDevice|cudaDeviceGetStreamPriorityRange|"
    r"cudaStreamCreate\w*|cudaGetDeviceProperties\w*|cudaFree|hipInit|hipSetDevice|hipStreamCreate\w*|"
    r"hipGetDeviceProperties\w*|hipDeviceGetStreamPriorityRange)$"
)
_MODULE = re.compile(r"^(?:cuModuleLoad\w*|cuLibraryLoad\w*|hipModuleLoad\w*|cudaLibraryLoad\w*)$")
_ALLOC = re.compile(
    r"^(?:cudaMalloc\w*|cudaFree\w*|cudaHostAlloc|cudaHostRegister|cudaHostUnregister|cuMemAlloc\w*|cuMemCreate|"
    r"cuMemFree\w*|hipMalloc\w*|hipFree\w*|hipHostMalloc|hipHostRegister|hipHostFree|hipExtMallocWithFlags)$"
)
_LAUNCH = re.compile(r"Launch", re.I)


_CALLS_SQL = """
SELECT r.rank, r.name, r.ts_ns, r.dur_ns, r.tid, r.correlation, t.startup_end_ns, t.stop_ts_ns
FROM runtime r LEFT JOIN gpu_timeline t ON t.rank = r.rank ORDER BY r.rank, r.ts_ns
"""


def _segment(ts: int, s0: int | None, s1: int | None) -> str:
    """'startup', 'steady' or 'stop': where a call lies in its rank's window (derive/windows.py)."""
    if s0 is None or ts < s0:
        return "startup"
    return "steady" if s1 is None or ts < s1 else "stop"


def cold_calls(ctx: Context) -> tuple[list[dict], dict[str, int]]:
    """The start-up calls (their kind and window segment) and the launch facts. An allocation counts only in the
    start-up segment: one of the steady state is the caching allocator growing again, a host stall (KRN006's)."""
    cur = ctx.con.execute(_CALLS_SQL)
    cols = [d[0] for d in cur.description]
    rows = cur.fetchall()  # 10^4-10^6 calls of a few dozen names: each name is classified once
    names = {name: _classify(name) for name in {r[1] for r in rows}}
    launches = [r[3] for r in rows if names[r[1]].counted_launch]
    median_launch = statistics.median(launches) if launches else 0
    # a first launch that blocked while the GPU idled (windows.py host_stalls) loaded a module or compiled; one
    # that blocked while the GPU was busy waited for room in the launch queue (GPU-bound, not cold), and a slow
    # launch of a kernel that ran before (REPEAT_LAUNCH) had nothing to load
    idle_launch = {
        (r["rank"], r["ts_ns"])
        for r in ctx.rows("SELECT rank, ts_ns FROM host_stalls WHERE kind LIKE 'slow kernel launch%'")
    }
    repeat = ctx.rows(
        "SELECT count(*) AS n, coalesce(sum(dur_ns), 0) AS ns FROM host_stalls WHERE kind = ?", [REPEAT_LAUNCH]
    )[0]
    out, later_allocs = [], [0, 0]
    for r in rows:
        c, d = names[r[1]], r[3]
        segment = _segment(r[2], r[6], r[7])
        if c.module:
            kind = "module loading"
        elif c.init and d >= SLOW_MS:
            kind = "context / stream creation, first-call initialisation"
        elif c.alloc and segment == "startup":
            kind = "allocation / host memory registration"
        elif c.launch and (r[0], r[2]) in idle_launch:
            kind = "kernel launch of ≥ 1 ms with the GPU idle (lazy module loading or JIT at first launch)"
        else:
            if c.alloc:
                later_allocs[0] += 1
                later_allocs[1] += d
            continue
        out.append(dict(zip(cols[:6], r[:6])) | {"kind": kind, "segment": segment})
    return out, {
        "allocations_after_startup": later_allocs[0],
        "allocations_after_startup_ns": later_allocs[1],
        "allocations_after_startup_are": "not start-up work: in the steady state the caching allocator growing or "
        "emptied (KRN006's host stalls when they idle the GPU), after the last GPU work the teardown",
        "median_launch_ns": int(median_launch),
        "launches": len(launches),
        "slow_repeat_launches": int(repeat["n"]),
        "slow_repeat_launch_ns": int(repeat["ns"]),
        "slow_repeat_launches_are": REPEAT_LAUNCH + ": not start-up, KRN006's host stalls",
    }


def _repeats(facts: dict) -> str:
    """The slow launches left out because their kernel ran before, in words (empty when there are none)."""
    n = facts["slow_repeat_launches"]
    if not n:
        return ""
    what = "launches" if n > 1 else "launch"
    of = "of kernels that ran before are" if n > 1 else "of a kernel that ran before is"
    return (
        f"; {n} slow {what} ({ms(facts['slow_repeat_launch_ns'])}) {of} not start-up: host contention or a full "
        "launch queue (KRN006's host stalls)"
    )


def _first_launched(ctx: Context, c: dict) -> dict:
    """The kernel a cold launch started first on its rank (a launch counts only as that kernel's first)."""
    if not c["kind"].startswith("kernel launch") or not c.get("correlation"):
        return {}
    name = ctx.scalar(
        "SELECT name FROM kernels WHERE rank = ? AND correlation = ? ORDER BY ts_ns LIMIT 1",
        [c["rank"], c["correlation"]],
    )
    return {"kernel": name, "first_launch_of_kernel": True} if name else {}


# the fitness classes of a window that is start-up, wholly or mostly (derive/fitness.py): the title's opening
_STARTUP_WINDOW = {
    "startup_only": ("start-up only: ", "The window is start-up only, nothing steady to measure"),
    "startup_dominated": ("mostly start-up: ", "The window is mostly start-up, too little steady work to judge"),
}


def _startup_window(ctx: Context) -> tuple[str, str] | None:
    """(the title's opening, the fitness's words) when the window is start-up, wholly or mostly, else None."""
    fit = ctx.fitness()
    if not fit or fit.get("class") not in _STARTUP_WINDOW:
        return None
    prefix, opening = _STARTUP_WINDOW[fit["class"]]
    return opening, fit["why"].removeprefix(prefix)


@dataclass(frozen=True)
class _Name:
    module: bool
    init: bool
    alloc: bool
    launch: bool
    counted_launch: bool  # a kernel launch that is not a graph launch (the median launch time)


def _classify(name: str) -> _Name:
    launch = bool(_LAUNCH.search(name))
    return _Name(
        module=bool(_MODULE.match(name)),
        init=bool(_INIT.match(name)),
        alloc=bool(_ALLOC.match(name)),
        launch=launch,
        counted_launch=launch and "Graph" not in name,
    )


def check(ctx: Context) -> Check:
    calls, facts = cold_calls(ctx)
    spans = ctx.rows(
        "SELECT rank, trace_end_ns - trace_start_ns AS span_ns FROM inputs WHERE rank IS NOT NULL "
        "AND rank IN (SELECT DISTINCT rank FROM runtime)"
    )
    span = sum(s["span_ns"] or 0 for s in spans)
    if not span:
        return not_applicable(RULE, "missing the profiled span of the ranks with runtime calls")
    by_kind: dict[str, int] = {}
    for c in calls:
        by_kind[c["kind"]] = by_kind.get(c["kind"], 0) + c["dur_ns"]
    cold = sum(by_kind.values())
    share = cold / span
    wt = window_time(ctx)
    # what of it lies in the window the other rules measure: the steady segment (all of it when there is none)
    steady = ctx.scalar("SELECT count(*) FROM gpu_timeline WHERE steady_span_ns > 0")
    inside = sum(c["dur_ns"] for c in calls if c["segment"] == "steady") if steady else cold
    values = {
        "cold_ns": cold,
        "profiled_host_span_ns": span,
        "cold_share": round(share, 4),
        "by_kind_ns": dict(sorted(by_kind.items(), key=lambda kv: -kv[1])),
        "cold_calls": len(calls),
        "cold_in_window_ns": inside,
        **wt.values(inside),
        **facts,
        "thresholds": {"info": INFO_SHARE, "warning": WARNING_SHARE},
    }
    formula = "cold share = Σ start-up calls' host time / profiled host span"
    parts = "; ".join(f"{k} {ms(v)}" for k, v in values["by_kind_ns"].items()) or "none"
    substituted = f"{ms(cold)} ({parts}) / {ms(span)} = {share:.4f}; impact (the part inside the window) " + wt.text(
        inside
    )
    top = sorted(calls, key=lambda c: -c["dur_ns"])[: ctx.settings.max_evidence]
    evidence = [
        {
            "rank": c["rank"],
            "step": None,
            "ts_ns": c["ts_ns"],
            "name": c["name"],
            "kind": c["kind"],
            "dur_ns": c["dur_ns"],
        }
        | _first_launched(ctx, c)
        for c in top
    ]
    common = {"formula": formula, "substituted": substituted, "values": values, "evidence": evidence}
    startup_window = _startup_window(ctx)
    if startup_window and share >= INFO_SHARE:
        opening, whole = startup_window
        values["window"] = whole
        return finding(
            RULE,
            **common,
            severity="info",
            confidence="high",
            # the window is start-up: its steady step time holds (almost) nothing, so the profiled span is the basis
            impact=min(1.0, share),
            impact_basis=PROFILED_SPAN,
            cost_ns=int(cold),
            title=f"{opening}: {whole}; start-up calls take {ms(cold)} = {share:.0%} of the profiled span ({parts})",
            next_check=(
                "Re-capture after warm-up: start the profiler after a few steps (torch.profiler "
                "schedule(skip_first=…, wait=…, warmup=1, active=…)), CUDA_MODULE_LOADING=EAGER for the measurement."
            ),
        )
    if share < INFO_SHARE:
        return passed(
            RULE,
            **common,
            confidence="high",
            title=f"Warm window: start-up calls take {share:.2%} of the profiled span ({parts})" + _repeats(facts),
        )
    reaches = wt.share(inside) >= INFO_SHARE  # the start-up work reaches into the window the other rules measure
    return finding(
        RULE,
        **common,
        severity="warning" if share >= WARNING_SHARE and reaches else "info",
        confidence="high",
        impact=wt.share(inside),
        impact_basis=wt.basis,
        cost_ns=int(cold),  # paid once, not per step
        title=(
            f"Cold window: start-up work takes {ms(cold)} = {share:.0%} of the profiled span ({parts}), "
            + (
                f"{ms(inside)} = {wt.share(inside):.0%} of {wt.basis}: step and idle measurements here overstate the "
                "steady state"
                if reaches
                else f"{ms(inside)} of it inside {wt.basis}: before the window, which its measurements leave out"
            )
            + _repeats(facts)
        ),
        next_check=(
            "Profile after warm-up: start the profiler after a few steps (or give it wait/warmup steps), set "
            "CUDA_MODULE_LOADING=EAGER for the measurement, and let the caching allocator reach its size first."
        ),
    )
