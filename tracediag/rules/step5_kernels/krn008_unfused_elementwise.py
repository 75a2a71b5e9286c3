"""KRN008 Unfused elementwise work.

Hypothesis: an eager model runs each norm, rotary embedding, activation and cast as its own pass over the
activations — an fp32 RMSNorm alone is cast, pow, mean, add, rsqrt, mul, cast, mul — and each pass reads and
writes the whole tensor. Where fused kernels (vLLM/SGLang custom ops, FlashInfer, AITER, CK, TorchInductor's
fused Triton kernels) would do it in one pass, the eager passes can take tens of percent of the GPU time.

Formula: unfused share = time of eager PyTorch elementwise, reduction, norm and copy/cast work inside steps /
GPU busy time of the steps (ATen TensorIterator / reduce / norm kernels, family `aten` of the catalog; index,
gather and scan kernels left out; fused families not counted) — on CPU-only traces the outermost eager
elementwise ops' host time / step time. Split by what the pass does, read from the kernel's functor or the
op's name: norm (pow, mean, rsqrt, layer_norm), activation (silu, gelu, ...), concatenation (cat, stack — not
RoPE: CNNs and recommenders concatenate too), RoPE-like (neg, sin/cos; in an LLM, else plain neg/sin/cos),
cast/copy, other arithmetic. Finding from 10 % (info), warning from 25 %; the finding's impact (what the verdict
ranks) is the unfused time's share of the window's step time (analyses/basis.py), the share of busy time beside it.

Evidence: the largest eager kernels/ops with calls, time and the kind of pass; the fused kernels already used.

What to do: fit to the workload's domain (derive/domain.py). LLM inference — the engine's fused
norm/RoPE/activation kernels (vLLM/SGLang custom ops, FlashInfer) or torch.compile; training — torch.compile
(forward and backward), fused optimizers, AMP without extra casts; other models — torch.compile (Inductor fuses
elementwise chains into one Triton kernel); check for fp32 upcasts around norms that add cast passes.
"""

from __future__ import annotations

import re
from collections import defaultdict

from tracediag.analyses.basis import window_time
from tracediag.analyses.kernels import ms, source_of
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="KRN008",
    step=5,
    title="Unfused elementwise work: eager norm / RoPE / activation / cast passes as a share of GPU time",
    requires_tables=("steps",),
    requires_window="complete",
    share_of_steady="busy",
)
INFO_SHARE, WARNING_SHARE = 0.10, 0.25

# what a pass does, from the ATen functor / kernel name or the CPU op name (first match)
_NORM = (
    r"layer_norm|rms_norm|RowwiseMoments|LayerNorm|MeanOps|rsqrt|pow_tensor|\bpow\b|aten::mean|aten::pow|aten::rsqrt"
)
_ACT = r"silu|gelu|relu|sigmoid|tanh|softplus|threshold|clamp|mish|glu|hardswish"
_ROPE = r"neg_kernel|aten::neg\b|sin_kernel|cos_kernel|aten::sin\b|aten::cos\b"
_CONCAT = r"CatArray|aten::cat\b|aten::concat|aten::stack\b"
_CAST = r"copy_kernel|_copy|direct_copy|aten::to\b|aten::_to_copy|aten::copy_|aten::contiguous|aten::clone"
_KINDS = (
    ("norm", re.compile(_NORM + r"|aten::var|batch_norm", re.I)),
    ("activation", re.compile(_ACT, re.I)),
    ("concatenation (cat)", re.compile(_CONCAT, re.I)),
    ("rope-like (neg/sin/cos)", re.compile(_ROPE, re.I)),
    ("cast/copy", re.compile(_CAST, re.I)),
)
_NOT_ELEMENTWISE = re.compile(r"index|gather|scatter|indexSelect|Scan|Sort|cub::|rocprim|embedding|argmax|topk", re.I)


def kind_of(name: str, llm: bool = True) -> str:
    """What the pass does; neg/sin/cos passes are called RoPE-like only in an LLM (derive/domain.py)."""
    for kind, rx in _KINDS:
        if rx.search(name):
            return kind if llm or not kind.startswith("rope") else "neg/sin/cos"
    return "arithmetic"


def _gpu(ctx: Context) -> tuple[list[dict], int, dict[str, int]]:
    rows = ctx.rows(
        """SELECT name, family, klass, sum(calls) AS calls, sum(time_ns) AS time_ns,
                  arg_min(rank, first_ts_ns) AS rank, arg_min(step_id, first_ts_ns) AS step, min(first_ts_ns) AS ts_ns
           FROM kernel_steps WHERE step_id IS NOT NULL AND source = 'gpu_kernel'
             AND klass IN ('elementwise', 'norm') GROUP BY ALL"""
    )
    busy = ctx.scalar("SELECT sum(gpu_busy_ns) FROM step_activity WHERE source = 'gpu_kernel'") or 0
    eager = [r for r in rows if r["family"] == "aten" and not _NOT_ELEMENTWISE.search(r["name"])]
    fused: dict[str, int] = defaultdict(int)
    for r in rows:
        if r["family"] not in ("aten", "softmax", "moe_routing", "cub", "trtllm_gen_moe", "triton_kernels"):
            fused[r["family"]] += r["time_ns"]
    return eager, busy, dict(fused)


def _cpu(ctx: Context) -> tuple[list[dict], int]:
    # derive/eager_ops.sql: the outermost eager elementwise CPU ops per rank, step and name
    rows = ctx.rows(
        """SELECT name, sum(calls) AS calls, sum(time_ns) AS time_ns, arg_min(rank, first_ts_ns) AS rank,
                  arg_min(step_id, first_ts_ns) AS step, min(first_ts_ns) AS ts_ns
           FROM eager_cpu_ops GROUP BY name"""
    )
    total = ctx.scalar("SELECT sum(step_ns) FROM step_activity") or 0
    return rows, total


def check(ctx: Context) -> Check:
    gpu = source_of(ctx) == "gpu_kernel"
    if gpu:
        eager, total, fused = _gpu(ctx)
        basis = "GPU busy time of the steps (union of their kernels and copies)"
    else:
        eager, total = _cpu(ctx)
        fused = {}
        basis = "host time of the steps (CPU-only trace: outermost eager ops' host time)"
    if not total:
        return not_applicable(RULE, "missing GPU or CPU work inside engine steps")
    by_kind: dict[str, int] = defaultdict(int)
    dom = (ctx.fitness() or {}).get("domain")
    llm = dom is None or dom["workload"] == "llm"
    for r in eager:
        r["kind"] = kind_of(r["name"], llm)
        by_kind[r["kind"]] += r["time_ns"]
    unfused = sum(by_kind.values())
    share = unfused / total
    steps = ctx.scalar(  # the steps the share is over: the cost per step
        "SELECT count(*) FROM step_activity WHERE " + ("gpu_busy_ns > 0" if gpu else "step_ns > 0")
    )
    values = {
        "unfused_ns": unfused,
        "total_ns": total,
        "time_basis": basis,
        "unfused_share": round(share, 4),
        "by_kind_ns": dict(sorted(by_kind.items(), key=lambda kv: (-kv[1], kv[0]))),
        "fused_families_ns": dict(sorted(fused.items(), key=lambda kv: (-kv[1], kv[0]))),
        "thresholds": {"info": INFO_SHARE, "warning": WARNING_SHARE},
    }
    formula = "unfused share = Σ eager elementwise / norm / cast time in steps / " + (
        "GPU busy time of the steps" if gpu else "step time"
    )
    parts = ", ".join(f"{k} {ms(v)}" for k, v in values["by_kind_ns"].items()) or "none"
    substituted = f"{ms(unfused)} ({parts}) / {ms(total)} = {share:.3f}"
    # ties in time broken by rank, start and name: the same order on every run (the query's order is not fixed)
    top = sorted(eager, key=lambda r: (-r["time_ns"], r["rank"], r["ts_ns"], r["name"]))[: ctx.settings.max_evidence]
    evidence = [
        {
            "rank": r["rank"],
            "step": r["step"],
            "ts_ns": r["ts_ns"],
            "name": r["name"],
            "kind": r["kind"],
            "calls": r["calls"],
            "time_ns": r["time_ns"],
        }
        for r in top
    ]
    table = [{"name": r["name"], "kind": r["kind"], "calls": r["calls"], "time_ns": r["time_ns"]} for r in top]
    common = {"formula": formula, "substituted": substituted, "values": values, "table": table, "evidence": evidence}
    if share < INFO_SHARE:
        return passed(
            RULE,
            **common,
            confidence="high" if gpu else "medium",
            title=f"Eager elementwise work is {share:.1%} of {'GPU busy' if gpu else 'step'} time ({parts})",
        )
    lead = max(by_kind, key=by_kind.get)
    # ranked on the window's time like every trace-side finding; the share of busy time sets the severity
    wt = window_time(ctx)
    common["values"] = values | wt.values(unfused)
    common["substituted"] = f"{substituted}; impact {wt.text(unfused)}"
    return finding(
        RULE,
        **common,
        severity="warning" if share >= WARNING_SHARE else "info",
        confidence="high" if gpu else "medium",
        impact=wt.share(unfused),
        impact_basis=wt.basis,
        cost_ns=int(unfused),
        cost_per_step_ns=int(unfused / steps) if steps else None,
        title=(
            f"Unfused elementwise work takes {share:.0%} of {'GPU busy' if gpu else 'step'} time "
            f"({wt.share(unfused):.0%} of {wt.basis}): {parts} — "
            f"mostly {lead} passes a fused kernel or torch.compile would merge"
        ),
        next_check=advice(ctx),
    )


def advice(ctx: Context) -> str:
    """What to do, fit to the workload's domain (derive/domain.py): engine kernels only for LLM inference."""
    dom = (ctx.fitness() or {}).get("domain") or {}
    if dom.get("llm_inference"):
        return (
            "Use the engine's fused norm / RoPE / activation kernels (vLLM and SGLang custom ops, FlashInfer) or "
            "torch.compile the model (Inductor fuses these chains); look for fp32 upcasts around the norms."
        )
    if dom.get("mode") == "training":
        convs = (dom.get("conv_ops") or 0) + (dom.get("conv_kernels") or 0)
        return (
            f"For {dom['label']} (no inference engine): torch.compile the model (Inductor fuses elementwise "
            "chains, forward and backward), fused optimizers (foreach=True / fused=True), AMP without extra fp32 "
            "casts" + ("; channels_last for the convolutions (no layout transposes around them)." if convs else ".")
        )
    return (
        "torch.compile the model (Inductor fuses elementwise chains into one kernel) or use the framework's fused "
        "norm / activation kernels; look for fp32 upcasts and copies between the passes."
    )
