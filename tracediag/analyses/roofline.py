"""Buyable kernel time: per op family and phase, what kernels at the GPU's roofline would save, as a share of the
window's step time (KRN012 judges it; the report's roofline section draws it). Not a rule.

Reads `op_roofline` (tracediag/derive/op_roofline.sql: one row per rank, op, shape, dtype and phase). A row counts
when it has a roofline (a cost and the GPU's roofs) and is not bounded by launch latency (a mean kernel time
under 5 µs per call: the roofline does not bound it, the launch does); with engine steps, only rows inside a step
count. The shares are of the window's step time, the one basis of every trace-side impact (analyses/basis.py: the
steady GPU span of the ranks; without steps, the profiled span). Per group: buyable = Σ max(0, kernel_ns −
roofline_ns) (a row faster than its roofline buys nothing and is counted apart: the cost model or the catalogue's
peak is off there), share = buyable / window time, and the Amdahl bound on the step = 1 / (1 − share): kernels on
the critical path, every one at its roofline, at most.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tracediag.analyses.basis import window_time
from tracediag.analyses.kernels import phase_name
from tracediag.context import Context

LAUNCH_BOUND_US = 5  # op_roofline.launch_bound: mean kernel time per call under this


@dataclass
class FamilyGroup:
    """One op family in one phase: its counted rows, summed."""

    family: str
    phase: str | None
    calls: int = 0
    kernel_ns: int = 0
    roofline_ns: float = 0.0
    buyable_ns: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def pct_of_roofline(self) -> float | None:
        return 100.0 * self.roofline_ns / self.kernel_ns if self.kernel_ns else None

    @property
    def best_pct(self) -> float | None:
        """The highest % of roofline a row of the family reaches here (rows of at least 1 % of its time): a rate
        this GPU and library demonstrably reach, unlike the datasheet peak."""
        rows = [r for r in self.rows if r["kernel_ns"] >= 0.01 * self.kernel_ns and r["pct_of_roofline"]]
        return min(100.0, max(r["pct_of_roofline"] for r in rows)) if rows else None

    @property
    def demonstrated_ns(self) -> float:
        """Buyable time if every row ran at the family's best % of roofline in this trace (a lower estimate)."""
        best = self.best_pct
        if not best:
            return 0.0
        return sum(max(0.0, r["kernel_ns"] - r["roofline_ns"] * 100.0 / best) for r in self.rows)


@dataclass
class Buyable:
    """The window's buyable time: groups (largest buyable first) and what was not counted, with why."""

    basis: str  # what the shares are of: the window's step time, or the profiled span (analyses/basis.py)
    basis_ns: int  # its time, ns
    phase_ns: dict[str | None, int]  # step time per phase (empty without steps)
    groups: list[FamilyGroup]
    total_kernel_ns: int  # every kernel in the window (graph replays and ops without shapes included)
    linked_kernel_ns: int  # kernels linked to a CPU op (op_roofline's kernel_ns)
    launch_bound_ns: int  # rows bounded by launch latency: not judged against the roofline
    no_roofline_ns: int  # rows without a cost or without roofs
    outside_steps_ns: int  # rows outside every step (with steps)
    faster_than_roofline: list[dict[str, Any]]  # rows whose kernels beat the model's roofline
    no_roofline_why: dict[str, int]  # reason -> kernel ns, for rows without a roofline
    gpu: str | None
    peak_source: str | None
    rows: int  # op_roofline rows

    @property
    def counted_ns(self) -> int:
        return sum(g.kernel_ns for g in self.groups)

    @property
    def buyable_ns(self) -> float:
        return sum(g.buyable_ns for g in self.groups)


def family_row(g: FamilyGroup, b: Buyable, unphased: str) -> dict[str, Any]:
    """One family and phase as KRN012's table and the report's buyable table show it (each adds its own share)."""
    return {
        "family": g.family,
        "phase": phase_name(g.phase, unphased),
        "calls": g.calls,
        "kernel_ns": g.kernel_ns,
        "roofline_ns": round(g.roofline_ns),
        "pct_of_roofline": round(g.pct_of_roofline or 0, 1),
        "buyable_ns": round(g.buyable_ns),
        "buyable_at_best_ns": round(g.demonstrated_ns),
        "share_of_step_time": round(share(g.buyable_ns, b.basis_ns), 4),
    }


def share(ns: float, of: float) -> float:
    return ns / of if of else 0.0


def amdahl(fraction: float) -> float | None:
    """The step's speed-up bound when `fraction` of it goes away: 1 / (1 − fraction) (None: all of it)."""
    return 1.0 / (1.0 - fraction) if fraction < 1 else None


def _why(r: dict[str, Any]) -> str:
    if r["model"] is None:
        return r["note"] or "no cost"
    if (r["flops"] is None and r["model"] != "memory") or r["bytes"] is None:
        return r["note"] or "the cost model could not count the call"
    return r["peak_source"] or "no roofs for the GPU"


def buyable(ctx: Context) -> Buyable:
    """The window's op_roofline, judged per op family and phase (module docstring); once per memoized analysis
    (KRN012 and the report's section read the same one, neither changes it)."""
    return ctx.once("buyable_kernel_time", lambda: _buyable(ctx))


def _buyable(ctx: Context) -> Buyable:
    rows = ctx.rows("SELECT * FROM op_roofline ORDER BY kernel_ns DESC, rank, op, shape, dtype, phase")
    ranks = sorted({r["rank"] for r in rows})
    steps = ctx.rows(
        "SELECT phase, count(*) AS n, sum(dur_ns) AS ns FROM steps WHERE list_contains(?::INTEGER[], rank) "
        "GROUP BY phase",
        [ranks],
    )
    phase_ns = {s["phase"]: int(s["ns"] or 0) for s in steps}
    n_steps = sum(s["n"] for s in steps)
    window = window_time(ctx)  # the one basis of every trace-side impact (tracediag/analyses/basis.py)
    basis_ns, basis = window.ns, window.basis
    total = int(
        ctx.scalar("SELECT coalesce(sum(dur_ns), 0) FROM kernels WHERE list_contains(?::INTEGER[], rank)", [ranks]) or 0
    )
    groups: dict[tuple[str, str | None], FamilyGroup] = {}
    launch = no_roof = outside = 0
    why: dict[str, int] = {}
    faster = []
    for r in rows:
        if r["roofline_ns"] is None:
            no_roof += r["kernel_ns"]
            reason = _why(r)
            why[reason] = why.get(reason, 0) + r["kernel_ns"]
        elif r["launch_bound"]:
            launch += r["kernel_ns"]
        elif n_steps and r["phase"] is None:
            outside += r["kernel_ns"]
        else:
            g = groups.setdefault((r["family"], r["phase"]), FamilyGroup(r["family"], r["phase"]))
            g.calls += r["calls"]
            g.kernel_ns += r["kernel_ns"]
            g.roofline_ns += r["roofline_ns"]
            g.buyable_ns += max(0.0, r["buyable_ns"])
            g.rows.append(r)
            if r["buyable_ns"] < 0:
                faster.append(r)
    first = rows[0] if rows else {}
    return Buyable(
        basis=basis,
        basis_ns=basis_ns,
        phase_ns=phase_ns,
        groups=sorted(groups.values(), key=lambda g: (-g.buyable_ns, g.family, g.phase or "")),
        total_kernel_ns=total,
        linked_kernel_ns=sum(r["kernel_ns"] for r in rows),
        launch_bound_ns=launch,
        no_roofline_ns=no_roof,
        outside_steps_ns=outside,
        faster_than_roofline=faster,
        no_roofline_why=dict(sorted(why.items(), key=lambda kv: -kv[1])),
        gpu=first.get("gpu"),
        peak_source=next((r["peak_source"] for r in rows if r["roofline_ns"] is not None), first.get("peak_source")),
        rows=len(rows),
    )
