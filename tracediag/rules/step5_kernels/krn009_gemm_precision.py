"""KRN009 GEMM precision.

Hypothesis: a GEMM that runs in fp32 on CUDA cores (cuBLAS `*_sgemm_*`, CUTLASS `simt_sgemm`) on a GPU with
tensor cores does an order of magnitude less arithmetic per second than the same GEMM in bf16/fp16 (or even
TF32) on the tensor cores: an fp32 model or layer, autocast off, or `allow_tf32` off leaves that on the table.

Formula: fp32 share = time of GEMM kernels whose name states fp32 SIMT arithmetic (catalog `gemm_precision`) /
time of all GEMM kernels, over the steps (the whole trace when it has no step); their share of the GPU busy
time is the cost. The GPU has tensor cores when its compute capability is ≥ 7.0 (deviceProperties), when
its kernels name a tensor-core architecture (volta/turing/ampere/sm80+ GEMMs, tensorop / xmma / nvjet / hgemm /
bf16 names), or on AMD Instinct (MFMA, gfx90a/gfx94x). Finding when the fp32 SIMT share of GEMM time is
≥ 10 % on a tensor-core GPU: warning when it costs ≥ 10 % of the GPU busy time, else info; the impact the verdict
ranks is the steady segment's fp32 time as a share of the window's step time (analyses/basis.py). TF32 GEMMs
(fp32 storage on tensor cores) are reported, not flagged. When the share is ≥ 10 % and nothing in the trace says
whether the GPU has tensor cores (no device properties, no tensor-core GEMM name), the rule is not applicable:
the waste cannot be told from the GPU's limit.

Evidence: the fp32 GEMM kernels with calls and time, the launching ops, the device and why it has tensor cores.

What to do: check the model's dtype and autocast (bf16/fp16 weights and activations), torch.backends.cuda.matmul
.allow_tf32 / torch.set_float32_matmul_precision('high') for fp32 models — on compute capability 8.0 and later
only: Volta and Turing (7.x) tensor cores take fp16, not TF32 or bf16, so the advice there is fp16 autocast (the
capability is read from the trace's device properties) — and layers kept in fp32 on purpose (lm_head, router,
norms feeding a GEMM).
"""

from __future__ import annotations

import re

from tracediag.analyses.basis import window_time
from tracediag.analyses.kernels import ms, source_of
from tracediag.catalog import gemm_precision
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="KRN009",
    step=5,
    title="GEMM precision: fp32 SIMT GEMMs on a GPU with tensor cores",
    requires_tables=("kernels",),
    may_be_downstream_of=("SHP003",),
)
SHARE_FINDING = 0.10  # fp32 SIMT share of GEMM time
WARNING_COST = 0.10  # ... costing this share of GPU busy time is a warning
_TC_NAME = re.compile(
    r"^(?:void\s+)?(?:volta|turing|ampere|sm[789]\d|sm1\d\d)_\w*gemm|tensorop|xmma_gemm|^nvjet_|hgemm|bf16|"
    r"s16816|h1688|MI\d+x\d+x\d+",
    re.I,
)
_AMD_MATRIX = re.compile(r"MI[123]\d\d|Instinct|gfx9[04]", re.I)


def tensor_cores(ctx: Context) -> tuple[bool | None, str]:
    """(has tensor cores, why) from device properties, else from the GEMM kernel names."""
    dev = ctx.rows(
        "SELECT device_name, device_compute_capability AS cc FROM inputs WHERE rank IS NOT NULL "
        "AND (device_name IS NOT NULL OR device_compute_capability IS NOT NULL) LIMIT 1"
    )
    if dev:
        name, cc = dev[0]["device_name"] or "", dev[0]["cc"]
        if name and _AMD_MATRIX.search(name):
            return True, f"{name}: AMD Instinct matrix cores (MFMA)"
        if cc:
            try:
                major = int(str(cc).split(".")[0])
            except ValueError:
                major = None
            if major is not None and major >= 7:
                return True, f"{name or 'GPU'}, compute capability {cc} (tensor cores from 7.0)"
            if major is not None:
                return False, f"{name or 'GPU'}, compute capability {cc}: no tensor cores (they start at 7.0)"
    # the busiest GEMM names first (the example shown is then the one that matters, and the same on every run)
    names = [
        r["name"]
        for r in ctx.rows(
            "SELECT name FROM kernels WHERE klass = 'gemm' GROUP BY name ORDER BY sum(dur_ns) DESC, name LIMIT 2000"
        )
    ]
    tc = next((n for n in names if _TC_NAME.search(n)), None)
    if tc:
        return True, f"its GEMM kernels name a tensor-core architecture or path ({tc[:80]})"
    return None, "no device properties and no GEMM kernel names a tensor-core architecture"


def tf32_available(ctx: Context) -> tuple[bool | None, str]:
    """(TF32 tensor cores on this GPU, why): from compute capability 8.0 (Ampere) on NVIDIA; None when unknown."""
    dev = ctx.rows(
        "SELECT device_name, device_compute_capability AS cc FROM inputs WHERE rank IS NOT NULL "
        "AND device_compute_capability IS NOT NULL LIMIT 1"
    )
    name = (dev[0]["device_name"] or "GPU") if dev else "GPU"
    # ROCm traces write the gfx version (9.4 = gfx942) where CUDA writes the compute capability
    hip = ctx.scalar("SELECT count(*) FROM runtime WHERE name LIKE 'hip%'")
    if not dev or _AMD_MATRIX.search(name) or hip:
        return None, "no NVIDIA compute capability in the device properties (an AMD GPU, or none given)"
    try:
        major = int(str(dev[0]["cc"]).split(".")[0])
    except ValueError:
        return None, f"compute capability {dev[0]['cc']!r} not understood"
    if major >= 8:
        return True, f"{name}, compute capability {dev[0]['cc']}: TF32 and bf16 tensor cores (from 8.0)"
    return False, f"{name}, compute capability {dev[0]['cc']}: fp16 tensor cores only (TF32 and bf16 start at 8.0)"


def _advice(tf32: bool | None, tf32_why: str) -> str:
    if tf32 is False:
        return (
            "Run these GEMMs in fp16 on the tensor cores (autocast to torch.float16, or an fp16 model): this GPU's "
            f"tensor cores take fp16 only, so allowing TF32 does nothing here ({tf32_why}); look for layers kept in "
            "fp32 (lm_head, router)."
        )
    tf32_text = (
        "allow TF32 (torch.set_float32_matmul_precision('high'))"
        if tf32
        else "allow TF32 (torch.set_float32_matmul_precision('high')) if the GPU has compute capability 8.0 or later"
    )
    return (
        f"Check the model dtype and autocast (bf16/fp16), and for fp32 models {tf32_text}; look for layers kept in "
        "fp32 (lm_head, router)."
    )


_STEADY_SQL = """
SELECT coalesce(sum(k.dur_ns), 0) FROM kernels k
JOIN gpu_timeline t ON t.rank = k.rank AND k.ts_ns >= t.startup_end_ns AND k.ts_ns < t.stop_ts_ns
WHERE list_contains(?, k.name)
"""


def _steady_time(ctx: Context, names: list[str]) -> int:
    """Time of the kernels of these names that start in the steady segment, ns."""
    return int(ctx.scalar(_STEADY_SQL, [names]) or 0) if names else 0


def check(ctx: Context) -> Check:
    if source_of(ctx) != "gpu_kernel":
        return not_applicable(RULE, "missing GPU kernels: a CPU-only trace has no tensor cores to leave unused")
    rows = ctx.rows(
        """SELECT name, sum(calls) AS calls, sum(time_ns) AS time_ns, arg_min(rank, first_ts_ns) AS rank,
                  arg_min(step_id, first_ts_ns) AS step, min(first_ts_ns) AS ts_ns
           FROM kernel_steps WHERE klass = 'gemm' AND source = 'gpu_kernel'
             AND (step_id IS NOT NULL OR NOT EXISTS (SELECT 1 FROM steps WHERE win_ts_ns IS NOT NULL))
           GROUP BY name"""
    )
    if not rows:
        return not_applicable(RULE, "missing GEMM kernels in the trace")
    gemm_ns = sum(r["time_ns"] for r in rows)
    by = {"fp32": 0, "tf32": 0}
    fp32_rows = []
    for r in rows:
        pr = gemm_precision(r["name"])
        if pr is not None:
            by[pr.precision] += r["time_ns"]
            if pr.precision == "fp32":
                fp32_rows.append(r)
    busy = ctx.scalar("SELECT sum(busy_ns) FROM gpu_timeline") or 0
    share = by["fp32"] / gemm_ns if gemm_ns else 0.0
    cost = by["fp32"] / busy if busy else 0.0
    has_tc, why = tensor_cores(ctx)
    tf32, tf32_why = tf32_available(ctx)
    values = {
        "gemm_ns": gemm_ns,
        "fp32_simt_ns": by["fp32"],
        "tf32_tensor_core_ns": by["tf32"],
        "fp32_share_of_gemm": round(share, 4),
        "fp32_share_of_gpu_busy": round(cost, 4),
        "tensor_cores": has_tc,
        "tensor_cores_from": why,
        "tf32_available": tf32,
        "tf32_from": tf32_why,
        "thresholds": {"fp32_share_of_gemm": SHARE_FINDING, "warning_cost": WARNING_COST},
    }
    formula = "fp32 share = Σ fp32 SIMT GEMM time / Σ GEMM time; cost = fp32 SIMT GEMM time / GPU busy time"
    substituted = (
        f"{ms(by['fp32'])} / {ms(gemm_ns)} = {share:.3f} of GEMM time; {ms(by['fp32'])} / {ms(busy)} = {cost:.3f} "
        f"of GPU busy time (TF32 on tensor cores: {ms(by['tf32'])})"
    )
    top = sorted(fp32_rows, key=lambda r: -r["time_ns"])[: ctx.settings.max_evidence]
    evidence = [
        {"rank": r["rank"], "step": r["step"], "ts_ns": r["ts_ns"], "name": r["name"], "calls": r["calls"],
         "time_ns": r["time_ns"]}
        for r in top
    ]  # fmt: skip
    common = {"formula": formula, "substituted": substituted, "values": values, "evidence": evidence}
    if share >= SHARE_FINDING and has_tc is None:  # the share is measured; whether it is a waste is not known
        return not_applicable(
            RULE,
            f"missing the GPU model: whether it has tensor cores is not in the trace ({why}); fp32 SIMT GEMMs are "
            f"{share:.1%} of GEMM time ({ms(by['fp32'])})",
        )
    if share < SHARE_FINDING or not has_tc:
        reason = f"fp32 SIMT GEMMs are {share:.1%} of GEMM time" + (
            f" on a GPU without tensor cores ({why})" if has_tc is False else ""
        )
        return passed(RULE, **common, confidence="high", title=reason)
    # ranked on the window's time like every trace-side finding (the fp32 GEMM time of the steady segment: start-up
    # GEMMs lie outside it); the share of busy time sets the severity
    wt = window_time(ctx)
    steady = _steady_time(ctx, [r["name"] for r in fp32_rows])
    common["values"] = values | {"fp32_simt_steady_ns": steady} | wt.values(steady)
    common["substituted"] = f"{substituted}; impact (steady fp32 SIMT GEMM time) {wt.text(steady)}"
    return finding(
        RULE,
        **common,
        severity="warning" if cost >= WARNING_COST else "info",
        confidence="high",
        impact=wt.share(steady),
        impact_basis=wt.basis,
        cost_ns=int(by["fp32"]),
        title=(
            f"fp32 GEMMs on CUDA cores: {ms(by['fp32'])} = {share:.0%} of GEMM time ({cost:.0%} of GPU busy time, "
            f"{wt.share(steady):.0%} of {wt.basis}) run "
            f"SIMT fp32 on a GPU with tensor cores ({why})"
        ),
        next_check=_advice(tf32, tf32_why),
    )
