"""`tracediag env`: the NVML snapshot command, on this machine (no GPU driver) and on fake NVML modules.

No GPU is available where these tests run, so the multi-GPU snapshots in tests/data/topology/ are made by
a SYNTHETIC BUILDER: the real snapshot code (tracediag.live.topology.take_snapshot) run against
`FakeNVML`, a stand-in for the pynvml module that answers the same calls with the values a machine
description gives (and raises pynvml.NVMLError the way NVML does for unsupported queries). The machine
descriptions below say what each one imitates. `test_committed_snapshots_are_reproducible` regenerates
them and compares; rewrite them with `python tests/test_env_command.py --write`.

The no-driver snapshot (`nodriver.topo.json`) is real output of `tracediag env` on a machine without
an NVIDIA driver (pynvml.nvmlInit raises NVMLError_LibraryNotFound).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import pynvml
from typer.testing import CliRunner

from tracediag.cli import env as env_cmd
from tracediag.live import topology

TOPO_DATA = Path(__file__).parent / "data" / "topology"


# --- the fake NVML -------------------------------------------------------------------------------------------


@dataclass
class FakeGPU:
    name: str
    bus_id: str
    mem_total: int
    numa: int | None
    cpus: tuple[int, int]  # local CPU range, inclusive
    pcie: tuple[int, int, int, int]  # gen, gen_max, width, width_max
    clocks: tuple[int, int, int, int]  # sm, sm_max, mem, mem_max (MHz)
    # per link: (state, nvml version enum, remote bus id, remote type enum); empty = no NVLink
    nvlinks: list[tuple[int, int, str, int]] = field(default_factory=list)


@dataclass
class FakeMachine:
    """What a machine answers: GPUs, per-pair PCIe common ancestor and P2P status (NVML enum values)."""

    driver: str
    gpus: list[FakeGPU]
    topology: dict[tuple[int, int], int]  # (a, b) -> nvmlGpuTopologyLevel_t
    p2p: dict[tuple[int, int], tuple[int, int, int, int]]  # (a, b) -> status for read, write, nvlink, atomics
    unsupported: frozenset[str] = frozenset()  # calls that raise NOT_SUPPORTED on this machine


class FakeNVML:
    """Answers the pynvml calls take_snapshot makes; errors are real pynvml.NVMLError instances."""

    NVMLError = pynvml.NVMLError
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS

    def __init__(self, machine: FakeMachine) -> None:
        self.m = machine

    def _gpu(self, h) -> FakeGPU:
        return self.m.gpus[h]

    def _check(self, name: str) -> None:
        if name in self.m.unsupported:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def nvmlInit(self):
        return None

    def nvmlShutdown(self):
        return None

    def nvmlSystemGetDriverVersion(self):
        return self.m.driver

    def nvmlSystemGetNVMLVersion(self):
        return "12." + self.m.driver

    def nvmlSystemGetCudaDriverVersion(self):
        return 12040

    def nvmlDeviceGetCount(self):
        return len(self.m.gpus)

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetName(self, h):
        return self._gpu(h).name

    def nvmlDeviceGetUUID(self, h):
        return f"GPU-00000000-0000-0000-0000-00000000000{h}"

    def nvmlDeviceGetPciInfo(self, h):
        return SimpleNamespace(busId=self._gpu(h).bus_id.encode())

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(total=self._gpu(h).mem_total, used=612 * 1024**2, free=self._gpu(h).mem_total)

    def nvmlDeviceGetClockInfo(self, h, kind):
        sm, _, mem, _ = self._gpu(h).clocks
        return sm if kind == 1 else mem

    def nvmlDeviceGetMaxClockInfo(self, h, kind):
        _, sm_max, _, mem_max = self._gpu(h).clocks
        return sm_max if kind == 1 else mem_max

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return self._gpu(h).pcie[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._gpu(h).pcie[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self._gpu(h).pcie[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._gpu(h).pcie[3]

    def nvmlDeviceGetNumaNodeId(self, h):
        self._check("nvmlDeviceGetNumaNodeId")
        return self._gpu(h).numa

    def nvmlDeviceGetCpuAffinity(self, h, words):
        lo, hi = self._gpu(h).cpus
        masks = [0] * max(words, hi // 64 + 1)
        for c in range(lo, hi + 1):
            masks[c // 64] |= 1 << (c % 64)
        return masks

    def _link(self, h, link):
        links = self._gpu(h).nvlinks
        if not links:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= len(links):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return links[link]

    def nvmlDeviceGetNvLinkState(self, h, link):
        return self._link(h, link)[0]

    def nvmlDeviceGetNvLinkVersion(self, h, link):
        return self._link(h, link)[1]

    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link):
        return SimpleNamespace(busId=self._link(h, link)[2].encode())

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, h, link):
        return self._link(h, link)[3]

    def nvmlDeviceGetTopologyCommonAncestor(self, a, b):
        return self.m.topology[(min(a, b), max(a, b))]

    def nvmlDeviceGetP2PStatus(self, a, b, idx):
        return self.m.p2p[(min(a, b), max(a, b))][idx]


# --- the machines ---------------------------------------------------------------------------------------------

H100_MEM = 85520809984  # NVIDIA H100 80GB HBM3: 79.6 GiB as NVML reports it
SWITCH = 2  # NVML_NVLINK_DEVICE_TYPE_SWITCH
NVLINK_4_0 = 6  # NVML_NVLINK_VERSION_4_0
OK = 0


def _h100(bus: str, numa: int, cpus: tuple[int, int], active_links: int = 18) -> FakeGPU:
    # 18 NVLink 4.0 links to the 4 NVSwitches of an HGX H100 baseboard; links past `active_links` are down
    switches = ("00000000:05:00.0", "00000000:06:00.0", "00000000:07:00.0", "00000000:08:00.0")
    links = [(1 if i < active_links else 0, NVLINK_4_0, switches[i % 4], SWITCH) for i in range(18)]
    return FakeGPU(
        name="NVIDIA H100 80GB HBM3",
        bus_id=bus,
        mem_total=H100_MEM,
        numa=numa,
        cpus=cpus,
        pcie=(5, 5, 16, 16),
        clocks=(1980, 1980, 2619, 2619),
        nvlinks=links,
    )


MACHINES: dict[str, tuple[str, FakeMachine]] = {
    # Two GPUs of an HGX H100 8-GPU node, as in the nccl-tests table tests/data/external/nccl-tests/ (same bus ids)
    "h100x2_nvswitch": (
        "2x H100 SXM (HGX baseboard): 18 active NVLink 4.0 links each to the NVSwitches, P2P OK, PCIe gen5 x16, "
        "both GPUs on NUMA node 0",
        FakeMachine(
            driver="550.54.15",
            gpus=[_h100("00000000:19:00.0", 0, (0, 55)), _h100("00000000:3B:00.0", 0, (0, 55))],
            topology={(0, 1): 40},  # NODE: different PCIe host bridges, same NUMA node
            p2p={(0, 1): (OK, OK, OK, OK)},
        ),
    ),
    # Same node with a degraded NVLink: 6 of GPU 1's 18 links down
    "h100x2_nvlink_degraded": (
        "as h100x2_nvswitch, but GPU 1 has only 12 of its 18 NVLink links active",
        FakeMachine(
            driver="550.54.15",
            gpus=[_h100("00000000:19:00.0", 0, (0, 55)), _h100("00000000:3B:00.0", 0, (0, 55), active_links=12)],
            topology={(0, 1): 40},
            p2p={(0, 1): (OK, OK, OK, OK)},
        ),
    ),
    # A PCIe-only server: 4 cards without NVLink, two per CPU socket; P2P only within a socket
    "l40sx4_pcie": (
        "4x L40S PCIe cards without NVLink, PCIe gen4 x16, GPUs 0-1 on NUMA node 0 and 2-3 on node 1; P2P over "
        "PCIe within a socket, not across (chipset not supported)",
        FakeMachine(
            driver="550.54.15",
            gpus=[
                FakeGPU(
                    "NVIDIA L40S",
                    f"00000000:{b}:00.0",
                    48305799168,
                    numa,
                    cpus,
                    (4, 4, 16, 16),
                    (2520, 2520, 9001, 9001),
                )
                for b, numa, cpus in (("17", 0, (0, 31)), ("31", 0, (0, 31)), ("B1", 1, (32, 63)), ("CA", 1, (32, 63)))
            ],
            topology={(0, 1): 30, (2, 3): 30, (0, 2): 50, (0, 3): 50, (1, 2): 50, (1, 3): 50},
            p2p={
                (0, 1): (OK, OK, 5, 5),
                (2, 3): (OK, OK, 5, 5),
                **{pair: (1, 1, 5, 5) for pair in ((0, 2), (0, 3), (1, 2), (1, 3))},
            },
        ),
    ),
}


def build_snapshot(name: str) -> dict:
    """The committed synthetic snapshot `name`: take_snapshot on FakeNVML, with fixed host and time."""
    description, machine = MACHINES[name]
    snap = topology.take_snapshot(FakeNVML(machine))
    snap["host"] = "synthetic-" + name.replace("_", "-")
    snap["created_utc"] = "2026-11-29T00:00:00Z"
    snap["environment"] = {"CUDA_VISIBLE_DEVICES": None, "CUDA_DEVICE_ORDER": None}
    snap["tool"]["version"] = "0.1.0"
    snap["provenance"] = (
        "SYNTHETIC: tracediag.live.topology.take_snapshot run against tests/test_env_command.py FakeNVML "
        f"(no GPU where the tests were written); machine: {description}"
    )
    return snap


# --- tests ----------------------------------------------------------------------------------------------------


def _ensure_registered(app) -> None:
    """`env` is registered by the CLI once tracediag.cli.env is in COMMAND_MODULES; before that, here."""
    if "env" not in {c.name or c.callback.__name__ for c in app.registered_commands}:
        env_cmd.register(app)


def test_no_driver_here_writes_json_saying_so(tmp_path):
    from tracediag.cli import app

    _ensure_registered(app)
    out = tmp_path / "topo.json"
    result = CliRunner().invoke(app, ["env", "-o", str(out)])
    assert result.exit_code == 0, result.output
    snap = json.loads(out.read_text())
    assert snap["schema"] == "tracediag/topology-v1"
    assert snap["nvml"]["available"] is False and snap["gpus"] == []
    assert "NVML" in snap["nvml"]["error"] or "nvidia-ml-py" in snap["nvml"]["error"]
    assert "No NVIDIA GPU driver here" in result.output and str(out) in result.output


def test_unwritable_output_is_one_line_exit_2(tmp_path):
    from tracediag.cli import app

    _ensure_registered(app)
    result = CliRunner().invoke(app, ["env", "-o", str(tmp_path / "missing-dir" / "topo.json")])
    assert result.exit_code == 2
    assert "cannot write" in result.output


def test_snapshot_from_fake_nvml_records_links_pairs_and_unsupported_calls():
    _, machine = MACHINES["l40sx4_pcie"]
    machine = FakeMachine(**{**machine.__dict__, "unsupported": frozenset({"nvmlDeviceGetNumaNodeId"})})
    snap = topology.take_snapshot(FakeNVML(machine))
    assert snap["nvml"]["available"] is True and len(snap["gpus"]) == 4 and len(snap["pairs"]) == 6
    g0 = snap["gpus"][0]
    assert g0["nvlinks"] == [] and g0["pcie"] == {"gen": 4, "gen_max": 4, "width": 16, "width_max": 16}
    assert g0["numa_node"] is None and g0["cpu_affinity"] == "0-31"
    assert {e["call"] for e in snap["errors"]} == {"nvmlDeviceGetNumaNodeId"}
    cross = next(p for p in snap["pairs"] if (p["a"], p["b"]) == (0, 2))
    assert cross["topology"] == "SYS" and cross["p2p"]["read"] == "chipset_not_supported"
    h = topology.take_snapshot(FakeNVML(MACHINES["h100x2_nvswitch"][1]))
    links = h["gpus"][1]["nvlinks"]
    assert len(links) == 18 and all(k["state"] == "active" and k["version"] == "4.0" for k in links)
    assert links[0]["remote_type"] == "switch" and h["gpus"][1]["pci_bus_id"] == "00000000:3B:00.0"


def test_cpulist():
    assert topology._cpulist([0b1111, 0]) == "0-3"
    assert topology._cpulist([(1 << 64) - 1, 1]) == "0-64"
    assert topology._cpulist([0b1011]) == "0-1,3"
    assert topology._cpulist([0]) is None


def test_committed_snapshots_are_reproducible():
    for name in MACHINES:
        committed = json.loads((TOPO_DATA / f"{name}.topo.json").read_text())
        assert committed == json.loads(json.dumps(build_snapshot(name))), name
    nodriver = json.loads((TOPO_DATA / "nodriver.topo.json").read_text())
    assert nodriver["nvml"]["available"] is False and nodriver["gpus"] == []


if __name__ == "__main__" and "--write" in sys.argv:
    TOPO_DATA.mkdir(parents=True, exist_ok=True)
    for name in MACHINES:
        (TOPO_DATA / f"{name}.topo.json").write_text(json.dumps(build_snapshot(name), indent=2) + "\n")
        print("wrote", TOPO_DATA / f"{name}.topo.json")
