"""KRN006 Host-bound steps: host-blocking stalls, GPU idle inside steps, GPU idle between steps.

Hypothesis: decode steps are short, so the host's work per step — launching hundreds of small kernels,
Python, a blocking copy or a synchronisation — can leave the GPU idle for a large share of the time;
then no kernel, batch or quantization change helps until the host side does. Three places hold that
idle time and are measured apart, each once: (1) host-blocking stalls — a synchronous copy, a
synchronize API — during which the GPU has nothing to run; (2) idle gaps inside a step's GPU window; (3) idle
time between steps (the engine's host loop: scheduling, sampling, detokenizing, synchronous output copies).
Who waits for whom: idle time in which the GPU already held the work that ends the gap (launched more than the
launch latency before it ran: the host ahead, the GPU behind) is the GPU's own wait — a stream or event dependency, a
collective, another stream — and is measured apart from the host-bound idle (derive/windows.py); a host call during
such a wait waits for the GPU and is no stall, and a synchronize after the last step is the profiler's stop.
Start-up is not counted: the start-up and profiler-stop segments of the window (derive/fitness.py) and the
start-up calls anywhere (allocations, module loading, initialisation, cold first launches) are KRN010's; their
idle time is kept out of every share here.

Formula: over each rank's steady segment (end of start-up to the end of the last GPU activity), busy = union of
kernels and copies; step windows = first to last GPU work a step launched (graph replays included), clipped so
that windows never overlap. stall share = GPU idle during host-blocking stalls / steady span; idle share of a
phase = Σ idle in its windows (stalls and start-up excluded) / Σ (window − stalls − start-up idle); idle
between steps = idle outside every window (stalls and start-up excluded) / steady span. Finding: stalls ≥ 1 %
of the span (warning from 10 %), a phase's host-bound idle ≥ 30 % (decode and mixed judged first), host-bound idle
between steps ≥ 30 % of the span, or queued idle ≥ 10 % of the span (warning from 30 %); an idle share of a
window of one step is `info` of low confidence with that caveat (a stall or a queued wait is not) — one marked step,
or the whole trace (no step markers) of a workload that may be an LLM engine's; the whole trace of a workload with
no prefill or decode (a CUDA or MPI program, a training or vision job) is everything the window ran, judged as a
rate like a window of many steps. The part that
costs the most leads; the finding's impact (what the verdict ranks) is its idle time / the window's step time
(analyses/basis.py). Launch facts: kernels per step, share of kernels < 10 µs, launch API time, graph launches,
launch-to-start time (how far the GPU runs behind the host).

Evidence: each stall (call, the CPU op around it with its shapes, its GPU idle time, the step), the longest
idle gap inside a step and what the host did during it — the innermost host spans (CPU ops, Python frames, NVTX
ranges, runtime calls on the launching thread) that cover most of it, each with its share of the gap, and the
untraced host time when recorded spans cover less than half (analyses/host_gaps.py) — per-phase idle shares, the
between-step idle.

What to do: a stall → remove the blocking call from the step (pin and make the copy async, drop the
.item()/.cpu()/synchronize); many short kernels
and no graphs in decode → capture decode in CUDA/HIP graphs (or torch.compile cudagraphs) and batch more
sequences per step; idle between steps → overlap scheduling with the GPU (async scheduling, async output
processing), fewer synchronous copies of the sampled tokens.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from tracediag.analyses.basis import window_time
from tracediag.analyses.host_gaps import GapAttribution, GapDirection, attribute_gap, dims_text, gap_direction
from tracediag.analyses.kernels import (
    median,
    ms,
    phase_name,
    phase_order,
    source_of,
    unphased_name,
    workload_domain,
)
from tracediag.context import Context
from tracediag.derive.fitness import QUEUE_LATENCY_NS
from tracediag.derive.kernel_phase import SOURCE as INFERRED
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.measures import WHOLE_TRACE

ONE_STEP_CAVEAT = (
    "a window of one step, which is no rate: its idle time may be what the host does between steps (preparing the "
    "next one, which an overlap scheduler such as SGLang's or vLLM's async scheduling runs beside this one's GPU "
    "work) — profile several steps before acting"
)
RULE = RuleMeta(
    id="KRN006",
    step=5,
    title="Host-blocking stalls, GPU idle inside and between steps, launch overhead (host-bound decode)",
    requires_tables=("steps",),
    requires_window="steady",
    share_of_steady="span",
)
IDLE_SHARE = 0.3  # idle share of a phase's step time, or of the span between steps: host-bound
STALL_SHARE = 0.01  # stalls idling the GPU for this share of the span are a finding (info)
STALL_WARNING = 0.10  # ... a warning from this share
QUEUED_SHARE = 0.10  # GPU idle with work already launched for this share of the span is a finding (info) ...
QUEUED_WARNING = 0.30  # ... a warning from this share (the host-bound idle's threshold)
QUEUED_NAMED = 0.10  # a phase's idle names its queued part from this share of it
JUDGE_FIRST = ("decode", "mixed")


def _phase_table(steps: list[dict], unphased: str) -> list[dict]:
    by_phase: dict[str, list[dict]] = defaultdict(list)
    for s in steps:
        by_phase[phase_name(s["phase"], unphased)].append(s)
    table = []
    for ph, rows in sorted(by_phase.items(), key=lambda kv: phase_order(kv[0] if kv[0] in JUDGE_FIRST else None)):
        time = sum(r["step_ns"] for r in rows)
        kernels = sum(r["kernels"] for r in rows)
        idle = sum(r["gpu_idle_ns"] for r in rows)
        queued = sum(r["queued_idle_ns"] or 0 for r in rows)
        table.append(
            {
                "phase": ph,
                "steps": len(rows),
                "step_ns": time,
                "stall_ns": sum(r["stall_ns"] for r in rows),
                "gpu_idle_ns": idle,
                "idle_share": idle / time if time else 0.0,
                # idle with work already launched is the GPU's own wait (derive/windows.py); the rest the host's
                "queued_idle_ns": queued,
                "host_idle_share": (idle - queued) / time if time else 0.0,
                "idle_share_median_step": median([r["gpu_idle_ns"] / r["step_ns"] for r in rows if r["step_ns"]]),
                "kernels_per_step": kernels / len(rows),
                "short_kernel_share": sum(r["short_kernels"] or 0 for r in rows) / kernels if kernels else None,
                "max_gap_ns": max(r["max_gap_ns"] or 0 for r in rows),
                "launch_api_ns_per_step": sum(r["launch_api_ns"] or 0 for r in rows) / len(rows),
                "graph_launches": sum(r["graph_launches"] or 0 for r in rows),
                "graph_kernel_share": sum(r["graph_kernels"] or 0 for r in rows) / kernels if kernels else None,
            }
        )
    return table


def _phase_words(ctx: Context) -> dict[str, tuple[str, str]]:
    """(steps, step time) in words for the phases that need more than their name: steps with no phase — a
    training job's, a forward pass of a model with no prefill or decode (derive/domain.py), a trace with no attention
    kernel (not a prefill/decode workload), or an inference trace whose phase nothing tells — and phases inferred
    from the attention kernels (derive/kernel_phase.py)."""
    unphased = unphased_name(ctx)
    if unphased == "training" or (ctx.layout is not None and ctx.layout.workload == "training"):
        unknown = ("training steps", "training step time")
    elif unphased == "forward":
        unknown = ("forward steps", "forward step time")
    else:
        attention = ctx.scalar("SELECT count(*) FROM kernel_steps WHERE klass IN ('attention', 'attention_fallback')")
        why = (
            "phase unknown: no step annotation, attention shape or prefill/decode-only attention kernel"
            if attention
            else "no attention kernel in the trace: not a prefill/decode workload"
        )
        unknown = (f"the steps ({why})", f"step time ({why})")
    words = {phase_name(None, unphased): unknown}
    for r in ctx.rows("SELECT DISTINCT phase FROM steps WHERE phase_source = ? ORDER BY phase", [INFERRED]):
        words[r["phase"]] = (f"{r['phase']} steps ({INFERRED})", f"{r['phase']} step time ({INFERRED})")
    return words


def _steps(t: dict, words: dict[str, tuple[str, str]]) -> str:
    """'decode steps'; a phase in _phase_words in its words."""
    return words.get(t["phase"], (f"{t['phase']} steps",))[0]


def _step_time(t: dict, words: dict[str, tuple[str, str]]) -> str:
    return words[t["phase"]][1] if t["phase"] in words else f"{t['phase']} step time"


def _gap_cause(ctx: Context, w: dict, t: dict) -> tuple[GapAttribution | None, str, str]:
    """What the host did during the longest gap of step row `w` (host_gaps.py), and the cause/next check for
    phase row `t`."""
    t0, gap = w["max_gap_start_ns"], w["max_gap_ns"] or 0
    host = attribute_gap(ctx, w["rank"], t0, gap) if t0 is not None and gap else None
    no_graphs = not t["graph_launches"]
    waits = gap_direction(ctx, w["rank"], t0, gap, QUEUE_LATENCY_NS) if t0 is not None and gap else None
    if waits is not None and waits.queued:  # the GPU held the work that ends the gap: no host work explains it
        cause = (
            f"the longest gap ({ms(gap)}) is the GPU's own wait: {ms(waits.queued_ns)} of it with "
            f"{waits.words()} already launched"
        )
        nxt = (
            "Find what the queued work waits for (the stream-wait / event calls before its launch, other streams, "
            "a collective's peers): the host was ahead of the GPU in that gap."
        )
    elif (t["short_kernel_share"] or 0) >= 0.5 and no_graphs:
        cause = (
            f"{t['kernels_per_step']:.0f} kernels per step, {t['short_kernel_share']:.0%} shorter than 10 µs, "
            f"no graph launches in {_steps(t, _phase_words(ctx))}: launch-bound"
        )
        if ctx.layout is not None and ctx.layout.workload == "training":  # no sequences to batch: a larger batch
            nxt = (
                "Capture the training step in CUDA/HIP graphs (torch.compile mode='reduce-overhead', or "
                "torch.cuda.graphs) or fuse its small ops, and raise the per-GPU batch size."
            )
        else:
            nxt = "Capture the step in CUDA/HIP graphs (or torch.compile cudagraphs) and batch more sequences per step."
    else:
        cause = f"host work in the longest gap ({ms(gap)}): " + (host.words() if host else "no host event in the gap")
        if no_graphs and t["phase"] == "decode":
            cause += "; decode runs without CUDA/HIP graphs"
        nxt = "Move that host work off the step's critical path (overlap scheduling with GPU work), or make it async."
        if host and host.advice():
            nxt += " " + host.advice()
    return host, cause, nxt


@dataclass(frozen=True)
class HostBoundMeasure:
    """KRN006's numbers: stall, in-step and between-step idle over the steady GPU span, and the longest gap."""

    steps: list[dict]
    stalls: list[dict]
    span: int
    stall_ns: int
    between_ns: int
    stall_share: float
    between_share: float
    table: list[dict]
    judged: list[dict]  # the phase rows, decode and mixed first, then by idle share
    worst: dict
    w: dict  # the step of the worst phase with the longest GPU idle gap
    host: GapAttribution | None  # the host work covering that gap (analyses/host_gaps.py)
    gap_cause: str
    gap_next: str
    step_name: str | None
    values: dict
    words: dict = field(default_factory=dict)  # _phase_words
    queued_ns: int = 0  # steady GPU idle with work already launched (a device-side wait), stalls excluded
    queued_share: float = 0.0  # ... / steady span
    queued_between_ns: int = 0  # ... of it between steps
    waits: GapDirection | None = None  # the longest gap of the step that waited most, who waited for whom
    one_step: bool = False  # a window of one step, whose idle share is no rate (one_step_window)


def _values(m: dict) -> dict:
    table, w, timeline = m["table"], m["w"], m["timeline"]
    return {
        "steady_gpu_span_ns": m["span"],
        "gpu_busy_ns": sum(t["steady_busy_ns"] for t in timeline),
        "startup_and_stop_idle_ns": sum(t["startup_idle_ns"] for t in timeline),
        "startup_and_stop_idle": "GPU idle in the start-up and profiler-stop segments and during start-up calls: "
        "KRN010's, kept out of these shares",
        "stall_ns": m["stall_ns"],
        "stall_share_of_span": round(m["stall_share"], 4),
        "stalls": len(m["stalls"]),
        "idle_between_steps_ns": m["between_ns"],
        "idle_between_steps_share_of_span": round(m["between_share"], 4),
        "idle_share": {t["phase"]: round(t["idle_share"], 4) for t in table},
        "host_idle_share": {t["phase"]: round(t["host_idle_share"], 4) for t in table},
        "queued_idle_ns": m["queued_ns"],
        "queued_idle": "GPU idle with work already launched (the kernel that ends the gap was launched more than "
        f"{QUEUE_LATENCY_NS / 1e3:g} µs earlier): a device-side wait, not the host; judged apart from host-bound idle",
        "queued_idle_share_of_span": round(m["queued_ns"] / m["span"], 4) if m["span"] else 0.0,
        "longest_queued_gap": m["waits"].to_dict() if m["waits"] else None,
        "launch_to_start": m["lag"],
        "step_ns_without_stalls": {t["phase"]: t["step_ns"] for t in table},
        "step_ns_with_stalls": {t["phase"]: t["step_ns"] + t["stall_ns"] for t in table},
        "thresholds": {
            "idle_share": IDLE_SHARE,
            "stall_share": STALL_SHARE,
            "stall_warning": STALL_WARNING,
            "queued_share": QUEUED_SHARE,
            "queued_warning": QUEUED_WARNING,
        },
        "phases_judged_first": [t["phase"] for t in table if t["phase"] in JUDGE_FIRST],
        "longest_gap": {
            "rank": w["rank"],
            "step": w["step_id"],
            "gap_ns": w["max_gap_ns"],
            "host": [f"{h['name']} ({h['kind']}, {h['share']:.0%} of the gap, {h['role']})" for h in m["host"].spans]
            if m["host"]
            else [],
            "host_attribution": m["host"].to_dict() if m["host"] else None,
        },
    }


_LAG_SQL = """
SELECT quantile_cont(k.ts_ns - r.ts_ns, 0.5) AS median_ns, quantile_cont(k.ts_ns - r.ts_ns, 0.9) AS p90_ns,
       count(*) AS kernels
FROM kernels k
JOIN (SELECT rank, correlation, min(ts_ns) AS ts_ns FROM runtime WHERE correlation > 0 GROUP BY ALL) r
  ON r.rank = k.rank AND r.correlation = k.correlation
JOIN gpu_timeline t ON t.rank = k.rank AND k.ts_ns >= t.startup_end_ns AND k.ts_ns < t.stop_ts_ns
"""


def _launch_lag(ctx: Context) -> dict | None:
    """How far the GPU runs behind the host: the steady kernels' launch-to-start time (median, p90), or None."""
    row = ctx.rows(_LAG_SQL)[0]
    if not row["kernels"]:
        return None
    return {"median_ns": int(row["median_ns"]), "p90_ns": int(row["p90_ns"]), "kernels": row["kernels"]}


def measure(ctx: Context) -> HostBoundMeasure | str:
    """Every number KRN006 judges by, or the reason (a string) it does not apply."""
    if source_of(ctx) != "gpu_kernel":
        return "missing GPU kernels: a CPU-only trace has no GPU idle time to measure"
    steps = ctx.rows("SELECT * FROM step_activity WHERE gpu_span_ns > 0 ORDER BY rank, step_id")
    if not steps:
        return "missing GPU work inside engine steps (no launch of the trace is in a step)"
    timeline = ctx.rows("SELECT * FROM gpu_timeline ORDER BY rank")
    # host-blocking stalls of the steady state; start-up calls and the start-up / stop segments are KRN010's
    stalls = ctx.rows(
        "SELECT * FROM host_stalls WHERE segment = 'steady' AND NOT startup_call ORDER BY gpu_idle_ns DESC"
    )
    span = sum(t["steady_span_ns"] for t in timeline)
    stall_ns = sum(t["stall_ns"] for t in timeline)
    between_ns = sum(t["idle_between_ns"] for t in timeline)
    unphased = unphased_name(ctx)
    table = _phase_table(steps, unphased)
    judged = sorted(table, key=lambda t: (t["phase"] not in JUDGE_FIRST, -t["host_idle_share"]))
    worst = judged[0]
    stall_share = stall_ns / span if span else 0.0
    between_share = between_ns / span if span else 0.0
    w = max(
        (s for s in steps if phase_name(s["phase"], unphased) == worst["phase"]), key=lambda r: r["max_gap_ns"] or 0
    )
    host, gap_cause, gap_next = _gap_cause(ctx, w, worst)
    queued_ns = sum(t["queued_idle_in_windows_ns"] + t["queued_idle_between_ns"] for t in timeline)
    q = max(steps, key=lambda r: (r["queued_idle_ns"] or 0, r["max_gap_ns"] or 0))
    waits = (
        gap_direction(ctx, q["rank"], q["max_gap_start_ns"], q["max_gap_ns"], QUEUE_LATENCY_NS)
        if q["queued_idle_ns"] and q["max_gap_start_ns"] is not None
        else None
    )
    waits = waits if waits is not None and waits.queued else None  # named only when that gap is a queued wait
    step_name = ctx.scalar("SELECT name FROM steps WHERE rank = ? AND step_id = ?", [w["rank"], w["step_id"]])
    values = _values(
        {
            "table": table,
            "w": w,
            "timeline": timeline,
            "span": span,
            "stall_ns": stall_ns,
            "stall_share": stall_share,
            "stalls": stalls,
            "between_ns": between_ns,
            "between_share": between_share,
            "host": host,
            "queued_ns": queued_ns,
            "waits": waits,
            "lag": _launch_lag(ctx),
        }
    )
    return HostBoundMeasure(
        steps,
        stalls,
        span,
        stall_ns,
        between_ns,
        stall_share,
        between_share,
        table,
        judged,
        worst,
        w,
        host,
        gap_cause,
        gap_next,
        step_name,
        values,
        _phase_words(ctx),
        queued_ns,
        queued_ns / span if span else 0.0,
        sum(t["queued_idle_between_ns"] for t in timeline),
        waits,
        one_step_window(ctx, steps),
    )


def one_step_window(ctx: Context, steps: list[dict]) -> bool:
    """A window of one step whose idle share is no rate (ONE_STEP_CAVEAT): one marked step, or the whole trace of a
    workload that may be an LLM engine's. The whole trace of a workload with no prefill or decode (a CUDA or MPI
    program, a training or vision job: derive/domain.py) is no step of an engine loop: its idle share is one of
    everything the window ran, a rate like any other."""
    if len(steps) >= 2:
        return False
    whole = ctx.scalar("SELECT count(*) FROM steps WHERE marker_source <> ?", [WHOLE_TRACE]) == 0
    return not (whole and workload_domain(ctx).get("workload") not in ("llm", None))


def _evidence(ctx: Context, m: HostBoundMeasure) -> list[dict]:
    w = m.w
    evidence = [
        {
            "rank": s["rank"],
            "step": s["step_id"],
            "ts_ns": s["ts_ns"],
            "name": s["name"],
            "kind": f"host-blocking stall: {s['kind']}",
            "op": f"{s['op_name'] or '?'}{dims_text(s['op_dims'])}",
            "dur_ns": s["dur_ns"],
            "gpu_idle_ns": s["gpu_idle_ns"],
        }
        for s in m.stalls[:3]
    ] + [
        {
            "rank": w["rank"],
            "step": w["step_id"],
            "ts_ns": w["max_gap_start_ns"],
            "name": f"longest GPU idle gap in {m.step_name} (stalls excluded)",
            "gap_ns": w["max_gap_ns"],
            "phase": m.worst["phase"],
        }
    ]
    if m.waits:  # the queued work that ends the longest wait, where the host launched it
        evidence.append(
            {
                "rank": m.waits.rank,
                "ts_ns": m.waits.ts_ns + m.waits.gap_ns,
                "name": m.waits.ending,
                "kind": "GPU work already launched that ends the longest wait (the GPU held it)",
                "launched_by": m.waits.api,
                "launch_ns": m.waits.launch_ns,
                "waited_with": m.waits.waited_with,
                "gap_ns": m.waits.gap_ns,
                "queued_ns": m.waits.queued_ns,
            }
        )
    spans = m.host.spans if m.host else []
    evidence += [
        {
            "rank": w["rank"],
            "step": w["step_id"],
            "ts_ns": h["ts_ns"],
            "name": h["name"],
            "kind": f"host {h['kind']} during the gap ({h['role']})",
            "dur_ns": h["max_dur_ns"],
            "instances": h["instances"],
            "covered_ns": h["covered_ns"],
            "share_of_gap": round(h["share"], 4),
        }
        for h in spans
    ]
    if m.host and m.host.untraced:
        evidence.append(
            {
                "rank": w["rank"],
                "step": w["step_id"],
                "ts_ns": w["max_gap_start_ns"],
                "name": "untraced host time",
                "kind": "no recorded host span (CPU op, Python frame, NVTX range, runtime call) on the thread",
                "untraced_ns": m.host.untraced_ns,
                "share_of_gap": round(1 - m.host.covered_share, 4),
            }
        )
    return evidence[: ctx.settings.max_evidence]


def _stall_part(m: HostBoundMeasure) -> tuple:
    """The host-blocking stalls as (share, cost, severity, sentence, what to do)."""
    stalls, table = m.stalls, m.table
    s0 = stalls[0]
    ph = next((t["phase"] for t in table if t["stall_ns"]), None)
    with_without = ""
    if ph:
        t = next(t for t in table if t["phase"] == ph)
        with_without = (
            f" ({_step_time(t, m.words)} {ms(t['step_ns'] + t['stall_ns'])} with it, {ms(t['step_ns'])} without)"
        )
    return (
        m.stall_share,
        m.stall_ns,
        "warning" if m.stall_share >= STALL_WARNING else "info",
        f"host-blocking stall: {s0['name']} ({s0['kind']}) {ms(s0['dur_ns'])} in "
        f"{s0['op_name'] or 'no CPU op'}{dims_text(s0['op_dims'])}"
        + (f" and {len(stalls) - 1} more" if len(stalls) > 1 else "")
        + (" idle" if len(stalls) > 1 else " idles")
        + f" the GPU {ms(m.stall_ns)} = {m.stall_share:.0%} of the steady GPU time; kept out of step "
        f"times{with_without}",
        "Remove the blocking call from the step: pin the host memory and copy with non_blocking=True, drop the "
        ".item()/.cpu()/synchronize.",
    )


def _parts(m: HostBoundMeasure) -> list[tuple]:
    """The three measures over their thresholds, each with its cost; the largest leads the title."""
    parts = []
    if m.stalls and m.stall_share >= STALL_SHARE:
        parts.append(_stall_part(m))
    # an idle share of a single step is no rate (ONE_STEP_CAVEAT): info; a stall is a measured blocking call
    idle_severity = "info" if m.one_step else "warning"
    # host-bound idle is the idle the host left (the GPU had no work launched); idle with work already launched is
    # the GPU's own wait, a part of its own below
    for t in m.judged:
        if t["host_idle_share"] >= IDLE_SHARE:
            queued = (
                f"; {ms(t['queued_idle_ns'])} of it the GPU's own wait, with work already launched"
                if t["queued_idle_ns"] >= QUEUED_NAMED * t["gpu_idle_ns"]
                else ""
            )
            parts.append(
                (
                    t["host_idle_share"],
                    t["gpu_idle_ns"] - t["queued_idle_ns"],
                    idle_severity,
                    f"GPU idle {t['idle_share']:.0%} of {_step_time(t, m.words)} (stalls excluded{queued}); "
                    f"{m.gap_cause}"
                    if t is m.worst
                    else f"GPU idle {t['idle_share']:.0%} of {_step_time(t, m.words)}",
                    m.gap_next,
                )
            )
    host_between = m.between_ns - m.queued_between_ns
    if m.span and host_between / m.span >= IDLE_SHARE:
        parts.append(
            (
                host_between / m.span,
                host_between,
                idle_severity,
                f"GPU idle between steps {ms(m.between_ns)} = {m.between_share:.0%} of the steady GPU time (the "
                "engine's host loop: scheduling, sampling, output processing)",
                "Overlap the host loop with the GPU (async scheduling / output processing), cut synchronous copies of "
                "the sampled tokens.",
            )
        )
    if m.queued_share >= QUEUED_SHARE:  # a measured wait, like a stall: its severity holds in a window of one step
        parts.append(_queued_part(m))
    return parts


def _queued_part(m: HostBoundMeasure) -> tuple:
    """GPU idle with work already launched: the host is ahead, the GPU waits on something of its own."""
    lag = m.values.get("launch_to_start") or {}
    behind = f"; kernels start a median {ms(lag['median_ns'])} after their launch" if lag.get("median_ns") else ""
    longest = f"; the longest: {ms(m.waits.gap_ns)} before {m.waits.words()}" if m.waits and m.waits.queued else ""
    same_gap = m.host and m.waits and m.host.ts_ns == m.waits.ts_ns and m.host.spans
    waiting = f" ({m.host.spans[0]['name']} among them)" if same_gap else ""
    return (
        m.queued_share,
        m.queued_ns,
        "warning" if m.queued_share >= QUEUED_WARNING else "info",
        f"GPU waits with work already launched: idle {ms(m.queued_ns)} = {m.queued_share:.0%} of the steady GPU time "
        f"holding queued work{longest}{behind} — a device-side wait (a stream or event dependency, a collective "
        "waiting for another rank, a copy on another stream), not the host: the host calls during it wait for the GPU"
        + waiting,
        "Find what the queued work waits for: the stream-wait / event calls before its launch, the other streams "
        "and ranks it depends on (a collective's peers, a copy engine); the host is ahead here, so host-side "
        "changes do not shorten it.",
    )


def judge(ctx: Context, m: HostBoundMeasure) -> Check:
    """Status, severity and words from KRN006's numbers."""
    formula = (
        "stall share = Σ GPU idle during host-blocking stalls / steady span; idle share (phase) = Σ idle in windows, "
        "stalls and start-up excluded / Σ (window − stalls − start-up idle), of it host-bound: the idle before the "
        "launch of the work that ends each gap; idle between steps = idle outside windows / steady span; queued = "
        f"idle later than {QUEUE_LATENCY_NS / 1e3:g} µs after that launch (the GPU holding work) / steady span"
    )
    substituted = (
        f"stalls {ms(m.stall_ns)} / {ms(m.span)} = {m.stall_share:.3f}; "
        + "; ".join(
            f"{t['phase']}: {ms(t['gpu_idle_ns'])} / {ms(t['step_ns'])} = {t['idle_share']:.3f}" for t in m.table
        )
        + f"; between steps {ms(m.between_ns)} / {ms(m.span)} = {m.between_share:.3f}"
        + f"; queued {ms(m.queued_ns)} / {ms(m.span)} = {m.queued_share:.3f}"
    )
    common = {
        "formula": formula,
        "substituted": substituted,
        "values": m.values,
        "table": m.table,
        "evidence": _evidence(ctx, m),
    }
    parts = _parts(m)
    if not parts:
        return passed(
            RULE,
            **common,
            confidence="high",
            title=(
                "GPU busy inside steps: idle "
                + ", ".join(f"{t['idle_share']:.1%} of {_steps(t, m.words)}" for t in m.judged)
                + f"; {m.between_share:.1%} idle between steps, {m.stall_share:.1%} in host-blocking stalls"
            ),
        )
    # the largest cost leads: the parts are ranked on the window's time like every trace-side finding (a phase's own
    # idle share, which judges it, is a share of that phase's steps only)
    parts.sort(key=lambda p: -p[1])
    _, cost, severity, lead, nxt = parts[0]
    wt = window_time(ctx)
    common["values"] = common["values"] | wt.values(cost)
    common["substituted"] = f"{common['substituted']}; impact {wt.text(cost)}"
    rest = [p[3].split(";")[0] for p in parts[1:]]
    one_step = severity == "info" and m.one_step  # an idle share of one step leads (a stall is measured)
    if one_step:
        common["values"] = {**common["values"], "one_step_caveat": ONE_STEP_CAVEAT}
    return finding(
        RULE,
        **common,
        severity=severity,
        confidence="low" if one_step else "high",
        impact=wt.share(cost),
        impact_basis=wt.basis,
        cost_ns=int(cost),
        cost_per_step_ns=int(cost / len(m.steps)),
        title=lead[0].upper()
        + lead[1:]
        + (" — also: " + "; ".join(rest) if rest else "")
        + (f" — caveat: {ONE_STEP_CAVEAT}" if one_step else ""),
        next_check=nxt + (" " + " ".join(p[4] for p in parts[1:] if p[4] != nxt) if len(parts) > 1 else ""),
    )


def check(ctx: Context) -> Check:
    m = measure(ctx)
    if isinstance(m, str):
        return not_applicable(RULE, m)
    return judge(ctx, m)
