"""KRN006 Host-bound steps: GPU idle gaps and launch overhead (decode first).

Hypothesis: decode steps are short, so the host's work per step — launching hundreds of small kernels,
Python, a blocking copy or a synchronisation — can leave the GPU idle for a large share of the step;
then no kernel, batch or quantization change helps until the host side does. The same holds for any
step with a long idle gap.

Formula: per step, GPU idle = span − union of the busy intervals of the kernels (and copies) the step
launched (graph replays included); idle share = idle / span, per phase over its steps (decode and mixed
judged first, then the rest). Finding when a phase's idle share ≥ 0.3. Launch facts: kernels per step,
share of kernels < 10 µs, launch API time, graph launches, blocking host calls.

Evidence: the step with the longest idle gap and what the host was doing during it (blocking runtime
calls and the CPU ops that span the gap), per-phase idle shares, launch counts.

What to do: many short kernels and no graphs → capture decode in CUDA/HIP graphs (or torch.compile's
cudagraphs) and batch more sequences per step; a blocking call in the gap (cudaStreamSynchronize,
a pageable host→device copy, .item()/.cpu()) → remove the sync or pin and make the copy async;
long host ops in the gap → move the host work off the critical path (overlap scheduling with the GPU).
"""

from __future__ import annotations

from collections import defaultdict

import orjson

from tracediag.engine import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.rules._kernels import median, phase_name, phase_order, prepare, source_of

RULE = RuleMeta(
    id="KRN006",
    step=5,
    title="GPU idle gaps and launch overhead inside steps (host-bound decode)",
    requires_tables=("steps",),
)
IDLE_SHARE = 0.3  # idle share of a phase's GPU span at or above this: host-bound
JUDGE_FIRST = ("decode", "mixed")


def _host_in_gap(ctx: Context, rank: int, t0: int, t1: int) -> list[dict]:
    """Blocking runtime calls and the longest CPU ops overlapping [t0, t1) on this rank, largest overlap first."""
    rt = ctx.rows(
        """SELECT 'runtime' AS kind, name, ts_ns, dur_ns,
                  least(ts_ns + dur_ns, ?) - greatest(ts_ns, ?) AS overlap_ns
           FROM runtime WHERE rank = ? AND ts_ns < ? AND ts_ns + dur_ns > ?
           ORDER BY overlap_ns DESC LIMIT 3""",
        [t1, t0, rank, t1, t0],
    )
    ops = ctx.rows(
        """SELECT 'cpu_op' AS kind, name, ts_ns, dur_ns, input_dims,
                  least(ts_ns + dur_ns, ?) - greatest(ts_ns, ?) AS overlap_ns
           FROM cpu_ops WHERE rank = ? AND ts_ns < ? AND ts_ns + dur_ns > ? AND dur_ns < ?
           ORDER BY overlap_ns DESC, dur_ns ASC LIMIT 3""",
        [t1, t0, rank, t1, t0, 10 * (t1 - t0) + 1],
    )
    return [r for r in rt + ops if r["overlap_ns"] > 0.5 * (t1 - t0)] or (rt + ops)[:3]


def check(ctx: Context) -> Check:
    prepare(ctx)
    if source_of(ctx) != "gpu_kernel":
        return not_applicable(RULE, "missing GPU kernels: a CPU-only trace has no GPU idle gaps to measure")
    steps = ctx.rows("SELECT * FROM step_activity WHERE kernels > 0 ORDER BY rank, step_id")
    if not steps:
        return not_applicable(RULE, "missing GPU kernels inside engine steps (no launch of the trace is in a step)")
    steps = [s for s in steps if s["phase"]]
    if not steps:
        return not_applicable(
            RULE, "missing phases: no step with GPU kernels is a prefill, decode or mixed engine step (see SCH001)"
        )
    by_phase: dict[str, list[dict]] = defaultdict(list)
    for s in steps:
        by_phase[phase_name(s["phase"])].append(s)
    table = []
    for ph, rows in sorted(by_phase.items(), key=lambda kv: phase_order(kv[0] if kv[0] in JUDGE_FIRST else None)):
        span = sum(r["gpu_span_ns"] for r in rows)
        kernels = sum(r["kernels"] for r in rows)
        table.append(
            {
                "phase": ph,
                "steps": len(rows),
                "gpu_span_ns": span,
                "gpu_idle_ns": sum(r["gpu_idle_ns"] for r in rows),
                "idle_share": sum(r["gpu_idle_ns"] for r in rows) / span if span else 0.0,
                "idle_share_median_step": median(
                    [r["gpu_idle_ns"] / r["gpu_span_ns"] for r in rows if r["gpu_span_ns"]]
                ),
                "kernels_per_step": kernels / len(rows),
                "short_kernel_share": sum(r["short_kernels"] or 0 for r in rows) / kernels if kernels else None,
                "gaps_ge_10us_per_step": sum(r["gaps_ge_10us"] or 0 for r in rows) / len(rows),
                "max_gap_ns": max(r["max_gap_ns"] or 0 for r in rows),
                "launch_api_ns_per_step": sum(r["launch_api_ns"] or 0 for r in rows) / len(rows),
                "graph_launches": sum(r["graph_launches"] or 0 for r in rows),
                "graph_kernel_share": sum(r["graph_kernels"] or 0 for r in rows) / kernels if kernels else None,
                "sync_calls": sum(r["sync_calls"] or 0 for r in rows),
            }
        )
    judged = sorted(table, key=lambda t: (t["phase"] not in JUDGE_FIRST, -t["idle_share"]))
    bad = [t for t in judged if t["idle_share"] >= IDLE_SHARE]
    values = {
        "idle_share": {t["phase"]: round(t["idle_share"], 4) for t in table},
        "threshold": IDLE_SHARE,
        "phases_judged_first": [t["phase"] for t in table if t["phase"] in JUDGE_FIRST],
    }
    formula = "idle share = Σ(span − busy) / Σ span over a phase's steps (busy = union of kernel/copy intervals)"
    substituted = "; ".join(
        f"{t['phase']}: {t['gpu_idle_ns'] / 1e6:.3g} / {t['gpu_span_ns'] / 1e6:.3g} ms = {t['idle_share']:.3f}"
        for t in table
    )
    worst_phase = bad[0]["phase"] if bad else judged[0]["phase"]
    w = max(by_phase[worst_phase], key=lambda r: r["max_gap_ns"] or 0)
    t0 = w["max_gap_start_ns"]
    host = _host_in_gap(ctx, w["rank"], t0, t0 + w["max_gap_ns"]) if t0 is not None and w["max_gap_ns"] else []
    step_name = ctx.scalar("SELECT name FROM steps WHERE rank = ? AND step_id = ?", [w["rank"], w["step_id"]])
    evidence = [
        {
            "rank": w["rank"],
            "step": w["step_id"],
            "ts_ns": t0,
            "name": f"longest GPU idle gap in {step_name}",
            "gap_ns": w["max_gap_ns"],
            "phase": worst_phase,
        }
    ] + [
        {
            "rank": w["rank"],
            "step": w["step_id"],
            "ts_ns": h["ts_ns"],
            "name": h["name"],
            "kind": f"host {h['kind']} during the gap",
            "dur_ns": h["dur_ns"],
            "overlap_ns": h["overlap_ns"],
        }
        for h in host
    ]
    evidence = evidence[: ctx.settings.max_evidence]
    values["longest_gap"] = {
        "rank": w["rank"],
        "step": w["step_id"],
        "gap_ns": w["max_gap_ns"],
        "host": [f"{h['name']} ({h['kind']}, {h['dur_ns'] / 1e6:.3g} ms)" for h in host],
    }
    if not bad:
        return passed(
            RULE,
            confidence="high",
            title="GPU busy inside steps: idle " + ", ".join(f"{t['idle_share']:.1%} of {t['phase']}" for t in judged),
            formula=formula,
            substituted=substituted,
            values=values,
            table=table,
            evidence=evidence,
        )
    t = bad[0]
    blocking = [h for h in host if h["kind"] == "runtime" and ("Synchronize" in h["name"] or "Memcpy" in h["name"])]
    if blocking:
        cause = f"the host was blocked in {blocking[0]['name']} ({blocking[0]['dur_ns'] / 1e6:.3g} ms)"
        ops = [h for h in host if h["kind"] == "cpu_op"]
        if ops:
            top = max(h["overlap_ns"] for h in ops)
            inner = min((h for h in ops if h["overlap_ns"] >= 0.9 * top), key=lambda h: h["dur_ns"])
            dims = orjson.dumps(orjson.loads(inner["input_dims"])).decode() if inner.get("input_dims") else ""
            cause += f" inside {inner['name']}" + (f" {dims}" if dims else "")
        nxt = (
            "Remove the blocking call from the step: a pageable host→device copy (pin the memory, non_blocking=True), "
            "a .item()/.cpu()/synchronize; then re-measure the idle share."
        )
    elif (t["short_kernel_share"] or 0) >= 0.5 and not t["graph_launches"]:
        cause = (
            f"{t['kernels_per_step']:.0f} kernels per step, {t['short_kernel_share']:.0%} shorter than 10 µs, "
            "no graph launches: launch-bound"
        )
        nxt = "Capture the step in CUDA/HIP graphs (or torch.compile cudagraphs) and batch more sequences per step."
    else:
        names = ", ".join(h["name"] for h in host) or "no host event recorded in the gap"
        cause = f"host work in the longest gap: {names}"
        nxt = "Move that host work off the step's critical path (overlap scheduling with GPU work), or make it async."
    return finding(
        RULE,
        severity="warning",
        confidence="high" if host else "medium",
        impact=t["idle_share"],
        title=(
            f"GPU idle {t['idle_share']:.0%} of {t['phase']} step time; longest gap {w['max_gap_ns'] / 1e6:.3g} ms: "
            f"{cause}"
        ),
        formula=formula,
        substituted=substituted,
        values=values,
        table=table,
        evidence=evidence,
        next_check=nxt,
    )
