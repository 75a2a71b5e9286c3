"""Ingest once, analyse many times: the Parquet store, and ingest on a real dask.distributed cluster.

The cluster is a real LocalCluster: a scheduler and worker processes on 127.0.0.1, which import tracediag and
write their ranks' partition files themselves. `analyze --store` on the result must give exactly the
findings.json of the single-machine path.

Many ranks (--ranks, per-TP-group evaluation, missing and failed ranks) are tested on 16 ranks replicated from the
real 8-rank sample by tests/fleet_replicas.py (two TP groups; a synthetic builder, documented there).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, SAMPLES

from tracediag.analysis import analyze
from tracediag.errors import InputError, UsageError
from tracediag.fleet import ingest_store
from tracediag.output import findings_json
from tracediag.store.parquet import MANIFEST, read_manifest

TP8 = REPO / "tests" / "data" / "fleet" / "healthy_tp8"
HEALTHY = SAMPLES / "healthy_tp2"


def _findings(**kw) -> bytes:
    return findings_json(analyze(**kw))


def test_store_layout_and_manifest(tmp_path):
    store = tmp_path / "s"
    res = ingest_store([HEALTHY], store)
    m = json.loads((store / MANIFEST).read_text())
    assert m["schema"] == "tracediag/store-v1" and m["tool"]["name"] == "tracediag"
    assert [i["ranks"] for i in m["inputs"]] == [[0], [1]]
    # canonical tables partitioned by rank, derived tables too
    assert {p.name for p in (store / "tables" / "cpu_ops").iterdir()} == {"rank=0", "rank=1"}
    assert {p.name for p in (store / "tables" / "steps").iterdir()} == {"rank=0", "rank=1"}
    assert m["tables"]["cpu_ops"]["kind"] == "canonical" and m["tables"]["steps"]["kind"] == "derived"
    assert m["tables"]["cpu_ops"]["rows"] == sum(i["rows"]["cpu_ops"] for i in m["inputs"]) > 0
    assert res.tables["collectives"]["rows"] > 0
    assert not list(tmp_path.glob(".s.*")), "staging left behind"


def test_store_findings_equal_direct_findings(tmp_path):
    store = tmp_path / "s"
    ingest_store([HEALTHY], store)
    model = HEALTHY / "config.json"
    assert _findings(paths=[], model=model, store=store) == _findings(paths=[HEALTHY], model=model)


def test_store_of_another_version_is_refused(tmp_path):
    store = tmp_path / "s"
    ingest_store([HEALTHY], store)
    doc = json.loads((store / MANIFEST).read_text())
    doc["schema_version"] = "0000"
    (store / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(InputError, match="ingest the traces again"):
        read_manifest(store)


def test_store_states_its_derivations_and_analyze_checks_them(tmp_path):
    from tracediag.derive import provided_tables, registry_version
    from tracediag.fleet import open_store_views

    store = tmp_path / "s"
    ingest_store([HEALTHY], store)
    doc = json.loads((store / MANIFEST).read_text())
    assert doc["derivations"] == {"registry_version": registry_version(), "provides": provided_tables()}
    assert set(provided_tables()) <= set(doc["tables"]) | set(doc["views"])
    open_store_views(store).close()
    doc["derivations"]["registry_version"] = "0000"
    (store / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"another set of derivations.*ingest the traces again"):
        analyze([], store=store)
    del doc["tables"]["kernel_steps"]
    doc["derivations"]["registry_version"] = registry_version()
    (store / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"lacks the derived table.s. kernel_steps"):
        analyze([], store=store)


def test_store_and_inputs_together_is_a_usage_error(tmp_path):
    store = tmp_path / "s"
    ingest_store([HEALTHY], store)
    with pytest.raises(UsageError, match="not both"):
        analyze([HEALTHY], store=store)


def test_ingest_refuses_a_folder_that_is_not_a_store(tmp_path):
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(UsageError, match="not a tracediag store"):
        ingest_store([HEALTHY], tmp_path)
    assert (tmp_path / "mine.txt").read_text() == "keep me"


def test_dask_local_cluster_ingest_gives_the_same_findings(tmp_path):
    distributed = pytest.importorskip("distributed")  # the test extra installs it: this never skips in CI
    ranks = sorted(TP8.glob("rank*.pt.trace.json.gz"))
    assert len(ranks) == 8
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        res = ingest_store(ranks, tmp_path / "store", scheduler=client)
        pids = {i["ranks"][0]: i for i in res.inputs}
        worker_pids = set(client.run(lambda: __import__("os").getpid()).values())
    assert sorted(pids) == list(range(8))
    assert res.backend.startswith("dask.distributed")
    model = TP8 / "config.json"
    assert _findings(paths=[], model=model, store=tmp_path / "store") == _findings(paths=ranks, model=model)
    assert worker_pids, "no workers"


def test_cli_ingest_then_analyze_store(tmp_path):
    store, out = tmp_path / "s", tmp_path / "out"

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "tracediag", *map(str, args)], capture_output=True, text=True, timeout=600
        )

    r = run("ingest", HEALTHY, "--store", store)
    assert r.returncode == 0, r.stderr
    assert "tracediag analyze --store" in r.stdout
    r = run("analyze", "--store", store, "-m", HEALTHY / "config.json", "-o", out, "-q")
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "findings.json").read_text())
    assert (out / "report.html").is_file() and doc["schema"] == "tracediag/findings-v1"
    r = run("analyze", "--store", tmp_path / "nope", "-o", tmp_path / "o2")
    assert r.returncode == 2 and "not a tracediag store" in r.stderr


# Reading a store is views over Parquet files in DuckDB: Arrow (~0.2 s of imports) is for writing tables only.
_NO_PYARROW = """
import importlib.abc, sys
class NoArrow(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "pyarrow" or name.startswith("pyarrow."):
            raise ImportError("pyarrow imported while reading a store: " + name)
sys.meta_path.insert(0, NoArrow())
sys.argv = ["tracediag", *sys.argv[1:]]
from tracediag.cli import main
main()
"""


def test_analyze_store_needs_no_arrow(tmp_path):
    store = tmp_path / "s"
    ingest_store([HEALTHY], store)
    args = ["analyze", "--store", store, "-m", HEALTHY / "config.json", "-o", tmp_path / "out", "-q", "--debug"]
    r = subprocess.run(
        [sys.executable, "-c", _NO_PYARROW, *args],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    with_arrow = json.loads(_findings(paths=[], store=store, model=HEALTHY / "config.json"))
    doc = json.loads((tmp_path / "out" / "findings.json").read_text())
    assert [(c["rule"], c["status"], c.get("severity")) for c in doc["checks"]] == [
        (c["rule"], c["status"], c.get("severity")) for c in with_arrow["checks"]
    ]


# --- many ranks: --ranks, per-TP-group evaluation, missing ranks ------------------------------------------------


@pytest.fixture(scope="module")
def fleet16(tmp_path_factory):
    """16 ranks: two TP groups of 8 built from the real 8-rank sample (tests/fleet_replicas.py), the second
    group 20 % slower, rank 13 left out."""
    from fleet_replicas import replicate

    out = tmp_path_factory.mktemp("fleet16")
    replicate(out, 2, stretch=0.2, drop={13})
    return out


@pytest.fixture(scope="module")
def tp8_statuses():
    rep = analyze([TP8], model=TP8 / "config.json")
    return {c.rule: c.status for c in rep.checks}


def test_parse_ranks():
    from tracediag.fleet.ranks import compact, parse_ranks

    assert parse_ranks("0,3,8-15") == [0, 3, *range(8, 16)]
    assert parse_ranks(" all ") == "all" and parse_ranks(None) is None
    assert compact([0, 1, 2, 5, 8, 9]) == "0-2,5,8-9"
    for bad in ("1-", "a", "5-3", "0,,1"):
        with pytest.raises(UsageError, match="--ranks"):
            parse_ranks(bad)


def test_default_ranks_on_sixteen(fleet16, tp8_statuses):
    rep = analyze([fleet16], model=fleet16 / "config.json")
    r = rep.to_dict()["ranks"]
    present = [x for x in range(16) if x != 13]
    assert r["present"] == present and r["missing"] == [13] and r["expected"] == list(range(16))
    assert r["analysed"] == [0, 8], "one per TP group (no straggler in this healthy run)"
    assert r["not_deep_analysed"] == [x for x in present if x not in (0, 8)]
    assert [g["ranks"] for g in r["groups"]] == [list(range(8)), [8, 9, 10, 11, 12, 14, 15]]
    assert r["groups_source"].startswith("the TP process groups' ranks")
    # the cross-group summary finds the slower group
    cg = r["cross_group"]
    assert cg["slowest_group"] == "TP group 1" and 0.15 < cg["dp_imbalance"] < 0.25
    # each rule: the worst group's check, with every group's status; the same verdicts as one group alone
    assert {c.rule: c.status for c in rep.checks} == tp8_statuses
    col001 = next(c for c in rep.checks if c.rule == "COL001")
    assert [g["group"] for g in col001.values["tp_groups"]] == ["TP group 0", "TP group 1"]
    # the report says it
    from tracediag.reports.html import render_html

    html = render_html(rep)
    assert "not deep-analysed" in html and "Missing: 13" in html


def test_explicit_ranks_and_all(fleet16):
    rep = analyze([fleet16], model=fleet16 / "config.json", ranks="0,3,8-15")
    r = rep.to_dict()["ranks"]
    assert r["analysed"] == [0, 3, 8, 9, 10, 11, 12, 14, 15] and r["selection"].startswith("--ranks 0,3,8-15")
    assert "13" in r["selection"]  # named but not in the inputs
    rep = analyze([fleet16], model=fleet16 / "config.json", ranks="all")
    assert rep.to_dict()["ranks"]["not_deep_analysed"] == []
    with pytest.raises(UsageError, match="none of these ranks"):
        analyze([fleet16], model=fleet16 / "config.json", ranks="40-41")


def test_group_evaluation_on_dask_equals_in_process(fleet16, tmp_path):
    distributed = pytest.importorskip("distributed")
    store = tmp_path / "store"
    ingest_store([fleet16], store)
    model = fleet16 / "config.json"
    direct = _findings(paths=[fleet16], model=model)
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        on_dask = _findings(paths=[], model=model, store=store, scheduler=client)
    assert on_dask == direct


def test_cli_ranks_option_on_a_store(fleet16, tmp_path):
    """Two TP groups over a store: the groups run in local processes (the default without --scheduler)."""
    out, store = tmp_path / "out", tmp_path / "store"
    ingest_store([fleet16], store)
    r = subprocess.run(
        [sys.executable, "-m", "tracediag", "analyze", "--store", str(store), "-m", str(fleet16 / "config.json"),
         "--ranks", "0,9", "-o", str(out), "-q"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    doc = json.loads((out / "findings.json").read_text())
    assert doc["ranks"]["analysed"] == [0, 9] and len(doc["ranks"]["group_summaries"]) == 2
    assert doc["ranks"]["group_summaries"][1]["deep_ranks"] == [9]
    r = subprocess.run(
        [sys.executable, "-m", "tracediag", "analyze", str(fleet16), "--ranks", "x", "-o", str(tmp_path / "o2")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert r.returncode == 2 and "--ranks" in r.stderr


def test_keep_going_records_a_failed_input(tmp_path):
    bad = tmp_path / "rank1.pt.trace.json"
    bad.write_bytes(b'{"traceEvents": [{"ph": "X", "name": "cut off')  # a truncated trace
    good = HEALTHY / "rank0.pt.trace.json.gz"
    with pytest.raises(InputError):
        ingest_store([good, bad], tmp_path / "s1")
    res = ingest_store([good, bad], tmp_path / "s2", keep_going=True)
    assert [f["path"] for f in res.failed] == [str(bad)]
    r = analyze([], store=tmp_path / "s2").to_dict()["ranks"]
    assert r["failed"][0]["path"] == str(bad) and r["failed"][0]["error"]
    assert r["present"] == [0] and r["missing"] == [1]  # world size 2, rank 1's file failed


def test_unnamed_groups_are_matched_within_their_tp_group_in_the_report(tmp_path):
    # gloo records no process-group name or ranks: two TP groups of 8 (the second 20 % slower), known only as
    # blocks of p = 8 ranks (--tp 8; the trace alone says world size 16). The rules run per group; the report's
    # skew table must match calls within each group too, not the k-th all-reduce of rank 0 with that of rank 8
    # (then the slower group arrives last in every set)
    from fleet_replicas import replicate

    out = tmp_path / "unnamed16"
    replicate(out, 2, stretch=0.2, named=False)
    rep = analyze([out], model=out / "config.json", ranks="all", tp=8)
    groups = rep.to_dict()["ranks"]["groups"]
    assert [g["ranks"] for g in groups] == [list(range(8)), list(range(8, 16))]
    (comm,) = [s for s in rep.sections if s.id == "comm"]
    rows = comm.tables["rank skew: arrivals at matched collectives"]
    last = {r["rank"]: r["arrived_last"] for r in rows}
    assert sum(last[r] for r in range(8)) > 0 and sum(last[r] for r in range(8, 16)) > 0
    # each group's sets: every call of one group is matched with its own group's ranks only
    assert sum(last[r] for r in range(8)) == sum(last[r] for r in range(8, 16))


def test_injected_straggler_among_64_ranks_is_named(tmp_path):
    # 64 ranks (8 TP groups of 8 copies of the real sample, each rank cut to the first 8 % of its time span to
    # keep the test fast); global rank 43 of group 5 reaches every collective 100 ms late. The default selection
    # must deep-analyse it, COL005 must name it in its group, and no other group may have a straggler
    from fleet_replicas import replicate

    out = tmp_path / "fleet64"
    replicate(out, 8, shift_us=1000.0, straggler=(43, 100_000.0), span=0.08)
    rep = analyze([out], model=out / "config.json")
    r = rep.to_dict()["ranks"]
    assert r["present"] == list(range(64)) and len(r["groups"]) == 8
    assert r["analysed"] == [0, 8, 16, 24, 32, 40, 43, 48, 56]
    assert {g["group"]: g["straggler_rank"] for g in r["group_summaries"] if g["straggler_rank"] is not None} == {
        "TP group 5": 43
    }
    (col005,) = [c for c in rep.checks if c.rule == "COL005"]
    assert col005.status == "finding" and col005.values["straggler_rank"] == 43
    assert "TP group 5" in col005.title and "Rank 43 is the straggler" in col005.title
    statuses = {g["group"]: g["status"] for g in col005.values["tp_groups"]}
    assert statuses.pop("TP group 5") == "finding" and set(statuses.values()) == {"pass"}


@pytest.mark.parametrize("failed", [None, 5, [{"path": 1}], ["x"]])
def test_a_manifest_whose_failed_list_is_not_one_is_refused(tmp_path, failed):
    """A long fuzz run edited `failed` to null: analyze --store, check --store and diff died iterating it (TypeError,
    exit 3). The manifest's `failed` is a list of {path, error} texts, or the manifest is not ours."""
    store = tmp_path / "s"
    ingest_store([HEALTHY], store)
    doc = json.loads((store / MANIFEST).read_text())
    doc["failed"] = failed
    (store / MANIFEST).write_text(json.dumps(doc))
    with pytest.raises(InputError, match=r"not the manifest tracediag writes \(.*\$\.failed"):
        read_manifest(store)


def test_a_damaged_parquet_file_of_a_store_is_one_line_naming_it(tmp_path):
    """Bytes of a store's Parquet file cut or flipped after ingest: DuckDB fails inside some query (Thrift, a
    footer, 'Out of buffer'); the CLI says which file (or store) is damaged, exit 2, not an internal error."""
    import subprocess
    import sys

    store = tmp_path / "s"
    ingest_store([HEALTHY], store)
    part = sorted((store / "tables" / "steps").rglob("*.parquet"))[0]
    data = bytearray(part.read_bytes())
    data[4:204] = bytes(200)  # the first page header zeroed: the file still opens and ends in its PAR1 footer
    part.write_bytes(bytes(data))
    r = subprocess.run(
        [sys.executable, "-m", "tracediag", "analyze", "--store", str(store), "-o", str(tmp_path / "out"), "-q"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-2000:]
    assert lines[0].startswith("tracediag: error: ") and str(store) in lines[0]
    assert "a Parquet file of the store is damaged or unreadable (" in lines[0] and "ingest" in lines[0]
    assert not (tmp_path / "out").exists()
    # the library says the same: an input error naming the store, not DuckDB's own error
    with pytest.raises(InputError, match="a Parquet file of the store is damaged or unreadable"):
        analyze([], store=store)


def test_a_parquet_file_whose_column_name_was_damaged_is_found(tmp_path):
    """A flipped byte in a file's footer renamed a column ('family' -> 'famjly'); with other bytes flipped too (a
    long fuzz run) the store's view failed in DuckDB's binder, which reads like a bug of ours; alone, it failed
    nothing and that file's column read as NULL. Opening the store checks its files' columns against the manifest
    (store.parquet.verify_columns), and damaged_file names the file (also after any failed query, in the CLI)."""
    from tracediag.store.parquet import damaged_file

    store = tmp_path / "s"
    ingest_store([HEALTHY], store)
    assert damaged_file(store) is None
    part = sorted((store / "tables" / "kernel_steps").rglob("*.parquet"))[0]
    data = part.read_bytes()
    part.write_bytes(data.replace(b"family", b"famjly", 1))  # the schema's name of the column
    err = damaged_file(store)
    assert err is not None and err.path == str(part)
    assert (
        err.problem == f"damaged Parquet file of the store {store}: its columns lack family of the manifest's; "
        "ingest the traces again"
    )
    # alone, the rename fails no query (the files are read by name: that file's `family` would be NULL, silently);
    # the store's files are checked against its manifest when it is opened
    with pytest.raises(InputError) as raised:
        analyze([], store=store)
    assert raised.value.path == str(part) and raised.value.problem == err.problem
