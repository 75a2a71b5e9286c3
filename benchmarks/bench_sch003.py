"""SCH003 at scale: the trend test on 10^5 and 10^6 points, and `tracediag analyze --log` on a 10^6-line vLLM log
whose queue grows, timed with the peak RSS of the process tree.

The log is SYNTHETIC (no real log that long exists in the repository): V1 stats lines in vLLM's own layout
(vllm/logger.py `%(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s`, vllm/v1/metrics/loggers.py
LoggingStatLogger) every second, with Waiting rising by one request a minute plus noise, so SCH003 must report
the growth. Run from the repository root:

    .venv/bin/python benchmarks/bench_sch003.py [--lines 1000000] [--json benchmarks/results/sch003.json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path


def write_log(path: Path, lines: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    t0 = datetime(2026, 3, 17, 0, 0, 0)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(lines):
            ts = (t0 + timedelta(seconds=i)).strftime("%m-%d %H:%M:%S")
            waiting = i // 60 + rng.randint(0, 5)
            f.write(
                f"(APIServer pid=4242) INFO {ts} [loggers.py:259] Engine 000: Avg prompt throughput: "
                f"{rng.uniform(900, 1100):.1f} tokens/s, Avg generation throughput: "
                f"{rng.uniform(400, 500):.1f} tokens/s, "
                f"Running: 32 reqs, Waiting: {waiting} reqs, GPU KV cache usage: {rng.uniform(80, 95):.1f}%, "
                "Prefix cache hit rate: 0.0%\n"
            )


def tree_rss(root: int) -> int:
    """Resident bytes of `root` and all its descendants now (Linux /proc; 0 where it is not readable)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            fields = stat[stat.rindex(")") + 2 :].split()
            children.setdefault(int(fields[1]), []).append(int(d.name))
            rss[int(d.name)] = int((d / "statm").read_text().split()[1]) * page
        except (OSError, ValueError, IndexError):
            continue
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def time_trend(n: int) -> float:
    from tracediag.model.servingmath import mann_kendall

    rng = random.Random(2)
    y = [i // 100 + rng.random() for i in range(n)]
    t0 = time.perf_counter()
    mann_kendall(range(n), y)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--lines", type=int, default=1_000_000)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    out: dict = {"trend_test_s": {str(n): round(time_trend(n), 2) for n in (100_000, 1_000_000)}}
    with tempfile.TemporaryDirectory() as d:
        log = Path(d) / "growing.log"
        write_log(log, a.lines)
        out["log_bytes"] = log.stat().st_size
        out["load_avg_1m_before"] = round(os.getloadavg()[0], 2)
        t0 = time.perf_counter()
        args = [sys.executable, "-c", "from tracediag.cli import main; main()", "analyze", "--log", str(log), "-o",
                str(Path(d) / "out"), "-q"]  # fmt: skip
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        peak_tree = 0
        while proc.poll() is None:
            peak_tree = max(peak_tree, tree_rss(proc.pid))
            time.sleep(0.05)
        proc.communicate()
        out["analyze_s"] = round(time.perf_counter() - t0, 1)
        out["analyze_rc"] = proc.returncode
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        out["analyze_cpu_s"] = round(usage.ru_utime + usage.ru_stime, 1)  # insensitive to other load on the machine
        out["peak_rss_mib"] = round(usage.ru_maxrss / 1024, 1)  # the largest single process
        out["peak_tree_rss_mib"] = round(peak_tree / 2**20, 1)  # the process and its workers, summed, sampled 20/s
        out["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
        findings = json.loads((Path(d) / "out" / "findings.json").read_text()) if proc.returncode == 0 else {}
        sch003 = next((c for c in findings.get("checks", []) if c["rule"] == "SCH003"), {})
        out["sch003"] = {k: sch003.get(k) for k in ("status", "title")}
        out["sch003_values"] = {
            k: sch003.get("values", {}).get(k) for k in ("n", "p_increase", "sen_slope_per_s", "sen_method", "test")
        }
        out["report_html_bytes"] = (Path(d) / "out" / "report.html").stat().st_size if proc.returncode == 0 else None
    out["lines"] = a.lines
    print(json.dumps(out, indent=2))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
