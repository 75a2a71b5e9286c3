"""The Dask path on a local cluster with 8 to 1024 ranks: ingest into a Parquet store, then
`analyze --store` with the rules evaluated per TP group on the cluster.

    python benchmarks/bench_fleet.py --ranks 64,256,1024 --workers 2 --repeats 1 \
        --out benchmarks/results/fleet-dask-<date>-<machine>.json

Not a test. The rank files are **replicated** from the real 8-rank sample tests/data/fleet/healthy_tp8 (torch.profiler,
gloo, TP=8) by tests/fleet_replicas.py: N ranks are N/8 TP groups of 8, each group a copy of the 8 real ranks with
its global ranks, its process group and a time shift — no 64-rank real trace set is vendored. The cluster is a real
`dask.distributed.LocalCluster` (scheduler and `--workers` worker processes on 127.0.0.1, one thread each). For each
size, in turn (sizes interleaved over `--repeats` rounds): on a fresh cluster (new worker processes, so their peak
RSS is this run's) `tracediag.fleet.ingest_store(..., scheduler=client)` writes the store (one task per rank
file) and the workers' peak RSS is read (`getrusage` in each worker); then on another fresh cluster
`tracediag.analyze(store=..., scheduler=client)` runs the rules per TP group on the workers (default `--ranks`:
one deep rank per group; one group, 8 ranks, is evaluated in the coordinator). Reported per size: median wall
times, the workers' peak RSS (max over workers), the coordinator's RSS, and a least-squares line t = a + b·N over
the sizes with its R² (time linear in ranks) and the per-rank cost b.

With `--straggler-ms D` (default 100; 0: none) one rank of one group is a straggler: global rank 5N/8 + 3 (rank 43
of 64; the last, 7, of 8) has its whole timeline shifted D ms later, so it reaches every collective of its group
late (tests/fleet_replicas.py). Each run then records whether the analysis names it: COL005's straggler and the group
summaries' straggler ranks must be exactly that rank, and the default deep-rank selection must include it. The
coordinator's peak RSS is sampled (psutil, every 20 ms) during each ingest and analyze.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def _worker_peak_mib(client) -> float:
    def peak() -> float:
        # VmHWM: the peak of this process's own memory. ru_maxrss is kept across execve (getrusage(2)), so a worker
        # started from the coordinator would report the coordinator's peak at the fork if it used less
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024  # kB
        except OSError:
            pass
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux

    return round(max(client.run(peak).values()), 1)


class _PeakRss:
    """The coordinator's peak RSS while the block runs (sampled every 20 ms)."""

    def __enter__(self) -> _PeakRss:
        import psutil

        self._proc = psutil.Process()
        self.peak = self._proc.memory_info().rss
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._proc.memory_info().rss)

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._proc.memory_info().rss)

    @property
    def mib(self) -> float:
        return round(self.peak / 2**20, 1)


def straggler_rank(n: int) -> int:
    return min(n - 1, n * 5 // 8 + 3)  # within the ranks: 7 of 8


def _names_straggler(report, rank: int) -> dict:
    r = report.to_dict()["ranks"]
    col005 = next((c for c in report.checks if c.rule == "COL005"), None)
    summaries = r.get("group_summaries", [])
    named = {g["group"]: g["straggler_rank"] for g in summaries if g.get("straggler_rank") is not None}
    return {
        "col005_status": col005.status if col005 else None,
        "col005_straggler_rank": col005.values.get("straggler_rank") if col005 else None,
        "group_stragglers": named,
        "deep_analysed_includes_it": rank in r["analysed"],
        "named": bool(
            col005 is not None
            and col005.status == "finding"
            and col005.values.get("straggler_rank") == rank
            # the group summaries name it, and only it (one TP group is evaluated whole: it has no summaries)
            and (list(named.values()) == [rank] or (not named and len(r.get("groups", [])) <= 1))
            and rank in r["analysed"]
        ),
    }


def _line(xs: list[float], ys: list[float]) -> dict:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    a = my - b * mx
    ss_res = sum((y - (a + b * x)) ** 2 for x, y in zip(xs, ys))
    ss_tot = sum((y - my) ** 2 for y in ys)
    return {
        "intercept_s": round(a, 3),
        "per_rank_s": round(b, 4),
        "r2": round(1 - ss_res / ss_tot, 4) if ss_tot else None,
    }


def main() -> int:
    from distributed import Client, LocalCluster
    from fleet_replicas import replicate

    from tracediag.analysis import analyze
    from tracediag.fleet import ingest_store

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", default="8,16,32,64")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--work", type=Path)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--straggler-ms", type=float, default=100.0)
    args = ap.parse_args()
    sizes = [int(x) for x in args.ranks.split(",")]
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-fleet-"))
    model = REPO / "tests" / "data" / "fleet" / "healthy_tp8" / "config.json"
    dirs = {}
    for n in sizes:
        d = work / f"r{n}"
        if not d.is_dir():
            late = (straggler_rank(n), args.straggler_ms * 1000.0) if args.straggler_ms else None
            t0 = time.perf_counter()
            replicate(d, n // 8, shift_us=1000.0, straggler=late)
            print(json.dumps({"replicated": n, "s": round(time.perf_counter() - t0, 1)}), flush=True)
        dirs[n] = d
    runs: dict[int, list[dict]] = {n: [] for n in sizes}

    def cluster():
        return LocalCluster(
            n_workers=args.workers, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
        )

    for rep in range(args.repeats):
        for n in sizes:
            files = sorted(dirs[n].glob("rank*.pt.trace.json.gz"))
            store = work / f"store{n}"
            load0 = os.getloadavg()[0]
            shutil.rmtree(store, ignore_errors=True)
            with cluster() as c, Client(c) as client:  # fresh worker processes: their peak RSS is this run's
                with _PeakRss() as ingest_rss:
                    t0 = time.perf_counter()
                    res = ingest_store(files, store, scheduler=client)
                    t_ingest = time.perf_counter() - t0
                ingest_peak = _worker_peak_mib(client)
            with cluster() as c, Client(c) as client:
                with _PeakRss() as analyze_rss:
                    t0 = time.perf_counter()
                    report = analyze([], model=model, store=store, scheduler=client)
                    t_analyze = time.perf_counter() - t0
                analyze_peak = _worker_peak_mib(client)
            r = report.to_dict()["ranks"]
            row = {
                "repeat": rep,
                "ranks": n,
                "input_bytes": sum(f.stat().st_size for f in files),
                "load_avg_1m": round(load0, 2),
                "ingest_s": round(t_ingest, 3),
                "ingest_worker_peak_rss_mib": ingest_peak,
                "parse_write_s_sum": round(sum(i["parse_write_s"] for i in res.inputs), 3),
                "analyze_store_s": round(t_analyze, 3),
                "analyze_worker_peak_rss_mib": analyze_peak,
                "coordinator_peak_rss_ingest_mib": ingest_rss.mib,
                "coordinator_peak_rss_analyze_mib": analyze_rss.mib,
                "tp_groups": len(r["groups"]),
                "deep_ranks": len(r["analysed"]),
                "findings": sorted(c.rule for c in report.checks if c.status == "finding"),
            }
            if args.straggler_ms:
                row["straggler"] = {"rank": straggler_rank(n), **_names_straggler(report, straggler_rank(n))}
            runs[n].append(row)
            print(json.dumps(row), flush=True)
    summary = []
    for n in sizes:
        rs = runs[n]
        summary.append(
            {
                "ranks": n,
                "ingest_s": statistics.median(r["ingest_s"] for r in rs),
                "analyze_store_s": statistics.median(r["analyze_store_s"] for r in rs),
                "total_s": statistics.median(r["ingest_s"] + r["analyze_store_s"] for r in rs),
                "worker_peak_rss_mib": max(
                    max(r["ingest_worker_peak_rss_mib"], r["analyze_worker_peak_rss_mib"]) for r in rs
                ),
                "coordinator_peak_rss_mib": max(
                    max(r["coordinator_peak_rss_ingest_mib"], r["coordinator_peak_rss_analyze_mib"]) for r in rs
                ),
                "straggler_named": all(r["straggler"]["named"] for r in rs) if args.straggler_ms else None,
            }
        )
    xs = [float(s["ranks"]) for s in summary]
    doc = {
        "benchmark": "Dask LocalCluster: ingest + analyze --store per TP group, replicated ranks",
        "straggler_ms": args.straggler_ms,
        "command": "python " + " ".join(sys.argv),
        "inputs": "rank files replicated from tests/data/fleet/healthy_tp8 (real torch.profiler gloo TP=8 ranks) "
        "by tests/fleet_replicas.py: N/8 TP groups of 8",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "workers": args.workers,
        "runs": {str(n): v for n, v in runs.items()},
        "summary": summary,
        "fit_ingest": _line(xs, [s["ingest_s"] for s in summary]),
        "fit_analyze": _line(xs, [s["analyze_store_s"] for s in summary]),
        "fit_total": _line(xs, [s["total_s"] for s in summary]),
    }
    if 1024 not in sizes and len(sizes) > 1:  # what the fit says 1024 ranks would take (not measured)
        doc["extrapolated_1024"] = {
            k: round(doc[f"fit_{k}"]["intercept_s"] + 1024 * doc[f"fit_{k}"]["per_rank_s"], 1)
            for k in ("ingest", "analyze", "total")
        }
    print(json.dumps({k: doc[k] for k in ("summary", "fit_ingest", "fit_analyze", "fit_total") if k in doc}, indent=1))
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
