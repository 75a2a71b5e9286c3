"""COL003's math: the speed-up table and T* of docs/method.md (step 3), the robust α–β fit, and the rule on
real traces (TP=1 baseline, its rejection, the pass branch)."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import EXTERNAL, SAMPLES

from tracediag.analysis import analyze
from tracediag.context import Settings
from tracediag.ingest.base import IngestOptions
from tracediag.ingest.nccl_tests import parse_nccl_tests
from tracediag.model import tpmath

# docs/method.md's check of the break-even (step 3, COL003): all of it assumptions, not measurements
EXAMPLE = {
    "L": 80,
    "H": 8192,
    "I": 28672,
    "H_KV": 1024,
    "e_a": 2,
    "flops_per_s": 120e12,
    "alpha_s": 8e-6,
    "bus_bw_bytes_per_s": 150e9,
}


def seconds_per_token_tp1(L: int, H: int, I: int, H_KV: int, flops_per_s: float) -> float:  # noqa: E741
    """a = L·F_proj/(T·peak) from a nominal FLOP rate, as docs/method.md's check takes it (the rule never takes
    a from a peak: it measures it); here the oracle's input."""
    return L * tpmath.proj_flops_per_layer(1, H, I, H_KV) / flops_per_s


def tp_speedup(T: float, p: int, *, L, H, I, H_KV, e_a, flops_per_s, alpha_s, bus_bw_bytes_per_s) -> float:  # noqa: E741
    """The cost-model enumeration of docs/method.md's check: t_1/t_p with t_p = t_1/p + 2L·τ_AR(T·H·e_a, p)
    (ideal 1/p compute, the rest of the step ignored): the oracle T* must agree with."""
    t1 = L * tpmath.proj_flops_per_layer(T, H, I, H_KV) / flops_per_s
    if p == 1:
        return 1.0
    tp = t1 / p + 2 * L * tpmath.allreduce_time_s(T * H * e_a, p, alpha_s, bus_bw_bytes_per_s)
    return t1 / tp


@pytest.mark.parametrize(
    ("T", "expected"),
    [
        (1, (0.61, 0.72, 0.79)),
        (4, (1.26, 1.81, 2.31)),
        (8, (1.53, 2.42, 3.42)),  # docs/method.md quotes T = 1, 4, 32 only
        (16, (1.71, 2.91, 4.51)),  # not quoted
        (32, (1.82, 3.25, 5.35)),
    ],
)
def test_method_speedup_table(T, expected):
    got = tuple(round(tp_speedup(T, p, **EXAMPLE), 2) for p in (2, 4, 8))
    assert got == expected


def test_projection_flops_and_a():
    # F_proj = 4T(H² + H·H_KV) + 6T·H·I with H_KV the K/V projection width (H_kv·D = 8·128 = 1024)
    assert tpmath.proj_flops_per_layer(1, 8192, 28672, 1024) == 1_711_276_032
    a = seconds_per_token_tp1(80, 8192, 28672, 1024, 120e12)
    assert round(a * 1e3, 3) == 1.141  # ms per token


def test_breakeven_tokens_method_example():
    a = seconds_per_token_tp1(80, 8192, 28672, 1024, 120e12)
    got = [round(tpmath.breakeven_tokens(80, 8e-6, a, p, 8192, 2, 150e9), 2) for p in (2, 4, 8)]
    assert got == [2.31, 1.54, 1.32]


@pytest.mark.parametrize("p", [2, 4, 8])
def test_breakeven_is_where_the_speedup_crosses_one(p):
    a = seconds_per_token_tp1(80, 8192, 28672, 1024, 120e12)
    t_star = tpmath.breakeven_tokens(80, 8e-6, a, p, 8192, 2, 150e9)
    assert tp_speedup(t_star, p, **EXAMPLE) == pytest.approx(1.0, rel=1e-9)


def test_non_positive_denominator_means_no_t_benefits():
    a = seconds_per_token_tp1(80, 8192, 28672, 1024, 120e12)
    # bus bandwidth so low that 4L(p−1)/p·H·e_a/B ≥ a(1−1/p): with p = 2, B ≤ 4·80·0.5·8192·2 / (a/2)
    b_zero = 4 * 80 * 0.5 * 8192 * 2 / (a * 0.5)
    assert tpmath.breakeven_denominator(a, 2, 80, 8192, 2, b_zero) == pytest.approx(0.0, abs=1e-15)
    assert tpmath.breakeven_tokens(80, 8e-6, a, 2, 8192, 2, b_zero * 0.999) is None
    assert tpmath.breakeven_tokens(80, 8e-6, a, 2, 8192, 2, 4e9) is None
    # and the model agrees: at that bandwidth TP=2 loses at every T
    slow = EXAMPLE | {"bus_bw_bytes_per_s": 4e9}
    assert all(tp_speedup(T, 2, **slow) < 1 for T in (1, 32, 1024, 65536))
    # an unresolved bandwidth term counts as 0: T* = 2Lα / (a(1−1/p))
    assert tpmath.breakeven_tokens(80, 8e-6, a, 2, 8192, 2, None) == pytest.approx(2 * 80 * 8e-6 / (a / 2))


def test_alpha_beta_exact_and_latency_only():
    S = np.array([2**k for k in range(10, 25)], dtype=float)
    tau = [tpmath.allreduce_time_s(s, 4, 8e-6, 150e9) for s in S]
    fit = tpmath.fit_alpha_beta(S, tau, 4)
    assert fit.alpha_s == pytest.approx(8e-6) and fit.bus_bw_bytes_per_s == pytest.approx(150e9)
    assert not fit.latency_only and fit.line.r2 == pytest.approx(1.0)
    flat = tpmath.fit_alpha_beta([1024, 1024, 24576, 24576], [3e-4, 3.2e-4, 3.1e-4, 2.9e-4], 2)
    assert flat.latency_only and flat.bus_bw_bytes_per_s is None
    assert flat.alpha_s == pytest.approx(3.05e-4) and flat.time_s(1e9) == flat.alpha_s


def test_alpha_beta_on_the_real_h100_nccl_tests_table():
    path = EXTERNAL / "nccl-tests" / "h100x2_all_reduce_perf.txt"
    rows = [
        r
        for r in parse_nccl_tests(path, 0, IngestOptions()).tables["nccl_tests"].to_pylist()
        if r["placement"] == "out-of-place"
    ]
    fit = tpmath.fit_alpha_beta([r["size_bytes"] for r in rows], [r["time_ns"] / 1e9 for r in rows], 2)
    # 21 sizes, 1 KiB .. 1 GiB: ~15 µs latency, ~330 GB/s bus bandwidth (the table's busbw tops at 358)
    assert 10e-6 < fit.alpha_s < 25e-6 and 300e9 < fit.bus_bw_bytes_per_s < 360e9 and fit.line.r2 > 0.99


# --- the rule on real traces ---------------------------------------------------------------------------------


def _col003(name="healthy_tp2", **settings):
    d = SAMPLES / name
    r = analyze(
        [d],
        model=d / "config.json",
        settings=Settings(**settings) if settings else None,
        extra_rules=["tracediag.rules.step3_collectives.col003_alpha_beta_breakeven"],
    )
    (c,) = [c for c in r.checks if c.rule == "COL003"]
    return c


def test_healthy_tp2_reports_alpha_fit_and_buckets():
    c = _col003()
    v = c.values
    assert c.status == "finding" and v["a_is_estimate"] is True and "(a estimated)" in c.title
    assert v["fit_distinct_payloads"] == 2 and v["fit_payload_range_bytes"] == [1024, 24576]
    assert v["bus_bw_gbs"] is None and "latency-bound" in v["bus_bw_note"]  # gloo on CPU: flat in payload
    assert v["call_times_from"].startswith("shortest rank's time")
    buckets = {(r["T_bucket"], r["phase"]): r for r in c.table}
    assert set(buckets) == {("2", "decode"), ("48", "prefill")}
    assert buckets[("2", "decode")]["observed_allreduce_calls"] == 9  # 2L + 1
    # per-step model 2L·τ = 8·α
    assert buckets[("2", "decode")]["model_comm_ns"] == pytest.approx(8 * v["alpha_us"] * 1e3, rel=1e-6)


def test_tp1_baseline_measures_a():
    c = _col003(tp1_baseline=str(SAMPLES / "healthy_tp1"))
    assert c.values["a_is_estimate"] is False and c.values["a_source"].startswith("TP=1 baseline")
    assert c.confidence in ("high", "medium") and "(a estimated)" not in c.title


@pytest.mark.parametrize(
    ("baseline", "why"),
    [
        (SAMPLES / "healthy_tp2" / "rank0.pt.trace.json.gz", "is not a TP=1 trace"),
        (EXTERNAL / "kineto" / "tracelens_h100_hf_qwen1.5-0.5b.json.gz", "another model"),
    ],
)
def test_wrong_baselines_fall_back_to_the_estimate(baseline, why):
    c = _col003(tp1_baseline=str(baseline))
    assert c.values["a_is_estimate"] is True and any(why in n for n in c.values["a_notes"])


def test_pass_when_decode_t_is_above_t_star(monkeypatch):
    # Stub: a projection slope 100× the trace's (as a wider model would have); the fit is the real one.
    from tracediag.rules.step3_collectives import col003_alpha_beta_breakeven as rule

    monkeypatch.setattr(rule, "estimate_a", lambda ctx, p: (5e-3, "stub", True, [], 0.0))
    c = _col003()
    assert c.status == "pass" and c.values["T_star"] < 2 and "above the break-even" in c.title


def test_the_fixed_gemm_time_tp_divides_is_counted_before_calling_tp_slower(monkeypatch):
    # The real fit gives the warning (median decode T below T*, c = the fit's own intercept). On a GPU decode the
    # GEMM time at T -> 0 is the weight reads, which TP divides too: with a fixed part c large enough that
    # c(1 - 1/p) exceeds 2L·alpha, TP=p is not slower at any T seen, so "slower" is not claimed (info, not decided).
    from tracediag.rules.step3_collectives import col003_alpha_beta_breakeven as rule

    base = _col003()
    assert base.severity == "warning" and base.values["share_slower_with_c"] > 0.5
    two_l_alpha = 2 * base.values["L"] * base.values["alpha_us"] * 1e-6
    a = base.values["a_ms_per_token"] / 1e3
    c_big = 4 * two_l_alpha  # saved: c(1 - 1/2) = 2 x 2L·alpha
    monkeypatch.setattr(rule, "estimate_a", lambda ctx, p: (a, "stub", True, [], c_big))
    c = _col003()
    assert c.status == "finding" and c.severity == "info" and "not decided" in c.title
    assert c.values["T_star"] == pytest.approx(base.values["T_star"], rel=1e-3)  # the per-token model's T* still shown
    assert c.values["share_slower_with_c"] <= 0.5 and c.values["c_fixed_gemm_ms_per_step"] == round(c_big * 1e3, 6)


# ------------------------------------------------------------------ sequence-parallel variant


def test_sequence_parallel_variant_same_bus_bytes_twice_the_calls():
    # docs/method.md's worked example: H = 8192, L = 80, T = 32, bf16, p = 4
    L, H, T, e, p = 80, 8192, 32, 2, 4
    # 2L all-reduces of V_AR = 2(p−1)/p·S, or 2L reduce-scatters + 2L all-gathers of (p−1)/p·S each: 120 MiB a step
    S = T * H * e
    assert tpmath.allreduce_calls_per_step(L) * tpmath.allreduce_bus_bytes(S, p) == 120 * 2**20
    assert 2 * L * 2 * (p - 1) / p * S == 120 * 2**20
    # T* with docs/method.md's numbers (a = 1.141 ms/token, α = 8 µs, 150 GB/s): 1.54 for all-reduces; the same
    # denominator with twice the calls doubles it
    a, alpha, B = 1.141e-3, 8e-6, 150e9
    ar = tpmath.breakeven_tokens(L, alpha, a, p, H, e, B)
    sp = tpmath.breakeven_tokens(L, alpha, a, p, H, e, B, calls_per_step=4 * L)
    assert round(ar, 2) == 1.54 and sp == pytest.approx(2 * ar)
