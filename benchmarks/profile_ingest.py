"""Where tracediag's ingest time goes for ONE rank file: a cProfile of the parser, split into phases.

Runs in the tracediag venv, in one process (no per-rank pool), so the profile covers all of the work::

    .venv/bin/python benchmarks/profile_ingest.py bench-work/json/rank0.pt.trace.json
    .venv/bin/python benchmarks/profile_ingest.py bench-work/gz/rank0.pt.trace.json.gz

Phases are read off the profile by function name, so they follow the parser as it is refactored:
file read / gunzip, msgspec decode, the parser's own Python functions (column building), the Arrow and
NumPy array constructors, and the DuckDB insert (``tracediag.ingest.load`` into a new DuckDB file).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import tempfile
import time
from pathlib import Path


def _name(func: tuple[str, int, str]) -> str:
    file, line, fn = func
    if file == "~":
        return fn
    return f"{Path(file).name}:{line}({fn})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", help="one Kineto trace file (.json or .json.gz)")
    ap.add_argument("--top", type=int, default=25, help="functions to list by own time")
    ap.add_argument("--save", help="write the raw pstats here (for snakeviz/pstats)")
    args = ap.parse_args(argv)

    from tracediag.ingest import load, parse_all
    from tracediag.store import open_store

    path = Path(args.trace)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    parsed = parse_all([path])  # one file: parsed in this process
    prof.disable()
    t_parse = time.perf_counter() - t0
    with tempfile.TemporaryDirectory() as tmp:
        con = open_store(Path(tmp) / "store.duckdb")
        t1 = time.perf_counter()
        load(con, parsed)
        con.close()
        t_load = time.perf_counter() - t1
    if args.save:
        prof.dump_stats(args.save)

    st = pstats.Stats(prof)
    stats = st.stats  # {func: (cc, nc, tottime, cumtime, callers)}
    total_prof = sum(v[2] for v in stats.values())

    def own(pred) -> float:
        return sum(v[2] for f, v in stats.items() if pred(f))

    def in_parser(f) -> bool:  # the Kineto parser's own modules (tracediag/ingest/kineto/)
        return "/ingest/kineto/" in f[0].replace("\\", "/")

    phases = [
        ("gunzip (gzip/zlib decompress)", own(lambda f: f[0] == "~" and ("decompress" in f[2]))),
        ("file read / mmap", own(lambda f: f[0] == "~" and ("read' of '_io" in f[2] or "mmap" in f[2]))),
        ("msgspec JSON decode", own(lambda f: f[0] == "~" and "msgspec" in f[2] and "decode" in f[2])),
        (
            "pyarrow array/table construction",
            own(lambda f: f[0] == "~" and "pyarrow" in f[2]) + own(lambda f: "pyarrow" in f[0]),
        ),
        (
            "numpy array construction/math",
            own(lambda f: f[0] == "~" and "numpy" in f[2]) + own(lambda f: "numpy" in f[0]),
        ),
        ("regex (name classification etc.)", own(lambda f: f[0] == "~" and "re.Pattern" in f[2])),
        (
            "parser's own Python code (loops, list comprehensions)",
            own(in_parser),
        ),
        ("other tracediag Python code", own(lambda f: "tracediag" in f[0] and not in_parser(f))),
    ]
    accounted = sum(t for _, t in phases)
    print(f"file: {path} ({path.stat().st_size / 1e6:.0f} MB on disk)")
    print(
        f"parse_all (one file, in-process, under cProfile): {t_parse:.2f} s wall; profiled own time {total_prof:.2f} s"
    )
    print(f"load into DuckDB file (not profiled): {t_load:.2f} s wall\n")
    print("| phase | own time s | share of profiled |")
    print("|---|---|---|")
    for label, t in phases:
        print(f"| {label} | {t:.2f} | {t / total_prof:.0%} |")
    print(
        f"| everything else (builtins: len/isinstance/list ops, GC, ...) | {total_prof - accounted:.2f} "
        f"| {(total_prof - accounted) / total_prof:.0%} |"
    )
    print(f"| DuckDB insert (load, separate wall) | {t_load:.2f} | — |\n")

    print("Parser functions by cumulative time:")
    rows = sorted(((v[3], v[2], v[1], f) for f, v in stats.items() if in_parser(f)), reverse=True)
    print("| function | cumulative s | own s | calls |")
    print("|---|---|---|---|")
    for ct, tt, nc, f in rows[:15]:
        print(f"| {_name(f)} | {ct:.2f} | {tt:.2f} | {nc} |")

    print(f"\nTop {args.top} functions by own time:")
    print("| function | own s | cumulative s | calls |")
    print("|---|---|---|---|")
    for f, v in sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[: args.top]:
        print(f"| {_name(f)} | {v[2]:.2f} | {v[3]:.2f} | {v[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
