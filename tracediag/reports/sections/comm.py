"""Communication: all-reduce latency vs payload with the α–β fit (COL003), per-rank skew (COL005),
the nccl-tests table at the same payloads (PATH002) and the topology snapshot (PATH001)."""

from __future__ import annotations

import statistics

from tracediag.reports import svg
from tracediag.reports.sections import Section


def _fit_chart(ctx, p: int) -> tuple[list[str], list[str], list[dict]]:
    from tracediag.analyses.allreduce_fits import allreduce_fits, allreduce_samples

    samples, source = allreduce_samples(ctx, p)
    if not samples:
        return [], [], []
    charts, notes, rows = [], [f"All-reduce call times: {source}."], []
    bench = ctx.rows(
        "SELECT size_bytes, time_ns FROM nccl_tests WHERE placement = 'out-of-place' AND op = 'all_reduce' "
        "AND time_ns IS NOT NULL ORDER BY size_bytes"
    )
    for g, fit in allreduce_fits(ctx, p).items():
        pts = [(s["payload_bytes"] / 1024, s["dur_ns"] / 1e3) for s in samples if s["group_size"] == g]
        lines = {}
        if fit is not None:
            lo, hi = fit.min_payload_bytes, fit.max_payload_bytes
            label = f"fit: α = {fit.alpha_s * 1e6:.1f} µs, " + (
                f"B = {fit.bus_bw_bytes_per_s / 1e9:.3g} GB/s"
                if fit.bus_bw_bytes_per_s
                else "no bandwidth term (latency-bound)"
            )
            lines[label] = [(S / 1024, fit.time_s(S) * 1e6) for S in (lo, (lo + hi) / 2, hi)]
            rows.append(
                {
                    "group_size": g,
                    "calls": fit.line.n,
                    "distinct_payloads": fit.line.distinct_x,
                    "min_payload_bytes": lo,
                    "max_payload_bytes": hi,
                    "alpha_us": round(fit.alpha_s * 1e6, 3),
                    "bus_bw_gbs": round(fit.bus_bw_bytes_per_s / 1e9, 4) if fit.bus_bw_bytes_per_s else None,
                    "r2": round(fit.line.r2, 4) if fit.line.r2 is not None else None,
                    "median_abs_rel_residual": round(fit.line.median_abs_rel_residual, 4),
                }
            )
            near = [b for b in bench if lo / 2 <= b["size_bytes"] <= hi * 2]
            if near:
                lines["nccl-tests (out-of-place)"] = [(b["size_bytes"] / 1024, b["time_ns"] / 1e3) for b in near]
        by_payload: dict[float, list[float]] = {}
        for x, y in pts:
            by_payload.setdefault(x, []).append(y)
        medians = [(x, statistics.median(ys)) for x, ys in sorted(by_payload.items())]
        charts.append(
            svg.scatter(
                f"All-reduce time vs payload, group size {g}",
                "payload per rank (KiB)",
                "time per call (µs, log scale)",
                {f"{len(pts)} calls (the fit's points)": pts, "median per payload": medians},
                lines=lines,
                log_y=True,
            )
        )
    return charts, notes, rows


def build(ctx) -> Section | None:
    from tracediag.analyses.stragglers import matched_summary, rank_table

    tables: dict[str, list[dict]] = {}
    charts: list[str] = []
    notes: list[str] = []
    if ctx.tp is not None and ctx.tp.p > 1 and ctx.scalar("SELECT count(*) FROM collectives"):
        c, n, rows = _fit_chart(ctx, ctx.tp.p)
        charts += c
        notes += n
        if rows:
            tables["α–β fit per group size (τ = α + 2(p−1)/p·S/B, Theil–Sen)"] = rows
    if (
        ctx.scalar("SELECT count(DISTINCT rank) FROM collectives")
        and ctx.scalar("SELECT count(DISTINCT rank) FROM collectives") > 1
    ):
        matched = matched_summary(ctx)
        if matched:
            tables["rank skew: arrivals at matched collectives"] = rank_table(ctx)
            notes.append(f"Collectives matched across ranks by {matched['matched_by']} ({matched['sets']} calls).")
    bench = ctx.rows(
        "SELECT source_path, op, nranks, dtype, size_bytes, time_ns, algbw_gbs, busbw_gbs FROM nccl_tests "
        "WHERE placement = 'out-of-place' ORDER BY source_path, size_bytes"
    )
    if bench:
        tables["nccl-tests (out-of-place)"] = bench
    gpus = ctx.rows(
        "SELECT host, gpu_index, name, pci_bus_id, memory_total_bytes, numa_node, cpu_affinity, "
        "pcie_gen, pcie_width, nvlinks_active, nvlinks_total, nvlink_version FROM topo_gpus ORDER BY host, gpu_index"
    )
    if gpus:
        tables["topology: GPUs"] = gpus
        tables["topology: GPU pairs"] = ctx.rows(
            "SELECT host, gpu_a, gpu_b, link_class, topology, p2p_read, p2p_write, p2p_nvlink, direct_nvlinks, "
            "expected_busbw_gbs FROM topo_pairs ORDER BY host, gpu_a, gpu_b"
        )
    for r in ctx.rows("SELECT path, meta_json FROM inputs WHERE format = 'topology'"):
        if '"nvml_available": false' in (r["meta_json"] or ""):
            notes.append(f"Topology snapshot {r['path']} was taken without an NVIDIA driver: no GPU data.")
    if not tables and not charts:
        return None
    return Section(
        id="comm",
        step=3,
        title="Communication: latency vs payload, rank skew, topology",
        tables=tables,
        notes=tuple(notes),
        svgs=tuple(c for c in charts if c),
    )
