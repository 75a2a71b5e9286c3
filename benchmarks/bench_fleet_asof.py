"""derive/collective_calls.sql: ASOF joins against the range self-join they replaced, on one long rank.

    python benchmarks/bench_fleet_asof.py /work/bench/gen/rank0.pt.trace.json --repeats 3 \
        --scales 0.25,1,4,8 --out benchmarks/results/fleet-asof-<date>-<machine>.json

The trace is parsed once and its tables loaded (with the core derivations that classify them) into an in-memory
DuckDB; then, for each scale (0.25, 0.5: the first quarter or half of each rank's time span; 1: the trace; 4, 8:
the trace repeated back to back, shifted in time — one rank as long as 4 or 8 of these traces, built from the
real one), the old query (tests/reference/collective_calls_rangejoin.sql) and the new one
(tracediag/derive/collective_calls.sql) run alternately, `--repeats` times each, on the same copy of the tables.
Reported: the median wall time of each, their ratio, and how each grows with the number of calls (the growth
exponent k in t ∝ n^k between the smallest and the largest scale). Both must return the same rows.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "tests" / "reference" / "collective_calls_rangejoin.sql"
SOURCE_TABLES = ("cpu_ops", "annotations", "kernels", "runtime")


def _load(traces: list[Path]):
    from tracediag.derive import build_order
    from tracediag.ingest import discover_inputs, load, parse_all
    from tracediag.store import open_store

    con = open_store()
    load(con, parse_all([(f, None) for f in discover_inputs(traces)]))
    for d in build_order():  # the derivations collectives.py runs after
        if "collectives" in d.provides:
            break
        d.run(con)
    return con


def _scale(con, factor: float) -> None:
    """Fresh copies of the source tables: the first `factor` of each rank's time span when factor <= 1; else
    the trace repeated `factor` times back to back (each copy shifted by the span, its correlation ids by
    the largest id), a rank as long as `factor` traces of it: one long rank, built from the real one."""
    for t in SOURCE_TABLES:
        con.execute(f"CREATE TEMP TABLE IF NOT EXISTS _src_{t} AS SELECT * FROM {t}")
    con.execute(
        "CREATE OR REPLACE TEMP TABLE _span AS SELECT rank, min(ts_ns) AS t0, max(ts_ns + coalesce(dur_ns, 0)) AS t1 "
        "FROM _src_cpu_ops GROUP BY rank"
    )
    if factor <= 1:
        for t in SOURCE_TABLES:
            con.execute(
                f"CREATE OR REPLACE TEMP TABLE {t} AS SELECT x.* FROM _src_{t} x JOIN _span s USING (rank) "
                f"WHERE x.ts_ns <= s.t0 + {factor} * (s.t1 - s.t0)"
            )
        return
    corr = con.execute(
        "SELECT coalesce(max(correlation), 0) + 1 FROM (SELECT correlation FROM _src_kernels "
        "UNION ALL SELECT correlation FROM _src_runtime)"
    ).fetchone()[0]
    for t in SOURCE_TABLES:
        cols = {r[0] for r in con.execute(f"DESCRIBE _src_{t}").fetchall()}
        shift = ["x.ts_ns + i * (s.t1 - s.t0 + 1000) AS ts_ns"]
        if "correlation" in cols:
            shift.append(f"x.correlation + i * {corr} AS correlation")
        con.execute(
            f"CREATE OR REPLACE TEMP TABLE {t} AS SELECT x.* REPLACE ({', '.join(shift)}) "
            f"FROM _src_{t} x JOIN _span s USING (rank) CROSS JOIN range({int(factor)}) r(i)"
        )


def _time(con, sql: str) -> float:
    t0 = time.perf_counter()
    con.execute(sql)
    return time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("traces", nargs="+", type=Path)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scales", default="0.25,0.5,1,2,4")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    t0 = time.perf_counter()
    con = _load(args.traces)
    load_s = time.perf_counter() - t0
    new_sql = (REPO / "tracediag" / "derive" / "collective_calls.sql").read_text()
    old_sql = REFERENCE.read_text()
    rows = []
    for scale in [float(s) for s in args.scales.split(",")]:
        _scale(con, scale)
        cand = con.execute(
            "SELECT count(*) FROM cpu_ops WHERE (klass = 'collective' OR coll_name IS NOT NULL) "
            "AND coalesce(coll_name, '') <> 'wait'"
        ).fetchone()[0]
        old_t, new_t = [], []
        for _ in range(args.repeats):  # interleaved: old, new, old, new ...
            old_t.append(_time(con, old_sql))
            con.execute("CREATE OR REPLACE TEMP TABLE _old AS SELECT * FROM coll_calls")
            new_t.append(_time(con, new_sql))
        same = con.execute(
            "SELECT (SELECT count(*) FROM (SELECT * FROM _old EXCEPT ALL SELECT * FROM coll_calls)) + "
            "(SELECT count(*) FROM (SELECT * FROM coll_calls EXCEPT ALL SELECT * FROM _old))"
        ).fetchone()[0]
        calls = con.execute("SELECT count(*) FROM coll_calls").fetchone()[0]
        row = {
            "trace_scale": scale,
            "collective_candidates": cand,
            "collective_calls": calls,
            "range_join_s": [round(x, 3) for x in old_t],
            "asof_s": [round(x, 3) for x in new_t],
            "range_join_median_s": round(statistics.median(old_t), 3),
            "asof_median_s": round(statistics.median(new_t), 3),
            "speedup": round(statistics.median(old_t) / statistics.median(new_t), 2),
            "rows_differing": same,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    first, last = rows[0], rows[-1]

    def exponent(key: str) -> float | None:
        import math

        n0, n1 = first["collective_calls"], last["collective_calls"]
        if n0 == n1 or not first[key]:
            return None
        return round(math.log(last[key] / first[key]) / math.log(n1 / n0), 2)

    doc = {
        "benchmark": "collective_calls.sql: ASOF joins vs range self-join",
        "command": "python " + " ".join(sys.argv),
        "traces": [str(p) for p in args.traces],
        "trace_bytes": sum(p.stat().st_size for p in args.traces if p.is_file()),
        "load_and_core_derive_s": round(load_s, 1),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "load_avg_1m": os.getloadavg()[0]},
        "repeats": args.repeats,
        "rows": rows,
        "growth_exponent": {"range_join": exponent("range_join_median_s"), "asof": exponent("asof_median_s")},
    }
    print(json.dumps(doc["growth_exponent"]))
    if args.out:
        args.out.write_text(json.dumps(doc, indent=2) + "\n")
    return 0 if all(r["rows_differing"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
