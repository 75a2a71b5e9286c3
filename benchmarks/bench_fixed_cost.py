"""Small runs against the import-and-parse floor (issue 40): the README sample and HTA's real V100 rank.

    python benchmarks/bench_fixed_cost.py                       # 7 interleaved rounds
    python benchmarks/bench_fixed_cost.py --rounds 11 --json benchmarks/results/fixed-cost-<date>.json
    python benchmarks/bench_fixed_cost.py --baseline /tmp/old-checkout   # A/B: this checkout over another one

Not a test. Each round runs, as whole processes one after another (interleaved, so a machine whose speed drifts
moves every row alike): the floor (a process that imports duckdb, numpy and orjson and parses the input files with
orjson, gzip undone, the cyclic GC off), `tracediag analyze` and `tracediag check` of the README sample
(sample_traces/healthy_tp2 with its config.json), the floor and `tracediag analyze` of the V100 rank, and a
process that analyses the V100 rank twice (`tracediag.analyze`) and reports the second run's time: the warm run of
a notebook or of the MCP server. Wall time around each process; CPU = user + system of the child from os.wait4.
Prints medians and the ratios to the floor (wall and CPU); with --baseline, also each row of the other checkout
(its path put first on PYTHONPATH) and the pairwise ratios this/other.
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

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "sample_traces/healthy_tp2"
V100 = REPO / "tests/data/external/kineto/hta_v100_ns_resolution.pt.trace.json.gz"

FLOOR = """
import gc, gzip, sys
import duckdb, numpy, orjson
gc.disable()
for path in sys.argv[1:]:
    with open(path, "rb") as fh:
        raw = fh.read()
    if raw[:2] == b"\\x1f\\x8b":
        raw = gzip.decompress(raw)
    orjson.loads(raw)
"""

WARM = """
import json, sys, time
import tracediag
tracediag.analyze([sys.argv[1]])
t, c = time.perf_counter(), time.process_time()
tracediag.analyze([sys.argv[1]])
print("WARM" + json.dumps({"wall_s": time.perf_counter() - t, "cpu_s": time.process_time() - c}))
"""


def _run(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    t = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=REPO)
    out = proc.stdout.read().decode() if proc.stdout else ""
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t
    rc = os.waitstatus_to_exitcode(status)
    if rc not in (0, 1):  # check exits 1 when it finds something new: the sample's COL003 is a finding
        raise RuntimeError(f"{' '.join(cmd)}: exit status {rc}")
    row = {"wall_s": wall, "cpu_s": ru.ru_utime + ru.ru_stime, "peak_rss_mib": ru.ru_maxrss / 1024}
    for line in out.splitlines():
        if line.startswith("WARM"):
            row |= {f"warm_{k}": v for k, v in json.loads(line[4:]).items()}
    return row


def _commands(out: Path) -> dict[str, list[str]]:
    py = sys.executable
    samples = sorted(str(p) for p in SAMPLE.glob("rank*.pt.trace.json.gz"))
    model = str(SAMPLE / "config.json")
    td = [py, "-m", "tracediag"]
    return {
        "sample floor": [py, "-c", FLOOR, *samples],
        "sample analyze": [*td, "analyze", str(SAMPLE), "-m", model, "-o", str(out / "sample"), "-q", "--force"],
        "sample check": [*td, "check", str(SAMPLE), "-m", model, "-q"],
        "V100 floor": [py, "-c", FLOOR, str(V100)],
        "V100 analyze": [*td, "analyze", str(V100), "-o", str(out / "v100"), "-q", "--force"],
        "V100 warm": [py, "-c", WARM, str(V100)],
    }


def _env(checkout: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(checkout))
    env.pop("VIRTUAL_ENV", None)
    return env


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--baseline", type=Path, help="another checkout, run interleaved with this one")
    ap.add_argument("--json", type=Path, help="write every run and the medians here")
    args = ap.parse_args()
    sides = {"this": _env(REPO)} | ({"other": _env(args.baseline.resolve())} if args.baseline else {})
    runs: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-fixed-") as tmp:
        cmds = _commands(Path(tmp))
        for cmd in cmds.values():  # one uncounted warm-up of each (page cache, bytecode, template cache)
            for env in sides.values():
                _run(cmd, env)
        for _ in range(args.rounds):
            for name, cmd in cmds.items():
                for side, env in sides.items():
                    runs.setdefault((side, name), []).append(_run(cmd, env))
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in runs.items()}
    print(f"| side | row | wall s | CPU s | peak MiB | / floor, wall | / floor, CPU |  ({args.rounds} rounds, medians)")
    print("|---|---|---|---|---|---|---|")
    for (side, name), m in med.items():
        floor = med[(side, name.split()[0] + " floor")]
        wall, cpu = (m["warm_wall_s"], m["warm_cpu_s"]) if "warm_wall_s" in m else (m["wall_s"], m["cpu_s"])
        ratio = "" if "floor" in name else f"{wall / floor['wall_s']:.2f}× | {cpu / floor['cpu_s']:.2f}×"
        label = name + (" (the second analyze, in process)" if "warm" in name else "")
        print(f"| {side} | {label} | {wall:.3f} | {cpu:.3f} | {m['peak_rss_mib']:.0f} | {ratio or '— | —'} |")
    if args.baseline:
        print("\n| row | this / other, wall (pairs' median) | CPU |")
        print("|---|---|---|")
        for name in cmds:
            pairs = list(zip(runs[("this", name)], runs[("other", name)]))
            w = "warm_wall_s" if "warm" in name else "wall_s"
            c = "warm_cpu_s" if "warm" in name else "cpu_s"
            print(
                f"| {name} | {statistics.median(a[w] / b[w] for a, b in pairs):.3f} | "
                f"{statistics.median(a[c] / b[c] for a, b in pairs):.3f} |"
            )
    if args.json:
        doc = {
            "rounds": args.rounds,
            "load_average_at_end": os.getloadavg(),
            "cores": os.cpu_count(),
            "runs": {f"{s}: {n}": v for (s, n), v in runs.items()},
            "medians": {f"{s}: {n}": v for (s, n), v in med.items()},
        }
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
