"""The long fuzz run: N mutated inputs of every kind, each in a forked process with a time limit.

Counts per kind and target: ok, input errors (one line naming the file), and the defects — internal errors,
hangs (past --timeout), errors that break the one-line contract, partial outputs (CLI). Each defect is listed
with its signature and the first (kind, index) that produced it, which `--replay` writes back out.

    python benchmarks/fuzz_long.py --per-kind 10000 --target ingest                # every ingester alone
    python benchmarks/fuzz_long.py --per-kind 1000 --target analyze                # + derive, rules, JSON
    python benchmarks/fuzz_long.py --per-kind 200 --target cli                     # the CLI's exit contract
    python benchmarks/fuzz_long.py --per-kind 20 --target endless                  # FIFOs, devices, sparse files,
                                                                                   # gzip bombs of every kind
    python benchmarks/fuzz_long.py --per-kind 300 --target commands                # command lines, read-back
                                                                                   # outputs, file-system faults,
                                                                                   # store tampering, MCP tool
                                                                                   # calls, scrapes
    python benchmarks/fuzz_long.py --kind kineto --replay 1234 --keep /tmp/case    # write one variant back out

Results: benchmarks/results/fuzz_long_<target>.json (merged per kind across runs; the command, salt and commit of
the last run). Inputs are derived from the real seed files (tests/fuzz/seeds.py) with
`random.Random(f"{salt}:{kind}:{index}")`, so a run is reproducible and a defect is replayable from its index.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import random
import select
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import ClassVar

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fuzz import commands, harness, mutate, seeds  # noqa: E402

# --target commands: its kinds are tests/fuzz/commands.py's; the run folder and store they damage are built once
COMMANDS_CACHE = Path(tempfile.gettempdir()) / "tracediag-fuzz-commands"

TARGET_OF = {  # what "ingest" / "analyze" mean for each kind
    "ingest": {k: "ingest" for k in harness.FORMAT} | {"model": "config", "check-toml": "config"},
    "store": {k: "store" for k in harness.FORMAT} | {"model": "config", "check-toml": "config"},
    "analyze": {k: "analyze" for k in harness.FORMAT} | {"model": "analyze", "check-toml": "config"},
}


def variant(kind: str, index: int, salt: str, work: Path) -> Path:
    rnd = random.Random(f"{salt}:{kind}:{index}")
    seed = rnd.choice(seeds.seed_files(kind))
    return mutate.mutate(kind, seed, work, rnd)


def _one(kind: str, index: int, salt: str, target: str, timeout: float) -> dict:
    """Mutate and run one input in this (worker) process; a soft time limit catches Python-level hangs."""
    work = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        if target == "commands":
            case = commands.make_case(kind, random.Random(f"{salt}:{kind}:{index}"), work, COMMANDS_CACHE)
            out = commands.check_case(case, timeout)
            return {"status": out.status, "detail": out.detail, "where": out.where}
        if target == "endless":  # a FIFO, a device, a sparse file or a gzip bomb made from a real seed, via the CLI
            rnd = random.Random(f"{salt}:{kind}:{index}")
            seed = rnd.choice(seeds.seed_files(kind))
            path = mutate.endless_or_oversized(seed, work / seed.name, rnd)
            out = harness.check_cli(kind, path, work, timeout)
            return {"status": out.status, "detail": out.detail, "where": out.where}
        path = variant(kind, index, salt, work)
        if target == "cli":
            out = harness.check_cli(kind, path, work, timeout)
        else:
            out = harness.run_target(TARGET_OF[target][kind], kind, path, timeout)
        return {"status": out.status, "detail": out.detail, "where": out.where}
    finally:
        shutil.rmtree(work, ignore_errors=True)


RECYCLE = 200  # inputs per worker process before a fresh one (the classification caches hold 1 MiB names)


class _Worker:
    """A forked process that runs inputs one after the other (no fork per input: the parent holds every parsed
    seed, and forking it costs more than most inputs)."""

    open_fds: ClassVar[set[int]] = set()  # the parent's ends of every worker's pipes (a new worker closes its copies)

    def __init__(self, kind: str, salt: str, target: str, timeout: float) -> None:
        self.tasks_r, self.tasks_w = os.pipe()
        self.res_r, self.res_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # child
            code = 0
            try:
                for fd in (self.tasks_w, self.res_r, *_Worker.open_fds):
                    with contextlib.suppress(OSError):
                        os.close(fd)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                with os.fdopen(self.tasks_r, "r") as tasks, os.fdopen(self.res_w, "w") as results:
                    for line in tasks:
                        i = int(line)
                        try:
                            res = _one(kind, i, salt, target, timeout)
                        except BaseException as exc:  # the harness itself failed: say so, go on
                            res = {"status": "internal", "detail": f"harness: {exc!r}"[:300], "where": "harness"}
                        results.write(json.dumps(res) + "\n")
                        results.flush()
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            os._exit(code)
        os.close(self.tasks_r)
        os.close(self.res_w)
        _Worker.open_fds |= {self.tasks_w, self.res_r}
        self.results = os.fdopen(self.res_r, "r")
        self.done = 0
        self.current: tuple[int, float] | None = None

    def give(self, index: int) -> None:
        os.write(self.tasks_w, f"{index}\n".encode())
        self.current = (index, time.monotonic())

    def stop(self, kill: bool = False) -> None:
        _Worker.open_fds -= {self.tasks_w, self.res_r}
        with contextlib.suppress(OSError):
            os.close(self.tasks_w)
        if kill:
            with contextlib.suppress(OSError):
                os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        self.results.close()


def _run_kind(kind: str, per_kind: int, target: str, salt: str, jobs: int, timeout: float):
    """(outcome counts, defects by signature) of `per_kind` inputs of one kind, on `jobs` worker processes."""
    counts: Counter[str] = Counter()
    defects: dict[str, dict] = {}
    todo = iter(range(per_kind))
    workers: list[_Worker] = []
    pending = per_kind
    hard_limit = timeout * (3 if target in ("cli", "commands", "endless") else 1.5) + 10

    def record(i: int, res: dict) -> None:
        o = harness.Outcome(res["status"], res["detail"], res["where"])
        counts[o.status] += 1
        if o.defect:
            d = defects.setdefault(o.signature, {"count": 0, "first_index": i, "example": o.detail})
            d["count"] += 1

    def feed(w: _Worker) -> bool:
        i = next(todo, None)
        if i is None:
            return False
        w.give(i)
        return True

    for _ in range(min(jobs, per_kind)):
        w = _Worker(kind, salt, target, timeout)
        workers.append(w)
        feed(w)
    while pending:
        busy = [w for w in workers if w.current is not None]
        ready, _, _ = select.select([w.results for w in busy], [], [], 0.5)
        now = time.monotonic()
        for w in list(busy):
            i, start = w.current
            if w.results in ready:
                line = w.results.readline()
                res = json.loads(line) if line else {"status": "internal", "detail": "worker died",
                                                     "where": "harness"}  # fmt: skip
            elif now - start > hard_limit:  # stuck in C code, or the soft limit did not fire
                res = {"status": "hang", "detail": f"killed after {hard_limit:.0f} s", "where": ""}
                line = ""
            else:
                continue
            record(i, res)
            pending -= 1
            w.current = None
            w.done += 1
            if line and w.done < RECYCLE:
                feed(w)
                continue
            w.stop(kill=not line)
            workers.remove(w)
            if pending > sum(1 for x in workers if x.current is not None):
                nw = _Worker(kind, salt, target, timeout)
                workers.append(nw)
                feed(nw)
    for w in workers:
        w.stop()
    return counts, defects


def run(kinds: list[str], per_kind: int, target: str, salt: str, jobs: int, timeout: float) -> dict:
    # import everything once in the parent: forked workers start warm
    import tracediag.analysis
    import tracediag.cli
    import tracediag.gate.config
    import tracediag.ingest.kineto
    import tracediag.ingest.nsys  # noqa: F401

    results: dict[str, dict] = {}
    if target == "commands":
        commands._built(str(COMMANDS_CACHE))
    for kind in kinds:
        for s in seeds.seed_files(kind) if target != "commands" else ():
            if kind in ("kineto", "topology", "model") or (kind == "vllm-bench" and s.suffix == ".json"):
                mutate.seed_doc(s)  # parsed once, shared by the forked workers
            if kind == "nsys":
                mutate.trimmed_export(s)
        gc.collect()
        gc.freeze()  # the workers' collector never walks (and so never copies) the parent's heap
        t0 = time.monotonic()
        counts, defects = _run_kind(kind, per_kind, target, salt, jobs, timeout)
        gc.unfreeze()
        results[kind] = {
            "inputs": per_kind,
            "target": TARGET_OF.get(target, {}).get(kind, target),
            "seconds": round(time.monotonic() - t0, 1),
            "counts": dict(sorted(counts.items())),
            "defects": defects,
        }
        c = results[kind]
        print(
            f"{kind:12s} {per_kind:6d} inputs {c['seconds']:8.1f} s  {c['counts']}"
            + (f"  DEFECTS: {len(defects)}" if defects else ""),
            flush=True,
        )
        for sig, d in sorted(defects.items(), key=lambda kv: -kv[1]["count"]):
            print(f"    {d['count']:5d} x {sig}  [first #{d['first_index']}] {d['example'][:160]}", flush=True)
    return results


def _commit() -> str | None:
    """The checkout's commit (None outside a git checkout, e.g. a copy made with `git archive`)."""
    import subprocess

    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    except OSError:
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--kind",
        action="append",
        choices=seeds.KINDS + commands.KINDS,
        help="input kind (repeatable; default: all of the target's)",
    )
    ap.add_argument("--per-kind", type=int, default=1000)
    ap.add_argument("--target", choices=["ingest", "store", "analyze", "cli", "commands", "endless"], default="ingest")
    ap.add_argument("--salt", default="tracediag-fuzz-1")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per input before it counts as a hang")
    ap.add_argument("--replay", type=int, help="write variant INDEX of --kind to --keep and exit")
    ap.add_argument("--keep", type=Path, help="folder for --replay")
    ap.add_argument("--results", type=Path, default=None, help="JSON results file (default benchmarks/results/…)")
    a = ap.parse_args()
    kinds = a.kind or list(commands.KINDS if a.target == "commands" else seeds.KINDS)
    if a.replay is not None:
        if len(kinds) != 1 or a.keep is None:
            ap.error("--replay needs one --kind and --keep")
        a.keep.mkdir(parents=True, exist_ok=True)
        print(variant(kinds[0], a.replay, a.salt, a.keep))
        return
    t0 = time.time()
    res = run(kinds, a.per_kind, a.target, a.salt, a.jobs, a.timeout)
    path = a.results or REPO / "benchmarks" / "results" / f"fuzz_long_{a.target}.json"
    doc = json.loads(path.read_text()) if path.exists() else {"kinds": {}}
    doc["kinds"].update(res)
    doc |= {
        "command": "python benchmarks/fuzz_long.py " + " ".join(sys.argv[1:]),
        "commit": _commit(),
        "salt": a.salt,
        "timeout_s": a.timeout,
        "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": round(time.time() - t0, 1),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    total = sum(sum(1 for _ in k["defects"]) for k in res.values())
    print(f"{sum(k['inputs'] for k in res.values())} inputs, {total} distinct defects -> {path}")


if __name__ == "__main__":
    main()
