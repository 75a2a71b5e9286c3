"""What a Kineto trace says of itself: the file's rank (distributedInfo, else its name, else its input order), its
process groups (distributedInfo.pg_config) and the inputs row (world size, backend, the device's properties).
Every value is checked: a wrongly typed or out-of-range one is NULL and counted; a rank that is not one is an
InputError naming `distributedInfo.rank`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import msgspec

from tracediag.errors import InputError
from tracediag.ingest import validate as val
from tracediag.ingest.kineto.events import _TOP
from tracediag.ingest.validate import BadRecords

_RANK_IN_NAME = re.compile(r"(?:^|[^a-z])rank[-_]?(\d+)", re.IGNORECASE)


def _pick_rank(path: Path, dist: Any, order: int) -> tuple[int, str]:
    if isinstance(dist, dict) and dist.get("rank") is not None:
        rank = dist["rank"]
        if type(rank) is not int or not 0 <= rank <= val.RANK_MAX:
            raise InputError(
                path, f"distributedInfo.rank is {val.example(rank)}, not a rank (an integer 0 … {val.RANK_MAX})"
            )
        return rank, "distributedInfo"
    m = _RANK_IN_NAME.search(path.name)
    if m and len(m.group(1)) <= 8 and int(m.group(1)) <= val.RANK_MAX:
        return int(m.group(1)), "file name"
    return order, "input order"


def _head_dist(prefix: bytes) -> Any:
    """distributedInfo from the keys written before the events array (Kineto writes it there), read before the
    events so a parser that spills its tables knows the rank; None when it is not there or does not decode (the
    whole document is decoded at the end anyway)."""
    if not prefix:
        return None
    try:
        return _TOP.decode(prefix + b"]}").distributedInfo
    except (msgspec.DecodeError, RecursionError):
        return None


def _pg_config(dist: Any, rank: int, bad: BadRecords) -> list[dict[str, Any]]:
    """distributedInfo.pg_config -> process_groups rows; a wrongly typed or out-of-range value is NULL."""
    if not (isinstance(dist, dict) and isinstance(dist.get("pg_config"), list)):
        return []
    chk = val.Checker(bad, "distributedInfo.pg_config")
    entries = [pg for pg in dist["pg_config"] if isinstance(pg, dict)]

    def col(key: str) -> list[Any]:
        return [pg.get(key) for pg in entries]

    names, descs, backends = (chk.str_values(k, col(k)) for k in ("pg_name", "pg_desc", "backend_config"))
    sizes = chk.int_values("pg_size", col("pg_size"), 1, val.RANK_MAX + 1)
    ranks, idx = val.int_lists(col("ranks"), 0, val.RANK_MAX)
    bad.nulled("distributedInfo.pg_config", "ranks", idx, [entries[i].get("ranks") for i in idx])
    return [
        {
            "rank": rank,
            "pg_name": names[i],
            "pg_desc": descs[i],
            "backend_config": backends[i],
            "pg_size": sizes[i],
            "ranks": ranks[i],
        }
        for i in range(len(entries))
    ]


def _meta(
    p: Path,
    order: int,
    rank: int,
    rank_source: str,
    dist: Any,
    props: Any,
    device: int | None,
    bad: BadRecords,
) -> dict[str, Any]:
    dist = dist if isinstance(dist, dict) else {}
    prop = None
    if isinstance(props, list):
        cands = [d for d in props if isinstance(d, dict)]
        prop = next((d for d in cands if d.get("id") == device), cands[0] if cands else None)
    # facts of the file: a wrongly typed or out-of-range one is NULL and counted
    di, dp = val.Checker(bad, "distributedInfo"), val.Checker(bad, "deviceProperties")
    prop = prop or {}

    def fact(chk: val.Checker, doc: dict, key: str, lo: int | None = None, hi: int = val.INT64_MAX) -> Any:
        if lo is None:
            return chk.str_values(key, [doc.get(key)])[0]
        return chk.int_values(key, [doc.get(key)], lo, hi)[0]

    world_size = fact(di, dist, "world_size", 1, val.RANK_MAX + 1)
    if world_size is not None and rank_source == "distributedInfo" and rank >= world_size:
        # one of the two is wrong, and which is not known: the rank names the file's tables, the world size is
        # left out (NULL) rather than contradict it
        bad.nulled("inputs", "distributedInfo.world_size", [0], [f"rank {rank} of world_size {world_size}"],
                   "world_size set to NULL (the file's rank is not below it)")  # fmt: skip
        world_size = None
    backend, nccl_version = fact(di, dist, "backend"), fact(di, dist, "nccl_version")
    name, mem = fact(dp, prop, "name") or None, fact(dp, prop, "totalGlobalMem", 0)
    sms, major, minor = (fact(dp, prop, k, 0, val.INT32_MAX) for k in ("numSms", "computeMajor", "computeMinor"))
    dist_json = val.json_text(dist) if dist else None
    props_json = val.json_text(props) if props else None
    if dist and dist_json is None:
        bad.nulled("inputs", "distributedInfo", [0], [dist])
    if props and props_json is None:
        bad.nulled("inputs", "deviceProperties", [0], [props])
    return {
        "input_id": order,
        "path": str(p),
        "format": "kineto",
        "profiler": "pytorch-profiler (kineto)",
        "file_bytes": p.stat().st_size,
        "rank": rank,
        "rank_source": rank_source,
        "world_size": world_size,
        "backend": backend,
        "nccl_version": nccl_version,
        "device_name": name,
        "device_total_mem_bytes": mem,
        "device_num_sms": sms,
        "device_compute_capability": f"{major}.{minor}" if major is not None else None,
        "distributed_info_json": dist_json,
        "device_properties_json": props_json,
    }
