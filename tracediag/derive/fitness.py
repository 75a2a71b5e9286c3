"""Window fitness: what the profiled window holds, and whether the rules can judge it.

Before any rule runs, each rank's window is split into segments and judged for completeness; the table
`window_fitness` (window_fitness.sql: one row per rank of a profiler trace) holds the numbers, `summarize` the
verdict the engine, the report and findings.json read.

Segments (the bounds are computed in derive/windows.py, with the stalls, from `startup_end` below):

* **start-up** — from the trace start to the first GPU work, extended through each start-up call (allocation,
  module loading, initialisation, a first launch that loads a module or compiles) after which the window since
  the first GPU work is still at least half start-up idle; KRN010 judges it, nothing else counts it as a stall;
* **profiler stop** — from the end of the last GPU work to the trace end: the final synchronisation and the flush;
* **steady** — between them: what the kernel and step rules measure.

Classes, the first that applies (for the whole analysis: the worst of its ranks):

* `too_short` — fewer than TOO_FEW_EVENTS recorded events on the rank: nothing to measure;
* `gpu_stripped` — a GPU job (NCCL/RCCL backend, device properties or runtime calls) with no GPU activity
  recorded: the device events were left out of the trace;
* `sampled` — the recorded events are a sample: the CPU ops' external ids (numbered one per op by the profiler)
  step by a median of at least 2, or the runtime calls' correlation ids by a median of at least
  SAMPLED_CORRELATION_GAP (a whole trace: 1 and 1–11 in every unsampled trace here);
* `startup_only` — no kernel starts after the start-up segment: the window holds start-up work only;
* `startup_dominated` — the start-up segment takes at least STARTUP_DOMINATES of the trace span: what steady work
  follows it is too little to speak for the run (HTA's A100 `simple_add`: 41.1 s of stream creation and frees,
  then 2.1 ms of kernels). The rules still measure that steady segment; only the verdict cannot rest on it;
* `graph_capture` — CUDA/HIP stream captures (`cudaStreamBeginCapture` … `cudaStreamEndCapture` on one thread) cover
  at least CAPTURE_DOMINATES of the steady segment: the window records a graph capture (vLLM's and SGLang's warm-up,
  the companion trace `--graph-capture` reads), not serving. A launch inside a capture is recorded into the graph and
  does not run, so the GPU idles while the host captures: idle, launch and step times describe the capture. Rules that
  need a steady window report not applicable (BLOCKS);
* `clipped` — the window starts inside GPU work launched before it, or ends before launched work ran (GPU
  operations whose launch is older than every launch in the trace; launches newer than every GPU operation):
  fit, the edge steps may be partial;
* `steady` — a steady segment with every event recorded;
* `cpu_only` — no GPU activity and no GPU backend (a CPU trace): fit, no segments.

The first six are unfit: a verdict that found no problem is `inconclusive` (tracediag/findings.py), with what to
re-capture (RECAPTURE); rules that declare they need a complete window (RuleMeta.requires_window = "complete":
every event of the window) or a steady one ("steady": complete, and steady work beyond start-up that is not a graph
capture) report "not applicable" with the reason under the classes BLOCKS names.

The summary also carries the workload's domain (derive/domain.py, table `workload_domain`): training or inference,
LLM or another model kind — the report header shows it and rules fit their advice to it.
"""

from __future__ import annotations

import re
from typing import Any

import duckdb
import numpy as np

from tracediag.derive import domain
from tracediag.derive import intervals as iv
from tracediag.derive.graph_capture import statement as graph_capture_statement
from tracediag.store import run_sql_file

# The derivation's declaration (tracediag/derive/__init__.py reads it from this source).
# the domain (domain.py, built here) reads the kernel classes, decode steps and GEMM shapes
REQUIRES = (
    "kernels",
    "cpu_ops",
    "runtime",
    "kernels.klass",
    "cpu_ops.klass",
    "memops",
    "annotations",
    "inputs",
    "gpu_timeline",
    "steps.phase",
    "gemm_shapes",
)
PROVIDES = ("window_fitness",)

STARTUP_SHARE = 0.5  # start-up goes on while start-up calls hold at least half of the window since the first GPU work
STARTUP_DOMINATES = 0.75  # a start-up segment this share of the trace span leaves too little steady work to judge
CAPTURE_DOMINATES = 0.5  # stream captures covering this share of the steady segment: the window is a graph capture
TOO_FEW_EVENTS = 10  # a rank with fewer recorded events (kernels, copies, runtime calls, CPU ops, annotations)
SAMPLED_EXTERNAL_GAP = 2  # median step of the CPU ops' external ids in a sampled trace (1 in a whole one)
SAMPLED_CORRELATION_GAP = 25  # median step of the runtime calls' correlation ids (1–11 in whole traces)
MIN_IDS = 20  # ... judged on at least this many ids
GPU_BACKEND = re.compile(r"nccl|rccl|hccl|xccl|cuda|hip", re.I)

# a slow launch whose kernels all ran before on the rank (derive/windows.py): nothing left to load or compile, so
# not a start-up call but a host-blocking stall of the steady state
REPEAT_LAUNCH = "slow launch of a kernel that ran before (host contention or a full launch queue)"
# a kernel launched to an idle GPU starts within tens of µs (launch latency); idle longer than this after the launch of
# the work that ends a gap is the GPU holding queued work, not the host late with it (derive/windows.py)
QUEUE_LATENCY_NS = 50_000
UNFIT = ("too_short", "gpu_stripped", "sampled", "startup_only", "startup_dominated", "graph_capture")
ORDER = (*UNFIT, "clipped", "steady", "cpu_only")
# what each requirement of a rule cannot be met by (a window mostly start-up still has a steady segment to measure;
# a capture's steady segment is the capture)
BLOCKS = {
    "complete": ("too_short", "gpu_stripped", "sampled"),
    "steady": ("too_short", "gpu_stripped", "sampled", "startup_only", "graph_capture"),
}
NEEDS = {
    "complete": "this rule needs every event of the window",
    "steady": "this rule needs whole steady steps",
}

COLUMNS = (
    "rank",
    "format",
    "backend",
    "events",
    "gpu_events",
    "kernels",
    "runtime_calls",
    "cpu_ops",
    "trace_ns",
    "startup_ns",
    "steady_ns",
    "stop_ns",
    "steady_kernels",
    "correlation_gap_median",
    "correlation_gap_p90",
    "external_id_gap_median",
    "external_id_gap_p90",
    "launched_before_window",
    "launches_after_window",
    "graph_captures",
    "graph_capture_ns",
    "fitness_class",
    "why",
)  # fmt: skip  (the columns of window_fitness.sql, in order)

# What to capture instead, per unfit class: shown after a "Re-capture:" label (report header, verdict, terminal).
RECAPTURE = {
    "too_short": (
        "Capture a longer window with every event: several whole steps after warm-up (torch.profiler with "
        "schedule(wait=…, warmup=…, active=…) and prof.step() per step; vLLM: --profiler-config "
        '\'{"profiler": "torch", "torch_profiler_dir": "/abs/dir"}\', or VLLM_TORCH_PROFILER_DIR before '
        "v0.13, then /start_profile and /stop_profile around a few requests)."
    ),
    "gpu_stripped": (
        "Record GPU activity: torch.profiler activities=[ProfilerActivity.CPU, "
        "ProfilerActivity.CUDA] (ROCm uses CUDA too), or nsys profile -t cuda,nvtx; keep the device events when "
        "the trace is filtered or exported."
    ),
    "sampled": (
        "Without sampling or filtering: a short window in full beats a long one sampled — "
        "torch.profiler schedule(wait=…, warmup=…, active=2–5 steps), every event kept (no trace filter or "
        "sampler on the export); vLLM: --profiler-config (v0.13+) or VLLM_TORCH_PROFILER_DIR, a few requests."
    ),
    "startup_only": (
        "After warm-up: start the profiler after a few steps (torch.profiler "
        "schedule(skip_first=…, wait=…, warmup=1, active=…)); vLLM and SGLang warm up and capture graphs at start "
        "— start profiling (/start_profile) once the server serves, with --profiler-config or "
        "VLLM_TORCH_PROFILER_DIR; CUDA_MODULE_LOADING=EAGER for the measurement."
    ),
}
RECAPTURE["startup_dominated"] = RECAPTURE["startup_only"]
RECAPTURE["graph_capture"] = (
    "The replay, not the capture: once the server serves, POST /start_profile, send a few requests, then "
    "/stop_profile (vLLM started with --profiler-config or VLLM_TORCH_PROFILER_DIR, SGLang with "
    "SGLANG_TORCH_PROFILER_DIR; or tracediag capture), and analyse that trace with this one beside it as "
    "--graph-capture: the replayed kernels then get the ops that captured them."
)


def startup_end(g_first: int, cold: list[tuple[int, int, np.ndarray, np.ndarray]], g_last: int) -> int:
    """End of the start-up segment: the first GPU work `g_first`, extended to the end of each start-up call
    `(start, end, idle starts, idle ends)` that begins before the last GPU work `g_last` and after which the
    window since `g_first` is still at least STARTUP_SHARE idle in start-up calls."""
    parts = [(gs, ge) for _, _, gs, ge in cold]
    if not parts:
        return g_first
    cs, ce = iv.merge_intervals(np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
    before = int(iv.covered(cs, ce, np.array([g_first]))[0])
    end = g_first
    for ts, e, _, _ in sorted(cold, key=lambda c: c[1]):
        if ts >= g_last or e <= g_first:
            continue
        e = min(e, g_last)
        idle = int(iv.covered(cs, ce, np.array([e]))[0]) - before
        if idle >= STARTUP_SHARE * (e - g_first):
            end = max(end, e)
    return end


_RANK_SQL = """
WITH r AS (SELECT rank, any_value(format) AS format, any_value(backend) AS backend,
                  any_value(device_name) AS device, min(trace_start_ns) AS t0, max(trace_end_ns) AS t1
           FROM inputs WHERE rank IS NOT NULL AND format IN ('kineto', 'nsys-sqlite', 'nsys-rep') GROUP BY rank),
n AS (SELECT rank, count(*) AS n FROM kernels GROUP BY rank),
m AS (SELECT rank, count(*) AS n FROM memops GROUP BY rank),
rt AS (SELECT rank, count(*) AS n FROM runtime GROUP BY rank),
op AS (SELECT rank, count(*) AS n FROM cpu_ops GROUP BY rank),
an AS (SELECT rank, count(*) AS n FROM annotations GROUP BY rank)
SELECT r.*, coalesce(n.n, 0) AS kernels, coalesce(m.n, 0) AS memops, coalesce(rt.n, 0) AS runtime_calls,
       coalesce(op.n, 0) AS cpu_ops, coalesce(an.n, 0) AS annotations
FROM r LEFT JOIN n USING (rank) LEFT JOIN m USING (rank) LEFT JOIN rt USING (rank) LEFT JOIN op USING (rank)
LEFT JOIN an USING (rank) ORDER BY rank
"""
# consecutive ids of one rank: the step from each to the next (a profiler numbers every call / op once)
# gaps between consecutive ids of a rank (`ids`: rank, id): the correlation ids of the runtime calls, the
# external ids of the CPU ops
_GAPS = """
g AS (SELECT rank, id - lag(id) OVER (PARTITION BY rank ORDER BY id) AS d FROM ids)
SELECT rank, median(d) AS med, quantile_cont(d, 0.9) AS p90, count(*) AS n FROM g WHERE d IS NOT NULL GROUP BY rank
"""
_CORRELATION_GAPS_SQL = (
    "WITH ids AS (SELECT DISTINCT rank, correlation AS id FROM runtime WHERE correlation > 0)," + _GAPS
)
_EXTERNAL_ID_GAPS_SQL = (
    "WITH ids AS (SELECT DISTINCT rank, external_id AS id FROM cpu_ops WHERE external_id > 0)," + _GAPS
)
_CLIPPED_SQL = """
WITH gpu AS (SELECT rank, correlation FROM kernels WHERE correlation > 0
             UNION ALL SELECT rank, correlation FROM memops WHERE correlation > 0),
launch AS (SELECT rank, correlation FROM runtime
           WHERE correlation > 0 AND regexp_matches(name, '(?i)launch|memcpy|memset')),
lo AS (SELECT rank, min(correlation) AS c FROM launch GROUP BY rank),
hi AS (SELECT rank, max(correlation) AS c FROM gpu GROUP BY rank),
-- joins per rank, not subqueries per rank: one scan of each table however many ranks (an nsys export with one
-- device per kernel has 4,010)
b AS (SELECT g.rank, count(*) AS n FROM gpu g JOIN lo ON lo.rank = g.rank
      WHERE g.correlation < lo.c
        AND NOT EXISTS (SELECT 1 FROM runtime x WHERE x.rank = g.rank AND x.correlation = g.correlation)
      GROUP BY g.rank),
a AS (SELECT l.rank, count(*) AS n FROM launch l JOIN hi ON hi.rank = l.rank
      WHERE l.correlation > hi.c
        AND NOT EXISTS (SELECT 1 FROM gpu g WHERE g.rank = l.rank AND g.correlation = l.correlation)
      GROUP BY l.rank)
SELECT r.rank, coalesce(b.n, 0) AS before_window, coalesce(a.n, 0) AS after_window
FROM (SELECT DISTINCT rank FROM gpu) r LEFT JOIN b USING (rank) LEFT JOIN a USING (rank)
"""


# each stream capture: a begin call and the next end call on its thread (a capture left open at the window's end is
# not counted: where it ends is not recorded)
_CAPTURES_SQL = """
WITH ev AS (SELECT rank, tid, ts_ns, ts_ns + dur_ns AS te, name,
                   regexp_matches(name, '^(cuda|hip)StreamBeginCapture') AS is_begin
            FROM runtime WHERE regexp_matches(name, '^(cuda|hip)Stream(Begin|End)Capture')),
o AS (SELECT *, lead(is_begin) OVER w AS next_is_begin, lead(te) OVER w AS next_te FROM ev
      WINDOW w AS (PARTITION BY rank, tid ORDER BY ts_ns, is_begin DESC))
SELECT rank, ts_ns, next_te, name FROM o
WHERE is_begin AND next_is_begin = false AND ts_ns IS NOT NULL AND next_te IS NOT NULL ORDER BY rank, ts_ns
"""


def _capture_cover(con: duckdb.DuckDBPyConnection, timeline: dict) -> dict[int, tuple[int, int, str]]:
    """Per rank: (stream captures, ns of the steady segment they cover, the begin call's name)."""
    by_rank: dict[int, list[tuple[int, int, str]]] = {}
    for rank, s, e, name in con.execute(_CAPTURES_SQL).fetchall():
        by_rank.setdefault(rank, []).append((s, e, name))
    out = {}
    for rank, caps in by_rank.items():
        s0, s1, _, _ = timeline.get(rank, (None, None, None, None))
        ns = 0
        if s0 is not None and s1 is not None:
            cs, ce = iv.merge_intervals(np.array([c[0] for c in caps]), np.array([c[1] for c in caps]))
            ns = iv.total(*iv.clip(cs, ce, s0, s1))
        out[rank] = (len(caps), ns, re.sub(r"_v\d+$", "", caps[0][2]))  # nsys: cudaStreamBeginCapture_v10000
    return out


def build(con: duckdb.DuckDBPyConnection) -> None:
    cur = con.execute(_RANK_SQL)
    cols = [d[0] for d in cur.description]
    ranks = [dict(zip(cols, row)) for row in cur.fetchall()]
    corr = {r[0]: r[1:] for r in con.execute(_CORRELATION_GAPS_SQL).fetchall()}
    ext = {r[0]: r[1:] for r in con.execute(_EXTERNAL_ID_GAPS_SQL).fetchall()}
    clipped = {r[0]: r[1:] for r in con.execute(_CLIPPED_SQL).fetchall()}
    timeline = {
        r[0]: r[1:]
        for r in con.execute(
            "SELECT rank, startup_end_ns, stop_ts_ns, steady_span_ns, steady_kernels FROM gpu_timeline"
        ).fetchall()
    }
    captures = _capture_cover(con, timeline)
    rows = []
    for r in ranks:
        rank, t0, t1 = r["rank"], r["t0"], r["t1"]
        c_med, c_p90, c_n = corr.get(rank, (None, None, 0))
        e_med, e_p90, e_n = ext.get(rank, (None, None, 0))
        before, after = clipped.get(rank, (0, 0))
        s0, s1, steady, steady_kernels = timeline.get(rank, (None, None, None, None))
        n_captures, capture_ns, capture_call = captures.get(rank, (0, 0, None))
        row = {
            "rank": rank,
            "format": r["format"],
            "backend": r["backend"],
            "events": r["kernels"] + r["memops"] + r["runtime_calls"] + r["cpu_ops"] + r["annotations"],
            "gpu_events": r["kernels"] + r["memops"],
            "kernels": r["kernels"],
            "runtime_calls": r["runtime_calls"],
            "cpu_ops": r["cpu_ops"],
            "trace_ns": t1 - t0 if t0 is not None and t1 is not None else None,
            "startup_ns": s0 - t0 if s0 is not None and t0 is not None else None,
            "steady_ns": steady,
            "stop_ns": max(0, t1 - s1) if s1 is not None and t1 is not None else None,
            "steady_kernels": steady_kernels,
            "correlation_gap_median": c_med if c_n >= MIN_IDS else None,
            "correlation_gap_p90": c_p90 if c_n >= MIN_IDS else None,
            "external_id_gap_median": e_med if e_n >= MIN_IDS else None,
            "external_id_gap_p90": e_p90 if e_n >= MIN_IDS else None,
            "launched_before_window": before,
            "launches_after_window": after,
            "graph_captures": n_captures,
            "graph_capture_ns": capture_ns,
        }
        row["fitness_class"], row["why"] = classify(row, gpu_job=_gpu_job(r), capture_call=capture_call)
        rows.append(row)
    run_sql_file(con, "tracediag.derive", "window_fitness.sql")
    domain.build(con)
    if rows:
        # one Arrow table, not executemany: DuckDB binds executemany row by row (8 s for the 4,010 ranks of an nsys
        # export with one device per kernel)
        import pyarrow as pa  # here, not at import: a Parquet store is analysed without pyarrow (no derive)

        fitness_rows = pa.table({c: [r[c] for r in rows] for c in COLUMNS})  # noqa: F841 (read by name below)
        con.execute(f"INSERT INTO window_fitness SELECT {', '.join(COLUMNS)} FROM fitness_rows")


def _gpu_job(r: dict[str, Any]) -> bool:
    return bool(GPU_BACKEND.search(r["backend"] or "") or r["device"] or r["runtime_calls"])


def _n(x: float | None) -> str:
    return "?" if x is None else f"{x:g}"


def _duration(ns: float) -> str:
    return f"{ns / 1e9:.3g} s" if ns >= 1e9 else f"{ns / 1e6:.3g} ms"


def classify(row: dict[str, Any], gpu_job: bool, capture_call: str | None = None) -> tuple[str, str]:
    """(class, why in words with its numbers) of one rank's window; `capture_call` names the rank's stream-capture
    begin call (cudaStreamBeginCapture, hipStreamBeginCapture) when it has one."""
    if row["events"] < TOO_FEW_EVENTS:
        return "too_short", (
            f"too short: {row['events']} recorded event{'s' if row['events'] != 1 else ''} (kernels, copies, runtime "
            f"calls, CPU ops, annotations; fewer than {TOO_FEW_EVENTS})"
        )
    if not row["gpu_events"]:
        if gpu_job:
            return "gpu_stripped", (
                f"GPU events stripped: a GPU job (backend {row['backend'] or '?'}) whose trace records no kernel and "
                f"no copy ({row['cpu_ops']:,} CPU ops, {row['runtime_calls']:,} runtime calls)"
            )
        return "cpu_only", "a CPU trace: no GPU activity and no GPU backend"
    e_med, c_med = row["external_id_gap_median"], row["correlation_gap_median"]
    gapped_ops = e_med is not None and e_med >= SAMPLED_EXTERNAL_GAP
    if gapped_ops or (c_med is not None and c_med >= SAMPLED_CORRELATION_GAP):
        keep = f"about 1 in {c_med:g} runtime calls kept" if c_med else "a sample of the CPU ops kept"
        return "sampled", (
            f"sampled: the CPU ops' external ids step by a median of {_n(e_med)} "
            f"(p90 {_n(row['external_id_gap_p90'])}; "
            f"1 when every op is recorded) and the runtime calls' correlation ids by a median of {_n(c_med)} "
            f"(p90 {_n(row['correlation_gap_p90'])}): {keep}"
        )
    if not row["kernels"]:  # GPU copies and no kernel at all: no GPU timeline, nothing steady to measure
        return "startup_only", (
            f"start-up only: no kernel in the trace ({row['gpu_events']:,} GPU copies or memsets, "
            f"{row['runtime_calls']:,} runtime calls): nothing steady to measure"
        )
    if not row["steady_kernels"]:
        return "startup_only", (
            f"start-up only: no kernel starts after the start-up segment ({(row['startup_ns'] or 0) / 1e6:.3g} ms of "
            f"the {(row['trace_ns'] or 0) / 1e6:.3g} ms trace: first GPU work, allocations, module loading and cold "
            f"first launches); {row['kernels']} kernel{'s' if row['kernels'] != 1 else ''} in all"
        )
    startup, trace = row["startup_ns"] or 0, row["trace_ns"] or 0
    if trace and startup >= STARTUP_DOMINATES * trace:
        return "startup_dominated", (
            f"mostly start-up: the start-up segment takes {_duration(startup)} = {startup / trace:.1%} of the "
            f"{_duration(trace)} trace (first GPU work, allocations, module loading and cold first launches), then "
            f"{_duration(row['steady_ns'] or 0)} of steady GPU work ({row['steady_kernels'] or 0:,} "
            f"kernel{'s' if row['steady_kernels'] != 1 else ''}): too little to speak for the run"
        )
    steady, cap = row["steady_ns"] or 0, row.get("graph_capture_ns") or 0
    if steady and cap >= CAPTURE_DOMINATES * steady:
        n = row["graph_captures"]
        begin = capture_call or "StreamBeginCapture"
        end = begin.replace("Begin", "End")
        return "graph_capture", (
            f"a graph capture: {n:,} stream capture{'s' if n != 1 else ''} ({begin} … {end}) cover {_duration(cap)} = "
            f"{cap / steady:.0%} of the {_duration(steady)} steady segment; a launch inside a capture is recorded "
            "into the graph, not run, so the idle, launch and step times here are the capture's, not serving's"
        )
    if row["launched_before_window"] or row["launches_after_window"]:
        return "clipped", (
            f"clipped: {row['launched_before_window']:,} GPU operations at the start were launched before the window, "
            f"{row['launches_after_window']:,} launches at the end ran after it; the edge steps may be partial"
        )
    return "steady", (
        f"steady: {(row['steady_ns'] or 0) / 1e6:.3g} ms of steady GPU work ({row['steady_kernels'] or 0:,} kernels) "
        f"after {(row['startup_ns'] or 0) / 1e6:.3g} ms of start-up, "
        # a GPU-only trace holds every GPU event and nothing of the host side (summarize's host_side says what)
        + ("every event recorded" if row["cpu_ops"] or not row["kernels"] else "every GPU event recorded, no CPU op")
    )


def summarize(con: duckdb.DuckDBPyConnection, graph_capture: str | None = None) -> dict[str, Any] | None:
    """The analysis's fitness: the worst rank's class, why, the numbers per rank, and what to re-capture; the
    workload's domain; the GPU time replayed from graphs and how much of it no CPU op accounts for (attributed to
    the capturing ops when `graph_capture`, the capture trace, is given: derive/graph_capture.py); None when no
    input is a profiler trace (or the store predates this table)."""
    try:
        cur = con.execute("SELECT * FROM window_fitness ORDER BY rank")
    except duckdb.CatalogException:
        return None
    cols = [d[0] for d in cur.description]
    ranks = [dict(zip(cols, r)) for r in cur.fetchall()]
    if not ranks:
        return None
    worst = min(ranks, key=lambda r: (ORDER.index(r["fitness_class"]), r["rank"]))
    cls = worst["fitness_class"]
    same = [r["rank"] for r in ranks if r["fitness_class"] == cls]
    where = f"rank {same[0]}" if len(same) == 1 else f"ranks {', '.join(map(str, same))}"
    out = {
        "class": cls,
        "fit": cls not in UNFIT,
        "why": worst["why"] if len(ranks) == 1 else f"{worst['why']} ({where} of {len(ranks)})",
        "ranks": ranks,
    }
    if cls in RECAPTURE:
        out["recapture"] = RECAPTURE[cls]
    dom = domain.read(con)
    if dom is not None:
        out["domain"] = dom
    host = host_side(ranks)
    if host is not None:
        out["host_side"] = host
    replay = graph_capture_statement(con, graph_capture)
    if replay is not None:
        out["graph_replay"] = replay
    return out


def host_side(ranks: list[dict[str, Any]]) -> dict[str, Any] | None:
    """What a GPU-only trace lacks: no rank with kernels recorded a CPU op (a profile taken without CPU activity, an
    Nsight export without PyTorch's NVTX ranges), so operator names and shapes, the op that launched each kernel and
    the host gaps between ops are not in it (and no launch call either when there are no runtime calls). None when
    the host side is there. The analysis adds the rules this leaves without an input (analysis.py)."""
    gpu = [r for r in ranks if r["kernels"]]
    if not gpu or any(r["cpu_ops"] for r in gpu):
        return None
    runtime = sum(r["runtime_calls"] or 0 for r in gpu)
    missing = "CPU ops" if runtime else "CPU ops and no runtime (launch) calls"
    lacks = "operator names and shapes, the op that launched each kernel and the host time between ops"
    if not runtime:
        lacks += ", and when each kernel was launched"
    return {
        "cpu_ops": 0,
        "runtime_calls": runtime,
        "why": (
            f"the host side is missing: {sum(r['kernels'] for r in gpu):,} kernels and no {missing} (a profile "
            "without CPU activity, or an Nsight export without PyTorch's NVTX op ranges): "
            f"{lacks} are not in the trace; kernels are classified by their names alone"
        ),
    }


def unfit_reason(fitness: dict[str, Any] | None, need: str | None) -> str | None:
    """'window unfit: sampled: …; this rule needs every event of the window' when a rule that declares `need`
    cannot be judged on this window, else None."""
    if not fitness or not need or fitness["class"] not in BLOCKS[need]:
        return None
    return f"window unfit: {fitness['why']}; {NEEDS[need]}"
