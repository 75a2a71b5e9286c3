"""The long fuzz run: N mutated inputs of every kind, each in a forked process with a time limit.

Counts per kind and target: ok, input errors (one line naming the file), and the defects — internal errors,
hangs (past --timeout), errors that break the one-line contract, partial outputs (CLI). Each defect is listed
with its signature and the first (kind, index) that produced it, which `--replay` writes back out.

    python benchmarks/fuzz_long.py --per-kind 10000 --target ingest                # every ingester alone
    python benchmarks/fuzz_long.py --per-kind 1000 --target analyze                # + derive, rules, JSON
    python benchmarks/fuzz_long.py --per-kind 200 --target cli                     # the CLI's exit contract
    python benchmarks/fuzz_long.py --kind kineto --replay 1234 --keep /tmp/case    # write one variant back out

Results: benchmarks/results/fuzz_long_<target>.json (merged per kind across runs). Inputs are derived from
the real seed files (tests/fuzz/seeds.py) with `random.Random(f"{salt}:{kind}:{index}")`, so a run is
reproducible and a defect is replayable from its index.
"""

from __future__ import annotations

import argparse
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fuzz import harness, mutate, seeds  # noqa: E402

TARGET_OF = {  # what "ingest" / "analyze" mean for each kind
    "ingest": {k: "ingest" for k in harness.FORMAT} | {"model": "config", "check-toml": "config"},
    "store": {k: "store" for k in harness.FORMAT} | {"model": "config", "check-toml": "config"},
    "analyze": {k: "analyze" for k in harness.FORMAT} | {"model": "analyze", "check-toml": "config"},
}


def variant(kind: str, index: int, salt: str, work: Path) -> Path:
    rnd = random.Random(f"{salt}:{kind}:{index}")
    seed = rnd.choice(seeds.seed_files(kind))
    return mutate.mutate(kind, seed, work, rnd)


def _child(kind: str, index: int, salt: str, target: str, w: int, timeout: float) -> None:
    work = Path(tempfile.mkdtemp(prefix="fuzz-"))
    try:
        path = variant(kind, index, salt, work)
        if target == "cli":
            out = harness.check_cli(kind, path, work, timeout)
        else:
            out = harness.run_target(TARGET_OF[target][kind], kind, path, None)
        os.write(w, json.dumps({"status": out.status, "detail": out.detail, "where": out.where}).encode())
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(kinds: list[str], per_kind: int, target: str, salt: str, jobs: int, timeout: float) -> dict:
    # import everything once in the parent: forked children start warm
    import tracediag.analysis
    import tracediag.cli
    import tracediag.gate.config
    import tracediag.ingest.kineto
    import tracediag.ingest.nsys  # noqa: F401

    for k in kinds:
        for s in seeds.seed_files(k):
            if k in ("kineto", "topology", "model") or (k == "vllm-bench" and s.suffix == ".json"):
                mutate.seed_doc(s)  # parsed once, shared by the forked children
    gc.collect()
    gc.freeze()  # the children's collector never walks (and so never copies) the parent's heap
    results: dict[str, dict] = {}
    for kind in kinds:
        t0 = time.monotonic()
        counts: Counter[str] = Counter()
        defects: dict[str, dict] = {}
        running: dict[int, tuple[int, int, float]] = {}  # pid -> (index, read fd, start)
        todo = iter(range(per_kind))
        exhausted = False
        while running or not exhausted:
            while not exhausted and len(running) < jobs:
                i = next(todo, None)
                if i is None:
                    exhausted = True
                    break
                r, w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    os.close(r)
                    code = 0
                    try:
                        signal.signal(signal.SIGINT, signal.SIG_DFL)
                        _child(kind, i, salt, target, w, timeout)
                    except BaseException:
                        import traceback

                        traceback.print_exc()
                        code = 1
                    os._exit(code)
                os.close(w)
                running[pid] = (i, r, time.monotonic())
            fds = {v[1]: pid for pid, v in running.items()}
            select.select(list(fds), [], [], 0.2)
            now = time.monotonic()
            for pid, (i, r, start) in list(running.items()):
                done, st = os.waitpid(pid, os.WNOHANG)
                limit = timeout * (3 if target == "cli" else 1)
                if not done and now - start < limit:
                    continue
                if not done:
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    res = {"status": "hang", "detail": f"killed after {limit:.0f} s", "where": ""}
                else:
                    raw = b""
                    while chunk := os.read(r, 65536):
                        raw += chunk
                    try:
                        res = json.loads(raw)
                    except ValueError:
                        code = os.waitstatus_to_exitcode(st)
                        res = {"status": "internal", "detail": f"fuzz child died (exit {code})", "where": "harness"}
                os.close(r)
                del running[pid]
                o = harness.Outcome(res["status"], res["detail"], res["where"])
                counts[o.status] += 1
                if o.defect:
                    d = defects.setdefault(o.signature, {"count": 0, "first_index": i, "example": o.detail})
                    d["count"] += 1
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kind", action="append", choices=seeds.KINDS, help="input kind (repeatable; default: all)")
    ap.add_argument("--per-kind", type=int, default=1000)
    ap.add_argument("--target", choices=["ingest", "store", "analyze", "cli"], default="ingest")
    ap.add_argument("--salt", default="tracediag-fuzz-1")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds per input before it counts as a hang")
    ap.add_argument("--replay", type=int, help="write variant INDEX of --kind to --keep and exit")
    ap.add_argument("--keep", type=Path, help="folder for --replay")
    ap.add_argument("--results", type=Path, default=None, help="JSON results file (default benchmarks/results/…)")
    a = ap.parse_args()
    kinds = a.kind or list(seeds.KINDS)
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
