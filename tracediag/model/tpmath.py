"""Tensor-parallel communication accounting and the break-even T* (docs/method.md, step 3).

Megatron-style TP runs 2 all-reduces per layer per forward step, each with logical payload
S = T·H·e_a bytes; the bus-equivalent bytes per call are V_AR = 2(p−1)/p·S (the nccl-tests bus
bandwidth factor) and per step V_step = 4L·(p−1)/p·T·H·e_a.

Sequence-parallel variant (Megatron SP): each all-reduce becomes a reduce-scatter after the row-parallel
GEMM and an all-gather before the next column-parallel one, each moving (p−1)/p·S bus bytes (nccl-tests'
factor for both). Per step: 4L calls, the same V_step — twice the calls, so twice the fixed latency α.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tracediag.model.fitting import LineFit, theil_sen


def allreduce_bus_bytes(S: float, p: int) -> float:
    """V_AR = 2(p−1)/p · S."""
    return 2 * (p - 1) / p * S


def allreduce_calls_per_step(L: int) -> int:
    """2L: one after attention, one after the MLP, per layer."""
    return 2 * L


def allreduce_time_s(S: float, p: int, alpha_s: float, bus_bw_bytes_per_s: float) -> float:
    """τ_AR(S, p) ≈ α_p + 2(p−1)S/(p·B_p)."""
    return alpha_s + allreduce_bus_bytes(S, p) / bus_bw_bytes_per_s


# --- Projection compute and TP profitability: when TP=p beats TP=1 (docs/method.md, COL003) -------------


def proj_flops_per_layer(T: float, H: int, I: int, H_KV: int) -> float:  # noqa: E741 (docs/method.md's symbol)
    """F_proj = 4T(H² + H·H_KV) + 6T·H·I: Q/K/V/O and the three SwiGLU projections, 2 FLOPs per multiply-add.

    H_KV is the *width* of the K/V projection (H_kv·D), not the KV head count.
    """
    return 4 * T * (H * H + H * H_KV) + 6 * T * H * I


def breakeven_denominator(
    a_s: float,
    p: int,
    L: int,
    H: int,
    e_a: int,
    bus_bw_bytes_per_s: float | None,
    bus_bytes_per_token: float | None = None,
) -> float:
    """a(1 − 1/p) − 4L·(p−1)/p·H·e_a/B_p: compute saved per token minus bus time added per token.

    B_p = None means the bandwidth term was not resolved (latency-bound data): it is taken as 0, which
    makes T* a lower bound. `bus_bytes_per_token` replaces 4L·(p−1)/p·H·e_a (another collective scheme).
    """
    per_token = 4 * L * (p - 1) / p * H * e_a if bus_bytes_per_token is None else bus_bytes_per_token
    bw_term = 0.0 if bus_bw_bytes_per_s is None else per_token / bus_bw_bytes_per_s
    return a_s * (1 - 1 / p) - bw_term


def breakeven_tokens(
    L: int,
    alpha_s: float,
    a_s: float,
    p: int,
    H: int,
    e_a: int,
    bus_bw_bytes_per_s: float | None,
    calls_per_step: int | None = None,
    bus_bytes_per_token: float | None = None,
) -> float | None:
    """T* = 2L·α_p / (a(1−1/p) − 4L·(p−1)/p·H·e_a/B_p); None when the denominator is not positive
    (the bandwidth term alone eats the ideal compute saving: no T benefits from TP=p).

    Another scheme gives its own calls per step and bus bytes per token: sequence parallelism
    `calls_per_step = 4L` with the same 4L·(p−1)/p·H·e_a — T* doubles. T* is optimistic (ideal 1/p compute,
    t_other ignored): decode T below it is a sound finding, T above it proves nothing."""
    den = breakeven_denominator(a_s, p, L, H, e_a, bus_bw_bytes_per_s, bus_bytes_per_token)
    if den <= 0:
        return None
    n = allreduce_calls_per_step(L) if calls_per_step is None else calls_per_step
    return n * alpha_s / den


# --- Robust straight-line fits (numpy only) ----------------------------------------------------------------


MIN_R2_FOR_BANDWIDTH = 0.25  # below this the per-byte term explains too little of the call times to report B


@dataclass(frozen=True)
class AlphaBetaFit:
    """τ = α + V_AR/B over all-reduce calls of one group size p."""

    p: int
    alpha_s: float  # fixed latency per call, seconds
    bus_bw_bytes_per_s: float | None  # B_p; None when the per-byte cost is not resolved (latency-bound data)
    line: LineFit  # the robust fit of τ (s) against V_AR (bytes), before the latency-only fallback
    min_payload_bytes: int
    max_payload_bytes: int
    latency_only: bool = False  # True: B unresolved, α = median call time
    alpha_clamped: bool = False  # True: the robust intercept was negative (unphysical); α = 0, B through the origin
    raw_intercept_s: float | None = None  # the fitted intercept before clamping, seconds

    def time_s(self, S: float) -> float:
        """τ_AR(S, p) with the fitted α and B (bandwidth term 0 when B is unresolved)."""
        if self.bus_bw_bytes_per_s is None:
            return self.alpha_s
        return allreduce_time_s(S, self.p, self.alpha_s, self.bus_bw_bytes_per_s)


def fit_alpha_beta(
    payload_bytes, seconds, p: int, min_r2: float = MIN_R2_FOR_BANDWIDTH, bus_bytes=None
) -> AlphaBetaFit | None:
    """Fit τ = α + 2(p−1)/p·S/B robustly; None with fewer than two distinct payload sizes.

    `bus_bytes` (per call) replaces 2(p−1)/p·S when the calls are not all-reduces (reduce-scatter and
    all-gather: (p−1)/p·S each), so one fit covers a sequence-parallel run's calls.

    When the fitted per-byte cost is not positive, or the line explains less than `min_r2` of the
    variance of the call times (R²), the data are latency-bound over the payloads seen: B is reported
    as unresolved (None) and α is the median call time.
    """
    S = np.asarray(payload_bytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    V_all = allreduce_bus_bytes(S, p) if bus_bytes is None else np.asarray(bus_bytes, dtype=float)
    line = theil_sen(V_all, t)
    if line is None:
        return None
    resolved = line.slope > 0 and line.r2 is not None and line.r2 >= min_r2
    alpha, slope, clamped = line.intercept, line.slope, False
    if resolved and alpha < 0:
        # A negative fixed latency is not physical (noise, or a few very large calls pulling the line):
        # α = 0 and the per-byte cost is the median of τ/V_AR over the calls, a fit through the origin.
        V = V_all
        ratios = t[V > 0] / V[V > 0]
        alpha, slope, clamped = 0.0, float(np.median(ratios)), True
    return AlphaBetaFit(
        p=p,
        alpha_s=alpha if resolved else float(np.median(t)),
        bus_bw_bytes_per_s=1 / slope if resolved else None,
        line=line,
        min_payload_bytes=int(S.min()),
        max_payload_bytes=int(S.max()),
        latency_only=not resolved,
        alpha_clamped=clamped,
        raw_intercept_s=line.intercept,
    )
