"""The Kineto decode, three ways: the parse floor (gunzip + orjson.loads), msgspec's typed decode as
tracediag/ingest/kineto/ does it, and pysimdjson (a simdjson binding) reading the same fields.

    .venv/bin/python benchmarks/bench_decode.py [--repeats 7] [--large bench-work/big/rank0.pt.trace.json]
    PYTHONPATH=/path/to/pysimdjson benchmarks/bench_decode.py ...   # pysimdjson is no dependency of tracediag

Inputs: the real V100 rank vendored in tests/data/external/kineto (HTA's, gzip) and a large rank: the file given
with --large (sample_traces/generate.py --large output, or benchmarks/gen_large_rank.py's), else the V100 rank's
events repeated --copies times (SYNTHETIC, written to a temporary plain-JSON file).

Every way reads the file's bytes (gunzip for .gz) and decodes them with the garbage collector off (kineto.py
pauses it too). msgspec: `msgspec.json.Decoder(_TraceTsText)` — the structs kineto.py decodes each chunk into
(unknown fields skipped inside the decoder, `ts` kept as its JSON text). simdjson: `Parser.parse` then, per
event, the same fields read from the lazy object (ph, cat, name, pid, tid, ts, dur, id and the `args` keys of
kineto._Args, picked from items(): the fastest access found), so both end with every field the parser uses as a
Python value. The ways alternate within each
round (the order rotates) and the median CPU time (time.process_time) and wall time over the rounds is printed.
"""

from __future__ import annotations

import argparse
import gc
import gzip
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import msgspec
import orjson

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from tracediag.ingest import kineto  # noqa: E402

V100 = REPO / "tests/data/external/kineto/hta_v100_ns_resolution.pt.trace.json.gz"
_OURS = ("ts_ns", "dur_ns")  # set by the parser, not read from the file
EVENT_KEYS = frozenset(f.encode_name for f in msgspec.structs.fields(kineto._Event) if f.name not in _OURS)
ARGS_KEYS = frozenset(f.encode_name for f in msgspec.structs.fields(kineto._Args))


def read(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if path.suffix == ".gz" else data


def floor(path: Path) -> int:
    doc = orjson.loads(read(path))
    return len(doc["traceEvents"])


_MSGSPEC = msgspec.json.Decoder(kineto._TraceTsText)


def typed(path: Path) -> int:
    top = _MSGSPEC.decode(read(path))
    return len(top.traceEvents or ())


def simd(path: Path) -> int:
    import simdjson

    doc = simdjson.Parser().parse(read(path))
    n = 0
    for e in doc["traceEvents"]:
        if not isinstance(e, simdjson.Object):
            continue
        # items() over the keys present: a get() of an absent key costs an exception inside the binding (~4 µs)
        _fields = {k: v for k, v in e.items() if k in EVENT_KEYS}
        a = _fields.pop("args", None)
        if isinstance(a, simdjson.Object):
            _args = {k: v for k, v in a.items() if k in ARGS_KEYS}
        n += 1
    return n


def simd_parse(path: Path) -> int:
    import simdjson

    return len(simdjson.Parser().parse(read(path))["traceEvents"])  # the parse alone: a bound, no field read


WAYS = {
    "floor (gunzip + orjson)": floor,
    "msgspec typed (kineto.py)": typed,
    "pysimdjson lazy fields": simd,
    "pysimdjson parse only (bound)": simd_parse,
}


def large_copy(copies: int, out: Path) -> Path:
    doc = orjson.loads(read(V100))
    events = doc["traceEvents"]
    doc["traceEvents"] = events * copies  # SYNTHETIC: the same events repeated; decode cost only
    out.write_bytes(orjson.dumps(doc))
    return out


def run(path: Path, repeats: int) -> dict:
    times: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
    events = {}
    names = list(WAYS)
    for r in range(repeats):
        for w in names[r % len(names) :] + names[: r % len(names)]:
            gc.collect()
            gc.disable()
            try:
                t0, c0 = time.perf_counter(), time.process_time()
                events[w] = WAYS[w](path)
                times[w].append((time.process_time() - c0, time.perf_counter() - t0))
            finally:
                gc.enable()
    return {
        w: {
            "events": events[w],
            "cpu_s": round(statistics.median(c for c, _ in v), 3),
            "wall_s": round(statistics.median(t for _, t in v), 3),
        }
        for w, v in times.items()
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--large", type=Path, help="a large plain-JSON rank file (default: the V100 rank repeated)")
    ap.add_argument("--copies", type=int, default=12)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    try:
        import simdjson  # noqa: F401
    except ImportError:
        for w in [w for w in WAYS if w.startswith("pysimdjson")]:
            del WAYS[w]
        print("pysimdjson not importable: its rows are left out", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        large = args.large or large_copy(args.copies, Path(tmp) / "large.pt.trace.json")
        inputs = {"V100 rank (real, gzip)": V100, f"large rank ({large.stat().st_size / 1e6:.0f} MB JSON)": large}
        results = {name: run(p, args.repeats) for name, p in inputs.items()}
    print("| input | way | events | CPU s (median) | wall s (median) | CPU / floor |")
    print("|---|---|---|---|---|---|")
    for name, res in results.items():
        base = next(iter(res.values()))["cpu_s"]
        for w, r in res.items():
            ratio = r["cpu_s"] / base
            print(f"| {name} | {w} | {r['events']:,} | {r['cpu_s']:.3f} | {r['wall_s']:.3f} | {ratio:.2f}× |")
    if args.json:
        args.json.write_text(json.dumps({"repeats": args.repeats, "results": results}, indent=1))


if __name__ == "__main__":
    main()
