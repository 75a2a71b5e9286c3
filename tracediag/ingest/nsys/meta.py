"""The inputs rows, one per rank of the export: its time span and event count, the GPU's properties
(TARGET_INFO_GPU through TARGET_INFO_CUDA_DEVICE), the rank's source and NVTX counts, the file's metadata.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from tracediag.ingest import validate as val
from tracediag.ingest.base import names_classified_by_prefix
from tracediag.ingest.nsys.export import _Export, _valid_tuples
from tracediag.ingest.nsys.nvtx import _Nvtx
from tracediag.ingest.nsys.ranks import _Unit
from tracediag.ingest.validate import BadRecords


@dataclass
class _RankFacts:
    """The file's ranks as the inputs rows describe them."""

    units: dict[tuple[int | None, int | None], _Unit]
    rank_source: str
    world_size: int | None
    nvtx_counts: dict[int, Counter[str]]


def _inputs_rows(
    ex: _Export,
    order: int,
    file_bytes: int,
    md: dict[str, str],
    meta_common: dict[str, Any],
    ranks: _RankFacts,
    nvtx: _Nvtx,
    out: dict[str, dict[str, list]],
    tables: dict[str, pa.Table],
) -> list[dict[str, Any]]:
    """One inputs row per rank of the file."""
    units = ranks.units
    summary = _per_rank(tables)
    props = _device_properties(ex, units)
    nccl_ranks = set()
    if "kernels" in tables:
        k = out["kernels"]
        nccl_ranks = {r for r, fam in zip(k["rank"], tables["kernels"].column("family").to_pylist()) if fam == "nccl"}
    version = md.get("EXPORT_PRODUCT_VERSION")
    facts = {id(prop): _prop_facts(prop, ex.bad) for prop, _ in props.values() if prop}
    long_names = names_classified_by_prefix(tables)
    if long_names:
        meta_common["names_classified_by_prefix"] = long_names
    if ex.bad:
        meta_common["bad_records"] = ex.bad.to_meta()
    inputs_rows = []
    ordered = sorted(units.values(), key=lambda u: u.rank)
    rows_owner = ordered[0]  # the file's bad records are counted once, on its first rank's row
    for u in ordered:
        first, last, events = summary.get(u.rank, (None, None, 0))
        prop, prop_source = props[(u.pid, u.device)]
        name, mem, sms, cc, prop_json = facts.get(id(prop), (None,) * 5)
        meta = meta_common | {
            "pid": u.pid,
            "process_name": nvtx.process_names.get(u.pid),
            "cuda_device": u.device,
            "device_info_source": prop_source,
            "nvtx": dict(ranks.nvtx_counts[u.rank]),
        }
        inputs_rows.append(
            {
                "input_id": order,
                "path": str(ex.path),
                "format": "nsys-sqlite",
                "profiler": f"nsys {version}" if version else "nsys",
                "file_bytes": file_bytes,
                "rank": u.rank,
                "rank_source": ranks.rank_source,
                "world_size": ranks.world_size,
                "backend": "nccl" if nvtx.nccl_names or u.rank in nccl_ranks else None,
                "nccl_version": None,
                "device_name": name,
                "device_total_mem_bytes": mem,
                "device_num_sms": sms,
                "device_compute_capability": cc,
                "trace_start_ns": first,
                "trace_end_ns": last,
                "events_total": events,
                "events_python_skipped": 0,
                "distributed_info_json": None,
                "device_properties_json": prop_json,
                "meta_json": val.json_text(meta),
                "bad_records": ex.bad.records if u is rows_owner else 0,
            }
        )
    return inputs_rows


def _prop_facts(prop: dict[str, Any], bad: BadRecords) -> tuple:
    """(name, total memory, SMs, compute capability, JSON) of a TARGET_INFO_GPU row; bad values NULL, counted."""
    chk = val.Checker(bad, "TARGET_INFO_GPU")
    name = chk.str_values("name", [prop.get("name")])[0]
    mem = chk.int_values("totalMemory", [prop.get("totalMemory")], 0, val.INT64_MAX)[0]
    sms = prop.get("smCount") if prop.get("smCount") is not None else prop.get("numMultiprocessors")
    sms = chk.int_values("smCount", [sms], 0, val.INT32_MAX)[0] or None
    major, minor = chk.int_values("computeMajor", [prop.get("computeMajor"), prop.get("computeMinor")], 0, 1000)
    cc = f"{major}.{minor}" if major is not None else None
    clean = {k: (None if isinstance(x, (bytes, bytearray)) else x) for k, x in prop.items()}
    return name, mem, sms, cc, val.json_text(clean)


def _per_rank(tables: dict[str, pa.Table]) -> dict[int, tuple[int, int, int]]:
    """rank -> (first start, last end, rows) over every table of the input."""
    out: dict[int, tuple[int, int, int]] = {}
    for t in tables.values():
        ends = pc.add(t.column("ts_ns"), pc.fill_null(t.column("dur_ns"), 0))
        agg = (
            pa.table({"rank": t.column("rank"), "ts": t.column("ts_ns"), "end": ends})
            .group_by("rank")
            .aggregate([("ts", "min"), ("end", "max"), ("ts", "count")])
        )
        for r, lo, hi, n in zip(*(agg.column(c).to_pylist() for c in ("rank", "ts_min", "end_max", "ts_count"))):
            a, b, m = out.get(r, (lo, hi, 0))
            out[r] = (min(a, lo), max(b, hi), m + n)
    return out


def _device_properties(
    ex: _Export, units: dict[tuple[int | None, int | None], _Unit]
) -> dict[tuple[int | None, int | None], tuple[dict[str, Any] | None, str]]:
    """(pid, CUDA device) -> (TARGET_INFO_GPU row as a dict, where it came from).

    CUDA device ordinals are per process: TARGET_INFO_CUDA_DEVICE maps (pid, cudaId) to the GPU's id in
    TARGET_INFO_GPU; without it, TARGET_INFO_GPU.cuDevice (the CUDA ordinal) is used, then its id.
    """
    gpus: list[dict[str, Any]] = []
    if "TARGET_INFO_GPU" in ex.tables:
        names = [r[1] for r in ex.rows('PRAGMA table_info("TARGET_INFO_GPU")')]
        rows = ex.rows("SELECT * FROM TARGET_INFO_GPU")
        gpus = [dict(zip(names, _clean_cells(ex, "TARGET_INFO_GPU", names, r))) for r in rows]
    cuda_dev: dict[tuple[int, int], tuple[int | None, int | None]] = {}
    t = "TARGET_INFO_CUDA_DEVICE"
    if t in ex.tables and {"pid", "cudaId"} <= ex.cols(t):
        rows = ex.rows(
            f"SELECT pid, cudaId, {ex.col(t, 't', 'gpuId')}, {ex.col(t, 't', 'numMultiprocessors')} FROM {t} t"
        )
        rows = _valid_tuples(
            ex,
            t,
            rows,
            {0: ("pid", None, None), 1: ("cudaId", None, None)},
            {2: ("gpuId", None, None), 3: ("numMultiprocessors", 0, val.INT32_MAX)},
        )
        for pid, cuda_id, gpu_id, sms in rows:
            cuda_dev[(pid, cuda_id)] = (gpu_id, sms)
    out: dict[tuple[int | None, int | None], tuple[dict[str, Any] | None, str]] = {}
    for key in units:
        pid, dev = key
        gpu_id, sms = cuda_dev.get((pid, dev), (None, None)) if pid is not None and dev is not None else (None, None)
        row = None
        if gpu_id is not None:
            row = next((g for g in gpus if g.get("id") == gpu_id), None)
            source = "TARGET_INFO_CUDA_DEVICE -> TARGET_INFO_GPU"
        if row is None and gpus:
            row = next((g for g in gpus if g.get("cuDevice") == dev), None) or next(
                (g for g in gpus if g.get("id") == dev), None
            )
            source = "TARGET_INFO_GPU (by CUDA device ordinal)"
        if row is None and (gpu_id is not None or sms is not None):
            row = {"id": gpu_id, "numMultiprocessors": sms}
            source = "TARGET_INFO_CUDA_DEVICE (SM count only)"
        out[key] = (row, source) if row is not None else (None, "absent: no TARGET_INFO_GPU or TARGET_INFO_CUDA_DEVICE")
    return out


def _clean_cells(ex: _Export, table: str, names: list[str], row: tuple) -> list[Any]:
    """A row kept whole (as JSON): blobs set to NULL, undecodable text replaced, both counted."""
    out = []
    for name, x in zip(names, row):
        if isinstance(x, bytes):
            ex.bad.skipped(f"{table}.{name}", "value set to NULL", [x])
            x = None
        elif type(x) is str and val.has_surrogates(x):
            x = ex.text_values(table, name, [x])[0]
        out.append(x)
    return out
