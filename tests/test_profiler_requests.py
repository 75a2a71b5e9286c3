"""`tracediag capture`'s profiler requests against a local HTTP server on 127.0.0.1 that answers from a script:
a request is repeated after a growing pause when it got no answer (refused, dropped) or a 5xx, never when it got
any other answer or was received and is still being worked on when the timeout ends."""

from __future__ import annotations

import json
import shutil
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from conftest import EXTERNAL, kineto_file

from tracediag.live.capture import capture
from tracediag.live.profiler_requests import post_profiler

METRICS = EXTERNAL / "vllm" / "metrics" / "production-stack-617_vllm0.10.0_v1_engine_label_excerpt.prom"


class ScriptedServer:
    """Answers each POST path from its script: an HTTP status, "drop" (close without a status line) or "slow"
    (answer 200 after 1 s). /metrics serves a vendored real vLLM exposition. `seen` counts the POSTs per path;
    `on_stop` runs when /stop_profile answers 200 (the engine writing its trace)."""

    def __init__(self, script: dict[str, list], on_stop=None) -> None:
        self.script, self.seen, self.on_stop = script, {}, on_stop
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                body = METRICS.read_bytes()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                server.seen[self.path] = server.seen.get(self.path, 0) + 1
                action = server.script[self.path].pop(0)
                if action == "drop":
                    self.close_connection = True
                    return
                if action == "slow":
                    time.sleep(1.0)
                    action = 200
                if action == 200 and self.path == "/stop_profile" and server.on_stop:
                    server.on_stop()
                self.send_response(action)
                self.send_header("Content-Length", "0")
                self.end_headers()

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def __enter__(self) -> ScriptedServer:
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def _ask(script: list, timeout_s: float = 5.0, **kw):
    pauses: list[float] = []
    with ScriptedServer({"/start_profile": list(script)}) as srv:
        answer = post_profiler(srv.url + "/start_profile", {}, timeout_s, sleep=pauses.append, **kw)
        return answer, pauses, srv.seen.get("/start_profile", 0)


def test_5xx_answers_are_asked_again_with_growing_pauses():
    answer, pauses, seen = _ask([503, 502, 200])
    assert (answer.status, answer.attempts, pauses, seen) == (200, ["HTTP 503", "HTTP 502", "HTTP 200"], [0.5, 1.0], 3)


@pytest.mark.parametrize("status", [200, 404, 400])
def test_any_other_answer_is_final(status):
    answer, pauses, seen = _ask([status, 200])
    assert (answer.status, answer.attempts, pauses, seen) == (status, [f"HTTP {status}"], [], 1)


def test_a_request_dropped_unanswered_is_sent_again():
    answer, pauses, seen = _ask(["drop", 200])
    assert (answer.status, answer.attempts, pauses, seen) == (200, ["closed without an answer", "HTTP 200"], [0.5], 2)


def test_a_request_still_being_worked_on_at_the_timeout_is_not_repeated():
    answer, pauses, seen = _ask(["slow", 200], timeout_s=0.3)
    assert answer.status is None and answer.error.startswith("sent, no answer within the timeout")
    assert (pauses, seen) == ([], 1)


def test_a_refused_connection_is_tried_four_times_then_said():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    pauses: list[float] = []
    answer = post_profiler(f"http://127.0.0.1:{port}/start_profile", {}, 2.0, sleep=pauses.append)
    assert answer.status is None and answer.attempts == ["connection refused"] * 4 and pauses == [0.5, 1.0, 2.0]


def test_no_pause_runs_past_the_deadline():
    answer, pauses, seen = _ask([503, 503, 503, 503], deadline=time.monotonic() + 0.8)
    assert (answer.status, pauses, seen) == (503, [0.5], 2)


def test_capture_records_every_attempt_and_still_gets_the_trace(tmp_path):
    """The server refuses the start once (503) and drops the stop once; the capture asks again, the engine writes
    its trace (a vendored real Kineto trace, under vLLM's file name) and capture.json lists every attempt."""
    profile_dir = tmp_path / "profile"
    profile_dir.mkdir()

    def write_trace() -> None:
        shutil.copy(kineto_file("hta_a100_simple_add.json.gz"), profile_dir / "worker0.1733580000000.pt.trace.json.gz")

    script = {"/start_profile": [503, 200], "/stop_profile": ["drop", 200]}
    said: list[str] = []
    with ScriptedServer(script, on_stop=write_trace) as srv:
        res = capture(srv.url, tmp_path / "inc", 0.3, interval_s=0.1, deadline_s=20, profile_dir=profile_dir,
                      progress=said.append)  # fmt: skip
        assert srv.seen == {"/start_profile": 2, "/stop_profile": 2}
    assert res.profiler == "recorded" and res.traces == ["worker0.1733580000000.pt.trace.json.gz"]
    manifest = json.loads((tmp_path / "inc" / "capture.json").read_text())
    assert manifest["profiler_requests"] == [
        {"endpoint": "start_profile", "status": 200, "attempts": ["HTTP 503", "HTTP 200"]},
        {"endpoint": "stop_profile", "status": 200, "attempts": ["closed without an answer", "HTTP 200"]},
    ]
    assert "/start_profile: 2 attempts (HTTP 503; HTTP 200)" in said
