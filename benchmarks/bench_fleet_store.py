"""`analyze --store` on an existing Parquet store against a full `analyze` of the same traces.

    python benchmarks/bench_fleet_store.py /work/bench/gen/rank0.pt.trace.json /work/bench/gen/rank1.pt.trace.json \
        -m /work/bench/gen/config.json --repeats 3 --out benchmarks/results/fleet-store-<date>-<machine>.json

Not a test. The store is made once (`tracediag ingest ... --store`, timed too); then the two commands run as
whole processes, interleaved (full, store, full, store, ...), `--repeats` times each:

    full:  tracediag analyze TRACES -m CONFIG -o OUT -q
    store: tracediag analyze --store STORE -m CONFIG -o OUT -q

Each process's wall time (start-up and imports included) and the peak resident set size of its process tree
(sampled every 20 ms with psutil) are recorded, with the 1-minute load average before each run (the machine
is shared). Reported: medians, the ratio store / full (target < 0.25), and whether both wrote the same checks.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def _tree_rss(proc) -> int:
    import psutil

    total = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            total += p.memory_info().rss
    return total


def measure(cmd: list[str]) -> dict:
    import psutil

    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ps = psutil.Process(child.pid)
    peak = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _tree_rss(ps))
            time.sleep(0.02)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    _, err = child.communicate()
    wall = time.perf_counter() - t0
    done.set()
    th.join()
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({child.returncode}): {err.decode()[-2000:]}")
    return {"wall_s": round(wall, 3), "peak_tree_rss_mib": round(peak[0] / 2**20, 1), "load_avg_1m": round(load, 2)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("-m", "--model", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", type=Path, help="scratch folder (default: a temporary one)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    td = [sys.executable, "-m", "tracediag"]
    work = Path(args.work or tempfile.mkdtemp(prefix="bench-fleet-store-"))
    work.mkdir(parents=True, exist_ok=True)
    store = work / "store"
    ingest = measure([*td, "ingest", *map(str, args.traces), "--store", str(store)])
    print("ingest", json.dumps(ingest), flush=True)
    full_cmd = [*td, "analyze", *map(str, args.traces), "-m", str(args.model), "-o", str(work / "full"), "-q"]
    store_cmd = [*td, "analyze", "--store", str(store), "-m", str(args.model), "-o", str(work / "from-store"), "-q"]
    runs: dict[str, list[dict]] = {"full": [], "store": []}
    for i in range(args.repeats):
        for name, cmd in (("full", full_cmd), ("store", store_cmd)):
            r = measure(cmd)
            runs[name].append(r)
            print(i, name, json.dumps(r), flush=True)
    checks = {
        name: json.loads((work / sub / "findings.json").read_text())["checks"]
        for name, sub in (("full", "full"), ("store", "from-store"))
    }
    med = {k: statistics.median(r["wall_s"] for r in v) for k, v in runs.items()}
    ratio = med["store"] / med["full"]
    doc = {
        "benchmark": "analyze --store on an existing store vs a full analyze",
        "command": "python " + " ".join(sys.argv),
        "commands": {"full": " ".join(full_cmd), "store": " ".join(store_cmd)},
        "traces": [str(p) for p in args.traces],
        "trace_bytes": sum(p.stat().st_size for p in args.traces),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "ingest_once": ingest,
        "store_bytes": sum(f.stat().st_size for f in store.rglob("*") if f.is_file()),
        "runs": runs,
        "median_wall_s": {k: round(v, 3) for k, v in med.items()},
        "median_peak_tree_rss_mib": {k: statistics.median(r["peak_tree_rss_mib"] for r in v) for k, v in runs.items()},
        "store_over_full": round(ratio, 3),
        "target": "store_over_full < 0.25",
        "target_met": ratio < 0.25,
        "same_checks": checks["full"] == checks["store"],
    }
    print(json.dumps({k: doc[k] for k in ("median_wall_s", "store_over_full", "target_met", "same_checks")}))
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
