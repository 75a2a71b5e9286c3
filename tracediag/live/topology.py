"""GPU topology snapshot (`tracediag env -o topo.json`): this machine's GPUs read with NVML (nvidia-ml-py),
for PATH001.

Per GPU: name, UUID, PCI bus id, memory, clocks, PCIe generation/width (current and max), NUMA node and
local CPUs, and every NVLink link (state, version, what is at the other end); per GPU pair: the PCIe
common ancestor (nvidia-smi topo -m's PIX/PXB/PHB/NODE/SYS) and the P2P status (read, write, NVLink,
atomics). A call the GPU or driver does not support is recorded as null plus an entry in `errors`.
Without a driver (or without nvidia-ml-py) it writes a snapshot saying so and exits 0.

Output: JSON, schema "tracediag/topology-v1" (read back by tracediag/ingest/topology.py).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import socket
from types import ModuleType
from typing import Any

from tracediag.version import __version__

SCHEMA_ID = "tracediag/topology-v1"

# nvml.h / pynvml constants, by value (pynvml defines NVML_P2P_CAPS_INDEX_READ as the tuple (0,) —
# a trailing comma in its source — so the indices are spelled out here).
P2P_CAPS = {"read": 0, "write": 1, "nvlink": 2, "atomics": 3}
P2P_STATUS = {
    0: "ok",
    1: "chipset_not_supported",
    2: "gpu_not_supported",
    3: "ioh_topology_not_supported",
    4: "disabled_by_regkey",
    5: "not_supported",
    6: "unknown",
}
# nvmlGpuTopologyLevel_t -> the names nvidia-smi topo -m prints
TOPOLOGY_LEVEL = {0: "INTERNAL", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
NVLINK_STATE = {0: "inactive", 1: "active", 2: "sleep", 3: "active_traffic_disabled"}
NVLINK_VERSION = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}
NVLINK_REMOTE = {0: "gpu", 1: "ibmnpu", 2: "switch", 0xFF: "unknown"}
CLOCK_SM, CLOCK_MEM = 1, 2  # NVML_CLOCK_SM, NVML_CLOCK_MEM
MAX_LINKS_DEFAULT = 18


def _text(v: Any) -> Any:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else v


def _cpulist(masks: Any) -> str | None:
    """NVML CPU affinity bitmask words (64 CPUs each) -> '0-55,112-167'."""
    if masks is None:
        return None
    cpus = [w * 64 + b for w, word in enumerate(masks) for b in range(64) if int(word) >> b & 1]
    if not cpus:
        return None
    ranges, start, prev = [], cpus[0], cpus[0]
    for c in [*cpus[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        ranges.append(f"{start}-{prev}" if prev > start else f"{start}")
        if c is not None:
            start = prev = c
    return ",".join(ranges)


class _Calls:
    """NVML calls that record their failures instead of raising."""

    def __init__(self, nvml: ModuleType) -> None:
        self.nvml = nvml
        self.errors: list[dict] = []

    def __call__(self, name: str, *args: Any, gpu: int | None = None, quiet: bool = False) -> Any:
        try:
            return getattr(self.nvml, name)(*args)
        except self.nvml.NVMLError as exc:
            if not quiet:
                self.errors.append({"call": name, "gpu": gpu, "error": str(exc)})
            return None
        except AttributeError:  # an older nvidia-ml-py without this call
            if not quiet:
                self.errors.append({"call": name, "gpu": gpu, "error": "not in this nvidia-ml-py"})
            return None


def _nvlinks(call: _Calls, h: Any, gpu: int) -> list[dict]:
    nvml = call.nvml
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", MAX_LINKS_DEFAULT)
    links = []
    for link in range(max_links):
        # a GPU without NVLink (or past its last link) answers NOT_SUPPORTED / INVALID_ARGUMENT: stop there
        state = call("nvmlDeviceGetNvLinkState", h, link, gpu=gpu, quiet=True)
        if state is None:
            break
        rec: dict[str, Any] = {"link": link, "state": NVLINK_STATE.get(state, str(state))}
        version = call("nvmlDeviceGetNvLinkVersion", h, link, gpu=gpu)
        rec["version"] = NVLINK_VERSION.get(version, str(version)) if version is not None else None
        if rec["state"] == "active":
            pci = call("nvmlDeviceGetNvLinkRemotePciInfo", h, link, gpu=gpu)
            rec["remote_pci_bus_id"] = _text(pci.busId) if pci is not None else None
            rtype = call("nvmlDeviceGetNvLinkRemoteDeviceType", h, link, gpu=gpu)
            rec["remote_type"] = NVLINK_REMOTE.get(rtype, "unknown") if rtype is not None else None
        links.append(rec)
    return links


def _gpu(call: _Calls, i: int) -> tuple[Any, dict]:
    h = call("nvmlDeviceGetHandleByIndex", i, gpu=i)
    mem = call("nvmlDeviceGetMemoryInfo", h, gpu=i)
    pci = call("nvmlDeviceGetPciInfo", h, gpu=i)
    numa = call("nvmlDeviceGetNumaNodeId", h, gpu=i)
    words = max(1, -(-(os.cpu_count() or 64) // 64))
    gpu = {
        "index": i,
        "name": _text(call("nvmlDeviceGetName", h, gpu=i)),
        "uuid": _text(call("nvmlDeviceGetUUID", h, gpu=i)),
        "pci_bus_id": _text(pci.busId) if pci is not None else None,
        "memory": {
            "total_bytes": int(mem.total) if mem is not None else None,
            "used_bytes": int(mem.used) if mem is not None else None,
        },
        "clocks_mhz": {
            "sm": call("nvmlDeviceGetClockInfo", h, CLOCK_SM, gpu=i),
            "sm_max": call("nvmlDeviceGetMaxClockInfo", h, CLOCK_SM, gpu=i),
            "mem": call("nvmlDeviceGetClockInfo", h, CLOCK_MEM, gpu=i),
            "mem_max": call("nvmlDeviceGetMaxClockInfo", h, CLOCK_MEM, gpu=i),
        },
        "pcie": {
            "gen": call("nvmlDeviceGetCurrPcieLinkGeneration", h, gpu=i),
            "gen_max": call("nvmlDeviceGetMaxPcieLinkGeneration", h, gpu=i),
            "width": call("nvmlDeviceGetCurrPcieLinkWidth", h, gpu=i),
            "width_max": call("nvmlDeviceGetMaxPcieLinkWidth", h, gpu=i),
        },
        "numa_node": numa if numa is None or numa >= 0 else None,
        "cpu_affinity": _cpulist(call("nvmlDeviceGetCpuAffinity", h, words, gpu=i)),
        "nvlinks": _nvlinks(call, h, i),
    }
    return h, gpu


def take_snapshot(nvml: ModuleType | None = None) -> dict[str, Any]:
    """The topology snapshot as a JSON-ready dict; `nvml` is the pynvml module (or a stand-in in tests)."""
    snap: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "tool": {"name": "tracediag", "version": __version__},
        "created_utc": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": socket.gethostname(),
        "environment": {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")},
        "nvml": {"available": False, "error": None},
        "gpus": [],
        "pairs": [],
        "errors": [],
    }
    if nvml is None:
        try:
            import pynvml as nvml  # nvidia-ml-py
        except ImportError:
            snap["nvml"]["error"] = "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
            return snap
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        snap["nvml"]["error"] = str(exc)  # e.g. "NVML Shared Library Not Found", "Driver Not Loaded"
        return snap
    try:
        call = _Calls(nvml)
        snap["nvml"] = {
            "available": True,
            "error": None,
            "driver_version": _text(call("nvmlSystemGetDriverVersion")),
            "nvml_version": _text(call("nvmlSystemGetNVMLVersion")),
            "cuda_driver_version": call("nvmlSystemGetCudaDriverVersion"),
        }
        n = call("nvmlDeviceGetCount") or 0
        handles = []
        for i in range(n):
            h, gpu = _gpu(call, i)
            handles.append(h)
            snap["gpus"].append(gpu)
        for a in range(n):
            for b in range(a + 1, n):
                level = call("nvmlDeviceGetTopologyCommonAncestor", handles[a], handles[b], gpu=a)
                p2p = {}
                for cap, idx in P2P_CAPS.items():
                    st = call("nvmlDeviceGetP2PStatus", handles[a], handles[b], idx, gpu=a)
                    p2p[cap] = P2P_STATUS.get(st, str(st)) if st is not None else None
                snap["pairs"].append(
                    {
                        "a": a,
                        "b": b,
                        "topology": TOPOLOGY_LEVEL.get(level, level) if level is not None else None,
                        "p2p": p2p,
                    }
                )
        snap["errors"] = call.errors
    finally:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlShutdown()
    return snap


def summary(snap: dict[str, Any]) -> list[str]:
    """A few lines for the terminal."""
    if not snap["nvml"]["available"]:
        return [f"No NVIDIA GPU driver here: NVML is not available ({snap['nvml']['error']})."]
    lines = [f"{len(snap['gpus'])} GPU(s), driver {snap['nvml'].get('driver_version')}:"]
    for g in snap["gpus"]:
        active = sum(1 for link in g["nvlinks"] if link["state"] == "active")
        pcie = g["pcie"]
        lines.append(
            f"  GPU {g['index']} {g['name']} {g['pci_bus_id']} NUMA {g['numa_node']} PCIe gen {pcie['gen']} "
            f"x{pcie['width']}, NVLink {active}/{len(g['nvlinks'])} active"
        )
    for p in snap["pairs"]:
        lines.append(
            f"  {p['a']}<->{p['b']}: {p['topology']}, P2P " + ", ".join(f"{k} {v}" for k, v in p["p2p"].items())
        )
    if snap["errors"]:
        lines.append(f"  {len(snap['errors'])} NVML queries not supported here (listed in the file)")
    return lines
