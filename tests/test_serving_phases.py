"""SCH012 (TTFT decomposition) and SCH013 (engine imbalance) on real `tracediag scrape`s of local servers.

No public thread quotes a /metrics scrape with TTFT, queue-time and prefill-time histograms of one server together,
so the TTFT split is shown on timed scrapes of the test server of tests/engine_server.py (a real torch model with
continuous batching, vLLM's metric names, its request phases measured as vLLM measures them), overloaded and
lightly loaded. Engine imbalance is shown on the real excerpts of tests/cases/sch013.toml; the two causes a log
excerpt cannot show apart (a router that fills one engine's queue, an engine that is slow at even load) on a
scrape of a /metrics endpoint written by prometheus_client with vLLM's names for two engines and chosen values."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from engine_server import EngineServer
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from tracediag.analysis import analyze
from tracediag.live.scrape import scrape_to_file

TTFT = "tracediag.rules.step6_scheduling.sch012_ttft_decomposition"
IMBALANCE = "tracediag.rules.step6_scheduling.sch013_engine_imbalance"


class Load:
    """Closed-loop clients sending completions until stopped."""

    def __init__(self, url: str, clients: int, prompt: str) -> None:
        self.url, self.stop, self.prompt = url, threading.Event(), prompt
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(clients)]

    def _run(self) -> None:
        body = json.dumps({"prompt": self.prompt, "max_tokens": 12}).encode()
        while not self.stop.is_set():
            try:
                urllib.request.urlopen(
                    urllib.request.Request(self.url + "/v1/completions", data=body), timeout=30
                ).read()
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


def _scrape_under_load(tmp_path, name, clients, prompt, **server):
    out = tmp_path / f"{name}.prom"
    srv = EngineServer(**server).start()
    try:
        with Load(srv.url, clients, prompt):
            time.sleep(0.5)  # requests finish before the first scrape: the window has observations at both ends
            res = scrape_to_file(srv.url + "/metrics", out, interval_s=0.25, duration_s=2.0)
    finally:
        srv.stop()
    assert res.scrapes >= 6
    report = analyze([], extra_inputs=[(out, "prometheus")], extra_rules=[TTFT])
    (c,) = [c for c in report.checks if c.rule == "SCH012"]
    return c


def test_overloaded_server_ttft_is_queueing(tmp_path):
    """12 clients on 2 slots with 30 ms steps: requests wait far longer than their prefill takes."""
    c = _scrape_under_load(tmp_path, "over", 12, "Why is my server slow? " * 3, max_num_seqs=2, step_floor_s=0.03)
    assert c.status == "finding" and c.severity == "warning", c.to_dict()
    v = c.values
    assert v["dominant"] == "queue" and v["queue_share"] > 0.8 and v["ttft_mean_s"] >= 0.1
    assert v["queue_mean_s"] + v["prefill_mean_s"] + v["rest_mean_s"] == pytest.approx(v["ttft_mean_s"])
    assert "between the first and last of" in v["window"] and c.table[0]["intervals"]
    q = v["quantiles"]["queue_time_seconds"]["p90"]
    assert q["bounds_s"][0] <= q["estimate_s"] <= q["bounds_s"][1]  # a histogram knows a quantile to its bucket
    assert "SCH003" in c.next_check and "SCH013" in c.next_check


def test_lightly_loaded_server_ttft_is_prefill(tmp_path):
    """One client with a longer prompt on an idle engine: the first token waits for compute, as it should."""
    c = _scrape_under_load(tmp_path, "light", 1, "Why is my server slow? " * 10, max_num_seqs=8)
    assert c.status == "pass", c.to_dict()
    assert c.values["prefill_share"] > 0.5 and c.values["queue_share"] < 0.5
    assert "prefill is" in c.title


class FakeFleet:
    """/metrics of two vLLM data-parallel engines (label `engine`, vllm/v1/metrics/loggers.py) with chosen values:
    generation tokens per scrape, running and waiting per engine."""

    def __init__(self, gen: tuple[int, int], running: tuple[int, int], waiting: tuple[int, int]) -> None:
        self.registry = r = CollectorRegistry()
        lab = ["model_name", "engine"]
        self.g = Counter("vllm:generation_tokens", "Number of generation tokens processed.", lab, registry=r)
        self.run = Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", lab, registry=r)
        self.wait = Gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", lab, registry=r)
        self.gen, self.running, self.waiting = gen, running, waiting
        self.lock = threading.Lock()

    def render(self) -> bytes:
        with self.lock:
            for e in (0, 1):
                lv = ("m", str(e))
                self.g.labels(*lv).inc(self.gen[e])
                self.run.labels(*lv).set(self.running[e])
                self.wait.labels(*lv).set(self.waiting[e])
            return generate_latest(self.registry)


def _scrape_fleet(tmp_path, fleet: FakeFleet):
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = fleet.render()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    out = tmp_path / "fleet.prom"
    try:
        scrape_to_file(f"http://127.0.0.1:{httpd.server_address[1]}/metrics", out, interval_s=0.05, duration_s=0.4)
    finally:
        httpd.shutdown()
        httpd.server_close()
    report = analyze([], extra_inputs=[(out, "prometheus")], extra_rules=[IMBALANCE])
    (c,) = [c for c in report.checks if c.rule == "SCH013"]
    return c


def test_a_router_that_fills_one_engine_is_router_imbalance(tmp_path):
    c = _scrape_fleet(tmp_path, FakeFleet(gen=(100, 40), running=(8, 8), waiting=(0, 30)))
    assert c.status == "finding" and c.values["cause"] == "router", c.to_dict()
    assert c.values["lagging"] == "1" and "waiting differs" in c.title
    assert c.values["capacity_lost"] == pytest.approx(0.3, abs=0.02)  # 1 − (100 + 40) / (2 × 100)


def test_an_engine_slow_at_even_load_is_a_slow_engine(tmp_path):
    c = _scrape_fleet(tmp_path, FakeFleet(gen=(100, 50), running=(8, 8), waiting=(4, 4)))
    assert c.status == "finding" and c.values["cause"] == "slow engine", c.to_dict()
    assert "the engine itself is slow" in c.title and "COL005" in c.next_check


def test_sglang_ttft_splits_into_queue_and_the_rest(tmp_path):
    """SGLang exports sglang:queue_time_seconds and sglang:time_to_first_token_seconds, no prefill histogram: the
    split is queueing and everything after it (prefill and the rest together), and says so."""
    c = _scrape_under_load(
        tmp_path, "sglang", 12, "Why is my server slow? " * 3, flavor="sglang", max_num_seqs=2, step_floor_s=0.03
    )
    assert c.status == "finding" and c.values["dominant"] == "queue", c.to_dict()
    assert c.values["prefill_mean_s"] is None and "not measured (SGLang)" in c.substituted
    assert c.table[0]["has_prefill_histogram"] is False
