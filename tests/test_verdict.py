"""The verdict, ranking by impact and folding under causes: on every sample trace the verdict names the fault
that was injected into it (sample_traces/README.md), and the logic itself on small hand-made check lists
(check results are data: these are lists of Check objects, not traces)."""

from __future__ import annotations

import pytest
from conftest import sample_report

from tracediag.findings import (
    WINDOW_STEP_TIME,
    Check,
    compact_long_strings,
    coverage,
    fold,
    ranked_findings,
    severity_follows_impact,
    verdict,
)
from tracediag.reports.html import render_html
from tracediag.rules import RULE_MODULES

# sample -> the finding its fault must produce (sample_traces/README.md, "What a diagnosis tool should find")
INJECTED = {
    "delayed_rank_tp2": "COL005",
    "fault_extra_allreduce_tp2": "COL001",
    "fault_fp32_comm_tp2": "COL002",
    "kv_replicated_tp4": "SHP001",
    "math_decode_tp2": "KRN001",
    "w4_dense_tp2": "SHP003",
    "healthy_tp2": "COL003",  # TP=2 is slower than TP=1 at decode: true for gloo on a CPU
}
CLEAN = ("wide_tp2", "healthy_tp1")  # every rule passes (SCH001's description of the split is info)


@pytest.mark.parametrize("name", sorted(INJECTED))
def test_verdict_names_the_injected_fault(name):
    v = sample_report(name).verdict
    rule = INJECTED[name]
    named = [v.get("rule"), *(a["rule"] for a in v.get("also", []))]
    assert v["status"] == "problem", v
    assert rule in named, (name, v)
    html = render_html(sample_report(name))
    verdict_html = html[html.index('id="verdict"') : html.index("</section>")]
    assert rule in verdict_html


@pytest.mark.parametrize("name", ["delayed_rank_tp2", "fault_extra_allreduce_tp2", "fault_fp32_comm_tp2",
                                  "kv_replicated_tp4", "w4_dense_tp2"])  # fmt: skip
def test_the_fault_is_the_primary_cause(name):
    assert sample_report(name).verdict["rule"] == INJECTED[name]


def test_delayed_rank_verdict_names_the_straggler_and_folds_tp_profitability_under_it():
    v = sample_report("delayed_rank_tp2").verdict
    assert v["rule"] == "COL005" and "Rank 1" in v["headline"] and "straggler" in v["headline"]
    # "TP=2 is slower than TP=1" and the per-step stall are context of the straggler, not causes of their own
    assert {"COL003", "SCH001"} <= set(v["explains"])
    assert v["next_check"] and "rank 1" in v["next_check"]
    ranked = [c.rule for c in sample_report("delayed_rank_tp2").findings]
    assert ranked[0] == "COL005"


def test_math_decode_names_the_fallback_next_to_the_larger_tp_cost():
    # COL003 affects every decode step (impact 100 %), the math fallback 4.9 % of decode time: both are causes
    # of their own; the fallback (info: under 5 % of the phase's step time) is named beside the verdict.
    v = sample_report("math_decode_tp2").verdict
    assert v["rule"] == "COL003"
    (also,) = [a for a in v["also"] if a["rule"] == "KRN001"]
    assert also["severity"] == "info" and "math" in also["title"]


@pytest.mark.parametrize("name", CLEAN)
def test_clean_samples_have_no_problem_verdict(name):
    v = sample_report(name).verdict
    assert v["status"] == "no_problem" and v["headline"].startswith("No problem at warning or error")


def test_without_model_the_verdict_says_what_could_not_run():
    v = sample_report("delayed_rank_tp2", with_model=False).verdict
    cov = v["coverage"]
    assert cov["rules"] == len(RULE_MODULES) and cov["ran"] < 10
    (model,) = [g for g in cov["enable"] if g["input"].startswith("--model")]
    assert {"SHP001", "COL001", "COL002"} <= set(model["rules"])
    assert f"{cov['ran']} of {len(RULE_MODULES)} rules ran" in v["coverage_text"]
    assert "pass --model config.json to enable SHP001" in v["coverage_text"]
    assert v["rule"] == "COL005"  # the straggler needs no model: still found


def test_findings_json_carries_the_verdict_and_ranked_findings():
    d = sample_report("w4_dense_tp2").to_dict()
    assert d["verdict"]["rule"] == "SHP003"
    order = [c["rule"] for c in d["findings"]]
    # SHP003 first (impact 1.0, error), KRN003 folded right under it, then the next cause
    assert order[:2] == ["SHP003", "KRN003"]
    steps = [c["step"] for c in d["checks"]]
    assert steps == sorted(steps)  # `checks` stay in walk order; only `findings` are ranked


# --- the logic on hand-made check lists --------------------------------------------------------------------


def _f(rule, impact, severity="warning", step=3, down=(), confidence="high", basis=None, qualifies=()):
    return Check(
        rule, step, "finding", f"{rule} title", severity, confidence, impact, downstream_of=down,
        impact_basis=basis, qualifies=qualifies,
    )  # fmt: skip


W = WINDOW_STEP_TIME  # the basis every trace-side impact is on


def test_ranking_is_by_impact_then_severity():
    checks = [
        _f("A", 0.04, "warning", step=4, basis=W),
        _f("B", 0.44, "info", step=5, basis=W),
        _f("C", 0.44, "error", step=6, basis="requests"),
    ]
    assert [c.rule for c in ranked_findings(checks)] == ["C", "B", "A"]


def test_a_share_of_busy_time_is_never_ranked_against_a_share_of_step_time():
    # the MPI + CUDA saxpy before KRN011 moved: copies at 76 % of GPU busy time (26 % of the window) headed GPU idle
    # at 66 % of the window; a trace impact counts only on the window's basis, and the verdict says what it ranked by
    busy = _f("KRN011", 0.76, "warning", step=5, basis="steady GPU busy time")
    idle = _f("KRN006", 0.66, "warning", step=5, basis=W)
    assert [c.rule for c in ranked_findings([busy, idle])] == ["KRN006", "KRN011"]
    v = verdict([busy, idle])
    assert v["rule"] == "KRN006" and v["cost"] == "66% of the window's step time"
    assert "share of the window's step time" in v["ranked_by"]


def test_a_serving_impact_without_a_basis_ranks_by_severity_below_those_with_one():
    checks = [_f("SCH006", 1.0, "warning", step=6), _f("SCH012", 0.3, "info", step=6, basis="mean TTFT")]
    assert [c.rule for c in ranked_findings(checks)] == ["SCH012", "SCH006"]


def test_a_caveat_never_heads_the_verdict_and_explains_nothing():
    caveat = _f("SCH009", None, "info", step=6, qualifies=("SCH003",))
    checks = [caveat, _f("SCH007", 0.2, "warning", step=6, basis="the engine's median acceptance")]
    v = verdict(checks)
    assert v["rule"] == "SCH007" and v["explains"] == []
    assert v["caveats"] == [
        {"rule": "SCH009", "severity": "info", "impact": None, "cost": "impact unknown", "title": "SCH009 title",
         "qualifies": []}
    ]  # fmt: skip


def test_a_growing_queue_heads_the_verdict_on_a_valid_load_and_step_time_comes_second():
    checks = [
        _f("KRN006", 0.5, "warning", step=5, basis=W),
        _f("SCH003", 0.2, "error", step=6, basis="engines tested"),
        _f("SCH009", None, "info", step=6, qualifies=("SCH003",)),
    ]
    v = verdict(checks)
    assert v["rule"] == "SCH003" and v["second"]["rule"] == "KRN006"
    assert v["caveats"][0]["qualifies"] == ["SCH003"]
    broken = [*checks[:2], _f("SCH009", 0.1, "warning", step=6, basis="requests")]
    assert verdict(broken)["rule"] != "SCH003" and "second" not in verdict(broken)


def test_fold_puts_consequences_under_the_best_ranked_cause():
    checks = [_f("CAUSE", 0.3), _f("X", 1.0, down=("CAUSE",)), _f("Y", 0.9, down=("X", "OTHER")), _f("OTHER", 0.1)]
    folded = {c.rule: [k.rule for k in ks] for c, ks in fold(checks)}
    assert folded == {"CAUSE": ["X", "Y"], "OTHER": []}
    v = verdict(checks)
    assert v["rule"] == "CAUSE" and v["explains"] == ["X", "Y"] and [a["rule"] for a in v["also"]] == ["OTHER"]


def test_an_info_finding_is_context_not_the_verdict():
    checks = [_f("INFO", 0.44, "info", step=5, basis=W), _f("PROBLEM", 0.04, "warning", step=4, basis=W)]
    assert [c.rule for c in ranked_findings(checks)] == ["INFO", "PROBLEM"]  # the list: by impact
    v = verdict(checks)
    assert v["status"] == "problem" and v["rule"] == "PROBLEM"
    assert v["largest_effect"]["rule"] == "INFO"  # far larger: named beside it
    v = verdict([_f("INFO", 1.0, "info"), _f("PROBLEM", 0.99, "warning")])
    assert v["rule"] == "PROBLEM" and "largest_effect" not in v
    v = verdict([_f("INFO", 0.5, "info")])
    assert v["status"] == "no_problem" and v["rule"] == "INFO"


def test_fold_survives_a_cycle_of_links():
    checks = [_f("A", 0.5, down=("B",)), _f("B", 0.7, down=("A",))]
    (cause, consequences), *rest = fold(checks)
    assert not rest and cause.rule == "B" and [c.rule for c in consequences] == ["A"]


def test_severity_follows_impact():
    small = severity_follows_impact(_f("A", 0.004, "error"))
    assert small.severity == "info" and small.rule_severity == "error"
    assert small.to_dict()["rule_severity"] == "error"
    assert severity_follows_impact(_f("B", 0.02, "warning")).severity == "warning"
    assert severity_follows_impact(_f("C", None, "error")).severity == "error"  # no measured effect: unchanged


def test_nothing_ran_is_not_a_clean_result():
    checks = [Check(r, 1, "not_applicable", "t", reason="missing model config (L); pass --model config.json",
                    enable=("--model config.json",)) for r in ("A", "B")]  # fmt: skip
    v = verdict(checks)
    assert v["status"] == "nothing_ran" and "not a clean result" in v["headline"]
    assert coverage(checks)["enable"] == [
        {"input": "--model config.json", "argument": "model", "config_key": None, "rules": ["A", "B"]}
    ]


def test_a_huge_string_is_kept_once():
    huge = "k" * 100_000
    doc = compact_long_strings({"a": [huge, {"b": huge}], "c": "short"})
    assert doc["long_strings"] == [huge] and doc["c"] == "short"
    assert doc["a"][0] == doc["a"][1]["b"] and len(doc["a"][0]) < 300 and "long_strings[0]" in doc["a"][0]


def test_an_undetermined_rule_makes_the_verdict_inconclusive_not_clean():
    checks = [
        _f("SCH006", 1.0, "info"),
        Check("SCH010", 6, "finding", "attainment between 44 % and 95 %", severity="info", impact=0.56,
              undetermined="rerun with per-request results"),
        Check("SCH003", 6, "pass", "no queue"),
    ]  # fmt: skip
    v = verdict(checks)
    assert v["status"] == "inconclusive" and v["rule"] == "SCH010"
    assert v["headline"].startswith("Not decided (SCH010)") and "per-request" in v["next_check"]
    assert v["undetermined"] == [{"rule": "SCH010", "title": "attainment between 44 % and 95 %",
                                  "decide": "rerun with per-request results"}]  # fmt: skip
    assert checks[1].to_dict()["undetermined"] == "rerun with per-request results"
    # a problem still wins, and the open question stays beside it
    v = verdict([*checks, _f("SCH004", 0.3, "warning")])
    assert v["status"] == "problem" and v["rule"] == "SCH004" and v["undetermined"][0]["rule"] == "SCH010"
    assert verdict([_f("SCH006", 1.0, "info")])["status"] == "no_problem"


def test_percentile_bounds_around_the_target_are_inconclusive_on_a_real_bench_result():
    """`vllm bench serve --save-result` at 2 req/s (tests/data/external/vllm/bench): TTFT p50 within 20 ms, p99 over
    it — the percentiles bound joint attainment on both sides of 95 %, so the verdict is not "no problem"."""
    from conftest import REPO

    from tracediag.analysis import analyze
    from tracediag.context import Settings

    bench = REPO / "tests/data/external/vllm/bench/vllm-0.33.0_rate2_save-result.json"
    report = analyze(
        [], extra_inputs=[(bench, "vllm-bench")], settings=Settings(slo_ms=(("ttft", 20.0), ("tpot", 50.0)))
    )
    v = report.verdict
    assert v["status"] == "inconclusive" and v["rule"] == "SCH010", v
    assert "--save-detailed" in v["next_check"]
    html = render_html(report)
    assert "Verdict: not decided" in html and "v-inconclusive" in html
