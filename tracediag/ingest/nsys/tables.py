"""The canonical Arrow tables: the columns each table stores, every value its column cannot hold NULL and
counted, pid/tid as Kineto writes them, names classified by the catalogue as for Kineto.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from tracediag.catalog import classify_cpu_op, classify_kernel
from tracediag.ingest import validate as val
from tracediag.ingest.nsys.ranges import _NVTX_COLUMNS
from tracediag.ingest.validate import BadRecords

# columns each table stores (the store's schema; store/schema.sql and store/schema_nsys.sql)
_KEEP = {
    "kernels": {"rank", "name", "ts_ns", "dur_ns", "device", "stream", "correlation", "external_id", "grid", "block",
                "klass", "family", "collective_op"},
    "memops": {"rank", "kind", "name", "ts_ns", "dur_ns", "device", "stream", "correlation", "external_id", "bytes"},
    "gpu_sync": {"rank", "name", "ts_ns", "dur_ns", "device", "stream", "correlation", "event_id"},
    "runtime": {"rank", "cat", "name", "ts_ns", "dur_ns", "correlation", "external_id"},
    "cpu_ops": {"rank", "name", "ts_ns", "dur_ns", "external_id", "input_dims", "klass", "family", "collective_op"},
    "annotations": {"rank", "name", "source", "ts_ns", "dur_ns", "klass", "collective_op"},
    "nvtx_events": set(_NVTX_COLUMNS),
}  # fmt: skip


def _classified(names: list[str], classify) -> dict[str, list]:
    # Same as the Kineto ingester: classify each distinct name once.
    table = {n: classify(n) for n in set(names)}
    return {
        "klass": [table[n].klass for n in names],
        "family": [table[n].family for n in names],
        "collective_op": [table[n].collective_op for n in names],
    }


_INT_COLS = {"ts_ns", "dur_ns", "stream", "correlation", "external_id", "bytes", "event_id", "domain_id", "color",
             "torch_seq", "torch_op_id", "message_bytes"}  # fmt: skip
_INT32_COLS = {"rank", "device", "category", "peer", "root", "nranks", "nccl_rank", "cuda_device"}
_DROP = {"pid", "gtid", "end_gtid"}  # replaced by the pid/tid/end_tid strings below


def _to_arrow(table: str, cols: dict[str, list], bad: BadRecords) -> pa.Table:
    """Columns -> Arrow; any value its column cannot hold (out of range, wrongly typed) is NULL and counted."""
    chk = val.Checker(bad, table)
    out: dict[str, pa.Array] = {}
    for name, values in cols.items():
        if name in _DROP or name not in _KEEP[table]:
            continue
        if name in ("grid", "block"):
            out[name] = chk.int_lists(name, values)
        elif name in _INT_COLS:
            out[name] = chk.ints(name, values, pa.int64())
        elif name in _INT32_COLS:
            out[name] = chk.ints(name, values, pa.int32())
        else:
            out[name] = chk.strs(name, values)
    if "gtid" in cols:  # host events: pid/tid as Kineto writes them (numbers as text)
        g = pa.array(cols["gtid"], pa.int64())
        out["pid"] = pc.bit_wise_and(pc.shift_right(g, 24), 0xFFFFFF).cast(pa.string())  # see pid_of
        out["tid"] = pc.bit_wise_and(g, 0xFFFFFF).cast(pa.string())
    if "end_gtid" in cols:
        out["end_tid"] = pc.bit_wise_and(pa.array(cols["end_gtid"], pa.int64()), 0xFFFFFF).cast(pa.string())
    classify = {"kernels": classify_kernel, "cpu_ops": classify_cpu_op, "annotations": classify_cpu_op}.get(table)
    if classify is not None:
        for name, values in _classified(cols["name"], classify).items():
            if name in _KEEP[table]:
                out[name] = pa.array(values, pa.string())
    return pa.table(out)
