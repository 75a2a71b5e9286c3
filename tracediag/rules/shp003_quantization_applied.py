"""SHP003 Quantization applied.

Hypothesis: the config declares 4-bit weight-only quantization (AWQ / GPTQ / bitsandbytes /
compressed-tensors W4A16 / MXFP4), but the engine runs the projections as dense 16-bit GEMMs on
full-size weights and no W4A16 kernel runs — the model was loaded unquantized or dequantized once at
load, so neither the memory nor the decode-bandwidth saving the config promises exists.

Formula: W4A16 calls = kernels/ops of class wo_gemm (Marlin, Machete, AWQ, GPTQ/exllama, bitsandbytes,
fpA_intB, int4 packed mm, MXFP4 matmul_ogs); dense projection calls = dense GEMM ops whose (K, N) is a
projection of the config at TP degree p (the SHP002 role table, lm_head excluded: quantizers leave it
16-bit) — on GPU traces without recorded shapes, dense GEMM kernels.
Finding when W4A16 calls = 0 and dense projection calls > 0; also when both run (some projections
stayed dense).

Evidence: the config's quantization_config, W4A16 kernels with calls and time, dense projection GEMMs
with their shapes (role, K, N) and example calls.

What to do: check the engine's load log for the quantization method it picked (and warnings that it
fell back), that the checkpoint really holds packed weights (qweight/scales), that the quant kernels
exist for this GPU arch and dtype, and the engine flags (--quantization) — then KRN003 for the path.
"""

from __future__ import annotations

from tracediag.engine import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed
from tracediag.rules._kernels import (
    SOURCE_LABEL,
    call_evidence,
    dense_projection_gemms,
    phase_name,
    prepare,
    source_of,
    tp_degree,
    weight_only_4bit,
)

RULE = RuleMeta(
    id="SHP003",
    step=1,
    title="4-bit weight-only config → W4A16 kernels run on the projections",
    requires_tables=("steps",),
    requires_model=("H",),
    may_be_downstream_of=("SHP002",),
)


def check(ctx: Context) -> Check:
    declared = weight_only_4bit(ctx.model)
    if declared is None:
        q = ctx.model.quantization
        what = f"quant_method {q.get('quant_method', '?')}, bits {ctx.model.weight_bits}" if q else "none"
        return not_applicable(
            RULE, f"missing 4-bit weight-only quantization_config in {ctx.model.path} (quantization_config: {what})"
        )
    prepare(ctx)
    p, p_source = tp_degree(ctx)
    source = source_of(ctx)
    wo = ctx.rows(
        """SELECT name, family, sum(calls) AS calls, sum(time_ns) AS time_ns, arg_min(rank, first_ts_ns) AS rank,
                  arg_min(step_id, first_ts_ns) AS step, min(first_ts_ns) AS ts_ns
           FROM kernel_steps WHERE klass = 'wo_gemm' GROUP BY ALL ORDER BY time_ns DESC"""
    )
    wo_calls = sum(r["calls"] for r in wo)
    dense = dense_projection_gemms(ctx, p)
    if dense is None:  # no shapes: fall back to dense GEMM kernels
        dense_kernels = ctx.rows(
            """SELECT name, phase, sum(calls) AS calls, sum(time_ns) AS time_ns, arg_min(rank, first_ts_ns) AS rank,
                      arg_min(step_id, first_ts_ns) AS step, min(first_ts_ns) AS ts_ns
               FROM kernel_steps WHERE klass = 'gemm' GROUP BY ALL ORDER BY time_ns DESC"""
        )
        dense_calls = sum(r["calls"] for r in dense_kernels)
        dense_how = "dense GEMM kernels (no GEMM shapes recorded: roles not checked)"
        dense_ev = [call_evidence(r) for r in dense_kernels]
        roles: dict[str, int] = {}
    else:
        dense_calls = len(dense)
        dense_how = f"dense GEMM ops with a projection's full-size (K, N) at p = {p}"
        dense_ev = [
            {
                "rank": r["rank"],
                "step": r["step_id"],
                "ts_ns": r["ts_ns"],
                "name": r["name"],
                "phase": phase_name(r["phase"]),
                "role": r["role"],
                "K": r["K"],
                "N": r["N"],
                "act_type": r["act_type"],
            }
            for r in dense
        ]
        roles = {}
        for r in dense:
            roles[r["role"]] = roles.get(r["role"], 0) + 1
    values = {
        "declared": declared,
        "quantization_config": ctx.model.quantization,
        "p": p,
        "p_source": p_source,
        "time_source": SOURCE_LABEL[source],
        "w4a16_calls": wo_calls,
        "w4a16_kernels": {r["name"]: r["calls"] for r in wo},
        "dense_projection_calls": dense_calls,
        "dense_counted_as": dense_how,
        "dense_roles": roles,
    }
    formula = "W4A16 calls (class wo_gemm) vs dense projection GEMM calls; finding when the dense ones run"
    substituted = f"W4A16 calls = {wo_calls}; {dense_how}: {dense_calls}"
    table = [
        {"kind": "W4A16", "name": r["name"], "family": r["family"], "calls": r["calls"], "time_ns": r["time_ns"]}
        for r in wo
    ] + [{"kind": "dense projection", "role": k, "calls": v} for k, v in roles.items()]
    wo_ev = [call_evidence(r) for r in wo]
    n = ctx.settings.max_evidence
    if not wo_calls and not dense_calls:
        return not_applicable(RULE, "missing GEMMs: neither W4A16 nor dense projection GEMMs in the trace")
    if wo_calls and not dense_calls:
        return passed(
            RULE,
            confidence="high",
            title=(
                f"Quantization applied ({declared}): {wo_calls} W4A16 calls "
                f"({', '.join(sorted(values['w4a16_kernels']))}), no dense projection GEMM"
            ),
            formula=formula,
            substituted=substituted,
            values=values,
            table=table,
            evidence=wo_ev[:n],
        )
    if not wo_calls:
        title = (
            f"Quantization not applied: the config declares {declared}, but no W4A16 kernel ran and "
            f"{dense_calls} projection GEMMs ran dense"
            + (f" on full-size weights ({', '.join(f'{k} ×{v}' for k, v in roles.items())})" if roles else "")
        )
        severity, impact = "error", 1.0
    else:
        title = (
            f"Quantization partly applied ({declared}): {wo_calls} W4A16 calls, but {dense_calls} projection GEMMs "
            f"still dense ({', '.join(f'{k} ×{v}' for k, v in roles.items()) or 'dense GEMM kernels'})"
        )
        severity, impact = "warning", dense_calls / (dense_calls + wo_calls)
    return finding(
        RULE,
        severity=severity,
        confidence="high" if roles else "medium",
        impact=impact,
        title=title,
        formula=formula,
        substituted=substituted,
        values=values,
        table=table,
        evidence=(dense_ev[: n - min(len(wo_ev), 2)] + wo_ev[:2]) if wo_ev else dense_ev[:n],
        next_check=(
            "Check the engine's load log for the quantization method it chose (or a fallback warning), that the "
            "checkpoint holds packed weights (qweight/qzeros/scales), that the W4A16 kernels support this GPU arch "
            "and dtype, and the --quantization flag; then KRN003 for the kernel path."
        ),
    )
