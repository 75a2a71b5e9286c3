"""The parallel layout from evidence: the tensor-parallel degree p, and what each process group is.

Groups are named from what the trace says about them, strongest evidence first:

1. the group's own description (`distributedInfo.pg_config[].pg_desc`, `Process Group Description` on
   collectives): names containing tp/tensor, dp/data, pp/pipeline, ep/expert; `default_pg` is the world;
2. what the collectives on the group carry and when: all-reduces (or reduce-scatter + all-gather
   pairs) inside the forward of inference steps sum the `[T, H]` activation — tensor parallelism; in a
   training job (autograd backward, an optimizer step, DDP's annotations) the all-reduces and
   broadcasts are data-parallel gradient and parameter syncs; all-to-alls are named by what else ran
   (derive/domain.py): expert parallel beside MoE kernels (EP), an embedding-table exchange beside
   embedding bags (EMB, TorchRec), sequence parallel beside attention (SP, Ulysses), else unnamed (A2A);
   send/recv pairs are pipeline stages;
3. the group's size: a group of one rank is no parallelism at all.

p, in order: `--tp`; the size of the tensor-parallel group found above (the all-reduces' recorded group
size, else their process group's size, else `distributedInfo.world_size` when the all-reduces recorded no
group); the engine log's `tensor_parallel_size` (table `serving_startup`); p = 1 when the trace shows no
tensor-parallel group: a single process, a training job (whose all-reduces are data parallel, or with no
collective recorded: never the rank count), or ranks that
exchange only all-to-all / send-recv; else, with neither collectives nor a log, the number of rank files
(say so) or unknown.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import duckdb

from tracediag.derive import domain
from tracediag.errors import UsageError
from tracediag.store import has_table, query_dicts


@dataclass(frozen=True)
class TPDegree:
    p: int
    source: str  # where p came from, in words


@dataclass(frozen=True)
class ParallelGroup:
    kind: str  # TP, DP, EP, PP, world, single rank, unknown
    name: str | None  # process group name (pg_name) when known
    description: str | None  # pg_desc as written
    size: int | None
    ranks: list[int] | None
    backend: str | None
    collectives: dict[str, int]  # op -> calls on this group seen in the trace
    evidence: str  # why this kind, in words

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "description": self.description,
            "size": self.size,
            "ranks": self.ranks,
            "backend": self.backend,
            "collectives": self.collectives,
            "evidence": self.evidence,
        }


@dataclass(frozen=True)
class Layout:
    tp: TPDegree | None
    workload: str  # inference, training, unknown
    workload_evidence: str
    groups: tuple[ParallelGroup, ...] = ()
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {
            "tp": {"p": self.tp.p, "source": self.tp.source} if self.tp else None,
            "workload": self.workload,
            "workload_evidence": self.workload_evidence,
            "groups": [g.to_dict() for g in self.groups],
            "notes": list(self.notes),
        }


_DESC_KIND = (
    (re.compile(r"(?:^|[^a-z])(?:tp|tensor)(?:[^a-z]|$)|tensor_model_parallel", re.I), "TP"),
    (re.compile(r"(?:^|[^a-z])(?:dp|data|ddp|fsdp)(?:[^a-z]|$)|data_parallel", re.I), "DP"),
    (re.compile(r"(?:^|[^a-z])(?:pp|pipeline)(?:[^a-z]|$)", re.I), "PP"),
    (re.compile(r"(?:^|[^a-z])(?:ep|expert|moe)(?:[^a-z]|$)", re.I), "EP"),
)
TP_OPS = ("all_reduce", "reduce_scatter", "all_gather")


def workload(con: duckdb.DuckDBPyConnection) -> tuple[str, str]:
    """('training', why) when the trace holds autograd backward or optimizer work; else inference or unknown."""
    ev = domain.training_evidence(con)
    backward, marks, kernels, engine = ev["backward"], ev["marks"], ev["kernels"], ev["engine"]
    if backward or marks:
        return "training", (
            f"{backward} autograd backward ops and {marks} optimizer / DDP annotations (Optimizer.step#…, "
            "DistributedDataParallel.forward, ## backward ##)"
        )
    if kernels:  # a GPU-only trace: no CPU ops to say so, but the kernels of a backward pass
        return "training", f"{kernels} backward-pass or optimizer kernels (*_backward*, flash_bwd, wgrad, Adam)"
    if engine:
        return "inference", f"{engine} inference-engine step annotations"
    return "unknown", "no backward pass, optimizer step or engine step annotation in the trace"


def _desc_kind(desc: str | None) -> str | None:
    if not desc or desc in ("undefined", "default_pg"):
        return None
    for rx, kind in _DESC_KIND:
        if rx.search(desc):
            return kind
    return None


def _domain(con: duckdb.DuckDBPyConnection) -> dict[str, Any] | None:
    return domain.read(con) or domain.classify(con)


def describe_groups(con: duckdb.DuckDBPyConnection, work: str) -> tuple[list[ParallelGroup], list[str]]:
    pgs = query_dicts(
        con,
        "SELECT pg_name, any_value(pg_desc) AS pg_desc, any_value(backend_config) AS backend, max(pg_size) AS size, "
        "any_value(ranks) AS ranks FROM process_groups GROUP BY pg_name ORDER BY try_cast(pg_name AS INTEGER), pg_name",
    )
    colls = query_dicts(
        con,
        "SELECT pg_name, any_value(pg_desc) AS pg_desc, max(group_size) AS group_size, op, count(*) AS n "
        "FROM collectives WHERE op NOT IN ('unknown', 'barrier') GROUP BY pg_name, op",
    )
    by_pg: dict[str | None, dict[str, int]] = {}
    size_of: dict[str | None, int | None] = {}
    desc_of: dict[str | None, str | None] = {}
    for c in colls:
        by_pg.setdefault(c["pg_name"], {})[c["op"]] = c["n"]
        size_of[c["pg_name"]] = size_of.get(c["pg_name"]) or c["group_size"]
        desc_of[c["pg_name"]] = desc_of.get(c["pg_name"]) or c["pg_desc"]
    multi = [p for p in pgs if (p["size"] or 0) > 1]
    unnamed_to: str | None = None
    if None in by_pg and len(multi) == 1 and multi[0]["pg_name"] not in by_pg:
        # collectives that recorded no process group (gloo without record_param_comms) run on the only group
        # of several ranks the trace lists
        unnamed_to = multi[0]["pg_name"]
        by_pg[unnamed_to] = by_pg.pop(None)
    groups, notes = [], []
    dom = _domain(con) if any(o.get("all_to_all") for o in by_pg.values()) else None
    singles = 0
    seen: set[str | None] = set()
    for g in pgs + [
        {"pg_name": k, "pg_desc": desc_of.get(k), "backend": None, "size": size_of.get(k), "ranks": None}
        for k in by_pg
        if k not in {p["pg_name"] for p in pgs}
    ]:
        name = g["pg_name"]
        if name in seen:
            continue
        seen.add(name)
        ops = by_pg.get(name, {})
        size = g["size"] or size_of.get(name)
        desc = g["pg_desc"] or desc_of.get(name)
        if size == 1 and not ops:
            singles += 1
            continue
        kind, why = _kind(desc, size, ops, work, dom)
        where = "distributedInfo.pg_config" if name in {p["pg_name"] for p in pgs} else "the collectives' args"
        if name == unnamed_to:
            where += "; its collectives record no group: it is the trace's only group of several ranks"
        carried = ", ".join(f"{n} {op}" for op, n in sorted(ops.items())) or "no collectives in the trace"
        groups.append(
            ParallelGroup(
                kind=kind,
                name=name,
                description=desc,
                size=size,
                ranks=list(g["ranks"]) if g["ranks"] is not None else None,
                backend=g["backend"],
                collectives=ops,
                evidence=f"{why} (group from {where}: desc {desc!r}, size {size}; carries {carried})",
            )
        )
    if singles:
        notes.append(f"{singles} process group(s) of a single rank (no parallelism) are not listed")
    return groups, notes


def _all_to_all_kind(dom: dict[str, Any] | None) -> tuple[str, str]:
    """What an all-to-all group is, from what else ran (derive/domain.py): MoE kernels → expert parallel; embedding
    bags → embedding-table exchange (TorchRec model parallel); attention without MoE → sequence parallel (Ulysses);
    else unnamed."""
    d = dom or {}
    if d.get("moe_kernels"):
        return "EP", f"all-to-all beside {d['moe_kernels']} MoE kernels: expert-parallel token dispatch"
    if d.get("embedding_bag_ops"):
        return "EMB", (
            f"all-to-all beside {d['embedding_bag_ops']} embedding-bag ops and no MoE kernel: embedding-table "
            "exchange (TorchRec model parallel)"
        )
    if d.get("workload") in ("llm", "encoder", "vision_transformer", "diffusion"):  # a transformer
        return "SP", (
            "all-to-all beside attention and no MoE kernel: sequence-parallel (Ulysses) exchange of heads and "
            "sequence shards"
        )
    return "A2A", "all-to-all with no MoE, embedding-bag or attention work to say what it exchanges"


def _kind(
    desc: str | None, size: int | None, ops: dict[str, int], work: str, dom: dict[str, Any] | None = None
) -> tuple[str, str]:
    k = _desc_kind(desc)
    if k:
        return k, f"its description names it ({desc!r})"
    if size == 1:
        return "single rank", "a group of one rank"
    if ops.get("all_to_all") and not any(ops.get(o) for o in ("all_reduce", "reduce_scatter")):
        return _all_to_all_kind(dom)
    if (ops.get("send") or ops.get("recv") or ops.get("send_recv")) and not any(ops.get(o) for o in TP_OPS):
        return "PP", "send/recv only: pipeline-stage transfers"
    if any(ops.get(o) for o in TP_OPS):
        if work == "training":
            return "DP", "all-reduces / broadcasts of a training job: data-parallel gradient and parameter syncs"
        return "TP", "all-reduces (or reduce-scatter + all-gather) inside inference steps: tensor parallelism"
    if desc == "default_pg":
        return "world", "the default (world) group"
    return "unknown", "no collective on this group in the trace"


def _tp_from_collectives(con: duckdb.DuckDBPyConnection) -> TPDegree | None:
    row = con.execute(
        "SELECT group_size, count(*) n FROM collectives WHERE op = 'all_reduce' AND group_size IS NOT NULL "
        "GROUP BY group_size ORDER BY n DESC LIMIT 1"
    ).fetchone()
    if row:
        return TPDegree(int(row[0]), "group size of the trace's all-reduce calls")
    row = con.execute(
        "SELECT g.pg_size, count(*) n FROM collectives c JOIN process_groups g "
        "ON g.rank = c.rank AND g.pg_name = c.pg_name WHERE c.op = 'all_reduce' AND g.pg_size IS NOT NULL "
        "GROUP BY g.pg_size ORDER BY n DESC LIMIT 1"
    ).fetchone()
    if row:
        return TPDegree(int(row[0]), "size of the all-reduces' process group (distributedInfo.pg_config)")
    rs_ag = con.execute(
        "SELECT coalesce(max(group_size), (SELECT max(world_size) FROM inputs)) FROM collectives "
        "WHERE op IN ('reduce_scatter', 'all_gather')"
    ).fetchone()[0]
    has = {
        op: n
        for op, n in con.execute(
            "SELECT op, count(*) FROM collectives WHERE op IN ('all_reduce', 'reduce_scatter') GROUP BY op"
        ).fetchall()
    }
    if has.get("all_reduce"):
        row = con.execute("SELECT max(world_size) FROM inputs").fetchone()
        if row and row[0]:
            return TPDegree(int(row[0]), "distributedInfo.world_size")
        n = con.execute("SELECT count(DISTINCT rank) FROM inputs WHERE rank IS NOT NULL").fetchone()[0]
        if n > 1:
            return TPDegree(n, "number of ranks in the inputs")
    if has.get("reduce_scatter") and rs_ag and rs_ag > 1:
        return TPDegree(int(rs_ag), "group of the reduce-scatter + all-gather pairs (sequence parallelism)")
    return None


def _tp_from_log(con: duckdb.DuckDBPyConnection) -> TPDegree | None:
    if not has_table(con, "serving_startup"):
        return None
    row = con.execute(
        "SELECT value_num, line FROM serving_startup WHERE key IN ('tensor_parallel_size', 'arg_tensor_parallel_size') "
        "AND value_num IS NOT NULL ORDER BY key DESC, line LIMIT 1"
    ).fetchone()
    if row and row[0] >= 1:
        return TPDegree(int(row[0]), f"engine log tensor_parallel_size (line {row[1]})")
    return None


def detect_layout(con: duckdb.DuckDBPyConnection, override: int | None = None) -> Layout:
    """The layout of the run in the store; p from --tp when `override` is given."""
    if override is not None and override < 1:
        raise UsageError(f"--tp must be ≥ 1, got {override}")
    work, work_why = workload(con)
    groups, notes = describe_groups(con, work)
    tp_groups = [g for g in groups if g.kind == "TP"]
    colls = con.execute("SELECT count(*) FROM collectives").fetchone()[0]
    world = con.execute("SELECT max(world_size), count(DISTINCT rank) FROM inputs WHERE rank IS NOT NULL").fetchone()
    world_size, rank_files = world[0], world[1]
    tp: TPDegree | None = None
    if override is not None:
        tp = TPDegree(override, "--tp option")
    elif work != "training" and (found := _tp_from_collectives(con)) is not None:
        tp = found
    elif tp_groups and tp_groups[0].size:
        tp = TPDegree(
            tp_groups[0].size, f"process group {tp_groups[0].name!r} described as {tp_groups[0].description!r}"
        )
    elif (logged := _tp_from_log(con)) is not None:
        tp = logged
    elif work == "training" and (groups or rank_files > 1):
        dp = [g for g in groups if g.kind == "DP"]
        if dp and dp[0].size:
            what = (
                f"its all-reduces are gradient syncs of a data-parallel group of {dp[0].size} "
                f"({dp[0].description or dp[0].name})"
            )
        elif dp:
            what = (
                "its all-reduces are gradient syncs of a data-parallel group, size not recorded "
                f"(world size {world_size or '?'})"
            )
        elif groups:
            kinds = ", ".join(sorted({g.kind for g in groups}))
            what = f"its collectives belong to {kinds} groups"
        else:  # data-parallel / FSDP ranks whose collectives the window did not record: the rank count is no TP
            what = f"no collective in the trace of its {rank_files} ranks: they are data parallel or FSDP"
        tp = TPDegree(1, f"training job with no tensor-parallel group: {what}")
    elif (world_size or 1) <= 1 and rank_files <= 1 and not any((g.size or 1) > 1 for g in groups):
        if rank_files == 1 or world_size == 1:
            tp = TPDegree(1, "single process and no tensor-parallel collectives")
    elif colls and not tp_groups:
        kinds = sorted({g.kind for g in groups if g.kind not in ("world", "single rank", "unknown")})
        tp = TPDegree(
            1,
            "no all-reduce or reduce-scatter + all-gather between the ranks: no tensor-parallel group"
            + (f" (groups: {', '.join(kinds)})" if kinds else ""),
        )
    elif rank_files > 1:
        tp = TPDegree(rank_files, "number of ranks in the inputs (no collective in the trace confirms it)")
    return Layout(tp=tp, workload=work, workload_evidence=work_why, groups=tuple(groups), notes=tuple(notes))
