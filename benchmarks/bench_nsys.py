"""Ingest benchmark for Nsight Systems exports, next to the Kineto ingester on this machine.

Not a test. Measures `parse_nsys_sqlite` (sqlite3 read + row mapping + Arrow) and the DuckDB load of the
largest Nsight Systems export in tests/data/external/nsys (the one with the most kernel, memcpy/memset, runtime
and NVTX rows), and the same two phases for the largest Kineto trace in tests/data/external/kineto, so both
figures come from the same machine and the same run. Each measurement runs in a fresh subprocess (imports
excluded from the timed part; peak RSS of that process reported); the median and minimum of --repeat runs
are printed, with events per second (Nsight: rows stored; Kineto: traceEvents entries).

Usage (from the repository root)::

    .venv/bin/python benchmarks/bench_nsys.py [--repeat 5] [--json out.json] [--nsys FILE] [--kineto FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
EXTERNAL = REPO / "tests" / "data" / "external"
MARK = "BENCH_RESULT "

CHILD = """
import json, resource, sys, time
from pathlib import Path
fmt, path = sys.argv[1], Path(sys.argv[2])
from tracediag.ingest import load
from tracediag.ingest.kineto import parse_kineto
from tracediag.ingest.nsys import parse_nsys_sqlite
from tracediag.store import open_store
import pyarrow as pa
import tracediag.catalog as cat
cat.load_patterns()  # compile the catalog outside the timed part, as a long-running process would have it
pa.array([1])  # pyarrow imports pandas on its first pa.array() of a list: a one-off cost for any ingester
con = open_store()
t0 = time.perf_counter()
parsed = (parse_nsys_sqlite if fmt == "nsys" else parse_kineto)(path, 0)
t1 = time.perf_counter()
load(con, [parsed])
t2 = time.perf_counter()
rows = {t: n for t, n in ((t, con.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0])
        for t in ("kernels", "memops", "runtime", "cpu_ops", "annotations", "nvtx_events", "gpu_sync", "flows")) if n}
events = sum(r["events_total"] or 0 for r in parsed.inputs_rows)
print("MARK" + json.dumps({"parse_s": t1 - t0, "load_s": t2 - t1, "events": events, "rows": rows,
      "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
""".replace("MARK", MARK)


def _richest_export(folder: Path) -> Path:
    """The export with the most GPU, runtime and NVTX rows (file size is mostly OS sampling tables)."""
    import sqlite3

    def events(p: Path) -> int:
        con = sqlite3.connect(f"file:{p}?mode=ro&immutable=1", uri=True)
        names = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        tables = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET",
                  "CUPTI_ACTIVITY_KIND_RUNTIME", "NVTX_EVENTS")  # fmt: skip
        n = sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables if t in names)
        con.close()
        return n

    files = sorted(folder.glob("*.sqlite"), key=events)
    if not files:
        raise SystemExit(f"no .sqlite in {folder} (vendored real inputs: tests/data/external/README.md)")
    return files[-1]


def _largest(folder: Path, pattern: str) -> Path:
    files = sorted(folder.glob(pattern), key=lambda p: p.stat().st_size)
    if not files:
        raise SystemExit(f"no {pattern} in {folder} (vendored real inputs: tests/data/external/README.md)")
    return files[-1]


def _run(fmt: str, path: Path) -> dict:
    res = subprocess.run(
        [sys.executable, "-c", CHILD, fmt, str(path)], capture_output=True, text=True, check=True, cwd=REPO
    )
    line = next(ln for ln in res.stdout.splitlines() if ln.startswith(MARK))
    return json.loads(line[len(MARK) :])


def measure(fmt: str, path: Path, repeat: int) -> dict:
    runs = [_run(fmt, path) for _ in range(repeat)]
    total = [r["parse_s"] + r["load_s"] for r in runs]
    med = statistics.median(total)
    return {
        "format": fmt,
        "file": path.name,
        "file_mb": round(path.stat().st_size / 1e6, 2),
        "events": runs[0]["events"],
        "rows": runs[0]["rows"],
        "parse_s_median": round(statistics.median(r["parse_s"] for r in runs), 4),
        "load_s_median": round(statistics.median(r["load_s"] for r in runs), 4),
        "ingest_s_median": round(med, 4),
        "ingest_s_min": round(min(total), 4),
        "events_per_s": round(runs[0]["events"] / med),
        "max_rss_mb": round(max(r["max_rss_mb"] for r in runs), 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--nsys", type=Path, default=None, help="export to time (default: the richest vendored export)")
    ap.add_argument("--kineto", type=Path, default=None, help="trace to compare with (default: largest Kineto file)")
    ap.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = ap.parse_args()
    nsys = args.nsys or _richest_export(EXTERNAL / "nsys")
    kineto = args.kineto or _largest(EXTERNAL / "kineto", "*.json*")
    results = [measure("nsys", nsys, args.repeat), measure("kineto", kineto, args.repeat)]
    machine = {"python": platform.python_version(), "cpus": os.cpu_count(), "machine": platform.machine()}
    head = (
        f"{'format':7} {'file':45} {'MB':>6} {'events':>8} {'parse s':>8} {'load s':>7} {'ingest s':>9} {'events/s':>9}"
    )
    print(head)
    for r in results:
        print(
            f"{r['format']:7} {r['file'][:45]:45} {r['file_mb']:6.2f} {r['events']:8d} {r['parse_s_median']:8.3f} "
            f"{r['load_s_median']:7.3f} {r['ingest_s_median']:9.3f} {r['events_per_s']:9d}"
        )
    print(f"median of {args.repeat} runs each, fresh process per run; {machine}")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
