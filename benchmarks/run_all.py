"""Every speed ratio of the ingest/analyze benchmarks in one command, each against its target.

    python benchmarks/run_all.py                      # everything whose inputs exist; skips the rest, saying why
    python benchmarks/run_all.py --make-data          # first generate the pair (needs torch) and the 4 GB rank
    python benchmarks/run_all.py --only real,store --repeats 5
    python benchmarks/run_all.py --quick              # fewer repeats, a 10^5-line log, fleet at 8 and 16 ranks

Not a test. It runs the existing benchmark scripts as child processes (each with this interpreter and the
repository on PYTHONPATH) and collects their results:

* `pair`  -- bench_ingest.py on `<data>/json` (the generated pair, 2 x 222 MB): the full `tracediag analyze`
  against the GC-free orjson parse floor (each file in its own process, in parallel up to the cores) by wall and
  CPU time, and against HolisticTraceAnalysis's load.
* `real`  -- bench_ingest.py on `<data>/real` (the largest vendored real Kineto rank, the HTA V100 trace, copied
  there when missing): the same ratios.
* `small` -- bench_fixed_cost.py: `tracediag analyze` and `check` of the README sample and `analyze` of the V100 rank
  (whole processes, and its second analyze in one process) against a floor process that imports duckdb, numpy and
  orjson and parses the same files (issue 40).
* `big`   -- `tracediag analyze` of the ~4 GB rank generated from the pair (gen_large_rank.py, `--make-data`): its
  peak RSS with the default --memory-limit.
* `store` -- bench_fleet_store.py on the pair: `analyze --store` over a full `analyze`.
* `log`   -- bench_sch003.py: `analyze --log` of a synthetic 10^6-line vLLM log.
* `logparse` -- bench_logs.py: the parse of 10^6-line vLLM and SGLang logs alone, CPU µs a line.
* `fleet` -- bench_fleet.py: ingest + `analyze --store` on a local Dask cluster, 8..64 replicated ranks (1024:
  `--fleet-ranks 64,256,1024`), one straggler injected: linear time, the coordinator's peak RSS, the straggler named.

A benchmark whose inputs or tools are missing is reported as "skipped: <why>" (HTA not installed, the pair not
generated, dask.distributed not installed); one that fails is reported as "failed: <its last error line>". Exit
status 1 when any benchmark failed, else 0. `--json` writes every collected number.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BENCH = REPO / "benchmarks"
V100 = REPO / "tests/data/external/kineto/hta_v100_ns_resolution.pt.trace.json.gz"
ALL = ("pair", "real", "small", "big", "store", "log", "logparse", "fleet")

# Targets: issue 27's (docs: benchmarks/README.md). (label, key, comparison, bound)
MB = 1e6 / 2**20  # the MB in MiB (peak RSS is read in MiB)
TARGETS = {
    "pair": [
        ("analyze / floor, wall", "over_floor_wall", "<=", 1.0),
        ("analyze / floor, CPU", "over_floor_cpu", "<=", 1.0),
        ("HTA load / analyze, wall", "hta_over_wall", ">=", 10.0),
        ("HTA load / analyze, CPU", "hta_over_cpu", ">=", 10.0),
        ("analyze / HTA peak tree RSS", "rss_over_hta", "<=", 0.5),
    ],
    "real": [
        ("analyze / floor, wall", "over_floor_wall", "<=", 2.0),
        ("analyze / floor, CPU", "over_floor_cpu", "<=", 2.0),
        ("HTA load / analyze, wall", "hta_over_wall", ">=", 3.0),
        ("HTA load / analyze, CPU", "hta_over_cpu", ">=", 3.0),
        ("analyze / HTA peak tree RSS", "rss_over_hta", "<=", 1.0),
    ],
    "small": [  # issue 40's: against a floor process that imports duckdb, numpy and orjson and parses the files
        ("README sample, analyze / import-and-parse floor, wall", "sample_analyze_over_floor_wall", "<=", 2.0),
        ("README sample, check / import-and-parse floor, wall", "sample_check_over_floor_wall", "<=", 2.0),
        ("V100 rank, analyze / import-and-parse floor, wall", "v100_analyze_over_floor_wall", "<=", 2.0),
        ("V100 rank, warm second analyze / floor, wall", "v100_warm_over_floor_wall", "<=", 1.5),
    ],
    "big": [("peak RSS MiB, 4 GB rank, default --memory-limit", "peak_rss_mib", "<=", 2000 * MB)],
    "store": [("analyze --store / full analyze, wall", "store_over_full", "<=", 0.25)],
    "log": [
        ("analyze --log, wall s (10^6 lines)", "wall_s", "<=", 10.0),
        ("peak tree RSS MiB (500 MB)", "peak_tree_rss_mib", "<=", 500 * MB),
    ],
    "logparse": [
        ("vLLM log parse, CPU µs a line", "vllm_cpu_us_per_line", "<=", 5.0),
        ("SGLang log parse, CPU µs a line", "sglang_cpu_us_per_line", "<=", 5.0),
    ],
    "fleet": [
        ("total time linear in ranks, R^2", "r2", ">=", 0.95),
        ("coordinator peak RSS MiB (1 GB)", "coordinator_peak_rss_mib", "<=", 1000 * MB),
        ("straggler named at every size", "straggler_named", "==", True),
    ],
}


class Skip(Exception):
    """A benchmark that cannot run here; the message says why."""


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("VIRTUAL_ENV", None)
    return env


def _run(cmd: list[str], timeout: float, check: bool = True) -> subprocess.CompletedProcess:
    print("$ " + " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(
        [str(c) for c in cmd], cwd=REPO, env=_env(), capture_output=True, text=True, timeout=timeout, check=False
    )
    sys.stderr.write(proc.stderr[-4000:])
    if proc.returncode != 0 and check:
        tail = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
        raise RuntimeError(tail[-1] if tail else f"exit status {proc.returncode}")
    return proc


def _importable(python: str, module: str) -> bool:
    if not Path(python).exists():
        return False
    return subprocess.run([python, "-c", f"import {module}"], capture_output=True, check=False).returncode == 0


def _ingest_bench(args, form: str) -> dict:
    """bench_ingest.py on <data>/<form> with floor, the CLI and HTA when installed; the ratios of its rows."""
    tools = ["floor", "td-cli"]
    hta = _importable(args.hta_python, "hta.trace_analysis")
    if hta:
        tools.append("hta")
    with tempfile.TemporaryDirectory(prefix="run-all-") as tmp:
        cmd = [sys.executable, BENCH / "bench_ingest.py", "--data", args.data, "--forms", form, "--tools",
               ",".join(tools), "--repeats", args.repeats, "--td-python", sys.executable, "--hta-python",
               args.hta_python, "--results", tmp, "--name", form]  # fmt: skip
        if args.busy:
            cmd += ["--quiet-cores", "0", "--max-other-cores", "0"]
        proc = _run(cmd, args.timeout, check=False)  # exit 1: some run failed; the others are still medians
        found = list(Path(tmp).glob("*.json"))
        if not found:
            tail = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
            raise RuntimeError(tail[-1] if tail else f"exit status {proc.returncode}")
        doc = json.loads(found[0].read_text())
    rows = {r["tool"]: r for r in doc["rows"]}
    failed = [r for r in doc["runs"] if "error" in r]
    cli = rows["tracediag analyze (CLI)"]
    floor = rows["parse floor (gunzip + orjson, no GC)"]
    out = {
        "analyze_wall_s": cli["process_s"],
        "analyze_cpu_s": cli["cpu_s"],
        "analyze_peak_rss_mb": cli["peak_rss_mb"],
        "floor_wall_s": floor["process_s"],
        "floor_cpu_s": floor["cpu_s"],
        "over_floor_wall": cli.get("tool_over_floor_process"),
        "over_floor_cpu": cli.get("tool_over_floor_cpu"),
        "runs": f"median of {args.repeats}, load average at end {doc['load_average_at_end'][0]:.1f}",
    }
    if failed:  # its exit status and the last line it wrote
        why = [ln for ln in failed[0]["error"].splitlines() if ln.strip() and "▕" not in ln][-1:]
        out["failed_runs"] = f"{len(failed)} of {len(doc['runs'])} (rc {failed[0]['rc']}: {' '.join(why)[:200]})"
    if hta:
        h = rows["HTA TraceAnalysis"]
        out |= {
            "hta_load_wall_s": h["process_s"],
            "hta_cpu_s": h["cpu_s"],
            "hta_over_wall": cli.get("hta_over_tool_process"),
            "hta_over_cpu": cli.get("hta_over_tool_cpu"),
            "rss_over_hta": cli.get("tool_over_hta_rss"),
        }
    else:
        out["hta"] = "skipped: HTA not installed (see benchmarks/README.md, Setup)"
    return out


def _pair_files(args) -> list[Path]:
    d = Path(args.data) / "json"
    files = sorted(d.glob("rank*.pt.trace.json")) if d.is_dir() else []
    if not files:
        raise Skip(f"the generated pair is not in {d} (run with --make-data, or see benchmarks/README.md)")
    return files


def bench_pair(args) -> dict:
    _pair_files(args)
    return _ingest_bench(args, "json")


def bench_real(args) -> dict:
    d = Path(args.data) / "real"
    if not any(d.glob("*.json*")):
        d.mkdir(parents=True, exist_ok=True)
        shutil.copy(V100, d / V100.name)
    return _ingest_bench(args, "real")


def _big_rank(args) -> Path:
    f = Path(args.data) / "big" / "rank0.pt.trace.json"
    if not f.exists():
        raise Skip(f"the generated 4 GB rank is not {f} (run with --make-data, or see benchmarks/README.md)")
    return f


def bench_big(args) -> dict:
    """`tracediag analyze` of the generated ~4 GB rank with the default --memory-limit: its peak RSS (the rank is
    parsed in the analyzing process: one file) and its wall and CPU time, one run."""
    f = _big_rank(args)
    with tempfile.TemporaryDirectory(prefix="run-all-") as tmp:
        cmd = [sys.executable, "-m", "tracediag", "analyze", str(f), "-o", str(Path(tmp) / "out"), "-q"]
        model = Path(args.data) / "config.json"
        if model.exists():
            cmd += ["-m", str(model)]
        print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage (and its reaped children's)
        wall = time.perf_counter() - t0
        err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
        proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode not in (0, 1):
        tail = [ln for ln in err.splitlines() if ln.strip()]
        raise RuntimeError(tail[-1] if tail else f"exit status {proc.returncode}")
    return {
        "peak_rss_mib": round(usage.ru_maxrss / 1024, 1),
        "wall_s": round(wall, 1),
        "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
        "gb": round(f.stat().st_size / 1e9, 2),
        "runs": "one run",
    }


def bench_store(args) -> dict:
    files = _pair_files(args)
    model = Path(args.data) / "config.json"
    if not model.exists():
        raise Skip(f"no model config {model} for the pair (see benchmarks/README.md)")
    with tempfile.TemporaryDirectory(prefix="run-all-") as tmp:
        out = Path(tmp) / "store.json"
        _run([sys.executable, BENCH / "bench_fleet_store.py", *files, "-m", model, "--repeats", args.repeats,
              "--out", out], args.timeout)  # fmt: skip
        doc = json.loads(out.read_text())
    return {
        "store_over_full": doc["store_over_full"],
        "full_wall_s": doc["median_wall_s"]["full"],
        "store_wall_s": doc["median_wall_s"]["store"],
        "same_checks": doc["same_checks"],
        "runs": f"median of {args.repeats}",
    }


def bench_log(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="run-all-") as tmp:
        out = Path(tmp) / "log.json"
        _run([sys.executable, BENCH / "bench_sch003.py", "--lines", args.log_lines, "--json", out], args.timeout)
        doc = json.loads(out.read_text())
    if doc.get("analyze_rc") != 0:
        raise RuntimeError(f"analyze --log exited {doc.get('analyze_rc')}")
    return {
        "lines": doc["lines"],
        "wall_s": doc["analyze_s"],
        "cpu_s": doc["analyze_cpu_s"],
        "peak_tree_rss_mib": doc["peak_tree_rss_mib"],
        "sch003": doc["sch003"]["status"],
        "runs": "one run",
    }


def bench_logparse(args) -> dict:
    with tempfile.TemporaryDirectory(prefix="run-all-") as tmp:
        out = Path(tmp) / "logs.json"
        _run([sys.executable, BENCH / "bench_logs.py", "--skip-analyze", "--lines", args.log_lines, "--repeats",
              args.repeats, "--json", out], args.timeout)  # fmt: skip
        doc = json.loads(out.read_text())
    med = doc["median"]
    return {
        "vllm_cpu_us_per_line": med["parse_vllm"]["new"]["cpu_us_per_line"],
        "sglang_cpu_us_per_line": med["parse_sglang"]["new"]["cpu_us_per_line"],
        "lines": doc["lines"],
        "runs": f"median of {args.repeats}",
    }


def bench_small(args) -> dict:
    """bench_fixed_cost.py: the README sample and the V100 rank against the import-and-parse floor."""
    with tempfile.TemporaryDirectory(prefix="run-all-") as tmp:
        out = Path(tmp) / "small.json"
        _run([sys.executable, BENCH / "bench_fixed_cost.py", "--rounds", max(3, args.repeats), "--json", out],
             args.timeout)  # fmt: skip
        med = json.loads(out.read_text())["medians"]

    def over(row: str, floor: str, key: str = "wall_s") -> float:
        return med[f"this: {row}"][key] / med[f"this: {floor}"]["wall_s"]

    return {
        "sample_analyze_over_floor_wall": over("sample analyze", "sample floor"),
        "sample_check_over_floor_wall": over("sample check", "sample floor"),
        "v100_analyze_over_floor_wall": over("V100 analyze", "V100 floor"),
        "v100_warm_over_floor_wall": over("V100 warm", "V100 floor", "warm_wall_s"),
        "runs": f"median of {max(3, args.repeats)} interleaved rounds",
    }


def bench_fleet(args) -> dict:
    if not _importable(sys.executable, "distributed"):
        raise Skip("dask.distributed not installed (the `fleet` extra)")
    with tempfile.TemporaryDirectory(prefix="run-all-") as tmp:
        out = Path(tmp) / "fleet.json"
        _run([sys.executable, BENCH / "bench_fleet.py", "--ranks", args.fleet_ranks, "--repeats",
              max(1, args.repeats // 2), "--out", out], args.timeout)  # fmt: skip
        doc = json.loads(out.read_text())
    fit = doc["fit_total"]
    return {
        "r2": fit.get("r2"),
        "coordinator_peak_rss_mib": max(s["coordinator_peak_rss_mib"] for s in doc["summary"]),
        "straggler_named": all(s["straggler_named"] for s in doc["summary"]),
        "per_rank_s": fit.get("per_rank_s"),
        "total_s": {str(s["ranks"]): round(s["total_s"], 2) for s in doc["summary"]},
        "runs": f"ranks {args.fleet_ranks}",
    }


def make_data(args) -> None:
    """The generated pair of benchmarks/README.md (needs the torch extra) and the ~4 GB rank made from it, when they
    are not there."""
    data = Path(args.data)
    make_pair(args)
    big = data / "big" / "rank0.pt.trace.json"
    pair = sorted((data / "json").glob("rank*.pt.trace.json"))
    if pair and not big.exists() and "big" in args.only:
        big.parent.mkdir(parents=True, exist_ok=True)
        _run([sys.executable, BENCH / "gen_large_rank.py", pair[0], "--target-gb", "4", "--out", big], args.timeout)


def make_pair(args) -> None:
    """The generated pair of benchmarks/README.md (needs the torch extra), when it is not there."""
    data = Path(args.data)
    if any((data / "json").glob("rank*.pt.trace.json")):
        return
    if not _importable(sys.executable, "torch"):
        print("--make-data: torch is not installed; the pair is not generated", file=sys.stderr)
        return
    gen = data / "gen"
    _run([sys.executable, REPO / "sample_traces/generate.py", "--scenario", "healthy_tp2", "--large", "--no-gzip",
          "--out", gen], args.timeout)  # fmt: skip
    (data / "json").mkdir(parents=True, exist_ok=True)
    for f in gen.glob("rank*.pt.trace.json"):
        os.link(f, data / "json" / f.name)
    shutil.copy(gen / "config.json", data / "config.json")


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.2f}"
    return "—" if v is None else str(v)


def _fmt_bound(bound) -> str:
    return str(bound).lower() if isinstance(bound, bool) else f"{bound:.4g}"


def table(results: dict[str, dict]) -> str:
    lines = ["| benchmark | ratio | measured | target | met |", "|---|---|---|---|---|"]
    for name, res in results.items():
        if "skipped" in res or "failed" in res:
            lines.append(f"| {name} | — | {res.get('skipped') or res.get('failed')} | — | — |")
            continue
        for label, key, op, bound in TARGETS[name]:
            v = res.get(key)
            if v is None:
                why = res.get("hta", "not measured") if key.startswith(("hta", "rss")) else "not measured"
                lines.append(f"| {name} | {label} | {why} | {op} {_fmt_bound(bound)} | — |")
                continue
            met = {"<=": v <= bound, ">=": v >= bound, "<": v < bound, "==": v == bound}[op]
            lines.append(f"| {name} | {label} | {_fmt(v)} | {op} {_fmt_bound(bound)} | {'yes' if met else 'no'} |")
        detail = ", ".join(f"{k} {_fmt(v)}" for k, v in res.items() if k not in {t[1] for t in TARGETS[name]})
        lines.append(f"| {name} | (inputs) | {detail} | | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", default=str(REPO / "bench-work"), help="folder with json/, real/, config.json")
    ap.add_argument("--only", default=",".join(ALL), help=f"comma list of {', '.join(ALL)}")
    ap.add_argument("--repeats", type=int, default=None, help="runs of each command (default 3)")
    ap.add_argument("--hta-python", default=str(REPO / ".venv-hta/bin/python"))
    ap.add_argument("--log-lines", type=int, default=None, help="lines of the synthetic log (default 10^6)")
    ap.add_argument("--fleet-ranks", default=None, help="rank counts of the fleet benchmark (default 8,16,32,64)")
    ap.add_argument(
        "--quick", action="store_true", help="defaults of --repeats 2, a 10^5-line log, fleet at 8 and 16 ranks"
    )
    ap.add_argument("--make-data", action="store_true", help="generate the pair first when missing (needs torch)")
    ap.add_argument(
        "--busy", action="store_true", help="shared machine: do not wait for idle cores nor redo noisy runs"
    )
    ap.add_argument("--timeout", type=float, default=3600, help="longest run of one benchmark script, s")
    ap.add_argument("--json", type=Path, help="write every collected number here")
    args = ap.parse_args(argv)
    quick = {"repeats": 2, "log_lines": 100_000, "fleet_ranks": "8,16"}
    full = {"repeats": 3, "log_lines": 1_000_000, "fleet_ranks": "8,16,32,64"}
    for key, value in (quick if args.quick else full).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    chosen = [c.strip() for c in args.only.split(",") if c.strip()]
    unknown = sorted(set(chosen) - set(ALL))
    if unknown:
        ap.error(f"unknown benchmark(s): {', '.join(unknown)}")
    if args.make_data:
        make_data(args)
    benches = {"pair": bench_pair, "real": bench_real, "small": bench_small, "big": bench_big, "store": bench_store,
               "log": bench_log, "logparse": bench_logparse, "fleet": bench_fleet}  # fmt: skip
    results: dict[str, dict] = {}
    for name in chosen:
        try:
            results[name] = benches[name](args)
        except Skip as exc:
            results[name] = {"skipped": f"skipped: {exc}"}
        except (RuntimeError, subprocess.TimeoutExpired, OSError, KeyError, ValueError) as exc:
            results[name] = {"failed": f"failed: {exc}"}
        print(f"{name}: {json.dumps(results[name], default=str)}", file=sys.stderr, flush=True)
    print(table(results))
    if args.json:
        doc = {
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "cpus": os.cpu_count(),
            "load_average_at_end": list(os.getloadavg()),
            "command": " ".join(sys.argv),
            "results": results,
        }
        args.json.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return 1 if any("failed" in r for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
