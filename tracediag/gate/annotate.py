"""Annotated Chrome-trace JSON: the run's events with every finding as a marked range.

The file opens in Perfetto UI and chrome://tracing and loads back through our Kineto ingester. It is
written from the store, so it works for any input format and for several ranks at once:

- the stored events of each rank (CPU ops, annotations, runtime calls, kernels, memcpy/memset, flows)
  with their Kineto categories and the args the ingester reads (`Input Dims`, `Input type`,
  `External id`, collective args, `correlation`, `device`, `stream`, ...). Each rank's processes get
  their own pids (`rank R · host pid P`, `rank R · GPU D`) so ranks do not collide in one file.
- per rank, a process `rank R · tracediag findings` sorted first, with a `steps` track (each engine
  step with phase and T) and, per finding, a track with a range on every step it is about (the steps of
  its evidence and of its per-step table, with that step's row as args; the whole trace when it names
  no step) and an `evidence` track with its example events at their exact times (instants when the
  event has no duration in the store).

Timestamps are written as µs with three decimals from the integer ns in the store, so no precision
is lost. Events on a synthetic track never partially overlap (Perfetto requires proper nesting per
thread): overlapping ranges go to extra lanes.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import duckdb
import orjson

from tracediag.files import atomic_file
from tracediag.version import __version__

PID_STRIDE = 10_000  # pids of rank r: r·stride + 1 (findings), + 2... (its host and GPU processes)
_STEPS_TID = 1
_FIRST_FINDING_TID = 1000
_TID_PER_FINDING = 100  # range lanes at +0..+49, evidence lanes at +50..+99
_EVIDENCE_TID = 50
_MAX_LANE = 49
_MAX_NAME = 200
_BATCH = 50_000
_KINETO_ANNOTATION_CATS = ("user_annotation", "gpu_user_annotation", "python_function")

# store column -> Kineto arg name (tracediag/ingest/kineto/events.py _Args), for the args we write back.
_COMM_ARGS = {
    "coll_name": "Collective name",
    "in_nelems": "In msg nelems",
    "out_nelems": "Out msg nelems",
    "group_size": "Group size",
    "dtype": "dtype",
    "pg_name": "Process Group Name",
    "pg_desc": "Process Group Description",
    "pg_ranks": "Process Group Ranks",
    "seq": "Seq",
}


def us(ns: int) -> orjson.Fragment:
    """Integer ns -> the µs number Chrome/Kineto JSON writes, exact (three decimals)."""
    sign = "-" if ns < 0 else ""
    q, r = divmod(abs(int(ns)), 1000)
    return orjson.Fragment(f"{sign}{q}.{r:03d}".encode())


def _raw_json(text: str | None) -> orjson.Fragment | None:
    # Input Dims / Input type are stored verbatim as JSON text; write them back as JSON, not as a string.
    return orjson.Fragment(text.encode()) if isinstance(text, str) and text.strip() else None


class _Ids:
    """Stable integer pids/tids for the merged file; remembers which source process/thread each came from."""

    def __init__(self, names: dict[int, SourceNames] | None = None) -> None:
        self.pids: dict[tuple[int, str, str], int] = {}
        self.names: dict[int, tuple[str, int]] = {}  # pid -> (process name, sort index)
        self.tids: dict[tuple[int, str], int] = {}
        self.next_in_rank: dict[int, int] = {}
        self.source = names or {}  # rank -> the input's own process and thread names
        self.origin: dict[int, tuple[int, str]] = {}  # our pid -> (rank, source pid or device)
        self.threads: dict[tuple[int, int], str] = {}  # (our pid, tid) -> source tid

    def findings_pid(self, rank: int) -> int:
        pid = rank * PID_STRIDE + 1
        self.names[pid] = (f"rank {rank} · tracediag findings", rank * 10)
        return pid

    def pid(self, rank: int, kind: str, orig: Any) -> int:
        key = (rank, kind, "" if orig is None else str(orig))
        if key not in self.pids:
            n = self.next_in_rank.get(rank, 2)
            self.next_in_rank[rank] = n + 1
            pid = rank * PID_STRIDE + n
            self.pids[key] = pid
            label = f"GPU {key[2]}" if kind == "gpu" else f"host pid {key[2]}" if key[2] else "host"
            own = self.source.get(rank, SourceNames()).processes.get(key[2])
            if own and own not in label:
                label += f" ({own})"  # the input's own process name: 'python', 'GPU 0 (H100)'
            self.names[pid] = (f"rank {rank} · {label}", rank * 10 + (2 if kind == "gpu" else 1))
            self.origin[pid] = (rank, key[2])
        return self.pids[key]

    def tid(self, pid: int, orig: Any) -> int:
        s = "" if orig is None else str(orig)
        if s.lstrip("-").isdigit() and -(2**31) < int(s) < 2**31:
            tid = int(s)
        else:
            key = (pid, s)
            if key not in self.tids:
                self.tids[key] = 2**30 + len(self.tids)
            tid = self.tids[key]
        self.threads.setdefault((pid, tid), s)
        return tid

    def thread_names(self) -> list[tuple[int, int, str]]:
        """(our pid, tid, the input's own thread name) for every thread the file uses that had a name."""
        out = []
        for (pid, tid), orig_tid in sorted(self.threads.items()):
            rank, orig_pid = self.origin.get(pid, (None, ""))
            name = self.source.get(rank, SourceNames()).threads.get((orig_pid, orig_tid)) if rank is not None else None
            if name:
                out.append((pid, tid, name))
        return out


@dataclass
class SourceNames:
    """The process and thread names an input trace gives its own pids and tids (Kineto `M` events)."""

    processes: dict[str, str] = field(default_factory=dict)  # source pid -> name
    threads: dict[tuple[str, str], str] = field(default_factory=dict)  # (source pid, tid) -> name


_M_MARKS = (b'"ph": "M"', b'"ph":"M"')
_M_WINDOW = 4096  # bytes around a metadata event's "ph" that hold the whole event


def kineto_names(raw: bytes) -> SourceNames:
    """process_name / thread_name events of a Kineto (Chrome trace) JSON, found without parsing the whole file:
    each `"ph": "M"` is located with bytes.find and only the small object around it is decoded."""
    out = SourceNames()
    dec = json.JSONDecoder()
    for mark in _M_MARKS:
        i = raw.find(mark)
        while i != -1:
            start = raw.rfind(b"{", max(0, i - _M_WINDOW), i)
            if start != -1:
                chunk = raw[start : i + _M_WINDOW].decode("utf-8", errors="replace")
                try:
                    ev, _ = dec.raw_decode(chunk)
                except ValueError:
                    ev = None
                if isinstance(ev, dict) and isinstance(ev.get("args"), dict):
                    name = ev["args"].get("name")
                    pid, tid = str(ev.get("pid")), str(ev.get("tid"))
                    if ev.get("name") == "process_name" and isinstance(name, str):
                        out.processes[pid] = name
                    elif ev.get("name") == "thread_name" and isinstance(name, str):
                        out.threads[(pid, tid)] = name
            i = raw.find(mark, i + len(mark))
    return out


def source_names(con: duckdb.DuckDBPyConnection) -> dict[int, SourceNames]:
    """Per rank, the names its Kineto input gave its processes and threads (files that are gone are skipped)."""
    out: dict[int, SourceNames] = {}
    for path, rank in con.execute(
        "SELECT DISTINCT path, rank FROM inputs WHERE format = 'kineto' AND rank IS NOT NULL"
    ).fetchall():
        p = Path(path)
        if not p.is_file():
            continue
        try:
            raw = p.read_bytes()
            if raw[:2] == b"\x1f\x8b":  # gzip by content, as the ingester detects it
                raw = gzip.decompress(raw)
        except (OSError, EOFError, gzip.BadGzipFile):
            continue
        out[rank] = kineto_names(raw)
    return out


class _Writer:
    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        self.count = 0

    def event(self, ev: dict[str, Any]) -> None:
        self.f.write((b",\n" if self.count else b"\n") + orjson.dumps(ev))
        self.count += 1


def _batches(con: duckdb.DuckDBPyConnection, sql: str, params: list[Any] | None = None) -> Iterator[dict[str, Any]]:
    cur = con.execute(sql, params or [])
    cols = [d[0] for d in cur.description]
    while rows := cur.fetchmany(_BATCH):
        for r in rows:
            yield dict(zip(cols, r))


def _args(row: dict[str, Any], keys: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for col, arg in keys.items():
        v = row.get(col)
        if v is None:
            continue
        if col in ("input_dims", "input_types"):
            v = _raw_json(v)
            if v is None:
                continue
        out[arg] = v
    return out


def _x(ev_name: Any, cat: str, pid: int, tid: int, ts: int, dur: int, args: dict[str, Any]) -> dict[str, Any]:
    ev = {"ph": "X", "cat": cat, "name": "" if ev_name is None else str(ev_name), "pid": pid, "tid": tid}
    ev |= {"ts": us(ts), "dur": us(max(0, dur or 0))}
    if args:
        ev["args"] = args
    return ev


def _gpu_pid_keys(con: duckdb.DuckDBPyConnection) -> set[tuple[int, str]]:
    rows = con.execute(
        "SELECT DISTINCT rank, CAST(device AS VARCHAR) FROM kernels WHERE device IS NOT NULL "
        "UNION SELECT DISTINCT rank, CAST(device AS VARCHAR) FROM memops WHERE device IS NOT NULL"
    ).fetchall()
    return {(r, d) for r, d in rows}


def _write_store_events(con: duckdb.DuckDBPyConnection, w: _Writer, ids: _Ids) -> None:
    gpu_keys = _gpu_pid_keys(con)

    def host(rank: int, pid: Any, tid: Any) -> tuple[int, int]:
        p = ids.pid(rank, "host", pid)
        return p, ids.tid(p, tid)

    base = {"external_id": "External id", "input_dims": "Input Dims", "input_types": "Input type"}
    for r in _batches(con, "SELECT * FROM cpu_ops ORDER BY rank, ts_ns"):
        p, t = host(r["rank"], r["pid"], r["tid"])
        w.event(_x(r["name"], "cpu_op", p, t, r["ts_ns"], r["dur_ns"], _args(r, base | _COMM_ARGS)))
    for r in _batches(con, "SELECT * FROM annotations ORDER BY rank, ts_ns"):
        cat = r["source"] if r["source"] in _KINETO_ANNOTATION_CATS else "user_annotation"
        if cat == "gpu_user_annotation":
            p = ids.pid(r["rank"], "gpu", r["pid"])
            t = ids.tid(p, r["tid"])
        else:
            p, t = host(r["rank"], r["pid"], r["tid"])
        args = _args(r, base)
        if r["source"] and r["source"] != cat:
            args["source"] = r["source"]  # e.g. an Nsight NVTX range, written as a Kineto user annotation
        w.event(_x(r["name"], cat, p, t, r["ts_ns"], r["dur_ns"], args))
    for r in _batches(con, "SELECT * FROM runtime ORDER BY rank, ts_ns"):
        p, t = host(r["rank"], r["pid"], r["tid"])
        args = _args(r, {"correlation": "correlation", "external_id": "External id"})
        w.event(_x(r["name"], r["cat"] or "cuda_runtime", p, t, r["ts_ns"], r["dur_ns"], args))
    gpu_args = {"device": "device", "stream": "stream", "correlation": "correlation", "external_id": "External id"}
    for r in _batches(con, "SELECT * FROM kernels ORDER BY rank, ts_ns"):
        p = ids.pid(r["rank"], "gpu", r["device"])
        args = _args(r, gpu_args | _COMM_ARGS)
        for k in ("grid", "block"):
            if r.get(k) is not None:
                args[k] = list(r[k])
        w.event(_x(r["name"], "kernel", p, ids.tid(p, r["stream"]), r["ts_ns"], r["dur_ns"], args))
    for r in _batches(con, "SELECT * FROM memops ORDER BY rank, ts_ns"):
        p = ids.pid(r["rank"], "gpu", r["device"])
        args = _args(r, gpu_args | {"bytes": "bytes"})
        cat = "gpu_memset" if r["kind"] == "memset" else "gpu_memcpy"
        w.event(_x(r["name"], cat, p, ids.tid(p, r["stream"]), r["ts_ns"], r["dur_ns"], args))
    for r in _batches(
        con, "SELECT * FROM flows WHERE flow_id IS NOT NULL AND phase IN ('s', 'f') ORDER BY rank, ts_ns"
    ):
        kind = "gpu" if (r["rank"], r["pid"]) in gpu_keys and r["phase"] == "f" else "host"
        p = ids.pid(r["rank"], kind, r["pid"])
        ev = {"ph": r["phase"], "id": r["flow_id"], "pid": p, "tid": ids.tid(p, r["tid"]), "ts": us(r["ts_ns"])}
        ev |= {"cat": r["cat"] or "flow", "name": r["cat"] or "flow"}
        if r["phase"] == "f":
            ev["bp"] = "e"  # bind to the enclosing slice, as Kineto writes its ac2g flow ends
        w.event(ev)


def _lanes(ranges: list[tuple[int, int, dict]]) -> list[tuple[int, tuple[int, int, dict]]]:
    """Greedy lanes: ranges in one lane never overlap (so they nest trivially on one track)."""
    ends: list[int] = []
    out = []
    for r in sorted(ranges, key=lambda x: (x[0], -x[1])):
        start, end = r[0], r[0] + r[1]
        for i, e in enumerate(ends):
            if start >= e:
                ends[i] = end
                out.append((i, r))
                break
        else:
            ends.append(end)
            out.append((len(ends) - 1, r))
    return out


def _evidence_dur(con: duckdb.DuckDBPyConnection, e: dict[str, Any]) -> int | None:
    if isinstance(e.get("dur_ns"), int):
        return e["dur_ns"]
    rank, ts, name = e.get("rank"), e.get("ts_ns"), e.get("name")
    if rank is None or not isinstance(ts, int):
        return None
    row = con.execute(
        "SELECT dur_ns FROM collectives WHERE rank = ? AND ts_ns = ? "
        "UNION ALL SELECT dur_ns FROM cpu_ops WHERE rank = ? AND ts_ns = ? AND name = ? "
        "UNION ALL SELECT dur_ns FROM annotations WHERE rank = ? AND ts_ns = ? AND name = ? "
        "UNION ALL SELECT dur_ns FROM kernels WHERE rank = ? AND ts_ns = ? AND name = ? LIMIT 1",
        [rank, ts, rank, ts, name, rank, ts, name, rank, ts, name],
    ).fetchone()
    return row[0] if row else None


def finding_label(c: dict[str, Any]) -> str:
    key = (c.get("values") or {}).get("key")
    rid = f"{c['rule']}[{key}]" if key is not None else c["rule"]
    new = "" if c.get("new", True) else " (known)"
    return f"{rid} {c.get('severity') or ''}{new}".strip()


def _step_of_row(row: dict[str, Any]) -> tuple[int, int] | None:
    step = row.get("step", row.get("step_id"))
    if isinstance(row.get("rank"), int) and isinstance(step, int):
        return row["rank"], step
    return None


def _write_findings(con: duckdb.DuckDBPyConnection, w: _Writer, ids: _Ids, findings: list[dict[str, Any]]) -> None:
    steps = {
        (r["rank"], r["step_id"]): r
        for r in _batches(con, "SELECT rank, step_id, name, marker_source, phase, T, ts_ns, dur_ns FROM steps")
    }
    spans = {
        r[0]: (r[1], r[2])
        for r in con.execute(
            "SELECT rank, min(trace_start_ns), max(trace_end_ns) FROM inputs WHERE rank IS NOT NULL GROUP BY rank"
        ).fetchall()
        if r[1] is not None and r[2] is not None
    }
    ranks = sorted({r for r, _ in steps} | set(spans))
    meta: list[tuple[int, int, str, int]] = []  # (pid, tid, thread name, sort index)
    for rank in ranks:
        pid = ids.findings_pid(rank)
        meta.append((pid, _STEPS_TID, "steps", 0))
    for (rank, step_id), s in sorted(steps.items()):
        label = " ".join(str(x) for x in (f"step {step_id}", s["phase"], f"T={s['T']}" if s["T"] else None) if x)
        args = {"marker": s["name"], "marker_source": s["marker_source"], "phase": s["phase"], "T": s["T"]}
        w.event(_x(label, "tracediag", ids.findings_pid(rank), _STEPS_TID, s["ts_ns"], s["dur_ns"], args))

    for i, c in enumerate(findings):
        tid0 = _FIRST_FINDING_TID + i * _TID_PER_FINDING
        label = finding_label(c)
        name = f"{label}: {c.get('title', '')}"[:_MAX_NAME]
        common = {
            "rule": c["rule"],
            "severity": c.get("severity"),
            "new": c.get("new", True),
            "title": c.get("title"),
            "formula": c.get("formula"),
            "substituted": c.get("substituted"),
            "next_check": c.get("next_check"),
            "values": orjson.dumps(c.get("values") or {}, default=str).decode(),
        }
        common = {k: v for k, v in common.items() if v is not None}
        rows = {}
        for row in c.get("table") or []:
            key = _step_of_row(row)
            if key:
                rows[key] = row
        about = set(rows)
        evid = [e for e in (c.get("evidence") or []) if isinstance(e.get("rank"), int)]
        about |= {(e["rank"], e["step"]) for e in evid if isinstance(e.get("step"), int)}
        ranges: dict[int, list[tuple[int, int, dict]]] = {}
        for key in sorted(k for k in about if k in steps):
            s = steps[key]
            row = rows.get(key)
            extra = {"row": orjson.dumps(row, default=str).decode()} if row else {}
            ranges.setdefault(key[0], []).append((s["ts_ns"], s["dur_ns"], common | {"step": key[1]} | extra))
        if not ranges:  # a finding about the whole run (config, shapes): mark each rank's whole trace
            for rank in sorted({e["rank"] for e in evid} & set(spans)) or sorted(spans):
                t0, t1 = spans[rank]
                ranges.setdefault(rank, []).append((t0, t1 - t0, common | {"scope": "whole trace"}))
        for rank, rs in ranges.items():
            pid = ids.findings_pid(rank)
            for lane, (ts, dur, args) in _lanes(rs):
                tid = tid0 + min(lane, _MAX_LANE)
                w.event(_x(name, "tracediag", pid, tid, ts, dur, args))
                meta.append((pid, tid, label + (f" ({lane + 1})" if lane else ""), tid))
        ev_ranges: dict[int, list[tuple[int, int, dict]]] = {}
        for e in evid:
            if not isinstance(e.get("ts_ns"), int) or e["rank"] not in set(ranks):
                continue
            dur = _evidence_dur(con, e)
            args = {k: (v if isinstance(v, (int, float, str, bool)) else str(v)) for k, v in e.items() if v is not None}
            if dur is None:
                pid = ids.findings_pid(e["rank"])
                inst = {"ph": "i", "s": "t", "cat": "tracediag", "name": f"{c['rule']} evidence: {e.get('name')}"}
                w.event(inst | {"pid": pid, "tid": tid0 + _EVIDENCE_TID, "ts": us(e["ts_ns"]), "args": args})
                meta.append((pid, tid0 + _EVIDENCE_TID, f"{label} evidence", tid0 + _EVIDENCE_TID))
            else:
                ev_ranges.setdefault(e["rank"], []).append((e["ts_ns"], dur, args))
        for rank, rs in ev_ranges.items():
            pid = ids.findings_pid(rank)
            for lane, (ts, dur, args) in _lanes(rs):
                tid = tid0 + _EVIDENCE_TID + min(lane, _MAX_LANE)
                w.event(_x(f"{c['rule']} evidence: {args.get('name')}", "tracediag", pid, tid, ts, dur, args))
                meta.append((pid, tid, f"{label} evidence" + (f" ({lane + 1})" if lane else ""), tid))

    for pid, tid, tname, sort in dict.fromkeys(meta):
        w.event({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": tname}})
        w.event({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid, "args": {"sort_index": sort}})


def _only_findings(findings: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [c for c in findings if c.get("status", "finding") == "finding"]


def gzipped(path: Path) -> bool:
    """A name ending in .gz asks for a gzip-compressed file (as torch.profiler writes .json.gz traces)."""
    return path.name.endswith(".gz")


def write_annotated_trace(
    db_path: str | Path, findings: list[dict[str, Any]], out_path: str | Path, title: str = "tracediag"
) -> dict[str, Any]:
    """Write the annotated trace; returns {"events", "findings", "path"}. Written atomically."""
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    findings = _only_findings(findings)
    con = duckdb.connect(str(db_path), read_only=True)
    try:
        with atomic_file(out_path) as raw_file:
            f = gzip.GzipFile(fileobj=raw_file, mode="wb", compresslevel=6, mtime=0) if gzipped(out_path) else raw_file
            f.write(b'{"traceEvents": [')
            w = _Writer(f)
            ids = _Ids(source_names(con))
            _write_findings(con, w, ids, findings)
            _write_store_events(con, w, ids)
            for pid, (pname, sort) in sorted(ids.names.items()):
                w.event({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": pname}})
                w.event({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": sort}})
            for pid, tid, tname in ids.thread_names():
                w.event({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": tname}})
            summary = {
                "tool": {"name": "tracediag", "version": __version__},
                "title": title,
                "findings": [
                    {"label": finding_label(c), "title": c.get("title"), "severity": c.get("severity")}
                    for c in findings
                ],
            }
            f.write(b'\n],\n"displayTimeUnit": "ns",\n"tracediag": ' + orjson.dumps(summary) + b"}\n")
            count = w.count
            if f is not raw_file:
                f.close()  # the gzip trailer; the file itself is closed and renamed by atomic_file
    finally:
        con.close()
    return {"events": count, "findings": len(findings), "path": str(out_path)}
