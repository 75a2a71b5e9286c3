"""NVTX ranges and marks into tables: nvtx_events (every one, payload decoded), cpu_ops (PyTorch `emit_nvtx`
ranges) and annotations (other ranges); runtime calls, kernels and memops linked to the innermost PyTorch range
open on the calling thread, as Kineto's 'External id' links them.
"""

from __future__ import annotations

import operator
from collections import Counter
from typing import Any

from tracediag.ingest.nsys.export import pid_of
from tracediag.ingest.nsys.nvtx import _PUSH_POP, NVTX_MARK_TYPES, _Nvtx
from tracediag.ingest.nsys.payloads import _payload_columns
from tracediag.ingest.nsys.ranks import _Unit
from tracediag.ingest.nsys_nvtx import innermost_open, parse_torch_range

_NVTX_COLUMNS = ("rank", "name", "kind", "domain_id", "domain", "ts_ns", "dur_ns", "gtid", "end_gtid", "category",
                 "color", "stored_as", "torch_seq", "torch_op_id", "nccl_comm_id", "message_bytes", "reduction_op",
                 "peer", "root", "nranks", "nccl_rank", "cuda_device", "payload_json")  # fmt: skip
_SYNTHETIC_OP_ID = 1 << 56  # external ids for PyTorch ranges recorded without op_id (older PyTorch)


def _nvtx_tables(
    nvtx: _Nvtx,
    payloads: dict[int, dict[str, Any]],
    units: dict[tuple[int | None, int | None], _Unit],
    prank: dict[int | None, int],
    out: dict[str, dict[str, list]],
    dropped: Counter,
) -> tuple[dict[str, list] | None, dict[int, Counter[str]], int]:
    """out["nvtx_events"], out["cpu_ops"] (PyTorch ranges) and out["annotations"] (other ranges); returns the
    cpu_ops columns (None without any), the NVTX counts per rank and how many ranges were still open."""
    ends = [max(map(operator.add, c["ts_ns"], c["dur_ns"]), default=0) for c in out.values()]
    trace_end = max([*ends, nvtx.max_end])
    ev_rows: list[tuple] = []  # rows of nvtx_events, in _NVTX_COLUMNS order
    op_rows: list[tuple] = []  # PyTorch ranges -> cpu_ops
    ann_rows: list[tuple] = []  # other ranges -> annotations
    nvtx_counts: dict[int, Counter[str]] = {u.rank: Counter() for u in units.values()}
    open_ranges = 0
    for i, (start, end, etype, gtid, end_gtid, dom, text, category, color, _) in enumerate(nvtx.events):
        pid = pid_of(gtid)
        rank = prank.get(pid)
        if rank is None:
            dropped[pid] += 1
            continue
        is_mark = etype in NVTX_MARK_TYPES
        if not is_mark and end is None:
            end = trace_end  # a range still open when the capture stopped: nsys's reports close it at the end
            open_ranges += 1
        text = text or ""
        torch = parse_torch_range(text) if not is_mark and not dom else None
        dur = None if is_mark else max(end - start, 0)
        kind = "mark" if is_mark else ("push_pop" if etype in _PUSH_POP else "start_end")
        stored = None if is_mark else ("cpu_ops" if torch else "annotations")
        domain = nvtx.domains.get((pid, dom)) if dom else None
        other_end = end_gtid if end_gtid is not None and end_gtid != gtid else None
        row = (rank, text, kind, dom, domain, start, dur, gtid, other_end, category, color, stored)
        row += (torch.seq, torch.op_id) if torch else (None, None)
        ev_rows.append(row + _payload_columns(payloads.get(i)))
        nvtx_counts[rank]["marks" if is_mark else "ranges"] += 1
        if is_mark:
            continue
        if torch:
            nvtx_counts[rank]["torch_ops"] += 1
            ext = torch.op_id if torch.op_id is not None else _SYNTHETIC_OP_ID + i
            op_rows.append((rank, torch.name, start, dur, gtid, ext, torch.input_dims))
        else:
            ann_rows.append((rank, text, start, dur, gtid))
    if ev_rows:
        out["nvtx_events"] = dict(zip(_NVTX_COLUMNS, map(list, zip(*ev_rows)), strict=True))
    ops = dict(zip(("rank", "name", "ts_ns", "dur_ns", "gtid", "external_id", "input_dims"), map(list, zip(*op_rows))))
    if op_rows:
        out["cpu_ops"] = ops
    if ann_rows:
        out["annotations"] = dict(zip(("rank", "name", "ts_ns", "dur_ns", "gtid"), map(list, zip(*ann_rows)))) | {
            "source": ["nvtx"] * len(ann_rows)
        }
    return (ops if op_rows else None), nvtx_counts, open_ranges


def _link_calls(out: dict[str, dict[str, list]], ops: dict[str, list] | None) -> None:
    """A runtime call gets the innermost PyTorch range open on its thread (`external_id`), and the kernels and
    memops it launched get the same."""
    run = out.get("runtime")
    if run is not None:
        run["external_id"] = [None] * len(run["rank"])
    if ops is None or run is None:
        return
    open_at = innermost_open(
        zip(ops["gtid"], ops["ts_ns"], map(operator.add, ops["ts_ns"], ops["dur_ns"]), ops["external_id"]),
        zip(run["gtid"], run["ts_ns"], range(len(run["rank"]))),
    )
    ext_of_corr: dict[tuple[int, int], int] = {}
    for j, ext in open_at.items():
        run["external_id"][j] = ext
        if run["correlation"][j] is not None:
            ext_of_corr[(run["rank"][j], run["correlation"][j])] = ext
    for table in ("kernels", "memops"):
        cols = out.get(table)
        if cols:
            cols["external_id"] = [ext_of_corr.get(rc) for rc in zip(cols["rank"], cols["correlation"])]
