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
Every value read goes through `tracediag.ingest.validate` (export.py `_valid_rows`, tables.py `_to_arrow`): a row
whose time, device or thread is not an integer in range (text or a blob in an integer column, an end before 2**63
overflowing the subtraction) is dropped, another out-of-range or wrongly typed value is set to NULL, text that is
not UTF-8 is kept with U+FFFD in place of the bad bytes; all are counted in the input's `bad_records`.

Schema sources: the NVIDIA Nsight Systems SQLite export schema (table comments in the exports
themselves) and the stats scripts shipped with nsys (reports/nvtx_kern_sum.py: pid = (globalTid >> 24) &
0xFFFFFF, tid = globalTid & 0xFFFFFF, NVTX range event types 59/60/70/71, domain create 75).

The package, by concern:
  file.py      the file checked: a complete SQLite database, opened read-only; SQLite's messages for a damaged one
  export.py    the export: tables and columns probed, queries run (a missing column named, non-UTF-8 text read
               leniently), metadata and enums; rows read as columns, rows that cannot be placed dropped and counted
  gpu.py       kernels, memcpys, memsets, synchronization and CUDA runtime/driver calls, on their ranks
  nvtx.py      NVTX_EVENTS read: domains, process and "MPI Rank N" thread names, ranges and marks
  payloads.py  NVTX binaryData payloads (NCCL message sizes, communicators, ranks) decoded by the export's schemas
  ranks.py     one rank per process and GPU, numbered from MPI, NCCL payloads or process order; process groups
  ranges.py    NVTX ranges and marks -> nvtx_events, cpu_ops, annotations; runtime calls, kernels, memops linked
               to the PyTorch range open on their thread
  tables.py    the canonical Arrow tables: the columns each stores, values checked, names classified
  meta.py      the inputs rows: time span, GPU properties (TARGET_INFO_GPU / _CUDA_DEVICE), rank source, metadata
  here         `parse_nsys_sqlite`, `parse_nsys_rep` (through `nsys export`), and the tables built in order
"""

from __future__ import annotations

import shlex
import shutil
import sqlite3
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from tracediag.errors import InputError
from tracediag.ingest.base import IngestOptions, Parsed
from tracediag.ingest.nsys.export import _Export, pid_of, tid_of
from tracediag.ingest.nsys.file import _DAMAGED, _check_file, _connect
from tracediag.ingest.nsys.gpu import _gpu_activity, _gpu_sync, _read_gpu, _runtime_calls
from tracediag.ingest.nsys.meta import _inputs_rows, _RankFacts
from tracediag.ingest.nsys.nvtx import NVTX_MARK_TYPES, NVTX_RANGE_TYPES, _read_nvtx
from tracediag.ingest.nsys.payloads import _decode_payloads, _payload_note, _payload_schemas
from tracediag.ingest.nsys.ranges import _link_calls, _nvtx_tables
from tracediag.ingest.nsys.ranks import _assign_ranks, _process_groups, _units
from tracediag.ingest.nsys.tables import _to_arrow
from tracediag.inputfile import regular_file


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


__all__ = ["NVTX_MARK_TYPES", "NVTX_RANGE_TYPES", "parse_nsys_rep", "parse_nsys_sqlite", "pid_of", "tid_of"]
