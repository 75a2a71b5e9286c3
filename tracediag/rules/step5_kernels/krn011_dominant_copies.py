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

from tracediag.analyses.basis import window_time
from tracediag.analyses.copies import SteadyCopies, steady_copies
from tracediag.analyses.kernels import ms
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

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
FORMULA = (
    "copy share = ∪ copies / GPU busy time (steady segment); window share = ∪ copies / steady span; bandwidth = "
    "bytes / time per direction and host memory, vs the host link (HtoD, DtoH) or 2·bytes / time vs the device "
    "memory bandwidth (DtoD)"
)


def check(ctx: Context) -> Check:
    m = steady_copies(ctx)
    if m is None:
        return not_applicable(RULE, "missing steady GPU work: no kernel or copy after the start-up segment")
    common = {
        "formula": FORMULA,
        "substituted": _substituted(m),
        "values": _values(m),
        "table": m.groups,
        "evidence": _evidence(ctx, m),
    }
    if m.share_of_busy < INFO_SHARE or m.copy_ns < MIN_COPY_NS:
        return _too_little(m, common)
    return _dominant(ctx, m, common)


def _values(m: SteadyCopies) -> dict:
    return {
        "copy_ns": m.copy_ns,
        "gpu_busy_ns": m.busy_ns,
        "steady_span_ns": m.span_ns,
        "copy_share_of_gpu_busy": round(m.share_of_busy, 4),
        "copy_share_of_window": round(m.share_of_window, 4),
        "copies": len(m.copies),
        "bytes": sum(c["bytes"] or 0 for c in m.copies),
        "pageable_copy_ns": sum(g["time_ns"] for g in m.pageable),
        "host_link": m.host_link,
        "device_memory": m.device_memory,
        "startup_copies": len(m.startup),
        "startup_copy_ns": m.startup_ns,
        "startup_copies_note": "copies in the start-up segment (the first upload): start-up work, not judged here",
        "thresholds": {"info": INFO_SHARE, "warning": WARNING_SHARE},
    }


def _group_name(g: dict) -> str:
    """'HtoD pageable', or the direction alone when the host memory is not said."""
    return f"{g['direction']}{' ' + g['host_memory'] if g['host_memory'] != '—' else ''}"


def _substituted(m: SteadyCopies) -> str:
    parts = "; ".join(
        f"{_group_name(g)} {g['copies']}× {g['bytes'] / 1e6:,.1f} MB in {ms(g['time_ns'])} = {g['gbs'] or 0:.3g} GB/s"
        + (f" ({g['share_of_link']:.0%} of {g['link_gbs']:g} GB/s)" if g.get("share_of_link") is not None else "")
        for g in m.groups[:3]
    )
    return (
        f"{ms(m.copy_ns)} / {ms(m.busy_ns)} = {m.share_of_busy:.3f} of GPU busy time, / {ms(m.span_ns)} = "
        f"{m.share_of_window:.3f} of the window" + (f"; {parts}" if parts else "")
    )


def _evidence(ctx: Context, m: SteadyCopies) -> list[dict]:
    """The longest copies, with their achieved bandwidth and the CPU op that issued them."""
    return [
        {
            "rank": c["rank"],
            "ts_ns": c["ts_ns"],
            "name": c["name"],
            "bytes": c["bytes"],
            "dur_ns": c["dur_ns"],
            "gbs": round((c["bytes"] or 0) / c["dur_ns"], 3),
            "op": c["op_name"],
        }
        for c in sorted(m.copies, key=lambda c: -c["dur_ns"])[: ctx.settings.max_evidence]
    ]


def _too_little(m: SteadyCopies, common: dict) -> Check:
    share, copy_ns = m.share_of_busy, m.copy_ns
    return passed(
        RULE,
        **common,
        confidence="high",
        title=(
            (
                f"Copies total {ms(copy_ns)} over the steady segment: too little to matter, whatever their share "
                f"({share:.1%} of the GPU busy time, {len(m.copies)} copies)"
                if copy_ns < MIN_COPY_NS and share >= INFO_SHARE
                else f"Copies take {share:.1%} of the steady GPU busy time ({ms(copy_ns)}, {len(m.copies)} copies)"
            )
            + (f"; {ms(m.startup_ns)} of start-up copies not counted" if m.startup_ns else "")
        ),
    )


def _dominant(ctx: Context, m: SteadyCopies, common: dict) -> Check:
    lead, pageable = m.groups[0], m.pageable
    return finding(
        RULE,
        **common,
        severity="warning" if m.share_of_busy >= WARNING_SHARE else "info",
        confidence="high",
        # ranked on the window's time like every trace-side finding (a share of busy time would outrank a
        # larger share of step time on a mostly idle GPU); the share of busy time sets the severity
        impact=min(1.0, m.share_of_window),
        impact_basis=window_time(ctx).basis,
        cost_ns=int(m.copy_ns),
        title=(
            f"Copies take {m.share_of_busy:.0%} of the GPU busy time ({ms(m.copy_ns)}, {m.share_of_window:.0%} of "
            f"the window): mostly {_group_name(lead)}, {lead['bytes'] / 1e6:,.0f} MB at {lead['gbs'] or 0:.3g} GB/s"
            + (f" = {lead['share_of_link']:.0%} of the link" if lead.get("share_of_link") is not None else "")
            + (f"; {len(pageable)} pageable group{'s' if len(pageable) > 1 else ''}" if pageable else "")
        ),
        next_check=_advice(m.groups, pageable),
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
