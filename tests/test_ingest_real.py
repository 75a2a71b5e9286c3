"""Every external real Kineto trace ingests; counts and numbers are checked against an independent read."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from decimal import Decimal

import duckdb
import pytest
from conftest import KINETO_DATA, kineto_file

from tracediag.derive import build_all
from tracediag.ingest import load
from tracediag.ingest.kineto import parse_kineto
from tracediag.store import open_store

ALL_FILES = sorted(p.name for p in KINETO_DATA.glob("*.json.gz"))


def _store(*names: str) -> duckdb.DuckDBPyConnection:
    con = open_store()
    load(con, [parse_kineto(kineto_file(n), order=i) for i, n in enumerate(names)])
    build_all(con)
    return con


def _raw_events(name: str, parse_float=float) -> list[dict]:
    with gzip.open(kineto_file(name), "rt") as f:
        return json.load(f, parse_float=parse_float)["traceEvents"]


def test_shared_data_present():
    assert len(ALL_FILES) >= 12, f"expected the real traces in {KINETO_DATA}"


@pytest.mark.parametrize("name", ALL_FILES)
def test_every_real_trace_ingests_with_exact_counts(name):
    con = _store(name)
    events = _raw_events(name)
    by_cat = Counter(e.get("cat") for e in events if e.get("ph") == "X")
    assert con.execute("SELECT count(*) FROM kernels").fetchone()[0] == by_cat["kernel"]
    assert con.execute("SELECT count(*) FROM cpu_ops").fetchone()[0] == by_cat["cpu_op"]
    assert con.execute("SELECT count(*) FROM runtime").fetchone()[0] == by_cat["cuda_runtime"] + by_cat["cuda_driver"]
    assert con.execute("SELECT count(*) FROM memops").fetchone()[0] == by_cat["gpu_memcpy"] + by_cat["gpu_memset"]
    for table in ("kernels", "cpu_ops", "runtime", "memops", "annotations"):
        assert con.execute(f"SELECT count(*) FROM {table} WHERE dur_ns < 0").fetchone()[0] == 0
    assert con.execute("SELECT count(*) FROM steps").fetchone()[0] >= 1


def test_v100_ns_timestamps_are_exact_and_never_negative():
    """Float µs timestamps near 1.7e15 lose hundreds of ns if multiplied naively in float64."""
    name = "hta_v100_ns_resolution.pt.trace.json.gz"
    con = _store(name)
    raw = [e for e in _raw_events(name, parse_float=Decimal) if e.get("cat") == "kernel"]
    want = sorted(int((Decimal(e["ts"]) * 1000).to_integral_value()) for e in raw)
    got = [r[0] for r in con.execute("SELECT ts_ns FROM kernels ORDER BY ts_ns").fetchall()]
    assert got == want
    want_dur = sorted(int((Decimal(e["dur"]) * 1000).to_integral_value()) for e in raw)
    assert sorted(r[0] for r in con.execute("SELECT dur_ns FROM kernels").fetchall()) == want_dur


def test_a100_nccl_kernels_become_collectives_with_payload_bytes():
    name = "hta_a100_rank0of2_nccl_args.json.gz"
    con = _store(name)
    sizes = {"Float": 4, "Long": 8}
    want = Counter(
        (e["args"]["Collective name"], e["args"]["In msg nelems"] * sizes[e["args"]["dtype"]])
        for e in _raw_events(name)
        if e.get("cat") == "kernel" and "Collective name" in e.get("args", {})
    )
    assert sum(want.values()) == 21
    got = Counter(
        ({"all_reduce": "allreduce", "broadcast": "broadcast"}[op], b)
        for op, b in con.execute("SELECT op, payload_bytes FROM collectives").fetchall()
    )
    assert got == want
    # every call carries its GPU kernel time and its group size
    assert con.execute("SELECT count(*) FROM collectives WHERE gpu_dur_ns > 0 AND group_size = 2").fetchone()[0] == 21


def test_vllm_step_annotations_give_tokens_and_phase():
    con = _store("tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz")
    rows = con.execute(
        "SELECT T, ctx_reqs, ctx_tokens, gen_reqs, gen_tokens, phase, kernel_count FROM steps"
    ).fetchall()
    # execute_8192_context_9(sq8155sk8430...)_generation_37(sq37sk34489...)
    assert rows == [(8192, 9, 8155, 37, 37, "mixed", 413)]


def test_sglang_prefill_step():
    con = _store("tracelens_mi300x_sglang_qwen3-8b_prefilldecode.json.gz")
    assert con.execute("SELECT T, phase FROM steps").fetchall() == [(15360, "prefill")]


def test_hf_generate_profiler_step_gets_t_and_phase_from_shapes():
    con = _store("tracelens_h100_hf_qwen1.5-0.5b.json.gz")
    (t, t_src, phase, phase_src) = con.execute("SELECT T, t_source, phase, phase_source FROM steps").fetchone()
    assert t_src.startswith("GEMM activation rows") and t > 0
    assert (phase, phase_src) == ("prefill", "attention query length")


def test_rank_from_distributed_info_file_name_or_order():
    pt = parse_kineto(kineto_file("hta_rank_not_found.json.gz"), order=3)
    assert (pt.inputs_rows[0]["rank"], pt.inputs_rows[0]["rank_source"]) == (3, "input order")
    pt = parse_kineto(kineto_file("hta_sampled_rank-1.json.gz"), order=0)
    assert pt.inputs_rows[0]["rank_source"] in ("distributedInfo", "file name") and pt.ranks == [1]


def test_sampled_ranks_together_are_two_ranks():
    con = _store("hta_sampled_rank-0.json.gz", "hta_sampled_rank-1.json.gz")
    assert [r[0] for r in con.execute("SELECT rank FROM inputs ORDER BY rank").fetchall()] == [0, 1]
