"""One set of inputs for every entry point (tracediag.inputspec): `tracediag analyze` and `check` have an option for
each input, the MCP tools `analyze` and `check` an argument, the notebook API a keyword, all checked by the one
validation (tracediag.request); every input a rule's coverage advice names is one of them; tracediag.toml is read
by analyze, check and diff alike."""

from __future__ import annotations

import inspect
import json

import pytest
import typer
from conftest import REPO, SAMPLES
from typer.testing import CliRunner

import tracediag
from tracediag.errors import UsageError
from tracediag.findings import option_name
from tracediag.gate.config import settings_keys
from tracediag.inputspec import BY_FLAG, INPUTS
from tracediag.request import Request
from tracediag.rules import RULE_MODULES

EXT = REPO / "tests" / "data" / "external"
BENCH = EXT / "vllm" / "bench" / "vllm-0.33.0_rate6_save-detailed.json"


def _cli_flags(command) -> set[str]:
    app = typer.Typer()
    app.command()(command)
    click_cmd = typer.main.get_command(app)
    return {o for p in click_cmd.params for o in p.opts}


@pytest.mark.parametrize("name", ["analyze", "check"])
def test_the_cli_commands_take_every_input(name):
    from tracediag.cli import analyze, check

    command = {"analyze": analyze.analyze, "check": check.check}[name]
    flags = _cli_flags(command)
    assert {s.flag for s in INPUTS if s.flag != "TRACES"} <= flags, name
    assert "--config" in flags  # and read tracediag.toml


def test_the_mcp_tools_take_every_input():
    import anyio

    from tracediag.agent.server import build_server

    tools = {t.name: t for t in anyio.run(build_server(REPO / "runs-unused").list_tools)}  # what a client lists
    for name in ("analyze", "check"):
        props = tools[name].input_schema["properties"]
        want = {s.name for s in INPUTS} - {"traces", "jobs"} | {"inputs", "config"}
        assert want <= set(props), (name, sorted(want - set(props)))
        assert all(props[p].get("description") for p in want), name


def test_the_notebook_api_takes_every_input():
    params = inspect.signature(tracediag.analyze).parameters
    named = {s.name for s in INPUTS} - {"traces"}
    missing = [n for n in named if n not in params]
    assert all(p.kind != p.VAR_KEYWORD for n, p in params.items() if n in named)
    assert set(missing) <= {s.name for s in INPUTS}  # the rest pass through **inputs to Request.build
    with pytest.raises(UsageError, match="no such input"):
        tracediag.analyze([SAMPLES / "healthy_tp2"], hbm_bandwith=3000.0)  # a typo is an error, never ignored


def test_every_input_a_rule_advises_is_declared_once():
    """The coverage advice ("pass --topology topo.json") names only declared inputs, so an agent and a notebook user
    get their own name for it (tool argument, keyword) and a config key where a file may give it."""
    import importlib

    for mod in RULE_MODULES:
        for e in importlib.import_module(mod).RULE.enabled_by:
            assert option_name(e) in BY_FLAG, (mod, e)
    keys = settings_keys()
    assert all(s.config_key in keys for s in INPUTS if s.config_key), "config keys are tracediag.toml's"


@pytest.mark.parametrize(
    ("naming", "word"), [("cli", "--tp: must be an integer"), ("mcp", "tp: must be an integer"), ("python", "tp:")]
)
def test_one_validation_names_the_input_as_its_caller_does(naming, word):
    with pytest.raises(UsageError, match=word):
        Request.build(tp=10**30, naming=naming)
    with pytest.raises(UsageError, match="NUL byte"):
        Request.build(["a\x00b"], naming=naming)


def test_analyze_check_and_diff_read_tracediag_toml(tmp_path, monkeypatch):
    """A budget given only in tracediag.toml enables SCH010 for `analyze` (as it did for `check` alone), and a flag
    given beside it wins; `check` takes --slo as analyze does."""
    from tracediag.cli import app

    (tmp_path / "tracediag.toml").write_text('slo = "ttft=500,tpot=50"\n')
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    r = runner.invoke(app, ["analyze", "--bench", str(BENCH), "-o", "a", "-q"])
    assert r.exit_code == 0, r.output
    sch010 = next(c for c in json.loads((tmp_path / "a" / "findings.json").read_text())["checks"]
                  if c["rule"] == "SCH010")  # fmt: skip
    assert sch010["status"] != "not_applicable" and sch010["values"]["slo_ms"] == {"ttft": 500.0, "tpot": 50.0}
    r = runner.invoke(app, ["check", "--bench", str(BENCH), "--slo", "ttft=1", "--rules", "SCH010", "-o", "c", "-q"])
    assert r.exit_code in (0, 1), r.output  # the flag over the file's budgets
    (sch010,) = json.loads((tmp_path / "c" / "findings.json").read_text())["checks"]
    assert sch010["values"]["slo_ms"] == {"ttft": 1.0}
