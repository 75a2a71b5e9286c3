"""Queries shared by the TP collective rules (COL001, COL002)."""

from __future__ import annotations

from tracediag.engine import Context


def tp_allreduce_where(alias: str = "") -> str:
    """The TP group's all-reduces: group size p (bound as a parameter), or unknown group size
    (older traces, custom all-reduce kernels without args)."""
    a = f"{alias}." if alias else ""
    return f"{a}op = 'all_reduce' AND ({a}group_size IS NULL OR {a}group_size = ?)"


def marked_steps(ctx: Context) -> list[dict]:
    """Steps that come from a real marker (not the whole-trace fallback)."""
    return ctx.rows(
        "SELECT rank, step_id, name, marker_source, phase, T, ts_ns, dur_ns FROM steps "
        "WHERE marker_source <> 'whole trace (no step markers)' ORDER BY rank, step_id"
    )


def example_calls(ctx: Context, where: str, params: list, limit: int) -> list[dict]:
    return ctx.rows(
        f"SELECT rank, step_id AS step, ts_ns, call_name AS name, coalesce(kernel_name, exec_name) AS work_event, "
        f"op, dtype, elements, "
        f"payload_bytes, group_size, evidence FROM collectives WHERE {where} ORDER BY rank, ts_ns LIMIT ?",
        [*params, limit],
    )
