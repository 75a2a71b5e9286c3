"""The command line in scripts and CI: `--format json` puts the document the command writes (findings.json,
check.json, diff.json) on stdout and nothing else; the JSON Schemas shipped in tracediag/schemas accept the real
outputs (CLI runs on the sample traces, the session's sample analyses, vendored real Kineto and Nsight traces) and
reject broken ones; a run that is not on a terminal says it is alive on stderr every few seconds."""

from __future__ import annotations

import copy
import io
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import get_args

import pytest
from conftest import EXTERNAL, SAMPLES, kineto_file, sample_report
from jsonschema import Draft202012Validator
from typer.testing import CliRunner

from tracediag.analysis import analyze
from tracediag.cli import app
from tracediag.cli.progress import heartbeat_line, progress, wanted
from tracediag.output import findings_json
from tracediag.schemas import SCHEMA_FILES, load_schema

HEALTHY = SAMPLES / "healthy_tp2"
FAULT = SAMPLES / "fault_fp32_comm_tp2"
HEARTBEAT = re.compile(r"tracediag: (\d+) s, (.+)")
# the CLI with its heartbeat every 50 ms, so a run of a second or two shows several
FAST_HEARTBEAT = "import tracediag.cli.progress as p\np.HEARTBEAT_S = 0.05\nfrom tracediag.cli import main\nmain()"


def _cli(*args: str | Path, fast_heartbeat: bool = False) -> subprocess.CompletedProcess:
    head = ["-c", FAST_HEARTBEAT] if fast_heartbeat else ["-m", "tracediag"]
    return subprocess.run([sys.executable, *head, *map(str, args)], capture_output=True, timeout=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, Path]]:
    """analyze, check and diff with --format json, their output folders beside them (stdout and stderr pipes)."""
    tmp = tmp_path_factory.mktemp("json")
    a, c, d = tmp / "analyze", tmp / "check", tmp / "diff"
    analyze = ["analyze", HEALTHY, "-m", HEALTHY / "config.json", "-o", a, "-q", "--progress", "--format", "json"]
    return {  # -q --progress: no summary, the heartbeat forced on
        "analyze": (_cli(*analyze, fast_heartbeat=True), a / "findings.json"),
        "check": (_cli("check", FAULT, "-m", FAULT / "config.json", "-o", c, "--format", "json"), c / "check.json"),
        "diff": (_cli("diff", a, c, "-o", d, "--format", "json", "--quiet"), d / "diff.json"),
    }


def _errors(doc: dict) -> list[str]:
    v = Draft202012Validator(load_schema(doc["schema"]))
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message[:300]}" for e in v.iter_errors(doc)]


@pytest.mark.parametrize("command", ["analyze", "check", "diff"])
def test_format_json_prints_the_written_document_and_nothing_else(runs, command):
    r, written = runs[command]
    doc = json.loads(r.stdout)  # the whole of stdout is one JSON document
    assert r.stdout == written.read_bytes()
    assert _errors(doc) == []
    expected = {"passed": 0, "failed": 1, "inconclusive": 4}[doc["outcome"]] if command == "check" else 0
    assert r.returncode == expected, r.stderr.decode()


def test_heartbeat_on_stderr_names_the_stage_and_the_elapsed_time(runs):
    r, _ = runs["analyze"]
    lines = r.stderr.decode().splitlines()
    beats = [HEARTBEAT.fullmatch(line) for line in lines]
    assert lines and all(beats), lines
    seconds = [int(m[1]) for m in beats]
    assert seconds == sorted(seconds)
    stages = list(dict.fromkeys(m[2] for m in beats))
    assert len(stages) >= 2 and any(s.startswith(("reading", "deriving", "running")) for s in stages), stages


def test_heartbeat_lines_every_interval_and_none_after_the_run():
    buf = io.StringIO()  # not a terminal
    with progress(stream=buf, every_s=0.02) as say:
        say("parsing 2 files")
        time.sleep(0.15)
        say("running 35 rules")
        time.sleep(0.15)
    lines = buf.getvalue().splitlines()
    time.sleep(0.06)
    assert buf.getvalue().splitlines() == lines  # the heartbeat stopped with the block
    assert {HEARTBEAT.fullmatch(line)[2] for line in lines} == {"parsing 2 files", "running 35 rules"}
    assert heartbeat_line(12.4, "deriving") == "tracediag: 12 s, deriving\n"


def test_progress_flags_force_either_way():
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert [wanted(None, False), wanted(None, True), wanted(True, True), wanted(False, False)] == [
        True, False, True, False]  # fmt: skip
    tty = Terminal()
    with progress(enabled=wanted(False, False), stream=tty, every_s=0.01) as say:  # --no-progress on a terminal
        say("reading")
        time.sleep(0.05)
    assert tty.getvalue() == ""


def test_an_unknown_format_is_one_line_naming_the_option(tmp_path):
    r = CliRunner().invoke(app, ["analyze", str(HEALTHY), "--format", "yaml", "-o", str(tmp_path / "o")])
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.strip() == "tracediag: error: --format must be one of text, json, got 'yaml'"
    assert not (tmp_path / "o").exists()


def test_schemas_are_draft_2020_12_and_name_the_documents_tracediag_writes():
    from tracediag.analysis import SCHEMA_ID
    from tracediag.derive.fitness import ORDER
    from tracediag.diff.compare import DIFF_SCHEMA_ID
    from tracediag.findings import Severity, Status
    from tracediag.gate.judge import CHECK_SCHEMA_ID, EXIT_CODES
    from tracediag.gate.outcome import OutcomeStatus

    assert set(SCHEMA_FILES) == {SCHEMA_ID, CHECK_SCHEMA_ID, DIFF_SCHEMA_ID}
    for schema_id in SCHEMA_FILES:
        s = load_schema(schema_id)
        Draft202012Validator.check_schema(s)
        assert s["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert s["properties"]["schema"] == {"const": schema_id}
    findings, check = load_schema(SCHEMA_ID), load_schema(CHECK_SCHEMA_ID)
    defs = findings["$defs"]
    assert defs["check"]["properties"]["status"]["enum"] == list(get_args(Status))
    assert defs["severity"]["enum"] == list(get_args(Severity)) == check["$defs"]["severity"]["enum"]
    assert defs["fitness_class"]["enum"] == list(ORDER)
    assert check["properties"]["outcome"]["enum"] == list(EXIT_CODES)
    assert check["properties"]["outcomes"]["items"]["properties"]["status"]["enum"] == list(get_args(OutcomeStatus))


def test_findings_of_samples_and_vendored_real_traces_match_the_schema():
    reports = {  # the CLI runs above cover healthy_tp2 and fault_fp32_comm_tp2
        "math_decode_tp2": sample_report("math_decode_tp2"),  # conftest's cached analysis, shared with other tests
        "HTA A100 rank (Kineto)": analyze([kineto_file("hta_a100_rank0of2_nccl_args.json.gz")], jobs=1),
        "nsys-ai RTX 3080 (Nsight export)": analyze([EXTERNAL / "nsys" / "nsysai_rtx3080_minimal.sqlite"], jobs=1),
    }
    for name, report in reports.items():
        assert _errors(json.loads(findings_json(report))) == [], name


def test_the_schemas_reject_broken_documents(runs):
    """Each mutation of a real output breaks one promise of its schema."""
    docs = {k: json.loads(runs[k][1].read_bytes()) for k in runs}
    na = next(i for i, c in enumerate(docs["analyze"]["checks"]) if c["status"] == "not_applicable")
    broken = {
        "status of a check": ("analyze", lambda d: d["checks"][0].update(status="maybe")),
        "a rule that could not run with values": ("analyze", lambda d: d["checks"][na].update(values={"x": 1})),
        "a key a check does not have": ("analyze", lambda d: d["checks"][0].update(score=1)),
        "a finding that is no finding": ("analyze", lambda d: d["findings"].append(d["checks"][na])),
        "no verdict": ("analyze", lambda d: d.pop("verdict")),
        "check outcome": ("check", lambda d: d.update(outcome="ok")),
        "a negative count": ("check", lambda d: d["counts"].update(fail=-1)),
        "no comparability": ("diff", lambda d: d.pop("comparability")),
    }
    for what, (command, mutate) in broken.items():
        doc = copy.deepcopy(docs[command])
        mutate(doc)
        assert _errors(doc), what
