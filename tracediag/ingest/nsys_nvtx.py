"""NVTX helpers for the Nsight Systems ingester: PyTorch range text, NCCL payloads, open-op sweep.

Pure functions over plain Python values, so they can be tested without an export.

Sources relied on (read, not copied):
- PyTorch `emit_nvtx` range text: torch/csrc/profiler/util.cpp `getNvtxStr` writes
  "{name}[, seq = {n}][, op_id = {id}][, sizes = {shapesToStr}][, input_op_ids = [...]]".
- NVTX payload entry types: NVIDIA/nccl src/include/nvtx3/nvToolsExtPayload.h (`NVTX_PAYLOAD_ENTRY_TYPE_*`;
  types >= 1 << 24 are static schema/enum ids).
- NCCL payload schemas (entry names, e.g. "Message size [bytes]", "Reduction operation"):
  NVIDIA/nccl src/include/nvtx_payload_schemas.h; reduction op values: nccl.h `ncclRedOp_t`.
- `NVTX_EVENTS.binaryData` layout in exports made with `nsys export --include-blobs=true`: a 32-byte header
  [domainId:u64][schemaId:u64][payloadSize:u64][payloadOffset:u64], then the payload; stored as BLOB or as
  hex text (GindaChen/nsys-ai src/nsys_ai/nccl_communicator.py @784bdc40, which decodes real exports).
"""

from __future__ import annotations

import re
import struct
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson

# --- PyTorch emit_nvtx / record_function range text ---------------------------------------------------------

_TORCH_RANGE = re.compile(
    r"^(?P<name>.+?)"
    r"(?:, seq = (?P<seq>-?\d+))?"
    r"(?:, op_id = (?P<op_id>\d+))?"
    r"(?:, sizes = (?P<sizes>\[.*?\]))?"
    r"(?:, input_op_ids = (?P<input_op_ids>\[.*\]))?$",
    re.DOTALL,
)


@dataclass(frozen=True)
class TorchRange:
    name: str  # op name without the suffixes ('aten::mm', 'c10d::allreduce_', 'ProfilerStep#3')
    seq: int | None  # autograd sequence number
    op_id: int | None  # RecordFunction handle, unique within the process
    input_dims: str | None  # `sizes` as JSON text, like Kineto's 'Input Dims'


def parse_torch_range(text: str) -> TorchRange | None:
    """The PyTorch fields of an NVTX range written by `torch.autograd.profiler.emit_nvtx`, else None.

    A range counts as PyTorch's only when it carries at least one of the suffixes getNvtxStr appends,
    so a user range named "a, b" is left alone.
    """
    if ", " not in text:
        return None
    m = _TORCH_RANGE.match(text)
    if m is None or not (m["seq"] or m["op_id"] or m["sizes"]):
        return None
    dims = m["sizes"]
    if dims is not None:
        try:
            orjson.loads(dims)
        except orjson.JSONDecodeError:  # e.g. a list cut short by the tracer: keep the op, drop the shapes
            dims = None
    return TorchRange(
        name=m["name"],
        seq=int(m["seq"]) if m["seq"] else None,
        op_id=int(m["op_id"]) if m["op_id"] else None,
        input_dims=dims,
    )


# --- NVTX extended payloads (NCCL) ---------------------------------------------------------------------------

# NVTX_PAYLOAD_ENTRY_TYPE_* -> struct format (x86-64 LP64 sizes: long = 8, size_t = 8, address = 8).
_ENTRY_FORMATS = {
    1: "b", 2: "B", 3: "h", 4: "H", 5: "i", 6: "I", 7: "q", 8: "Q", 9: "q", 10: "Q",
    11: "b", 12: "B", 13: "h", 14: "H", 15: "i", 16: "I", 17: "q", 18: "Q",
    19: "f", 20: "d", 22: "Q", 23: "Q",
}  # fmt: skip
_STATIC_SCHEMA_START = 1 << 24  # custom types (enums, nested schemas) have ids from here on
# nccl.h: typedef enum { ncclSum = 0, ncclProd = 1, ncclMax = 2, ncclMin = 3, ncclAvg = 4 } ncclRedOp_t;
NCCL_REDOPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}
_BLOB_HEADER = struct.Struct("<QQQQ")


@dataclass(frozen=True)
class SchemaEntry:
    idx: int
    name: str
    type: int
    offset: int | None


def blob_bytes(value: Any) -> bytes | None:
    """binaryData as bytes: SQLite BLOB, or hex text; None when it is neither."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, str):
        s = value.strip().removeprefix("0x").replace(" ", "")
        try:
            return bytes.fromhex(s)
        except ValueError:
            return None
    return None


def split_blob(raw: bytes) -> tuple[int, int, bytes] | None:
    """(domain id, schema id, payload) from an exported binaryData blob; None when the header does not fit."""
    if len(raw) < _BLOB_HEADER.size:
        return None
    domain_id, schema_id, size, offset = _BLOB_HEADER.unpack_from(raw)
    if offset < _BLOB_HEADER.size or offset + size > len(raw):
        return None
    return domain_id, schema_id, raw[offset : offset + size]


def decode_payload(
    entries: list[SchemaEntry], payload: bytes, enums: dict[int, dict[int, str]] | None = None
) -> dict[str, Any]:
    """Entry name -> value for a static payload schema. Entries of types this decoder does not know
    (nested schemas, strings, arrays) are left out rather than guessed."""
    enums = enums or {}
    out: dict[str, Any] = {}
    pos: int | None = 0  # end of the previous entry; None once an entry of unknown size was skipped
    for e in sorted(entries, key=lambda e: e.idx):
        fmt = _ENTRY_FORMATS.get(e.type)
        if fmt is None and e.type >= _STATIC_SCHEMA_START:
            fmt = "i"  # an enum (C enums are int-sized); its values come from the enum table or NCCL's list
        if fmt is None:
            pos = None  # unknown size: an implicit offset after it cannot be computed
            continue
        size = struct.calcsize(fmt)
        if e.offset is not None:
            off = e.offset
        elif pos is not None:
            off = -(-pos // size) * size  # natural alignment
        else:
            continue
        if off + size > len(payload):
            continue
        value = struct.unpack_from("<" + fmt, payload, off)[0]
        if e.type >= _STATIC_SCHEMA_START:
            names = enums.get(e.type)
            if names is None and e.name == "Reduction operation":
                names = NCCL_REDOPS
            value = names.get(value, value) if names else value
        out[e.name] = value
        pos = off + size
    return out


# --- innermost open range at a point in time, per thread ------------------------------------------------------


def innermost_open(
    ranges: Iterable[tuple[Any, int, int, int]], points: Iterable[tuple[Any, int, int]]
) -> dict[int, int]:
    """For each point (thread, ts, point_id), the id of the innermost range (thread, start, end, range_id)
    of the same thread with start <= ts <= end. Ranges of one thread nest (NVTX push/pop); a range that
    does not nest is treated as closed when a later one opens past its end.

    Returns point_id -> range_id for the points inside some range.
    """
    by_thread: dict[Any, list[tuple[int, int, int]]] = {}
    for tid, start, end, rid in ranges:
        by_thread.setdefault(tid, []).append((start, -end, rid))
    pts: dict[Any, list[tuple[int, int]]] = {}
    for tid, ts, pid in points:
        if tid in by_thread:
            pts.setdefault(tid, []).append((ts, pid))
    out: dict[int, int] = {}
    for tid, plist in pts.items():
        rs = sorted(by_thread[tid])  # by start, then longest first: outer before inner
        starts = [r[0] for r in rs]
        plist.sort()
        stack: list[tuple[int, int]] = []  # (end, range_id)
        j = 0
        for ts, point_id in plist:
            hi = bisect_right(starts, ts)
            while j < hi:
                start, neg_end, rid = rs[j]
                while stack and stack[-1][0] < start:
                    stack.pop()
                stack.append((-neg_end, rid))
                j += 1
            while stack and stack[-1][0] < ts:
                stack.pop()
            if stack:
                out[point_id] = stack[-1][1]
    return out
