"""GPU activity and the CUDA API: CUPTI_ACTIVITY_KIND_KERNEL / _MEMCPY / _MEMSET read and turned into the kernels
and memops tables, _SYNCHRONIZATION into gpu_sync, _RUNTIME into runtime (named and categorised as Kineto does,
one call per correlation id), each row on the rank of its GPU work.
"""

from __future__ import annotations

import re
from collections import Counter

from tracediag.ingest.nsys.export import (
    _ANY_INT,
    _DUR,
    _INT32,
    _TS,
    _columns,
    _dur_sql,
    _Export,
    _keep_host,
    _pid_sql,
    _valid_rows,
)

_CUPTI_VERSION_SUFFIX = re.compile(r"_v\d{4,}$")  # cudaLaunchKernel_v7000 -> cudaLaunchKernel

# Kineto's names (libkineto cupti_strings.cpp memcpyKindString; CUPTI copyKind ids, = ENUM_CUDA_MEMCPY_OPER;
# 11-13 are nsys's unified-memory copies, which CUPTI's memcpy records do not have)
_MEMCPY_KIND = {1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD", 7: "DtoA", 8: "DtoD", 9: "HtoH",
                10: "PtoP", 11: "HtoD", 12: "DtoH", 13: "DtoD"}  # fmt: skip
# ENUM_CUDA_MEM_KIND of the 2023.2 and 2026 exports (used when the export lacks the enum table); the labels
# are the strings Kineto writes for the same kinds.
_MEM_KIND = {0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
             6: "Managed Static", 7: "Unknown"}  # fmt: skip
# CUpti_ActivitySynchronizationType (= ENUM_CUPTI_SYNC_TYPE) -> Kineto cuda_sync names
_SYNC_KIND = {0: "Unknown", 1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync", 4: "Context Sync"}


def _read_gpu(ex: _Export) -> tuple[dict[str, list], dict[str, list], dict[str, list]]:
    """Kernels, memcpys and memsets as columns; pid decoded and duration computed in SQL."""
    k, m, s = "CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"
    dims = ("gx", "gy", "gz", "bx", "by", "bz")
    knames = ("pid", "device", "ts_ns", "dur_ns", "stream", "correlation", "dname", "sname", *dims)
    kern = {n: [] for n in knames}
    if k in ex.tables:
        c = ex.cols(k)
        join = (" LEFT JOIN StringIds d ON d.id = k.demangledName" if "demangledName" in c else "") + (
            " LEFT JOIN StringIds s ON s.id = k.shortName" if "shortName" in c else ""
        )
        cols = ", ".join(ex.col(k, "k", n) for n in ("gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ"))
        kern = _columns(
            ex,
            f"SELECT {_pid_sql('k', 'globalPid')}, k.deviceId, k.start, {_dur_sql('k')}, "
            f"{ex.col(k, 'k', 'streamId')}, {ex.col(k, 'k', 'correlationId')}, "
            f"{'d.value' if 'demangledName' in c else 'NULL'}, {'s.value' if 'shortName' in c else 'NULL'}, {cols} "
            f"FROM {k} k{join} ORDER BY k.start",
            knames,
        )
    mnames = ("pid", "device", "ts_ns", "dur_ns", "stream", "correlation", "bytes", "copy_kind", "src", "dst")
    mcpy = {n: [] for n in mnames}
    if m in ex.tables:
        mcpy = _columns(
            ex,
            f"SELECT {_pid_sql('m', 'globalPid')}, m.deviceId, m.start, {_dur_sql('m')}, "
            f"{ex.col(m, 'm', 'streamId')}, {ex.col(m, 'm', 'correlationId')}, {ex.col(m, 'm', 'bytes')}, "
            f"{ex.col(m, 'm', 'copyKind')}, {ex.col(m, 'm', 'srcKind')}, {ex.col(m, 'm', 'dstKind')} "
            f"FROM {m} m ORDER BY m.start",
            mnames,
        )
    snames = ("pid", "device", "ts_ns", "dur_ns", "stream", "correlation", "bytes", "mem_kind")
    mset = {n: [] for n in snames}
    if s in ex.tables:
        mset = _columns(
            ex,
            f"SELECT {_pid_sql('m', 'globalPid')}, m.deviceId, m.start, {_dur_sql('m')}, "
            f"{ex.col(s, 'm', 'streamId')}, {ex.col(s, 'm', 'correlationId')}, {ex.col(s, 'm', 'bytes')}, "
            f"{ex.col(s, 'm', 'memKind')} FROM {s} m ORDER BY m.start",
            snames,
        )
    gpu_row = {"ts_ns": ("start", _TS), "dur_ns": ("end", _DUR)}
    key = {"pid": ("globalPid", _ANY_INT), "device": ("deviceId", _INT32)}
    kern = _valid_rows(ex, k, kern, gpu_row, key)
    for name in ("dname", "sname"):
        kern[name] = ex.text_values(k, {"dname": "demangledName", "sname": "shortName"}[name], kern[name])
    mcpy = _valid_rows(ex, m, mcpy, gpu_row, key)
    mset = _valid_rows(ex, s, mset, gpu_row, key)
    return kern, mcpy, mset


def _one_call_per_correlation(ex: _Export, table: str, cols: dict[str, list]) -> None:
    """Give each correlation id of a process to one runtime call, in place: every derivation joins kernels to their
    launching call on it, so an id shared by n calls and m kernels makes n × m rows (an export whose calls all
    share one id took 3 GB from 5 MB). nsys writes a call twice when a second trace layer wraps it (the same name,
    the same id and thread, the second record inside the first): the inner one keeps the id, quietly. Any other
    call that reuses an id (a damaged or edited export) gets NULL, a bad record. `cols` are ordered by start."""
    holder: dict[tuple, int] = {}
    wrappers: list[int] = []
    reused: list[int] = []
    ts, dur, corr, pids, gtid = cols["ts_ns"], cols["dur_ns"], cols["correlation"], cols["pid"], cols["gtid"]
    for i, c in enumerate(corr):
        if type(c) is not int:
            continue
        key = (pids[i], c)
        h = holder.setdefault(key, i)
        if h == i:
            continue
        if gtid[h] == gtid[i] and ts[h] <= ts[i] and ts[i] + dur[i] <= ts[h] + dur[h]:  # the inner call, kept
            wrappers.append(h)
            holder[key] = i
        else:
            reused.append(i)
    if not (wrappers or reused):
        return
    ex.bad.nulled(table, "correlationId", reused, [corr[i] for i in reused], "shared with an earlier call: set to NULL")
    for i in wrappers + reused:
        corr[i] = None


def _runtime_cat(name: str, ecls: int | None, classes: dict[int, str], has_class: bool) -> str:
    if not has_class:
        return "cuda_runtime" if name.startswith("cuda") else "cuda_driver"
    label = (classes.get(ecls) or "").upper()  # ENUM_NSYS_EVENT_CLASS: TRACE_PROCESS_EVENT_CUDA_DRIVER = 1
    return "cuda_driver" if "DRIVER" in label or (not label and ecls == 1) else "cuda_runtime"


def _gpu_activity(
    ex: _Export,
    kern: dict[str, list],
    mcpy: dict[str, list],
    mset: dict[str, list],
    urank: dict[tuple[int | None, int | None], int],
) -> tuple[dict[str, dict[str, list]], dict[tuple[int | None, int], int]]:
    """The kernels and memops tables, and the rank of the GPU work of each (pid, correlation)."""
    out: dict[str, dict[str, list]] = {}
    corr_rank: dict[tuple[int | None, int], int] = {}  # (pid, correlation) -> rank of its GPU work
    mem_kind = ex.enum("ENUM_CUDA_MEM_KIND", _MEM_KIND)
    memops: list[dict[str, list]] = []
    if kern["ts_ns"]:
        rank = [urank[key] for key in zip(kern["pid"], kern["device"])]
        dims = [kern[n] for n in ("gx", "gy", "gz", "bx", "by", "bz")]
        out["kernels"] = {
            "rank": rank,
            "name": [d or s or "" for d, s in zip(kern["dname"], kern["sname"])],
            "grid": [[x, y, z] if None not in (x, y, z) else None for x, y, z in zip(*dims[:3])],
            "block": [[x, y, z] if None not in (x, y, z) else None for x, y, z in zip(*dims[3:])],
        } | {n: kern[n] for n in ("ts_ns", "dur_ns", "device", "stream", "correlation")}
    if mcpy["ts_ns"]:
        triples = list(zip(mcpy["copy_kind"], mcpy["src"], mcpy["dst"]))
        label = {
            t: f"Memcpy {_MEMCPY_KIND.get(t[0], 'Unknown')} ({mem_kind.get(t[1], 'Unknown')} -> "
            f"{mem_kind.get(t[2], 'Unknown')})"
            for t in set(triples)
        }
        memops.append({"kind": ["memcpy"] * len(triples), "name": [label[t] for t in triples]} | mcpy)
    if mset["ts_ns"]:
        n = len(mset["ts_ns"])
        memops.append(
            {"kind": ["memset"] * n, "name": [f"Memset ({mem_kind.get(k, 'Unknown')})" for k in mset["mem_kind"]]}
            | mset
        )
    if memops:
        cols = {
            c: [v for m in memops for v in m[c]]
            for c in ("kind", "name", "pid", "device", "ts_ns", "dur_ns", "stream", "correlation", "bytes")
        }
        out["memops"] = cols | {"rank": [urank[key] for key in zip(cols["pid"], cols["device"])]}
    for table, pids in (("kernels", kern["pid"]), ("memops", out.get("memops", {}).get("pid", []))):
        if table in out:
            cols = out[table]
            corr_rank.update(((p, c), r) for p, c, r in zip(pids, cols["correlation"], cols["rank"]) if c is not None)
    return out, corr_rank


def _gpu_sync(
    ex: _Export,
    out: dict[str, dict[str, list]],
    corr_rank: dict[tuple[int | None, int], int],
    urank: dict[tuple[int | None, int | None], int],
    prank: dict[int | None, int],
    dropped: Counter,
) -> None:
    """out["gpu_sync"]: the synchronization records, on the rank of their GPU work (else their device's)."""
    sync = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
    if sync not in ex.tables:
        return
    cols = _columns(
        ex,
        f"SELECT {_pid_sql('s', 'globalPid')}, s.deviceId, s.start, {_dur_sql('s')}, "
        f"{ex.col(sync, 's', 'streamId')}, {ex.col(sync, 's', 'correlationId')}, "
        f"{ex.col(sync, 's', 'syncType')}, {ex.col(sync, 's', 'eventId')} FROM {sync} s ORDER BY s.start",
        ("pid", "device", "ts_ns", "dur_ns", "stream", "correlation", "kind", "event_id"),
    )
    cols = _valid_rows(
        ex,
        sync,
        cols,
        {"ts_ns": ("start", _TS), "dur_ns": ("end", _DUR)},
        {"pid": ("globalPid", _ANY_INT), "device": ("deviceId", _INT32)},
    )
    rank = [
        r if (r := corr_rank.get((p, c))) is not None else urank.get((p, d), prank.get(p))
        for p, d, c in zip(cols["pid"], cols["device"], cols["correlation"])
    ]
    cols["name"] = [_SYNC_KIND.get(k, "Unknown") for k in cols.pop("kind")]
    if cols["ts_ns"]:
        out["gpu_sync"] = _keep_host(cols, rank, dropped)


def _runtime_calls(
    ex: _Export,
    out: dict[str, dict[str, list]],
    corr_rank: dict[tuple[int | None, int], int],
    prank: dict[int | None, int],
    dropped: Counter,
) -> None:
    """out["runtime"]: the CUDA runtime / driver calls, on the rank of the GPU work they launched."""
    rt = "CUPTI_ACTIVITY_KIND_RUNTIME"
    if rt not in ex.tables:
        return
    cols = _columns(
        ex,
        f"SELECT r.globalTid, {_pid_sql('r', 'globalTid')}, r.globalTid & 16777215, r.start, "
        f"{_dur_sql('r')}, {ex.col(rt, 'r', 'correlationId')}, s.value, {ex.col(rt, 'r', 'eventClass')} "
        f"FROM {rt} r LEFT JOIN StringIds s ON s.id = r.nameId ORDER BY r.start",
        ("gtid", "pid", "tid", "ts_ns", "dur_ns", "correlation", "raw_name", "event_class"),
    )
    valid = {"ts_ns": ("start", _TS), "dur_ns": ("end", _DUR), "gtid": ("globalTid", _ANY_INT)}
    cols = _valid_rows(ex, rt, cols, valid)
    cols["raw_name"] = ex.text_values(rt, "nameId -> StringIds.value", cols["raw_name"])
    _one_call_per_correlation(ex, rt, cols)
    rank = [
        r if c is not None and (r := corr_rank.get((p, c))) is not None else prank.get(p)
        for p, c in zip(cols["pid"], cols["correlation"])
    ]
    classes, has_class = ex.enum("ENUM_NSYS_EVENT_CLASS", {}), "eventClass" in ex.cols(rt)
    pairs = list(zip(cols.pop("raw_name"), cols.pop("event_class")))
    clean = {pair: _CUPTI_VERSION_SUFFIX.sub("", pair[0] or "") for pair in set(pairs)}
    cat = {pair: _runtime_cat(clean[pair], pair[1], classes, has_class) for pair in clean}
    cols["name"] = [clean[x] for x in pairs]
    cols["cat"] = [cat[x] for x in pairs]
    if cols["ts_ns"]:
        out["runtime"] = _keep_host(cols, rank, dropped)
