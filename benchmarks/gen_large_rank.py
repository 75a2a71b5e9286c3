"""Scale one real Kineto rank file up by repeating its events with shifted timestamps and ids (SYNTHETIC).

For the bounded-memory benchmark (a multi-GB rank file): the output holds the input's top-level keys
(distributedInfo, deviceProperties, ...) once and its `traceEvents` N times; repeat k has every `ts` moved by
k × (the trace's span + 1 ms) and every id that links events (`args.External id`, `args.correlation`,
`args.Record function id`, `args.Ev Idx`, `args.Sequence number`, `args.Seq`, flow `id`) moved by k × (the
largest id + 1), so joins on those ids stay one-to-one and steps do not overlap. Metadata events (`ph` "M")
are written once. Events are written one by one (orjson), so the generator holds one copy of the input only.

    .venv/bin/python benchmarks/gen_large_rank.py bench-work/json/rank0.pt.trace.json \
        --target-gb 4 --out bench-work/big/rank0.pt.trace.json
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import orjson

_ID_ARGS = ("External id", "correlation", "Record function id", "Ev Idx", "Sequence number", "Seq")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path, help="a plain-JSON Kineto rank file")
    ap.add_argument("--target-gb", type=float, default=4.0, help="approximate output size, GB (10**9 bytes)")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)

    doc = orjson.loads(args.trace.read_bytes())
    events = doc.pop("traceEvents")
    meta = [e for e in events if e.get("ph") == "M"]
    timed = [e for e in events if e.get("ph") != "M"]
    ts = [e["ts"] for e in timed if isinstance(e.get("ts"), (int, float))]
    ends = [e["ts"] + (e.get("dur") or 0) for e in timed if isinstance(e.get("ts"), (int, float))]
    shift_ts = (max(ends) - min(ts)) + 1000.0
    max_id = 0
    for e in timed:
        if isinstance(e.get("id"), int):
            max_id = max(max_id, e["id"])
        a = e.get("args")
        if isinstance(a, dict):
            for k in _ID_ARGS:
                if isinstance(a.get(k), int):
                    max_id = max(max_id, a[k])
    shift_id = max_id + 1
    per_repeat = len(orjson.dumps(timed)) + len(timed)  # as written: compact, one event per line
    repeats = max(1, math.ceil(args.target_gb * 1e9 / per_repeat))

    args.out.parent.mkdir(parents=True, exist_ok=True)
    head = orjson.dumps(doc)[:-1]  # the other keys, without the closing brace
    with open(args.out, "wb") as f:
        f.write(head + (b', "traceEvents": [\n' if len(head) > 1 else b'{"traceEvents": [\n'))
        first = True
        for e in meta:
            f.write((b"" if first else b",\n") + orjson.dumps(e))
            first = False
        for k in range(repeats):
            dt, di = k * shift_ts, k * shift_id
            for e in timed:
                if k:
                    e = dict(e)
                    if isinstance(e.get("ts"), (int, float)):
                        e["ts"] = round(e["ts"] + dt, 3)
                    if isinstance(e.get("id"), int):
                        e["id"] += di
                    a = e.get("args")
                    if isinstance(a, dict):
                        a = dict(a)
                        for key in _ID_ARGS:
                            if isinstance(a.get(key), int) and a[key] >= 0:
                                a[key] += di
                        e["args"] = a
                f.write((b"" if first else b",\n") + orjson.dumps(e))
                first = False
        f.write(b"\n]}\n")
    print(f"{args.out}: {args.out.stat().st_size / 1e9:.2f} GB, {repeats} repeats of {len(timed):,} events")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
