"""Fuzzing of command lines, of tracediag's own outputs read back, and of file-system faults at the output paths
(tests/fuzz/commands.py has the cases and the contract: exit 0/1/2/4 only, exit 2 one line, no file of the
user's changed, nothing partial left; the MCP tools' and `tracediag scrape`'s contracts are tests/fuzz/services.py's).
A fixed, derandomized budget in the normal suite; more with
`TRACEDIAG_FUZZ_EXAMPLES=N`, and the long run is `python benchmarks/fuzz_long.py --target commands`.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from pathlib import Path

import pytest
from fuzz import commands, services
from hypothesis import Phase, given
from hypothesis import strategies as st
from test_fuzz import budget

EXAMPLES = {"command-line": 14, "read-back": 10, "fs-fault": 8, "store-tamper": 8, "mcp-arguments": 3, "scrape": 6}


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("fuzz-built")


@pytest.mark.parametrize("kind", commands.KINDS)
def test_command_lines_outputs_and_file_system_faults_keep_the_contract(kind, built):
    # no shrinking: each example is a whole CLI run, and the failure message already holds the command line
    @budget(EXAMPLES[kind], phases=(Phase.explicit, Phase.reuse, Phase.generate))
    @given(rnd=st.randoms(use_true_random=False))
    def check(rnd: random.Random) -> None:
        work = Path(tempfile.mkdtemp(prefix=f"fuzz-{kind}-"))
        case = commands.make_case(kind, rnd, work, built)
        outcome = commands.check_case(case)
        assert not outcome.defect, f"{outcome.status}: {outcome.detail} (workspace kept at {work})"
        shutil.rmtree(work, ignore_errors=True)

    check()


def test_an_unknown_tool_is_the_one_line_error_and_the_server_goes_on(built, tmp_path):
    """Found by the mcp-arguments kind: the SDK answered `Unknown tool: nope`, not the CLI's line."""
    ws = commands.workspace(tmp_path, built)
    services.mcp_workspace(ws, tmp_path)
    frames = [services.MALFORMED[6], services._request(10, "findings", {"run": str(ws["run"])})]
    outcome = services.check_mcp(commands.Case(frames, tmp_path, "mcp-arguments"), 60)
    assert outcome.status == "input_error" and "no tool 'nope' (tools: analyze" in outcome.detail, outcome


def test_a_scrape_that_takes_no_page_leaves_no_file(built, tmp_path):
    """Found by the scrape kind: every poll failed (exit 2) and an empty output file was left behind."""
    commands.workspace(tmp_path, built)
    spec = {"plan": ["http-error", "binary"], "out": str(tmp_path / "out.prom"), "limit": 0.8, "seed": "0",
            "options": ["--interval", "100ms", "--duration", "0.3s", "--timeout", "0.4s", "-o",
                        str(tmp_path / "out.prom"), "-q"]}  # fmt: skip
    outcome = services.check_scrape(commands.Case([spec], tmp_path, "scrape"), 30)
    assert outcome.status == "input_error" and not (tmp_path / "out.prom").exists(), outcome


@pytest.mark.parametrize(("plan", "seed"), [(["redirect-self"], "0"), (["ok", "no-status"], "1")])
def test_a_scrape_error_in_several_lines_is_said_in_one(built, tmp_path, plan, seed):
    """Found by the scrape kind: urllib's redirect loop error (and a status line of the server's own, `HTTP/9.9
    abc\\r\\n`) went to stderr as they were, so exit 2 said its error in 3 lines and exit 0's summary was cut."""
    commands.workspace(tmp_path, built)
    spec = {"plan": plan, "out": str(tmp_path / "out.prom"), "limit": 1.6, "seed": seed,
            "options": ["--interval", "200ms", "--duration", "0.4s", "--timeout", "1s", "--max-failures", "1",
                        "-o", str(tmp_path / "out.prom"), "-q"]}  # fmt: skip
    outcome = services.check_scrape(commands.Case([spec], tmp_path, "scrape"), 30)
    assert outcome.status == ("ok" if "ok" in plan else "input_error"), outcome


@pytest.mark.parametrize("case", ["long-name", "diff-of-a-log"])
def test_mcp_calls_found_by_the_fuzz_run_answer_the_one_line_error_or_a_result(built, tmp_path, case):
    """Found by the mcp-arguments kind: a path of a 300-character name was an internal error (OSError from is_dir,
    ENAMETOOLONG), and `diff` of a run against a log crashed on its own answer (a bucket without steps on one side:
    None where the output schema said int), the SDK's bare `Error executing tool diff`."""
    ws = commands.workspace(tmp_path, built)
    services.mcp_workspace(ws, tmp_path)
    call = (("findings", {"run": str(ws["folder"] / ("n" * 300))}) if case == "long-name" else
            ("diff", {"before": str(ws["run"]), "after": str(ws["log"])}))  # fmt: skip
    frames = [services._request(10, *call), services._request(99, "findings", {"run": str(ws["run"])})]
    outcome = services.check_mcp(commands.Case(frames, tmp_path, "mcp-arguments"), 60)
    assert not outcome.defect, outcome
    assert outcome.status == ("input_error" if case == "long-name" else "ok"), outcome
