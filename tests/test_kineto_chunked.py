"""Chunked Kineto decoding (the memory budget): the same store as a whole-file decode on every real trace and
sample trace, with chunks small enough that every file is split many times; a parser's Python heap bounded by
the budget, not the file size; the budget reaching DuckDB and the command line."""

from __future__ import annotations

import gzip
import tracemalloc

import orjson
import pytest
from conftest import KINETO_DATA, SAMPLES
from typer.testing import CliRunner

from tracediag import memory as mem
from tracediag.cli import app
from tracediag.errors import InputError
from tracediag.ingest import IngestOptions, kineto, load
from tracediag.store import open_store

FILES = [*sorted(KINETO_DATA.glob("*.json.gz")), *sorted(SAMPLES.glob("*/rank0.pt.trace.json.gz"))]
TINY = 16 << 10  # bytes per chunk at least; each file is split into about 40 chunks


def _store_rows(parsed) -> dict[str, list]:
    con = open_store()
    load(con, [parsed])
    tables = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main'").fetchall()]
    # the store keeps no insertion order (store.connect): rows are compared as sorted lists
    out = {t: con.execute(f'SELECT * FROM "{t}" ORDER BY ALL').fetchall() for t in sorted(tables)}
    con.close()
    return out


def _chunked(path, monkeypatch, chunk: int = TINY, fallback: bool = False, **kw):
    sizes = []
    if not fallback:  # a well-formed file must not need the whole-file decode

        def no_fallback(*a):
            raise AssertionError("chunked decoding fell back to the whole file")

        monkeypatch.setattr(kineto, "_parse_whole", no_fallback)
    real = kineto.ArrayChunks

    def spy(*a, **k):
        ac = real(*a, **k)
        sizes.append(ac)
        return ac

    monkeypatch.setattr(kineto, "decode_chunk_bytes", lambda limit: chunk)
    monkeypatch.setattr(kineto, "ArrayChunks", spy)
    return kineto.parse_kineto(path, 0, IngestOptions(**kw)), sizes


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_chunked_store_equals_whole_file_store(path, monkeypatch):
    try:
        whole = kineto._parse_whole(path, 0, IngestOptions())
    except InputError as exc:  # a file that is meant to fail: the chunked parse names the same problem
        with pytest.raises(InputError) as got:
            _chunked(path, monkeypatch, fallback=True)
        assert str(got.value) == str(exc)
        return
    raw = len(gzip.decompress(path.read_bytes()))
    chunk = max(TINY, raw // 40)
    chunked, streams = _chunked(path, monkeypatch, chunk)
    assert streams and streams[-1].items_bytes > 0
    if raw > 4 * chunk:
        assert streams[-1].items_bytes > 2 * chunk  # the file really went through several chunks
    assert chunked.inputs_rows == whole.inputs_rows
    assert chunked.process_groups == whole.process_groups
    assert {k: t.schema for k, t in chunked.tables.items()} == {k: t.schema for k, t in whole.tables.items()}
    assert _store_rows(chunked) == _store_rows(whole)


def test_keep_python_chunked_equals_whole(monkeypatch):
    path = SAMPLES / "healthy_tp2" / "rank0.pt.trace.json.gz"
    whole = kineto._parse_whole(path, 0, IngestOptions(keep_python=True))
    chunked, _ = _chunked(path, monkeypatch, keep_python=True)
    assert _store_rows(chunked) == _store_rows(whole) and chunked.inputs_rows == whole.inputs_rows


def _big_trace(tmp_path, repeats: int):
    """A SYNTHETIC scale-up of a real sample rank: its events repeated (ids and times shifted), ~1 MB a copy."""
    doc = orjson.loads(gzip.decompress((SAMPLES / "healthy_tp2" / "rank0.pt.trace.json.gz").read_bytes()))
    events = [e for e in doc.pop("traceEvents") if e.get("ph") == "X"]
    span = max(e["ts"] + e.get("dur", 0) for e in events) - min(e["ts"] for e in events) + 1
    out = []
    for k in range(repeats):
        for e in events:
            e = dict(e, ts=e["ts"] + k * span)
            if isinstance(e.get("args"), dict) and isinstance(e["args"].get("External id"), int):
                e["args"] = dict(e["args"], **{"External id": e["args"]["External id"] + k * 10**7})
            out.append(e)
    path = tmp_path / "rank0.pt.trace.json"
    path.write_bytes(orjson.dumps({**doc, "traceEvents": out}))
    return path


def _python_peak(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_python_heap_is_bounded_by_the_chunk_not_the_file(tmp_path, monkeypatch):
    path = _big_trace(tmp_path, 12)
    size = path.stat().st_size
    assert size > 10 << 20
    kineto.parse_kineto(SAMPLES / "healthy_tp2" / "rank0.pt.trace.json.gz")  # imports done before measuring
    whole = _python_peak(lambda: kineto._parse_whole(path, 0, IngestOptions()))
    monkeypatch.setattr(kineto, "decode_chunk_bytes", lambda limit: 1 << 20)
    chunked = _python_peak(lambda: kineto.parse_kineto(path, 0, IngestOptions()))
    # decoded events take several times their JSON: the whole file's worth vs one 1 MiB chunk's worth (plus
    # the text columns, which keep their bytes objects: part of the tables)
    assert whole > 2 * size
    assert chunked < 0.6 * size and chunked < whole / 4, (chunked, whole, size)


def test_budget_sets_the_chunk_and_duckdb_limit():
    assert mem.chunk_bytes(512 << 20) == (512 << 20) // mem.CHUNK_FACTOR
    # the trace decoder's chunk: the budget's, at most DECODE_CHUNK_MAX (a small chunk reuses warm memory)
    assert mem.decode_chunk_bytes(512 << 20) == mem.DECODE_CHUNK_MAX == 8 << 20
    assert mem.decode_chunk_bytes(64 << 20) == (64 << 20) // mem.CHUNK_FACTOR
    assert mem.parse_size("2GiB") == 2 << 30 and mem.parse_size("300m") == 300 << 20
    with pytest.raises(ValueError, match="minimum"):
        mem.parse_size("1k")
    with pytest.raises(ValueError, match="not a size"):
        mem.parse_size("lots")
    con = open_store(memory_limit=256 << 20)
    limit = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    con.close()
    assert limit.replace(" ", "") in ("1.0GiB", "1024.0MiB", "1GiB")


def test_memory_limit_option(tmp_path):
    trace = SAMPLES / "healthy_tp2" / "rank0.pt.trace.json.gz"
    res = CliRunner().invoke(app, ["analyze", str(trace), "-o", str(tmp_path / "a"), "-q", "--memory-limit", "3k"])
    assert res.exit_code == 2 and "--memory-limit" in res.output
    res = CliRunner().invoke(app, ["analyze", str(trace), "-o", str(tmp_path / "b"), "-q", "--memory-limit", "128MiB"])
    assert res.exit_code == 0, res.output
    assert mem.memory_limit() == mem.DEFAULT_MEMORY_LIMIT  # a value passed down, not a setting of the process


def test_pytorch_1_8_categories_are_read_as_their_successors(tmp_path):
    """PyTorch 1.8's Kineto wrote `Operator`, `Kernel`, `Runtime`, `Memcpy`, `Memset` (libkineto's ChromeTraceLogger
    then; pytorch/kineto tb_plugin's tests parse them): a real V100 trace written back with those names gives the
    same tables, where it was "too short: 0 recorded events"."""
    real = KINETO_DATA / "hta_v100_ns_resolution.pt.trace.json.gz"
    doc = orjson.loads(gzip.decompress(real.read_bytes()))
    old = {"kernel": "Kernel", "cpu_op": "Operator", "cuda_runtime": "Runtime", "gpu_memcpy": "Memcpy",
           "gpu_memset": "Memset"}  # fmt: skip
    for e in doc["traceEvents"]:
        if e.get("cat") in old:
            e["cat"] = old[e["cat"]]
    f = tmp_path / "pytorch18.pt.trace.json"
    f.write_bytes(orjson.dumps(doc))
    new, old_parsed = kineto._parse_whole(real, 0, IngestOptions()), kineto._parse_whole(f, 0, IngestOptions())
    for table in ("kernels", "cpu_ops", "runtime", "memops"):
        assert old_parsed.tables[table].num_rows == new.tables[table].num_rows, table
        assert table == "memops" or new.tables[table].num_rows > 0, table
    facts = orjson.loads(old_parsed.inputs_rows[0]["meta_json"])
    assert facts["unread_categories"] == {"Trace": 1}  # the profiler's own span, counted, not dropped silently


def test_a_trace_of_categories_nobody_reads_says_which(tmp_path):
    events = [
        {"ph": "X", "cat": "gpu_op_v9", "name": f"op{i}", "pid": 0, "tid": 1, "ts": i, "dur": 1} for i in range(3)
    ]
    f = tmp_path / "future.pt.trace.json"
    f.write_bytes(orjson.dumps({"traceEvents": events}))
    with pytest.raises(InputError, match=r"no event of a category tracediag reads; .*'gpu_op_v9' \(3\)"):
        kineto._parse_whole(f, 0, IngestOptions())
