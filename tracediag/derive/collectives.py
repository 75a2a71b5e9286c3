"""The `collectives` table: one row per collective call, from the SQL that finds the calls (collective_calls.sql)
and the Python that reads their sizes and element types from the JSON dims and dtype spellings, then
collectives_finish.sql. Its own module so that reading a store (views only) does not import pyarrow."""

from __future__ import annotations

import math

import duckdb
import orjson
import pyarrow as pa

from tracediag.catalog import normalize_collective_name
from tracediag.model.dtypes import canonical_dtype, element_size
from tracediag.store import run_sql_file

# The derivation's declaration (tracediag/derive/__init__.py reads it from this source).
REQUIRES = ("kernels", "cpu_ops", "runtime", "kernels.klass", "cpu_ops.klass", "annotations", "steps", "steps.T")
PROVIDES = ("collectives", "step_collectives")
# collective_calls.sql's temporary tables, read by this module
SCRATCH = (
    "coll_cand",
    "coll_outer",
    "coll_kern",
    "coll_calls",
    "coll_meta",
    "coll_gpu",
    "coll_dispatch",
    "coll_detached",
    "coll_pair",
)

COLLECTIVES_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),  # global rank
        ("call_id", pa.int64()),  # per-rank ordinal of the call, by host start
        ("step_id", pa.int32()),  # engine step (steps.step_id), NULL when outside every step
        ("op", pa.string()),  # all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send, recv, ...
        ("call_name", pa.string()),  # outermost event of the call (c10d::allreduce_, kernel name, ...)
        ("kernel_name", pa.string()),  # GPU kernel of the call, NULL on CPU-only (gloo) traces
        ("evidence", pa.string()),  # where the payload came from
        ("dtype", pa.string()),  # canonical element type (bf16, fp32, ...)
        ("element_bytes", pa.int32()),  # bytes per element
        ("elements", pa.int64()),  # elements in this rank's input buffer
        ("payload_bytes", pa.int64()),  # elements x element_bytes: this rank's input bytes
        ("out_elements", pa.int64()),  # elements in the output buffer (all_gather: p x input)
        ("group_size", pa.int32()),  # ranks in the process group
        ("pg_name", pa.string()),
        ("pg_desc", pa.string()),
        ("pg_ranks", pa.string()),
        ("seq", pa.int64()),  # per-process-group sequence number when the profiler recorded it
        ("cpu_ts_ns", pa.int64()),  # host start of the call, ns
        ("cpu_dur_ns", pa.int64()),  # host duration of the call, ns
        ("gpu_ts_ns", pa.int64()),  # first kernel start, ns
        ("gpu_dur_ns", pa.int64()),  # first kernel start to last kernel end, ns
        ("exec_name", pa.string()),  # backend worker range that did the work (gloo:all_reduce), if any
        ("exec_ts_ns", pa.int64()),  # its start, ns (host clock)
        ("exec_dur_ns", pa.int64()),  # its duration, ns
        ("ts_ns", pa.int64()),  # start of the work: kernel, else backend worker range, else host call
        ("dur_ns", pa.int64()),  # duration of the work, same precedence
        ("anchor_ts_ns", pa.int64()),  # host time used to place the call in a step
        ("exec_op", pa.string()),  # the collective the backend ran for it (gloo: reduce_scatter -> all_reduce)
        ("in_width", pa.int64()),  # last dimension of the input tensor (H for a [T, H] activation), when recorded
    ]
)


def _json_args(args_json: str | None) -> list:
    """The arguments of a Kineto 'Input Dims' or 'Input type' value; [] when there is none or it is not a JSON
    list."""
    if not args_json:
        return []
    try:
        args = orjson.loads(args_json)
    except orjson.JSONDecodeError:
        return []
    return args if isinstance(args, list) else []


def _first_tensor_elements(dims_json: str | None) -> int | None:
    """Elements of the first tensor (or tensor list) argument in Kineto 'Input Dims'."""
    for arg in _json_args(dims_json):
        if isinstance(arg, list) and arg and all(isinstance(x, int) for x in arg):
            return math.prod(arg)
        if isinstance(arg, list) and arg and all(isinstance(x, list) for x in arg):  # TensorList
            tensors = [t for t in arg if t and all(isinstance(x, int) for x in t)]
            if tensors:
                return sum(math.prod(t) for t in tensors)
    return None


def _first_tensor_width(dims_json: str | None) -> int | None:
    """Last dimension of the first tensor argument in Kineto 'Input Dims' (first tensor of a TensorList)."""
    for arg in _json_args(dims_json):
        if isinstance(arg, list) and arg and all(isinstance(x, int) for x in arg):
            return arg[-1]
        if (
            isinstance(arg, list)
            and arg
            and isinstance(arg[0], list)
            and arg[0]
            and all(isinstance(x, int) for x in arg[0])
        ):
            return arg[0][-1]
    return None


def _first_tensor_type(types_json: str | None) -> str | None:
    for t in _json_args(types_json):
        if isinstance(t, str) and canonical_dtype(t):
            return t
    return None


def _evidence(in_nelems: int | None, has_param_comms: bool | None, elements: int | None) -> str:
    if in_nelems is not None and has_param_comms:
        return "record_param_comms args"
    if in_nelems is not None:
        return "collective kernel args"
    if elements is not None:
        return "op input shapes"
    return "not recorded"


# columns of collectives copied from coll_calls as they are (collectives name: coll_calls name)
_PASSED = {
    "rank": "rank", "call_name": "call_name", "kernel_name": "kernel_name", "out_elements": "out_nelems",
    "group_size": "group_size", "pg_name": "pg_name", "pg_desc": "pg_desc", "pg_ranks": "pg_ranks", "seq": "seq",
    "cpu_ts_ns": "cpu_ts_ns", "cpu_dur_ns": "cpu_dur_ns", "gpu_ts_ns": "gpu_ts_ns", "gpu_dur_ns": "gpu_dur_ns",
    "exec_name": "exec_name", "exec_ts_ns": "exec_ts_ns", "exec_dur_ns": "exec_dur_ns", "anchor_ts_ns": "anchor_ts_ns",
}  # fmt: skip


def build(con: duckdb.DuckDBPyConnection) -> None:
    run_sql_file(con, "tracediag.derive", "collective_calls.sql")
    cur = con.execute("SELECT * FROM coll_calls ORDER BY rank, anchor_ts_ns")
    names = [d[0] for d in cur.description]
    rows = cur.fetchall()
    c = dict(zip(names, map(list, zip(*rows)), strict=True)) if rows else {n: [] for n in names}
    out: dict[str, list] = {f.name: [] for f in COLLECTIVES_SCHEMA}
    for name, source in _PASSED.items():
        out[name] = c[source]
    out["step_id"] = [None] * len(rows)
    # calls of a run share a few shapes, types and names: each distinct string is decoded once
    types: dict[str | None, str | None] = {}
    dtypes: dict[str | None, tuple[str | None, int | None]] = {}
    dims: dict[str | None, tuple[int | None, int | None]] = {}
    ops: dict[str, str] = {}
    call_no: dict[int, int] = {}
    for i in range(len(rows)):
        dtype_raw = c["dtype"][i]
        if not dtype_raw:
            t = c["input_types"][i]
            if t not in types:
                types[t] = _first_tensor_type(t)
            dtype_raw = types[t]
        if dtype_raw not in dtypes:
            dtypes[dtype_raw] = (canonical_dtype(dtype_raw), element_size(dtype_raw))
        dtype, esize = dtypes[dtype_raw]
        d = c["input_dims"][i]
        if d not in dims:
            dims[d] = (_first_tensor_elements(d), _first_tensor_width(d))
        in_nelems = c["in_nelems"][i]
        elements = in_nelems if in_nelems is not None else dims[d][0]
        op = c["op"][i]
        coll_name = c["coll_name"][i]
        if (op is None or op == "unknown") and coll_name:
            if coll_name not in ops:
                ops[coll_name] = normalize_collective_name(coll_name)
            op = ops[coll_name]
        if c["gpu_ts_ns"][i] is not None:
            ts, dur = c["gpu_ts_ns"][i], c["gpu_dur_ns"][i]
        elif c["exec_ts_ns"][i] is not None:
            ts, dur = c["exec_ts_ns"][i], c["exec_dur_ns"][i]
        else:
            ts, dur = c["cpu_ts_ns"][i], c["cpu_dur_ns"][i]
        rank = c["rank"][i]
        call_no[rank] = call_no.get(rank, -1) + 1
        exec_op = c["exec_op"][i]
        out["call_id"].append(call_no[rank])
        out["op"].append(op or "unknown")
        out["evidence"].append(_evidence(in_nelems, c["has_param_comms"][i], elements))
        out["dtype"].append(dtype)
        out["element_bytes"].append(esize)
        out["elements"].append(elements)
        out["payload_bytes"].append(elements * esize if elements is not None and esize else None)
        out["ts_ns"].append(ts)
        out["dur_ns"].append(dur)
        out["exec_op"].append(exec_op if exec_op not in (None, "unknown") else op or "unknown")
        out["in_width"].append(dims[d][1])
    table = pa.table(out, schema=COLLECTIVES_SCHEMA)
    con.register("_collectives_in", table)
    con.execute("CREATE OR REPLACE TABLE collectives AS SELECT * FROM _collectives_in")
    con.unregister("_collectives_in")
    run_sql_file(con, "tracediag.derive", "collectives_finish.sql")
