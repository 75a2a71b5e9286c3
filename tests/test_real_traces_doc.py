"""docs/real_traces.md is current, tracediag's counts agree with an independent count of each real GPU trace, and
every rule that says "not applicable" on one of them says so because the trace truly lacks that input."""

from __future__ import annotations

import functools
import re

import pytest
import real_traces
from conftest import REPO

from tracediag.analysis import analyze
from tracediag.findings import RANKED_BY, TRACE_TIME_STEPS, WINDOW_BASES, on_window_basis

DOC = REPO / "docs" / "real_traces.md"
GEMM_NAME = re.compile(r"gemm|Cijk_|nvjet|xmma|cutlass.*(?:gemm|Gemm)|matmul", re.I)


@functools.cache
def _report(path: str):
    return analyze([path]).to_dict()


@functools.cache
def _inventory(path: str) -> real_traces.Inventory:
    return real_traces.inventory(real_traces.Path(path))


def test_doc_is_current():
    got = real_traces.render(lambda p: _report(str(p))["checks"], lambda p: _report(str(p))["fitness"])
    assert DOC.read_text() == got, "regenerate: python tests/real_traces.py > docs/real_traces.md"


@pytest.mark.parametrize("path", real_traces.TRACES, ids=lambda p: p.name)
def test_tracediag_counts_match_the_independent_count(path):
    (inp,) = _report(str(path))["inputs"]
    inv = _inventory(str(path))
    assert inp["counts"]["kernels"] == inv.kernels
    if inv.format == "kineto":
        assert inp["counts"]["cpu_ops"] == inv.cpu_ops
    assert len(inp["ranks"]) == max(inv.ranks, 1)


def _truly_absent(reason: str, inv: real_traces.Inventory, path) -> bool:
    """The input the reason says is missing is not in the file (by the independent count)."""
    no_input_given = (
        "missing model config",
        "missing topology snapshot",
        "missing nccl-tests output",
        "missing SLO budgets",
        "missing queue series",
        "missing KV-cache usage",
        "missing prefix-cache statistics",
        "missing speculative-decoding statistics",
        "missing benchmark results",
        "missing two independent measurements",
        "missing per-request inter-token latencies",
        "missing a gap budget",
        "missing request counts over time",
        "missing TTFT histogram",
        "missing a second data-parallel engine",
    )
    if reason.startswith(no_input_given):
        return True  # no --model / --topology / --nccl-tests / telemetry was given
    names = _kernel_names(str(path))
    expected = real_traces.expected_window(inv)
    checks = {
        # the window fitness (tracediag/derive/fitness.py) from the independent counts
        "window unfit: too short": expected == "too_short",
        "window unfit: GPU events stripped": expected == "gpu_stripped",
        "window unfit: sampled": expected == "sampled",
        "window unfit: start-up only": expected == "startup_only",
        "window unfit: a graph capture": expected == "graph_capture",
        "missing decoding requests": inv.engine_step_annotations > 0 and inv.decoding_step_annotations == 0,
        "missing GPU memory copies": inv.gpu_copies == 0,
        # the summed GPU time bounds the steady segment's busy union: under 1 ms in all, under 1 ms steady
        "missing steady GPU work": inv.gpu_time_ns < 1_000_000,
        "missing collective calls: none in the trace": inv.collective_kernels == 0,
        "missing collective kernels": inv.collective_kernels == 0,
        "missing attention": inv.attention_kernels == 0,
        "missing other ranks": inv.ranks == 1,
        "missing inference steps: a training job": inv.backward_or_optimizer_events > 0
        and inv.engine_step_annotations == 0,
        "missing phase: no step carries an engine step annotation": inv.engine_step_annotations == 0,
        # SCH001 on an encoder's or a vision model's forward passes: the independent label is no LLM
        "missing LLM steps: the workload is": inv.engine_step_annotations == 0
        and not real_traces.expected_domain(inv).startswith(("LLM", "non-LLM")),
        "missing GEMM kernels": not any(GEMM_NAME.search(n) for n in names),
        "missing GEMM input shapes": inv.gemm_ops_with_shapes == 0,
        "missing runtime": inv.runtime_calls == 0,
        "missing GPU kernels": inv.kernels == 0,
        "missing CPU ops that launched the kernels": inv.kernels_linked_to_ops == 0,
        "missing input shapes": inv.ops_with_shapes == 0,
        # GEMMs are the ops with a cost that carry time: with under 5 % of the kernel time in GEMM ops with shapes,
        # whatever has a cost is launch-bound or negligible
        "missing an op with a cost": inv.gemm_kernel_share < 0.05,
        "missing GPU work inside engine steps": inv.runtime_calls == 0,
        "missing GPU or CPU work inside engine steps": inv.runtime_calls == 0 and inv.cpu_ops <= 1,
    }
    for prefix, ok in checks.items():
        if reason.startswith(prefix):
            return ok
    if reason.startswith("p = 1"):
        return inv.ranks == 1 or inv.backward_or_optimizer_events > 0 or "all-reduce" not in reason
    return False


@functools.cache
def _kernel_names(path: str) -> frozenset[str]:
    return frozenset(real_traces.kernel_names(real_traces.Path(path)))


@pytest.mark.parametrize("path", real_traces.TRACES, ids=lambda p: p.name)
def test_not_applicable_only_when_the_input_is_absent(path):
    inv = _inventory(str(path))
    bad = [
        (c["rule"], c["reason"])
        for c in _report(str(path))["checks"]
        if c["status"] == "not_applicable" and not _truly_absent(c["reason"], inv, path)
    ]
    assert not bad


@pytest.mark.parametrize("path", real_traces.TRACES, ids=lambda p: p.name)
def test_window_class_matches_the_independent_count(path):
    """The class tracediag gives the window is the one the file's own counts call for (sampling gaps, GPU events
    present, event count, kernels after start-up); steady and clipped differ by where launches fall, not by count.
    The counts bound the start-up segment from above (the first kernel, or the end of the last slow host call before
    the last kernel, whichever is later): below 75 % of the span the window cannot be mostly start-up."""
    got = _report(str(path))["fitness"]["class"]
    want = real_traces.expected_window(_inventory(str(path)))
    either = {
        "steady or clipped": ("steady", "clipped"),
        "steady, clipped or startup_dominated": ("steady", "clipped", "startup_dominated"),
    }
    assert got in either.get(want, (want,))


@pytest.mark.parametrize("path", real_traces.TRACES, ids=lambda p: p.name)
def test_domain_matches_the_independent_count(path):
    """The workload label (tracediag/derive/domain.py) is the one the file's own counts call for: training vs
    inference, LLM vs recommender vs vision vs other."""
    got = _report(str(path))["fitness"]["domain"]["label"]
    assert got == real_traces.expected_domain(_inventory(str(path)))


@pytest.mark.parametrize("path", real_traces.TRACES, ids=lambda p: p.name)
def test_cold_launches_are_first_launches_by_the_independent_count(path):
    """KRN010 counts a slow launch as start-up only when it is its kernel's first launch in the process; slow
    launches of kernels that ran before (counted from the file) are set apart, never counted as cold."""
    (c,) = [c for c in _report(str(path))["checks"] if c["rule"] == "KRN010"]
    if c["status"] == "not_applicable":
        return
    inv = _inventory(str(path))
    cold = [e for e in c["evidence"] if e["kind"].startswith("kernel launch")]
    assert len(cold) <= inv.slow_first_launches
    assert all(e.get("first_launch_of_kernel") for e in cold)
    assert c["values"]["slow_repeat_launches"] <= inv.slow_repeat_launches


@pytest.mark.parametrize("path", real_traces.TRACES, ids=lambda p: p.name)
def test_steps_without_a_phase_are_named_by_what_the_trace_holds(path):
    """KRN006 calls steps with no phase training steps only in a training job, and says the trace has no attention
    kernel only when the independent count finds none."""
    (c,) = [c for c in _report(str(path))["checks"] if c["rule"] == "KRN006"]
    if c["status"] == "not_applicable":
        return
    inv = _inventory(str(path))
    assert "unknown phase" not in c["title"]
    if "training step" in c["title"]:
        assert inv.backward_or_optimizer_events > 0
    if "no attention kernel in the trace" in c["title"]:
        assert inv.attention_kernels == 0


@pytest.mark.parametrize("path", real_traces.TRACES, ids=lambda p: p.name)
def test_every_trace_impact_is_a_share_of_the_window(path):
    """One basis: each trace finding's impact is a share of the window's step time (KRN010's too: the cold work inside
    the window; its share of the whole trace is shown beside it), and the verdict says what it ranked by."""
    report = _report(str(path))
    off_basis = [
        (c["rule"], c.get("impact_basis"))
        for c in report["checks"]
        if c["status"] == "finding" and c["step"] in TRACE_TIME_STEPS and not on_window_basis(c)
    ]
    assert not off_basis, off_basis
    v = report["verdict"]
    assert v["ranked_by"] == RANKED_BY
    if v.get("rule") and v["rule"].startswith(("KRN", "COL004", "COL005")):
        assert v["impact_basis"] in WINDOW_BASES, v
