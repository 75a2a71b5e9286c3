"""Server-log parsing, two versions of tracediag side by side: per-line parse cost of vLLM and SGLang logs, and
`tracediag analyze --log` end to end on the 10^6-line vLLM log of bench_sch003.py.

    .venv/bin/python benchmarks/bench_logs.py --old-root /path/to/old/checkout --repeats 3 \
        --json benchmarks/results/<date>-logs.json
    .venv/bin/python benchmarks/bench_logs.py --skip-analyze      # this checkout alone (run_all.py's `logparse`)

The logs are SYNTHETIC, in the engines' own layouts: the V1 stats lines of bench_sch003.write_log (10^6 lines,
one a second) and SGLang decode batch lines (log_tables_dump._sglang_lines: two TP ranks, with and without the
cuda graph field, an access line every 500 and a prefill line every 1000). Each measurement is a fresh
subprocess with PYTHONPATH set to one checkout; the versions alternate within each round (old, new, then new,
old) so that load from other users of the machine falls on both alike, and the medians over the rounds are
reported with the CPU time of each child (os.wait4), which other load inflates less than wall time, and its
peak RSS (ru_maxrss; for analyze also the sum over its process tree, sampled 20 times a second).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from bench_sch003 import tree_rss, write_log  # noqa: E402
from log_tables_dump import _sglang_lines  # noqa: E402

PARSE = """
import sys, time
from pathlib import Path
from tracediag.ingest.base import IngestOptions
from tracediag.ingest.{mod} import {fn} as parse
t0, c0 = time.perf_counter(), time.process_time()
parsed = parse(Path(sys.argv[1]), 0, IngestOptions())
print(time.perf_counter() - t0, time.process_time() - c0, parsed.tables["serving_stats"].num_rows)
"""


def _run(args: list[str], root: Path) -> dict:
    # os.wait4 gives this child's own rusage (RUSAGE_CHILDREN would add up every child so far)
    env = dict(os.environ, PYTHONPATH=str(root))
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as err_file:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=err_file, env=env, cwd=str(root))
        peak_tree = 0
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            peak_tree = max(peak_tree, tree_rss(proc.pid))
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        out = proc.stdout.read()
        err_file.seek(0)
        err = err_file.read()
    code = os.waitstatus_to_exitcode(status)
    if code:
        raise SystemExit(f"{args[:4]} failed ({code}): {err.decode()[-2000:]}")
    return {
        "wall_s": round(wall, 2),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 2),
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "peak_tree_rss_mib": round(peak_tree / 2**20, 1),
        "stdout": out.decode(),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--old-root", type=Path, help="checkout of the version to compare with (default: none)")
    ap.add_argument("--new-root", type=Path, default=REPO)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-analyze", action="store_true")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    roots = {"new": a.new_root.resolve()}
    if a.old_root is not None:
        roots = {"old": a.old_root.resolve(), **roots}
    results: dict[str, dict[str, list[dict]]] = {}
    with tempfile.TemporaryDirectory() as d:
        vllm, sglang = Path(d) / "vllm.log", Path(d) / "sglang.log"
        write_log(vllm, a.lines)
        sglang.write_text("\n".join(_sglang_lines(a.lines, 3)) + "\n")
        lines = {"vllm": a.lines, "sglang": sum(1 for _ in sglang.open("rb"))}
        jobs = {
            "parse_vllm": [sys.executable, "-c", PARSE.format(mod="vllm_log", fn="parse_vllm_log"), str(vllm)],
            "parse_sglang": [sys.executable, "-c", PARSE.format(mod="sglang_log", fn="parse_sglang_log"), str(sglang)],
        }
        if not a.skip_analyze:
            jobs["analyze_vllm"] = [sys.executable, "-c", "from tracediag.cli import main; main()", "analyze",
                                    "--log", str(vllm), "-o", str(Path(d) / "out"), "-q"]  # fmt: skip
        for rep in range(a.repeats):
            order = list(roots) if rep % 2 == 0 else list(roots)[::-1]
            for job, args in jobs.items():
                for version in order:
                    r = _run(args, roots[version])
                    r["load_avg_1m"] = round(os.getloadavg()[0], 2)
                    if job.startswith("parse"):
                        parse_s, parse_cpu_s, rows = r["stdout"].split()
                        n = lines[job.split("_")[1]]
                        r["parse_s"] = round(float(parse_s), 2)
                        r["parse_cpu_s"] = round(float(parse_cpu_s), 2)
                        r["rows"] = int(rows)
                        r["us_per_line"] = round(float(parse_s) / n * 1e6, 2)
                        r["cpu_us_per_line"] = round(float(parse_cpu_s) / n * 1e6, 2)
                    del r["stdout"]
                    results.setdefault(job, {}).setdefault(version, []).append(r)
                    print(json.dumps({"repeat": rep, "job": job, "version": version, **r}), flush=True)
    summary = {
        job: {
            version: {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "load_avg_1m"}
            for version, runs in by_version.items()
        }
        for job, by_version in results.items()
    }
    doc = {
        "command": "python " + " ".join(sys.argv),
        "lines": lines,
        "machine": {"cpus": os.cpu_count()},
        "roots": {k: str(v) for k, v in roots.items()},
        "runs": results,
        "median": summary,
    }
    print(json.dumps(summary, indent=1))
    if a.json:
        a.json.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
