"""Link rates: what a PCIe or NVLink link carries per direction, by generation (the topology snapshot's links, and the
host link KRN011 measures copies against). Pure data and arithmetic; no I/O.

PCIe per lane and direction after line encoding (PCI-SIG base specifications): 1.0 2.5 GT/s 8b/10b = 0.25 GB/s, 2.0
5 GT/s = 0.5, 3.0 8 GT/s 128b/130b = 0.985, 4.0 16 GT/s = 1.969, 5.0 32 GT/s = 3.938, 6.0 64 GT/s PAM4 with FLIT
mode: 8.0 raw (FLIT framing leaves about 7.6). NVLink per link and direction (NVIDIA's NVLink pages: NVLink 1.0 20
GB/s; 2.0-4.0 25 GB/s; 5.0 50 GB/s).
"""

from __future__ import annotations

NVLINK_GBS_PER_LINK = {"1.0": 20.0, "2.0": 25.0, "2.2": 25.0, "3.0": 25.0, "3.1": 25.0, "4.0": 25.0, "5.0": 50.0}
PCIE_GBS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 8.0}


def pcie_gbs(gen: int | None, width: int | None) -> float | None:
    """GB/s per direction of a PCIe link of generation `gen` and `width` lanes (None: either unknown)."""
    if not gen or not width or gen not in PCIE_GBS_PER_LANE:
        return None
    return round(PCIE_GBS_PER_LANE[gen] * width, 3)
