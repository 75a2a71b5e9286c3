"""SHP003 Quantization applied.

Hypothesis: the checkpoint declares quantized weights for some module groups (AWQ / GPTQ / bitsandbytes /
compressed-tensors / FP8 / MXFP4 / NVFP4 ...), but the engine runs those groups as dense 16-bit GEMMs on
full-size weights — the model was loaded unquantized or dequantized once at load, so neither the memory nor the
decode-bandwidth saving the config promises exists. Groups the checkpoint excludes from quantization
(`modules_to_not_convert`, `ignore`, `exclude_modules`: attention and router of gpt-oss, lm_head almost
everywhere) running dense are right, not a finding.

Formula: per quantized module group (tracediag.model.quant: attention, dense MLP, experts, shared experts,
lm_head), the GEMM kernels that serve it must read weights of its declared width: MoE experts are judged on
the expert GEMMs (grouped / batched MoE kernels: matmul_ogs, trtllm-gen bmm, Marlin MoE, CUTLASS / CK MoE,
fused_moe), the other groups on the dense GEMMs. A dense GEMM op whose (K, N) is the group's full-size
projection at TP degree p (the SHP002 role table) proves the group ran 16-bit — unless a dequantize op of the
same step wrote that weight (as many of the step's dense projection GEMMs, in order, as it ran dequantize ops):
that is the engine's dequantize path (vLLM's AWQ at ≥ 256 tokens), quantized weights expanded per step, which
KRN003 weighs; on GPU traces without recorded shapes, a quantized dense group with no low-bit GEMM kernel at all
is the evidence.

Evidence: the per-group table (declared format and scheme, verdict, kernels with the format read from their
names), dense projection GEMMs with their shapes (role, K, N) and example calls.

What to do: check the engine's load log for the quantization method it picked (and warnings that it fell
back), that the checkpoint really holds packed weights (qweight/scales, *_blocks/*_scales), that the quant
kernels exist for this GPU arch and dtype, and the engine flags (--quantization) — then KRN003 for the path.
"""

from __future__ import annotations

from tracediag.analyses.kernels import (
    SOURCE_LABEL,
    call_evidence,
    declared_formats,
    group_dispatch,
    kernels_in_words,
    phase_name,
    source_of,
    tp_degree,
    unphased_name,
)
from tracediag.context import Context
from tracediag.findings import Check, RuleMeta, finding, not_applicable, passed

RULE = RuleMeta(
    id="SHP003",
    step=1,
    title="Quantized module groups run kernels of their declared format",
    requires_tables=("steps",),
    requires_model=("H",),
    may_be_downstream_of=("SHP002",),
)
NEXT_CHECK = (
    "Check the engine's load log for the quantization method it chose (or a fallback warning), that the "
    "checkpoint holds packed weights (qweight/qzeros/scales, *_blocks/*_scales), that the low-bit kernels support "
    "this GPU arch and dtype, and the --quantization flag; then KRN003 for the kernel path."
)


def _dense_evidence(dense_rows: list[dict], unphased: str) -> list[dict]:
    """The dense projection GEMMs on a quantized group's full-size weights, as evidence."""
    return [
        {
            "rank": r["rank"],
            "step": r["step_id"],
            "ts_ns": r["ts_ns"],
            "name": r["name"],
            "phase": phase_name(r["phase"], unphased),
            "role": r["role"],
            "group": r["group"],
            "K": r["K"],
            "N": r["N"],
            "act_type": r["act_type"],
        }
        for r in dense_rows
    ]


def _applied(
    m, verdicts: list, formula: str, substituted: str, values: dict, table: list[dict], evidence: list[dict]
) -> Check:
    """No group failed: the kernels that read each group's declared width, the groups not verified, and the
    groups the config leaves unquantized on purpose."""
    unverified = [v for v in verdicts if v.verdict in ("unverified", "not_seen")]
    applied = [v for v in verdicts if v.verdict == "applied"]
    excluded = [g.group for g in m.quant.groups.values() if not g.quantized]
    how = "; ".join(
        f"{v.group} {v.declared.name} ({v.declared.scheme}) on {kernels_in_words(v.kernels)}"
        for v in applied
        if v.kernels
    )
    note = f"; {', '.join(v.group for v in unverified)}: {unverified[0].why}" if unverified else ""
    return passed(
        RULE,
        confidence="high" if not unverified else "low",
        title=(
            f"Quantization applied per group: {how or 'no group verified'}{note}"
            + (f"; {', '.join(excluded)} stay {m.quant.groups[excluded[0]].fmt.name} by design" if excluded else "")
        ),
        formula=formula,
        substituted=substituted,
        values=values,
        table=table,
        evidence=evidence,
    )


def check(ctx: Context) -> Check:
    m = ctx.model
    if m.quant is None or not m.quant.quantized_groups:
        what = declared_formats(m) if m.quant is not None and m.quant.method else "none"
        return not_applicable(
            RULE, f"missing quantization_config: {m.path} declares no quantized module group (quantization: {what})"
        )
    p, p_source = tp_degree(ctx)
    verdicts, gemms, dense = group_dispatch(ctx, p)
    if not gemms and not dense:
        return not_applicable(RULE, "missing GEMMs: no GEMM kernel or op in the trace")
    lowbit = [r for r in gemms if r["fmt"].lowbit]
    failed = [v for v in verdicts if v.verdict in ("not_applied", "partly")]
    quantized = {v.group for v in verdicts}
    # a dense GEMM on a weight a dequantize op of its step wrote is the engine's dequantize path (KRN003), not
    # quantization left unapplied
    dense_rows = [d for d in dense or [] if d["group"] in quantized and not d["dequantized"]]
    dequantized = [d for d in dense or [] if d["group"] in quantized and d["dequantized"]]
    values = {
        "declared": declared_formats(m),
        "quantization_source": m.quantization_source,
        "quantization_config": m.quantization,
        "p": p,
        "p_source": p_source,
        "time_source": SOURCE_LABEL[source_of(ctx)],
        "lowbit_calls": sum(r["calls"] for r in lowbit),
        "lowbit_kernels": {r["name"]: r["calls"] for r in lowbit},
        "dense_projection_calls": len(dense_rows),
        "dequantized_projection_calls": len(dequantized),
        "dense_counted_as": (
            f"dense GEMM ops with a quantized group's full-size (K, N) at p = {p}"
            if dense is not None
            else "no GEMM shapes recorded: dense GEMM kernels cannot be tied to a group"
        ),
        "groups": [v.row() for v in verdicts],
        "group_formats": m.quant.table(),
    }
    formula = (
        "per quantized group: GEMM kernels serving it read weights of its declared width (experts: the MoE GEMMs); "
        "dense GEMMs with the group's full-size (K, N) = not applied, unless a dequantize op of the same step wrote "
        "their weight"
    )
    substituted = "; ".join(f"{v.group} {v.declared.name}: {v.verdict} ({v.why})" for v in verdicts)
    table = [v.row() for v in verdicts]
    n, unphased = ctx.settings.max_evidence, unphased_name(ctx)
    ev_dense = _dense_evidence(dense_rows, unphased)
    ev_k = [call_evidence(r, scheme=r["fmt"].scheme, weights=r["fmt"].weight) for r in gemms]
    if not failed:
        evidence = [call_evidence(r, scheme=r["fmt"].scheme) for r in lowbit][:n] or ev_k[:n]
        return _applied(m, verdicts, formula, substituted, values, table, evidence)
    not_applied = [v for v in failed if v.verdict == "not_applied"]
    proven = any(v.dense_calls for v in failed) or any(v.group == "experts" for v in not_applied)
    roles = {}
    for v in failed:
        for r, c in v.dense_roles.items():
            roles[r] = roles.get(r, 0) + c
    groups_txt = ", ".join(f"{v.group} ({v.declared.name})" for v in failed)
    if not_applied and not lowbit:
        title = (
            f"Quantization not applied: the config declares {groups_txt}, but no low-bit kernel ran and "
            + (
                f"{len(dense_rows)} projection GEMMs ran dense"
                if dense_rows
                else f"{sum(r['calls'] for r in gemms)} GEMM calls ran 16-bit kernels"
            )
            + (f" on full-size weights ({', '.join(f'{k} ×{c}' for k, c in roles.items())})" if roles else "")
        )
        impact = 1.0
    else:
        title = (
            f"Quantization not applied to {groups_txt}: "
            + "; ".join(f"{v.group}: {v.why}" for v in failed)
            + (f" ({', '.join(f'{k} ×{c}' for k, c in roles.items())})" if roles else "")
        )
        impact = len(failed) / len(verdicts)
    return finding(
        RULE,
        severity="error" if proven else "warning",
        confidence="high" if proven else "medium",
        impact=impact,
        title=title,
        formula=formula,
        substituted=substituted,
        values=values
        | (
            {}
            if proven
            else {
                "note": "no GEMM shapes tie the dense kernels to these groups: a low-bit "
                "kernel missing from the catalog would look the same"
            }
        ),
        table=table,
        evidence=(ev_dense[: n - 2] + ev_k[:2]) if ev_dense else ev_k[:n],
        next_check=NEXT_CHECK,
    )
