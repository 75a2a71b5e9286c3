"""The memory copies of the steady segment (KRN011 judges them): per rank, the copies after the start-up segment
(derive/fitness.py; the start-up copies, the first upload of the weights, are counted apart), their union, the
GPU busy time and the steady span; per direction and host memory, copies, bytes, time and achieved bandwidth,
against the host link (HtoD, DtoH) or the device memory bandwidth (DtoD)."""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from tracediag.analyses.kernels import _bw_from_props
from tracediag.context import Context
from tracediag.derive import intervals as iv
from tracediag.model.links import pcie_gbs

_COPY = re.compile(r"Memcpy\s+(HtoD|DtoH|DtoD|HtoH|PtoP|DtoA|AtoD)\b(?:\s*\((\w+)\s*->\s*(\w+)\))?", re.I)
# usual host link of a GPU generation, per direction, GB/s (PCIe after line encoding: 3.0 x16 15.8, 4.0 x16 31.5,
# 5.0 x16 63.0) — an assumption when no topology snapshot says which link the GPU has
_LINK_BY_NAME = (
    (re.compile(r"GH200|GB200|GB300|Grace", re.I), None),  # NVLink-C2C to the Grace CPU: not a PCIe link
    (re.compile(r"H100|H200|H800|H20\b|B200|B300|B100|RTX PRO 6000|MI3\d\d", re.I), (5, 16)),
    (re.compile(r"A100|A800|A30|A40|A10\b|A6000|L40|L4\b|RTX 30\d\d|RTX 40\d\d|RTX A\d|MI2\d\d", re.I), (4, 16)),
    (re.compile(r"V100|T4\b|RTX 20\d\d|Quadro RTX|TITAN V|P100|GP100|MI100|MI50", re.I), (3, 16)),
)


@dataclass
class SteadyCopies:
    """The copies of the steady segment over every rank. `copies`: the memops rows (with the CPU op that issued
    each, op_name) and their direction and host memory; `groups`: per direction and host memory, largest time
    first; `copy_ns`: the union of the copies; `busy_ns`, `span_ns`: the steady GPU busy time and span; `startup`:
    the copies of the start-up segment; `host_link`, `device_memory`: what each group's bandwidth is measured
    against, in words."""

    copies: list[dict[str, Any]]
    groups: list[dict[str, Any]]
    copy_ns: int
    busy_ns: int
    span_ns: int
    startup: list[dict[str, Any]]
    host_link: str
    device_memory: str

    @property
    def share_of_busy(self) -> float:
        return self.copy_ns / self.busy_ns

    @property
    def share_of_window(self) -> float:
        return self.copy_ns / self.span_ns if self.span_ns else 0.0

    @property
    def pageable(self) -> list[dict[str, Any]]:
        """The groups copied from or to pageable host memory (staged through a pinned bounce buffer)."""
        return [g for g in self.groups if g["host_memory"] == "pageable"]

    @property
    def startup_ns(self) -> int:
        return sum(r["dur_ns"] for r in self.startup)


def steady_copies(ctx: Context) -> SteadyCopies | None:
    """The steady segment's copies, or None when the steady segment has no GPU busy time to share them of."""
    copies, totals, startup = _per_rank(ctx)
    busy = totals.get("busy_ns", 0)
    if not busy:
        return None
    link, link_how = host_link(ctx)
    dram, dram_how = device_memory_bandwidth(ctx)
    return SteadyCopies(
        copies=copies,
        groups=_groups(copies, link, dram),
        copy_ns=totals.get("copy_union_ns", 0),
        busy_ns=busy,
        span_ns=totals.get("span_ns", 0),
        startup=startup,
        host_link=link_how,
        device_memory=dram_how,
    )


def copy_kind(name: str) -> tuple[str, str]:
    """('HtoD', 'pageable') from 'Memcpy HtoD (Pageable -> Device)'; host memory '' when not said."""
    m = _COPY.search(name or "")
    if not m:
        return "other", ""
    direction = m.group(1)[0].upper() + "to" + m.group(1)[-1].upper()
    src, dst = (m.group(2) or "").lower(), (m.group(3) or "").lower()
    host = src if direction == "HtoD" else dst if direction == "DtoH" else ""
    return direction, host if host in ("pageable", "pinned") else ("host" if host else "")


def host_link(ctx: Context) -> tuple[float | None, str]:
    """GB/s per direction of the GPU's host link: the topology snapshot, else the generation's usual PCIe link."""
    topo = ctx.rows("SELECT name, pcie_gen, pcie_width FROM topo_gpus WHERE pcie_gen IS NOT NULL LIMIT 1")
    if topo and pcie_gbs(topo[0]["pcie_gen"], topo[0]["pcie_width"]):
        t = topo[0]
        gbs = pcie_gbs(t["pcie_gen"], t["pcie_width"])
        return gbs, f"PCIe gen{t['pcie_gen']} x{t['pcie_width']} = {gbs:g} GB/s per direction (topology snapshot)"
    dev = ctx.scalar("SELECT any_value(device_name) FROM inputs WHERE rank IS NOT NULL AND device_name IS NOT NULL")
    for rx, link in _LINK_BY_NAME:
        if dev and rx.search(dev):
            if link is None:
                return None, f"{dev}: the host link is NVLink-C2C, not PCIe; pass --topology for its rate"
            gbs = pcie_gbs(*link)
            return gbs, (
                f"assumed PCIe gen{link[0]} x{link[1]} = {gbs:g} GB/s per direction, the usual host link of a {dev} "
                "(pass --topology from `tracediag env` for the measured link)"
            )
    return None, "unknown host link: no topology snapshot and no device name it can be told from (pass --topology)"


def device_memory_bandwidth(ctx: Context) -> tuple[float | None, str]:
    """GB/s of the device memory: --hbm-bandwidth, else the device properties' figure; else (None, why)."""
    if ctx.settings.hbm_bandwidth_gbs:
        return ctx.settings.hbm_bandwidth_gbs, f"--hbm-bandwidth {ctx.settings.hbm_bandwidth_gbs:g} GB/s"
    for row in ctx.rows("SELECT device_name, device_properties_json FROM inputs WHERE rank IS NOT NULL"):
        bw = _bw_from_props(row["device_properties_json"])
        if bw:
            return bw / 1e9, f"device memory bandwidth {bw / 1e9:,.0f} GB/s ({row['device_name'] or 'GPU'} properties)"
    return None, "device memory bandwidth unknown (pass --hbm-bandwidth)"


def _per_rank(ctx: Context) -> tuple[list[dict], dict[str, int], list[dict]]:
    """Per rank: copies in the steady segment, its busy and span, the start-up copies (by direction)."""
    copies, totals, startup = [], defaultdict(int), []
    for t in ctx.rows("SELECT * FROM gpu_timeline ORDER BY rank"):
        rank, s0, s1 = t["rank"], t["startup_end_ns"], t["stop_ts_ns"]
        rows = ctx.rows(
            """SELECT m.rank, m.name, m.ts_ns, m.dur_ns, m.bytes, m.external_id, o.name AS op_name
               FROM memops m LEFT JOIN (SELECT rank, external_id, any_value(name) AS name FROM cpu_ops
                                        WHERE external_id > 0 GROUP BY ALL) o USING (rank, external_id)
               WHERE m.rank = ? AND m.kind = 'memcpy' AND m.dur_ns > 0 ORDER BY m.ts_ns""",
            [rank],
        )
        steady = [r for r in rows if s0 <= r["ts_ns"] < s1]
        startup += [r for r in rows if r["ts_ns"] < s0]
        # copies on several streams overlap: their union, not their sum, is the time the copies took
        us, ue = iv.merge_intervals(
            np.array([r["ts_ns"] for r in steady], dtype=np.int64),
            np.array([r["ts_ns"] + r["dur_ns"] for r in steady], dtype=np.int64),
        )
        totals["copy_union_ns"] += iv.total(us, ue)
        totals["busy_ns"] += t["steady_busy_ns"] or 0
        totals["span_ns"] += t["steady_span_ns"] or 0
        copies += steady
    return copies, dict(totals), startup


def _groups(copies: list[dict], link: float | None, dram: float | None) -> list[dict]:
    """Per direction and host memory: copies, bytes, time, GB/s and its share of the link it crosses; largest time
    first. Sets each copy's direction and host_memory."""
    groups: dict[tuple[str, str], dict] = {}
    for c in copies:
        c["direction"], c["host_memory"] = copy_kind(c["name"])
        g = groups.setdefault(
            (c["direction"], c["host_memory"]),
            {"direction": c["direction"], "host_memory": c["host_memory"] or "—", "copies": 0, "bytes": 0},
        )
        g.setdefault("time_ns", 0)
        g["copies"] += 1
        g["bytes"] += c["bytes"] or 0
        g["time_ns"] += c["dur_ns"]
    table = sorted(groups.values(), key=lambda g: -g["time_ns"])
    for g in table:
        g["gbs"] = round(g["bytes"] / g["time_ns"], 3) if g["time_ns"] else None
        if g["direction"] in ("HtoD", "DtoH") and link and g["gbs"] is not None:
            g["link_gbs"], g["share_of_link"] = link, round(g["gbs"] / link, 3)
        elif g["direction"] == "DtoD" and dram and g["gbs"] is not None:  # read and write: twice the bytes
            g["link_gbs"], g["share_of_link"] = dram, round(2 * g["gbs"] / dram, 3)
    return table
