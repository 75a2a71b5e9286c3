"""`tracediag scrape` against real HTTP servers on 127.0.0.1 started by the tests (http.server in a thread).

The served exposition is written by prometheus_client itself (a registry with vLLM's metric names and labels,
rendered by `generate_latest`), with values that change on every request: the waiting queue grows by 5
requests per scrape, the running count cycles, the preemption counter rises.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from itertools import pairwise
from pathlib import Path

import pytest
import typer
from conftest import REPO
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from typer.testing import CliRunner

from tracediag.analysis import analyze
from tracediag.cli.scrape import register
from tracediag.errors import UsageError
from tracediag.ingest import detect_format
from tracediag.ingest.base import IngestOptions
from tracediag.ingest.prometheus import parse_prometheus
from tracediag.live.scrape import metrics_url, parse_duration, scrape_to_file, stamp


class FakeVllm:
    """A /metrics endpoint with vLLM's names (vllm/v1/metrics/loggers.py) whose values change per scrape."""

    def __init__(self, waiting=None, queue_time=None) -> None:
        self.waiting_of = waiting or (lambda n: 5 * n)  # the queue at scrape n
        self.queue_time_of = queue_time or (lambda n: 0.1 * (n + 1))  # the queue time observed at scrape n
        self.registry = CollectorRegistry()
        labels = ["model_name", "engine"]
        self.waiting = Gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed.", labels, registry=self.registry
        )
        self.running = Gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            labels,
            registry=self.registry,
        )
        self.kv = Gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=self.registry
        )
        self.preempt = Counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels, registry=self.registry
        )
        self.queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase.",
            labels,
            buckets=[0.3, 0.5, 1.0, 5.0, 10.0],
            registry=self.registry,
        )
        self.n = 0
        self.lock = threading.Lock()

    def render(self) -> bytes:
        with self.lock:
            lv = ("m", "0")
            self.waiting.labels(*lv).set(self.waiting_of(self.n))
            self.running.labels(*lv).set(8 + self.n % 3)
            self.kv.labels(*lv).set(min(1.0, 0.5 + 0.05 * self.n))
            self.preempt.labels(*lv).inc(self.n)
            self.queue.labels(*lv).observe(self.queue_time_of(self.n))
            self.n += 1
            return generate_latest(self.registry)


class Server:
    """ThreadingHTTPServer on 127.0.0.1:<free port> serving FakeVllm at /metrics; `die_after` scrapes, it stops."""

    def __init__(self, die_after: int | None = None, waiting=None, queue_time=None) -> None:
        self.fake = FakeVllm(waiting, queue_time)
        self.served = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                if self.path != "/metrics":
                    self.send_error(404)
                    return
                body = outer.fake.render()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                outer.served += 1
                if die_after is not None and outer.served >= die_after:
                    threading.Thread(target=outer.stop, daemon=True).start()

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/metrics"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self._stopped = False

    def stop(self) -> None:
        if not self._stopped:
            self._stopped = True
            self.httpd.shutdown()
            self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.stop()


def _app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """tracediag (test harness)"""

    register(app)
    return app


def test_scrape_command_writes_timestamped_scrapes_the_ingester_reads(server, tmp_path):
    out = tmp_path / "metrics.prom"
    res = CliRunner().invoke(_app(), ["scrape", server.url, "--interval", "50ms", "--duration", "0.5s", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "scrape 1/10: ok" in res.output and "written to" in res.output  # progress, then the summary
    text = out.read_text()
    assert text.count("# tracediag-scrape seq=") == server.served == 10
    assert detect_format(out) == "prometheus"
    parsed = parse_prometheus(out, 0, IngestOptions())
    meta = parsed.inputs_rows[0]
    assert '"scrapes": 10' in meta["meta_json"] and '"timed_scrapes": 10' in meta["meta_json"]
    rows = parsed.tables["metric_samples"].to_pylist()
    waiting = [(r["scrape"], r["value"]) for r in rows if r["canonical"] == "requests_waiting"]
    assert waiting == [(i, 5.0 * i) for i in range(10)]  # the values changed with every scrape
    ts = sorted({r["ts_ns"] for r in rows})
    assert len(ts) == 10 and all(b > a for a, b in pairwise(ts)) and ts[-1] - ts[0] < 2e9
    assert {r["t_s"] for r in rows if r["scrape"] == 0} == {0.0}


def test_scraped_growing_queue_is_an_sch003_finding(server, tmp_path):
    out = tmp_path / "metrics.prom"
    res = scrape_to_file(server.url, out, interval_s=0.05, duration_s=0.4)
    assert res.scrapes == 8 and res.stopped == "duration elapsed"
    report = analyze(
        [],
        extra_inputs=[(out, "prometheus")],
        extra_rules=[
            "tracediag.rules.step6_scheduling.sch003_queue_growth",
            "tracediag.rules.step6_scheduling.sch004_kv_pressure",
        ],
    )
    (sch003,) = [c for c in report.checks if c.rule == "SCH003"]
    assert sch003.status == "finding" and sch003.values["n"] == 8
    assert sch003.values["p_increase"] == pytest.approx(1 / 40320)
    assert sch003.values["sen_slope_per_s"] > 0
    (sch004,) = [c for c in report.checks if c.rule == "SCH004"]
    assert sch004.status == "finding" and sch004.values["preemptions_metric_total"] == sum(range(8))


def test_one_stuck_request_is_not_queue_growth(tmp_path):
    """Waiting 0 → 1 beside a running batch of 8-10 is significant for a trend test (Mann-Kendall p < 0.05) but
    not arrivals outpacing completions: growth must also exceed max(2, 10 % of the running batch)."""
    out = tmp_path / "metrics.prom"
    # eight polls 50 ms apart; a run in which the machine stalled one poll past the 5 s timeout (a busy test
    # worker beside it) is taken again with a fresh server: the series, not the scheduler, is under test
    for _ in range(3):
        stuck = Server(waiting=lambda n: 0 if n < 3 else 1, queue_time=lambda n: 0.05)
        try:
            res = scrape_to_file(stuck.url, out, interval_s=0.05, duration_s=0.4)
        finally:
            stuck.stop()
        if res.scrapes == 8 and not res.failures:
            break
        out.unlink()
    assert res.scrapes == 8 and not res.failures, res
    report = analyze(
        [], extra_inputs=[(out, "prometheus")], extra_rules=["tracediag.rules.step6_scheduling.sch003_queue_growth"]
    )
    (sch003,) = [c for c in report.checks if c.rule == "SCH003"]
    assert sch003.status == "pass" and "rose only 0 → 1" in sch003.title, sch003.to_dict()
    assert sch003.values["p_increase"] < 0.05 and sch003.values["rise_threshold"] == 2.0
    assert 0 < sch003.values["sen_rise"] <= 2.0


def test_server_dying_mid_scrape_loses_no_sample_already_taken(tmp_path):
    dying = Server(die_after=4)
    try:
        out = tmp_path / "metrics.prom"
        res = CliRunner().invoke(
            _app(),
            [
                "scrape",
                dying.url,
                "--interval",
                "50ms",
                "--duration",
                "30s",
                "-o",
                str(out),
                "--max-failures",
                "2",
                "--timeout",
                "1s",
            ],
        )
    finally:
        dying.stop()
    assert res.exit_code == 0, res.output
    assert "server unreachable" in res.output and "failed:" in res.output
    parsed = parse_prometheus(out, 0, IngestOptions())
    rows = parsed.tables["metric_samples"].to_pylist()
    assert sorted({r["scrape"] for r in rows}) == [0, 1, 2, 3]  # all four scrapes the server answered
    assert [r["value"] for r in rows if r["canonical"] == "requests_waiting"] == [0.0, 5.0, 10.0, 15.0]
    assert '"malformed_lines": 0' in parsed.inputs_rows[0]["meta_json"]


def test_unreachable_server_is_a_clear_error(tmp_path):
    s = Server()
    url = s.url
    s.stop()  # nothing listens on that port any more
    res = CliRunner().invoke(
        _app(),
        [
            "scrape",
            url,
            "--interval",
            "20ms",
            "--duration",
            "5s",
            "-o",
            str(tmp_path / "m.prom"),
            "--max-failures",
            "2",
        ],
    )
    assert res.exit_code == 2
    assert "tracediag: error: no scrape succeeded" in res.output
    assert not (tmp_path / "m.prom").exists()  # no scrape taken: no file (it was left empty before)


def test_ctrl_c_stops_cleanly_and_keeps_the_scrapes(server, tmp_path):
    out = tmp_path / "metrics.prom"
    # A process started in the background of a non-interactive shell inherits SIGINT *ignored*; restore
    # Python's default handler in the child, as an interactive terminal would have it.
    code = (
        "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "import typer\nfrom tracediag.cli.scrape import register\napp = typer.Typer()\n"
        "@app.callback()\ndef main():\n    pass\nregister(app)\napp()\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "scrape", server.url, "--interval", "50ms", "--duration", "60s", "-o", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (not out.exists() or out.read_text().count("# tracediag-scrape") < 3):
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert "interrupted (Ctrl-C)" in err and "Traceback" not in err
    n = out.read_text().count("# tracediag-scrape")
    rows = parse_prometheus(out, 0, IngestOptions()).tables["metric_samples"].to_pylist()
    assert n >= 3 and len({r["scrape"] for r in rows}) == n  # every scrape written is complete and readable


def test_options_and_helpers():
    assert parse_duration("500ms", "x") == 0.5 and parse_duration("5m", "x") == 300 and parse_duration("2", "x") == 2
    for bad in ("0s", "-1s", "soon", ""):
        with pytest.raises(UsageError):
            parse_duration(bad, "--interval")
    assert metrics_url("127.0.0.1:8000") == "http://127.0.0.1:8000/metrics"
    assert metrics_url("http://h:8000/metrics") == "http://h:8000/metrics"
    with pytest.raises(UsageError):
        metrics_url("ftp://h/metrics")
    body = 'a 1\nb{x="}"} 2\nc 3 1700000000000\n# HELP a x\n'
    assert stamp(body, 42) == 'a 1 42\nb{x="}"} 2 42\nc 3 1700000000000\n# HELP a x\n'
    res = CliRunner().invoke(_app(), ["scrape", "http://127.0.0.1:9/metrics", "--interval", "soon"])
    assert res.exit_code == 2 and "--interval" in res.output


def test_output_is_valid_for_prometheus_client_too(server, tmp_path):
    """Each scrape block is plain exposition with sample timestamps: prometheus_client's parser reads it."""
    from prometheus_client.parser import text_string_to_metric_families

    out = tmp_path / "m.prom"
    scrape_to_file(server.url, out, interval_s=0.05, duration_s=0.1)
    fams = list(text_string_to_metric_families(out.read_text()))
    stamps = {s.timestamp for f in fams for s in f.samples}
    assert None not in stamps and Path(out).stat().st_size > 0


class LeakyVllm(FakeVllm):
    """Synthetic (no real capture breaks Little's law): the gauges say ~10 + 5n requests are in the system,
    while the counters finish one 0.1 s request per scrape — requests are held open (e.g. streams never
    closed), so L̄ ≫ λ·W."""

    def __init__(self) -> None:
        super().__init__()
        labels = ["model_name", "engine"]
        self.success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=self.registry,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            labels,
            buckets=[0.05, 0.1, 0.5, 1.0],
            registry=self.registry,
        )

    def render(self) -> bytes:
        with self.lock:
            self.success.labels("m", "0", "stop").inc()
            self.e2e.labels("m", "0").observe(0.1)
        return super().render()


def test_scraped_open_requests_break_littles_law(tmp_path):
    srv = Server()
    srv.fake = LeakyVllm()
    try:
        out = tmp_path / "metrics.prom"
        scrape_to_file(srv.url, out, interval_s=0.05, duration_s=0.4)
    finally:
        srv.stop()
    report = analyze(
        [], extra_inputs=[(out, "prometheus")], extra_rules=["tracediag.rules.step6_scheduling.sch008_littles_law"]
    )
    (sch008,) = [c for c in report.checks if c.rule == "SCH008"]
    assert sch008.status == "finding", sch008.to_dict()
    assert sch008.values["ratio"] > 2
    assert sch008.formula and sch008.substituted and sch008.evidence


class RawServer:
    """A TCP server on 127.0.0.1 answering every connection with `respond(sock)`: responses no HTTP library
    would send (the malformed cases scrape must count as failed, not crash on)."""

    def __init__(self, respond) -> None:
        import socketserver

        class H(socketserver.BaseRequestHandler):
            def handle(self):
                try:
                    self.request.recv(65536)
                    respond(self.request)
                except OSError:
                    pass

        self.srv = socketserver.ThreadingTCPServer(("127.0.0.1", 0), H)
        self.srv.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.srv.server_address[1]}/metrics"
        threading.Thread(target=self.srv.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.srv.shutdown()
        self.srv.server_close()


def _gzip_half() -> bytes:
    import gzip as gz

    full = gz.compress(generate_latest(FakeVllm().registry))
    return full[: len(full) // 2]


def _drip(sock) -> None:
    sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100000\r\n\r\n")
    for _ in range(30):  # one byte a second: bounded, the client gives up long before
        sock.sendall(b"#")
        time.sleep(1)


MALFORMED = {
    "no status line": lambda s: s.sendall(b"vllm:num_requests_waiting 3\n"),
    "body shorter than Content-Length": lambda s: s.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\nvllm:num_requests_waiting 3\n"
    ),
    "bad chunked encoding": lambda s: s.sendall(
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nvllm:num_requests_waiting 3\r\n0\r\n\r\n"
    ),
    "truncated gzip": lambda s: s.sendall(
        b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(_gzip_half()) + _gzip_half()
    ),
    "binary body": lambda s: s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\n\x00\x01\x02\x03\xff\xfe\x00\x00"),
    "HTML error page": lambda s: s.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 21\r\n\r\n<html>oops</html>\n\n\n\n"),
    "slow drip": _drip,
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_responses_are_counted_failed_scrapes(kind, tmp_path):
    srv = RawServer(MALFORMED[kind])
    try:
        out = tmp_path / "m.prom"
        t0 = time.monotonic()
        res = scrape_to_file(srv.url, out, interval_s=0.5, duration_s=1.0, timeout_s=1.0, max_failures=5)
        elapsed = time.monotonic() - t0
    finally:
        srv.stop()
    assert res.scrapes == 0 and res.failures >= 1, res
    assert not out.exists()  # nothing malformed was stored as a scrape (no file without a scrape)
    assert elapsed < 5.0  # per-scrape and whole-run deadlines hold, a one-byte-a-second server included


class SteadyVllm(LeakyVllm):
    """Synthetic, consistent counters: 2 requests always in the system, one finishing per scrape after 2 scrape
    intervals in the system: L = 2 = λ·W whatever the interval (λ = 1/Δ, W = 2Δ)."""

    def __init__(self, interval_s: float) -> None:
        super().__init__()
        self.interval_s = interval_s

    def render(self) -> bytes:
        with self.lock:
            lv = ("m", "0")
            self.success.labels("m", "0", "stop").inc()
            self.e2e.labels(*lv).observe(2 * self.interval_s)
            self.waiting.labels(*lv).set(0)
            self.running.labels(*lv).set(2)
            self.n += 1
            return generate_latest(self.registry)


def test_scraped_steady_server_satisfies_littles_law(tmp_path):
    srv = Server()
    srv.fake = SteadyVllm(0.1)
    try:
        out = tmp_path / "metrics.prom"
        scrape_to_file(srv.url, out, interval_s=0.1, duration_s=0.8)
    finally:
        srv.stop()
    report = analyze(
        [], extra_inputs=[(out, "prometheus")], extra_rules=["tracediag.rules.step6_scheduling.sch008_littles_law"]
    )
    (sch008,) = [c for c in report.checks if c.rule == "SCH008"]
    assert sch008.status == "pass", sch008.to_dict()
    assert 0.5 <= sch008.values["ratio"] <= 2.0
