"""Queries shared by the TP collective rules (COL001, COL002, COL003): which calls are the TP group's, the
scheme (all-reduces or sequence-parallel pairs), per-step counts, and the element size e_a of the activations."""

from __future__ import annotations

import statistics

from tracediag.context import Context
from tracediag.model.dtypes import element_size

ALL_REDUCE = "all_reduce"
SEQUENCE_PARALLEL = "sequence_parallel"  # reduce-scatter + all-gather per row-/column-parallel GEMM pair


def tp_allreduce_where(alias: str = "") -> str:
    """The TP group's all-reduces: group size p (bound as a parameter), or unknown group size
    (older traces, custom all-reduce kernels without args)."""
    a = f"{alias}." if alias else ""
    return f"{a}op = 'all_reduce' AND ({a}group_size IS NULL OR {a}group_size = ?)"


def tp_sp_where(alias: str = "") -> str:
    """The TP group's reduce-scatters and all-gathers (sequence parallelism): group size p or unknown."""
    a = f"{alias}." if alias else ""
    return f"{a}op IN ('reduce_scatter', 'all_gather') AND ({a}group_size IS NULL OR {a}group_size = ?)"


def marked_steps(ctx: Context) -> list[dict]:
    """Steps that come from a real marker (not the whole-trace fallback)."""
    return ctx.rows(
        "SELECT rank, step_id, name, marker_source, phase, T, ts_ns, dur_ns FROM steps "
        "WHERE marker_source <> 'whole trace (no step markers)' ORDER BY rank, step_id"
    )


def empty_steps(ctx: Context) -> set[tuple[int, int]]:
    """(rank, step_id) of steps that did no model work: no GPU kernel on a rank that has kernels, or no
    GEMM/attention/collective op on a CPU-only rank (an empty scheduler iteration)."""
    rows = ctx.rows(
        """SELECT s.rank, s.step_id FROM steps s
           WHERE NOT EXISTS (
               SELECT 1 FROM kernel_steps k WHERE k.rank = s.rank AND k.step_id = s.step_id
                 AND k.klass IN ('gemm', 'wo_gemm', 'attention', 'attention_fallback', 'collective', 'norm',
                                 'elementwise', 'dequant'))
             AND NOT EXISTS (SELECT 1 FROM collectives c WHERE c.rank = s.rank AND c.step_id = s.step_id)"""
    )
    return {(r["rank"], r["step_id"]) for r in rows}


def per_step_counts(ctx: Context, p: int) -> list[dict]:
    """Per marked step: TP all-reduces, reduce-scatters, all-gathers, all-to-alls, all collectives."""
    return ctx.rows(
        f"""
        SELECT s.rank, s.step_id, s.phase, s.T,
            count(c.op) FILTER (WHERE {tp_allreduce_where("c")}) AS all_reduce,
            count(c.op) FILTER (WHERE c.op = 'all_gather') AS all_gather,
            count(c.op) FILTER (WHERE c.op = 'reduce_scatter') AS reduce_scatter,
            count(c.op) FILTER (WHERE c.op = 'all_to_all') AS all_to_all,
            count(c.op) AS all_collectives
        FROM steps s LEFT JOIN collectives c ON c.rank = s.rank AND c.step_id = s.step_id
        WHERE s.marker_source <> 'whole trace (no step markers)'
        GROUP BY s.rank, s.step_id, s.phase, s.T ORDER BY s.rank, s.step_id
        """,
        [p],
    )


def tp_scheme(ctx: Context, p: int) -> str:
    """How the TP group communicates per step: SEQUENCE_PARALLEL when the steps run reduce-scatter +
    all-gather pairs and no all-reduce (median over the non-empty marked steps), else ALL_REDUCE."""
    empty = empty_steps(ctx)
    rows = [r for r in per_step_counts(ctx, p) if (r["rank"], r["step_id"]) not in empty]
    if not rows:
        return ALL_REDUCE
    ar = statistics.median(r["all_reduce"] for r in rows)
    rs = statistics.median(r["reduce_scatter"] for r in rows)
    ag = statistics.median(r["all_gather"] for r in rows)
    return SEQUENCE_PARALLEL if ar == 0 and rs >= 2 and ag >= rs else ALL_REDUCE


def example_calls(ctx: Context, where: str, params: list, limit: int) -> list[dict]:
    return ctx.rows(
        f"SELECT rank, step_id AS step, ts_ns, call_name AS name, coalesce(kernel_name, exec_name) AS work_event, "
        f"op, dtype, elements, "
        f"payload_bytes, group_size, evidence FROM collectives WHERE {where} ORDER BY rank, ts_ns LIMIT ?",
        [*params, limit],
    )


def activation_element_bytes(ctx: Context) -> tuple[int | None, str]:
    """e_a from the GEMM activations in the trace; the config dtype only as a labelled fallback."""
    row = ctx.rows(
        "SELECT act_type, count(*) AS n FROM gemm_shapes WHERE act_type IS NOT NULL "
        "GROUP BY act_type ORDER BY n DESC LIMIT 1"
    )
    if row and element_size(row[0]["act_type"]):
        t = row[0]["act_type"]
        return element_size(t), f"GEMM activation type in the trace ({t})"
    m = ctx.model
    if m.dtype_bytes:
        return m.dtype_bytes, f"config torch_dtype ({m.dtype}); the trace recorded no GEMM input types"
    return None, "unknown"
