"""Spilling: a rank whose tables outgrow the parser's budget is written as Parquet parts and streamed into the
store, never held whole. Forced here with a budget so small that every chunk of a real trace spills: the store,
the inputs rows and the findings must be exactly those of the in-memory path, on one process, on parser
processes and on the Parquet-store ingest, and no part file may be left behind."""

from __future__ import annotations

import gzip
import json

import orjson
import pytest
from conftest import KINETO_DATA

import tracediag.fleet as fleet
import tracediag.ingest as ingest
from tracediag.analysis import analyze
from tracediag.errors import InputError
from tracediag.fleet import ingest_store
from tracediag.ingest import IngestOptions, kineto, load, parse_all, parts_folder
from tracediag.ingest.base import SpilledTable
from tracediag.store import open_store

# real traces: exact-ns timestamps (V100), ROCm with RCCL (MI300X), a pair of ranks
V100 = KINETO_DATA / "hta_v100_ns_resolution.pt.trace.json.gz"
MI300X = KINETO_DATA / "tracelens_mi300x_rank0of8_rccl_ddp.json.gz"
PAIR = [KINETO_DATA / "hta_sampled_rank-0.json.gz", KINETO_DATA / "hta_sampled_rank-1.json.gz"]
TABLES = ("kernels", "memops", "runtime", "cpu_ops", "annotations", "flows", "inputs", "process_groups")


@pytest.fixture
def spill_every_chunk(monkeypatch):
    """Chunks of 256 KiB, and the tables written out after every chunk."""
    monkeypatch.setattr(kineto, "decode_chunk_bytes", lambda limit: 256 << 10)
    monkeypatch.setattr(kineto, "spill_bytes", lambda limit: 1)


def _rows(con) -> dict[str, list]:
    # spilled parts keep each part's rows in order, not the whole file's: compare as sorted sets of rows
    return {t: con.execute(f"SELECT * FROM {t} ORDER BY ALL").fetchall() for t in TABLES}


def _store(files, parts_dir=None, jobs=1) -> tuple[dict, list]:
    con = open_store()
    parsed = parse_all(files, jobs=jobs, parts_dir=parts_dir)
    kinds = [{n: type(t).__name__ for n, t in p.tables.items()} for p in parsed]
    load(con, parsed)
    rows = _rows(con)
    con.close()
    return rows, kinds


@pytest.mark.parametrize("path", [V100, MI300X], ids=lambda p: p.name)
def test_spilled_store_equals_held_store(path, tmp_path, monkeypatch):
    held, kinds = _store([path])
    assert set(kinds[0].values()) == {"Table"}
    monkeypatch.setattr(kineto, "decode_chunk_bytes", lambda limit: 256 << 10)
    monkeypatch.setattr(kineto, "spill_bytes", lambda limit: 1)
    with parts_folder() as parts:
        spilled, kinds = _store([path], parts)
        assert set(kinds[0].values()) == {"SpilledTable"}
        assert not list(parts.iterdir())  # every part was loaded and removed
    assert spilled == held


def test_spilled_parser_processes(spill_every_chunk, tmp_path):
    with parts_folder(tmp_path / "store.duckdb") as parts:
        spilled, kinds = _store(PAIR, parts, jobs=2)
        assert all(set(k.values()) == {"SpilledTable"} for k in kinds)
    assert not (tmp_path / "store.duckdb.parts").exists()
    kineto_held = _held_pair()
    assert spilled == kineto_held


def _held_pair():
    con = open_store()
    load(con, [kineto.parse_kineto(p, i, IngestOptions()) for i, p in enumerate(PAIR)])
    rows = _rows(con)
    con.close()
    return rows


def test_rank_given_after_the_events_relabels_the_parts(spill_every_chunk, tmp_path):
    # the real MI300X rank 0 re-serialised with its top-level keys after traceEvents (JSON does not fix key
    # order) and the rank in distributedInfo changed to 5: the parts, written before the rank was known, carry
    # the provisional rank (from the file name or the input order) until the parser rewrites them
    doc = orjson.loads(gzip.decompress(MI300X.read_bytes()))
    events = doc.pop("traceEvents")
    doc["distributedInfo"]["rank"] = 5
    path = tmp_path / "trace.json"
    path.write_bytes(orjson.dumps({"traceEvents": events, **doc}))
    with parts_folder() as parts:
        parsed = kineto.parse_kineto(path, 0, IngestOptions(spill_dir=str(parts)))
        assert isinstance(parsed.tables["kernels"], SpilledTable)
        con = open_store()
        load(con, [parsed])
    ranks = {t: con.execute(f"SELECT list(DISTINCT rank) FROM {t}").fetchone()[0] for t in TABLES[:6]}
    assert ranks == {t: [5] for t in TABLES[:6]}
    assert parsed.inputs_rows[0]["rank"] == 5 and parsed.inputs_rows[0]["rank_source"] == "distributedInfo"


def test_spilled_analysis_gives_the_same_findings(tmp_path, monkeypatch):
    held = analyze([V100], db_path=tmp_path / "a.duckdb").to_dict()
    monkeypatch.setattr(kineto, "decode_chunk_bytes", lambda limit: 256 << 10)
    monkeypatch.setattr(kineto, "spill_bytes", lambda limit: 1)
    inserted = []
    real = ingest._insert_parts
    monkeypatch.setattr(ingest, "_insert_parts", lambda con, t, s: inserted.append(len(s.files)) or real(con, t, s))
    spilled = analyze([V100], db_path=tmp_path / "b.duckdb").to_dict()
    assert len(inserted) == 6 and min(inserted) > 5  # six tables, each in many parts
    assert not (tmp_path / "b.duckdb.parts").exists()
    for doc in (held, spilled):
        for i in doc["inputs"]:
            i.pop("path")
    assert json.dumps(spilled, sort_keys=True, default=str) == json.dumps(held, sort_keys=True, default=str)


def test_spilled_parquet_store_ingest(tmp_path, monkeypatch):
    held = ingest_store(PAIR, tmp_path / "held", jobs=1)
    monkeypatch.setattr(kineto, "decode_chunk_bytes", lambda limit: 256 << 10)
    monkeypatch.setattr(kineto, "spill_bytes", lambda limit: 1)
    moved = []
    real = fleet._move_part
    monkeypatch.setattr(fleet, "_move_part", lambda *a: moved.append(a[1]) or real(*a))
    spilled = ingest_store(PAIR, tmp_path / "spilled", jobs=1)
    assert len(moved) > 20  # both ranks' tables went through parts
    assert {t: v["rows"] for t, v in spilled.tables.items()} == {t: v["rows"] for t, v in held.tables.items()}
    assert not list((tmp_path / "spilled").glob(".parts*"))
    a = analyze([], store=tmp_path / "held").to_dict()
    b = analyze([], store=tmp_path / "spilled").to_dict()
    assert json.dumps(a["checks"], sort_keys=True, default=str) == json.dumps(b["checks"], sort_keys=True, default=str)


def test_parts_that_cannot_be_written_are_a_one_line_error(spill_every_chunk, tmp_path):
    # the spill folder is a file: writing a part fails, and that is said (not a whole-file decode in memory)
    not_a_folder = tmp_path / "full"
    not_a_folder.write_text("")
    with pytest.raises(InputError, match=r"too large to hold and cannot be written out to .*full.*--memory-limit"):
        kineto.parse_kineto(MI300X, 0, IngestOptions(spill_dir=str(not_a_folder)))
