"""docs/method.md's worked example for the TP communication account (step 3)."""

from tracediag.model import tpmath


def test_worked_example_h8192_l80_t32_bf16_p4():
    S = 32 * 8192 * 2  # T·H·e_a
    assert S == 524_288 == 512 * 1024
    assert tpmath.allreduce_calls_per_step(80) == 160
    # bus bytes per call: 2(p-1)/p * S
    assert tpmath.allreduce_bus_bytes(S, 4) == 786_432
    assert tpmath.allreduce_bus_bytes(S, 4) * 160 == 120 * 1024**2


def test_allreduce_time_alpha_beta():
    # τ = α + 2(p−1)S/(p·B): 8 µs + 786432 B / 150 GB/s
    t = tpmath.allreduce_time_s(524_288, 4, alpha_s=8e-6, bus_bw_bytes_per_s=150e9)
    assert abs(t - (8e-6 + 786_432 / 150e9)) < 1e-15


def test_negative_intercept_is_clamped_to_zero_latency():
    # calls whose time is pure bandwidth with noise that tilts the robust line below the origin
    S = [1000, 2000, 4000, 8000, 16000, 32000]
    t = [1e-6, 3e-6, 7e-6, 15e-6, 31e-6, 63e-6]  # ≈ −1 µs + S/500 MB/s
    fit = tpmath.fit_alpha_beta(S, t, p=2)
    assert fit.raw_intercept_s < 0 and fit.alpha_clamped and fit.alpha_s == 0
    assert fit.bus_bw_bytes_per_s > 0
