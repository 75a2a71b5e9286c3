"""NVTX_EVENTS read: domains, process names and "MPI Rank N" thread names, then every range and mark, their
text checked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tracediag.ingest import validate as val
from tracediag.ingest.nsys.export import _TS, _Export, _valid_tuples, pid_of
from tracediag.ingest.validate import BadRecords

# ENUM_NSYS_EVENT_TYPE ids (same in the 2023.2 and 2026.x exports)
NVTX_RANGE_TYPES = (59, 60, 70, 71)  # NvtxPushPopRange, NvtxStartEndRange, NvtxtPushPopRange, NvtxtStartEndRange
NVTX_MARK_TYPES = (34, 65)  # NvtxMark, NvtxtMark
_PUSH_POP = frozenset({59, 70})
_THREAD_NAME = 39  # NvtxThread: nsys's MPI trace names each rank's thread "MPI Rank N"
_DOMAIN_CREATE = 75
_MPI_THREAD = re.compile(r"^MPI Rank (\d+)$")


@dataclass
class _Nvtx:
    events: list[tuple] = field(default_factory=list)  # ranges and marks, by start
    domains: dict[tuple[int | None, int], str] = field(default_factory=dict)  # (pid, domainId) -> name
    mpi_ranks: dict[int | None, int] = field(default_factory=dict)  # pid -> rank from "MPI Rank N" thread names
    process_names: dict[int | None, str] = field(default_factory=dict)
    has_binary: bool = False
    max_end: int = 0
    nccl_names: set[str] = field(default_factory=set)
    bad: BadRecords | None = None


def _read_nvtx(ex: _Export) -> _Nvtx:
    out = _Nvtx(bad=ex.bad)
    if "PROCESSES" in ex.tables and {"pid", "name"} <= ex.cols("PROCESSES"):
        rows = _valid_tuples(ex, "PROCESSES", ex.rows("SELECT pid, name FROM PROCESSES"), {0: ("pid", None, None)})
        names = ex.text_values("PROCESSES", "name", [r[1] for r in rows])
        out.process_names = {r[0]: name for r, name in zip(rows, names)}
    t = "NVTX_EVENTS"
    if t not in ex.tables:
        return out
    c = ex.cols(t)
    out.has_binary = "binaryData" in c
    text = "coalesce(e.text, s.value)" if "textId" in c else "e.text"
    join = " LEFT JOIN StringIds s ON s.id = e.textId" if "textId" in c else ""
    sel = (
        f"e.start, e.end, e.eventType, e.globalTid, {ex.col(t, 'e', 'endGlobalTid')}, {ex.col(t, 'e', 'domainId')}, "
        f"{text}, {ex.col(t, 'e', 'category')}, {ex.col(t, 'e', 'color')}, {ex.col(t, 'e', 'binaryData')}"
    )
    # columns of a row: start, end, eventType, globalTid, endGlobalTid, domainId, text, category, color, binaryData
    spec = {0: ("start", *_TS), 3: ("globalTid", None, None)}
    nullable = {1: ("end", *_TS), 4: ("endGlobalTid", None, None), 5: ("domainId", None, None)}
    rows = _nvtx_rows(ex, f"SELECT {sel} FROM {t} e{join} WHERE e.eventType IN (?, ?)", (_DOMAIN_CREATE, _THREAD_NAME))
    for _start, _end, etype, gtid, _, dom, name, *_ in _valid_tuples(ex, t, rows, spec, nullable):
        if etype == _DOMAIN_CREATE and dom is not None and name:
            out.domains[(pid_of(gtid), dom)] = name
        elif etype == _THREAD_NAME and name and (m := _MPI_THREAD.match(name)) and int(m.group(1)) <= val.RANK_MAX:
            out.mpi_ranks[pid_of(gtid)] = int(m.group(1))
    wanted = NVTX_RANGE_TYPES + NVTX_MARK_TYPES
    out.events = _valid_tuples(
        ex,
        t,
        _nvtx_rows(
            ex,
            f"SELECT {sel} FROM {t} e{join} WHERE e.eventType IN ({', '.join('?' * len(wanted))}) ORDER BY e.start",
            wanted,
        ),
        spec,
        nullable,
    )
    out.max_end = max((e[1] for e in out.events if e[1] is not None), default=0)
    out.nccl_names = {e[6] for e in out.events if e[5] and e[6] and e[6].startswith("nccl")}
    return out


def _nvtx_rows(ex: _Export, sql: str, params: tuple) -> list[tuple]:
    """NVTX_EVENTS rows with their text checked (non-text NULL, undecodable bytes replaced, both counted)."""
    rows = ex.rows(sql, params)
    if not rows:
        return rows
    texts = ex.text_values("NVTX_EVENTS", "text", [r[6] for r in rows])
    return [(*r[:6], tx, *r[7:]) for r, tx in zip(rows, texts)]
