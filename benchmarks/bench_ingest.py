"""Ingest benchmark: tracediag vs HolisticTraceAnalysis (HTA) on the same large Kineto traces.

Not a test. Each measured load runs in a fresh subprocess; the parent samples the resident set size of
that subprocess and all of its descendants (both tools fork one parser process per rank file) and keeps
the peak of the sum. Wall time is taken twice: ``time.perf_counter()`` around the load inside the child
("load"), and around the whole subprocess including interpreter start-up and imports ("process").

Rows:

* ``tracediag ingest``  -- ``discover_inputs`` -> ``parse_all`` -> ``load`` into a new DuckDB file.
* ``tracediag analyze`` -- ``tracediag.analysis.analyze``: ingest plus derived tables and every rule.
* ``HTA TraceAnalysis`` -- ``hta.trace_analysis.TraceAnalysis(trace_dir=...)``. Read from the installed
  HolisticTraceAnalysis 0.5.0 source:

  - ``TraceAnalysis.__init__`` builds ``Trace(trace_files, trace_dir)`` and calls ``load_traces()``
    (hta/trace_analysis.py), i.e. the constructor parses every rank and aligns/filters them.
  - Rank discovery (hta/common/trace_file.py ``create_rank_to_trace_dict_from_dir``): every file in the
    directory ending in ``.json`` or ``.gz``; the rank is the first ``"rank":\\s+(\\d+)`` match read line by
    line, else rank 0. So the directory must hold only the rank traces (no config.json/scenario.json).
  - Parallelism (hta/common/trace.py ``parse_multiple_ranks``): ``mp.get_context("fork").Pool`` with
    ``min(len(ranks), cpu_count())`` processes for <= 8 ranks; results (pandas DataFrames) are pickled
    back to the parent, which re-maps symbol ids with ``Series.apply``.
  - JSON parser (hta/common/trace_parser.py ``get_default_trace_parsing_backend``): ``ParserBackend.JSON``
    (the ijson auto-detection is commented out), i.e. stdlib ``json.loads(fh.read())`` on the whole file
    (``gzip.open`` for ``.gz``), then ``pd.DataFrame(trace["traceEvents"])`` and symbol compression.

Usage (from the repository root; see benchmarks/README.md for making the venvs and traces)::

    .venv/bin/python benchmarks/bench_ingest.py --data bench-work --hta-python .venv-hta/bin/python

Only ``psutil`` is needed in the interpreter running this script; the children run in the tracediag and
HTA interpreters given on the command line.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MARK = "BENCH_RESULT "

# --------------------------------------------------------------------------------------------------------
# Child side: runs inside the tool's own interpreter, prints one MARK line with its timings.
# --------------------------------------------------------------------------------------------------------

CHILD_TD_INGEST = """
import json, resource, sys, time
t0 = time.perf_counter()
from tracediag.ingest import discover_inputs, load, parse_all
from tracediag.store import open_store
t1 = time.perf_counter()
con = open_store(sys.argv[2])
parsed = parse_all(discover_inputs([sys.argv[1]]))
tp = time.perf_counter()
load(con, parsed)
con.close()
t2 = time.perf_counter()
import duckdb
c = duckdb.connect(sys.argv[2], read_only=True)
tables = [r[0] for r in c.execute("SELECT table_name FROM duckdb_tables()").fetchall()]
rows = {t: c.execute(f'SELECT count(*) FROM "{t}"').fetchone()[0] for t in tables}
c.close()
import tracediag
print("MARK" + json.dumps({
    "snapshot": not tracediag.__file__.startswith(sys.argv[4]),
    "import_s": t1 - t0, "load_s": t2 - t1, "parse_all_s": tp - t1, "store_load_s": t2 - tp, "rows": rows,
    "maxrss_self_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    "maxrss_children_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
}), flush=True)
"""

CHILD_TD_ANALYZE = """
import json, resource, sys, time
t0 = time.perf_counter()
from tracediag.analysis import analyze
t1 = time.perf_counter()
report = analyze([sys.argv[1]], model=sys.argv[3] or None)
t2 = time.perf_counter()
import tracediag
print("MARK" + json.dumps({
    "snapshot": not tracediag.__file__.startswith(sys.argv[4]),
    "import_s": t1 - t0, "load_s": t2 - t1,
    "rows": {"inputs": len(getattr(report, "inputs", []) or [])},
    "checks": {getattr(c, "rule", str(i)): getattr(c, "status", None)
               for i, c in enumerate(getattr(report, "checks", []) or [])},
    "maxrss_self_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    "maxrss_children_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
}), flush=True)
"""

CHILD_TD_CLI = """
import json, resource, sys, time
t0 = time.perf_counter()
from tracediag.cli import app
t1 = time.perf_counter()
args = ["analyze", sys.argv[1], "-o", sys.argv[2] + ".out", "-q"] + (["-m", sys.argv[3]] if sys.argv[3] else [])
try:
    app(args, standalone_mode=False)
    rc = 0
except SystemExit as exc:
    rc = exc.code or 0
t2 = time.perf_counter()
import tracediag
if rc:
    sys.exit(rc)
print("MARK" + json.dumps({
    "snapshot": not tracediag.__file__.startswith(sys.argv[4]),
    "import_s": t1 - t0, "load_s": t2 - t1,
    "maxrss_self_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    "maxrss_children_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
}), flush=True)
"""

# The GC-free parse floor: what parsing the same JSON costs at the least in Python (issue 15), parallel as
# tracediag is (issue 27): each file read, gunzipped (for .gz) and `orjson.loads`ed in its own forked process with
# the cyclic GC disabled, at most one process per core at a time; the parent only forks and reaps them (their CPU
# time is in its rusage once reaped). One file: one process, the parse in the child as before.
CHILD_FLOOR = """
import gc, gzip, json, os, resource, sys, time
t0 = time.perf_counter()
import orjson
t1 = time.perf_counter()
gc.disable()

def parse(path):
    with open(path, "rb") as fh:
        raw = fh.read()
    if raw[:2] == b"\\x1f\\x8b":
        raw = gzip.decompress(raw)
    doc = orjson.loads(raw)
    return len(doc["traceEvents"] if isinstance(doc, dict) else doc)

files = [os.path.join(sys.argv[1], f) for f in sorted(os.listdir(sys.argv[1]))]
n = 0
if len(files) == 1:
    n = parse(files[0])
else:
    cores = os.cpu_count() or 1  # as tracediag sizes its parser pool
    r, w = os.pipe()
    alive = 0
    for f in files:
        if alive >= cores:
            os.wait()
            alive -= 1
        if os.fork() == 0:
            os.close(r)
            os.write(w, (str(parse(f)) + "\\n").encode())
            os._exit(0)
        alive += 1
    while alive:
        os.wait()
        alive -= 1
    os.close(w)
    with os.fdopen(r) as counts:
        n = sum(int(x) for x in counts.read().split())
t2 = time.perf_counter()
print("MARK" + json.dumps({
    "import_s": t1 - t0, "load_s": t2 - t1, "rows": {"events": n},
    "maxrss_self_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    "maxrss_children_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
}), flush=True)
"""

CHILD_HTA = """
import json, resource, sys, time
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
t1 = time.perf_counter()
analyzer = TraceAnalysis(trace_dir=sys.argv[1])
t2 = time.perf_counter()
print("MARK" + json.dumps({
    "import_s": t1 - t0, "load_s": t2 - t1,
    "rows": {f"rank{r}": len(df) for r, df in sorted(analyzer.t.traces.items())},
    "maxrss_self_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    "maxrss_children_kb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,
}), flush=True)
"""

# --------------------------------------------------------------------------------------------------------
# Parent side.
# --------------------------------------------------------------------------------------------------------


def snapshot_package(dest: Path, python: str, tries: int = 5, wait_s: float = 60.0) -> str:
    """Copy the tracediag package into `dest` so every run of one benchmark measures the same code even
    while the working tree changes; retry while it does not import (mid-edit). Returns a content hash."""
    for attempt in range(tries):
        target = dest / "tracediag"
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(REPO / "tracediag", target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        # bytecode compiled once, as `pip install` does: with PYTHONDONTWRITEBYTECODE set (common in containers)
        # every run would otherwise compile the package from source (~0.3 s) and time that too
        subprocess.run([python, "-m", "compileall", "-q", str(target)], check=False, capture_output=True)
        check = subprocess.run(
            [python, "-c", "import tracediag.analysis, tracediag.ingest, tracediag.store"],
            capture_output=True,
            text=True,
            cwd=dest,
            env=dict(os.environ, PYTHONPATH=str(dest)),
        )
        if check.returncode == 0:
            h = hashlib.sha256()
            for f in sorted(target.rglob("*")):
                if f.is_file() and "__pycache__" not in f.parts:
                    h.update(str(f.relative_to(dest)).encode())
                    h.update(f.read_bytes())
            return h.hexdigest()[:16]
        print(
            f"tracediag does not import (attempt {attempt + 1}/{tries}), retrying in {wait_s:.0f} s:\n"
            f"{check.stderr[-800:]}",
            file=sys.stderr,
            flush=True,
        )
        time.sleep(wait_s)
    raise SystemExit("tracediag package does not import; giving up")


def trace_files(d: Path) -> list[Path]:
    return sorted(f for f in d.iterdir() if f.is_file() and f.name.endswith((".json", ".json.gz")))


def json_bytes(f: Path) -> int:
    """Uncompressed size: the file size, or for gzip the ISIZE trailer (size mod 2**32)."""
    with open(f, "rb") as fh:
        if fh.read(2) != b"\x1f\x8b":
            return f.stat().st_size
        fh.seek(-4, os.SEEK_END)
        return int.from_bytes(fh.read(4), "little")


def set_page_cache(files: list[Path], mode: str) -> None:
    """Put both tools in the same page-cache state before every run: all trace files evicted (cold) or
    all read once (warm). Eviction uses POSIX_FADV_DONTNEED, which needs no privileges."""
    for f in files:
        if mode == "cold":
            fd = os.open(f, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
        else:
            with open(f, "rb") as fh:
                while fh.read(1 << 24):
                    pass


class TreeRSS(threading.Thread):
    """Sample the RSS sum of a process and all of its descendants every `interval` seconds."""

    def __init__(self, pid: int, interval: float) -> None:
        super().__init__(daemon=True)
        import psutil

        self._psutil = psutil
        self.root = psutil.Process(pid)
        self.interval = interval
        self.peak = 0
        self.peak_procs = 0
        self.max_procs = 0
        self.samples = 0
        self._halt = threading.Event()

    def sample(self) -> None:
        ps = self._psutil
        try:
            procs = [self.root, *self.root.children(recursive=True)]
        except ps.Error:
            return
        total = 0
        n = 0
        for p in procs:
            try:
                total += p.memory_info().rss
                n += 1
            except ps.Error:
                pass
        self.samples += 1
        self.max_procs = max(self.max_procs, n)
        if total > self.peak:
            self.peak, self.peak_procs = total, n

    def run(self) -> None:
        while not self._halt.is_set():
            self.sample()
            self._halt.wait(self.interval)

    def stop(self) -> None:
        self._halt.set()
        self.join()


def _busy_cpu_s() -> float:
    """Busy CPU seconds of the whole machine so far (all cores), from psutil.cpu_times()."""
    import psutil

    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0) + getattr(t, "softirq", 0) + getattr(t, "steal", 0)


def _self_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def wait_quiet(max_busy: float, max_wait_s: float) -> float:
    """Wait until the machine is idle (busy cores < `max_busy`, 1 s samples) so that other work on a
    shared box does not land inside a measurement; gives up after `max_wait_s`. Returns the busy cores
    of the last sample."""
    import psutil

    deadline = time.monotonic() + max_wait_s
    quiet = 0
    last_note = 0.0
    while True:
        busy = psutil.cpu_percent(interval=1.0) / 100 * (os.cpu_count() or 1)
        quiet = quiet + 1 if busy < max_busy else 0
        if quiet >= 2 or time.monotonic() > deadline:
            return busy
        if time.monotonic() - last_note > 15:
            last_note = time.monotonic()
            print(f"  waiting for an idle machine ({busy:.1f} cores busy)", file=sys.stderr, flush=True)


def run_once(python: str, code: str, argv: list[str], env: dict[str, str], interval: float, cwd: Path) -> dict:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(
            [python, "-c", code.replace("MARK", MARK), *argv], stdout=out, stderr=err, env=env, cwd=cwd
        )
        sampler = TreeRSS(proc.pid, interval)
        sampler.start()
        busy0, self0 = _busy_cpu_s(), _self_cpu_s()
        # wait4: the child's rusage includes the descendants it waited for (the per-rank workers).
        _, status, ru = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        busy1, self1 = _busy_cpu_s(), _self_cpu_s()
        rc = proc.returncode = os.waitstatus_to_exitcode(status)
        sampler.stop()
        out.seek(0)
        err.seek(0)
        stdout = out.read().decode(errors="replace")
        stderr = err.read().decode(errors="replace")
    cpu = ru.ru_utime + ru.ru_stime
    res: dict = {
        "rc": rc,
        "process_s": wall,
        "cpu_s": cpu,
        "sampler_cpu_s": self1 - self0,
        "other_cpu_s": max(0.0, busy1 - busy0 - cpu - (self1 - self0)),
        "peak_tree_rss_mb": sampler.peak / 2**20,
        "procs_at_peak": sampler.peak_procs,
        "max_procs": sampler.max_procs,
        "rss_samples": sampler.samples,
    }
    lines = [ln for ln in stdout.splitlines() if ln.startswith(MARK)]
    if rc != 0 or not lines:
        res["error"] = (stderr or stdout)[-3000:]
    else:
        res.update(json.loads(lines[-1][len(MARK) :]))
    # Warnings/errors the tool logged (HTA logs through `logging`; keep distinct lines only).
    noisy = ("▕", "Parsed ", "Overall parsing", "leaving ", "Rounding down")
    res["stderr_lines"] = sorted(
        {ln.strip() for ln in stderr.splitlines() if ln.strip() and not any(s in ln for s in noisy)}
    )[:20]
    return res


def pkg_version(python: str, module: str) -> str | None:
    code = f"import importlib.metadata as m; print(m.version({module!r}))"
    try:
        return subprocess.run(
            [python, "-c", code], capture_output=True, text=True, check=True, timeout=60
        ).stdout.strip()
    except (subprocess.SubprocessError, OSError):
        return None


def machine() -> dict:
    cpu = ""
    try:
        for ln in Path("/proc/cpuinfo").read_text().splitlines():
            if ln.startswith("model name"):
                cpu = ln.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "host": socket.gethostname(),
        "cores": os.cpu_count(),
        "cpu": cpu,
        "mem_gib": round(mem_gib, 1),
        "os": platform.platform(),
    }


def _rel(path: str) -> str:
    """Path relative to the repository when inside it (results files carry no machine-local paths)."""
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return path


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO, check=True
        ).stdout.strip()
    except (subprocess.SubprocessError, OSError):
        return None


def fmt_table(rows: list[dict]) -> str:
    head = (
        "| tool | form | files | MB on disk (JSON) | load wall s | process wall s | CPU s "
        "| peak tree RSS MB | HTA/tool load wall | HTA/tool process wall | HTA/tool CPU | tool/HTA peak RSS "
        "| tool/floor process wall | tool/floor CPU |"
    )
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:

        def f(x, spec=".2f", unit=""):
            return "—" if x is None else format(x, spec) + unit

        out.append(
            f"| {r['tool']} | {r['form']} | {r['files']} | {r['total_mb']:.0f} ({r['json_mb']:.0f}) "
            f"| {f(r['load_s'])} | {f(r['process_s'])} | {f(r['cpu_s'], '.1f')} "
            f"| {f(r['peak_rss_mb'], '.0f')} "
            f"| {f(r.get('hta_over_tool_load'), unit='×')} | {f(r.get('hta_over_tool_process'), unit='×')} "
            f"| {f(r.get('hta_over_tool_cpu'), unit='×')} | {f(r.get('tool_over_hta_rss'))} "
            f"| {f(r.get('tool_over_floor_process'), unit='×')} | {f(r.get('tool_over_floor_cpu'), unit='×')} |"
        )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--data",
        default=str(REPO / "bench-work"),
        help="folder holding json/ and/or gz/ subfolders with only the rank trace files",
    )
    ap.add_argument("--forms", default="json,gz", help="comma list of subfolders of --data to measure")
    ap.add_argument(
        "--model", default=None, help="model config for the analyze row (default: <data>/config.json if present)"
    )
    ap.add_argument("--td-python", default=str(REPO / ".venv/bin/python"))
    ap.add_argument("--hta-python", default=str(REPO / ".venv-hta/bin/python"))
    ap.add_argument(
        "--tools",
        default="td-ingest,td-analyze,hta",
        help="comma list, run interleaved in this order: td-ingest, td-analyze (library, in-memory store), "
        "td-cli (the full `tracediag analyze` command: report, findings, trace.duckdb), floor, hta",
    )
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--cache",
        choices=("cold", "warm"),
        default="cold",
        help="page-cache state of the trace files before every run (default: cold)",
    )
    ap.add_argument("--interval", type=float, default=0.015, help="RSS sampling period, s")
    ap.add_argument(
        "--quiet-cores",
        type=float,
        default=0.3,
        help="before each run wait until fewer than this many cores are busy (0: don't wait)",
    )
    ap.add_argument("--quiet-wait", type=float, default=300, help="longest wait for an idle machine, s")
    ap.add_argument(
        "--max-other-cores",
        type=float,
        default=0.2,
        help="discard and redo a run during which other processes kept more than this many "
        "cores busy on average (0: keep every run)",
    )
    ap.add_argument("--redo", type=int, default=3, help="most redos per run")
    ap.add_argument(
        "--results", default=str(REPO / "benchmarks/results"), help="folder for <date>-<host>-<cores>c.json; '' to skip"
    )
    ap.add_argument("--name", default="", help="suffix of the results file name (e.g. pair, real-rank)")
    args = ap.parse_args(argv)

    data = Path(args.data).resolve()
    model = str(Path(args.model).resolve()) if args.model else ""
    if not model and (data / "config.json").exists():
        model = str(data / "config.json")
    tools = {
        "td-ingest": ("tracediag ingest", args.td_python, CHILD_TD_INGEST),
        "td-analyze": ("tracediag analyze", args.td_python, CHILD_TD_ANALYZE),
        "hta": ("HTA TraceAnalysis", args.hta_python, CHILD_HTA),
        "td-cli": ("tracediag analyze (CLI)", args.td_python, CHILD_TD_CLI),
        "floor": ("parse floor (gunzip + orjson, no GC)", args.td_python, CHILD_FLOOR),
    }
    chosen = [t.strip() for t in args.tools.split(",") if t.strip()]
    snap_dir = Path(tempfile.mkdtemp(prefix="bench-ingest-src-"))
    src_hash = snapshot_package(snap_dir, args.td_python) if any(t.startswith("td") for t in chosen) else None
    env = dict(os.environ, PYTHONPATH=str(snap_dir), PYTHONHASHSEED="0")
    env.pop("VIRTUAL_ENV", None)

    rows: list[dict] = []
    runs: list[dict] = []
    discarded: list[dict] = []
    forms = [f.strip() for f in args.forms.split(",") if f.strip()]
    for form in forms:
        d = data / form
        if not d.is_dir():
            print(f"skip form {form}: {d} does not exist", file=sys.stderr)
            continue
        files = trace_files(d)
        extra = sorted(f.name for f in d.iterdir() if f not in files)
        if extra:
            print(f"warning: {d} holds non-trace files {extra}; HTA will try to parse them", file=sys.stderr)
        total_mb = sum(f.stat().st_size for f in files) / 1e6
        json_mb = sum(json_bytes(f) for f in files) / 1e6
        per: dict[str, list[dict]] = {t: [] for t in chosen}
        # Interleave tools within each repeat so drift (thermal, noisy neighbours) hits all alike.
        for rep in range(args.repeats):
            for t in chosen:
                label, python, code = tools[t]
                for attempt in range(args.redo + 1):
                    with tempfile.TemporaryDirectory(prefix="bench-ingest-") as tmp:
                        busy = wait_quiet(args.quiet_cores, args.quiet_wait) if args.quiet_cores > 0 else None
                        set_page_cache(files, args.cache)
                        # cwd is the snapshot: `python -c` puts the cwd first on sys.path, ahead of PYTHONPATH.
                        r = run_once(
                            python,
                            code,
                            [str(d), str(Path(tmp) / "store.duckdb"), model, str(REPO)],
                            env,
                            args.interval,
                            snap_dir,
                        )
                    r.update(tool=label, form=form, repeat=rep, attempt=attempt, busy_cores_before=busy)
                    noisy = args.max_other_cores > 0 and r["other_cpu_s"] / r["process_s"] > args.max_other_cores
                    if noisy and attempt < args.redo and "error" not in r:
                        r["discarded"] = "other processes busy during the run"
                        discarded.append(r)
                        print(
                            f"[{form}] {label:18s} run {rep + 1}: redo, other processes used "
                            f"{r['other_cpu_s']:.1f} CPU s in {r['process_s']:.1f} s",
                            file=sys.stderr,
                            flush=True,
                        )
                        continue
                    break
                runs.append(r)
                per[t].append(r)
                status = "ERROR" if "error" in r else "ok"
                print(
                    f"[{form}] {label:18s} run {rep + 1}/{args.repeats}: {status} "
                    f"load {r.get('load_s', float('nan')):.2f} s, process {r['process_s']:.2f} s, "
                    f"CPU {r['cpu_s']:.1f} s, peak tree RSS {r['peak_tree_rss_mb']:.0f} MB, "
                    f"other processes used {r['other_cpu_s']:.1f} CPU s meanwhile",
                    file=sys.stderr,
                    flush=True,
                )
                if "error" in r:
                    print(r["error"], file=sys.stderr)
        form_rows = {}
        for t in chosen:
            ok = [r for r in per[t] if "error" not in r]
            label = tools[t][0]
            row = {
                "tool": label,
                "form": form,
                "files": len(files),
                "total_mb": total_mb,
                "json_mb": json_mb,
                "runs_ok": len(ok),
                "runs": len(per[t]),
                "load_s": statistics.median(r["load_s"] for r in ok) if ok else None,
                "process_s": statistics.median(r["process_s"] for r in ok) if ok else None,
                "cpu_s": statistics.median(r["cpu_s"] for r in ok) if ok else None,
                "other_cpu_s_max": max(r["other_cpu_s"] for r in ok) if ok else None,
                "peak_rss_mb": statistics.median(r["peak_tree_rss_mb"] for r in ok) if ok else None,
                "peak_rss_mb_max": max(r["peak_tree_rss_mb"] for r in ok) if ok else None,
                "errors": [r["error"] for r in per[t] if "error" in r][:1],
            }
            for key in ("import_s", "parse_all_s", "store_load_s"):
                if ok and all(key in r for r in ok):
                    row[key] = statistics.median(r[key] for r in ok)
            form_rows[t] = row
        hta = form_rows.get("hta")
        floor = form_rows.get("floor")
        for row in form_rows.values():
            if floor and row is not floor and floor["process_s"] and row["process_s"]:
                row["tool_over_floor_process"] = row["process_s"] / floor["process_s"]
                row["tool_over_floor_cpu"] = row["cpu_s"] / floor["cpu_s"]
            if hta and row is not hta and row is not floor and hta["load_s"] and row["load_s"]:
                row["hta_over_tool_load"] = hta["load_s"] / row["load_s"]
                row["hta_over_tool_process"] = hta["process_s"] / row["process_s"]
                row["tool_over_hta_rss"] = row["peak_rss_mb"] / hta["peak_rss_mb"]
                row["hta_over_tool_cpu"] = hta["cpu_s"] / row["cpu_s"]
            rows.append(row)

    table = fmt_table(rows)
    print(table)
    verdicts = []
    for r in rows:
        if r["tool"] == "tracediag ingest" and r.get("hta_over_tool_load") is not None:
            speed_ok = r["hta_over_tool_load"] >= 5
            mem_ok = r["tool_over_hta_rss"] <= 1
            verdicts.append(
                f"{r['form']}: {r['hta_over_tool_load']:.1f}× faster than HTA "
                f"({'meets' if speed_ok else 'MISSES'} 5×), "
                f"{r['tool_over_hta_rss']:.2f}× HTA's peak RSS "
                f"({'meets' if mem_ok else 'MISSES'} <= 1×)"
            )
    for r in rows:
        if r["tool"].startswith("tracediag analyze (CLI)") and r.get("tool_over_floor_process") is not None:
            verdicts.append(
                f"{r['form']}: full analyze {r['tool_over_floor_process']:.2f}× the parse floor's wall "
                f"({r['tool_over_floor_cpu']:.2f}× its CPU)"
                + (
                    f", {r['hta_over_tool_process']:.1f}× faster than HTA's load (process wall), "
                    f"{r['tool_over_hta_rss']:.2f}× HTA's peak tree RSS"
                    if r.get("hta_over_tool_process")
                    else ""
                )
            )
    for v in verdicts:
        print("goal", v)

    if args.results:
        m = machine()
        stamp = dt.datetime.now().strftime("%Y-%m-%d")
        suffix = f"-{args.name}" if args.name else ""
        out = Path(args.results) / f"{stamp}-{m['host']}-{m['cores']}c{suffix}.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        doc = {
            "date": dt.datetime.now().isoformat(timespec="seconds"),
            "machine": m,
            "tracediag_commit": git_commit(),
            "tracediag_source_sha256_16": src_hash,
            "versions": {
                "python_tracediag": subprocess.run(
                    [args.td_python, "-V"], capture_output=True, text=True
                ).stdout.strip(),
                "msgspec": pkg_version(args.td_python, "msgspec"),
                "duckdb": pkg_version(args.td_python, "duckdb"),
                "pyarrow": pkg_version(args.td_python, "pyarrow"),
                "HolisticTraceAnalysis": pkg_version(args.hta_python, "HolisticTraceAnalysis"),
                "pandas_hta": pkg_version(args.hta_python, "pandas"),
            },
            "command": " ".join([Path(sys.executable).name, *sys.argv]).replace(str(REPO) + "/", ""),
            "load_average_at_end": list(os.getloadavg()),
            "settings": {
                "repeats": args.repeats,
                "cache": args.cache,
                "rss_interval_s": args.interval,
                "quiet_cores": args.quiet_cores,
                "max_other_cores": args.max_other_cores,
                "model": _rel(model) if model else None,
                "data": _rel(str(data)),
                "forms": forms,
            },
            "rows": rows,
            "goals": verdicts,
            "runs": runs,
            "discarded_runs": discarded,
        }
        out.write_text(json.dumps(doc, indent=2, default=str) + "\n")
        print(f"wrote {out}", file=sys.stderr)
    shutil.rmtree(snap_dir, ignore_errors=True)
    return 0 if all("error" not in r for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
