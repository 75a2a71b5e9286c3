"""The rule contract behind the coverage line: each rule declares the inputs that can let it run
(RuleMeta.enabled_by), its not-applicable reasons name only those, and the coverage generated from the
declarations says what the reasons' wording said before the declarations existed (the reference below), and
names the declared file inputs (--log, --metrics, --bench) of a rule whose run held none of them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import EXTERNAL, sample_report

from tracediag.engine import load_rules
from tracediag.findings import Check, RuleMeta, coverage, named_inputs, not_applicable, option_name

RULES = {m.RULE.id: m.RULE for m in load_rules()}

# The reference: how the coverage line was read from the reasons' wording (a regex over `--option ARG`, the
# first option of analyze/check a reason names) before the rules declared their inputs.
_OPTION = re.compile(r"(--[a-z][a-z0-9-]*)(?:[ =]([\w./=,:*-]+))?")
_WORDED = (
    "--model", "--tp", "--topology", "--nccl-tests", "--tp1-baseline", "--hbm-bandwidth", "--peak-tflops",
    "--slo", "--metrics", "--log", "--bench", "--keep-python",
)  # fmt: skip


def _worded(reason: str | None) -> str | None:
    m = next((m for m in _OPTION.finditer(reason or "") if m.group(1) in _WORDED), None)
    if not m:
        return None
    arg = (m.group(2) or "").rstrip(".,:)")
    shows_value = (arg and any(ch in arg for ch in "./=_")) or (arg.isupper() and len(arg) <= 4)
    return f"{m.group(1)} {arg}" if shows_value else m.group(1)


# files each input option stands for: a rule whose reason names no input, in a run with no file of any of its
# declared file inputs, is enabled by the first of them (a trace-only run: --log for SCH003)
_FILE_KINDS = {
    "--log": {"vllm-log", "sglang-log"},
    "--metrics": {"prometheus"},
    "--bench": {"vllm-bench", "sglang-bench", "aiperf"},
}


def _lacked_files(rule: str, formats: set[str]) -> str | None:
    files = [e for e in RULES[rule].enabled_by if e.split(" ")[0] in _FILE_KINDS]
    if files and not any(_FILE_KINDS[e.split(" ")[0]] & formats for e in files):
        return files[0]
    return None


def _worded_coverage(checks: list[Check], formats: set[str]) -> dict:
    """The coverage block as the reasons' wording gave it, and the file inputs a rule lacked entirely."""
    groups: dict[str, list[str]] = {}
    shown: dict[str, str] = {}
    other = []
    for c in checks:
        if c.status != "not_applicable":
            continue
        opt = _worded(c.reason) or _lacked_files(c.rule, formats)
        if opt is None:
            other.append(c.rule)
            continue
        groups.setdefault(option_name(opt), []).append(c.rule)
        shown[option_name(opt)] = max(shown.get(option_name(opt), ""), opt, key=len)
    return {
        "enable": [{"input": shown[k], "rules": v} for k, v in sorted(groups.items(), key=lambda kv: -len(kv[1]))],
        "not_applicable_to_inputs": other,
    }


def _reports():
    from tracediag.analysis import analyze

    yield "healthy_tp2", sample_report("healthy_tp2")
    yield "delayed_rank_tp2 without --model", sample_report("delayed_rank_tp2", with_model=False)
    yield "w4_dense_tp2", sample_report("w4_dense_tp2")
    for name, kind in (
        ("vllm/log_excerpts/vllm-37307_v1_2026-03_waiting_drains_under_prefill.log", "vllm-log"),
        ("vllm/metrics/production-stack-617_vllm0.10.0_v1_engine_label_excerpt.prom", "prometheus"),
        ("vllm/bench/vllm-0.33.0_rate2_save-result.json", "vllm-bench"),
    ):
        yield name, analyze([], extra_inputs=[(EXTERNAL / name, kind)])


REPORTS = None


def _all_reports():
    global REPORTS
    if REPORTS is None:
        REPORTS = list(_reports())
    return REPORTS


def test_coverage_from_declarations_is_what_the_reasons_said():
    for name, report in _all_reports():
        cov = coverage(report.checks)
        worded = _worded_coverage(report.checks, {i["format"] for i in report.inputs})
        assert [{k: e[k] for k in ("input", "rules")} for e in cov["enable"]] == worded["enable"], name
        assert cov["not_applicable_to_inputs"] == worded["not_applicable_to_inputs"], name
        assert report.to_dict()["verdict"]["coverage"] == cov, name


def test_every_reason_names_only_declared_inputs():
    seen = 0
    for name, report in _all_reports():
        for c in report.checks:
            if c.status != "not_applicable":
                continue
            named = {m.group(1) for m in _OPTION.finditer(c.reason or "") if m.group(1) in _WORDED}
            declared = {option_name(e) for e in RULES[c.rule].enabled_by}
            assert named <= declared, (name, c.rule, c.reason, RULES[c.rule].enabled_by)
            seen += bool(named)
    assert seen >= 10  # the reports hold reasons that name an input, so the check above judged something


def test_declared_inputs_are_options_of_analyze():
    import typer

    from tracediag.cli import app

    analyze = typer.main.get_command(app).commands["analyze"]
    names = {opt for p in analyze.params for opt in getattr(p, "opts", [])}
    declared = {option_name(e) for meta in RULES.values() for e in meta.enabled_by}
    assert declared <= names, declared - names


def test_model_and_tp_are_derived_and_first():
    shp001 = RULES["SHP001"]
    assert shp001.requires_model and shp001.requires_tp
    assert shp001.enabled_by[:2] == ("--model config.json", "--tp N")
    assert RULES["PATH001"].enabled_by == ("--topology topo.json",)
    both = RuleMeta(id="X", step=1, title="t", requires_model=("H",), enabled_by=("--bench", "--model cfg.json"))
    assert both.enabled_by == ("--bench", "--model cfg.json")  # a declared form of --model replaces the derived one


@pytest.mark.parametrize(
    ("reason", "enable"),
    [
        ("missing model config (H); pass --model config.json", ("--model config.json",)),
        ("missing a reference FLOP rate: pass --tp1-baseline or --peak-tflops", ("--tp1-baseline", "--peak-tflops")),
        ("missing the degree; pass --tp N", ("--tp N",)),
        ("p = 1 (single process): no sharded projections", ()),
    ],
)
def test_named_inputs_match_whole_options(reason, enable):
    both = ("--tp1-baseline", "--peak-tflops")
    meta = RuleMeta(id="X", step=5, title="t", requires_model=("H",), requires_tp=True, enabled_by=both)
    assert named_inputs(meta, reason) == enable  # "--tp" is not "--tp1-baseline"
    assert not_applicable(meta, reason).enable == enable
    assert "enable" not in not_applicable(meta, reason).to_dict()  # findings.json's checks are unchanged


def test_docs_list_each_rules_enabling_inputs():
    text = (Path(__file__).resolve().parents[1] / "docs" / "rules.md").read_text()
    for meta in RULES.values():
        if meta.enabled_by:
            assert f"Enabled by: {', '.join(f'`{e}`' for e in meta.enabled_by)}." in text, meta.id
