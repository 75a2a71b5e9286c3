"""The one basis every trace-side impact is a share of: the window's step time.

On a GPU trace that is the steady GPU span of each analysed rank (derive/windows.py: from the end of start-up to
the end of the last GPU work), summed over the ranks: the time the steps ran in, idle time between them included.
It is named "the window's step time" when the trace has steps and "the profiled span" when it has none. On a
CPU-only trace it is the steps' host time (else the traces' span). A rule's own share (of GPU busy time, of a
phase's step time, of GEMM time) is shown beside its impact, in its values and title; only the window share is
ranked (tracediag.findings.rank_key), so an effect on a mostly idle GPU never outranks a larger share of time.
"""

from __future__ import annotations

from dataclasses import dataclass

from tracediag.context import Context
from tracediag.findings import PROFILED_SPAN, WINDOW_STEP_TIME

_GPU_SQL = "SELECT coalesce(sum(steady_span_ns), 0), count(*) FROM gpu_timeline WHERE steady_span_ns > 0"
_HOST_STEPS_SQL = "SELECT coalesce(sum(step_ns), 0) FROM step_activity WHERE step_ns > 0"
_TRACE_SQL = "SELECT coalesce(sum(trace_end_ns - trace_start_ns), 0) FROM inputs WHERE trace_end_ns > trace_start_ns"


@dataclass(frozen=True)
class WindowTime:
    """The ranking basis of one analysis: `ns` of time, `basis` its words (findings.WINDOW_BASES), `how` the sum."""

    ns: int
    basis: str
    how: str

    def share(self, part_ns: float) -> float:
        """part / window, at most 1 (0 when the window is empty)."""
        return min(1.0, part_ns / self.ns) if self.ns > 0 else 0.0

    def text(self, part_ns: float) -> str:
        """'12.3 ms / 45.6 ms = 0.270 of the window's step time (…)': the impact's substitution."""
        return f"{part_ns / 1e6:.3g} ms / {self.ns / 1e6:.3g} ms = {self.share(part_ns):.3f} of {self.basis}"

    def values(self, part_ns: float) -> dict:
        """The impact's inputs, for a finding's values."""
        return {
            "window_time_ns": self.ns,
            "window_time": self.how,
            "share_of_window": round(self.share(part_ns), 4),
        }


def window_time(ctx: Context) -> WindowTime:
    """The analysis's window time (see the module docstring); memoized per analysis."""
    return ctx.once("window_time", lambda: _window_time(ctx))


def _has_steps(ctx: Context) -> bool:
    return bool(ctx.scalar("SELECT count(*) FROM (SELECT 1 FROM steps LIMIT 1)"))


def _window_time(ctx: Context) -> WindowTime:
    steps = _has_steps(ctx)
    span, ranks = ctx.con.execute(_GPU_SQL).fetchone()
    if span:
        return WindowTime(
            int(span),
            WINDOW_STEP_TIME if steps else PROFILED_SPAN,
            f"Σ steady GPU span (end of start-up to the last GPU work) over {ranks} rank{'s' if ranks != 1 else ''}",
        )
    host = ctx.scalar(_HOST_STEPS_SQL) or 0 if steps else 0
    if host:
        return WindowTime(int(host), WINDOW_STEP_TIME, "Σ host time of the steps (a CPU-only trace)")
    return WindowTime(int(ctx.scalar(_TRACE_SQL) or 0), PROFILED_SPAN, "Σ trace span of the inputs (no steps)")
