"""Topology snapshots written by `tracediag env` (schema "tracediag/topology-v1") -> topo_* tables.

The snapshot holds what NVML reported; the link class of each GPU pair and the bandwidth that path
can carry are derived here, so an old snapshot benefits from a better classification:

- `nvlink`: active NVLink links from one GPU to the other's PCI bus id (direct bridge/mesh);
- `nvswitch`: both GPUs have active links to NVSwitches and P2P over NVLink is OK;
- `pcie`: no NVLink path, P2P read/write over PCIe OK;
- `pcie-host`: no P2P at all: traffic is staged through host memory.

Bandwidth per direction of the path (what nccl-tests' bus bandwidth is compared with: NVIDIA/nccl-tests
doc/PERFORMANCE.md, "bus bandwidth ... reflects how optimally the hardware is used"):
NVLink per link per direction 20 GB/s (1.0), 25 GB/s (2.x, 3.x, 4.0), 50 GB/s (5.0) — NVIDIA's NVLink
page: P100 4 links 160 GB/s, V100 6 links 300 GB/s, A100 12 links 600 GB/s, H100 18 links 900 GB/s,
Blackwell 18 links 1.8 TB/s, all bidirectional totals; PCIe per lane per direction after line encoding:
0.25 (gen1), 0.5 (gen2), 0.985 (gen3), 1.969 (gen4), 3.938 (gen5), 8.0 (gen6, FLIT) GB/s.

The snapshot is checked field by field against what `tracediag env` writes (`_SNAPSHOT`): a value of the wrong
type or out of range is an InputError naming the field (`gpus[1].memory.total_bytes`), never a crash.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from tracediag.errors import InputError
from tracediag.ingest import validate as val
from tracediag.ingest.base import IngestOptions, Parsed
from tracediag.inputfile import read_input
from tracediag.model.links import NVLINK_GBS_PER_LINK, pcie_gbs

SCHEMA_PREFIX = "tracediag/topology-v"
SUPPORTED = {"tracediag/topology-v1"}


def bus_key(bus_id: str | None) -> tuple[int, int, int, int] | None:
    """'00000000:19:00.0' / '0000:19:00.0' / '19:00.0' -> (domain, bus, device, function)."""
    if not bus_id:
        return None
    try:
        parts = bus_id.strip().lower().split(":")
        dev, _, fn = parts[-1].partition(".")
        domain = int(parts[-3], 16) if len(parts) >= 3 else 0
        return (domain, int(parts[-2], 16), int(dev, 16), int(fn or "0", 16))
    except (ValueError, IndexError):
        return None


def classify_pair(ga: dict, gb: dict, pair: dict) -> tuple[str, int, float | None]:
    """(link_class, direct NVLink links a->b, expected per-direction GB/s)."""
    kb = bus_key(gb.get("pci_bus_id"))
    active_a = [link for link in ga.get("nvlinks") or [] if link.get("state") == "active"]
    active_b = [link for link in gb.get("nvlinks") or [] if link.get("state") == "active"]
    direct = [link for link in active_a if kb and bus_key(link.get("remote_pci_bus_id")) == kb]
    p2p = pair.get("p2p") or {}

    def rate(links: list[dict]) -> float | None:
        rates = [NVLINK_GBS_PER_LINK.get(str(link.get("version"))) for link in links]
        return None if not links or None in rates else sum(rates)

    if direct:
        return "nvlink", len(direct), rate(direct)
    sw_a = [link for link in active_a if link.get("remote_type") == "switch"]
    sw_b = [link for link in active_b if link.get("remote_type") == "switch"]
    if sw_a and sw_b and p2p.get("nvlink") in ("ok", None):
        ra, rb = rate(sw_a), rate(sw_b)
        return "nvswitch", 0, min(ra, rb) if ra is not None and rb is not None else None
    if p2p.get("nvlink") == "ok" and active_a and active_b:
        ra, rb = rate(active_a), rate(active_b)
        return "nvlink", 0, min(ra, rb) if ra is not None and rb is not None else None
    pa_, pb_ = ga.get("pcie") or {}, gb.get("pcie") or {}
    bw = [pcie_gbs(x.get("gen"), x.get("width")) for x in (pa_, pb_)]
    expected = min(bw) if None not in bw else None
    if p2p.get("read") == "ok" or p2p.get("write") == "ok":
        return "pcie", 0, expected
    return "pcie-host", 0, expected


# --- what a snapshot may hold (live/topology.py writes it) ---------------------------------------------------
# a field: (types, lo, hi) for numbers, (str,) for text, a dict for an object, [spec] for a list of them;
# every field may be null except the ones in _REQUIRED.
_TEXT = (str,)
_ANY_KEY = "*"  # in an object spec: every key of the object, each value checked by the same spec
_COUNT = (int, 0, 2**20)


def _int_in(lo: int, hi: int) -> tuple:
    return (int, lo, hi)


_LINK = {
    "link": _int_in(0, 4096),
    "state": _TEXT,
    "version": (str, int, float),
    "remote_pci_bus_id": _TEXT,
    "remote_type": _TEXT,
}
_MHZ = _int_in(0, 10**6)
_GPU = {
    "index": _int_in(0, 2**16),
    "name": _TEXT,
    "uuid": _TEXT,
    "pci_bus_id": _TEXT,
    "memory": {"total_bytes": _int_in(0, val.INT64_MAX), "used_bytes": _int_in(0, val.INT64_MAX)},
    "clocks_mhz": {"sm": _MHZ, "sm_max": _MHZ, "mem": _MHZ, "mem_max": _MHZ},
    "pcie": {
        "gen": _int_in(0, 64),
        "gen_max": _int_in(0, 64),
        "width": _int_in(0, 1024),
        "width_max": _int_in(0, 1024),
    },
    "numa_node": _int_in(-1, 2**16),
    "cpu_affinity": _TEXT,
    "nvlinks": [_LINK],
}
_PAIR = {
    "a": _int_in(0, 2**16),
    "b": _int_in(0, 2**16),
    "topology": _TEXT,
    "p2p": {"read": _TEXT, "write": _TEXT, "nvlink": _TEXT, "atomics": _TEXT},
}
_SNAPSHOT = {
    "schema": _TEXT,
    "host": _TEXT,
    "created_utc": _TEXT,
    "tool": {"name": _TEXT, "version": _TEXT},
    "nvml": {
        "available": (bool,),
        "error": _TEXT,
        "driver_version": _TEXT,
        "nvml_version": _TEXT,
        "cuda_driver_version": _int_in(0, 10**7),  # nvmlSystemGetCudaDriverVersion: 1000 * major + 10 * minor
    },
    "environment": {_ANY_KEY: _TEXT},  # CUDA_VISIBLE_DEVICES, CUDA_DEVICE_ORDER: text or null
    "errors": [{"call": _TEXT, "gpu": _int_in(0, 2**16), "error": _TEXT}],  # NVML calls that failed
    "gpus": [_GPU],
    "pairs": [_PAIR],
}
_REQUIRED = {"gpus[].index", "gpus[].nvlinks[].link", "pairs[].a", "pairs[].b"}


def _type_name(spec: tuple) -> str:
    if spec[0] is int and len(spec) == 3:
        return f"an integer {spec[1]} … {spec[2]}"
    names = {str: "text", int: "a number", float: "a number", bool: "true/false"}
    return " or ".join(dict.fromkeys(names[t] for t in spec))


def _check(path: Path, value: Any, spec: Any, where: str, generic: str) -> None:
    """Raise an InputError naming `where` (gpus[1].memory.total_bytes) when value does not fit spec."""
    if value is None:
        if generic in _REQUIRED:
            raise InputError(path, f"topology snapshot: {where} is missing")
        return
    if isinstance(spec, dict):
        if not isinstance(value, dict):
            raise InputError(path, f"topology snapshot: {where} must be an object, got {val.example(value)}")
        keys = list(value) if _ANY_KEY in spec else list(spec)
        for key in keys:
            sub = spec.get(key, spec.get(_ANY_KEY))
            name = key if key in spec else f"[{val.example(key)}]"  # a key from the file: printable, short
            _check(
                path, value.get(key), sub, f"{where}.{name}" if where else name, f"{generic}.{key}" if generic else key
            )
        return
    if isinstance(spec, list):
        if not isinstance(value, list):
            raise InputError(path, f"topology snapshot: {where} must be a list, got {val.example(value)}")
        for i, item in enumerate(value):
            if item is None:
                raise InputError(path, f"topology snapshot: {where}[{i}] is null")
            _check(path, item, spec[0], f"{where}[{i}]", f"{generic}[]")
        return
    types = tuple(t for t in spec if isinstance(t, type))
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if ok and spec[0] is int and len(spec) == 3:
        ok = type(value) is int and spec[1] <= value <= spec[2]
    if ok and isinstance(value, float):
        ok = value == value and abs(value) < 1e300
    if ok and isinstance(value, str):
        ok = not val.has_surrogates(value)
    if not ok:
        raise InputError(path, f"topology snapshot: {where} must be {_type_name(spec)}, got {val.example(value)}")


def _load(path: Path, limit: int | None) -> dict:
    raw = read_input(path, "topology snapshot", limit)
    try:
        doc = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(path, f"topology snapshot is not valid JSON ({exc})") from None
    except RecursionError:
        raise InputError(path, "topology snapshot is not valid JSON (nested hundreds of levels deep)") from None
    except ValueError as exc:  # an integer past int_max_str_digits (4,300 digits): not a JSONDecodeError
        raise InputError(path, f"topology snapshot is not valid JSON ({str(exc).split(';', 1)[0]})") from None
    if not isinstance(doc, dict) or not str(doc.get("schema", "")).startswith(SCHEMA_PREFIX):
        raise InputError(path, 'not a tracediag topology snapshot (no "schema": "tracediag/topology-v1")')
    if doc["schema"] not in SUPPORTED:
        raise InputError(
            path, f"topology schema {doc['schema']} is newer than this tracediag reads ({', '.join(SUPPORTED)})"
        )
    if not isinstance(doc.get("gpus"), list) or not isinstance(doc.get("pairs", []), list):
        raise InputError(path, "topology snapshot lacks its 'gpus' list")
    _check(path, doc, _SNAPSHOT, "", "")
    indices = [g["index"] for g in doc["gpus"]]
    if len(set(indices)) != len(indices):
        raise InputError(path, f"topology snapshot: two gpus[] entries have the same index ({indices})")
    for i, pair in enumerate(doc.get("pairs") or []):
        for side in ("a", "b"):
            if pair[side] not in indices:
                raise InputError(path, f"topology snapshot: pairs[{i}].{side} = {pair[side]} is no GPU in gpus[]")
    return doc


def _gpu_row(src: str, host: Any, g: dict) -> dict[str, Any]:
    """One topo_gpus row: the GPU's memory, clocks, PCIe link and how many of its NVLinks are active."""
    links = g.get("nvlinks") or []
    active = [link for link in links if link.get("state") == "active"]
    versions = sorted({str(link.get("version")) for link in active if link.get("version")})
    mem, clk, pcie = g.get("memory") or {}, g.get("clocks_mhz") or {}, g.get("pcie") or {}
    return {
        "source_path": src,
        "host": host,
        "gpu_index": int(g["index"]),
        "name": g.get("name"),
        "uuid": g.get("uuid"),
        "pci_bus_id": g.get("pci_bus_id"),
        "memory_total_bytes": mem.get("total_bytes"),
        "memory_used_bytes": mem.get("used_bytes"),
        "sm_clock_mhz": clk.get("sm"),
        "sm_clock_max_mhz": clk.get("sm_max"),
        "mem_clock_mhz": clk.get("mem"),
        "mem_clock_max_mhz": clk.get("mem_max"),
        "pcie_gen": pcie.get("gen"),
        "pcie_gen_max": pcie.get("gen_max"),
        "pcie_width": pcie.get("width"),
        "pcie_width_max": pcie.get("width_max"),
        "numa_node": g.get("numa_node"),
        "cpu_affinity": g.get("cpu_affinity"),
        "nvlinks_total": len(links),
        "nvlinks_active": len(active),
        "nvlink_version": ",".join(versions) or None,
    }


def _link_rows(src: str, host: Any, g: dict, bus_to_index: dict) -> list[dict[str, Any]]:
    """The GPU's topo_nvlinks rows, the remote end resolved to a GPU index by its PCI bus id."""
    return [
        {
            "source_path": src,
            "host": host,
            "gpu_index": int(g["index"]),
            "link": int(link["link"]),
            "state": link.get("state"),
            "version": str(link["version"]) if link.get("version") is not None else None,
            "remote_pci_bus_id": link.get("remote_pci_bus_id"),
            "remote_type": link.get("remote_type"),
            "remote_gpu_index": bus_to_index.get(bus_key(link.get("remote_pci_bus_id"))),
        }
        for link in g.get("nvlinks") or []
    ]


def _pair_row(src: str, host: Any, p: dict, by_index: dict[int, dict]) -> dict[str, Any]:
    """One topo_pairs row: the pair's P2P capabilities and its link class (classify_pair)."""
    a, b = sorted((int(p["a"]), int(p["b"])))
    cls, direct, expected = classify_pair(by_index[a], by_index[b], p)
    p2p = p.get("p2p") or {}
    return {
        "source_path": src,
        "host": host,
        "gpu_a": a,
        "gpu_b": b,
        "topology": p.get("topology"),
        "p2p_read": p2p.get("read"),
        "p2p_write": p2p.get("write"),
        "p2p_nvlink": p2p.get("nvlink"),
        "p2p_atomics": p2p.get("atomics"),
        "direct_nvlinks": direct,
        "link_class": cls,
        "expected_busbw_gbs": expected,
    }


def parse_topology(path: Path, order: int, options: IngestOptions) -> Parsed:
    doc = _load(path, options.memory_limit)
    src, host = str(path), doc.get("host")
    gpus: list[dict[str, Any]] = doc["gpus"]
    try:
        by_index = {int(g["index"]): g for g in gpus}
        bus_to_index = {bus_key(g.get("pci_bus_id")): int(g["index"]) for g in gpus if g.get("pci_bus_id")}
        gpu_rows, link_rows, pair_rows = [], [], []
        for g in gpus:
            gpu_rows.append(_gpu_row(src, host, g))
            link_rows += _link_rows(src, host, g, bus_to_index)
        for p in doc.get("pairs", []):
            pair_rows.append(_pair_row(src, host, p, by_index))
    except (KeyError, TypeError, ValueError) as exc:
        raise InputError(
            path, f"topology snapshot has a malformed GPU or pair entry ({type(exc).__name__}: {exc})"
        ) from None
    nvml = doc.get("nvml") or {}
    meta = {
        "schema": doc["schema"],
        "host": host,
        "created_utc": doc.get("created_utc"),
        "nvml_available": bool(nvml.get("available")),
        "nvml_error": nvml.get("error"),
        "driver_version": nvml.get("driver_version"),
        "gpus": len(gpu_rows),
        "environment": doc.get("environment"),
        "errors": len(doc.get("errors") or []),
        "tool": doc.get("tool"),
    }
    names = sorted({g["name"] for g in gpu_rows if g["name"]})
    mems = [g["memory_total_bytes"] for g in gpu_rows if g["memory_total_bytes"]]
    tables = {}
    for name, rows in (("topo_gpus", gpu_rows), ("topo_nvlinks", link_rows), ("topo_pairs", pair_rows)):
        if rows:
            tables[name] = pa.Table.from_pylist(rows)
    return Parsed(
        path=src,
        format="topology",
        inputs_rows=[
            {
                "profiler": f"tracediag env ({(doc.get('tool') or {}).get('version') or '?'})",
                "file_bytes": Path(path).stat().st_size,
                "rank": None,
                "device_name": ", ".join(names) or None,
                "device_total_mem_bytes": min(mems) if mems else None,
                "meta_json": json.dumps(meta),
            }
        ],
        tables=tables,
    )
