"""Nsight Systems input: an `nsys export --type sqlite` database (or a .nsys-rep through `nsys export`).

One export holds every process of the capture. Each process with GPU work (kernels, memory copies or
memsets) on one CUDA device becomes one rank; runtime calls and NVTX ranges of that process go with it
(a process driving several GPUs has one rank per GPU: runtime calls follow their kernels by correlation
id, host-only events go to the process's busiest GPU). Host events of processes without GPU work (a
launcher, an API server) are not stored; the input's meta_json counts them.

What lands where (canonical tables, `store/schema.sql`; Nsight-only detail in `store/schema_nsys.sql`):
- CUPTI_ACTIVITY_KIND_KERNEL -> kernels (demangled name from StringIds, device, stream, grid/block,
  correlation; klass/family/collective_op from the catalog, as for Kineto).
- CUPTI_ACTIVITY_KIND_MEMCPY / _MEMSET -> memops, named as Kineto names them
  ("Memcpy HtoD (Pageable -> Device)", "Memset (Device)").
- CUPTI_ACTIVITY_KIND_RUNTIME -> runtime (cat cuda_runtime / cuda_driver from eventClass; the CUPTI
  version suffix `_v7000` is dropped so names read as in Kineto: cudaLaunchKernel).
- CUPTI_ACTIVITY_KIND_SYNCHRONIZATION -> gpu_sync.
- NVTX_EVENTS: every range and mark -> nvtx_events (domain, push/pop vs start/end, decoded payload);
  PyTorch `emit_nvtx` ranges ("aten::mm, seq = 3, op_id = 7, sizes = [[..]]") -> cpu_ops (input_dims from
  `sizes`), every other range -> annotations with source 'nvtx'. Runtime calls get external_id = the
  innermost PyTorch range open on their thread (its op_id), and kernels/memops the external_id of their
  runtime call, so ops link to kernels the way Kineto's 'External id' does.
- TARGET_INFO_GPU (else TARGET_INFO_CUDA_DEVICE) -> the inputs row's device columns.

Tables an export lacks are absent (nsys creates them lazily), so every table and column is probed in
sqlite_master / table_info first. Timestamps are integer ns on the capture's clock, as exported.
Every value read goes through `tracediag.ingest.validate` (`_valid_rows`, `_to_arrow`): a row whose time, device
or thread is not an integer in range (text or a blob in an integer column, an end before 2**63 overflowing the
subtraction) is dropped, another out-of-range or wrongly typed value is set to NULL, text that is not UTF-8 is
kept with U+FFFD in place of the bad bytes; all are counted in the input's `bad_records`.

Schema sources: the NVIDIA Nsight Systems SQLite export schema (table comments in the exports
themselves) and the stats scripts shipped with nsys (reports/nvtx_kern_sum.py: pid = (globalTid >> 24) &
0xFFFFFF, tid = globalTid & 0xFFFFFF, NVTX range event types 59/60/70/71, domain create 75).
"""

from __future__ import annotations

import operator
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import tempfile
import urllib.parse
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from tracediag.catalog import classify_cpu_op, classify_kernel
from tracediag.errors import InputError
from tracediag.ingest import validate as val
from tracediag.ingest.base import IngestOptions, Parsed, names_classified_by_prefix
from tracediag.ingest.nsys_nvtx import (
    SchemaEntry,
    blob_bytes,
    decode_payload,
    innermost_open,
    parse_torch_range,
    split_blob,
)
from tracediag.ingest.validate import BadRecords
from tracediag.inputfile import open_input, regular_file

# ENUM_NSYS_EVENT_TYPE ids (same in the 2023.2 and 2026.x exports)
NVTX_RANGE_TYPES = (59, 60, 70, 71)  # NvtxPushPopRange, NvtxStartEndRange, NvtxtPushPopRange, NvtxtStartEndRange
NVTX_MARK_TYPES = (34, 65)  # NvtxMark, NvtxtMark
_PUSH_POP = frozenset({59, 70})
_THREAD_NAME = 39  # NvtxThread: nsys's MPI trace names each rank's thread "MPI Rank N"
_DOMAIN_CREATE = 75
_MPI_THREAD = re.compile(r"^MPI Rank (\d+)$")
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
_NVTX_COLUMNS = ("rank", "name", "kind", "domain_id", "domain", "ts_ns", "dur_ns", "gtid", "end_gtid", "category",
                 "color", "stored_as", "torch_seq", "torch_op_id", "nccl_comm_id", "message_bytes", "reduction_op",
                 "peer", "root", "nranks", "nccl_rank", "cuda_device", "payload_json")  # fmt: skip
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
_SYNTHETIC_OP_ID = 1 << 56  # external ids for PyTorch ranges recorded without op_id (older PyTorch)
_SQLITE_MAGIC = b"SQLite format 3\x00"


def pid_of(global_id: int | None) -> int | None:
    """Process id from a serialized GlobalId (nsys reports: (globalTid >> 24) & 0x00FFFFFF); None for anything
    that is not an integer."""
    return (global_id >> 24) & 0xFFFFFF if type(global_id) is int else None


def tid_of(global_tid: int | None) -> int | None:
    """Thread id from a serialized GlobalId (nsys reports: globalTid & 0x00FFFFFF)."""
    return global_tid & 0xFFFFFF if type(global_tid) is int else None


# --- file checks -------------------------------------------------------------------------------------------


def _check_file(p: Path) -> int:
    """Size of a readable, complete SQLite file; InputError naming the problem otherwise."""
    try:
        with open_input(p, "Nsight Systems export") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(100)
    except OSError as exc:
        raise InputError(p, f"cannot read file ({exc.strerror or exc})") from None
    if size == 0:
        raise InputError(p, "file is empty")
    if not head.startswith(_SQLITE_MAGIC):
        raise InputError(p, "not an SQLite database (Nsight Systems exports are made by `nsys export --type=sqlite`)")
    if len(head) < 100:
        raise InputError(p, f"truncated SQLite file ({size} bytes, less than its 100-byte header)")
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    header_size_valid = head[24:28] == head[92:96]  # "in-header database size" is valid (SQLite file format §1.3)
    if page_size and header_size_valid and pages and size < pages * page_size:
        raise InputError(
            p,
            f"truncated SQLite file: its header says {pages} pages of {page_size} bytes "
            f"({pages * page_size} bytes) but the file has {size}; was the export or the copy interrupted?",
        )
    if page_size and size % page_size:
        raise InputError(p, f"truncated SQLite file: {size} bytes is not a whole number of {page_size}-byte pages")
    return size


_NO_COLUMN = re.compile(r"no such column: (?:(\w+)\.)?(\w+)")
_TABLE_ALIAS = re.compile(r"\b(?:FROM|JOIN)\s+(\w+)(?:\s+(?!ON\b|WHERE\b|ORDER\b|LEFT\b|JOIN\b|GROUP\b)(\w+))?")


def _missing_column(sql: str, message: str) -> tuple[str, str] | None:
    """(table, column) of SQLite's "no such column: k.start" for a query of ours (the alias looked up in its FROM
    and JOIN clauses; an unqualified column is the query's only table's); None for any other error."""
    m = _NO_COLUMN.search(message)
    if m is None:
        return None
    alias, column = m.group(1), m.group(2)
    tables = _TABLE_ALIAS.findall(sql)
    for table, a in tables:
        if alias in (a, table):
            return table, column
    if alias is None and len({t for t, _ in tables}) == 1:
        return tables[0][0], column
    return (alias or "?"), column


def _lenient_text(b: bytes) -> str:
    # undecodable bytes become lone surrogates, which validate.clean_text finds, counts and replaces
    return b.decode("utf-8", "surrogateescape")


def _connect(p: Path) -> sqlite3.Connection:
    # read-only and immutable: works on read-only media, never writes a journal next to the export
    uri = f"file:{urllib.parse.quote(str(p.resolve()))}?mode=ro&immutable=1"
    return sqlite3.connect(uri, uri=True)


# --- the export --------------------------------------------------------------------------------------------


@dataclass
class _Unit:
    """One rank: a process on one CUDA device."""

    pid: int | None
    device: int | None
    rank: int = -1
    gpu_events: int = 0


class _Export:
    def __init__(self, path: Path, con: sqlite3.Connection) -> None:
        self.path = path
        self.con = con
        self.tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        self._cols: dict[str, set[str]] = {}
        self.notes: list[str] = []
        self.bad = BadRecords()

    def cols(self, table: str) -> set[str]:
        if table not in self._cols:
            self._cols[table] = (
                {r[1] for r in self.con.execute(f'PRAGMA table_info("{table}")')} if table in self.tables else set()
            )
        return self._cols[table]

    def col(self, table: str, alias: str, name: str, default: str = "NULL") -> str:
        return f"{alias}.{name}" if name in self.cols(table) else default

    def rows(self, sql: str, params: tuple = ()) -> list[tuple]:
        try:
            return self.con.execute(sql, params).fetchall()
        except (sqlite3.OperationalError, UnicodeDecodeError) as exc:
            missing = _missing_column(sql, str(exc))
            if missing is not None:
                table, column = missing
                raise InputError(
                    self.path,
                    f"Nsight Systems export whose table {table} has no column {column} (an edited file, or an export "
                    "schema this tracediag does not know); re-export it with `nsys export --type=sqlite`",
                ) from None
            if "decode" not in str(exc) or self.con.text_factory is _lenient_text:
                raise
            # text that is not UTF-8 (a damaged page, a bad writer): read it leniently, count it where it is used
            self.con.text_factory = _lenient_text
            return self.con.execute(sql, params).fetchall()

    def text_values(self, table: str, column: str, values: list[Any]) -> list[str | None]:
        """Text from the export: non-text set to NULL, undecodable bytes replaced; both counted."""
        return val.Checker(self.bad, table).str_values(column, values)

    # --- metadata ---

    def metadata(self) -> tuple[str, dict[str, str]]:
        for table in ("META_DATA_EXPORT", "EXPORT_META_DATA"):  # 2024+ / 2023.2 and older
            if table in self.tables and {"name", "value"} <= self.cols(table):
                rows = self.rows(f"SELECT name, value FROM {table}")
                names = self.text_values(table, "name", [r[0] for r in rows])
                values = self.text_values(table, "value", [r[1] for r in rows])
                return table, {k: v for k, v in zip(names, values) if k is not None}
        return "", {}

    def check_is_nsys(self) -> None:
        markers = {"META_DATA_EXPORT", "EXPORT_META_DATA", "NVTX_EVENTS"}
        if "StringIds" not in self.tables or not (
            self.tables & markers or any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in self.tables)
        ):
            shown = ", ".join(sorted(self.tables)[:6]) or "none"
            raise InputError(
                self.path,
                "SQLite database, but not an Nsight Systems export: it has no StringIds and no "
                f"META_DATA_EXPORT/EXPORT_META_DATA, CUPTI_ACTIVITY_KIND_* or NVTX_EVENTS table (tables: {shown})",
            )

    def enum(self, table: str, fallback: dict[int, str]) -> dict[int, str]:
        if table in self.tables and {"id", "label"} <= self.cols(table):
            rows = _valid_tuples(self, table, self.rows(f"SELECT id, label FROM {table}"), {0: ("id", None, None)})
            labels = self.text_values(table, "label", [r[1] for r in rows])
            got = {r[0]: lab for r, lab in zip(rows, labels) if lab is not None}
            return got or fallback
        return fallback


# SQLite's messages for a damaged file (sqlite3.c: SQLITE_CORRUPT, SQLITE_NOTADB, SQLITE_IOERR, "malformed schema")
_DAMAGED = re.compile(r"malformed|not a database|disk I/O|corrupt|truncated|file is encrypted", re.IGNORECASE)


def parse_nsys_sqlite(path: str | Path, order: int = 0, options: IngestOptions | None = None) -> Parsed:
    """Parse one Nsight Systems SQLite export. Raises InputError naming the file on any problem."""
    p = Path(path)
    size = _check_file(p)
    try:
        con = _connect(p)
    except sqlite3.Error as exc:
        raise InputError(p, f"cannot open SQLite file ({' '.join(str(exc).split())})") from None
    try:
        ex = _Export(p, con)
        ex.check_is_nsys()
        return _build(ex, order, size)
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        # UnicodeDecodeError: the schema itself (table or column names) is not UTF-8, a damaged file
        why = " ".join(str(exc).split())  # SQLite's messages can span lines (a malformed schema quotes its SQL)
        if isinstance(exc, sqlite3.OperationalError) and not _DAMAGED.search(why):
            # an error of the query on a readable file (a column of the wrong affinity, a limit of SQLite's)
            raise InputError(p, f"SQLite error reading the export ({why}); re-export it with `nsys export`") from None
        raise InputError(p, f"corrupt or truncated SQLite file ({why}); re-export it with `nsys export`") from None
    finally:
        con.close()


def parse_nsys_rep(path: str | Path, order: int = 0, options: IngestOptions | None = None) -> Parsed:
    """A .nsys-rep report: converted with `nsys export --type=sqlite` into a temporary file when `nsys` is
    on the PATH, else an InputError with the command to run."""
    p = Path(path)
    regular_file(p, "Nsight Systems report")
    out_name = p.with_suffix(".sqlite").name
    hint = f"nsys export --type=sqlite --include-blobs=true --output={shlex.quote(out_name)} {shlex.quote(p.name)}"
    exe = shutil.which("nsys")
    if exe is None:
        raise InputError(
            p,
            f"an Nsight Systems report must be exported to SQLite first and `nsys` is not on the PATH: run `{hint}` "
            "(drop --include-blobs=true on nsys versions without it) and pass the .sqlite file",
        )
    with tempfile.TemporaryDirectory(prefix="tracediag-nsys-") as tmp:
        out = Path(tmp) / out_name
        base = [exe, "export", "--type=sqlite", "--force-overwrite=true", f"--output={out}"]
        # --include-blobs keeps the NVTX binary payloads (NCCL message sizes); older nsys lacks the option.
        for extra in (["--include-blobs=true"], []):
            res = subprocess.run([*base, *extra, str(p)], capture_output=True, text=True, check=False)
            if res.returncode == 0 and out.is_file():
                break
        else:
            last = (res.stderr or res.stdout).strip().splitlines()
            raise InputError(
                p, f"`nsys export` failed (exit {res.returncode}): {last[-1] if last else 'no output'}; run `{hint}`"
            )
        parsed = parse_nsys_sqlite(out, order, options)
    size = p.stat().st_size
    for row in parsed.inputs_rows:
        row |= {"path": str(p), "format": "nsys-rep", "file_bytes": size}
    parsed.path, parsed.format = str(p), "nsys-rep"
    return parsed


# --- building the tables -----------------------------------------------------------------------------------


def _pid_sql(alias: str, col: str) -> str:
    # see pid_of; a value that is not an integer is passed through as it is, for _valid_rows to report
    c = f"{alias}.{col}"
    return f"(CASE typeof({c}) WHEN 'integer' THEN (({c} >> 24) & 16777215) ELSE {c} END)"


def _dur_sql(alias: str) -> str:
    """end - start, ≥ 0; when either is not an integer, the bad value itself (for _valid_rows to report)."""
    s, e = f"{alias}.start", f"{alias}.end"
    return (
        f"(CASE WHEN typeof({s}) = 'integer' AND typeof({e}) = 'integer' THEN max({e} - {s}, 0) "
        f"WHEN typeof({e}) = 'integer' THEN NULL ELSE {e} END)"
    )


def _columns(ex: _Export, sql: str, names: tuple[str, ...]) -> dict[str, list]:
    rows = ex.rows(sql)
    cols = list(zip(*rows)) if rows else [() for _ in names]
    return {n: list(c) for n, c in zip(names, cols, strict=True)}


# value ranges of the columns a row cannot be placed without (validate.py: why these bounds)
_TS = (-val.TS_NS_MAX, val.TS_NS_MAX)
_DUR = (0, val.DUR_NS_MAX)
_ANY_INT = (-val.INT64_MAX - 1, val.INT64_MAX)
_INT32 = (-(2**31), val.INT32_MAX)


def _valid_rows(
    ex: _Export,
    table: str,
    cols: dict[str, list],
    required: dict[str, tuple[str, tuple[int, int]]],
    nullable: dict[str, tuple[str, tuple[int, int]]] | None = None,
) -> dict[str, list]:
    """The rows whose `required` columns are integers in range and whose `nullable` ones are NULL or such
    integers (`{column: (export column name, (lo, hi))}`); the other rows are dropped and counted."""
    n = len(next(iter(cols.values()), []))
    if not n:
        return cols
    ok = np.ones(n, dtype=bool)
    for spec, allow_null in ((required, False), (nullable or {}, True)):
        for name, (label, (lo, hi)) in spec.items():
            values = cols[name]
            good = np.fromiter(
                ((type(v) is int and lo <= v <= hi) or (allow_null and v is None) for v in values), dtype=bool, count=n
            )
            if not good.all():
                ex.bad.dropped(table, label, [v for v, g, o in zip(values, good, ok) if not g and o])
                ok &= good
    if ok.all():
        return cols
    return {k: [v for v, g in zip(vals, ok) if g] for k, vals in cols.items()}


def _valid_tuples(
    ex: _Export,
    table: str,
    rows: list[tuple],
    required: dict[int, tuple[str, int | None, int | None]],
    nullable: dict[int, tuple[str, int | None, int | None]] | None = None,
) -> list[tuple]:
    """_valid_rows for rows as tuples: `{position: (export column name, lo, hi)}` (None: the int64 bound)."""
    if not rows:
        return rows
    names = tuple(range(len(rows[0])))
    cols = {i: [r[i] for r in rows] for i in names}
    rng = {
        i: (lab, (-val.INT64_MAX - 1 if lo is None else lo, val.INT64_MAX if hi is None else hi))
        for i, (lab, lo, hi) in {**required, **(nullable or {})}.items()
    }
    kept = _valid_rows(ex, table, cols, {i: rng[i] for i in required}, {i: rng[i] for i in nullable or {}})
    return list(zip(*(kept[i] for i in names)))


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


def _classified(names: list[str], classify) -> dict[str, list]:
    # Same as the Kineto ingester: classify each distinct name once.
    table = {n: classify(n) for n in set(names)}
    return {
        "klass": [table[n].klass for n in names],
        "family": [table[n].family for n in names],
        "collective_op": [table[n].collective_op for n in names],
    }


def _keep(cols: dict[str, list], rank: list[int | None]) -> dict[str, list]:
    """The columns with a rank column added, rows without a rank removed."""
    if None not in rank:
        return cols | {"rank": rank}
    idx = [i for i, r in enumerate(rank) if r is not None]
    return {k: [v[i] for i in idx] for k, v in cols.items()} | {"rank": [rank[i] for i in idx]}


def _keep_host(cols: dict[str, list], rank: list[int | None], dropped: Counter) -> dict[str, list]:
    """_keep for host-side rows: the ones without a rank (no GPU work in their process) counted in `dropped` by pid."""
    dropped.update(p for p, r in zip(cols["pid"], rank) if r is None)
    return _keep(cols, rank)


def _payload_schemas(ex: _Export) -> tuple[dict[tuple[int, int], list[SchemaEntry]], dict[int, dict[int, str]]]:
    t = "NVTX_PAYLOAD_SCHEMA_ENTRIES"
    schemas: dict[tuple[int, int], dict[int, SchemaEntry]] = {}
    if t in ex.tables and {"domainId", "schemaId", "idx", "type", "name"} <= ex.cols(t):
        rows = ex.rows(f"SELECT domainId, schemaId, idx, type, name, {ex.col(t, 't', 'offset')} FROM {t} t")
        rows = _valid_tuples(
            ex,
            t,
            rows,
            {0: ("domainId", None, None), 1: ("schemaId", None, None), 2: ("idx", None, None)},
            {3: ("type", None, None), 5: ("offset", 0, val.INT32_MAX)},
        )
        names = ex.text_values(t, "name", [r[4] for r in rows])
        for (dom, sid, idx, typ, _, off), name in zip(rows, names):
            if typ is not None and name is not None:
                schemas.setdefault((dom, sid), {}).setdefault(idx, SchemaEntry(idx, name, typ, off))
    enums: dict[int, dict[int, str]] = {}
    e = "NVTX_PAYLOAD_ENUM_ENTRIES"
    if e in ex.tables and {"schemaId", "name", "value"} <= ex.cols(e):
        rows = _valid_tuples(
            ex,
            e,
            ex.rows(f"SELECT schemaId, name, value FROM {e}"),
            {0: ("schemaId", None, None)},
            {2: ("value", None, None)},
        )
        names = ex.text_values(e, "name", [r[1] for r in rows])
        for (sid, _, value), name in zip(rows, names):
            if value is not None:
                enums.setdefault(sid, {}).setdefault(value, name)
    return {k: list(v.values()) for k, v in schemas.items()}, enums


def _runtime_cat(name: str, ecls: int | None, classes: dict[int, str], has_class: bool) -> str:
    if not has_class:
        return "cuda_runtime" if name.startswith("cuda") else "cuda_driver"
    label = (classes.get(ecls) or "").upper()  # ENUM_NSYS_EVENT_CLASS: TRACE_PROCESS_EVENT_CUDA_DRIVER = 1
    return "cuda_driver" if "DRIVER" in label or (not label and ecls == 1) else "cuda_runtime"


def _build(ex: _Export, order: int, file_bytes: int) -> Parsed:
    """The export's tables, table by table: its ranks, GPU activity, synchronization, runtime calls, NVTX
    ranges, the links between them, then one inputs row per rank."""
    meta_table, md = ex.metadata()
    kern, mcpy, mset = _read_gpu(ex)
    units, primary = _units(ex, kern, mcpy, mset)
    nvtx = _read_nvtx(ex)
    schemas, enums = _payload_schemas(ex)
    payloads = _decode_payloads(nvtx, schemas, enums)
    rank_source, world_size = _assign_ranks(ex, units, primary, nvtx, payloads)
    urank = {key: u.rank for key, u in units.items()}
    prank = {pid: u.rank for pid, u in primary.items()}

    dropped: Counter[int | None] = Counter()  # host events of processes without GPU work, by pid
    out, corr_rank = _gpu_activity(ex, kern, mcpy, mset, urank)
    _gpu_sync(ex, out, corr_rank, urank, prank, dropped)
    _runtime_calls(ex, out, corr_rank, prank, dropped)
    ops, nvtx_counts, open_ranges = _nvtx_tables(nvtx, payloads, units, prank, out, dropped)
    _link_calls(out, ops)

    tables = {name: _to_arrow(name, cols, ex.bad) for name, cols in out.items()}
    meta_common = {
        "nsys_version": md.get("EXPORT_PRODUCT_VERSION"),
        "export_schema_version": md.get("EXPORT_SCHEMA_VERSION"),
        "export_metadata_table": meta_table or None,
        "include_blobs": md.get("EXPORT_PARAM_INCLUDE_BLOBS"),
        "clock": "integer ns on the capture's clock (TARGET_INFO_SESSION_START_TIME gives its UTC start)",
        "runtime_names": "CUPTI version suffix (_v7000) removed, as Kineto writes them",
        "ranks_in_file": len(units),
        "nccl_payload": _payload_note(nvtx, payloads, md),
        "nvtx_open_ranges_closed_at_trace_end": open_ranges,
    }
    if dropped:
        meta_common["host_events_not_stored"] = {
            f"pid {pid} ({nvtx.process_names.get(pid, '?')})": n for pid, n in sorted(dropped.items(), key=str)
        } | {"why": "process without kernels, memory copies or memsets on any GPU"}
    ranks = _RankFacts(units, rank_source, world_size, nvtx_counts)
    inputs_rows = _inputs_rows(ex, order, file_bytes, md, meta_common, ranks, nvtx, out, tables)
    pgs = _process_groups(units, payloads, nvtx)
    return Parsed(path=str(ex.path), format="nsys-sqlite", inputs_rows=inputs_rows, tables=tables, process_groups=pgs)


@dataclass
class _RankFacts:
    """The file's ranks as the inputs rows describe them."""

    units: dict[tuple[int | None, int | None], _Unit]
    rank_source: str
    world_size: int | None
    nvtx_counts: dict[int, Counter[str]]


def _units(
    ex: _Export, kern: dict[str, list], mcpy: dict[str, list], mset: dict[str, list]
) -> tuple[dict[tuple[int | None, int | None], _Unit], dict[int | None, _Unit]]:
    """The ranks: one unit per (process, device) with GPU work, and each process's unit with the most work."""
    work: Counter[tuple[int | None, int | None]] = Counter()
    for cols in (kern, mcpy, mset):
        work.update(zip(cols["pid"], cols["device"]))
    if not work:
        present = sorted(t for t in ex.tables if t.startswith(("CUPTI_", "NVTX_")))
        raise InputError(
            ex.path,
            "Nsight Systems export without GPU work (no CUDA kernels, memory copies or memsets; tables: "
            f"{', '.join(present) or 'none'}); capture with `nsys profile --trace=cuda,nvtx`",
        )
    units = {key: _Unit(pid=key[0], device=key[1], gpu_events=n) for key, n in work.items()}
    primary: dict[int | None, _Unit] = {}
    for u in sorted(units.values(), key=lambda u: (-u.gpu_events, u.device if u.device is not None else -1)):
        primary.setdefault(u.pid, u)
    return units, primary


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


def _nvtx_tables(
    nvtx: _Nvtx,
    payloads: dict[int, dict[str, Any]],
    units: dict[tuple[int | None, int | None], _Unit],
    prank: dict[int | None, int],
    out: dict[str, dict[str, list]],
    dropped: Counter,
) -> tuple[dict[str, list] | None, dict[int, Counter[str]], int]:
    """out["nvtx_events"], out["cpu_ops"] (PyTorch ranges) and out["annotations"] (other ranges); returns the
    cpu_ops columns (None without any), the NVTX counts per rank and how many ranges were still open."""
    ends = [max(map(operator.add, c["ts_ns"], c["dur_ns"]), default=0) for c in out.values()]
    trace_end = max([*ends, nvtx.max_end])
    ev_rows: list[tuple] = []  # rows of nvtx_events, in _NVTX_COLUMNS order
    op_rows: list[tuple] = []  # PyTorch ranges -> cpu_ops
    ann_rows: list[tuple] = []  # other ranges -> annotations
    nvtx_counts: dict[int, Counter[str]] = {u.rank: Counter() for u in units.values()}
    open_ranges = 0
    for i, (start, end, etype, gtid, end_gtid, dom, text, category, color, _) in enumerate(nvtx.events):
        pid = pid_of(gtid)
        rank = prank.get(pid)
        if rank is None:
            dropped[pid] += 1
            continue
        is_mark = etype in NVTX_MARK_TYPES
        if not is_mark and end is None:
            end = trace_end  # a range still open when the capture stopped: nsys's reports close it at the end
            open_ranges += 1
        text = text or ""
        torch = parse_torch_range(text) if not is_mark and not dom else None
        dur = None if is_mark else max(end - start, 0)
        kind = "mark" if is_mark else ("push_pop" if etype in _PUSH_POP else "start_end")
        stored = None if is_mark else ("cpu_ops" if torch else "annotations")
        domain = nvtx.domains.get((pid, dom)) if dom else None
        other_end = end_gtid if end_gtid is not None and end_gtid != gtid else None
        row = (rank, text, kind, dom, domain, start, dur, gtid, other_end, category, color, stored)
        row += (torch.seq, torch.op_id) if torch else (None, None)
        ev_rows.append(row + _payload_columns(payloads.get(i)))
        nvtx_counts[rank]["marks" if is_mark else "ranges"] += 1
        if is_mark:
            continue
        if torch:
            nvtx_counts[rank]["torch_ops"] += 1
            ext = torch.op_id if torch.op_id is not None else _SYNTHETIC_OP_ID + i
            op_rows.append((rank, torch.name, start, dur, gtid, ext, torch.input_dims))
        else:
            ann_rows.append((rank, text, start, dur, gtid))
    if ev_rows:
        out["nvtx_events"] = dict(zip(_NVTX_COLUMNS, map(list, zip(*ev_rows)), strict=True))
    ops = dict(zip(("rank", "name", "ts_ns", "dur_ns", "gtid", "external_id", "input_dims"), map(list, zip(*op_rows))))
    if op_rows:
        out["cpu_ops"] = ops
    if ann_rows:
        out["annotations"] = dict(zip(("rank", "name", "ts_ns", "dur_ns", "gtid"), map(list, zip(*ann_rows)))) | {
            "source": ["nvtx"] * len(ann_rows)
        }
    return (ops if op_rows else None), nvtx_counts, open_ranges


def _link_calls(out: dict[str, dict[str, list]], ops: dict[str, list] | None) -> None:
    """A runtime call gets the innermost PyTorch range open on its thread (`external_id`), and the kernels and
    memops it launched get the same."""
    run = out.get("runtime")
    if run is not None:
        run["external_id"] = [None] * len(run["rank"])
    if ops is None or run is None:
        return
    open_at = innermost_open(
        zip(ops["gtid"], ops["ts_ns"], map(operator.add, ops["ts_ns"], ops["dur_ns"]), ops["external_id"]),
        zip(run["gtid"], run["ts_ns"], range(len(run["rank"]))),
    )
    ext_of_corr: dict[tuple[int, int], int] = {}
    for j, ext in open_at.items():
        run["external_id"][j] = ext
        if run["correlation"][j] is not None:
            ext_of_corr[(run["rank"][j], run["correlation"][j])] = ext
    for table in ("kernels", "memops"):
        cols = out.get(table)
        if cols:
            cols["external_id"] = [ext_of_corr.get(rc) for rc in zip(cols["rank"], cols["correlation"])]


def _inputs_rows(
    ex: _Export,
    order: int,
    file_bytes: int,
    md: dict[str, str],
    meta_common: dict[str, Any],
    ranks: _RankFacts,
    nvtx: _Nvtx,
    out: dict[str, dict[str, list]],
    tables: dict[str, pa.Table],
) -> list[dict[str, Any]]:
    """One inputs row per rank of the file."""
    units = ranks.units
    summary = _per_rank(tables)
    props = _device_properties(ex, units)
    nccl_ranks = set()
    if "kernels" in tables:
        k = out["kernels"]
        nccl_ranks = {r for r, fam in zip(k["rank"], tables["kernels"].column("family").to_pylist()) if fam == "nccl"}
    version = md.get("EXPORT_PRODUCT_VERSION")
    facts = {id(prop): _prop_facts(prop, ex.bad) for prop, _ in props.values() if prop}
    long_names = names_classified_by_prefix(tables)
    if long_names:
        meta_common["names_classified_by_prefix"] = long_names
    if ex.bad:
        meta_common["bad_records"] = ex.bad.to_meta()
    inputs_rows = []
    ordered = sorted(units.values(), key=lambda u: u.rank)
    rows_owner = ordered[0]  # the file's bad records are counted once, on its first rank's row
    for u in ordered:
        first, last, events = summary.get(u.rank, (None, None, 0))
        prop, prop_source = props[(u.pid, u.device)]
        name, mem, sms, cc, prop_json = facts.get(id(prop), (None,) * 5)
        meta = meta_common | {
            "pid": u.pid,
            "process_name": nvtx.process_names.get(u.pid),
            "cuda_device": u.device,
            "device_info_source": prop_source,
            "nvtx": dict(ranks.nvtx_counts[u.rank]),
        }
        inputs_rows.append(
            {
                "input_id": order,
                "path": str(ex.path),
                "format": "nsys-sqlite",
                "profiler": f"nsys {version}" if version else "nsys",
                "file_bytes": file_bytes,
                "rank": u.rank,
                "rank_source": ranks.rank_source,
                "world_size": ranks.world_size,
                "backend": "nccl" if nvtx.nccl_names or u.rank in nccl_ranks else None,
                "nccl_version": None,
                "device_name": name,
                "device_total_mem_bytes": mem,
                "device_num_sms": sms,
                "device_compute_capability": cc,
                "trace_start_ns": first,
                "trace_end_ns": last,
                "events_total": events,
                "events_python_skipped": 0,
                "distributed_info_json": None,
                "device_properties_json": prop_json,
                "meta_json": val.json_text(meta),
                "bad_records": ex.bad.records if u is rows_owner else 0,
            }
        )
    return inputs_rows


def _prop_facts(prop: dict[str, Any], bad: BadRecords) -> tuple:
    """(name, total memory, SMs, compute capability, JSON) of a TARGET_INFO_GPU row; bad values NULL, counted."""
    chk = val.Checker(bad, "TARGET_INFO_GPU")
    name = chk.str_values("name", [prop.get("name")])[0]
    mem = chk.int_values("totalMemory", [prop.get("totalMemory")], 0, val.INT64_MAX)[0]
    sms = prop.get("smCount") if prop.get("smCount") is not None else prop.get("numMultiprocessors")
    sms = chk.int_values("smCount", [sms], 0, val.INT32_MAX)[0] or None
    major, minor = chk.int_values("computeMajor", [prop.get("computeMajor"), prop.get("computeMinor")], 0, 1000)
    cc = f"{major}.{minor}" if major is not None else None
    clean = {k: (None if isinstance(x, (bytes, bytearray)) else x) for k, x in prop.items()}
    return name, mem, sms, cc, val.json_text(clean)


def _payload_columns(pl: dict[str, Any] | None) -> tuple:
    """nvtx_events' payload columns (nccl_comm_id ... payload_json) from a decoded payload."""
    if not pl:
        return (None,) * 9
    comm, redop = pl.get("NCCL communicator ID"), pl.get("Reduction operation")
    return (
        f"0x{comm:016x}" if isinstance(comm, int) else None,
        pl.get("Message size [bytes]"),
        str(redop) if redop is not None else None,
        pl.get("Peer rank"),
        pl.get("Root"),
        pl.get("No. of ranks"),
        pl.get("Rank"),
        pl.get("CUDA device"),
        orjson.dumps(pl, default=str).decode(),
    )


def _per_rank(tables: dict[str, pa.Table]) -> dict[int, tuple[int, int, int]]:
    """rank -> (first start, last end, rows) over every table of the input."""
    out: dict[int, tuple[int, int, int]] = {}
    for t in tables.values():
        ends = pc.add(t.column("ts_ns"), pc.fill_null(t.column("dur_ns"), 0))
        agg = (
            pa.table({"rank": t.column("rank"), "ts": t.column("ts_ns"), "end": ends})
            .group_by("rank")
            .aggregate([("ts", "min"), ("end", "max"), ("ts", "count")])
        )
        for r, lo, hi, n in zip(*(agg.column(c).to_pylist() for c in ("rank", "ts_min", "end_max", "ts_count"))):
            a, b, m = out.get(r, (lo, hi, 0))
            out[r] = (min(a, lo), max(b, hi), m + n)
    return out


# --- NVTX reading ------------------------------------------------------------------------------------------


@dataclass
class _Nvtx:
    events: list[tuple] = field(default_factory=list)  # ranges and marks, by start
    domains: dict[tuple[int | None, int], str] = field(default_factory=dict)  # (pid, domainId) -> name
    mpi_ranks: dict[int | None, int] = field(default_factory=dict)  # pid -> rank from "MPI Rank N" thread names
    process_names: dict[int | None, str] = field(default_factory=dict)
    has_binary: bool = False
    max_end: int = 0
    nccl_names: set[str] = field(default_factory=set)
    bad: BadRecords | None = None


def _read_nvtx(ex: _Export) -> _Nvtx:
    out = _Nvtx(bad=ex.bad)
    if "PROCESSES" in ex.tables and {"pid", "name"} <= ex.cols("PROCESSES"):
        rows = _valid_tuples(ex, "PROCESSES", ex.rows("SELECT pid, name FROM PROCESSES"), {0: ("pid", None, None)})
        names = ex.text_values("PROCESSES", "name", [r[1] for r in rows])
        out.process_names = {r[0]: name for r, name in zip(rows, names)}
    t = "NVTX_EVENTS"
    if t not in ex.tables:
        return out
    c = ex.cols(t)
    out.has_binary = "binaryData" in c
    text = "coalesce(e.text, s.value)" if "textId" in c else "e.text"
    join = " LEFT JOIN StringIds s ON s.id = e.textId" if "textId" in c else ""
    sel = (
        f"e.start, e.end, e.eventType, e.globalTid, {ex.col(t, 'e', 'endGlobalTid')}, {ex.col(t, 'e', 'domainId')}, "
        f"{text}, {ex.col(t, 'e', 'category')}, {ex.col(t, 'e', 'color')}, {ex.col(t, 'e', 'binaryData')}"
    )
    # columns of a row: start, end, eventType, globalTid, endGlobalTid, domainId, text, category, color, binaryData
    spec = {0: ("start", *_TS), 3: ("globalTid", None, None)}
    nullable = {1: ("end", *_TS), 4: ("endGlobalTid", None, None), 5: ("domainId", None, None)}
    rows = _nvtx_rows(ex, f"SELECT {sel} FROM {t} e{join} WHERE e.eventType IN (?, ?)", (_DOMAIN_CREATE, _THREAD_NAME))
    for _start, _end, etype, gtid, _, dom, name, *_ in _valid_tuples(ex, t, rows, spec, nullable):
        if etype == _DOMAIN_CREATE and dom is not None and name:
            out.domains[(pid_of(gtid), dom)] = name
        elif etype == _THREAD_NAME and name and (m := _MPI_THREAD.match(name)) and int(m.group(1)) <= val.RANK_MAX:
            out.mpi_ranks[pid_of(gtid)] = int(m.group(1))
    wanted = NVTX_RANGE_TYPES + NVTX_MARK_TYPES
    out.events = _valid_tuples(
        ex,
        t,
        _nvtx_rows(
            ex,
            f"SELECT {sel} FROM {t} e{join} WHERE e.eventType IN ({', '.join('?' * len(wanted))}) ORDER BY e.start",
            wanted,
        ),
        spec,
        nullable,
    )
    out.max_end = max((e[1] for e in out.events if e[1] is not None), default=0)
    out.nccl_names = {e[6] for e in out.events if e[5] and e[6] and e[6].startswith("nccl")}
    return out


def _nvtx_rows(ex: _Export, sql: str, params: tuple) -> list[tuple]:
    """NVTX_EVENTS rows with their text checked (non-text NULL, undecodable bytes replaced, both counted)."""
    rows = ex.rows(sql, params)
    if not rows:
        return rows
    texts = ex.text_values("NVTX_EVENTS", "text", [r[6] for r in rows])
    return [(*r[:6], tx, *r[7:]) for r, tx in zip(rows, texts)]


def _decode_payloads(
    nvtx: _Nvtx, schemas: dict[tuple[int, int], list[SchemaEntry]], enums: dict[int, dict[int, str]]
) -> dict[int, dict[str, Any]]:
    """Event index -> decoded payload entries, for events whose binaryData a payload schema describes."""
    out: dict[int, dict[str, Any]] = {}
    if not nvtx.has_binary or not schemas:
        return out
    for i, ev in enumerate(nvtx.events):
        raw = blob_bytes(ev[9])
        if raw is None:
            continue
        parts = split_blob(raw)
        if parts is None:
            continue
        domain_id, schema_id, payload = parts
        entries = schemas.get((domain_id, schema_id)) or schemas.get((ev[5], schema_id))
        if entries:
            decoded = _checked_payload(nvtx.bad, decode_payload(entries, payload, enums))
            if decoded:
                out[i] = decoded
    return out


# payload entries the rank and communicator logic reads, with the range each must be in
_PAYLOAD_INTS = {
    "Rank": (0, val.RANK_MAX),
    "No. of ranks": (1, val.RANK_MAX + 1),
    "CUDA device": _INT32,
    "NCCL communicator ID": (0, 2**64 - 1),
    "Message size [bytes]": (0, val.COUNT_MAX),
    "Peer rank": (0, val.RANK_MAX),
    "Root": (0, val.RANK_MAX),
}


def _checked_payload(bad: BadRecords | None, pl: dict[str, Any]) -> dict[str, Any]:
    """A decoded payload without the entries the schema gave an impossible value (a double where a rank
    belongs, a size beyond any buffer); those are counted."""
    for key, (lo, hi) in _PAYLOAD_INTS.items():
        x = pl.get(key)
        if x is not None and not (type(x) is int and lo <= x <= hi):
            if bad is not None:
                bad.skipped(f"NVTX_EVENTS.binaryData.{key}", "payload entry ignored", [x])
            pl = {k: v for k, v in pl.items() if k != key}
    return pl


def _payload_note(nvtx: _Nvtx, payloads: dict[int, dict[str, Any]], md: dict[str, str]) -> str:
    if not nvtx.nccl_names:
        return "no NCCL NVTX ranges in the export"
    if payloads:
        return f"decoded from binaryData for {len(payloads)} NVTX events (see nvtx_events.message_bytes, ...)"
    blobs = md.get("EXPORT_PARAM_INCLUDE_BLOBS")
    why = " (exported with --include-blobs=false)" if blobs == "false" else ""
    return (
        f"NCCL NVTX ranges present but binaryData is NULL{why}: message size, reduction op and communicator are "
        "not available; collectives are named from kernel and range names. Re-export with "
        "`nsys export --type=sqlite --include-blobs=true` to get them"
    )


# --- ranks -------------------------------------------------------------------------------------------------


def _assign_ranks(
    ex: _Export,
    units: dict[tuple[int | None, int | None], _Unit],
    primary: dict[int | None, _Unit],
    nvtx: _Nvtx,
    payloads: dict[int, dict[str, Any]],
) -> tuple[str, int | None]:
    """Set every unit's rank; returns (rank_source, world_size or None)."""
    one_gpu_per_process = len(primary) == len(units)
    # 1. MPI: nsys's MPI trace table, else its "MPI Rank N" thread names.
    mpi: dict[int | None, int] = {}
    mpi_source = ""
    if "MPI_RANKS" in ex.tables and {"globalTid", "rank"} <= ex.cols("MPI_RANKS"):
        rows = _valid_tuples(
            ex,
            "MPI_RANKS",
            ex.rows("SELECT globalTid, rank FROM MPI_RANKS"),
            {0: ("globalTid", None, None), 1: ("rank", 0, val.RANK_MAX)},
        )
        mpi = {pid_of(g): r for g, r in rows}
        mpi_source = "MPI_RANKS table (nsys MPI trace)"
    if not mpi:
        mpi = nvtx.mpi_ranks
        mpi_source = "NVTX thread name 'MPI Rank N' (nsys MPI trace)"
    if mpi and one_gpu_per_process and all(u.pid in mpi for u in units.values()):
        ranks = [mpi[u.pid] for u in units.values()]
        if len(set(ranks)) == len(ranks):
            for u in units.values():
                u.rank = mpi[u.pid]
            return mpi_source, None
    # 2. NCCL: ncclCommInitRank payloads (Rank, No. of ranks, CUDA device), the largest communicator.
    nccl: dict[tuple[int | None, int | None], tuple[int, int]] = {}
    for i, pl in payloads.items():
        if "Rank" in pl and "No. of ranks" in pl:
            ev = nvtx.events[i]
            pid = pid_of(ev[3])
            dev = pl.get("CUDA device")
            key = (pid, dev) if (pid, dev) in units else (pid, primary[pid].device) if pid in primary else None
            if key is not None:
                nranks, rank = int(pl["No. of ranks"]), int(pl["Rank"])
                if key not in nccl or nranks > nccl[key][0]:
                    nccl[key] = (nranks, rank)
    if nccl and all(k in nccl for k in units):
        ranks = [nccl[k][1] for k in units]
        sizes = {nccl[k][0] for k in units}
        if len(set(ranks)) == len(ranks) and len(sizes) == 1:
            for k, u in units.items():
                u.rank = nccl[k][1]
            return "NCCL NVTX payload (ncclCommInitRank: Rank of the largest communicator)", sizes.pop()
    # 3. One rank per process (and GPU) with GPU work, by CUDA device then pid.
    for i, u in enumerate(sorted(units.values(), key=lambda u: (u.device if u.device is not None else -1, u.pid or 0))):
        u.rank = i
    return (
        "process order: one rank per process and GPU with GPU work, by CUDA device then pid "
        "(no MPI or NCCL rank in the export)",
        None,
    )


def _process_groups(
    units: dict[tuple[int | None, int | None], _Unit], payloads: dict[int, dict[str, Any]], nvtx: _Nvtx
) -> list[dict[str, Any]]:
    """NCCL communicators from ncclCommInitRank-style payloads (communicator id, No. of ranks, Rank)."""
    members: dict[int, dict[int, int]] = {}  # comm id -> {rank in comm: global rank}
    sizes: dict[int, int] = {}
    seen: dict[int, set[int]] = {}  # global rank -> comm ids
    primary = {u.pid: u for u in sorted(units.values(), key=lambda u: -u.gpu_events)}
    for i, pl in payloads.items():
        comm = pl.get("NCCL communicator ID")
        if comm is None or "No. of ranks" not in pl or "Rank" not in pl:
            continue
        pid = pid_of(nvtx.events[i][3])
        u = units.get((pid, pl.get("CUDA device"))) or primary.get(pid)
        if u is None:
            continue
        members.setdefault(comm, {})[int(pl["Rank"])] = u.rank
        sizes[comm] = int(pl["No. of ranks"])
        seen.setdefault(u.rank, set()).add(comm)
    out = []
    for rank, comms in sorted(seen.items()):
        for comm in sorted(comms):
            m = members[comm]
            complete = len(m) == sizes[comm]
            out.append(
                {
                    "rank": rank,
                    "pg_name": f"0x{comm:016x}",
                    "pg_desc": "NCCL communicator (NVTX payload)",
                    "backend_config": "cuda:nccl",
                    "pg_size": sizes[comm],
                    "ranks": [m[r] for r in sorted(m)] if complete else None,
                }
            )
    return out


# --- device properties -------------------------------------------------------------------------------------


def _device_properties(
    ex: _Export, units: dict[tuple[int | None, int | None], _Unit]
) -> dict[tuple[int | None, int | None], tuple[dict[str, Any] | None, str]]:
    """(pid, CUDA device) -> (TARGET_INFO_GPU row as a dict, where it came from).

    CUDA device ordinals are per process: TARGET_INFO_CUDA_DEVICE maps (pid, cudaId) to the GPU's id in
    TARGET_INFO_GPU; without it, TARGET_INFO_GPU.cuDevice (the CUDA ordinal) is used, then its id.
    """
    gpus: list[dict[str, Any]] = []
    if "TARGET_INFO_GPU" in ex.tables:
        names = [r[1] for r in ex.rows('PRAGMA table_info("TARGET_INFO_GPU")')]
        rows = ex.rows("SELECT * FROM TARGET_INFO_GPU")
        gpus = [dict(zip(names, _clean_cells(ex, "TARGET_INFO_GPU", names, r))) for r in rows]
    cuda_dev: dict[tuple[int, int], tuple[int | None, int | None]] = {}
    t = "TARGET_INFO_CUDA_DEVICE"
    if t in ex.tables and {"pid", "cudaId"} <= ex.cols(t):
        rows = ex.rows(
            f"SELECT pid, cudaId, {ex.col(t, 't', 'gpuId')}, {ex.col(t, 't', 'numMultiprocessors')} FROM {t} t"
        )
        rows = _valid_tuples(
            ex,
            t,
            rows,
            {0: ("pid", None, None), 1: ("cudaId", None, None)},
            {2: ("gpuId", None, None), 3: ("numMultiprocessors", 0, val.INT32_MAX)},
        )
        for pid, cuda_id, gpu_id, sms in rows:
            cuda_dev[(pid, cuda_id)] = (gpu_id, sms)
    out: dict[tuple[int | None, int | None], tuple[dict[str, Any] | None, str]] = {}
    for key in units:
        pid, dev = key
        gpu_id, sms = cuda_dev.get((pid, dev), (None, None)) if pid is not None and dev is not None else (None, None)
        row = None
        if gpu_id is not None:
            row = next((g for g in gpus if g.get("id") == gpu_id), None)
            source = "TARGET_INFO_CUDA_DEVICE -> TARGET_INFO_GPU"
        if row is None and gpus:
            row = next((g for g in gpus if g.get("cuDevice") == dev), None) or next(
                (g for g in gpus if g.get("id") == dev), None
            )
            source = "TARGET_INFO_GPU (by CUDA device ordinal)"
        if row is None and (gpu_id is not None or sms is not None):
            row = {"id": gpu_id, "numMultiprocessors": sms}
            source = "TARGET_INFO_CUDA_DEVICE (SM count only)"
        out[key] = (row, source) if row is not None else (None, "absent: no TARGET_INFO_GPU or TARGET_INFO_CUDA_DEVICE")
    return out


def _clean_cells(ex: _Export, table: str, names: list[str], row: tuple) -> list[Any]:
    """A row kept whole (as JSON): blobs set to NULL, undecodable text replaced, both counted."""
    out = []
    for name, x in zip(names, row):
        if isinstance(x, bytes):
            ex.bad.skipped(f"{table}.{name}", "value set to NULL", [x])
            x = None
        elif type(x) is str and val.has_surrogates(x):
            x = ex.text_values(table, name, [x])[0]
        out.append(x)
    return out


# --- arrow ---

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


__all__ = ["parse_nsys_rep", "parse_nsys_sqlite", "pid_of", "tid_of"]
