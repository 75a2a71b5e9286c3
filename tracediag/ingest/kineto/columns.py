"""Kineto events -> table columns, and the tables, each declared once (`TABLES`): the event categories its rows come
from, in row order, and its column builders, in column order. `build_tables` is the one loop that builds every
table of a chunk from its timed events (timestamps._timed).

A column builder takes a table's rows (`_Rows`: its sources' events, ts and dur joined, their args, the checker that
counts the table's bad values, the columns built so far and the file's state) and returns columns by name; the
checks run in builder order, which is the order bad records are reported in.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import operator
from collections.abc import Callable, Iterator
from typing import Any

import msgspec
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from tracediag.catalog import classify_cpu_op, classify_kernel
from tracediag.ingest import validate as val
from tracediag.ingest.kineto.events import _Args, _Event, _get_args, _get_cat, _get_name, _get_pid, _get_tid

_NO_ARGS = _Args()


def _int64(a: np.ndarray) -> pa.Array:
    """numpy int64/int32 -> Arrow without a copy (and without pyarrow's pandas shim, which `pa.array(ndarray)`
    imports: ~0.4 s per process)."""
    a = np.ascontiguousarray(a)
    typ = pa.int32() if a.dtype == np.int32 else pa.int64()
    return pa.Array.from_buffers(typ, len(a), [None, pa.py_buffer(a)])


def _args_of(evs: list[_Event]) -> list[_Args]:
    """The events' args, an empty _Args where an event has none (so attribute getters need no None test)."""
    args = list(map(_get_args, evs))
    if None in args:
        args = [a if a is not None else _NO_ARGS for a in args]
    return args


_COMM_FIELDS = ("coll_name", "in_nelems", "in_size_old", "dtype", "group_size", "pg_name", "pg_id_old", "seq",
                "out_nelems", "out_size_old", "pg_desc", "pg_ranks")  # fmt: skip
_get_comm = operator.attrgetter(*_COMM_FIELDS)
_NO_COMM = (None,) * len(_COMM_FIELDS)


def _pg_ranks(x: Any) -> Any:
    # "Process Group Ranks" is text ("[0, 1]"); a list of ints is kept as its JSON text
    if type(x) is list and not val.is_bad(val.int_list(x)):
        return orjson.dumps(x).decode()
    return x


_COMM_TYPES = {"coll_name": pa.string(), "in_nelems": pa.int64(), "out_nelems": pa.int64(), "group_size": pa.int32(),
               "dtype": pa.string(), "pg_name": pa.string(), "pg_desc": pa.string(), "pg_ranks": pa.string(),
               "seq": pa.int64()}  # fmt: skip


def _comm_columns(args: list[_Args], chk: val.Checker) -> dict[str, pa.Array]:
    """Collective metadata columns; only the few events that carry any of it are visited per field."""
    n = len(args)
    # one C-level pass: the comm fields of every event as a tuple, compared with all-None
    idx = list(itertools.compress(range(n), map(_NO_COMM.__ne__, map(_get_comm, args))))

    def raw(getter) -> list[Any]:
        values = [None] * n
        for i in idx:
            values[i] = getter(args[i])
        return values

    if not idx:
        return {k: pa.nulls(n, t) for k, t in _COMM_TYPES.items()}
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


def _raw_column(raws: list[msgspec.Raw], name: str, chk: val.Checker) -> pa.Array:
    """Verbatim JSON fragments (Input Dims, Input type) -> string column (empty: NULL); invalid UTF-8 is NULL
    and counted. Built from one joined buffer and an offsets array (no bytes object per event)."""
    n = len(raws)
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=n)
    offsets = np.zeros(n + 1, dtype=np.int32 if lengths.sum() < 2**31 else np.int64)
    np.cumsum(lengths, out=offsets[1:])
    present = lengths > 0
    validity = None if present.all() else pa.array(present).buffers()[1]
    typ = pa.binary() if offsets.dtype == np.int32 else pa.large_binary()
    arr = pa.Array.from_buffers(typ, n, [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(raws))])
    try:
        return arr.cast(pa.string())
    except pa.ArrowInvalid:
        return chk.raw_text(name, [bytes(r) if len(r) else None for r in raws])


class _Classes:
    """Name -> catalog class, each distinct name classified once per file (traces repeat a few thousand
    names hundreds of thousands of times), applied to a column with Arrow `index_in` + `take`."""

    def __init__(self, classify) -> None:
        self.classify = classify
        self.cache: dict[str, Any] = {}

    def columns(self, names: pa.Array) -> dict[str, pa.Array]:
        uniq = pc.unique(names)
        keys = uniq.to_pylist()
        cache, classify = self.cache, self.classify
        cls = [cache[k] if k in cache else cache.setdefault(k, classify(k)) for k in keys]
        at = pc.index_in(names, value_set=uniq)
        return {
            "klass": pc.take(pa.array([c.klass for c in cls], pa.string()), at),
            "family": pc.take(pa.array([c.family for c in cls], pa.string()), at),
            "collective_op": pc.take(pa.array([c.collective_op for c in cls], pa.string()), at),
        }


class FileColumns:
    """What the columns of one file share across its chunks: the catalog classes of the names seen so far and the
    correlation ids of the runtime calls so far (_one_call_per_correlation)."""

    def __init__(self) -> None:
        self.kernel_classes = _Classes(classify_kernel)
        self.op_classes = _Classes(classify_cpu_op)
        self.runtime_correlations: set[int] = set()

    def one_call_per_correlation(self, corr: list[int | None], chk: val.Checker) -> list[int | None]:
        """The runtime calls' correlation ids with each id kept by its first call only: every derivation joins
        kernels to their launching call on it, so an id shared by n calls and m kernels makes n × m rows (a trace
        whose calls all share one id took 2.4 GB and 21 s instead of 0.2 GB and 3 s). A call that reuses an id
        gets NULL, a bad record. Checked in C (sets) unless an id repeats."""
        seen = self.runtime_correlations
        ids = list(filter(functools.partial(operator.is_not, None), corr))
        fresh = set(ids)
        if len(fresh) == len(ids) and seen.isdisjoint(fresh):
            seen |= fresh
            return corr
        reused = []
        for i, c in enumerate(corr):
            if c is None:
                continue
            if c in seen:
                reused.append(i)
            else:
                seen.add(c)
        chk.bad.nulled(
            chk.table, "args.correlation", reused, [corr[i] for i in reused], "shared with an earlier call: set to NULL"
        )
        out = list(corr)
        for i in reused:
            out[i] = None
        return out


# one source's timed events: (category, events, ts ns, dur ns)
Part = tuple[str, list[_Event], np.ndarray, np.ndarray]


class _Rows:
    """The rows of one table in one chunk: its sources' timed events joined in row order (first source first), and
    what the column builders share: the table's checker, the columns built so far, the file's FileColumns."""

    def __init__(self, parts: list[Part], chk: val.Checker, file: FileColumns) -> None:
        self.parts = parts
        self.evs = parts[0][1] if len(parts) == 1 else [e for part in parts for e in part[1]]
        self.ts = np.concatenate([part[2] for part in parts])
        self.dur = np.concatenate([part[3] for part in parts])
        self.chk = chk
        self.file = file
        self.cols: dict[str, pa.Array] = {}

    @functools.cached_property
    def args(self) -> list[_Args]:
        return _args_of(self.evs)

    def arg(self, field: str) -> list[Any]:
        return list(map(operator.attrgetter(field), self.args))


Column = Callable[[_Rows], dict[str, pa.Array]]


def _base(r: _Rows) -> dict[str, pa.Array]:
    """name, ts_ns, dur_ns of events that went through _timed (rank is added once the file is read). A negative
    duration, stored as 0, is a bad record of the row."""
    evs, chk = r.evs, r.chk
    zero = np.flatnonzero(r.dur == 0)
    if len(zero):
        neg = [i for i in zero.tolist() if val.negative_duration(evs[i].dur)]
        chk.bad.nulled(chk.table, "dur", neg, [evs[i].dur for i in neg], "negative duration set to 0, record kept")
    return {
        "name": pc.fill_null(chk.strs("name", list(map(_get_name, evs))), ""),
        "ts_ns": _int64(r.ts),
        "dur_ns": _int64(r.dur),
    }


def _gpu(r: _Rows) -> dict[str, pa.Array]:
    """device, stream (args.device / args.stream when the event has them, else Kineto's pid and tid), correlation,
    external_id."""
    evs, chk = r.evs, r.chk
    i32 = (-(2**31), val.INT32_MAX)
    dev_raw = r.arg("device")
    stream_raw = r.arg("stream")
    dev = chk.int_values("args.device", dev_raw, *i32)
    stream = chk.int_values("args.stream", stream_raw, -val.ID_MAX - 1, val.ID_MAX)
    return {
        "device": pa.array(
            [d if raw is not None else val.int_or_none(e.pid, *i32) for d, raw, e in zip(dev, dev_raw, evs)],
            pa.int32(),
        ),
        "stream": pa.array(
            [s if raw is not None else val.int_or_none(e.tid) for s, raw, e in zip(stream, stream_raw, evs)],
            pa.int64(),
        ),
        "correlation": chk.ints("args.correlation", r.arg("correlation"), pa.int64()),
        "external_id": chk.ints("args.External id", r.arg("external_id"), pa.int64()),
    }


def _host(r: _Rows) -> dict[str, pa.Array]:
    return {
        "pid": r.chk.strs("pid", list(map(_get_pid, r.evs))),
        "tid": r.chk.strs("tid", list(map(_get_tid, r.evs))),
    }


def _arg_ints(
    column: str, name: str, field: str, typ: pa.DataType, lo: int | None = None, hi: int | None = None
) -> Column:
    """The column of an integer arg (`name` as Kineto writes it, `field` as _Args holds it)."""
    return lambda r: {column: r.chk.ints(name, r.arg(field), typ, lo, hi)}


def _arg_int_lists(column: str, name: str, field: str) -> Column:
    return lambda r: {column: r.chk.int_lists(name, r.arg(field))}


def _arg_text(column: str, name: str, field: str) -> Column:
    """The column of a verbatim JSON arg (Input Dims, Input type)."""
    return lambda r: {column: _raw_column(r.arg(field), name, r.chk)}


def _source(column: str, values: dict[str, str] | None = None) -> Column:
    """The column of each row's source category, as `values` names it (else as it is)."""

    def build(r: _Rows) -> dict[str, pa.Array]:
        names = [values.get(s, s) if values else s for s, _, _, _ in r.parts]
        reps = (itertools.repeat(name, len(evs)) for name, (_, evs, _, _) in zip(names, r.parts))
        return {column: pa.array(list(itertools.chain.from_iterable(reps)), pa.string())}

    return build


def _classes(which: str, *keep: str) -> Column:
    """The catalog's class columns of the rows' names (kernel or op names; `keep`: only those columns)."""

    def build(r: _Rows) -> dict[str, pa.Array]:
        cls = (r.file.kernel_classes if which == "kernel" else r.file.op_classes).columns(r.cols["name"])
        return {k: cls[k] for k in keep} if keep else cls

    return build


def _comm(r: _Rows) -> dict[str, pa.Array]:
    return _comm_columns(r.args, r.chk)


def _runtime_correlation(r: _Rows) -> dict[str, pa.Array]:
    corr = r.chk.int_values("args.correlation", r.arg("correlation"), -val.ID_MAX - 1, val.ID_MAX)
    return {"correlation": pa.array(r.file.one_call_per_correlation(corr, r.chk), pa.int64())}


def _flow_id(r: _Rows) -> dict[str, pa.Array]:
    return {"flow_id": r.chk.ints("id", [e.id for e in r.evs], pa.int64())}


def _flow_point(r: _Rows) -> dict[str, pa.Array]:
    """cat, phase ('s' start, 'f' finish) and ts_ns of a flow event (it has no duration)."""
    return {
        "cat": r.chk.strs("cat", list(map(_get_cat, r.evs))),
        "phase": pa.array([e.ph for e in r.evs], pa.string()),
        "ts_ns": _int64(r.ts),
    }


@dataclasses.dataclass(frozen=True)
class Table:
    """A table of a Kineto trace: the event categories its rows come from (all rows of the first, then of the
    next...) and its column builders, in column order."""

    name: str
    sources: tuple[str, ...]
    columns: tuple[Column, ...]


_EXTERNAL_ID = _arg_ints("external_id", "args.External id", "external_id", pa.int64())
_INPUTS = (_arg_text("input_dims", "args.Input Dims", "input_dims"),
           _arg_text("input_types", "args.Input type", "input_types"))  # fmt: skip

TABLES = (
    Table("kernels", ("kernel",),
          (_base, _gpu, _arg_int_lists("grid", "args.grid", "grid"), _arg_int_lists("block", "args.block", "block"),
           _classes("kernel"), _comm)),
    Table("memops", ("gpu_memcpy", "gpu_memset"),
          (_base, _gpu, _source("kind", {"gpu_memcpy": "memcpy", "gpu_memset": "memset"}),
           _arg_ints("bytes", "args.bytes", "bytes", pa.int64(), 0, val.COUNT_MAX))),
    Table("runtime", ("cuda_runtime", "cuda_driver"),
          (_base, _host, _source("cat"), _runtime_correlation, _EXTERNAL_ID)),
    Table("cpu_ops", ("cpu_op", "python_function"),
          (_base, _host, _EXTERNAL_ID, *_INPUTS, _classes("op"), _comm)),
    Table("annotations", ("user_annotation", "gpu_user_annotation", "python_step_marker"),
          (_base, _host, _source("source", {"python_step_marker": "python_function"}), _EXTERNAL_ID, *_INPUTS,
           _classes("op", "klass", "collective_op"))),
    Table("flows", ("flows",),
          (_flow_id, _flow_point, _host)),
)  # fmt: skip

# table -> its sources in row order; event category -> its table (events of other categories are not stored)
SOURCES = {t.name: t.sources for t in TABLES}
TABLE_OF = {src: t.name for t in TABLES for src in t.sources}
# the categories of PyTorch 1.8's first Kineto traces (libkineto's ChromeTraceLogger then wrote "Operator", "Kernel",
# "Runtime", "Memcpy", "Memset"; the tensorboard plugin's tests hold them), read as the categories that replaced them
OLD_CATEGORY = {"Kernel": "kernel", "Operator": "cpu_op", "Runtime": "cuda_runtime", "Memcpy": "gpu_memcpy",
                "Memset": "gpu_memset", "Python": "python_function"}  # fmt: skip


def build_tables(timed: dict[str, tuple[list[_Event], np.ndarray, np.ndarray]], bad: val.BadRecords,
                 file: FileColumns) -> Iterator[tuple[list[Part], pa.Table]]:  # fmt: skip
    """Every table of a chunk that has rows: (its parts, the table), from the chunk's timed events by category;
    its bad values are counted in `bad` (rows numbered within the chunk's rows of the table)."""
    for table in TABLES:
        parts = [(s, *timed[s]) for s in table.sources if s in timed and len(timed[s][0])]
        if not parts:
            continue
        r = _Rows(parts, val.Checker(bad, table.name), file)
        for column in table.columns:
            r.cols |= column(r)
        yield parts, pa.table(r.cols)
