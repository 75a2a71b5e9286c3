"""The ranks: one per process and CUDA device with GPU work, numbered from nsys's MPI trace (MPI_RANKS, else
"MPI Rank N" thread names), else ncclCommInitRank payloads, else process order; NCCL communicators from the
payloads become process groups.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any

from tracediag.errors import InputError
from tracediag.ingest import validate as val
from tracediag.ingest.nsys.export import _Export, _valid_tuples, pid_of
from tracediag.ingest.nsys.nvtx import _Nvtx


@dataclass
class _Unit:
    """One rank: a process on one CUDA device."""

    pid: int | None
    device: int | None
    rank: int = -1
    gpu_events: int = 0


def _units(
    ex: _Export, kern: dict[str, list], mcpy: dict[str, list], mset: dict[str, list]
) -> tuple[dict[tuple[int | None, int | None], _Unit], dict[int | None, _Unit]]:
    """The ranks: one unit per (process, device) with GPU work, and each process's unit with the most work."""
    work: Counter[tuple[int | None, int | None]] = Counter()
    for cols in (kern, mcpy, mset):
        work.update(zip(cols["pid"], cols["device"]))
    if not work:
        present = sorted(t for t in ex.tables if t.startswith(("CUPTI_", "NVTX_")))
        raise InputError(
            ex.path,
            "Nsight Systems export without GPU work (no CUDA kernels, memory copies or memsets; tables: "
            f"{', '.join(present) or 'none'}); capture with `nsys profile --trace=cuda,nvtx`",
        )
    units = {key: _Unit(pid=key[0], device=key[1], gpu_events=n) for key, n in work.items()}
    primary: dict[int | None, _Unit] = {}
    for u in sorted(units.values(), key=lambda u: (-u.gpu_events, u.device if u.device is not None else -1)):
        primary.setdefault(u.pid, u)
    return units, primary


def _assign_ranks(
    ex: _Export,
    units: dict[tuple[int | None, int | None], _Unit],
    primary: dict[int | None, _Unit],
    nvtx: _Nvtx,
    payloads: dict[int, dict[str, Any]],
) -> tuple[str, int | None]:
    """Set every unit's rank; returns (rank_source, world_size or None)."""
    one_gpu_per_process = len(primary) == len(units)
    # 1. MPI: nsys's MPI trace table, else its "MPI Rank N" thread names.
    mpi: dict[int | None, int] = {}
    mpi_source = ""
    if "MPI_RANKS" in ex.tables and {"globalTid", "rank"} <= ex.cols("MPI_RANKS"):
        rows = _valid_tuples(
            ex,
            "MPI_RANKS",
            ex.rows("SELECT globalTid, rank FROM MPI_RANKS"),
            {0: ("globalTid", None, None), 1: ("rank", 0, val.RANK_MAX)},
        )
        mpi = {pid_of(g): r for g, r in rows}
        mpi_source = "MPI_RANKS table (nsys MPI trace)"
    if not mpi:
        mpi = nvtx.mpi_ranks
        mpi_source = "NVTX thread name 'MPI Rank N' (nsys MPI trace)"
    if mpi and one_gpu_per_process and all(u.pid in mpi for u in units.values()):
        ranks = [mpi[u.pid] for u in units.values()]
        if len(set(ranks)) == len(ranks):
            for u in units.values():
                u.rank = mpi[u.pid]
            return mpi_source, None
    # 2. NCCL: ncclCommInitRank payloads (Rank, No. of ranks, CUDA device), the largest communicator.
    nccl: dict[tuple[int | None, int | None], tuple[int, int]] = {}
    for i, pl in payloads.items():
        if "Rank" in pl and "No. of ranks" in pl:
            ev = nvtx.events[i]
            pid = pid_of(ev[3])
            dev = pl.get("CUDA device")
            key = (pid, dev) if (pid, dev) in units else (pid, primary[pid].device) if pid in primary else None
            if key is not None:
                nranks, rank = int(pl["No. of ranks"]), int(pl["Rank"])
                if key not in nccl or nranks > nccl[key][0]:
                    nccl[key] = (nranks, rank)
    if nccl and all(k in nccl for k in units):
        ranks = [nccl[k][1] for k in units]
        sizes = {nccl[k][0] for k in units}
        if len(set(ranks)) == len(ranks) and len(sizes) == 1:
            for k, u in units.items():
                u.rank = nccl[k][1]
            return "NCCL NVTX payload (ncclCommInitRank: Rank of the largest communicator)", sizes.pop()
    # 3. One rank per process (and GPU) with GPU work, by CUDA device then pid.
    for i, u in enumerate(sorted(units.values(), key=lambda u: (u.device if u.device is not None else -1, u.pid or 0))):
        u.rank = i
    return (
        "process order: one rank per process and GPU with GPU work, by CUDA device then pid "
        "(no MPI or NCCL rank in the export)",
        None,
    )


def _process_groups(
    units: dict[tuple[int | None, int | None], _Unit], payloads: dict[int, dict[str, Any]], nvtx: _Nvtx
) -> list[dict[str, Any]]:
    """NCCL communicators from ncclCommInitRank-style payloads (communicator id, No. of ranks, Rank)."""
    members: dict[int, dict[int, int]] = {}  # comm id -> {rank in comm: global rank}
    sizes: dict[int, int] = {}
    seen: dict[int, set[int]] = {}  # global rank -> comm ids
    primary = {u.pid: u for u in sorted(units.values(), key=lambda u: -u.gpu_events)}
    for i, pl in payloads.items():
        comm = pl.get("NCCL communicator ID")
        if comm is None or "No. of ranks" not in pl or "Rank" not in pl:
            continue
        pid = pid_of(nvtx.events[i][3])
        u = units.get((pid, pl.get("CUDA device"))) or primary.get(pid)
        if u is None:
            continue
        members.setdefault(comm, {})[int(pl["Rank"])] = u.rank
        sizes[comm] = int(pl["No. of ranks"])
        seen.setdefault(u.rank, set()).add(comm)
    out = []
    for rank, comms in sorted(seen.items()):
        for comm in sorted(comms):
            m = members[comm]
            complete = len(m) == sizes[comm]
            out.append(
                {
                    "rank": rank,
                    "pg_name": f"0x{comm:016x}",
                    "pg_desc": "NCCL communicator (NVTX payload)",
                    "backend_config": "cuda:nccl",
                    "pg_size": sizes[comm],
                    "ranks": [m[r] for r in sorted(m)] if complete else None,
                }
            )
    return out
