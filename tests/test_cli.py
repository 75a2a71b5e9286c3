"""The command line as users run it: exit codes, one-line errors, no partial outputs."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SAMPLES

HEALTHY = SAMPLES / "healthy_tp2"
RANK0 = HEALTHY / "rank0.pt.trace.json.gz"


def run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tracediag", *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=300
    )


def test_analyze_healthy_writes_three_outputs(tmp_path):
    out = tmp_path / "out"
    r = run("analyze", HEALTHY, "--model", HEALTHY / "config.json", "--out", out)
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in out.iterdir()) == ["findings.json", "report.html", "trace.duckdb"]
    doc = json.loads((out / "findings.json").read_text())
    assert doc["schema"] == "tracediag/findings-v1"
    statuses = {c["rule"]: c["status"] for c in doc["checks"]}
    assert {r: statuses[r] for r in ("SHP001", "SHP002", "COL001", "COL002")} == dict.fromkeys(
        ("SHP001", "SHP002", "COL001", "COL002"), "pass"
    )
    col001 = next(c for c in doc["checks"] if c["rule"] == "COL001")
    assert col001["values"]["2L"] == 8 and col001["values"]["all_reduce_per_step_mode"] == 9
    col002 = next(c for c in doc["checks"] if c["rule"] == "COL002")
    assert col002["values"]["e_a"] == 2 and col002["values"]["example_expected_bytes"] == (
        col002["values"]["example_T"] * 256 * 2
    )
    for inp in doc["inputs"]:
        assert set(inp["counts"]) >= {"kernels", "cpu_ops", "collectives", "steps"}
        assert inp["format"] == "kineto" and len(inp["ranks"]) == 1
    assert "COL001" in r.stdout and "report.html" in r.stdout
    # no staging leftovers next to the output
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_fault_trace_exit_zero_with_finding(tmp_path):
    d = SAMPLES / "fault_fp32_comm_tp2"
    r = run("analyze", d, "-m", d / "config.json", "-o", tmp_path / "o", "-q")
    assert r.returncode == 0 and r.stdout == ""
    doc = json.loads((tmp_path / "o" / "findings.json").read_text())
    assert "COL002" in [f["rule"] for f in doc["findings"]]
    assert doc["cost_model"]["applies"] is False


def _bad_inputs(tmp: Path) -> dict[str, tuple[list[str | Path], str]]:
    raw = gzip.decompress(RANK0.read_bytes())
    not_json = tmp / "notes.json"
    not_json.write_text("this is a log line, not JSON\n")
    trunc_gz = tmp / "rank0.pt.trace.json.gz"
    trunc_gz.write_bytes(RANK0.read_bytes()[: RANK0.stat().st_size // 2])
    trunc_json = tmp / "cut.json"
    trunc_json.write_bytes(raw[: len(raw) // 3])
    doc = json.loads(raw)
    empty = tmp / "empty.json"
    empty.write_text(json.dumps({**doc, "traceEvents": []}))
    cfg = json.loads((HEALTHY / "config.json").read_text())
    del cfg["hidden_size"]
    bad_cfg = tmp / "config_no_hidden.json"
    bad_cfg.write_text(json.dumps(cfg))
    model = HEALTHY / "config.json"
    return {
        "not JSON": ([not_json, "-m", model], "not valid JSON"),
        "truncated gzip": ([trunc_gz, "-m", model], "gzip"),
        "truncated JSON": ([trunc_json, "-m", model], "truncated JSON"),
        "JSON that is not a trace": ([model, "-m", model], "unrecognised input: not a Kineto trace"),
        "empty trace": ([empty, "-m", model], "no events"),
        "config without hidden_size": ([RANK0, "-m", bad_cfg], "hidden_size"),
        "missing file": ([tmp / "nope.json"], "no such file"),
    }


@pytest.mark.parametrize(
    "case",
    [
        "not JSON",
        "truncated gzip",
        "truncated JSON",
        "JSON that is not a trace",
        "empty trace",
        "config without hidden_size",
        "missing file",
    ],
)
def test_bad_input_exits_2_with_one_line_and_no_output(tmp_path, case):
    inputs = tmp_path / "in"
    inputs.mkdir()
    args, needle = _bad_inputs(inputs)[case]
    work = tmp_path / "work"
    work.mkdir()
    r = run("analyze", *args, "--out", work / "out")
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tracediag: error: "), r.stderr
    assert needle in lines[0]
    bad_file = [a for a in args if isinstance(a, Path)][-1 if case == "config without hidden_size" else 0]
    assert str(bad_file) in lines[0]
    assert list(work.iterdir()) == []  # no partial outputs, no staging folder


def test_failed_run_keeps_previous_outputs(tmp_path):
    out = tmp_path / "out"
    assert run("analyze", HEALTHY, "-m", HEALTHY / "config.json", "-o", out, "-q").returncode == 0
    before = (out / "findings.json").read_bytes()
    r = run("analyze", tmp_path / "missing.json", "-o", out)
    assert r.returncode == 2
    assert (out / "findings.json").read_bytes() == before


def test_usage_error_exit_2():
    r = run("analyze")
    assert r.returncode == 2
