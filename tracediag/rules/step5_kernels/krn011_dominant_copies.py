"""KRN011 Copies that dominate the window.

Hypothesis: memory copies — host to device, device to host, device to device — take most of the GPU's busy
time: the inputs or the weights uploaded again every step, results copied back synchronously each iteration,
pageable host memory (staged through a pinned bounce buffer, at a fraction of the link, blocking the host),
device-to-device copies of whole tensors (.contiguous(), .clone(), cat). Then no kernel change helps: the time
is in moving bytes, and often in moving them more than once.

Formula: over each rank's steady segment (derive/fitness.py; copies of the start-up segment — the first upload
of the weights — are start-up work, KRN010's, and are shown apart), per direction (HtoD, DtoH, DtoD, PtoP) and
host memory (pageable, pinned): copies, bytes, time, achieved bandwidth = bytes / time, and the link it is
measured against: the PCIe link of the topology snapshot (generation × lanes, per direction) when one is given,
else the usual host link of that GPU generation (an assumption, labelled so); DtoD against the device memory
bandwidth (each byte read and written: 2·bytes / time). copy share = union of the copies / GPU busy time
(union of kernels and copies); window share = union of the copies / steady span. Finding from 25 % of GPU busy
time (info), warning from 50 % (the copies dominate), and only from 1 ms of copies; the finding's impact (what
the verdict ranks) is the window share, the share of step time every trace-side finding is ranked on.

Evidence: the largest copies (rank, time, direction, bytes, duration, GB/s) and the CPU op that issued them.

What to do: pageable copies → pin the host buffers (tensor.pin_memory(), DataLoader(pin_memory=True)) and copy
with non_blocking=True (on a side stream, so copies overlap compute); the same bytes uploaded every step → keep
them on the GPU (move weights and constant inputs once, outside the loop); device-to-host every iteration →
copy only what is needed (no .cpu()/.item()/.tolist() of whole tensors in the loop), asynchronously; large
device-to-device copies → avoid the copy (views instead of .contiguous()/.clone(), preallocated outputs).
"""

from __future__ import annotations

import re
from collections import defaultdict

import numpy as np

from tracediag.analyses.basis import window_time
from tracediag.analyses.kernels import _bw_from_props, ms
from tracediag.context import Context
from tracediag.derive import intervals as iv
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.model.links import pcie_gbs

RULE = RuleMeta(
    id="KRN011",
    step=5,
    title="Copies that dominate the window: host/device memory copies as a share of GPU time, with their bandwidth",
    requires_tables=("memops",),
    requires_window="complete",
    share_of_steady="busy",
)
INFO_SHARE, WARNING_SHARE = 0.25, 0.50  # copy share of the steady GPU busy time
# copies totalling less than this over the steady segment are no finding at any share (one 1.6 µs copy in a
# start-up-only window was "100 % of GPU busy time")
MIN_COPY_NS = 1_000_000
_COPY = re.compile(r"Memcpy\s+(HtoD|DtoH|DtoD|HtoH|PtoP|DtoA|AtoD)\b(?:\s*\((\w+)\s*->\s*(\w+)\))?", re.I)
# usual host link of a GPU generation, per direction, GB/s (PCIe after line encoding: 3.0 x16 15.8, 4.0 x16 31.5,
# 5.0 x16 63.0) — an assumption when no topology snapshot says which link the GPU has
_LINK_BY_NAME = (
    (re.compile(r"GH200|GB200|GB300|Grace", re.I), None),  # NVLink-C2C to the Grace CPU: not a PCIe link
    (re.compile(r"H100|H200|H800|H20\b|B200|B300|B100|RTX PRO 6000|MI3\d\d", re.I), (5, 16)),
    (re.compile(r"A100|A800|A30|A40|A10\b|A6000|L40|L4\b|RTX 30\d\d|RTX 40\d\d|RTX A\d|MI2\d\d", re.I), (4, 16)),
    (re.compile(r"V100|T4\b|RTX 20\d\d|Quadro RTX|TITAN V|P100|GP100|MI100|MI50", re.I), (3, 16)),
)


def _parse(name: str) -> tuple[str, str]:
    """('HtoD', 'pageable') from 'Memcpy HtoD (Pageable -> Device)'; host memory '' when not said."""
    m = _COPY.search(name or "")
    if not m:
        return "other", ""
    direction = m.group(1)[0].upper() + "to" + m.group(1)[-1].upper()
    src, dst = (m.group(2) or "").lower(), (m.group(3) or "").lower()
    host = src if direction == "HtoD" else dst if direction == "DtoH" else ""
    return direction, host if host in ("pageable", "pinned") else ("host" if host else "")


def _host_link(ctx: Context) -> tuple[float | None, str]:
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


def _device_bw(ctx: Context) -> tuple[float | None, str]:
    if ctx.settings.hbm_bandwidth_gbs:
        return ctx.settings.hbm_bandwidth_gbs, f"--hbm-bandwidth {ctx.settings.hbm_bandwidth_gbs:g} GB/s"
    for row in ctx.rows("SELECT device_name, device_properties_json FROM inputs WHERE rank IS NOT NULL"):
        bw = _bw_from_props(row["device_properties_json"])
        if bw:
            return bw / 1e9, f"device memory bandwidth {bw / 1e9:,.0f} GB/s ({row['device_name'] or 'GPU'} properties)"
    return None, "device memory bandwidth unknown (pass --hbm-bandwidth)"


def _measure(ctx: Context) -> tuple[list[dict], dict[str, int], list[dict]]:
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
        us, ue = iv.merge_intervals(
            np.array([r["ts_ns"] for r in steady], dtype=np.int64),
            np.array([r["ts_ns"] + r["dur_ns"] for r in steady], dtype=np.int64),
        )
        totals["copy_union_ns"] += iv.total(us, ue)
        totals["busy_ns"] += t["steady_busy_ns"] or 0
        totals["span_ns"] += t["steady_span_ns"] or 0
        copies += steady
    return copies, dict(totals), startup


def check(ctx: Context) -> Check:
    copies, totals, startup = _measure(ctx)
    busy, span, copy_ns = totals.get("busy_ns", 0), totals.get("span_ns", 0), totals.get("copy_union_ns", 0)
    if not busy:
        return not_applicable(RULE, "missing steady GPU work: no kernel or copy after the start-up segment")
    link, link_how = _host_link(ctx)
    dram, dram_how = _device_bw(ctx)
    groups: dict[tuple[str, str], dict] = {}
    for c in copies:
        c["direction"], c["host_memory"] = _parse(c["name"])
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
    share = copy_ns / busy
    window_share = copy_ns / span if span else 0.0
    pageable = [g for g in table if g["host_memory"] == "pageable"]
    startup_ns = sum(r["dur_ns"] for r in startup)
    values = {
        "copy_ns": copy_ns,
        "gpu_busy_ns": busy,
        "steady_span_ns": span,
        "copy_share_of_gpu_busy": round(share, 4),
        "copy_share_of_window": round(window_share, 4),
        "copies": len(copies),
        "bytes": sum(c["bytes"] or 0 for c in copies),
        "pageable_copy_ns": sum(g["time_ns"] for g in pageable),
        "host_link": link_how,
        "device_memory": dram_how,
        "startup_copies": len(startup),
        "startup_copy_ns": startup_ns,
        "startup_copies_note": "copies in the start-up segment (the first upload): start-up work, not judged here",
        "thresholds": {"info": INFO_SHARE, "warning": WARNING_SHARE},
    }
    formula = (
        "copy share = ∪ copies / GPU busy time (steady segment); window share = ∪ copies / steady span; bandwidth = "
        "bytes / time per direction and host memory, vs the host link (HtoD, DtoH) or 2·bytes / time vs the device "
        "memory bandwidth (DtoD)"
    )
    parts = "; ".join(
        f"{g['direction']}{' ' + g['host_memory'] if g['host_memory'] != '—' else ''} {g['copies']}× "
        f"{g['bytes'] / 1e6:,.1f} MB in {ms(g['time_ns'])} = {g['gbs'] or 0:.3g} GB/s"
        + (f" ({g['share_of_link']:.0%} of {g['link_gbs']:g} GB/s)" if g.get("share_of_link") is not None else "")
        for g in table[:3]
    )
    substituted = (
        f"{ms(copy_ns)} / {ms(busy)} = {share:.3f} of GPU busy time, / {ms(span)} = {window_share:.3f} of the window"
        + (f"; {parts}" if parts else "")
    )
    top = sorted(copies, key=lambda c: -c["dur_ns"])[: ctx.settings.max_evidence]
    evidence = [
        {
            "rank": c["rank"],
            "ts_ns": c["ts_ns"],
            "name": c["name"],
            "bytes": c["bytes"],
            "dur_ns": c["dur_ns"],
            "gbs": round((c["bytes"] or 0) / c["dur_ns"], 3),
            "op": c["op_name"],
        }
        for c in top
    ]
    common = {"formula": formula, "substituted": substituted, "values": values, "table": table, "evidence": evidence}
    if share < INFO_SHARE or copy_ns < MIN_COPY_NS:
        return passed(
            RULE,
            **common,
            confidence="high",
            title=(
                (
                    f"Copies total {ms(copy_ns)} over the steady segment: too little to matter, whatever their share "
                    f"({share:.1%} of the GPU busy time, {len(copies)} copies)"
                    if copy_ns < MIN_COPY_NS and share >= INFO_SHARE
                    else f"Copies take {share:.1%} of the steady GPU busy time ({ms(copy_ns)}, {len(copies)} copies)"
                )
                + (f"; {ms(startup_ns)} of start-up copies not counted" if startup_ns else "")
            ),
        )
    lead = table[0]
    what = f"{lead['direction']}{' ' + lead['host_memory'] if lead['host_memory'] != '—' else ''}"
    return finding(
        RULE,
        **common,
        severity="warning" if share >= WARNING_SHARE else "info",
        confidence="high",
        # ranked on the window's time like every trace-side finding (a share of busy time would outrank a
        # larger share of step time on a mostly idle GPU); the share of busy time sets the severity
        impact=min(1.0, window_share),
        impact_basis=window_time(ctx).basis,
        cost_ns=int(copy_ns),
        title=(
            f"Copies take {share:.0%} of the GPU busy time ({ms(copy_ns)}, {window_share:.0%} of the window): mostly "
            f"{what}, {lead['bytes'] / 1e6:,.0f} MB at {lead['gbs'] or 0:.3g} GB/s"
            + (f" = {lead['share_of_link']:.0%} of the link" if lead.get("share_of_link") is not None else "")
            + (f"; {len(pageable)} pageable group{'s' if len(pageable) > 1 else ''}" if pageable else "")
        ),
        next_check=_advice(table, pageable),
    )


def _advice(table: list[dict], pageable: list[dict]) -> str:
    out = []
    if pageable:
        out.append(
            "Pin the host buffers (tensor.pin_memory(), DataLoader(pin_memory=True)) and copy with non_blocking=True "
            "on a side stream: pageable copies are staged through a bounce buffer and block the host."
        )
    dirs = {g["direction"] for g in table[:2]}
    if "HtoD" in dirs:
        out.append("Keep data that does not change on the GPU: move weights and constant inputs once, not every step.")
    if "DtoH" in dirs:
        out.append("Copy back only what is needed (no .cpu()/.item()/.tolist() of whole tensors per step), async.")
    if "DtoD" in dirs:
        out.append("Avoid device copies of whole tensors (views, not .contiguous()/.clone(); preallocated outputs).")
    return " ".join(out) or "See which op issues the largest copies (evidence) and whether they are needed every step."
