"""`tracediag capture` end to end against the local test server of tests/engine_server.py on 127.0.0.1: a real
torch model served with continuous batching, a real torch.profiler trace started and stopped through the
server's /start_profile and /stop_profile, /metrics scraped during the same window, the server log's lines of
the window copied, and the bundle analyzed into one folder that `tracediag analyze FOLDER` reads again."""

from __future__ import annotations

import gzip
import json
import threading
import urllib.request
from pathlib import Path

import pytest
from engine_server import EngineServer
from typer.testing import CliRunner

from tracediag.analysis import analyze
from tracediag.cli import app


class Load:
    """Closed-loop clients sending completions until stopped (bounded: the test stops them)."""

    def __init__(self, url: str, clients: int = 4) -> None:
        self.url, self.stop = url, threading.Event()
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        body = json.dumps({"prompt": "Why is my server slow? " * 3, "max_tokens": 12}).encode()
        while not self.stop.is_set():
            try:
                req = urllib.request.Request(self.url + "/v1/completions", data=body)
                urllib.request.urlopen(req, timeout=30).read()
            except OSError:
                return

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(30)


@pytest.fixture(scope="module")
def captured(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("capture")
    prof, log = tmp / "vllm_profile", tmp / "server.log"
    srv = EngineServer(profiler_dir=prof, log_path=log, step_floor_s=0.01, log_interval_s=0.5).start()
    out = tmp / "incident"
    try:
        with Load(srv.url):
            res = CliRunner().invoke(
                app,
                [
                    "capture",
                    srv.url,
                    "--duration",
                    "3s",
                    "--interval",
                    "250ms",
                    "--steps",
                    "25",
                    "--profile-dir",
                    str(prof),
                    "--log-file",
                    str(log),
                    "-o",
                    str(out),
                    "--deadline",
                    "120s",
                    "-q",
                ],
            )
    finally:
        srv.stop()
    return res, out


def test_capture_end_to_end_against_the_local_test_server(captured):
    res, out = captured
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "capture.json").read_text())
    assert manifest["engine"] == "vllm" and manifest["profiler"] == "recorded" and manifest["scrapes"] >= 8
    (trace,) = sorted((out / "traces").glob("*.pt.trace.json.gz"))
    for name in ("metrics.prom", "server.log", "report.html", "findings.json", "trace.duckdb"):
        assert (out / name).stat().st_size > 0, name
    # the same window: the trace's events, the scrapes and the copied log lines all fall inside the capture
    start, stop = manifest["started_unix_s"], manifest["stopped_unix_s"]
    doc = json.loads(gzip.decompress(trace.read_bytes()))
    xs = [e for e in doc["traceEvents"] if e.get("ph") == "X" and "ts" in e]
    t0 = doc["baseTimeNanoseconds"] / 1e9
    assert start - 1 <= t0 + min(e["ts"] for e in xs) / 1e6 <= max(t0 + e["ts"] / 1e6 for e in xs) <= stop + 1
    steps = [e for e in xs if e["name"].startswith("execute_context_")]
    assert 20 <= len(steps) <= 26  # --steps 25 reached the engine's profiler
    marks = [
        int(line.split("unix_ms=")[1].split()[0]) / 1000
        for line in (out / "metrics.prom").read_text().splitlines()
        if line.startswith("# tracediag-scrape")
    ]
    assert start - 1 <= min(marks) and max(marks) <= stop + 1
    assert "Engine 000:" in (out / "server.log").read_text()
    findings = json.loads((out / "findings.json").read_text())
    checks = {c["rule"]: c for c in findings["checks"]}
    assert checks["SCH001"]["status"] != "not_applicable"  # steps from the trace
    assert checks["SCH003"]["status"] != "not_applicable"  # the queue series from the scrapes and the log
    # the engine thread writes the trace when the profiler stops (as vLLM's worker does): scrapes may see it pause
    assert checks["SCH011"]["status"] in ("pass", "finding")
    html = (out / "report.html").read_text()
    assert "Queue depth (waiting requests)" in html


def test_the_incident_folder_is_an_input_later(captured, tmp_path):
    _, out = captured
    report = analyze([out])
    assert {i["format"] for i in report.inputs} == {"kineto", "prometheus", "vllm-log"}


def test_a_server_without_profiler_says_so_and_keeps_the_rest(tmp_path):
    srv = EngineServer(profiler_dir=None, log_path=tmp_path / "s.log").start()
    try:
        res = CliRunner().invoke(
            app, ["capture", srv.url, "--duration", "1s", "--interval", "250ms", "-o", str(tmp_path / "inc")]
        )
    finally:
        srv.stop()
    assert res.exit_code == 0, res.output
    manifest = json.loads((tmp_path / "inc" / "capture.json").read_text())
    assert manifest["profiler"] == "not enabled on the server (404)" and manifest["scrapes"] >= 3
    assert "VLLM_TORCH_PROFILER_DIR" in res.output
    assert (tmp_path / "inc" / "findings.json").exists()


def test_capture_into_a_folder_that_holds_files_is_a_usage_error(tmp_path):
    (tmp_path / "x").write_text("keep me")
    res = CliRunner().invoke(app, ["capture", "http://127.0.0.1:9", "-o", str(tmp_path)])
    assert res.exit_code == 2 and "not empty" in res.output and (tmp_path / "x").read_text() == "keep me"


def test_unreachable_server_is_one_clear_error(tmp_path):
    res = CliRunner().invoke(app, ["capture", "http://127.0.0.1:9", "-o", str(tmp_path / "inc"), "--timeout", "1s"])
    assert res.exit_code == 2 and "did not answer" in res.output
    assert not Path(tmp_path / "inc" / "findings.json").exists()


def test_capture_of_an_sglang_flavoured_server_with_a_growing_queue(tmp_path):
    """SGLang's profiler API (`output_dir` and `num_steps` in the body), `sglang:*` metrics and SGLang's log layout;
    more clients than `max_num_seqs` with a slow step, so the queue builds up while the window runs. The log and
    metric *names* are SGLang's, the numbers this server's own (tests/engine_server.py)."""
    log = tmp_path / "sglang.log"
    srv = EngineServer(flavor="sglang", max_num_seqs=2, step_floor_s=0.03, log_path=log, log_interval_s=0.2).start()
    out = tmp_path / "inc"
    try:
        with Load(srv.url, clients=12):
            res = CliRunner().invoke(
                app,
                [
                    "capture",
                    srv.url,
                    "--duration",
                    "3s",
                    "--interval",
                    "200ms",
                    "--steps",
                    "10",
                    "--log-file",
                    str(log),
                    "-o",
                    str(out),
                    "-q",
                ],
            )
    finally:
        srv.stop()
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "capture.json").read_text())
    assert manifest["engine"] == "sglang" and manifest["profiler"] == "recorded" and manifest["traces"]
    text = (out / "server.log").read_text()
    assert "Decode batch. #running-req: 2" in text and "#queue-req" in text
    report = analyze([out])
    assert {i["format"] for i in report.inputs} == {"kineto", "prometheus", "sglang-log"}
    checks = {c.rule: c for c in report.checks}
    assert checks["SCH003"].status in ("pass", "finding") and checks["SCH004"].status != "not_applicable"
