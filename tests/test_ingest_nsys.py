"""Nsight Systems SQLite exports: every real export in tests/data/external/nsys ingests, and what lands in the
store is checked against direct sqlite3 queries of the same file (an independent read)."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import stat
import struct
from pathlib import Path

import duckdb
import pytest
from conftest import EXTERNAL

from tracediag.analysis import analyze
from tracediag.errors import InputError
from tracediag.ingest import detect_format, parse_one
from tracediag.ingest.base import IngestOptions
from tracediag.ingest.nsys import parse_nsys_rep, parse_nsys_sqlite
from tracediag.ingest.nsys_nvtx import SchemaEntry, decode_payload, innermost_open, parse_torch_range, split_blob
from tracediag.pipeline import store_from

NSYS_DATA = EXTERNAL / "nsys"
ALL_FILES = sorted(p.name for p in NSYS_DATA.glob("*.sqlite"))
BEFORE, AFTER = "nsysai_2xh100_before.sqlite", "nsysai_2xh100_after.sqlite"
GPU_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


def nsys_file(name: str) -> Path:
    p = NSYS_DATA / name
    if not p.exists():
        raise FileNotFoundError(f"{p} missing (vendored real inputs: tests/data/external/README.md)")
    return p


def _src(name: str) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{nsys_file(name)}?mode=ro&immutable=1", uri=True)


def _tables(src: sqlite3.Connection) -> set[str]:
    return {r[0] for r in src.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def _count(src: sqlite3.Connection, table: str, where: str = "1") -> int:
    return src.execute(f"SELECT count(*) FROM {table} WHERE {where}").fetchone()[0] if table in _tables(src) else 0


def _gpu_pids(src: sqlite3.Connection) -> str:
    """SQL list of the pids that ran GPU work: only their host events are stored."""
    parts = [f"SELECT DISTINCT (globalPid >> 24) & 16777215 FROM {t}" for t in GPU_TABLES if t in _tables(src)]
    return " UNION ".join(parts)


@pytest.fixture(scope="module")
def stores() -> dict[str, duckdb.DuckDBPyConnection]:
    out = {}
    for name in ALL_FILES:
        out[name] = store_from([parse_nsys_sqlite(nsys_file(name), order=0)])
    return out


def _q(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple]:
    return con.execute(sql).fetchall()


def test_vendored_nsys_data_present():
    assert len(ALL_FILES) >= 4, f"expected the real Nsight exports in {NSYS_DATA}"


@pytest.mark.parametrize("name", ALL_FILES)
def test_every_export_ingests_with_exact_counts(name, stores):
    con, src = stores[name], _src(name)
    one = lambda sql: con.execute(sql).fetchone()[0]  # noqa: E731
    assert one("SELECT count(*) FROM kernels") == _count(src, "CUPTI_ACTIVITY_KIND_KERNEL") > 0
    assert one("SELECT count(*) FROM memops WHERE kind = 'memcpy'") == _count(src, "CUPTI_ACTIVITY_KIND_MEMCPY")
    assert one("SELECT count(*) FROM memops WHERE kind = 'memset'") == _count(src, "CUPTI_ACTIVITY_KIND_MEMSET")
    gpu_pids = _gpu_pids(src)
    in_gpu_pid = f"((globalTid >> 24) & 16777215) IN ({gpu_pids})"
    assert one("SELECT count(*) FROM runtime") == _count(src, "CUPTI_ACTIVITY_KIND_RUNTIME", in_gpu_pid)
    ranges = _count(src, "NVTX_EVENTS", f"eventType IN (59, 60, 70, 71) AND {in_gpu_pid}")
    marks = _count(src, "NVTX_EVENTS", f"eventType IN (34, 65) AND {in_gpu_pid}")
    assert one("SELECT count(*) FROM nvtx_events WHERE kind <> 'mark'") == ranges
    assert one("SELECT count(*) FROM nvtx_events WHERE kind = 'mark'") == marks
    assert one("SELECT count(*) FROM cpu_ops") + one("SELECT count(*) FROM annotations") == ranges
    assert one("SELECT count(*) FROM gpu_sync") == _count(src, "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION")
    for table in ("kernels", "memops", "runtime", "cpu_ops", "annotations", "gpu_sync"):
        assert one(f"SELECT count(*) FROM {table} WHERE dur_ns < 0 OR rank IS NULL") == 0
    assert one("SELECT count(*) FROM kernels WHERE klass IS NULL") == 0  # catalog classification ran
    assert one("SELECT count(*) FROM steps") >= 1


@pytest.mark.parametrize("name", ALL_FILES)
def test_kernel_rows_match_the_source(name, stores):
    """Name = demangled name through StringIds; times, device, stream, grid/block and correlation verbatim."""
    want = sorted(
        (n, t, d, dev, st, c, [gx, gy, gz], [bx, by, bz])
        for n, t, d, dev, st, c, gx, gy, gz, bx, by, bz in _src(name).execute(
            "SELECT s.value, k.start, k.end - k.start, k.deviceId, k.streamId, k.correlationId, "
            "k.gridX, k.gridY, k.gridZ, k.blockX, k.blockY, k.blockZ "
            "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName"
        )
    )
    got = sorted(_q(stores[name], "SELECT name, ts_ns, dur_ns, device, stream, correlation, grid, block FROM kernels"))
    assert got == want


def test_2022_and_2026_export_schemas_are_both_read():
    old = parse_nsys_sqlite(nsys_file("pipit_saxpy_mpi_nvtx.sqlite"))  # EXPORT_META_DATA, schema 2.9.1
    new = parse_nsys_sqlite(nsys_file(BEFORE))  # META_DATA_EXPORT, schema 3.25.0
    m_old, m_new = (json.loads(p.inputs_rows[0]["meta_json"]) for p in (old, new))
    assert (old.inputs_rows[0]["profiler"], m_old["export_metadata_table"], m_old["export_schema_version"]) == (
        "nsys 2022.2.1.31",
        "EXPORT_META_DATA",
        "2.9.1",
    )
    assert (new.inputs_rows[0]["profiler"], m_new["export_metadata_table"], m_new["export_schema_version"]) == (
        "nsys 2026.2.1.210",
        "META_DATA_EXPORT",
        "3.25.0",
    )


def test_runtime_and_memop_names_read_like_kineto(stores):
    con = stores[BEFORE]
    names = dict(_q(con, "SELECT name, count(*) FROM runtime GROUP BY 1"))
    launches = _src(BEFORE).execute(
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
        "WHERE s.value = 'cudaLaunchKernel_v7000'"
    )
    assert names["cudaLaunchKernel"] == launches.fetchone()[0] > 0
    assert not [n for n in names if n.endswith(("_v7000", "_v3020"))]
    cats = dict(_q(con, "SELECT name, any_value(cat) FROM runtime GROUP BY 1"))
    assert cats["cuLaunchKernelEx"] == "cuda_driver" and cats["cudaMemcpyAsync"] == "cuda_runtime"
    memops = {n for (n,) in _q(con, "SELECT DISTINCT name FROM memops")}
    assert "Memcpy HtoD (Pinned -> Device)" in memops or "Memcpy HtoD (Pageable -> Device)" in memops
    assert {n for n in memops if n.startswith("Memset")} == {"Memset (Device)"}
    syncs = {n for (n,) in _q(con, "SELECT DISTINCT name FROM gpu_sync")}
    assert syncs <= {"Event Sync", "Stream Wait Event", "Stream Sync", "Context Sync"} and syncs


def test_processes_become_ranks_with_decoded_pids(stores):
    """globalPid >> 24 & 0xFFFFFF is the pid PROCESSES lists; one rank per process with GPU work."""
    for name in (BEFORE, AFTER):
        rows = _q(stores[name], "SELECT rank, meta_json, rank_source, backend FROM inputs ORDER BY rank")
        procs = dict(_src(name).execute("SELECT pid, name FROM PROCESSES"))
        assert [r[0] for r in rows] == [0, 1]
        metas = [json.loads(r[1]) for r in rows]
        assert [m["cuda_device"] for m in metas] == [0, 1]
        assert all(procs[m["pid"]] == "python3" == m["process_name"] for m in metas)
        assert all(r[2].startswith("process order") and r[3] == "nccl" for r in rows)
        # NCCL binaryData is NULL in these exports: the input says so
        assert all(
            "binaryData is NULL" in m["nccl_payload"] and "--include-blobs=true" in m["nccl_payload"] for m in metas
        )
        tids = {t for (t,) in _q(stores[name], "SELECT DISTINCT tid FROM runtime")}
        want = {
            str(g & 0xFFFFFF)
            for (g,) in _src(name).execute("SELECT DISTINCT globalTid FROM CUPTI_ACTIVITY_KIND_RUNTIME")
        }
        assert tids == want


def test_mpi_rank_comes_from_the_nsys_mpi_thread_name(stores):
    ((rank, source),) = _q(stores["pipit_saxpy_mpi_nvtx.sqlite"], "SELECT rank, rank_source FROM inputs")
    assert rank == 0 and "MPI Rank" in source
    domains = dict(
        _q(stores["pipit_saxpy_mpi_nvtx.sqlite"], "SELECT name, any_value(domain) FROM nvtx_events GROUP BY 1")
    )
    assert domains["MPI_Send"] == "MPI" and domains["saxpy"] is None  # domain from its nvtxDomainCreate event


@pytest.mark.parametrize(
    ("name", "device", "sms", "cc", "mem", "source"),
    [
        ("nsysai_rtx3080_minimal.sqlite", "NVIDIA GeForce RTX 3080", 68, "8.6", 10736893952, "TARGET_INFO_CUDA_DEVICE"),
        ("pipit_saxpy_mpi_nvtx.sqlite", "NVIDIA A100-SXM4-40GB", 108, "8.0", 42297524224, "TARGET_INFO_GPU"),
        (BEFORE, None, None, None, None, "absent"),
    ],
)
def test_gpu_properties_reach_the_inputs_row(name, device, sms, cc, mem, source, stores):
    cols = "device_name, device_num_sms, device_compute_capability, device_total_mem_bytes, meta_json"
    for row in _q(stores[name], f"SELECT {cols} FROM inputs"):
        assert row[:4] == (device, sms, cc, mem)
        assert json.loads(row[4])["device_info_source"].startswith(source)


# --- the 2xH100 before/after pair -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def h100_reports():
    return {name: analyze([nsys_file(name)], db_path=None) for name in (BEFORE, AFTER)}


@pytest.mark.parametrize("name", [BEFORE, AFTER])
def test_nccl_kernels_become_collectives_per_gpu(name, stores, h100_reports):
    con, src = stores[name], _src(name)
    want = dict(
        src.execute(
            "SELECT k.deviceId, count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
            "WHERE s.value LIKE 'ncclDevKernel%' GROUP BY 1"
        )
    )
    assert len(want) == 2 and all(n > 20 for n in want.values())
    # every NCCL kernel of each GPU is the GPU side of exactly one collective call of that rank
    got = dict(
        _q(
            con,
            "SELECT i.rank, count(DISTINCT c.gpu_ts_ns) FROM collectives c JOIN inputs i USING (rank) "
            "WHERE c.gpu_ts_ns IS NOT NULL GROUP BY 1",
        )
    )
    assert got == {0: want[0], 1: want[1]}
    # the PyTorch NVTX ranges name the calls: c10d::alltoall_base_ > record_param_comms > nccl:all_to_all
    ops = dict(_q(con, "SELECT op, count(*) FROM collectives WHERE call_name = 'c10d::alltoall_base_' GROUP BY 1"))
    assert set(ops) == {"all_to_all"} and ops["all_to_all"] >= 2 * min(want.values()) - 2
    report = h100_reports[name]
    (inp,) = report.inputs
    assert inp["format"] == "nsys-sqlite" and inp["profiler"] == "nsys 2026.2.1.210" and inp["ranks"] == [0, 1]
    assert inp["counts"]["collectives"] >= sum(want.values())
    # an FSDP training job whose two ranks exchange only all-to-all (expert/sequence parallel): no TP group
    assert report.tp is not None and report.tp.p == 1 and "no tensor-parallel group" in report.tp.source


@pytest.mark.parametrize("name", [BEFORE, AFTER])
def test_pytorch_nvtx_ranges_are_linked_to_their_kernels(name, stores):
    """kernel -> runtime call (correlation) -> innermost PyTorch range on the calling thread (external_id).

    Checked independently in SQL: the linked op's range holds the launch, on the launch's thread, and no
    shorter PyTorch range on that thread also holds it."""
    con = stores[name]
    linked = con.execute("SELECT count(*) FROM kernels WHERE external_id IS NOT NULL").fetchone()[0]
    total = con.execute("SELECT count(*) FROM kernels").fetchone()[0]
    assert linked > 0.9 * total
    bad = con.execute(
        """
        SELECT count(*) FROM kernels k
        JOIN runtime r ON r.rank = k.rank AND r.correlation = k.correlation
        JOIN cpu_ops o ON o.rank = k.rank AND o.external_id = k.external_id
        WHERE NOT (o.tid = r.tid AND o.ts_ns <= r.ts_ns AND r.ts_ns <= o.ts_ns + o.dur_ns)
           OR EXISTS (SELECT 1 FROM cpu_ops x WHERE x.rank = o.rank AND x.tid = r.tid AND x.dur_ns < o.dur_ns
                      AND x.ts_ns <= r.ts_ns AND r.ts_ns <= x.ts_ns + x.dur_ns)
        """
    ).fetchone()[0]
    assert bad == 0
    # and launches inside no range are left unlinked, not guessed
    unlinked_inside = con.execute(
        """
        SELECT count(*) FROM kernels k JOIN runtime r ON r.rank = k.rank AND r.correlation = k.correlation
        WHERE k.external_id IS NULL AND EXISTS (SELECT 1 FROM cpu_ops x WHERE x.rank = r.rank AND x.tid = r.tid
              AND x.ts_ns <= r.ts_ns AND r.ts_ns <= x.ts_ns + x.dur_ns)
        """
    ).fetchone()[0]
    assert unlinked_inside == 0
    pairs = dict(
        _q(
            con,
            "SELECT o.name || ' -> ' || k.klass, count(*) FROM kernels k JOIN cpu_ops o "
            "ON o.rank = k.rank AND o.external_id = k.external_id GROUP BY 1",
        )
    )
    assert pairs["aten::addmm -> gemm"] > 0  # the kernel dispatch of each op is in the store
    assert pairs["nccl:all_to_all -> collective"] > 0
    assert pairs["flash_attn::_flash_attn_forward -> attention"] > 0
    families = {f for (f,) in _q(con, "SELECT DISTINCT family FROM kernels WHERE klass <> 'other'")}
    assert {"nccl", "cublas", "fa2", "aten"} <= families


# --- bad input ------------------------------------------------------------------------------------------------


def test_sqlite_that_is_not_an_nsys_export_is_refused(tmp_path):
    p = tmp_path / "notes.sqlite"
    con = sqlite3.connect(p)
    con.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    con.execute("INSERT INTO notes (body) VALUES ('hello')")
    con.commit()
    con.close()
    assert detect_format(p) == "nsys-sqlite"
    with pytest.raises(InputError, match="SQLite database, but not an Nsight Systems export") as exc:
        parse_one(p, None, 0, IngestOptions())
    assert "notes" in str(exc.value)


@pytest.mark.parametrize("keep", [0.5, 0.999])
def test_truncated_export_is_refused(tmp_path, keep):
    src = nsys_file(BEFORE)
    data = src.read_bytes()
    p = tmp_path / "cut.sqlite"
    p.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(InputError, match="truncated SQLite file"):
        parse_nsys_sqlite(p)


def test_corrupt_export_is_refused(tmp_path):
    """Whole pages, right size, garbage inside: SQLite's own error becomes one clear line."""
    data = bytearray(nsys_file("nsysai_rtx3080_minimal.sqlite").read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[page : page * 8] = b"\xa5" * (page * 7)  # the schema's b-tree pages
    p = tmp_path / "corrupt.sqlite"
    p.write_bytes(bytes(data))
    with pytest.raises(InputError, match="corrupt or truncated SQLite file"):
        parse_nsys_sqlite(p)


def test_empty_and_non_sqlite_files_are_refused(tmp_path):
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    with pytest.raises(InputError, match="file is empty"):
        parse_nsys_sqlite(empty)
    kineto = EXTERNAL / "kineto" / "hta_large_integer.pt.trace.json.gz"
    with pytest.raises(InputError, match="not an SQLite database"):
        parse_nsys_sqlite(kineto)


def test_nsys_rep_without_nsys_names_the_command(tmp_path, monkeypatch):
    # The report's content is never read when nsys is missing; no real .nsys-rep is in the vendored data.
    rep = tmp_path / "profile run.nsys-rep"
    rep.write_bytes(b"placeholder: nsys is absent, so only the path matters")
    monkeypatch.setenv("PATH", str(tmp_path / "no-bin"))
    assert detect_format(rep) == "nsys-rep"
    with pytest.raises(InputError) as exc:
        parse_one(rep, None, 0, IngestOptions())
    msg = str(exc.value)
    assert "nsys export --type=sqlite --include-blobs=true --output='profile run.sqlite' 'profile run.nsys-rep'" in msg
    assert "not on the PATH" in msg and "\n" not in msg


def test_nsys_rep_is_exported_with_nsys_when_present(tmp_path, monkeypatch):
    """`nsys` here is a stand-in script (no Nsight Systems on the test machines) that records its arguments and
    writes a real export to --output, refusing --include-blobs like an older nsys would."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.txt"
    fake = bin_dir / "nsys"
    fake.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> "{log}"\n'
        'for a in "$@"; do case "$a" in --include-blobs=*) echo "unknown option: $a" >&2; exit 1;; '
        f'--output=*) cp "{nsys_file("pipit_saxpy_mpi_nvtx.sqlite")}" "${{a#--output=}}";; esac; done\n'
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    rep = tmp_path / "saxpy.nsys-rep"
    rep.write_bytes(b"stand-in report")
    parsed = parse_nsys_rep(rep)
    calls = log.read_text().splitlines()
    assert len(calls) == 2 and "--include-blobs=true" in calls[0] and "--include-blobs" not in calls[1]
    assert calls[1].startswith("export --type=sqlite --force-overwrite=true --output=")
    assert parsed.path == str(rep) and parsed.format == "nsys-rep"
    assert parsed.inputs_rows[0]["format"] == "nsys-rep" and parsed.tables["kernels"].num_rows == 5
    shutil.rmtree(bin_dir)


# --- NVTX helpers ---------------------------------------------------------------------------------------------


def test_pytorch_range_text_from_the_export_is_parsed():
    texts = [t for (t,) in _src(BEFORE).execute("SELECT DISTINCT text FROM NVTX_EVENTS WHERE domainId = 0 LIMIT 500")]
    parsed = [parse_torch_range(t) for t in texts]
    assert all(p is not None and p.op_id is not None for p in parsed)
    r = parse_torch_range("aten::linear, seq = 45337, op_id = 990384")
    assert (r.name, r.seq, r.op_id, r.input_dims) == ("aten::linear", 45337, 990384, None)
    # torch/csrc/profiler/util.cpp getNvtxStr with record_shapes: ", sizes = [[..], ..]" then input_op_ids
    r = parse_torch_range("aten::mm, seq = 7, op_id = 12, sizes = [[48, 256], [256, 768]], input_op_ids = [(11,0)]")
    assert (r.name, r.input_dims) == ("aten::mm", "[[48, 256], [256, 768]]")
    assert parse_torch_range("aten::empty, sizes = [[]]").input_dims == "[[]]"
    assert parse_torch_range("ncclGroupEnd") is None and parse_torch_range("step 3, warmup") is None


def test_nccl_payload_decodes_with_the_exports_schema_tables():
    """Payload bytes packed like NCCL's NcclNvtxParamsAllReduce (src/include/nvtx_payload_schemas.h) behind the
    32-byte binaryData header; synthetic because every real export here was made without --include-blobs."""
    rows = _src(BEFORE).execute(
        "SELECT DISTINCT idx, name, type, offset FROM NVTX_PAYLOAD_SCHEMA_ENTRIES WHERE schemaId = 16777223"
    )
    entries = [SchemaEntry(i, n, t, o) for i, n, t, o in rows]
    assert [e.name for e in sorted(entries, key=lambda e: e.idx)] == [
        "NCCL communicator ID",
        "Message size [bytes]",
        "Reduction operation",
    ]
    payload = struct.pack("<QQi4x", 0x1234ABCD, 8 * 4096 * 2, 0)
    blob = struct.pack("<QQQQ", 1, 16777223, len(payload), 32) + payload
    domain, schema, body = split_blob(blob)
    assert (domain, schema) == (1, 16777223)
    assert decode_payload(entries, body) == {
        "NCCL communicator ID": 0x1234ABCD,
        "Message size [bytes]": 65536,
        "Reduction operation": "sum",
    }


def test_nccl_payload_lands_in_nvtx_events(tmp_path):
    """A copy of a real export whose ncclSend ranges get binaryData (hex text) packed per NCCL's
    NcclNvtxParamsSendRecv schema: the decoded message size and peer are stored, and the input says so."""
    p = tmp_path / "with_blobs.sqlite"
    shutil.copyfile(nsys_file(BEFORE), p)
    con = sqlite3.connect(p)
    payload = struct.pack("<QQi4x", 0xFEED, 1 << 20, 1)
    blob = (struct.pack("<QQQQ", 1, 16777226, len(payload), 32) + payload).hex()
    sid = con.execute("SELECT id FROM StringIds WHERE value = 'ncclSend'").fetchone()[0]
    n = con.execute("UPDATE NVTX_EVENTS SET binaryData = ? WHERE textId = ?", (blob, sid)).rowcount
    con.commit()
    con.close()
    parsed = parse_nsys_sqlite(p)
    ev = parsed.tables["nvtx_events"].to_pylist()
    sends = [e for e in ev if e["name"] == "ncclSend"]
    assert len(sends) == n > 0
    assert {(e["message_bytes"], e["peer"], e["nccl_comm_id"]) for e in sends} == {(1 << 20, 1, "0x000000000000feed")}
    assert json.loads(parsed.inputs_rows[0]["meta_json"])["nccl_payload"].startswith(f"decoded from binaryData for {n}")


def test_innermost_open_range_per_thread():
    ranges = [("t1", 0, 100, 1), ("t1", 10, 50, 2), ("t1", 20, 30, 3), ("t1", 60, 70, 4), ("t2", 0, 100, 9)]
    points = [("t1", 25, 0), ("t1", 40, 1), ("t1", 65, 2), ("t1", 80, 3), ("t1", 150, 4), ("t2", 5, 5), ("t3", 5, 6)]
    assert innermost_open(ranges, points) == {0: 3, 1: 2, 2: 4, 3: 1, 5: 9}


def test_ranks_come_from_ncclCommInitRank_payloads(tmp_path):
    """A copy of a real export with one ncclCommInitRank range per process added, its binaryData packed per
    NCCL's NcclNvtxParamsCommInitRank schema (schema 16777218 of the export's own tables) — synthetic because
    the real capture window holds no communicator init. The ranks it names win over process order, even when
    they disagree with it, and the communicator becomes a process group."""
    p = tmp_path / "with_init.sqlite"
    shutil.copyfile(nsys_file(BEFORE), p)
    con = sqlite3.connect(p)
    con.execute("INSERT INTO StringIds (id, value) VALUES ((SELECT max(id) + 1 FROM StringIds), 'ncclCommInitRank')")
    sid = con.execute("SELECT id FROM StringIds WHERE value = 'ncclCommInitRank'").fetchone()[0]
    threads = con.execute(
        "SELECT globalTid, min(start) FROM NVTX_EVENTS WHERE domainId = 1 GROUP BY 1 ORDER BY 1"
    ).fetchall()
    assert len(threads) == 2
    for (gtid, t0), (nccl_rank, cuda_dev) in zip(threads, [(1, 0), (0, 1)]):  # pid 144 (GPU 0) is NCCL rank 1
        payload = struct.pack("<Qiii4x", 0xC0FFEE, 2, nccl_rank, cuda_dev)
        blob = struct.pack("<QQQQ", 1, 16777218, len(payload), 32) + payload
        con.execute(
            "INSERT INTO NVTX_EVENTS (start, end, eventType, globalTid, textId, domainId, binaryData) "
            "VALUES (?, ?, 59, ?, ?, 1, ?)",
            (t0 - 1000, t0 - 10, gtid, sid, blob),
        )
    con.commit()
    con.close()
    parsed = parse_nsys_sqlite(p)
    rows = {json.loads(r["meta_json"])["cuda_device"]: r for r in parsed.inputs_rows}
    assert (rows[0]["rank"], rows[1]["rank"]) == (1, 0)
    assert rows[0]["rank_source"].startswith("NCCL NVTX payload") and rows[0]["world_size"] == 2
    assert {(g["rank"], g["pg_name"], g["pg_size"], tuple(g["ranks"])) for g in parsed.process_groups} == {
        (0, "0x0000000000c0ffee", 2, (0, 1)),
        (1, "0x0000000000c0ffee", 2, (0, 1)),
    }
    # kernels of GPU 0 now belong to rank 1
    k = parsed.tables["kernels"]
    assert set(zip(k.column("rank").to_pylist(), k.column("device").to_pylist())) == {(1, 0), (0, 1)}


# --- hostile values: the real minimal export with one cell edited (regressions of the fuzz suite) ----------------

MINIMAL = "nsysai_rtx3080_minimal.sqlite"  # 2 kernels, 1 memcpy, 9 runtime calls, TARGET_INFO_GPU


def _edited_export(tmp_path, *sql: str) -> Path:
    out = tmp_path / "export.sqlite"
    shutil.copyfile(nsys_file(MINIMAL), out)
    con = sqlite3.connect(out)
    for stmt in sql:
        con.execute(stmt)
    con.commit()
    con.close()
    return out


def _bad_fields(parsed) -> tuple[int, dict]:
    row = parsed.inputs_rows[0]
    return sum(r["bad_records"] for r in parsed.inputs_rows), json.loads(row["meta_json"]).get("bad_records", {}).get(
        "fields", {}
    )


KERNEL_1 = "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET {} WHERE rowid = (SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)"


@pytest.mark.parametrize(
    ("assignment", "field"),
    [
        ("deviceId = x'00ff10'", "CUPTI_ACTIVITY_KIND_KERNEL.deviceId"),  # a blob: ArrowInvalid before
        ("deviceId = 1099511627776", "CUPTI_ACTIVITY_KIND_KERNEL.deviceId"),  # 2**40 into int32
        ("start = 'text'", "CUPTI_ACTIVITY_KIND_KERNEL.start"),
        ('start = -9223372036854775808, "end" = 9223372036854775807', "CUPTI_ACTIVITY_KIND_KERNEL.start"),
        ('"end" = 1e308', "CUPTI_ACTIVITY_KIND_KERNEL.end"),
    ],
)
def test_a_kernel_row_that_cannot_be_placed_is_dropped_and_counted(tmp_path, assignment, field):
    p = parse_nsys_sqlite(_edited_export(tmp_path, KERNEL_1.format(assignment)))
    assert p.tables["kernels"].num_rows == 1  # of 2
    n, fields = _bad_fields(p)
    assert n == 1 and fields[field]["action"] == "record dropped"


def test_an_overflowing_end_minus_start_is_dropped(tmp_path):
    """end − start beyond 64 bits: SQLite turns the difference into a REAL; it used to reach the store."""
    p = parse_nsys_sqlite(
        _edited_export(tmp_path, KERNEL_1.format('start = -9000000000000000000, "end" = 9000000000000000000'))
    )
    assert p.tables["kernels"].num_rows == 1


def test_text_that_is_not_utf8_is_replaced_and_counted(tmp_path):
    """A kernel name whose bytes are not UTF-8: the whole export was 'corrupt' before; now one replaced name."""
    p = parse_nsys_sqlite(
        _edited_export(
            tmp_path,
            "UPDATE StringIds SET value = CAST(x'6b65726e656cff' AS TEXT) WHERE id = "
            "(SELECT demangledName FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY start LIMIT 1)",
        )
    )
    names = p.tables["kernels"].column("name").to_pylist()
    assert "kernel\ufffd" in names
    n, fields = _bad_fields(p)
    assert n >= 1 and "CUPTI_ACTIVITY_KIND_KERNEL.demangledName" in fields


@pytest.mark.parametrize(
    "stmt",
    [
        "UPDATE META_DATA_EXPORT SET value = x'00ff' WHERE name = 'EXPORT_PRODUCT_VERSION'",  # TypeError in orjson
        "UPDATE ENUM_NSYS_EVENT_CLASS SET label = x'ff00'",  # TypeError in the runtime category
        "UPDATE TARGET_INFO_GPU SET name = x'ff', totalMemory = 'lots', computeMajor = 1e300",
        "UPDATE PROCESSES SET name = x'00', pid = 'x'",
        "UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = 'x', globalTid = x'01'",
    ],
)
def test_wrongly_typed_cells_elsewhere_are_counted_not_fatal(tmp_path, stmt):
    p = parse_nsys_sqlite(_edited_export(tmp_path, stmt))
    assert p.tables["kernels"].num_rows == 2
    n, fields = _bad_fields(p)
    assert n >= 1 and fields
    store_from([p]).close()


def test_a_damaged_page_is_still_one_clear_error(tmp_path):
    out = tmp_path / "export.sqlite"
    data = bytearray(nsys_file(MINIMAL).read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)  # the schema page
    out.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"export\.sqlite"):
        parse_nsys_sqlite(out)


def test_a_schema_that_is_not_utf8_is_one_clear_error(tmp_path):
    """A table name whose bytes are not UTF-8 (a damaged schema page): UnicodeDecodeError escaped before."""
    out = tmp_path / "export.sqlite"
    shutil.copyfile(nsys_file(MINIMAL), out)
    con = sqlite3.connect(out)
    con.execute("PRAGMA writable_schema = ON")
    con.execute("UPDATE sqlite_master SET name = CAST(x'50726fff' AS TEXT) WHERE name = 'ProcessStreams'")
    con.commit()
    con.close()
    with pytest.raises(InputError, match=r"export\.sqlite: corrupt"):
        parse_nsys_sqlite(out)


def test_a_malformed_schema_is_one_line(tmp_path):
    """SQLite quotes the broken CREATE statement, newlines and all: the error must still be one line."""
    out = tmp_path / "export.sqlite"
    shutil.copyfile(nsys_file(MINIMAL), out)
    con = sqlite3.connect(out)
    con.execute("PRAGMA writable_schema = ON")
    con.execute(
        "UPDATE sqlite_master SET sql = 'CREATE TABLE TARGET_INFO_SYSTEM_ENV (a INT, `b' || char(10) || ')' "
        "WHERE name = 'TARGET_INFO_SYSTEM_ENV'"
    )
    con.commit()
    con.close()
    with pytest.raises(InputError, match="malformed database schema") as e:
        parse_nsys_sqlite(out)
    assert "\n" not in str(e.value)
