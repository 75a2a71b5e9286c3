"""The GPU catalogue (tracediag/catalog/gpus.json): every required GPU, a vendor source for every number served,
recognition of the device names the vendored real traces carry (Kineto deviceProperties, Nsight TARGET_INFO_GPU,
`tracediag env` snapshots), and KRN005 / KRN007 / COL003 using it when --peak-tflops / --hbm-bandwidth are absent.

No vendored real GPU trace runs at TP > 1 with a model config and projection GEMM shapes, so KRN007 and COL003 never
reach their peak on one: they are run on the CPU sample traces with the trace's GPU set to the catalogue's H100
(tracediag.analyses.gpu.for_trace patched), and the real-trace path (store -> GPU -> peak) is tested on its own.
"""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
from urllib.parse import urlparse

import duckdb
import pytest
from conftest import EXTERNAL, KINETO_DATA, REPO, SAMPLES, kineto_file

from tracediag.analyses import gpu
from tracediag.analysis import analyze
from tracediag.catalog.gpus import INFERRED, MATCHED_BY_NAME, MATH_CLASSES, entries, lookup, peak
from tracediag.context import Context, Settings

B300 = "tracelens_b300_sglang_qwen3-30b-a3b_moe_decode_cudagraph.json.gz"
B300_MODEL = REPO / "tests" / "data" / "configs" / "Qwen__Qwen3-30B-A3B.config.json"
MI300X_EMPTY_NAME = "tracelens_mi300x_vllm_gptoss_prefilldecode_piecewise.json.gz"
VENDOR_HOSTS = ("nvidia.com", "amd.com")

# every GPU the catalogue must hold: (label, a device name it carries, memory bytes, SM/CU count) -> entry name
REQUIRED = [
    ("P100 SXM2", "Tesla P100-SXM2-16GB", 17071734784, 56, "NVIDIA Tesla P100 SXM2 16GB"),
    ("P100 PCIe", "Tesla P100-PCIE-16GB", 17071734784, 56, "NVIDIA Tesla P100 PCIe 16GB"),
    ("Quadro GP100", "Quadro GP100", 17069309952, 56, "NVIDIA Quadro GP100"),
    ("V100 SXM2", "Tesla V100-SXM2-32GB", 34079637504, 80, "NVIDIA Tesla V100 SXM2"),
    ("V100 PCIe", "Tesla V100-PCIE-16GB", 16945512448, 80, "NVIDIA Tesla V100 PCIe"),
    ("A100 SXM 40GB", "NVIDIA A100-SXM4-40GB", 42297524224, 108, "NVIDIA A100 SXM4 40GB"),
    ("A100 SXM 80GB", "NVIDIA A100-SXM4-80GB", 85100068864, 108, "NVIDIA A100 SXM4 80GB"),
    ("A100 PCIe 40GB", "NVIDIA A100-PCIE-40GB", 42505273344, 108, "NVIDIA A100 PCIe 40GB"),
    ("A100 PCIe 80GB", "NVIDIA A100 80GB PCIe", 85094612992, 108, "NVIDIA A100 PCIe 80GB"),
    ("A10", "NVIDIA A10", 23836098560, 72, "NVIDIA A10"),
    ("A10G", "NVIDIA A10G", 23836098560, 80, "NVIDIA A10G"),
    ("L4", "NVIDIA L4", 23580639232, 58, "NVIDIA L4"),
    ("L40S", "NVIDIA L40S", 48305799168, 142, "NVIDIA L40S"),
    ("H100 SXM", "NVIDIA H100 80GB HBM3", 85018279936, 132, "NVIDIA H100 SXM5 80GB"),
    ("H100 PCIe", "NVIDIA H100 PCIe", 85028896768, 114, "NVIDIA H100 PCIe 80GB"),
    ("H100 NVL", "NVIDIA H100 NVL", 100485038080, 132, "NVIDIA H100 NVL 94GB"),
    ("H200", "NVIDIA H200", 150754820096, 132, "NVIDIA H200 141GB"),
    ("H20", "NVIDIA H20", 102005473280, 78, "NVIDIA H20 96GB"),
    ("GH200", "NVIDIA GH200 480GB", 102005473280, 132, "NVIDIA GH200 96GB HBM3"),
    ("B200", "NVIDIA B200", 191537987584, 148, "NVIDIA B200 180GB (HGX)"),
    ("B300", "NVIDIA B300 SXM6 AC", 287416123392, 148, "NVIDIA B300 / GB300 288GB"),
    ("GB300", "NVIDIA GB300", 287416123392, 148, "NVIDIA B300 / GB300 288GB"),
    ("RTX 3080", "NVIDIA GeForce RTX 3080", 10736893952, 68, "NVIDIA GeForce RTX 3080"),
    ("RTX 3090", "NVIDIA GeForce RTX 3090", 25447170048, 82, "NVIDIA GeForce RTX 3090"),
    ("RTX 4090", "NVIDIA GeForce RTX 4090", 25393692672, 128, "NVIDIA GeForce RTX 4090"),
    ("RTX 5090", "NVIDIA GeForce RTX 5090", 33667547136, 170, "NVIDIA GeForce RTX 5090"),
    ("MI210", "AMD Instinct MI210", 68702699520, 104, "AMD Instinct MI210"),
    ("MI250X", "AMD Instinct MI250X", 68702699520, 110, "AMD Instinct MI250X (one GCD)"),
    ("MI300X", "AMD Instinct MI300X", 206141652992, 304, "AMD Instinct MI300X"),
    ("MI325X", "AMD Instinct MI325X", 274877906944, 304, "AMD Instinct MI325X"),
    ("MI355X", "AMD Instinct MI355X", 309237645312, 256, "AMD Instinct MI355X"),
]

# every device name the vendored real inputs carry -> the catalogue entry it must match
REAL_NAMES = {
    "NVIDIA A100-PG509-200": "NVIDIA A100 SXM4 40GB",  # the SXM4 board's part number; 40 GB reported
    "NVIDIA A100-SXM4-40GB": "NVIDIA A100 SXM4 40GB",
    "Quadro GP100": "NVIDIA Quadro GP100",
    "Tesla V100-SXM2-32GB": "NVIDIA Tesla V100 SXM2",
    "NVIDIA B300 SXM6 AC": "NVIDIA B300 / GB300 288GB",
    "NVIDIA H100 80GB HBM3": "NVIDIA H100 SXM5 80GB",
    "AMD Instinct MI300X": "AMD Instinct MI300X",
    "NVIDIA GeForce RTX 3080": "NVIDIA GeForce RTX 3080",
    "NVIDIA L40S": "NVIDIA L40S",
    "": "AMD Instinct MI300X",  # inferred: vendor amd (warp size 64), 304 CUs, 192 GiB
}


def _vendored_devices() -> list[tuple[str, str, int | None, int | None, str | None]]:
    """(file, device name, memory bytes, SM/CU count, vendor) of every device a vendored real input names."""
    out = []
    for f in sorted(KINETO_DATA.rglob("*.json*")):
        opener = gzip.open if f.suffix == ".gz" else open
        with opener(f, "rt") as fh:
            doc = json.load(fh)
        for d in doc.get("deviceProperties", []) if isinstance(doc, dict) else []:
            vendor = {64: "amd", 32: "nvidia"}.get(d.get("warpSize"))
            out.append((f.name, d.get("name") or "", d.get("totalGlobalMem"), d.get("numSms"), vendor))
    for f in sorted((EXTERNAL / "nsys").glob("*.sqlite")):
        con = sqlite3.connect(f"file:{f}?mode=ro", uri=True)
        if con.execute("SELECT 1 FROM sqlite_master WHERE name = 'TARGET_INFO_GPU'").fetchone():
            for name, mem, sms in con.execute("SELECT name, totalMemory, smCount FROM TARGET_INFO_GPU"):
                out.append((f.name, name or "", mem, sms, "nvidia"))
        con.close()
    for f in sorted((REPO / "tests" / "data" / "topology").glob("*.topo.json")):
        for g in json.loads(f.read_text()).get("gpus") or []:
            out.append((f.name, g.get("name") or "", (g.get("memory") or {}).get("total_bytes"), None, "nvidia"))
    return out


def test_every_required_gpu_is_recognised():
    names = {e.name for e in entries()}
    for label, device, mem, sms, want in REQUIRED:
        assert want in names, label
        spec = lookup(device, sm_count=sms, memory_bytes=mem)
        assert spec is not None and spec.name == want, (label, device, spec and spec.name)
        assert spec.matched_by == MATCHED_BY_NAME


def test_every_number_has_a_vendor_source():
    for e in entries():
        served = {**e.peak_tflops, **({"hbm_gbs": e.hbm_gbs} if e.hbm_gbs is not None else {})}
        assert set(e.peak_tflops) <= set(MATH_CLASSES), e.name
        assert set(e.sources) == set(served), e.name  # a source for every number, none for a number not served
        for key, value in served.items():
            assert value > 0, (e.name, key)
            urls = re.findall(r"https?://[^\s,;)]+", e.sources[key])
            hosts = [urlparse(u).hostname or "" for u in urls]
            assert hosts and all(any(h == v or h.endswith("." + v) for v in VENDOR_HOSTS) for h in hosts), (
                e.name,
                key,
                urls,
            )
        # figures only third-party pages give are kept aside, never served
        for key in e.unverified:
            assert key not in served, (e.name, key)
        if e.unverified or not served:
            assert e.note or e.unverified, e.name


def test_dense_peaks_are_stored():
    # spot values from the vendors' documents, dense (half the 2:4-sparse tensor figure where one is quoted)
    h100 = lookup("NVIDIA H100 80GB HBM3", sm_count=132, memory_bytes=85018279936)
    assert h100.peak_tflops["bf16"] == 989.5 and h100.peak_tflops["fp8"] == 1979.0 and h100.hbm_gbs == 3350.0
    mi300x = lookup("AMD Instinct MI300X", sm_count=304, memory_bytes=206141652992)
    assert mi300x.peak_tflops["bf16"] == 1307.4 and mi300x.hbm_gbs == 5300.0
    a100 = lookup("NVIDIA A100-PG509-200", sm_count=108, memory_bytes=42297524224)
    assert a100.peak_tflops["bf16"] == 312.0 and a100.hbm_gbs == 1555.0
    # V100 has one FP16 tensor figure: bf16 asks fall back to it, and say so
    v100 = lookup("Tesla V100-SXM2-32GB", sm_count=80, memory_bytes=34079637504)
    assert peak(v100, "bf16") == (125.0, "fp16")


@pytest.mark.parametrize("dev", _vendored_devices(), ids=lambda d: f"{d[0]}:{d[1] or '(empty)'}")
def test_real_device_names(dev):
    f, name, mem, sms, vendor = dev
    assert name in REAL_NAMES, f"{f}: device name {name!r} is new: add it to REAL_NAMES (and the catalogue)"
    spec = lookup(name, vendor=vendor, sm_count=sms, memory_bytes=mem)
    assert spec is not None and spec.name == REAL_NAMES[name], (f, name, spec and spec.name)
    if name:
        assert spec.matched_by == MATCHED_BY_NAME
    else:
        assert spec.matched_by.startswith(INFERRED) and "device name is empty" in spec.matched_by


def test_every_real_name_is_seen():
    assert {d[1] for d in _vendored_devices()} == set(REAL_NAMES)


def test_unknown_or_ambiguous_is_none():
    assert lookup("NVIDIA T4", sm_count=40, memory_bytes=15843721216) is None
    assert lookup("Intel(R) Data Center GPU Max 1550") is None
    assert lookup("NVIDIA H100") is None  # SXM, PCIe or NVL: neither SM count nor memory tells
    assert lookup("NVIDIA GeForce RTX 3080", sm_count=70, memory_bytes=12_884_901_888) is None  # the 12 GB board
    assert lookup("", vendor="nvidia", sm_count=304, memory_bytes=206141652992) is None
    assert lookup("", vendor=None, sm_count=304, memory_bytes=206141652992) is None  # no vendor: not inferred
    # a name several parts share is told apart by the CU count
    assert lookup("AMD Instinct MI250X / MI250", sm_count=104, memory_bytes=68702699520).name.startswith(
        "AMD Instinct MI250 "
    )
    assert lookup("AMD Instinct MI250X / MI250", sm_count=110, memory_bytes=68702699520).name.startswith(
        "AMD Instinct MI250X"
    )


def _store_context(tmp_path, trace, settings=None) -> Context:
    db = tmp_path / "trace.duckdb"
    analyze([trace], db_path=db, rules=("KRN005",))
    return Context(duckdb.connect(str(db), read_only=True), None, None, settings or Settings())


def test_empty_name_mi300x_from_the_store(tmp_path):
    ctx = _store_context(tmp_path, kineto_file(MI300X_EMPTY_NAME))
    spec = gpu.for_trace(ctx)
    assert spec is not None and spec.name == "AMD Instinct MI300X"
    assert spec.matched_by.startswith(INFERRED) and "vendor amd, 304 CUs" in spec.matched_by
    flops, source = gpu.peak_flops(ctx)
    assert flops == pytest.approx(1307.4e12)
    assert source.startswith("from the GPU catalogue: AMD Instinct MI300X, AMD Instinct MI300X data sheet")
    assert "amd.com" in source and "inferred" in source and "upper bound" in source
    bw, bw_source = gpu.bandwidth(ctx)
    assert bw == pytest.approx(5.3e12) and "5300 GB/s" in bw_source


def test_flags_win_over_the_catalogue(tmp_path):
    ctx = _store_context(tmp_path, kineto_file(B300), Settings(peak_tflops=1000.0, hbm_bandwidth_gbs=2000.0))
    assert gpu.for_trace(ctx).name == "NVIDIA B300 / GB300 288GB"
    assert gpu.peak_flops(ctx) == (1e15, "--peak-tflops 1000")
    assert gpu.bandwidth(ctx) == (2e12, "--hbm-bandwidth 2000 GB/s")


def test_gpu_from_a_topology_snapshot(tmp_path):
    # a trace without device properties (the CPU sample) beside a `tracediag env` snapshot: its NVML names count
    db = tmp_path / "trace.duckdb"
    topo = REPO / "tests" / "data" / "topology" / "l40sx4_pcie.topo.json"
    analyze([SAMPLES / "healthy_tp2"], db_path=db, extra_inputs=[(topo, "topology")], rules=("KRN005",))
    ctx = Context(duckdb.connect(str(db), read_only=True), None, None, Settings())
    assert gpu.for_trace(ctx).name == "NVIDIA L40S"
    bw, source = gpu.bandwidth(ctx)
    assert bw == pytest.approx(864e9) and source.startswith("from the GPU catalogue: NVIDIA L40S, NVIDIA L40S")


def _check(report, rule):
    (c,) = [c for c in report.checks if c.rule == rule]
    return c


def test_krn005_uses_the_catalogue_on_the_b300_trace():
    c = _check(analyze([kineto_file(B300)], model=B300_MODEL, rules=("KRN005",)), "KRN005")
    assert c.status == "pass", c.to_dict()
    assert c.values["bandwidth_kind"] == "datasheet peak (GPU catalogue)"
    assert c.values["bandwidth_bytes_per_s"] == pytest.approx(8e12)
    assert c.values["bandwidth_source"].startswith("from the GPU catalogue: NVIDIA B300 / GB300 288GB, ")
    assert "nvidia.com" in c.values["bandwidth_source"] and "upper bound" in c.values["bandwidth_source"]
    assert c.values["peak_source"].startswith("from the GPU catalogue: NVIDIA B300 / GB300 288GB, ")
    assert c.values["peak_flops_per_s"] == pytest.approx(2250e12)  # bf16 dense: the trace's GEMMs are bf16
    assert "understated" in c.values["note"]
    assert "GPU catalogue" in c.title


def test_krn005_flags_override_the_catalogue():
    s = Settings(hbm_bandwidth_gbs=4000.0, peak_tflops=100.0)
    c = _check(analyze([kineto_file(B300)], model=B300_MODEL, rules=("KRN005",), settings=s), "KRN005")
    assert c.values["bandwidth_kind"] == "given (--hbm-bandwidth)"
    assert c.values["bandwidth_bytes_per_s"] == pytest.approx(4e12)
    assert c.values["peak_source"] == "--peak-tflops 100" and c.values["peak_flops_per_s"] == pytest.approx(1e14)
    assert "GPU catalogue" not in json.dumps(c.values)


def test_krn005_unknown_gpu_asks_for_the_flag(monkeypatch):
    from tracediag.derive import device

    monkeypatch.setattr(device, "lookup", lambda *a, **k: None)
    c = _check(analyze([kineto_file(B300)], model=B300_MODEL, rules=("KRN005",)), "KRN005")
    assert c.status == "not_applicable"
    assert "'NVIDIA B300 SXM6 AC' is not in the GPU catalogue" in c.reason and "--hbm-bandwidth" in c.reason


H100 = lookup("NVIDIA H100 80GB HBM3", sm_count=132, memory_bytes=85018279936)


@pytest.fixture
def on_h100(monkeypatch):
    """The CPU sample traces as if their GPU were the catalogue's H100 SXM."""
    monkeypatch.setattr(gpu, "for_trace", lambda ctx: H100)


def test_krn007_uses_the_catalogue(on_h100):
    trace = SAMPLES / "wide_tp2"
    c = _check(analyze([trace], model=trace / "config.json", rules=("KRN007",)), "KRN007")
    assert c.status == "pass", c.to_dict()
    assert (
        c.values["reference"].startswith("datasheet peak ")
        and "NVIDIA H100 SXM5 80GB (GPU catalogue)" in (c.values["reference"])
    )
    assert c.values["reference_source"].startswith("from the GPU catalogue: NVIDIA H100 SXM5 80GB, ")
    assert "upper bound" in c.values["reference_source"]
    s = Settings(peak_tflops=1.0)
    c = _check(analyze([trace], model=trace / "config.json", rules=("KRN007",), settings=s), "KRN007")
    assert c.values["reference"] == "peak 1 TFLOP/s" and "reference_source" not in c.values


def test_krn007_without_any_reference_stays_not_applicable():
    trace = SAMPLES / "healthy_tp2"  # a CPU trace: no GPU, no catalogue figure
    c = _check(analyze([trace], model=trace / "config.json", rules=("KRN007",)), "KRN007")
    assert c.status == "not_applicable" and "missing a reference FLOP rate" in c.reason


def test_col003_uses_the_catalogue(on_h100):
    trace = SAMPLES / "healthy_tp2"
    c = _check(analyze([trace], model=trace / "config.json", rules=("COL003",)), "COL003")
    peak_tflops = c.values["peak_tflops"]
    assert peak_tflops in H100.peak_tflops.values()
    assert c.values["peak_source"].startswith("from the GPU catalogue: NVIDIA H100 SXM5 80GB, ")
    assert "upper bound" in c.values["peak_source"]
    assert f"{peak_tflops:g} TFLOP/s" in c.values["compute_floor_note"]
    s = Settings(peak_tflops=1.0)
    c = _check(analyze([trace], model=trace / "config.json", rules=("COL003",), settings=s), "COL003")
    assert c.values["peak_tflops"] == 1.0 and "peak_source" not in c.values


def test_col003_without_a_gpu_has_no_floor():
    trace = SAMPLES / "healthy_tp2"
    c = _check(analyze([trace], model=trace / "config.json", rules=("COL003",)), "COL003")
    assert "peak_tflops" not in c.values and "peak_source" not in c.values
