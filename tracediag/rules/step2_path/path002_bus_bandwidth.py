"""PATH002 Achieved bus bandwidth.

Hypothesis: the collectives are slow either because the path is slow (the micro-benchmark is slow
too: NVLink down, PCIe, NIC, NUMA, GPUDirect) or because the application uses a good path badly
(rank placement, concurrent streams, CPU affinity, framework syncs, contention). Steps 3 and 4
of the walk (docs/method.md): measure the collective alone at the same payloads, then compare it
with the application's.

Formula: step 3 — peak bus bandwidth of the nccl-tests all_reduce_perf table (out-of-place) vs the
link class's per-direction bandwidth (PATH001 snapshot); slow when below half of it. Step 4 — at each
all-reduce payload S of the trace, the application's call time τ_app(S) (the shortest rank's time of
each matched call) vs the benchmark's τ_bench(S) (log-log interpolation between the table's sizes);
ratio = τ_app/τ_bench, bus bandwidth = 2(p−1)/p·S/τ. Slow when the median ratio is 2 or more.
Without a table: the fitted B of the application (COL003) vs the link class.

Evidence: per payload size the application and benchmark times, their ratio and bus bandwidths; the
benchmark's peak bus bandwidth, its ranks and devices, the link class; the application's backend
and device (a CPU/gloo trace against a GPU/NCCL table compares two different paths — said so).

What to do: benchmark slow → fix the path before the model (NVLink state, P2P, PCIe width, NIC and
NUMA placement, GPUDirect RDMA); benchmark fine but the application slow at the same payloads →
look at rank placement, concurrent communication streams, CPU affinity of the ranks, framework
synchronisation and other traffic; do not carry micro-benchmark-tuned NCCL variables into production
unmeasured.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

from tracediag.analyses.allreduce_fits import allreduce_fits, allreduce_samples
from tracediag.analyses.topology import group_gpus, snapshots
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model import tpmath

RULE = RuleMeta(
    id="PATH002",
    step=2,
    title="Achieved bus bandwidth vs nccl-tests and the link class",
    may_be_downstream_of=("PATH001",),
    enabled_by=("--nccl-tests all_reduce_perf.txt", "--topology topo.json"),
)
BENCH_SLOW = 0.5  # benchmark peak busbw below this share of the link's bandwidth: the path is slow
APP_SLOW = 2.0  # application all-reduce at least this many times slower than the benchmark at the same size
APP_B_SLOW = 0.25  # without a table: fitted B below this share of the link's bandwidth


def bench_rows(ctx: Context) -> tuple[list[dict], dict]:
    """Out-of-place all-reduce rows of the first nccl-tests table (its facts in the second value)."""
    files = ctx.rows("SELECT path, meta_json FROM inputs WHERE format = 'nccl-tests' ORDER BY input_id")
    for f in files:
        rows = ctx.rows(
            "SELECT size_bytes, time_ns, busbw_gbs, algbw_gbs, dtype, nranks, op FROM nccl_tests "
            "WHERE source_path = ? AND placement = 'out-of-place' AND time_ns IS NOT NULL AND time_ns > 0 "
            "AND (op = 'all_reduce' OR (op IS NULL AND redop NOT IN ('none') AND coalesce(root, -1) = -1)) "
            "ORDER BY size_bytes",
            [f["path"]],
        )
        if rows:
            return rows, {"path": f["path"], **json.loads(f["meta_json"] or "{}")}
    return [], {}


def bench_time_ns(rows: list[dict], size: float) -> tuple[float, str]:
    """τ_bench(size): log-log interpolation; below the smallest size its time (latency floor), above the
    largest its bus bandwidth."""
    sizes = [r["size_bytes"] for r in rows]
    if size <= sizes[0]:
        return rows[0]["time_ns"], "below the table: its smallest size's time"
    if size >= sizes[-1]:
        last = rows[-1]
        return last["time_ns"] * size / last["size_bytes"], "above the table: its largest size's bandwidth"
    for lo, hi in itertools.pairwise(rows):
        if lo["size_bytes"] <= size <= hi["size_bytes"]:
            f = (math.log(size) - math.log(lo["size_bytes"])) / (
                math.log(hi["size_bytes"]) - math.log(lo["size_bytes"])
            )
            return math.exp(
                math.log(lo["time_ns"]) + f * (math.log(hi["time_ns"]) - math.log(lo["time_ns"]))
            ), "interpolated"
    return rows[-1]["time_ns"], "interpolated"


def link_expectation(ctx: Context, p: int | None) -> tuple[float | None, str | None, str | None]:
    """(expected GB/s per direction, worst link class, snapshot) for the TP group, from the topology snapshot."""
    usable = [s for s in snapshots(ctx) if s.get("nvml_available") and s.get("gpus")]
    if not usable:
        return None, None, None
    snap = usable[0]
    n = ctx.scalar("SELECT count(*) FROM topo_gpus WHERE source_path = ?", [snap["path"]])
    idx, _ = group_gpus(ctx, p or n, n)
    if (p or n) > n:
        return None, "network", snap["path"]
    rows = ctx.rows(
        "SELECT link_class, expected_busbw_gbs FROM topo_pairs WHERE source_path = ? AND list_contains(?, gpu_a) "
        "AND list_contains(?, gpu_b)",
        [snap["path"], idx, idx],
    )
    bws = [r["expected_busbw_gbs"] for r in rows if r["expected_busbw_gbs"] is not None]
    order = {"nvlink": 0, "nvswitch": 0, "pcie": 1, "pcie-host": 2}
    worst = max((r["link_class"] for r in rows), key=lambda c: order.get(c, 9), default=None)
    return (min(bws) if bws else None), worst, snap["path"]


def _bench_values(bench: list[dict], bmeta: dict, p: int | None) -> tuple[dict, dict, str]:
    """Step 3's side: the micro-benchmark's peak as values, its evidence row, and the confidence it allows."""
    peak = max(bench, key=lambda r: r["busbw_gbs"] or 0)
    values = {
        "nccl_tests": bmeta.get("path"),
        "nccl_tests_ranks": bmeta.get("nranks"),
        "nccl_tests_devices": sorted({d["name"] for d in bmeta.get("devices", [])}),
        "nccl_tests_peak_busbw_gbs": peak["busbw_gbs"],
        "nccl_tests_peak_at_bytes": peak["size_bytes"],
        "nccl_tests_min_time_ns": min(r["time_ns"] for r in bench),
    }
    evidence = {
        "rank": None,
        "ts_ns": None,
        "name": f"nccl-tests all_reduce_perf {peak['size_bytes']:,} B: busbw {peak['busbw_gbs']} GB/s",
        "source": bmeta.get("path"),
    }
    confidence = "high"
    if p and bmeta.get("nranks") and bmeta["nranks"] != p:
        values["note_ranks"] = f"the benchmark ran on {bmeta['nranks']} ranks, the TP group has {p}"
        confidence = "medium"
    return values, evidence, confidence


def _snapshot_gpu_names(ctx: Context, snap: str | None) -> set[str]:
    if not snap:
        return set()
    return {
        r[0] for r in ctx.con.execute("SELECT DISTINCT name FROM topo_gpus WHERE source_path = ?", [snap]).fetchall()
    }


def _app_table(samples: list[dict], bench: list[dict], bmeta: dict, p: int) -> tuple[list[dict], list[float]]:
    """Step 4's rows: the application's median time per payload, beside the benchmark's at that size."""
    by_size: dict[int, list[int]] = defaultdict(list)
    for s in samples:
        by_size[s["payload_bytes"]].append(s["dur_ns"])
    table: list[dict] = []
    ratios: list[float] = []
    for size, durs in sorted(by_size.items()):
        app = statistics.median(durs)
        row = {
            "payload_bytes": size,
            "calls": len(durs),
            "app_median_ns": int(app),
            "app_busbw_gbs": round(tpmath.allreduce_bus_bytes(size, p) / app, 4),
        }
        if bench:
            bt, how = bench_time_ns(bench, size)
            row |= {
                "bench_ns": int(bt),
                "bench_busbw_gbs": round(tpmath.allreduce_bus_bytes(size, bmeta.get("nranks") or p) / bt, 4),
                "bench_lookup": how,
                "app_over_bench": round(app / bt, 3),
            }
            ratios += [app / bt] * len(durs)
        table.append(row)
    return table, ratios


def _path_note(values: dict, has_gpu: bool, device: str | None, backend: str | None) -> str | None:
    """Why the application's path and the benchmark's are not the same path, when they are not."""
    if not has_gpu:
        return (
            f"the application's all-reduces ran on the CPU ({backend or 'unknown backend'}); the benchmark "
            f"measured NCCL on {', '.join(values['nccl_tests_devices']) or 'GPUs'}: the ratio compares two "
            "different paths"
        )
    if device and values["nccl_tests_devices"] and device not in values["nccl_tests_devices"]:
        return (
            f"the trace ran on {device}, the benchmark on {', '.join(values['nccl_tests_devices'])}: run "
            "nccl-tests on the deployment's own GPUs for a like-for-like comparison"
        )
    return None


@dataclass(frozen=True)
class BandwidthMeasure:
    """PATH002's numbers: the benchmark against the link (step 3), the application against both (step 4)."""

    values: dict
    table: list[dict]
    evidence: list[dict]
    confidence: str
    link_gbs: float | None
    link_class: str | None
    bench_share_of_link: float | None  # step 3: peak busbw / link GB/s
    app_over_bench: float | None  # step 4: median τ_app / τ_bench over the calls
    app_fitted_busbw_gbs: float | None  # step 4 without a table: the α–β fit's B


def _measure_app(ctx: Context, samples: list[dict], dur_source, bench: list[dict], bmeta: dict, p: int) -> dict:
    """Step 4's numbers as keyword arguments for BandwidthMeasure, plus the values and confidence they add."""
    backend = ctx.scalar("SELECT any_value(backend) FROM inputs WHERE rank IS NOT NULL")
    device = ctx.scalar("SELECT any_value(device_name) FROM inputs WHERE rank IS NOT NULL AND format <> 'nccl-tests'")
    has_gpu = bool(ctx.scalar("SELECT count(*) FROM kernels WHERE klass = 'collective'"))
    values = {
        "app_backend": backend,
        "app_device": device or ("GPU" if has_gpu else "CPU (no GPU kernels in the trace)"),
        "app_call_times_from": dur_source,
    }
    table, ratios = _app_table(samples, bench, bmeta, p)
    return {
        "values": values,
        "table": table,
        "ratios": ratios,
        "has_gpu": has_gpu,
        "device": device,
        "backend": backend,
    }


def measure(ctx: Context) -> BandwidthMeasure | str:
    """Every number PATH002 judges by, or the reason (a string) it does not apply."""
    p = ctx.tp.p if ctx.tp else None
    bench, bmeta = bench_rows(ctx)
    link_gbs, link_class, snap = link_expectation(ctx, p)
    if not bench and link_gbs is None:  # decided before the trace's calls are read
        return (
            "missing nccl-tests output (--nccl-tests all_reduce_perf.txt) and topology snapshot (--topology): "
            "nothing to compare the collectives' bus bandwidth with"
        )
    samples: list[dict] = []
    dur_source = None
    if p and p > 1 and ctx.scalar("SELECT count(*) FROM collectives"):
        samples, dur_source = allreduce_samples(ctx, p)
    if not samples and not (bench and link_gbs is not None):
        have = "the nccl-tests table" if bench else "the link class"
        return (
            f"missing the other side of the comparison: only {have} is given; add the application's trace "
            "(TP all-reduces with payloads) or " + ("--topology" if bench else "--nccl-tests")
        )
    values: dict = {"p": p}
    evidence: list[dict] = []
    table: list[dict] = []
    confidence = "high"
    share = med = fitted = None
    if bench:  # step 3: the micro-benchmark vs the link class
        bench_values, bench_evidence, confidence = _bench_values(bench, bmeta, p)
        values |= bench_values
        evidence.append(bench_evidence)
    if link_gbs is not None or link_class:
        values |= {"link_class": link_class, "link_expected_busbw_gbs": link_gbs, "topology": snap}
    snap_names = _snapshot_gpu_names(ctx, snap)
    same_gpus = not (bench and snap_names and values["nccl_tests_devices"]) or bool(
        snap_names & set(values["nccl_tests_devices"])
    )
    if bench and link_gbs and not same_gpus:
        values["note_machines"] = (
            f"the nccl-tests table ran on {', '.join(values['nccl_tests_devices'])}, the topology snapshot shows "
            f"{', '.join(sorted(snap_names))}: different machines, so the table is not compared with the link class"
        )
        if not samples:
            return "mismatched inputs: " + values["note_machines"]
    elif bench and link_gbs:
        share = values["nccl_tests_peak_busbw_gbs"] / link_gbs
        values["nccl_tests_share_of_link"] = round(share, 4)
    if samples:  # step 4: the application vs the micro-benchmark at the same payloads
        app = _measure_app(ctx, samples, dur_source, bench, bmeta, p)
        values |= app["values"]
        table = app["table"]
        if bench:
            med = statistics.median(app["ratios"])
            values["app_over_bench_median"] = round(med, 3)
            note = _path_note(values, app["has_gpu"], app["device"], app["backend"])
            if note:
                values["note_paths"] = note
                confidence = "low"
        elif link_gbs:
            fit = allreduce_fits(ctx, p).get(p)
            if fit and fit.bus_bw_bytes_per_s:
                fitted = fit.bus_bw_bytes_per_s / 1e9
                values["app_fitted_busbw_gbs"] = round(fitted, 4)
            else:
                values["app_fitted_busbw_gbs"] = None
                values["note_fit"] = "the application's calls are latency-bound: no bandwidth to compare (COL003)"
        worst = max(samples, key=lambda s: s["dur_ns"])
        evidence.append({k: worst[k] for k in ("rank", "step", "ts_ns", "name", "payload_bytes", "dur_ns")})
    return BandwidthMeasure(values, table, evidence, confidence, link_gbs, link_class, share, med, fitted)


def _verdicts(ms: BandwidthMeasure) -> list[str]:
    """What is slow, step 3 first: the path itself, then how the application uses it."""
    verdicts: list[str] = []
    link_gbs, link_class, values = ms.link_gbs, ms.link_class, ms.values
    if ms.bench_share_of_link is not None and ms.bench_share_of_link < BENCH_SLOW:
        verdicts.append(
            f"the micro-benchmark itself is slow: peak busbw {values['nccl_tests_peak_busbw_gbs']} GB/s = "
            f"{ms.bench_share_of_link:.0%} of the {link_class} path's ~{link_gbs:g} GB/s (step 3: fix the path)"
        )
    if ms.app_over_bench is not None and ms.app_over_bench >= APP_SLOW:
        verdicts.append(
            f"the application's all-reduces take {ms.app_over_bench:.1f}× the benchmark's time at the same payloads "
            "(step 4: placement, streams, CPU affinity, syncs, contention)"
        )
    b = ms.app_fitted_busbw_gbs
    if b is not None and b < APP_B_SLOW * link_gbs:
        verdicts.append(
            f"the application's fitted bus bandwidth {b:.3g} GB/s is {b / link_gbs:.0%} of the "
            f"{link_class} path's ~{link_gbs:g} GB/s"
        )
    return verdicts


def _formula(ms: BandwidthMeasure) -> tuple[str, str]:
    values, table = ms.values, ms.table
    formula = (
        "step 3: peak busbw(nccl-tests) / link GB/s; step 4: ratio = τ_app(S) / τ_bench(S) at the trace's payloads, "
        "busbw = 2(p−1)/p·S/τ"
    )
    parts = []
    if "nccl_tests_share_of_link" in values:
        parts.append(
            f"{values['nccl_tests_peak_busbw_gbs']} / {ms.link_gbs:g} GB/s = {values['nccl_tests_share_of_link']:.0%}"
        )
    if table and "app_over_bench_median" in values:
        r0 = table[0]
        parts.append(
            f"S = {r0['payload_bytes']:,} B: {r0['app_median_ns'] / 1e3:.1f} µs / {r0['bench_ns'] / 1e3:.1f} µs = "
            f"{r0['app_over_bench']:.1f}×; median over calls {values['app_over_bench_median']:.1f}×"
        )
    return formula, "; ".join(parts) or formula


def judge(ctx: Context, ms: BandwidthMeasure) -> Check:
    """Status, severity and words from PATH002's numbers."""
    values, link_class = ms.values, ms.link_class
    formula, substituted = _formula(ms)
    common = {
        "formula": formula,
        "substituted": substituted,
        "values": values,
        "table": ms.table,
        "evidence": ms.evidence[: ctx.settings.max_evidence],
        "confidence": ms.confidence,
    }
    compared = {"nccl_tests_share_of_link", "app_over_bench_median"} & set(values) or values.get("app_fitted_busbw_gbs")
    if not compared:
        return not_applicable(
            RULE,
            "nothing comparable: "
            + (values.get("note_fit") or values.get("note_machines") or "no bandwidth measured")
            + "; add an nccl-tests table from the deployment's GPUs (--nccl-tests)",
        )
    verdicts = _verdicts(ms)
    if not verdicts:
        what = []
        if "nccl_tests_share_of_link" in values:
            what.append(f"nccl-tests reaches {values['nccl_tests_share_of_link']:.0%} of the {link_class} path")
        if "app_over_bench_median" in values:
            what.append(
                f"the application's all-reduces take {values['app_over_bench_median']:.2g}× the benchmark's time"
            )
        if values.get("app_fitted_busbw_gbs"):
            what.append(f"the application's fitted B is {values['app_fitted_busbw_gbs']:.3g} GB/s")
        return passed(RULE, **common, title="Bus bandwidth as expected: " + "; ".join(what))
    step3 = any("step 3" in v for v in verdicts)
    return finding(
        RULE,
        **common,
        severity="warning",
        impact=1.0 if step3 else min(1.0, 1 - 1 / values.get("app_over_bench_median", 2.0)),
        title=verdicts[0][0].upper() + verdicts[0][1:] + (f"; also {verdicts[1]}" if len(verdicts) > 1 else ""),
        next_check=(
            "Fix the path before the model: NVLink state, P2P, PCIe width/generation, NIC and NUMA placement, "
            "GPUDirect RDMA (PATH001)."
            if step3
            else "The path is fine in isolation: check rank-to-GPU placement, concurrent communication streams, CPU "
            "affinity of the ranks, framework synchronisation and other traffic during the run."
        ),
    )


def check(ctx: Context) -> Check:
    ms = measure(ctx)
    if isinstance(ms, str):
        return not_applicable(RULE, ms)
    return judge(ctx, ms)
