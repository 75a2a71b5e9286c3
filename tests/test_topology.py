"""Topology snapshots (`tracediag env` JSON) -> topo_* tables, link classes, and PATH001 / SHP004 on them.

The multi-GPU snapshots in tests/data/topology/ are SYNTHETIC (the real snapshot code run against a
stand-in NVML module: see tests/test_env_command.py); nodriver.topo.json is real output without a driver.
"""

from __future__ import annotations

import json

import pytest
from conftest import REPO, SAMPLES

from tracediag.analysis import analyze
from tracediag.errors import InputError
from tracediag.ingest import detect_format
from tracediag.ingest.base import IngestOptions
from tracediag.ingest.topology import bus_key, classify_pair, parse_topology
from tracediag.model.links import pcie_gbs
from tracediag.rules import module_name

TOPO = REPO / "tests" / "data" / "topology"


def _tables(name):
    parsed = parse_topology(TOPO / f"{name}.topo.json", 0, IngestOptions())
    return parsed, {k: v.to_pylist() for k, v in parsed.tables.items()}


def test_detected_by_content():
    for f in TOPO.glob("*.topo.json"):
        assert detect_format(f) == "topology", f


def test_nvswitch_pair_and_gpus():
    parsed, t = _tables("h100x2_nvswitch")
    (pair,) = t["topo_pairs"]
    assert pair["link_class"] == "nvswitch" and pair["direct_nvlinks"] == 0
    # 18 NVLink 4.0 links × 25 GB/s per direction
    assert pair["expected_busbw_gbs"] == 450.0 and pair["topology"] == "NODE" and pair["p2p_read"] == "ok"
    g = t["topo_gpus"][1]
    assert (g["nvlinks_active"], g["nvlinks_total"], g["nvlink_version"], g["pcie_gen"], g["pcie_width"]) == (
        18,
        18,
        "4.0",
        5,
        16,
    )
    assert len(t["topo_nvlinks"]) == 36 and {r["remote_type"] for r in t["topo_nvlinks"]} == {"switch"}
    meta = json.loads(parsed.inputs_rows[0]["meta_json"])
    assert meta["nvml_available"] is True and parsed.inputs_rows[0]["device_total_mem_bytes"] == 85520809984


def test_pcie_pairs_with_and_without_p2p():
    _, t = _tables("l40sx4_pcie")
    classes = {(p["gpu_a"], p["gpu_b"]): (p["link_class"], p["topology"]) for p in t["topo_pairs"]}
    assert classes[(0, 1)] == ("pcie", "PHB") and classes[(0, 2)] == ("pcie-host", "SYS")
    # PCIe gen4 x16: 16 × 1.969 GB/s per direction
    assert {p["expected_busbw_gbs"] for p in t["topo_pairs"]} == {31.504}


def test_degraded_nvlink_lowers_the_expected_bandwidth():
    _, t = _tables("h100x2_nvlink_degraded")
    assert t["topo_pairs"][0]["expected_busbw_gbs"] == 300.0  # min(18, 12) links × 25 GB/s
    assert [g["nvlinks_active"] for g in t["topo_gpus"]] == [18, 12]


def test_direct_nvlink_between_two_gpus():
    # a direct NVLink bridge (remote end = the other GPU's bus id), e.g. two PCIe cards with a bridge
    ga = {
        "pci_bus_id": "00000000:17:00.0",
        "nvlinks": [
            {"state": "active", "version": "3.0", "remote_pci_bus_id": "00000000:31:00.0", "remote_type": "gpu"}
        ]
        * 4,
    }
    gb = {"pci_bus_id": "00000000:31:00.0", "nvlinks": []}
    assert classify_pair(ga, gb, {"p2p": {"nvlink": "ok"}}) == ("nvlink", 4, 100.0)


def test_bus_ids_and_pcie_rates():
    assert bus_key("00000000:3B:00.0") == bus_key("0000:3b:00.0") == (0, 0x3B, 0, 0)
    assert bus_key("garbage") is None and bus_key(None) is None
    assert pcie_gbs(5, 16) == 63.008 and pcie_gbs(None, 16) is None


def test_nodriver_snapshot_has_no_tables():
    parsed, t = _tables("nodriver")
    assert t == {} and json.loads(parsed.inputs_rows[0]["meta_json"])["nvml_error"] == "NVML Shared Library Not Found"


def test_bad_snapshots_are_one_clear_error(tmp_path):
    with pytest.raises(InputError, match="not a tracediag topology snapshot"):
        parse_topology(SAMPLES / "healthy_tp2" / "config.json", 0, IngestOptions())
    doc = json.loads((TOPO / "h100x2_nvswitch.topo.json").read_text())
    newer = tmp_path / "v2.json"
    newer.write_text(json.dumps(doc | {"schema": "tracediag/topology-v2"}))
    with pytest.raises(InputError, match="newer than this tracediag reads"):
        parse_topology(newer, 0, IngestOptions())
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps(doc | {"pairs": [{"a": 0, "b": 7}]}))
    with pytest.raises(InputError, match=r"pairs\[0\]\.b = 7 is no GPU in gpus\[\]"):
        parse_topology(broken, 0, IngestOptions())


def _check(rule, paths, extra=(), model=None, tp=None):
    module = {"PATH001": "path001_link_class", "SHP004": "shp004_fits_on_one_card"}[rule]
    r = analyze(paths, model=model, tp=tp, extra_inputs=list(extra), extra_rules=[module_name(module.split("_")[0])])
    (c,) = [c for c in r.checks if c.rule == rule]
    return c


def test_path001_group_from_the_trace():
    d = SAMPLES / "healthy_tp2"
    c = _check("PATH001", [d], [(TOPO / "h100x2_nvswitch.topo.json", "topology")])
    assert c.status == "pass" and c.values["p"] == 2 and c.values["gpus"] == [0, 1]
    c = _check("PATH001", [d], [(TOPO / "l40sx4_pcie.topo.json", "topology")])
    assert c.status == "finding" and c.values["worst_link_class"] == "pcie"  # GPUs 0 and 1 share a socket
    c = _check("PATH001", [SAMPLES / "kv_replicated_tp4"], [(TOPO / "l40sx4_pcie.topo.json", "topology")])
    assert c.status == "finding" and c.values["worst_link_class"] == "pcie-host"
    assert any("P2P read chipset_not_supported" in e["name"] for e in c.evidence)


def test_shp004_memory_from_the_snapshot():
    d = SAMPLES / "healthy_tp2"
    c = _check("SHP004", [d], [(TOPO / "h100x2_nvswitch.topo.json", "topology")], model=d / "config.json")
    assert c.status == "finding" and c.severity == "info"
    assert c.values["gpu_memory_source"].startswith("topology snapshot")
    assert c.values["min_p_that_fits"] == 1


# --- hostile values: a snapshot with one value edited is one error naming the field (regressions of the fuzz suite)


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d["gpus"][0]["memory"].update(total_bytes="lots"), r"gpus\[0\]\.memory\.total_bytes"),
        (lambda d: d["gpus"][1].update(nvlinks=7), r"gpus\[1\]\.nvlinks must be a list"),  # AttributeError before
        (lambda d: d["gpus"][0]["nvlinks"][0].update(link=2**70), r"gpus\[0\]\.nvlinks\[0\]\.link"),
        (lambda d: d["gpus"][0].update(pci_bus_id=["00:19.0"]), r"gpus\[0\]\.pci_bus_id"),  # .strip() on a list
        (lambda d: d["gpus"][0].update(name="\ud800"), r"gpus\[0\]\.name"),  # UnicodeEncodeError in Arrow
        (lambda d: d["gpus"][0]["pcie"].update(gen=float("inf")), r"gpus\[0\]\.pcie\.gen"),  # OverflowError
        (lambda d: d.update(pairs=[None]), r"pairs\[0\] is null"),
        (lambda d: d.update(tool=["tracediag"]), r"tool must be an object"),
    ],
)
def test_a_wrong_value_is_one_error_naming_the_field(tmp_path, edit, field):
    doc = json.loads((TOPO / "h100x2_nvswitch.topo.json").read_text())
    edit(doc)
    f = tmp_path / "topo.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=field) as e:
        parse_topology(f, 0, IngestOptions())
    assert str(e.value).startswith(str(f)) and "\n" not in str(e.value)


def test_a_snapshot_nested_too_deep_is_one_error(tmp_path):
    f = tmp_path / "topo.json"
    f.write_text('{"schema": "tracediag/topology-v1", "gpus": [], "environment": ' + "[" * 5000 + "]" * 5000 + "}")
    with pytest.raises(InputError, match="nested"):
        parse_topology(f, 0, IngestOptions())


@pytest.mark.parametrize(
    ("edit", "field"),
    [  # the fields the validator did not check before: each written by `tracediag env` (live/topology.py)
        (lambda d: d["nvml"].update(nvml_version=12.55), r"nvml\.nvml_version must be text"),
        (lambda d: d["nvml"].update(cuda_driver_version=-1), r"nvml\.cuda_driver_version must be an integer"),
        (lambda d: d["nvml"].update(cuda_driver_version="12.4"), r"nvml\.cuda_driver_version"),
        (lambda d: d["environment"].update(CUDA_VISIBLE_DEVICES=[0, 1]), r"environment\.\['CUDA_VISIBLE_DEVICES'\]"),
        (lambda d: d["environment"].update({"\ud800" * 3: 5}), r"environment\.\['\\\\ud800"),
        (lambda d: d.update(environment="CUDA_VISIBLE_DEVICES=0"), r"environment must be an object"),
        (lambda d: d.update(errors=[{"call": "nvmlDeviceGetName", "gpu": 2**40, "error": "x"}]), r"errors\[0\]\.gpu"),
        (lambda d: d.update(errors=["nvmlDeviceGetName failed"]), r"errors\[0\] must be an object"),
        (lambda d: d.update(errors=[{"call": ["nvmlInit"]}]), r"errors\[0\]\.call must be text"),
    ],
)
def test_every_field_of_the_snapshot_is_checked(tmp_path, edit, field):
    doc = json.loads((TOPO / "h100x2_nvswitch.topo.json").read_text())
    edit(doc)
    f = tmp_path / "topo.json"
    f.write_text(json.dumps(doc))
    with pytest.raises(InputError, match=field) as e:
        parse_topology(f, 0, IngestOptions())
    assert str(e.value).startswith(str(f)) and "\n" not in str(e.value)


@pytest.mark.parametrize("name", ["nodriver", "h100x2_nvswitch", "l40sx4_pcie", "h100x2_nvlink_degraded"])
def test_every_committed_snapshot_becomes_its_rows(name):
    # the real driverless snapshot and the NVML-field ones: one row per GPU, GPU pair and NVLink of the JSON
    path = TOPO / f"{name}.topo.json"
    doc = json.loads(path.read_text())
    parsed = parse_topology(path, 0, IngestOptions())
    rows = {t: parsed.tables[t].to_pylist() if t in parsed.tables else [] for t in ("topo_gpus", "topo_pairs")}
    assert [(g["gpu_index"], g["name"], g["pci_bus_id"]) for g in rows["topo_gpus"]] == [
        (g["index"], g["name"], g["pci_bus_id"]) for g in doc["gpus"]
    ]
    assert [(p["gpu_a"], p["gpu_b"]) for p in rows["topo_pairs"]] == [(p["a"], p["b"]) for p in doc["pairs"]]
    links = sum(len(g.get("nvlinks") or []) for g in doc["gpus"])
    assert (parsed.tables["topo_nvlinks"].num_rows if "topo_nvlinks" in parsed.tables else 0) == links
    meta = json.loads(parsed.inputs_rows[0]["meta_json"])
    assert meta["nvml_available"] is doc["nvml"]["available"] and meta["gpus"] == len(doc["gpus"])
