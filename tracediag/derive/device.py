"""The GPU a trace ran on, read from the store: the catalogue's entry (tracediag.catalog.gpus) for the device facts of
the trace ranks, else for a `tracediag env` topology snapshot's GPUs.

Where the store says which GPU ran, in this order (the first that names a catalogued GPU wins): the `inputs` rows
of the trace ranks, lowest rank first (`device_name`, `device_total_mem_bytes`, `device_num_sms`,
`device_properties_json`: Kineto `deviceProperties`, Nsight `TARGET_INFO_GPU`); then `topo_gpus` (NVML names and
memory). The vendor, needed when the name is empty (the MI300X TraceLens traces carry `name: ""`), comes from the
name, the device properties' warp size (64 on AMD CDNA, 32 on NVIDIA) or ROCm runtime calls (`hip*`).

On the derive floor, over a connection, so that a derived table (op_roofline) and the rules
(tracediag.analyses.gpu) read the same GPU.
"""

from __future__ import annotations

from typing import Any

import duckdb
import orjson

from tracediag.catalog.gpus import GpuSpec, lookup


def _props(raw: str | None) -> list[dict[str, Any]]:
    if not raw:
        return []
    try:
        doc = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return []
    return [d for d in (doc if isinstance(doc, list) else [doc]) if isinstance(d, dict)]


def _vendor(con: duckdb.DuckDBPyConnection, row: dict[str, Any]) -> str | None:
    """nvidia / amd from the device name, the warp size in the device properties, or ROCm runtime calls."""
    name = (row.get("device_name") or "").lower()
    if "nvidia" in name or "tesla" in name or "quadro" in name or "geforce" in name:
        return "nvidia"
    if "amd" in name or "instinct" in name or "radeon" in name:
        return "amd"
    for d in _props(row.get("device_properties_json")):
        warp = d.get("warpSize", d.get("threadsPerWarp"))
        if warp == 64:
            return "amd"
        if warp == 32:
            return "nvidia"
    hip = con.execute(
        "SELECT count(*) FROM (SELECT 1 FROM runtime WHERE rank = ? AND name LIKE 'hip%' LIMIT 1)", [row["rank"]]
    ).fetchone()[0]
    return "amd" if hip else None


def _from_inputs(con: duckdb.DuckDBPyConnection) -> GpuSpec | None:
    cur = con.execute(
        "SELECT rank, device_name, device_total_mem_bytes, device_num_sms, device_properties_json FROM inputs "
        "WHERE rank IS NOT NULL AND (device_name IS NOT NULL OR device_num_sms IS NOT NULL "
        "OR device_total_mem_bytes IS NOT NULL) ORDER BY rank"
    )
    cols = [d[0] for d in cur.description]
    for row in [dict(zip(cols, r, strict=True)) for r in cur.fetchall()]:
        spec = lookup(
            row["device_name"],
            vendor=_vendor(con, row),
            sm_count=row["device_num_sms"],
            memory_bytes=row["device_total_mem_bytes"],
        )
        if spec is not None:
            return spec
    return None


def _from_topology(con: duckdb.DuckDBPyConnection) -> GpuSpec | None:
    try:
        rows = con.execute(
            "SELECT name, memory_total_bytes FROM topo_gpus WHERE name IS NOT NULL ORDER BY gpu_index"
        ).fetchall()
    except duckdb.Error:  # no snapshot was given: the table is absent
        return None
    for name, memory in rows:
        spec = lookup(name, vendor="nvidia", memory_bytes=memory)
        if spec is not None:
            return spec
    return None


def trace_gpu(con: duckdb.DuckDBPyConnection) -> GpuSpec | None:
    """The catalogued GPU of the trace in the store (the lowest trace rank's with device facts, else the topology
    snapshot's), or None when the store names none the catalogue knows."""
    return _from_inputs(con) or _from_topology(con)


def device_named(con: duckdb.DuckDBPyConnection) -> str | None:
    """The device name the trace carries, when there is one (for saying which GPU the catalogue lacks)."""
    row = con.execute(
        "SELECT device_name FROM inputs WHERE rank IS NOT NULL AND device_name IS NOT NULL ORDER BY rank LIMIT 1"
    ).fetchone()
    return row[0] if row else None
