"""The topology snapshots (`tracediag env`) among the inputs, and which of their GPUs the TP group ran on: PATH001
classifies the links between those GPUs, PATH002 reads the bandwidth they promise."""

from __future__ import annotations

import json

from tracediag.context import Context


def snapshots(ctx: Context) -> list[dict]:
    """The topology inputs with their facts (host, whether NVML was available)."""
    out = []
    for r in ctx.rows("SELECT path, meta_json FROM inputs WHERE format = 'topology' ORDER BY input_id"):
        meta = json.loads(r["meta_json"] or "{}")
        out.append({"path": r["path"], **meta})
    return out


def group_gpus(ctx: Context, p: int, n_gpus: int) -> tuple[list[int], str]:
    """NVML indices of the TP group's GPUs on the (first) snapshot's node."""
    devs = ctx.rows("SELECT rank, min(device) AS device FROM kernels GROUP BY rank ORDER BY rank")
    if devs and len(devs) >= min(p, 2):
        idx = sorted({int(d["device"]) for d in devs if d["device"] is not None})[:p]
        if idx and max(idx) < n_gpus:
            return idx, "the GPU ordinals the ranks' kernels ran on (assumes CUDA ordinals = NVML order)"
    return list(range(min(p, n_gpus))), f"GPUs 0..{min(p, n_gpus) - 1} of the snapshot (no GPU ordinals in a trace)"
