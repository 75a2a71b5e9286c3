"""Every external real Kineto trace ingests; counts and numbers are checked against an independent read."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from decimal import Decimal

import duckdb
import pytest
from conftest import KINETO_DATA, kineto_file

from tracediag.errors import InputError
from tracediag.ingest.kineto import parse_kineto
from tracediag.pipeline import store_from

ALL_FILES = sorted(p.name for p in KINETO_DATA.glob("*.json.gz"))


def _store(*names: str) -> duckdb.DuckDBPyConnection:
    return store_from([parse_kineto(kineto_file(n), order=i) for i, n in enumerate(names)])


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


# --- hostile values: each a real trace with one value edited (regressions of the fuzz suite, tests/fuzz/) ----------

SIMPLE = "hta_a100_simple_add.json.gz"  # a small real A100 trace: kernels with correlation ids, cpu_ops, memcpys


def _edited(tmp_path, edit, name: str = SIMPLE, path=None):
    """The real trace with `edit(doc)` applied, written with fuzz.mutate.dump_json (Raw tokens verbatim)."""
    import sys

    sys.path.insert(0, str(KINETO_DATA.parents[2]))
    from fuzz.mutate import dump_json

    src = path or kineto_file(name)
    doc = json.loads(gzip.decompress(src.read_bytes()))
    edit(doc)
    out = tmp_path / "rank0.pt.trace.json"
    out.write_bytes(dump_json(doc))
    return out


def _first(doc, cat, pred=lambda e: True):
    return next(e for e in doc["traceEvents"] if e.get("cat") == cat and pred(e))


def _bad(parsed) -> tuple[int, dict]:
    row = parsed.inputs_rows[0]
    return row["bad_records"], json.loads(row["meta_json"] or "{}").get("bad_records", {}).get("fields", {})


def test_unusable_ts_or_dur_drops_the_event_and_counts_it(tmp_path):
    from fuzz.mutate import Raw

    def edit(doc):
        kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"]
        kernels[0]["ts"] = Raw(b"1" + b"0" * 400)  # a 401-digit number: np.array raised OverflowError
        kernels[1]["dur"] = 1e30  # became a garbage int64 silently
        kernels[2]["ts"] = "soon"
        kernels[3]["dur"] = [1, 2]  # numpy made a 2-D array of the column: IndexError

    base = parse_kineto(kineto_file(SIMPLE))
    p = parse_kineto(_edited(tmp_path, edit))
    assert p.tables["kernels"].num_rows == base.tables["kernels"].num_rows - 4
    n, fields = _bad(p)
    assert n == 4
    assert fields["kernels.ts"]["count"] == 2 and fields["kernels.ts"]["action"] == "record dropped"
    assert fields["kernels.ts"]["examples"][0] == "an integer of about 400 digits"
    assert fields["kernels.dur"]["count"] == 2
    assert base.inputs_rows[0]["bad_records"] == 0 and "bad_records" not in (base.inputs_rows[0]["meta_json"] or "")
    # the categories no table holds are counted (cuda_sync: the synchronization events of PyTorch 2.x)
    assert '"unread_categories":{"cuda_sync":41,"Trace":1}' in base.inputs_rows[0]["meta_json"]


def test_out_of_range_args_are_null_and_counted(tmp_path):
    def edit(doc):
        _first(doc, "kernel")["args"]["correlation"] = 2**64  # beyond int64
        _first(doc, "kernel")["args"]["Group size"] = 2**40  # ArrowInvalid into an int32 column
        _first(doc, "gpu_memcpy")["args"]["bytes"] = -5

    p = parse_kineto(_edited(tmp_path, edit))
    k = p.tables["kernels"]
    assert k.column("correlation")[0].as_py() is None and k.column("group_size")[0].as_py() is None
    assert p.tables["memops"].column("bytes").null_count >= 1
    n, fields = _bad(p)
    assert n == 2  # two records: one kernel (two fields), one memcpy
    assert set(fields) == {"kernels.args.correlation", "kernels.args.Group size", "memops.args.bytes"}
    assert fields["kernels.args.Group size"]["examples"] == [str(2**40)]


def test_invalid_utf8_in_input_dims_is_null_and_counted(tmp_path):
    from fuzz.mutate import Raw

    def edit(doc):
        _first(doc, "cpu_op")["args"]["Input Dims"] = Raw(b'[["\xff\xfe"]]')  # ArrowInvalid on the cast before

    p = parse_kineto(_edited(tmp_path, edit))
    assert p.tables["cpu_ops"].column("input_dims")[0].as_py() is None
    assert _bad(p)[1]["cpu_ops.args.Input Dims"]["count"] == 1


def test_json_nested_1500_deep_is_one_input_error(tmp_path):
    from fuzz.mutate import Raw

    def edit(doc):
        doc["distributedInfo"] = Raw(b"[" * 1500 + b"]" * 1500)  # RecursionError escaped the ingester

    with pytest.raises(InputError, match="nested too deep") as e:
        parse_kineto(_edited(tmp_path, edit))
    assert "rank0.pt.trace.json" in str(e.value)


@pytest.mark.parametrize("rank", [2**40, -1, "0", True])
def test_a_rank_that_is_no_rank_is_an_input_error_naming_the_field(tmp_path, rank):
    def edit(doc):
        doc["distributedInfo"]["rank"] = rank

    with pytest.raises(InputError, match=r"distributedInfo\.rank is .*, not a rank"):
        parse_kineto(_edited(tmp_path, edit))


def test_file_facts_out_of_range_are_null_and_counted(tmp_path):
    def edit(doc):
        doc["distributedInfo"] |= {"world_size": 2**40, "backend": ["nccl"], "big": 2**70}

    p = parse_kineto(_edited(tmp_path, edit))
    row = p.inputs_rows[0]
    assert row["world_size"] is None and row["backend"] is None
    assert row["distributed_info_json"] is None  # orjson cannot write 2**70: NULL, not a crash after the parse
    assert set(_bad(p)[1]) >= {"distributedInfo.world_size", "distributedInfo.backend", "inputs.distributedInfo"}


def test_a_lone_surrogate_escape_is_not_reported_as_truncation(tmp_path):
    from fuzz.mutate import Raw

    def edit(doc):  # the last value of the file, where the decoder says "Input data was truncated"
        last = doc["traceEvents"][-1]
        doc["traceEvents"][-1] = {"ts": last["ts"], "ph": last["ph"], "name": Raw(b'"\\ud800"')}
        doc.pop("traceName", None)

    with pytest.raises(InputError, match="not valid JSON") as e:
        parse_kineto(_edited(tmp_path, edit))
    assert "truncated" not in str(e.value)


def test_bad_records_show_in_findings_json(tmp_path):
    from tracediag.analysis import analyze

    def edit(doc):
        _first(doc, "kernel")["ts"] = 1e300

    report = analyze([_edited(tmp_path, edit)])
    (inp,) = report.inputs
    assert inp["counts"]["bad_records"] == 1


def test_huge_names_are_classified_by_their_prefix(tmp_path):
    """A 8 MiB kernel name costs what a 32 KiB one does (a 500 MiB one took 4 minutes), and is recorded."""
    import time

    from tracediag.catalog import CLASSIFY_MAX_CHARS, classify_kernel

    long = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*)" + "x" * (8 << 20)
    t = time.perf_counter()
    c = classify_kernel(long)
    assert time.perf_counter() - t < 2.0
    assert c.klass == "collective" and c.collective_op == "all_reduce"

    def edit(doc):
        _first(doc, "kernel")["name"] = "void my_kernel<" + "T," * CLASSIFY_MAX_CHARS + ">()"

    p = parse_kineto(_edited(tmp_path, edit))
    assert json.loads(p.inputs_rows[0]["meta_json"])["names_classified_by_prefix"] == 1
