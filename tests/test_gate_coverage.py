"""An honest gate: `tracediag check` says how many rules ran, warns without --model, and with --require (or
the `require` config key) is inconclusive (exit 4) when a rule that must run could not, naming it and why."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET

import typer
from conftest import SAMPLES
from typer.testing import CliRunner

from tracediag.cli import check as check_cmd
from tracediag.rules import RULE_MODULES

FP32 = SAMPLES / "fault_fp32_comm_tp2"


N = len(RULE_MODULES)  # every registered rule is selected by default


def cli(*args):
    app = typer.Typer(add_completion=False, pretty_exceptions_enable=False)

    @app.callback()
    def _main() -> None:
        """tracediag (commands under test)."""

    check_cmd.register(app)
    return CliRunner().invoke(app, [str(a) for a in args])


def last_line(text: str) -> str:
    return [line for line in text.splitlines() if line.strip()][-1]


def test_faulty_sample_without_model_is_not_an_unqualified_pass(tmp_path):
    r = cli("check", FP32, "--junit", tmp_path / "j.xml", "-j", "1")
    assert r.exit_code == 0, r.stdout  # nothing that ran found a problem at warning or above...
    line = last_line(r.stdout)
    # ... but the verdict line says so only with the coverage: COL002, which would find the fp32 upcast, did not run
    m = re.search(rf"(\d+) of {N} rules ran; (\d+) could not run", line)
    assert line.startswith("PASSED") and m and int(m[1]) + int(m[2]) == N and int(m[1]) < N // 3, line
    ran = int(m[1])
    assert "pass --model config.json" in line
    assert re.search(rf"warning: no --model given: \d+ of {N} selected rules could not run \(SHP001", r.stderr)
    assert "COL002" in r.stderr
    root = ET.parse(tmp_path / "j.xml").getroot()
    cases = {tc.get("name").split(" ", 1)[0]: tc for tc in root.iter("testcase")}
    skipped = cases["COL002"].find("skipped")
    assert skipped is not None and "pass --model config.json" in skipped.get("message")
    props = {p.get("name"): p.get("value") for p in root.iter("property")}
    assert props["coverage"].startswith(f"{ran} of {N} rules ran")


def test_require_is_inconclusive_when_required_rules_could_not_run(tmp_path):
    out = tmp_path / "out"
    r = cli("check", FP32, "--require", "SHP*,COL*", "--junit", tmp_path / "j.xml", "-o", out, "-j", "1")
    assert r.exit_code == 4, r.stdout  # nothing that ran failed, but the check cannot say the run is fine
    line = last_line(r.stdout)
    assert line.startswith("INCONCLUSIVE: ") and "required rule(s) could not run: SHP001, SHP002" in line, line
    assert "skip  COL002: required, but could not run: missing model config (H); pass --model config.json" in r.stdout
    root = ET.parse(tmp_path / "j.xml").getroot()
    cases = {tc.get("name").split(" ", 1)[0]: tc for tc in root.iter("testcase")}
    assert cases["SHP001"].find("failure") is None  # skipped with its reason, not failed and not passed
    skipped = cases["SHP001"].find("skipped")
    assert skipped is not None and skipped.get("message").startswith("required rule could not run (check inconclusive)")
    assert "pass --model config.json" in skipped.get("message")
    assert cases["KRN001"].find("skipped") is None and cases["KRN001"].find("failure") is None  # ran and passed
    assert {p.get("name"): p.get("value") for p in root.iter("property")}["outcome"] == "inconclusive"
    assert root.get("failures") == "0"
    doc = json.loads((out / "check.json").read_text())
    assert doc["outcome"] == "inconclusive" and doc["passed"] is False
    assert doc["inconclusive"][0].startswith("required rule SHP001 could not run: missing model config")


def test_a_new_finding_fails_even_when_required_rules_could_not_run():
    # COL002 finds the fp32 upcast (exit 1); KRN007 cannot run without a TP=1 trace: the failure wins
    r = cli("check", FP32, "-m", FP32 / "config.json", "--require", "COL002,KRN007", "--rules", "COL002", "-j", "1")
    assert r.exit_code == 1, r.stdout
    line = last_line(r.stdout)
    assert line.startswith("FAILED: 1 new at or above warning: COL002; 1 required rule(s) could not run: KRN007"), line


def test_nothing_could_run_is_inconclusive():
    # no --model: SHP001 cannot run; a check of nothing is not a pass
    r = cli("check", FP32, "--rules", "SHP001", "-j", "1")
    assert r.exit_code == 4, r.stdout
    line = last_line(r.stdout)
    assert line.startswith("INCONCLUSIVE: the run cannot be diagnosed: No rule could run on these inputs"), line


def test_require_passes_when_the_required_rules_ran():
    r = cli("check", SAMPLES / "w4_int4mm_tp2", "-m", SAMPLES / "w4_int4mm_tp2" / "config.json",
            "--require", "SHP001,SHP002,SHP003,KRN003", "--rules", "SHP*", "-j", "1")  # fmt: skip
    # KRN003 is not in --rules but required: it runs; all four pass on this sample
    assert r.exit_code == 0, r.stdout
    assert "pass  KRN003" in r.stdout and "4 required" in r.stdout


def test_require_config_key(tmp_path):
    cfg = tmp_path / "tracediag.toml"
    cfg.write_text('require = ["SHP*"]\n')
    r = cli("check", FP32, "--config", cfg, "-q", "-j", "1")
    assert r.exit_code == 4 and "required rule(s) could not run: SHP001, SHP002, SHP003, SHP004" in r.stdout


def test_require_unknown_rule_is_a_usage_error():
    r = cli("check", FP32, "--require", "NOPE*")
    assert r.exit_code == 2 and "--require NOPE* matches no rule" in r.stderr


def test_check_output_has_the_verdict_and_does_not_wrap():
    d = SAMPLES / "delayed_rank_tp2"
    r = cli("check", d, "-m", d / "config.json", "-j", "1")
    lines = r.stdout.splitlines()
    (verdict,) = [line for line in lines if line.startswith("Verdict: ")]
    assert "Rank 1 is the straggler" in verdict and "(COL005 warning, 32% of the window's step time)" in verdict
    assert any(len(line) > 200 for line in lines)  # long lines stay whole in CI logs


def test_unfit_window_makes_the_check_inconclusive():
    """A sampled trace (1 runtime call in ~36 kept): no rule that could run found a problem, and the window cannot
    show one — exit 4 with the window's class, not a pass."""
    from conftest import kineto_file

    r = cli("check", kineto_file("hta_sampled_rank-0.json.gz"), "-j", "1")
    assert r.exit_code == 4, r.stdout
    assert "the run cannot be diagnosed: Inconclusive: this window can show neither a problem" in r.stdout
    assert "sampled" in r.stdout
