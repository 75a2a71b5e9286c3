"""Dump what the Nsight Systems parser makes of every vendored export (and of edited copies that reach its edge
cases), so that two versions of the parser can be compared exactly:

    PYTHONPATH=/path/to/old python benchmarks/nsys_tables_dump.py /tmp/old
    PYTHONPATH=$PWD .venv/bin/python benchmarks/nsys_tables_dump.py /tmp/new
    .venv/bin/python benchmarks/nsys_tables_dump.py --compare /tmp/old /tmp/new

Inputs: every `*.sqlite` under tests/data/, as it is, and copies of them edited in a temporary folder: NCCL
payloads in binaryData (ncclSend message sizes, ncclCommInitRank ranks), ranges left open, a runtime call sharing
its correlation id, no TARGET_INFO_CUDA_DEVICE or TARGET_INFO_GPU, the MPI_RANKS table, the hostile cells of
tests/test_ingest_nsys.py (blobs, text and overflowing numbers where integers belong, text that is not UTF-8),
and exports the parser refuses. Each dump is one Arrow IPC file per table and meta.json (the inputs rows, process
groups, and for an input the parser rejects, its error).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import struct
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNEL_1 = "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET {} WHERE rowid = (SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)"


def _exports() -> list[Path]:
    return sorted((ROOT / "tests" / "data").rglob("*.sqlite"))


def _with_blobs(con: sqlite3.Connection) -> None:
    payload = struct.pack("<QQi4x", 0xFEED, 1 << 20, 1)
    blob = (struct.pack("<QQQQ", 1, 16777226, len(payload), 32) + payload).hex()
    sends = "SELECT id FROM StringIds WHERE value = 'ncclSend'"
    con.execute(f"UPDATE NVTX_EVENTS SET binaryData = ? WHERE textId IN ({sends})", (blob,))


def _with_init(con: sqlite3.Connection) -> None:
    con.execute("INSERT INTO StringIds (id, value) VALUES ((SELECT max(id) + 1 FROM StringIds), 'ncclCommInitRank')")
    sid = con.execute("SELECT id FROM StringIds WHERE value = 'ncclCommInitRank'").fetchone()[0]
    threads = con.execute("SELECT globalTid, min(start) FROM NVTX_EVENTS WHERE domainId = 1 GROUP BY 1 ORDER BY 1")
    for k, (gtid, t0) in enumerate(threads.fetchall()):
        payload = struct.pack("<Qiii4x", 0xC0FFEE, 2, 1 - k % 2, k)
        blob = struct.pack("<QQQQ", 1, 16777218, len(payload), 32) + payload
        con.execute(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, textId, domainId, binaryData) "
            "VALUES (?, ?, 59, ?, ?, 1, ?)",
            (t0 - 1000, t0 - 10, gtid, sid, blob),
        )


def _mpi_ranks(con: sqlite3.Connection) -> None:
    con.execute("CREATE TABLE MPI_RANKS (globalTid INTEGER, rank INTEGER)")
    gtids = con.execute("SELECT DISTINCT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME ORDER BY 1").fetchall()
    con.executemany("INSERT INTO MPI_RANKS VALUES (?, ?)", [(g, len(gtids) - i) for i, (g,) in enumerate(gtids)])


EDITS: dict[str, tuple[str, list]] = {
    "blobs": ("nsysai_2xh100_before.sqlite", [_with_blobs]),
    "init_rank": ("nsysai_2xh100_before.sqlite", [_with_init]),
    "mpi_ranks": ("nsysai_2xh100_after.sqlite", [_mpi_ranks]),
    "open_ranges": ("nsysai_2xh100_after.sqlite", ['UPDATE NVTX_EVENTS SET "end" = NULL WHERE rowid % 7 = 0']),
    "shared_corr": ("pipit_saxpy_mpi_nvtx.sqlite", [
        "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = (SELECT min(correlationId) FROM "
        "CUPTI_ACTIVITY_KIND_RUNTIME) WHERE rowid % 5 = 0"]),
    "no_cuda_device": ("pipit_saxpy_mpi_nvtx.sqlite", ["DROP TABLE IF EXISTS TARGET_INFO_CUDA_DEVICE"]),
    "no_gpu_info": ("nsysai_rtx3080_minimal.sqlite", ["DROP TABLE IF EXISTS TARGET_INFO_GPU",
                                                      "DROP TABLE IF EXISTS TARGET_INFO_CUDA_DEVICE"]),
    "no_event_class": ("nsysai_rtx3080_minimal.sqlite", ["DROP TABLE IF EXISTS ENUM_NSYS_EVENT_CLASS",
                                                         "DROP TABLE IF EXISTS ENUM_CUDA_MEM_KIND"]),
    "kernel_blob_device": ("nsysai_rtx3080_minimal.sqlite", [KERNEL_1.format("deviceId = x'00ff10'")]),
    "kernel_big_device": ("nsysai_rtx3080_minimal.sqlite", [KERNEL_1.format("deviceId = 1099511627776")]),
    "kernel_text_start": ("nsysai_rtx3080_minimal.sqlite", [KERNEL_1.format("start = 'text'")]),
    "kernel_overflow": ("nsysai_rtx3080_minimal.sqlite", [
        KERNEL_1.format('start = -9000000000000000000, "end" = 9000000000000000000')]),
    "kernel_real_end": ("nsysai_rtx3080_minimal.sqlite", [KERNEL_1.format('"end" = 1e308')]),
    "not_utf8": ("nsysai_rtx3080_minimal.sqlite", [
        "UPDATE StringIds SET value = CAST(x'6b65726e656cff' AS TEXT) WHERE id = "
        "(SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start LIMIT 1)"]),
    "bad_cells": ("nsysai_rtx3080_minimal.sqlite", [
        "UPDATE META_DATA_EXPORT SET value = x'00ff' WHERE name = 'EXPORT_PRODUCT_VERSION'",
        "UPDATE ENUM_NSYS_EVENT_CLASS SET label = x'ff00'",
        "UPDATE TARGET_INFO_GPU SET name = x'ff', totalMemory = 'lots', computeMajor = 1e300",
        "UPDATE PROCESSES SET name = x'00', pid = 'x'",
        "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = 'x', globalTid = x'01'"]),
    "nvtx_bad_cells": ("pipit_saxpy_mpi_nvtx.sqlite", [
        "UPDATE NVTX_EVENTS SET globalTid = 'x' WHERE rowid % 11 = 0",
        "UPDATE NVTX_EVENTS SET domainId = x'01' WHERE rowid % 13 = 0"]),
    "no_gpu_work": ("nsysai_rtx3080_minimal.sqlite", ["DELETE FROM CUPTI_ACTIVITY_KIND_KERNEL",
                                                      "DELETE FROM CUPTI_ACTIVITY_KIND_MEMCPY"]),
    "not_nsys": ("nsysai_rtx3080_minimal.sqlite", ["DROP TABLE StringIds"]),
    "missing_column": ("nsysai_rtx3080_minimal.sqlite", [
        "ALTER TABLE CUPTI_ACTIVITY_KIND_KERNEL RENAME COLUMN start TO begin"]),
}  # fmt: skip


def _edited(work: Path) -> list[tuple[str, Path]]:
    out = []
    for name, (src, edits) in EDITS.items():
        p = work / f"{name}.sqlite"
        shutil.copyfile(ROOT / "tests" / "data" / "external" / "nsys" / src, p)
        con = sqlite3.connect(p)
        for e in edits:
            e(con) if callable(e) else con.execute(e)
        con.commit()
        con.close()
        out.append((f"edited__{name}", p))
    return out


def _dump_one(path: Path, out: Path) -> None:
    import pyarrow as pa

    from tracediag.errors import TracediagError
    from tracediag.ingest import without_pandas
    from tracediag.ingest.nsys import parse_nsys_sqlite

    out.mkdir(parents=True, exist_ok=True)
    with without_pandas():
        try:
            parsed = parse_nsys_sqlite(path, 0)
        except TracediagError as exc:
            (out / "meta.json").write_text(json.dumps({"error": str(exc).replace(str(path), "<input>")}))
            return
    for name, t in parsed.tables.items():
        with pa.ipc.new_file(out / f"{name}.arrow", t.schema) as w:
            w.write_table(t.combine_chunks())
    rows = [{k: (v if k != "path" else None) for k, v in r.items()} for r in parsed.inputs_rows]
    meta = {"inputs_rows": rows, "process_groups": parsed.process_groups, "format": parsed.format}
    (out / "meta.json").write_text(json.dumps(meta, sort_keys=True, default=str))


def dump(dest: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        cases = [(str(f.relative_to(ROOT)).replace("/", "__"), f) for f in _exports()] + _edited(Path(tmp))
        for key, path in cases:
            _dump_one(path, dest / key)
            print(key, file=sys.stderr)


def compare(old: Path, new: Path) -> int:
    import pyarrow as pa

    bad = 0
    cases = sorted(p.relative_to(old) for p in old.iterdir())
    if cases != sorted(p.relative_to(new) for p in new.iterdir()):
        print("the two dumps hold different inputs")
        return 1
    for case in cases:
        a, b = old / case, new / case
        if (a / "meta.json").read_bytes() != (b / "meta.json").read_bytes():
            print(f"{case}: meta differs")
            bad += 1
        names = sorted(p.name for p in a.glob("*.arrow"))
        if names != sorted(p.name for p in b.glob("*.arrow")):
            print(f"{case}: tables differ: {names}")
            bad += 1
            continue
        for n in names:
            ta = pa.ipc.open_file(a / n).read_all()
            tb = pa.ipc.open_file(b / n).read_all()
            if not ta.equals(tb, check_metadata=True) or (a / n).read_bytes() != (b / n).read_bytes():
                print(f"{case}/{n}: differs ({ta.num_rows} vs {tb.num_rows} rows)")
                bad += 1
    print(f"{len(cases)} parses compared, {bad} differ")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dest", nargs="?", type=Path)
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("OLD", "NEW"))
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if args.dest is None:
        ap.error("give DEST, or --compare OLD NEW")
    dump(args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
