"""PyTorch profiler (Kineto) Chrome-trace JSON -> canonical columnar tables.

One call parses one rank file and returns Arrow tables shaped like `store/schema.sql`.
The whole file is decoded in one pass by msgspec into typed structs that keep only the fields
the schema needs (unknown keys are skipped inside the decoder, not materialised as dicts), then
each category is turned into columns with list comprehensions and numpy. That is the parse floor
on this hardware: see benchmarks/bench_ingest.py.

Field names are the ones Kineto and PyTorch write (pytorch/kineto libkineto/src/output_json.cpp,
torch/csrc/profiler/util.h).

Every value goes through `tracediag.ingest.validate`: an event whose `ts` or `dur` is not a finite number in
range is dropped, an out-of-range or wrongly typed arg (a 2**40 group size, invalid UTF-8 in `Input Dims`) is
set to NULL, and both are counted in the input's `bad_records`; the rank of the file, when present and not a
rank, is an InputError naming `distributedInfo.rank`.
"""

from __future__ import annotations

import contextlib
import gzip
import mmap
import os
import re
import zlib
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from tracediag.catalog import classify_cpu_op, classify_kernel
from tracediag.errors import InputError
from tracediag.ingest import validate as val
from tracediag.ingest.base import IngestOptions, Parsed, names_classified_by_prefix
from tracediag.ingest.validate import BadRecords

_EMPTY = msgspec.Raw(b"")


class _Args(msgspec.Struct, omit_defaults=True):
    # Kineto writes some of these as numbers in one version and strings in another: Any keeps the
    # decoder from rejecting a real trace over a type it does not need to interpret.
    external_id: Any = msgspec.field(name="External id", default=None)
    device: Any = None
    stream: Any = None
    correlation: Any = None
    grid: Any = None
    block: Any = None
    bytes: Any = None
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=_EMPTY)
    input_types: msgspec.Raw = msgspec.field(name="Input type", default=_EMPTY)
    coll_name: Any = msgspec.field(name="Collective name", default=None)
    in_nelems: Any = msgspec.field(name="In msg nelems", default=None)
    out_nelems: Any = msgspec.field(name="Out msg nelems", default=None)
    in_size_old: Any = msgspec.field(name="In msg size", default=None)
    out_size_old: Any = msgspec.field(name="Out msg size", default=None)
    group_size: Any = msgspec.field(name="Group size", default=None)
    dtype: Any = None
    pg_name: Any = msgspec.field(name="Process Group Name", default=None)
    pg_id_old: Any = msgspec.field(name="Process Group ID", default=None)
    pg_desc: Any = msgspec.field(name="Process Group Description", default=None)
    pg_ranks: Any = msgspec.field(name="Process Group Ranks", default=None)
    seq: Any = msgspec.field(name="Seq", default=None)


class _Event(msgspec.Struct):
    ph: str = ""
    cat: Any = ""
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    id: Any = None
    args: _Args | None = None
    # Not Chrome-trace keys: filled by _timed (ts_ns from the raw JSON text when float64 cannot hold ns, see
    # _exact_ts), once both are validated.
    # (Any: a JSON key of the same name must not fail the decode; both are overwritten)
    ts_ns: Any = None
    dur_ns: Any = 0


class _RawTs(msgspec.Struct):
    ts: msgspec.Raw = _EMPTY


class _RawTsTrace(msgspec.Struct):
    traceEvents: list[_RawTs] | None = None


# Above 2**43 µs (~8.8e12, i.e. epoch-based µs clocks) a float64 has a spacing of ≥ 2 ns, so the
# nanosecond digits Kineto writes ("1712195495505582.988") cannot survive a float parse.
_FLOAT_NS_EXACT_LIMIT_US = 2.0**43


class _Trace(msgspec.Struct):
    traceEvents: list[_Event] | None = None
    distributedInfo: Any = None
    deviceProperties: Any = None


_TraceOrArray = _Trace | list[_Event]

# Markers worth keeping from the (skipped) python_function events: vLLM V0 and V1 model runners
# show their per-step `execute_model` only as a Python frame (CATALOG.md section 4).
_PY_STEP_MARKER = re.compile(r"(?:^|\s|/)\w*model_runner\w*\.py\(\d+\): execute_model$")
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)", re.IGNORECASE)


def read_bytes(path: Path) -> bytes | mmap.mmap:
    """Whole-file bytes; gzip is detected by magic number, not by the file name."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
            if head == b"\x1f\x8b":
                f.seek(0)
                try:
                    return gzip.decompress(f.read())
                except (OSError, EOFError, zlib.error) as exc:
                    raise InputError(path, f"corrupt or truncated gzip data ({exc})") from None
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise InputError(path, "file is empty")
            # mmap: the decoder reads straight from the page cache, no second copy of a 1 GB file.
            return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise InputError(path, f"cannot read file ({exc.strerror or exc})") from None


def _ends_whole(data: bytes | mmap.mmap) -> bool:
    """The JSON text ends with its closing bracket (so a 'truncated' from the decoder means a bad escape)."""
    tail = data[-64:] if len(data) >= 64 else data[:]
    return bytes(tail).rstrip().endswith((b"}", b"]"))


def _decode(path: Path, data: bytes | mmap.mmap) -> tuple[list[_Event], dict[str, Any]]:
    try:
        doc = msgspec.json.decode(data, type=_TraceOrArray)
    except msgspec.ValidationError as exc:
        msg = str(exc)
        if msg.startswith("Number out of range"):  # e.g. 1e999: no float holds it
            raise InputError(path, f"a number too large for any float ({msg})") from None
        raise InputError(path, f"JSON, but not a Chrome/Kineto trace: {msg}") from None
    except msgspec.DecodeError as exc:
        msg = str(exc)
        if "truncated" in msg.lower() and not _ends_whole(data):
            raise InputError(path, f"truncated JSON ({msg}); was the profiler stopped mid-write?") from None
        if "truncated" in msg.lower():
            msg = "an invalid string escape, such as a lone \\ud800 surrogate"
        hint = "; NaN and Infinity are not JSON numbers" if "invalid character" in msg else ""
        raise InputError(path, f"not valid JSON ({msg}{hint})") from None
    except RecursionError:
        # msgspec stops at the interpreter's recursion limit (not raised here): no trace nests like this
        raise InputError(path, "JSON nested too deep to be a trace (hundreds of levels of [ or {)") from None
    if isinstance(doc, list):
        return doc, {}
    if doc.traceEvents is None:
        raise InputError(path, "JSON, but not a Chrome/Kineto trace: no 'traceEvents' array")
    return doc.traceEvents, {"distributedInfo": doc.distributedInfo, "deviceProperties": doc.deviceProperties}


def _exact_ts_ns(raw: msgspec.Raw) -> int | None:
    """Decimal µs text -> integer ns, exactly (half-up on the 4th decimal)."""
    b = bytes(raw)
    if not b or b in (b"null",) or len(b) > 64:  # 64 characters: beyond any clock (validated after)
        return None
    try:
        if b"e" in b or b"E" in b:
            d = Decimal(b.decode())
            if not d.is_finite() or d.adjusted() > 30:  # 1e999999999 would expand to a billion digits
                return None
            return int((d * 1000).to_integral_value(rounding=ROUND_HALF_UP))
        whole, _, frac = b.partition(b".")
        ns = abs(int(whole)) * 1000 + int((frac + b"000")[:3])
        if len(frac) > 3 and frac[3:4] >= b"5":
            ns += 1
        return -ns if whole.startswith(b"-") else ns
    except (ValueError, ArithmeticError):
        return None


def _attach_exact_ts(data: bytes | mmap.mmap, events: list[_Event]) -> None:
    """Second, narrow decode of only `ts` as raw text, for traces whose clock float64 cannot resolve."""
    doc = msgspec.json.decode(data, type=_RawTsTrace | list[_RawTs])
    raws = doc if isinstance(doc, list) else (doc.traceEvents or [])
    for e, r in zip(events, raws, strict=True):
        e.ts_ns = _exact_ts_ns(r.ts)


def _needs_exact_ts(events: list[_Event]) -> bool:
    limit = _FLOAT_NS_EXACT_LIMIT_US
    return any(isinstance(e.ts, float) and (e.ts >= limit or e.ts <= -limit) for e in events)


def _timed(evs: list[_Event], table: str, exact: bool, bad: BadRecords) -> list[_Event]:
    """The events whose `ts` and `dur` are usable, with both stored in ns on the event (`ts_ns`, `dur_ns`);
    the others are dropped and counted as bad records of `table`.

    Kineto writes µs with a fractional part down to ns; `validate.us_to_ns` converts the integer part apart
    from the fraction (at 1.7e15 µs, float64 × 1000 is off by hundreds of ns). With `exact`, `ts_ns` already
    holds the value parsed from the JSON text (_attach_exact_ts) and is only range-checked.
    """
    if not evs:
        return evs
    if exact:
        lim = val.TS_NS_MAX
        ts_list = [e.ts_ns for e in evs]
        ts_ok = np.fromiter((type(t) is int and -lim <= t <= lim for t in ts_list), dtype=bool, count=len(evs))
        ts = np.array([t if ok else 0 for t, ok in zip(ts_list, ts_ok)], dtype=np.int64)
    else:
        ts, ts_ok = val.us_to_ns([e.ts for e in evs])
    dur, dur_ok = val.dur_us_to_ns([e.dur for e in evs])
    ok = ts_ok & dur_ok
    for e, t, d in zip(evs, ts.tolist(), dur.tolist()):
        e.ts_ns = t
        e.dur_ns = d
    if ok.all():
        return evs
    bad.dropped(table, "ts", [e.ts for e, good in zip(evs, ts_ok) if not good])
    bad.dropped(table, "dur", [e.dur for e, t, d in zip(evs, ts_ok, dur_ok) if t and not d])
    return [e for e, good in zip(evs, ok) if good]


def _ns_of(evs: list[_Event]) -> np.ndarray:
    return np.fromiter((e.ts_ns for e in evs), dtype=np.int64, count=len(evs))


def _dur_of(evs: list[_Event]) -> np.ndarray:
    return np.fromiter((e.dur_ns for e in evs), dtype=np.int64, count=len(evs))


def _pick_rank(path: Path, dist: Any, order: int) -> tuple[int, str]:
    if isinstance(dist, dict) and dist.get("rank") is not None:
        rank = dist["rank"]
        if type(rank) is not int or not 0 <= rank <= val.RANK_MAX:
            raise InputError(
                path, f"distributedInfo.rank is {val.example(rank)}, not a rank (an integer 0 … {val.RANK_MAX})"
            )
        return rank, "distributedInfo"
    m = _RANK_IN_NAME.search(path.name)
    if m and len(m.group(1)) <= 8 and int(m.group(1)) <= val.RANK_MAX:
        return int(m.group(1)), "file name"
    return order, "input order"


def _has_comm(a: _Args) -> bool:
    # spelled out: this runs once per CPU op (hundreds of thousands), a getattr loop costs 10x more
    return (
        a.coll_name is not None
        or a.in_nelems is not None
        or a.in_size_old is not None
        or a.dtype is not None
        or a.group_size is not None
        or a.pg_name is not None
        or a.pg_id_old is not None
        or a.seq is not None
        or a.out_nelems is not None
        or a.out_size_old is not None
        or a.pg_desc is not None
        or a.pg_ranks is not None
    )


def _pg_ranks(x: Any) -> Any:
    # "Process Group Ranks" is text ("[0, 1]"); a list of ints is kept as its JSON text
    if type(x) is list and not val.is_bad(val.int_list(x)):
        return orjson.dumps(x).decode()
    return x


def _comm_columns(args: list[_Args | None], chk: val.Checker) -> dict[str, pa.Array]:
    """Collective metadata columns; only the few events that carry any of it are visited per field."""
    n = len(args)
    idx = [i for i, a in enumerate(args) if a is not None and _has_comm(a)]

    def raw(getter) -> list[Any]:
        values = [None] * n
        for i in idx:
            values[i] = getter(args[i])
        return values

    if not idx:
        types = {"coll_name": pa.string(), "in_nelems": pa.int64(), "out_nelems": pa.int64(), "group_size": pa.int32(),
                 "dtype": pa.string(), "pg_name": pa.string(), "pg_desc": pa.string(), "pg_ranks": pa.string(),
                 "seq": pa.int64()}  # fmt: skip
        return {k: pa.nulls(n, t) for k, t in types.items()}
    elems = (0, val.COUNT_MAX)
    return {
        "coll_name": chk.strs("args.Collective name", raw(lambda a: a.coll_name)),
        "in_nelems": chk.ints(
            "args.In msg nelems",
            raw(lambda a: a.in_nelems if a.in_nelems is not None else a.in_size_old),
            pa.int64(),
            *elems,
        ),
        "out_nelems": chk.ints(
            "args.Out msg nelems",
            raw(lambda a: a.out_nelems if a.out_nelems is not None else a.out_size_old),
            pa.int64(),
            *elems,
        ),
        "group_size": chk.ints("args.Group size", raw(lambda a: a.group_size), pa.int32(), 1, val.RANK_MAX + 1),
        "dtype": chk.strs("args.dtype", raw(lambda a: a.dtype)),
        "pg_name": chk.strs(
            "args.Process Group Name", raw(lambda a: a.pg_name if a.pg_name is not None else a.pg_id_old)
        ),
        "pg_desc": chk.strs("args.Process Group Description", raw(lambda a: a.pg_desc)),
        "pg_ranks": chk.strs("args.Process Group Ranks", raw(lambda a: _pg_ranks(a.pg_ranks))),
        "seq": chk.ints("args.Seq", raw(lambda a: a.seq), pa.int64()),
    }


def _raw_column(raws: list[msgspec.Raw | None], name: str, chk: val.Checker) -> pa.Array:
    """Verbatim JSON fragments (Input Dims, Input type) -> string column; invalid UTF-8 is NULL and counted."""
    return chk.raw_text(name, [bytes(r) if r is not None and len(r) else None for r in raws])


def _classified(names: list[str], classify) -> dict[str, pa.Array]:
    # Classify each distinct name once; traces repeat a few thousand names hundreds of thousands of times.
    table = {n: classify(n) for n in set(names)}
    return {
        "klass": pa.array([table[n].klass for n in names], pa.string()),
        "family": pa.array([table[n].family for n in names], pa.string()),
        "collective_op": pa.array([table[n].collective_op for n in names], pa.string()),
    }


def _base(evs: list[_Event], rank: int, chk: val.Checker) -> dict[str, Any]:
    """rank, name, ts_ns, dur_ns of events that went through _timed."""
    return {
        "rank": pa.array(np.full(len(evs), rank, dtype=np.int32)),
        "name": pc.fill_null(chk.strs("name", [e.name if e.name is not None else "" for e in evs]), ""),
        "ts_ns": pa.array(_ns_of(evs)),
        "dur_ns": pa.array(_dur_of(evs)),
    }


def _gpu_columns(evs: list[_Event], chk: val.Checker) -> dict[str, pa.Array]:
    args = [e.args for e in evs]
    i32 = (-(2**31), val.INT32_MAX)
    # args.device / args.stream when the event has them, else Kineto's pid (device) and tid (stream)
    dev = chk.int_values("args.device", [a.device if a else None for a in args], *i32)
    stream = chk.int_values("args.stream", [a.stream if a else None for a in args], -val.ID_MAX - 1, val.ID_MAX)
    return {
        "device": pa.array(
            [d if a and a.device is not None else val.int_or_none(e.pid, *i32) for d, e, a in zip(dev, evs, args)],
            pa.int32(),
        ),
        "stream": pa.array(
            [s if a and a.stream is not None else val.int_or_none(e.tid) for s, e, a in zip(stream, evs, args)],
            pa.int64(),
        ),
        "correlation": chk.ints("args.correlation", [a.correlation if a else None for a in args], pa.int64()),
        "external_id": chk.ints("args.External id", [a.external_id if a else None for a in args], pa.int64()),
    }


def _host_columns(evs: list[_Event], chk: val.Checker) -> dict[str, pa.Array]:
    return {
        "pid": chk.strs("pid", [e.pid for e in evs]),
        "tid": chk.strs("tid", [e.tid for e in evs]),
    }


def parse_kineto(path: str | Path, order: int = 0, options: IngestOptions | None = None) -> Parsed:
    """Parse one Kineto trace file. Raises InputError naming the file on any problem."""
    p = Path(path)
    keep_python = (options or IngestOptions()).keep_python
    data = read_bytes(p)
    try:
        events, top = _decode(p, data)
        exact = _needs_exact_ts(events)
        if exact:
            _attach_exact_ts(data, events)
        return _build(p, order, events, top, keep_python, exact)
    finally:
        if isinstance(data, mmap.mmap):
            # msgspec.Raw values point into the map; they were converted to str in _build.
            with contextlib.suppress(BufferError):
                data.close()


# event category -> the table its events go to (events of other categories are not stored, so not checked)
_TABLE_OF = {"kernel": "kernels", "gpu_memcpy": "memops", "gpu_memset": "memops", "cuda_runtime": "runtime",
             "cuda_driver": "runtime", "cpu_op": "cpu_ops", "python_function": "cpu_ops",
             "user_annotation": "annotations", "gpu_user_annotation": "annotations",
             "python_step_marker": "annotations"}  # fmt: skip


def _build(
    p: Path, order: int, events: list[_Event], top: dict[str, Any], keep_python: bool, exact: bool = False
) -> Parsed:
    if not events:
        raise InputError(p, "trace has no events (empty traceEvents)")
    by_cat: dict[str, list[_Event]] = {}
    flows: list[_Event] = []
    py_skipped = 0
    for e in events:
        ph = e.ph
        if ph == "X":
            cat = e.cat if isinstance(e.cat, str) else ""
            if cat == "python_function" and not keep_python:
                if isinstance(e.name, str) and _PY_STEP_MARKER.search(e.name):
                    by_cat.setdefault("python_step_marker", []).append(e)
                else:
                    py_skipped += 1
                continue
            by_cat.setdefault(cat, []).append(e)
        elif ph in ("s", "f"):
            flows.append(e)
    if not any(by_cat.values()):
        if py_skipped:
            raise InputError(
                p,
                f"trace has no duration events besides {py_skipped} python_function events "
                "(pass --keep-python to store those)",
            )
        raise InputError(p, f"trace has no duration events (only {len(events)} metadata/instant events)")

    dist = top.get("distributedInfo")
    rank, rank_source = _pick_rank(p, dist, order)
    bad = BadRecords()
    by_cat = {cat: _timed(evs, _TABLE_OF[cat], exact, bad) if cat in _TABLE_OF else evs for cat, evs in by_cat.items()}
    flows = _timed(flows, "flows", exact, bad)
    if bad and not any(evs for cat, evs in by_cat.items() if cat in _TABLE_OF):
        first = next(iter(bad.fields))
        raise InputError(
            p,
            f"no event has a usable ts and dur ({bad.records} dropped; e.g. {first} = {bad.fields[first].examples[0]})",
        )
    tables: dict[str, pa.Table] = {}

    kern = by_cat.get("kernel", [])
    if kern:
        chk = val.Checker(bad, "kernels")
        cols = _base(kern, rank, chk) | _gpu_columns(kern, chk)
        args = [e.args for e in kern]
        cols["grid"] = chk.int_lists("args.grid", [a.grid if a else None for a in args])
        cols["block"] = chk.int_lists("args.block", [a.block if a else None for a in args])
        names = cols["name"].to_pylist()
        cols |= _classified(names, classify_kernel) | _comm_columns(args, chk)
        tables["kernels"] = pa.table(cols)

    mem = [("memcpy", e) for e in by_cat.get("gpu_memcpy", [])] + [("memset", e) for e in by_cat.get("gpu_memset", [])]
    if mem:
        chk = val.Checker(bad, "memops")
        evs = [e for _, e in mem]
        cols = _base(evs, rank, chk) | _gpu_columns(evs, chk)
        cols["kind"] = pa.array([k for k, _ in mem], pa.string())
        cols["bytes"] = chk.ints(
            "args.bytes", [e.args.bytes if e.args else None for e in evs], pa.int64(), 0, val.COUNT_MAX
        )
        tables["memops"] = pa.table(cols)

    rt = [(c, e) for c in ("cuda_runtime", "cuda_driver") for e in by_cat.get(c, [])]
    if rt:
        chk = val.Checker(bad, "runtime")
        evs = [e for _, e in rt]
        cols = _base(evs, rank, chk) | _host_columns(evs, chk)
        cols["cat"] = pa.array([c for c, _ in rt], pa.string())
        cols["correlation"] = chk.ints(
            "args.correlation", [e.args.correlation if e.args else None for e in evs], pa.int64()
        )
        cols["external_id"] = chk.ints(
            "args.External id", [e.args.external_id if e.args else None for e in evs], pa.int64()
        )
        tables["runtime"] = pa.table(cols)

    ops = by_cat.get("cpu_op", []) + (by_cat.get("python_function", []) if keep_python else [])
    if ops:
        chk = val.Checker(bad, "cpu_ops")
        cols = _base(ops, rank, chk) | _host_columns(ops, chk)
        args = [e.args for e in ops]
        cols["external_id"] = chk.ints("args.External id", [a.external_id if a else None for a in args], pa.int64())
        cols["input_dims"] = _raw_column([a.input_dims if a else None for a in args], "args.Input Dims", chk)
        cols["input_types"] = _raw_column([a.input_types if a else None for a in args], "args.Input type", chk)
        cols |= _classified(cols["name"].to_pylist(), classify_cpu_op) | _comm_columns(args, chk)
        tables["cpu_ops"] = pa.table(cols)

    ann = [
        (src, e)
        for src in ("user_annotation", "gpu_user_annotation", "python_step_marker")
        for e in by_cat.get(src, [])
    ]
    if ann:
        chk = val.Checker(bad, "annotations")
        evs = [e for _, e in ann]
        cols = _base(evs, rank, chk) | _host_columns(evs, chk)
        cols["source"] = pa.array(["python_function" if s == "python_step_marker" else s for s, _ in ann], pa.string())
        cols["external_id"] = chk.ints(
            "args.External id", [e.args.external_id if e.args else None for e in evs], pa.int64()
        )
        cols["input_dims"] = _raw_column([e.args.input_dims if e.args else None for e in evs], "args.Input Dims", chk)
        cols["input_types"] = _raw_column([e.args.input_types if e.args else None for e in evs], "args.Input type", chk)
        cls = _classified(cols["name"].to_pylist(), classify_cpu_op)
        cols["klass"] = cls["klass"]
        cols["collective_op"] = cls["collective_op"]
        tables["annotations"] = pa.table(cols)

    if flows:
        chk = val.Checker(bad, "flows")
        tables["flows"] = pa.table(
            {
                "rank": pa.array(np.full(len(flows), rank, dtype=np.int32)),
                "flow_id": chk.ints("id", [e.id for e in flows], pa.int64()),
                "cat": chk.strs("cat", [e.cat for e in flows]),
                "phase": pa.array([e.ph for e in flows], pa.string()),
                "ts_ns": pa.array(_ns_of(flows)),
                "pid": chk.strs("pid", [e.pid for e in flows]),
                "tid": chk.strs("tid", [e.tid for e in flows]),
            }
        )

    starts, ends = [], []
    for name in ("kernels", "memops", "runtime", "cpu_ops", "annotations"):
        t = tables.get(name)
        if t is not None and t.num_rows:
            ts = t.column("ts_ns").to_numpy()
            starts.append(ts.min())
            ends.append((ts + t.column("dur_ns").to_numpy()).max())

    meta = _meta(p, order, rank, rank_source, dist, top.get("deviceProperties"), tables, bad)
    pgs = _pg_config(dist, rank, bad)
    long_names = names_classified_by_prefix(tables)
    meta |= {
        "trace_start_ns": int(min(starts)) if starts else None,
        "trace_end_ns": int(max(ends)) if ends else None,
        "events_total": len(events),
        "events_python_skipped": py_skipped,
    }
    facts = {"names_classified_by_prefix": long_names} if long_names else {}
    if bad:
        facts["bad_records"] = bad.to_meta()
    meta |= {"bad_records": bad.records, "meta_json": orjson.dumps(facts).decode() if facts else None}
    return Parsed(path=str(p), format="kineto", inputs_rows=[meta], tables=tables, process_groups=pgs)


def _pg_config(dist: Any, rank: int, bad: BadRecords) -> list[dict[str, Any]]:
    """distributedInfo.pg_config -> process_groups rows; a wrongly typed or out-of-range value is NULL."""
    if not (isinstance(dist, dict) and isinstance(dist.get("pg_config"), list)):
        return []
    chk = val.Checker(bad, "distributedInfo.pg_config")
    entries = [pg for pg in dist["pg_config"] if isinstance(pg, dict)]

    def col(key: str) -> list[Any]:
        return [pg.get(key) for pg in entries]

    names, descs, backends = (chk.str_values(k, col(k)) for k in ("pg_name", "pg_desc", "backend_config"))
    sizes = chk.int_values("pg_size", col("pg_size"), 1, val.RANK_MAX + 1)
    ranks, idx = val.int_lists(col("ranks"), 0, val.RANK_MAX)
    bad.nulled("distributedInfo.pg_config", "ranks", idx, [entries[i].get("ranks") for i in idx])
    return [
        {
            "rank": rank,
            "pg_name": names[i],
            "pg_desc": descs[i],
            "backend_config": backends[i],
            "pg_size": sizes[i],
            "ranks": ranks[i],
        }
        for i in range(len(entries))
    ]


def _meta(
    p: Path,
    order: int,
    rank: int,
    rank_source: str,
    dist: Any,
    props: Any,
    tables: dict[str, pa.Table],
    bad: BadRecords,
) -> dict[str, Any]:
    dist = dist if isinstance(dist, dict) else {}
    device = None
    if "kernels" in tables and tables["kernels"].num_rows:
        devs = pc.drop_null(tables["kernels"].column("device"))
        if len(devs):
            counts = pc.value_counts(devs)
            device = counts.field("values")[pc.index(counts.field("counts"), pc.max(counts.field("counts"))).as_py()]
            device = device.as_py()
    prop = None
    if isinstance(props, list):
        cands = [d for d in props if isinstance(d, dict)]
        prop = next((d for d in cands if d.get("id") == device), cands[0] if cands else None)
    # facts of the file: a wrongly typed or out-of-range one is NULL and counted
    di, dp = val.Checker(bad, "distributedInfo"), val.Checker(bad, "deviceProperties")
    prop = prop or {}

    def fact(chk: val.Checker, doc: dict, key: str, lo: int | None = None, hi: int = val.INT64_MAX) -> Any:
        if lo is None:
            return chk.str_values(key, [doc.get(key)])[0]
        return chk.int_values(key, [doc.get(key)], lo, hi)[0]

    world_size = fact(di, dist, "world_size", 1, val.RANK_MAX + 1)
    backend, nccl_version = fact(di, dist, "backend"), fact(di, dist, "nccl_version")
    name, mem = fact(dp, prop, "name") or None, fact(dp, prop, "totalGlobalMem", 0)
    sms, major, minor = (fact(dp, prop, k, 0, val.INT32_MAX) for k in ("numSms", "computeMajor", "computeMinor"))
    dist_json = val.json_text(dist) if dist else None
    props_json = val.json_text(props) if props else None
    if dist and dist_json is None:
        bad.nulled("inputs", "distributedInfo", [0], [dist])
    if props and props_json is None:
        bad.nulled("inputs", "deviceProperties", [0], [props])
    return {
        "input_id": order,
        "path": str(p),
        "format": "kineto",
        "profiler": "pytorch-profiler (kineto)",
        "file_bytes": p.stat().st_size,
        "rank": rank,
        "rank_source": rank_source,
        "world_size": world_size,
        "backend": backend,
        "nccl_version": nccl_version,
        "device_name": name,
        "device_total_mem_bytes": mem,
        "device_num_sms": sms,
        "device_compute_capability": f"{major}.{minor}" if major is not None else None,
        "distributed_info_json": dist_json,
        "device_properties_json": props_json,
    }
