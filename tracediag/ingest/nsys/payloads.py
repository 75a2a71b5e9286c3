"""NVTX binary payloads (NCCL's message sizes, communicators and ranks): the export's payload schema and enum
tables, each event's binaryData decoded by them (`tracediag.ingest.nsys_nvtx`) and its values checked, and the
payload columns of nvtx_events.
"""

from __future__ import annotations

from typing import Any

import orjson

from tracediag.ingest import validate as val
from tracediag.ingest.nsys.export import _INT32, _Export, _valid_tuples
from tracediag.ingest.nsys.nvtx import _Nvtx
from tracediag.ingest.nsys_nvtx import SchemaEntry, blob_bytes, decode_payload, split_blob
from tracediag.ingest.validate import BadRecords


def _payload_schemas(ex: _Export) -> tuple[dict[tuple[int, int], list[SchemaEntry]], dict[int, dict[int, str]]]:
    t = "NVTX_PAYLOAD_SCHEMA_ENTRIES"
    schemas: dict[tuple[int, int], dict[int, SchemaEntry]] = {}
    if t in ex.tables and {"domainId", "schemaId", "idx", "type", "name"} <= ex.cols(t):
        rows = ex.rows(f"SELECT domainId, schemaId, idx, type, name, {ex.col(t, 't', 'offset')} FROM {t} t")
        rows = _valid_tuples(
            ex,
            t,
            rows,
            {0: ("domainId", None, None), 1: ("schemaId", None, None), 2: ("idx", None, None)},
            {3: ("type", None, None), 5: ("offset", 0, val.INT32_MAX)},
        )
        names = ex.text_values(t, "name", [r[4] for r in rows])
        for (dom, sid, idx, typ, _, off), name in zip(rows, names):
            if typ is not None and name is not None:
                schemas.setdefault((dom, sid), {}).setdefault(idx, SchemaEntry(idx, name, typ, off))
    enums: dict[int, dict[int, str]] = {}
    e = "NVTX_PAYLOAD_ENUM_ENTRIES"
    if e in ex.tables and {"schemaId", "name", "value"} <= ex.cols(e):
        rows = _valid_tuples(
            ex,
            e,
            ex.rows(f"SELECT schemaId, name, value FROM {e}"),
            {0: ("schemaId", None, None)},
            {2: ("value", None, None)},
        )
        names = ex.text_values(e, "name", [r[1] for r in rows])
        for (sid, _, value), name in zip(rows, names):
            if value is not None:
                enums.setdefault(sid, {}).setdefault(value, name)
    return {k: list(v.values()) for k, v in schemas.items()}, enums


def _decode_payloads(
    nvtx: _Nvtx, schemas: dict[tuple[int, int], list[SchemaEntry]], enums: dict[int, dict[int, str]]
) -> dict[int, dict[str, Any]]:
    """Event index -> decoded payload entries, for events whose binaryData a payload schema describes."""
    out: dict[int, dict[str, Any]] = {}
    if not nvtx.has_binary or not schemas:
        return out
    for i, ev in enumerate(nvtx.events):
        raw = blob_bytes(ev[9])
        if raw is None:
            continue
        parts = split_blob(raw)
        if parts is None:
            continue
        domain_id, schema_id, payload = parts
        entries = schemas.get((domain_id, schema_id)) or schemas.get((ev[5], schema_id))
        if entries:
            decoded = _checked_payload(nvtx.bad, decode_payload(entries, payload, enums))
            if decoded:
                out[i] = decoded
    return out


# payload entries the rank and communicator logic reads, with the range each must be in
_PAYLOAD_INTS = {
    "Rank": (0, val.RANK_MAX),
    "No. of ranks": (1, val.RANK_MAX + 1),
    "CUDA device": _INT32,
    "NCCL communicator ID": (0, 2**64 - 1),
    "Message size [bytes]": (0, val.COUNT_MAX),
    "Peer rank": (0, val.RANK_MAX),
    "Root": (0, val.RANK_MAX),
}


def _checked_payload(bad: BadRecords | None, pl: dict[str, Any]) -> dict[str, Any]:
    """A decoded payload without the entries the schema gave an impossible value (a double where a rank
    belongs, a size beyond any buffer); those are counted."""
    for key, (lo, hi) in _PAYLOAD_INTS.items():
        x = pl.get(key)
        if x is not None and not (type(x) is int and lo <= x <= hi):
            if bad is not None:
                bad.skipped(f"NVTX_EVENTS.binaryData.{key}", "payload entry ignored", [x])
            pl = {k: v for k, v in pl.items() if k != key}
    return pl


def _payload_note(nvtx: _Nvtx, payloads: dict[int, dict[str, Any]], md: dict[str, str]) -> str:
    if not nvtx.nccl_names:
        return "no NCCL NVTX ranges in the export"
    if payloads:
        return f"decoded from binaryData for {len(payloads)} NVTX events (see nvtx_events.message_bytes, ...)"
    blobs = md.get("EXPORT_PARAM_INCLUDE_BLOBS")
    why = " (exported with --include-blobs=false)" if blobs == "false" else ""
    return (
        f"NCCL NVTX ranges present but binaryData is NULL{why}: message size, reduction op and communicator are "
        "not available; collectives are named from kernel and range names. Re-export with "
        "`nsys export --type=sqlite --include-blobs=true` to get them"
    )


def _payload_columns(pl: dict[str, Any] | None) -> tuple:
    """nvtx_events' payload columns (nccl_comm_id ... payload_json) from a decoded payload."""
    if not pl:
        return (None,) * 9
    comm, redop = pl.get("NCCL communicator ID"), pl.get("Reduction operation")
    return (
        f"0x{comm:016x}" if isinstance(comm, int) else None,
        pl.get("Message size [bytes]"),
        str(redop) if redop is not None else None,
        pl.get("Peer rank"),
        pl.get("Root"),
        pl.get("No. of ranks"),
        pl.get("Rank"),
        pl.get("CUDA device"),
        orjson.dumps(pl, default=str).decode(),
    )
