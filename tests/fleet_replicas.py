"""Many-rank runs built from the real 8-rank sample (tests/data/fleet/healthy_tp8): a synthetic builder, because
no real trace set of 16-64 ranks with several TP groups is vendored.

`replicate(src, out, groups)` writes `groups` copies of the p rank files of `src` as the TP groups of one
data-parallel run of groups × p ranks: copy g's rank r becomes global rank g·p + r; `distributedInfo` says
world size groups·p and lists the world group and the copy's TP group (`pg_name` "g+1", description "tp",
its p ranks); each copy's collective calls (the `c10d::` ops) carry that group's name, description, size and
ranks in their args, as torch's record_param_comms does on NCCL; copy g's timestamps are shifted by
g × `shift_us` (and stretched by 1 + g × `stretch` when given, to make one group slower). `straggler=(rank, µs)`
makes one global rank a straggler: its whole timeline is shifted that much later, so it reaches every collective
of its group late and the others wait for it (their calls keep their recorded durations: each waits min(duration,
delay)). `span=f` keeps the events of the first fraction f of each rank's time span (fewer steps, for fast tests).
Every other event is the real one, unchanged. Used by tests/test_fleet.py and benchmarks/bench_fleet.py.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable
from pathlib import Path

FLEET_SAMPLE = Path(__file__).resolve().parent / "data" / "fleet" / "healthy_tp8"


def replicate(
    out: Path,
    groups: int,
    src: Path = FLEET_SAMPLE,
    *,
    drop: Iterable[int] = (),
    shift_us: float = 0.0,
    stretch: float = 0.0,
    compresslevel: int = 1,
    named: bool = True,
    straggler: tuple[int, float] | None = None,
    span: float = 1.0,
) -> list[Path]:
    """Write the rank files of `groups` TP groups into `out` (skipping the global ranks in `drop`). With
    `named=False` the TP groups are recorded nowhere (no pg_config entry, no process-group args on the calls),
    as in the real gloo sample itself: they are then only blocks of p ranks."""
    files = sorted(src.glob("rank*.pt.trace.json.gz"), key=lambda f: int(f.name[4:].split(".")[0]))
    docs = [json.loads(gzip.decompress(f.read_bytes())) for f in files]
    p = len(docs)
    world = groups * p
    drop = set(drop)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for g in range(groups):
        block = list(range(g * p, (g + 1) * p))
        for r, doc in enumerate(docs):
            rank = g * p + r
            if rank in drop:
                continue
            d = dict(doc)
            info = dict(d["distributedInfo"])
            tp_pg = {
                "pg_name": str(g + 1),
                "pg_desc": "tp",
                "backend_config": info["pg_config"][0].get("backend_config"),
                "pg_size": p,
                "ranks": block,
            }
            info |= {
                "rank": rank,
                "world_size": world,
                "pg_count": 2 if named else 1,
                "pg_config": [
                    {**info["pg_config"][0], "pg_size": world, "ranks": list(range(world))},
                    *([tp_pg] if named else []),
                ],
            }
            d["distributedInfo"] = info
            stamps = [e["ts"] for e in doc["traceEvents"] if isinstance(e.get("ts"), (int, float))]
            t0 = min(stamps)
            t_end = t0 + (max(stamps) - t0) * span
            late = straggler[1] if straggler is not None and straggler[0] == rank else 0.0
            events = []
            for e in doc["traceEvents"]:
                e = dict(e)
                if isinstance(e.get("ts"), (int, float)):
                    if e["ts"] > t_end:
                        continue
                    e["ts"] = t0 + (e["ts"] - t0) * (1 + g * stretch) + g * shift_us + late
                    if stretch and isinstance(e.get("dur"), (int, float)):
                        e["dur"] = e["dur"] * (1 + g * stretch)
                if named and e.get("cat") == "cpu_op" and str(e.get("name", "")).startswith("c10d::"):
                    e["args"] = {
                        **(e.get("args") or {}),
                        "Process Group Name": str(g + 1),
                        "Process Group Description": "tp",
                        "Group size": p,
                        "Process Group Ranks": str(block),
                    }
                events.append(e)
            d["traceEvents"] = events
            path = out / f"rank{rank}.pt.trace.json.gz"
            path.write_bytes(gzip.compress(json.dumps(d).encode(), compresslevel=compresslevel))
            written.append(path)
    (out / "config.json").write_bytes((src / "config.json").read_bytes())
    return written
