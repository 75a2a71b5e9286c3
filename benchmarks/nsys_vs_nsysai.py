"""`tracediag analyze` of an Nsight Systems SQLite export against nsys-ai's Parquet cache build of the same file.

Not a test. Two commands run as whole processes, interleaved (tracediag, nsys-ai, tracediag, nsys-ai, ...), after
--warmup uncounted rounds:

    tracediag: PYTHON -m tracediag analyze COPY -o OUT -q
    nsys-ai:   NSYSAI_PYTHON -c "...; from nsys_ai.parquet_cache import build_cache; build_cache(COPY)"
               (--nsysai-step warm: NSYSAI_PYTHON -m nsys_ai warm COPY)

They do different amounts of work, so read the ratio with that in mind. tracediag parses the export, loads it
into DuckDB, builds its derived tables, runs every rule and writes findings.json, report.html and trace.duckdb.
nsys-ai's `build_cache` (nsys_ai/parquet_cache.py, 0.3.0) only exports the export's tables to ZSTD Parquet
files in `<stem>.nsys-cache` next to the export (kernels joined with their names and tensor-core flags, NVTX
with resolved text, runtime, memcpy/memset, sync, string ids, ...): the step every nsys-ai analysis pays first,
before any skill runs. It defers the NVTX-to-kernel map to the first query that needs it; `nsys-ai warm` also
builds that map and opens the profile once.

Every round works in a fresh folder holding a fresh copy of the export (copied outside the timed part), so
nsys-ai finds no cache to reuse and both tools read the same bytes from the page cache. After each run the
outputs are checked: tracediag's findings.json parses, nsys-ai's `.cache_version` exists and every Parquet file
in the cache is non-empty. Wall time is taken around the whole process (interpreter start and imports
included); CPU time is user + system from `os.wait4` (the child and the children it reaped), which other load
on a shared machine inflates far less than wall time; peak RSS is the child's `ru_maxrss` (the largest single
process). Printed: median and minimum of each, and the ratios tracediag / nsys-ai of the medians and the median
of the per-round ratios. Standard library only.

Usage (from the repository root; the nsys-ai venv is set up as in benchmarks/README.md)::

    .venv/bin/python benchmarks/nsys_vs_nsysai.py --nsysai-python /tmp/nsysai-venv/bin/python --rounds 15
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
NSYS_EXPORTS = REPO / "tests" / "data" / "external" / "nsys"

# The cache build alone: the function nsys-ai's own open path (`parquet_cache.open_auto_db`) calls on a profile
# that has no valid cache yet. No viewer, no AI backend, no network.
BUILD_CACHE = "import sys\nfrom nsys_ai.parquet_cache import build_cache\nbuild_cache(sys.argv[1])\n"
VERSIONS = (
    "import importlib.metadata as m, json, platform\n"
    "print(json.dumps({'python': platform.python_version(), "
    "**{p: m.version(p) for p in ('nsys-ai', 'duckdb', 'pyarrow')}}))\n"
)


def _largest_export(folder: Path) -> Path:
    files = sorted(folder.glob("*.sqlite"), key=lambda p: p.stat().st_size)
    if not files:
        raise SystemExit(f"no .sqlite in {folder} (vendored real inputs: tests/data/external/README.md)")
    return files[-1]


def _timed(cmd: list[str], log: Path) -> dict:
    """Run `cmd` to completion; wall seconds around the process, CPU seconds and peak RSS from wait4."""
    load = os.getloadavg()[0]
    with log.open("wb") as out:
        t0 = time.perf_counter()
        child = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - t0
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {child.returncode}:\n{log.read_text(errors='replace')[-3000:]}")
    return {
        "wall_s": round(wall, 4),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 4),
        "user_s": round(usage.ru_utime, 4),
        "sys_s": round(usage.ru_stime, 4),
        "max_rss_mib": round(usage.ru_maxrss / 1024, 1),  # Linux reports KiB
        "load_avg_1m": round(load, 2),
    }


def _check_tracediag(out: Path) -> dict:
    findings = out / "findings.json"
    if not findings.is_file():
        raise SystemExit(f"tracediag wrote no {findings}")
    checks = json.loads(findings.read_text())["checks"]
    status: dict[str, int] = {}
    for c in checks:
        status[c["status"]] = status.get(c["status"], 0) + 1
    return {"checks": len(checks), "by_status": dict(sorted(status.items()))}


def _check_nsysai(cache: Path) -> dict:
    if not (cache / ".cache_version").is_file():
        raise SystemExit(f"nsys-ai wrote no {cache / '.cache_version'}")
    files = sorted(cache.glob("*.parquet"))
    empty = [f.name for f in files if f.stat().st_size == 0]
    if not files or empty:
        stamp = (cache / ".cache_version").read_text()
        raise SystemExit(f"nsys-ai cache {cache}: {len(files)} Parquet files, empty: {empty}, stamp: {stamp}")
    return {
        "parquet_files": len(files),
        "bytes": sum(f.stat().st_size for f in files),
        "stamp": json.loads((cache / ".cache_version").read_text()),
    }


FIGURES = ("wall_s", "cpu_s", "max_rss_mib")


def _summary(runs: list[dict], key: str) -> dict:
    values = [r[key] for r in runs]
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4), "max": round(max(values), 4)}


def _ratios(a: list[dict], b: list[dict], key: str, label: str) -> dict:
    """a / b: of the two medians, and the median and minimum of the per-round pairs (robust to drift)."""
    pairs = [x[key] / y[key] for x, y in zip(a, b)]
    return {
        f"{label}_of_medians": round(statistics.median(x[key] for x in a) / statistics.median(y[key] for y in b), 3),
        f"{label}_median_of_pairs": round(statistics.median(pairs), 3),
        f"{label}_min_of_pairs": round(min(pairs), 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("export", nargs="?", type=Path, help="Nsight Systems SQLite export (default: the largest vendored)")
    ap.add_argument("--nsysai-python", type=Path, required=True, help="python of a venv with nsys-ai installed")
    ap.add_argument("--nsysai-step", choices=("build_cache", "warm"), default="build_cache")
    ap.add_argument("--python", type=Path, default=Path(sys.executable), help="python that runs tracediag")
    ap.add_argument("--rounds", type=int, default=15, help="counted rounds (one run of each tool per round)")
    ap.add_argument("--warmup", type=int, default=1, help="uncounted rounds first")
    ap.add_argument(
        "--out", type=Path, help="results JSON (default: benchmarks/results/nsys-vs-nsysai-DATE-NCPUSc.json)"
    )
    ap.add_argument("--keep", type=Path, help="keep the last round's folder here")
    args = ap.parse_args()

    export = (args.export or _largest_export(NSYS_EXPORTS)).resolve()
    env_keys = [k for k in os.environ if k.startswith("NSYS_AI_")]
    if env_keys:
        raise SystemExit(f"unset {', '.join(env_keys)}: they change what nsys-ai builds")
    nsysai_versions = json.loads(subprocess.run([str(args.nsysai_python), "-c", VERSIONS], capture_output=True,
                                                text=True, check=True).stdout)  # fmt: skip
    tracediag_versions = json.loads(
        subprocess.run(
            [str(args.python), "-c", VERSIONS.replace("'nsys-ai', ", "'tracediag', ")],
            capture_output=True,
            text=True,
            check=True,
            cwd=REPO,
        ).stdout
    )
    work = Path(tempfile.mkdtemp(prefix="nsys-vs-nsysai-"))
    runs: dict[str, list[dict]] = {"tracediag": [], "nsys-ai": []}
    outputs: dict[str, dict] = {}
    commands: dict[str, list[str]] = {}
    failed = True
    try:
        for i in range(args.warmup + args.rounds):
            counted = i >= args.warmup
            rnd = work / f"round{i}"
            rnd.mkdir()
            copy = rnd / export.name
            shutil.copyfile(export, copy)
            commands["tracediag"] = [str(args.python), "-m", "tracediag", "analyze", str(copy), "-o",
                                     str(rnd / "tracediag-out"), "-q"]  # fmt: skip
            commands["nsys-ai"] = (
                [str(args.nsysai_python), "-c", BUILD_CACHE, str(copy)]
                if args.nsysai_step == "build_cache"
                else [str(args.nsysai_python), "-m", "nsys_ai", "warm", str(copy)]
            )
            for name in ("tracediag", "nsys-ai"):
                r = _timed(commands[name], rnd / f"{name}.log")
                outputs[name] = (
                    _check_tracediag(rnd / "tracediag-out")
                    if name == "tracediag"
                    else _check_nsysai(copy.with_suffix(".nsys-cache"))
                )
                if counted:
                    runs[name].append(r)
                label = f"round {i - args.warmup + 1}" if counted else "warm-up"
                print(f"{label:9} {name:9} wall {r['wall_s']:6.2f} s  cpu {r['cpu_s']:6.2f} s  "
                      f"rss {r['max_rss_mib']:6.0f} MiB  load {r['load_avg_1m']:.1f}", flush=True)  # fmt: skip
            if args.keep and i == args.warmup + args.rounds - 1:
                shutil.copytree(rnd, args.keep, dirs_exist_ok=True)
            shutil.rmtree(rnd)
        failed = False
    finally:
        if failed:
            print(f"kept for inspection: {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    td, na = runs["tracediag"], runs["nsys-ai"]
    result = {
        "benchmark": f"tracediag analyze vs nsys-ai {args.nsysai_step} on one Nsight Systems export",
        "date": dt.date.today().isoformat(),
        "command": "python " + " ".join(sys.argv),
        "export": {"file": export.name, "bytes": export.stat().st_size},
        "commit": subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=REPO).stdout.strip(),
        "commands": {
            k: [Path(v[0]).name, *(a.replace(str(work), "$WORK") for a in v[1:])] for k, v in commands.items()
        },
        "nsysai_step": args.nsysai_step,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "machine": {"cpus": os.cpu_count(), "machine": platform.machine(), "kernel": platform.release()},
        "versions": {"tracediag": tracediag_versions, "nsys-ai": nsysai_versions},
        "outputs": outputs,
        "runs": runs,
        "summary": {name: {k: _summary(rs, k) for k in FIGURES} for name, rs in runs.items()},
        "tracediag_over_nsysai": {**_ratios(td, na, "wall_s", "wall"), **_ratios(td, na, "cpu_s", "cpu")},
    }

    print()
    print(f"{export.name} ({export.stat().st_size / 1e6:.2f} MB), {args.rounds} interleaved rounds after "
          f"{args.warmup} warm-up; nsys-ai step: {args.nsysai_step}")  # fmt: skip
    print(f"{'tool':10} {'wall med s':>10} {'wall min s':>10} {'cpu med s':>10} {'cpu min s':>10} {'rss med MiB':>11}")
    for name, s in result["summary"].items():
        print(f"{name:10} {s['wall_s']['median']:10.3f} {s['wall_s']['min']:10.3f} {s['cpu_s']['median']:10.3f} "
              f"{s['cpu_s']['min']:10.3f} {s['max_rss_mib']['median']:11.0f}")  # fmt: skip
    q = result["tracediag_over_nsysai"]
    print(f"tracediag / nsys-ai: wall {q['wall_of_medians']:.2f}x, cpu {q['cpu_of_medians']:.2f}x (of the medians); "
          f"per-round pairs: wall median {q['wall_median_of_pairs']:.2f}x (min {q['wall_min_of_pairs']:.2f}x), "
          f"cpu median {q['cpu_median_of_pairs']:.2f}x (min {q['cpu_min_of_pairs']:.2f}x)")  # fmt: skip
    print(f"outputs: tracediag {outputs['tracediag']}; nsys-ai {outputs['nsys-ai']['parquet_files']} Parquet files, "
          f"{outputs['nsys-ai']['bytes']} bytes")  # fmt: skip
    out = args.out or REPO / "benchmarks" / "results" / f"nsys-vs-nsysai-{result['date']}-{os.cpu_count()}c.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
