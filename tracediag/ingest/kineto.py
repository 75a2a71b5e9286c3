"""PyTorch profiler (Kineto) Chrome-trace JSON -> canonical columnar tables.

One call parses one rank file and returns Arrow tables shaped like `store/schema.sql`.
The whole file is decoded in one pass by msgspec into typed structs that keep only the fields
the schema needs (unknown keys are skipped inside the decoder, not materialised as dicts), then
each category is turned into columns with list comprehensions and numpy. That is the parse floor
on this hardware: see benchmarks/bench_ingest.py.

Field names are the ones Kineto and PyTorch write (pytorch/kineto libkineto/src/output_json.cpp,
torch/csrc/profiler/util.h).
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

from tracediag.catalog import classify_cpu_op, classify_kernel
from tracediag.errors import InputError
from tracediag.ingest.base import IngestOptions, Parsed

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
    # Not a Chrome-trace key: filled from the raw JSON text when float64 cannot hold ns (see _exact_ts).
    ts_ns: int | None = None


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


def _decode(path: Path, data: bytes | mmap.mmap) -> tuple[list[_Event], dict[str, Any]]:
    try:
        doc = msgspec.json.decode(data, type=_TraceOrArray)
    except msgspec.ValidationError as exc:
        raise InputError(path, f"JSON, but not a Chrome/Kineto trace: {exc}") from None
    except msgspec.DecodeError as exc:
        msg = str(exc)
        if "truncated" in msg.lower():
            raise InputError(path, f"truncated JSON ({msg}); was the profiler stopped mid-write?") from None
        raise InputError(path, f"not valid JSON ({msg})") from None
    if isinstance(doc, list):
        return doc, {}
    if doc.traceEvents is None:
        raise InputError(path, "JSON, but not a Chrome/Kineto trace: no 'traceEvents' array")
    return doc.traceEvents, {"distributedInfo": doc.distributedInfo, "deviceProperties": doc.deviceProperties}


def _to_int(v: Any) -> int | None:
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v if -(2**63) <= v < 2**63 else None  # e.g. 64-bit unsigned ids: not representable
    if isinstance(v, float):
        return int(v) if v == v and abs(v) < 2**63 else None
    if isinstance(v, str):
        try:
            return int(v, 0) if v.startswith("0x") else int(float(v))
        except ValueError:
            return None
    return None


def _to_str(v: Any) -> str | None:
    if v is None:
        return None
    return v if isinstance(v, str) else str(v)


def _int_list(v: Any) -> list[int] | None:
    if isinstance(v, list) and all(isinstance(x, int) for x in v):
        return v
    return None


def _exact_ts_ns(raw: msgspec.Raw) -> int | None:
    """Decimal µs text -> integer ns, exactly (half-up on the 4th decimal)."""
    b = bytes(raw)
    if not b or b in (b"null",):
        return None
    try:
        if b"e" in b or b"E" in b:
            return int((Decimal(b.decode()) * 1000).to_integral_value(rounding=ROUND_HALF_UP))
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


def _ns_of(evs: list[_Event]) -> np.ndarray:
    if evs and evs[0].ts_ns is not None:
        return np.array([e.ts_ns if e.ts_ns is not None else 0 for e in evs], dtype=np.int64)
    return _ns([e.ts for e in evs])


def _ns(values: list[Any]) -> np.ndarray:
    """Microsecond timestamps (int or float) -> int64 ns, without float64 rounding of the integer part.

    Kineto writes µs with a fractional part down to ns. At 1.7e15 µs a float64 multiplied by 1000
    is off by hundreds of ns; splitting integer and fraction keeps what the JSON number holds.
    """
    ts = np.array([v if isinstance(v, (int, float)) else np.nan for v in values], dtype=np.float64)
    ok = ~np.isnan(ts)
    whole = np.floor(ts[ok])
    res = np.zeros(len(ts), dtype=np.int64)
    res[ok] = whole.astype(np.int64) * 1000 + np.rint((ts[ok] - whole) * 1000).astype(np.int64)
    return res


def _dur_ns(values: list[Any]) -> np.ndarray:
    d = np.array([v if isinstance(v, (int, float)) else 0 for v in values], dtype=np.float64)
    return np.maximum(np.rint(d * 1000), 0).astype(np.int64)


def _pick_rank(path: Path, dist: Any, order: int) -> tuple[int, str]:
    if isinstance(dist, dict) and isinstance(dist.get("rank"), int):
        return dist["rank"], "distributedInfo"
    m = _RANK_IN_NAME.search(path.name)
    if m:
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


def _comm_columns(args: list[_Args | None]) -> dict[str, pa.Array]:
    """Collective metadata columns; only the few events that carry any of it are visited per field."""
    n = len(args)
    idx = [i for i, a in enumerate(args) if a is not None and _has_comm(a)]

    def col(getter, typ):
        if not idx:
            return pa.nulls(n, typ)
        values = [None] * n
        for i in idx:
            values[i] = getter(args[i])
        return pa.array(values, type=typ)

    return {
        "coll_name": col(lambda a: _to_str(a.coll_name), pa.string()),
        "in_nelems": col(lambda a: _to_int(a.in_nelems if a.in_nelems is not None else a.in_size_old), pa.int64()),
        "out_nelems": col(lambda a: _to_int(a.out_nelems if a.out_nelems is not None else a.out_size_old), pa.int64()),
        "group_size": col(lambda a: _to_int(a.group_size), pa.int32()),
        "dtype": col(lambda a: _to_str(a.dtype), pa.string()),
        "pg_name": col(lambda a: _to_str(a.pg_name if a.pg_name is not None else a.pg_id_old), pa.string()),
        "pg_desc": col(lambda a: _to_str(a.pg_desc), pa.string()),
        "pg_ranks": col(lambda a: _to_str(a.pg_ranks), pa.string()),
        "seq": col(lambda a: _to_int(a.seq), pa.int64()),
    }


def _str_column(values: list[Any]) -> pa.Array:
    """Strings (or ints, e.g. pid/tid) -> Arrow string column; Arrow converts homogeneous lists in C."""
    try:
        arr = pa.array(values)
        return arr if arr.type == pa.string() else arr.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return pa.array([_to_str(v) for v in values], pa.string())


def _raw_column(raws: list[msgspec.Raw | None]) -> pa.Array:
    """Verbatim JSON fragments (Input Dims, Input type) -> string column, UTF-8 checked by Arrow."""
    return pa.array([bytes(r) if r is not None and len(r) else None for r in raws], pa.binary()).cast(pa.string())


def _classified(names: list[str], classify) -> dict[str, pa.Array]:
    # Classify each distinct name once; traces repeat a few thousand names hundreds of thousands of times.
    table = {n: classify(n) for n in set(names)}
    return {
        "klass": pa.array([table[n].klass for n in names], pa.string()),
        "family": pa.array([table[n].family for n in names], pa.string()),
        "collective_op": pa.array([table[n].collective_op for n in names], pa.string()),
    }


def _base(evs: list[_Event], rank: int) -> dict[str, Any]:
    ts = _ns_of(evs)
    return {
        "rank": pa.array(np.full(len(evs), rank, dtype=np.int32)),
        "name": _str_column([e.name if e.name is not None else "" for e in evs]),
        "ts_ns": pa.array(ts),
        "dur_ns": pa.array(_dur_ns([e.dur for e in evs])),
    }


def _gpu_columns(evs: list[_Event]) -> dict[str, pa.Array]:
    args = [e.args for e in evs]
    return {
        "device": pa.array(
            [_to_int(a.device) if a and a.device is not None else _to_int(e.pid) for e, a in zip(evs, args)],
            pa.int32(),
        ),
        "stream": pa.array(
            [_to_int(a.stream) if a and a.stream is not None else _to_int(e.tid) for e, a in zip(evs, args)],
            pa.int64(),
        ),
        "correlation": pa.array([_to_int(a.correlation) if a else None for a in args], pa.int64()),
        "external_id": pa.array([_to_int(a.external_id) if a else None for a in args], pa.int64()),
    }


def _host_columns(evs: list[_Event]) -> dict[str, pa.Array]:
    return {
        "pid": _str_column([e.pid for e in evs]),
        "tid": _str_column([e.tid for e in evs]),
    }


def parse_kineto(path: str | Path, order: int = 0, options: IngestOptions | None = None) -> Parsed:
    """Parse one Kineto trace file. Raises InputError naming the file on any problem."""
    p = Path(path)
    keep_python = (options or IngestOptions()).keep_python
    data = read_bytes(p)
    try:
        events, top = _decode(p, data)
        if _needs_exact_ts(events):
            _attach_exact_ts(data, events)
        return _build(p, order, events, top, keep_python)
    finally:
        if isinstance(data, mmap.mmap):
            # msgspec.Raw values point into the map; they were converted to str in _build.
            with contextlib.suppress(BufferError):
                data.close()


def _build(p: Path, order: int, events: list[_Event], top: dict[str, Any], keep_python: bool) -> Parsed:
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
        raise InputError(p, f"trace has no duration events (only {len(events)} metadata/instant events)")

    dist = top.get("distributedInfo")
    rank, rank_source = _pick_rank(p, dist, order)
    tables: dict[str, pa.Table] = {}

    kern = by_cat.get("kernel", [])
    if kern:
        cols = _base(kern, rank) | _gpu_columns(kern)
        args = [e.args for e in kern]
        cols["grid"] = pa.array([_int_list(a.grid) if a else None for a in args], pa.list_(pa.int32()))
        cols["block"] = pa.array([_int_list(a.block) if a else None for a in args], pa.list_(pa.int32()))
        names = cols["name"].to_pylist()
        cols |= _classified(names, classify_kernel) | _comm_columns(args)
        tables["kernels"] = pa.table(cols)

    mem = [("memcpy", e) for e in by_cat.get("gpu_memcpy", [])] + [("memset", e) for e in by_cat.get("gpu_memset", [])]
    if mem:
        evs = [e for _, e in mem]
        cols = _base(evs, rank) | _gpu_columns(evs)
        cols["kind"] = pa.array([k for k, _ in mem], pa.string())
        cols["bytes"] = pa.array([_to_int(e.args.bytes) if e.args else None for e in evs], pa.int64())
        tables["memops"] = pa.table(cols)

    rt = [(c, e) for c in ("cuda_runtime", "cuda_driver") for e in by_cat.get(c, [])]
    if rt:
        evs = [e for _, e in rt]
        cols = _base(evs, rank) | _host_columns(evs)
        cols["cat"] = pa.array([c for c, _ in rt], pa.string())
        cols["correlation"] = pa.array([_to_int(e.args.correlation) if e.args else None for e in evs], pa.int64())
        cols["external_id"] = pa.array([_to_int(e.args.external_id) if e.args else None for e in evs], pa.int64())
        tables["runtime"] = pa.table(cols)

    ops = by_cat.get("cpu_op", []) + (by_cat.get("python_function", []) if keep_python else [])
    if ops:
        cols = _base(ops, rank) | _host_columns(ops)
        args = [e.args for e in ops]
        cols["external_id"] = pa.array([_to_int(a.external_id) if a else None for a in args], pa.int64())
        cols["input_dims"] = _raw_column([a.input_dims if a else None for a in args])
        cols["input_types"] = _raw_column([a.input_types if a else None for a in args])
        cols |= _classified(cols["name"].to_pylist(), classify_cpu_op) | _comm_columns(args)
        tables["cpu_ops"] = pa.table(cols)

    ann = [
        (src, e)
        for src in ("user_annotation", "gpu_user_annotation", "python_step_marker")
        for e in by_cat.get(src, [])
    ]
    if ann:
        evs = [e for _, e in ann]
        cols = _base(evs, rank) | _host_columns(evs)
        cols["source"] = pa.array(["python_function" if s == "python_step_marker" else s for s, _ in ann], pa.string())
        cols["external_id"] = pa.array([_to_int(e.args.external_id) if e.args else None for e in evs], pa.int64())
        cols["input_dims"] = _raw_column([e.args.input_dims if e.args else None for e in evs])
        cols["input_types"] = _raw_column([e.args.input_types if e.args else None for e in evs])
        cls = _classified(cols["name"].to_pylist(), classify_cpu_op)
        cols["klass"] = cls["klass"]
        cols["collective_op"] = cls["collective_op"]
        tables["annotations"] = pa.table(cols)

    if flows:
        tables["flows"] = pa.table(
            {
                "rank": pa.array(np.full(len(flows), rank, dtype=np.int32)),
                "flow_id": pa.array([_to_int(e.id) for e in flows], pa.int64()),
                "cat": pa.array([_to_str(e.cat) for e in flows], pa.string()),
                "phase": pa.array([e.ph for e in flows], pa.string()),
                "ts_ns": pa.array(_ns_of(flows)),
                "pid": pa.array([_to_str(e.pid) for e in flows], pa.string()),
                "tid": pa.array([_to_str(e.tid) for e in flows], pa.string()),
            }
        )

    starts, ends = [], []
    for name in ("kernels", "memops", "runtime", "cpu_ops", "annotations"):
        t = tables.get(name)
        if t is not None and t.num_rows:
            ts = t.column("ts_ns").to_numpy()
            starts.append(ts.min())
            ends.append((ts + t.column("dur_ns").to_numpy()).max())

    meta = _meta(p, order, rank, rank_source, dist, top.get("deviceProperties"), tables)
    meta |= {
        "trace_start_ns": int(min(starts)) if starts else None,
        "trace_end_ns": int(max(ends)) if ends else None,
        "events_total": len(events),
        "events_python_skipped": py_skipped,
    }
    pgs = []
    if isinstance(dist, dict) and isinstance(dist.get("pg_config"), list):
        for pg in dist["pg_config"]:
            if isinstance(pg, dict):
                pgs.append(
                    {
                        "rank": rank,
                        "pg_name": _to_str(pg.get("pg_name")),
                        "pg_desc": _to_str(pg.get("pg_desc")),
                        "backend_config": _to_str(pg.get("backend_config")),
                        "pg_size": _to_int(pg.get("pg_size")),
                        "ranks": _int_list(pg.get("ranks")),
                    }
                )
    return Parsed(path=str(p), format="kineto", inputs_rows=[meta], tables=tables, process_groups=pgs)


def _meta(
    p: Path,
    order: int,
    rank: int,
    rank_source: str,
    dist: Any,
    props: Any,
    tables: dict[str, pa.Table],
) -> dict[str, Any]:
    dist = dist if isinstance(dist, dict) else {}
    device = None
    if "kernels" in tables and tables["kernels"].num_rows:
        devs = [d for d in tables["kernels"].column("device").to_pylist() if d is not None]
        if devs:
            device = max(set(devs), key=devs.count)
    prop = None
    if isinstance(props, list):
        cands = [d for d in props if isinstance(d, dict)]
        prop = next((d for d in cands if d.get("id") == device), cands[0] if cands else None)
    cc = None
    if prop and prop.get("computeMajor") is not None:
        cc = f"{prop.get('computeMajor')}.{prop.get('computeMinor')}"
    return {
        "input_id": order,
        "path": str(p),
        "format": "kineto",
        "profiler": "pytorch-profiler (kineto)",
        "file_bytes": p.stat().st_size,
        "rank": rank,
        "rank_source": rank_source,
        "world_size": _to_int(dist.get("world_size")),
        "backend": _to_str(dist.get("backend")),
        "nccl_version": _to_str(dist.get("nccl_version")),
        "device_name": (prop.get("name") or None) if prop else None,
        "device_total_mem_bytes": _to_int(prop.get("totalGlobalMem")) if prop else None,
        "device_num_sms": _to_int(prop.get("numSms")) if prop else None,
        "device_compute_capability": cc,
        "distributed_info_json": orjson.dumps(dist).decode() if dist else None,
        "device_properties_json": orjson.dumps(props).decode() if props else None,
    }
