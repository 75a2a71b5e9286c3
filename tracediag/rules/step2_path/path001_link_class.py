"""PATH001 Link class.

Hypothesis: the GPUs of the tensor-parallel group are not joined by NVLink (or NVSwitch): the group
spans PCIe-only pairs, pairs without P2P (staged through host memory), GPUs on different CPU sockets,
another node, or NVLink links that are down. The expected bus bandwidth is then an order of magnitude
lower and every TP all-reduce pays for it (docs/method.md, step 2 of the walk: nvidia-smi topo -m
and P2P status).

Formula: for each pair of GPUs in the group, the link class from the NVML snapshot — nvlink (direct
links), nvswitch, pcie (P2P over PCIe), pcie-host (no P2P), network (the group does not fit in the
snapshot's node) — and the path's per-direction bandwidth (NVLink links × per-link rate, or PCIe
lanes × per-lane rate); the group is as fast as its slowest pair.

Evidence: per pair the class, PCIe common ancestor (PIX/PXB/PHB/NODE/SYS), P2P read/write/NVLink
status and expected GB/s; per GPU NVLink links active/total, PCIe generation and width, NUMA node.
The group is ranks 0..p−1 on the GPUs their trace kernels ran on (else GPU 0..p−1 of the snapshot).

What to do: keep TP inside NVLink islands and use pipeline parallelism across the weak link (vLLM's
guidance for nodes without NVLink); restore inactive NVLink links (nvidia-smi nvlink -s, reseat,
fabric manager); enable P2P/ACS settings; pin each rank to its GPU's NUMA node.
"""

from __future__ import annotations

from tracediag.analyses.topology import group_gpus, snapshots
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="PATH001",
    step=2,
    title="Link class between the GPUs of the TP group (NVLink / PCIe / network)",
    may_be_downstream_of=("SHP001",),
    enabled_by=("--topology topo.json",),
)
STRONG = ("nvlink", "nvswitch")
CLASS_ORDER = {"nvlink": 0, "nvswitch": 0, "pcie": 1, "pcie-host": 2, "network": 3}
CLASS_WORDS = {
    "nvlink": "NVLink",
    "nvswitch": "NVSwitch",
    "pcie": "PCIe",
    "pcie-host": "PCIe without P2P (staged through host memory)",
    "network": "network link (the group does not fit in this node)",
}


def _group_pairs(ctx: Context, snapshot: str, idx: list[int]) -> list[dict]:
    """The snapshot's GPU pairs within the TP group's GPUs: link class, P2P capabilities, expected bandwidth."""
    return ctx.rows(
        "SELECT gpu_a, gpu_b, link_class, topology, p2p_read, p2p_write, p2p_nvlink, direct_nvlinks, "
        "expected_busbw_gbs FROM topo_pairs WHERE source_path = ? AND list_contains(?, gpu_a) AND "
        "list_contains(?, gpu_b) ORDER BY gpu_a, gpu_b",
        [snapshot, idx, idx],
    )


def _link_problems(p: int, idx: list[int], snap: dict, gpus: dict, pairs: list[dict], off_node: int) -> list[dict]:
    """The weak links of the group, as evidence: ranks off the node (the network), GPU pairs without NVLink or
    NVSwitch, and GPUs with NVLink links down."""
    problems: list[dict] = []
    if off_node > 0:
        problems.append(
            {
                "rank": None,
                "ts_ns": None,
                "name": f"{off_node} of the {p} ranks are not on {snap.get('host')} ({len(gpus)} GPUs): the group "
                "crosses the network",
                "link_class": "network",
            }
        )
    for pr in pairs:
        if pr["link_class"] not in STRONG:
            problems.append(
                {
                    "rank": None,
                    "ts_ns": None,
                    "name": f"GPU {pr['gpu_a']} <-> GPU {pr['gpu_b']}: {pr['link_class']} ({pr['topology']}, P2P read "
                    f"{pr['p2p_read']}, NVLink {pr['p2p_nvlink']}), ~{pr['expected_busbw_gbs']} GB/s",
                    "link_class": pr["link_class"],
                }
            )
    degraded = [
        g for i, g in gpus.items() if i in idx and g["nvlinks_total"] and g["nvlinks_active"] < g["nvlinks_total"]
    ]
    for g in degraded:
        problems.append(
            {
                "rank": None,
                "ts_ns": None,
                "name": f"GPU {g['gpu_index']} ({g['name']}): {g['nvlinks_active']} of {g['nvlinks_total']} "
                "NVLink links active",
                "link_class": "nvlink-degraded",
            }
        )
    return problems


def _link_table(pairs: list[dict], gpus: dict, idx: list[int]) -> list[dict]:
    """The pairs with each end's NUMA node, then one row per GPU of the group (bus id, links, PCIe)."""
    return [
        pr | {"numa_a": gpus[pr["gpu_a"]]["numa_node"], "numa_b": gpus[pr["gpu_b"]]["numa_node"]} for pr in pairs
    ] + [
        {
            "gpu": i,
            "name": gpus[i]["name"],
            "pci_bus_id": gpus[i]["pci_bus_id"],
            "numa_node": gpus[i]["numa_node"],
            "nvlinks_active": gpus[i]["nvlinks_active"],
            "nvlinks_total": gpus[i]["nvlinks_total"],
            "pcie": f"gen{gpus[i]['pcie_gen']} x{gpus[i]['pcie_width']}",
        }
        for i in idx
    ]


def check(ctx: Context) -> Check:
    snaps = snapshots(ctx)
    if not snaps:
        return not_applicable(
            RULE,
            "missing topology snapshot: run `tracediag env -o topo.json` on the node and pass --topology topo.json",
        )
    usable = [s for s in snaps if s.get("nvml_available") and s.get("gpus")]
    if not usable:
        s = snaps[0]
        return not_applicable(
            RULE,
            f"missing GPU data: the topology snapshot {s['path']} was taken where NVML was not available "
            f"({s.get('nvml_error')}); take it on the GPU node",
        )
    snap = usable[0]
    gpus = {
        g["gpu_index"]: g
        for g in ctx.rows("SELECT * FROM topo_gpus WHERE source_path = ? ORDER BY gpu_index", [snap["path"]])
    }
    p = ctx.tp.p if ctx.tp else len(gpus)
    p_source = ctx.tp.source if ctx.tp else "all GPUs of the snapshot (no trace or --tp)"
    if p < 2:
        return not_applicable(RULE, "p = 1: one GPU, no link between ranks")
    idx, group_source = group_gpus(ctx, p, len(gpus))
    pairs = _group_pairs(ctx, snap["path"], idx)
    off_node = p - len(idx)
    other_hosts = [s for s in usable[1:] if s.get("host") != snap.get("host")]
    problems = _link_problems(p, idx, snap, gpus, pairs, off_node)
    worst = max((pr["link_class"] for pr in pairs), key=lambda c: CLASS_ORDER.get(c, 9), default="nvlink")
    expected = [pr["expected_busbw_gbs"] for pr in pairs if pr["expected_busbw_gbs"] is not None]
    if off_node > 0:
        worst, expected = "network", []  # the NIC bounds it; the snapshot does not describe the network
    numa = sorted({g["numa_node"] for i, g in gpus.items() if i in idx and g["numa_node"] is not None})
    values = {
        "p": p,
        "p_source": p_source,
        "host": snap.get("host"),
        "snapshot": snap["path"],
        "gpus": idx,
        "gpu_names": sorted({gpus[i]["name"] for i in idx}),
        "group_from": group_source,
        "link_classes": {f"{pr['gpu_a']}-{pr['gpu_b']}": pr["link_class"] for pr in pairs},
        "worst_link_class": worst,
        "expected_group_busbw_gbs": min(expected) if expected else None,
        "numa_nodes": numa,
        "nvlinks_active": {str(i): f"{gpus[i]['nvlinks_active']}/{gpus[i]['nvlinks_total']}" for i in idx},
    }
    if other_hosts:
        values["other_snapshots"] = [s["path"] for s in other_hosts]
    table = _link_table(pairs, gpus, idx)
    formula = (
        "group bandwidth = min over GPU pairs of the path's per-direction GB/s (NVLink links × rate, PCIe lanes × rate)"
    )
    substituted = ", ".join(f"{k}: {v}" for k, v in values["link_classes"].items()) + (
        f"; min {values['expected_group_busbw_gbs']} GB/s" if expected else ""
    )
    common = {
        "formula": formula,
        "substituted": substituted,
        "values": values,
        "table": table,
    }
    if not problems:
        return passed(
            RULE,
            **common,
            confidence="high",
            title=(
                f"TP group on {len(idx)} GPUs joined by {CLASS_WORDS[worst]} with all links active and P2P OK "
                f"(~{values['expected_group_busbw_gbs']} GB/s per direction)"
            ),
            evidence=[],
        )
    weak = [x for x in problems if x["link_class"] != "nvlink-degraded"]
    if weak:
        title = (
            f"TP group crosses a {CLASS_WORDS[worst]}"
            + ("" if worst == "network" else f": {len(weak)} GPU pair(s) without NVLink")
            + (f", ~{values['expected_group_busbw_gbs']} GB/s per direction" if expected else "")
        )
        nxt = (
            "Keep TP inside NVLink islands and use pipeline parallelism across the weak link; where PCIe is the "
            "only path, check P2P (ACS, IOMMU) and NUMA placement of each rank; measure with nccl-tests (PATH002)."
        )
    else:
        title = f"NVLink degraded: {'; '.join(x['name'] for x in problems)}"
        nxt = "Check `nvidia-smi nvlink -s` and the fabric manager; reseat or replace the GPU/baseboard before tuning."
    return finding(
        RULE,
        **common,
        severity="warning",
        confidence="high" if "synthetic" not in str(snap.get("host")) else "medium",
        impact=1.0 if weak else 0.5,
        title=title,
        evidence=problems[: ctx.settings.max_evidence],
        next_check=nxt,
    )
