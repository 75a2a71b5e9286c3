"""Ingest once, analyse many times: the Parquet store, and ingest on a real dask.distributed cluster.

The cluster is a real LocalCluster: a scheduler and worker processes on 127.0.0.1, which import tracediag and
write their ranks' partition files themselves. `analyze --store` on the result must give exactly the
findings.json of the single-machine path.
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
