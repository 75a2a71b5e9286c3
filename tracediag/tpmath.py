"""Tensor-parallel communication accounting (RULEBOOK step 3, the seed's "TP article").

Megatron-style TP runs 2 all-reduces per layer per forward step, each with logical payload
S = T·H·e_a bytes; the bus-equivalent bytes per call are V_AR = 2(p−1)/p·S (the nccl-tests bus
bandwidth factor) and per step V_step = 4L·(p−1)/p·T·H·e_a.
"""

from __future__ import annotations


def allreduce_payload_bytes(T: int, H: int, e_a: int) -> int:
    """S = T·H·e_a: bytes of the [T, H] activation one all-reduce sums."""
    return T * H * e_a


def allreduce_bus_bytes(S: float, p: int) -> float:
    """V_AR = 2(p−1)/p · S."""
    return 2 * (p - 1) / p * S


def allreduce_calls_per_step(L: int) -> int:
    """2L: one after attention, one after the MLP, per layer."""
    return 2 * L


def step_bus_bytes(L: int, p: int, T: int, H: int, e_a: int) -> float:
    """V_step = 4L·(p−1)/p·T·H·e_a, bytes per rank per step."""
    return 4 * L * (p - 1) / p * T * H * e_a


def allreduce_time_s(S: float, p: int, alpha_s: float, bus_bw_bytes_per_s: float) -> float:
    """τ_AR(S, p) ≈ α_p + 2(p−1)S/(p·B_p)."""
    return alpha_s + allreduce_bus_bytes(S, p) / bus_bw_bytes_per_s
