"""A local test inference server on 127.0.0.1 for `tracediag capture`, `tracediag scrape` and the benchmark clients.

It serves a small real torch model on the CPU with continuous batching and exposes what the engines document:

- `POST /v1/completions` (OpenAI completions, streamed as server-sent events or whole), `GET /v1/models`,
  `GET /health`;
- `GET /metrics`: Prometheus text written by prometheus_client, with vLLM's metric names and labels (the request
  phases as vLLM measures them: queue = first QUEUED → first SCHEDULED, prefill = first SCHEDULED → first token,
  vllm/v1/metrics/stats.py update_from_finished_request)
  (vllm/v1/metrics/loggers.py PrometheusStatLogger) or SGLang's (python/sglang/srt/metrics/collector.py),
  whose values are the server's own state: requests running and waiting, KV blocks in use, finished requests,
  their latencies;
- `POST /start_profile`, `POST /stop_profile` (vllm/entrypoints/serve/profile/api_router.py: registered only when a
  profiler directory is configured, else 404; SGLang's take `{"output_dir", "num_steps"}`): a real
  `torch.profiler` trace of the engine steps, written by `torch.profiler.tensorboard_trace_handler` as
  `<worker>.<ms>.pt.trace.json.gz`, as vLLM's TorchProfilerWrapper does;
- a server log in vLLM's logger layout (`(APIServer pid=N) INFO MM-DD HH:MM:SS [file.py:N] message`, vllm/logger.py)
  with the V1 periodic stats line (vllm/v1/metrics/loggers.py LoggingStatLogger) and uvicorn-style access lines,
  or SGLang's (`[YYYY-MM-DD HH:MM:SS] Prefill batch. …` / `Decode batch. …`).

What is *not* real: this is not vLLM or SGLang. The numbers are this server's; the log and metric *names and
layouts* are the engines'. Tokens are printable ASCII characters (id = ord(c) − 32, 95 ids, + one unknown id):
the same tokenizer is written for the benchmark clients by `write_tokenizer`. Every engine step is
annotated `execute_context_N(T)_generation_M(U)` (vLLM's gpu_model_runner step annotation) so the trace has steps.
`step_floor_s` makes each engine step take at least that long, to play a slower engine (queues then form
at lower request rates).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import torch
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

VOCAB = 96  # 95 printable ASCII characters + unknown
UNK = 95
BLOCK = 16  # KV block size in tokens (accounting only)


def encode(text: str) -> list[int]:
    return [ord(c) - 32 if 32 <= ord(c) < 127 else UNK for c in text]


def decode(ids: list[int]) -> str:
    return "".join(chr(i + 32) if 0 <= i < 95 else "?" for i in ids)


def write_tokenizer(folder: Path) -> Path:
    """A Hugging Face tokenizer folder for the same character-level vocabulary (for the benchmark clients)."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {chr(i + 32): i for i in range(95)} | {"<unk>": UNK}
    tok = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": UNK,
                "content": "<unk>",
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "."}, "behavior": "Isolated", "invert": False},
        "post_processor": None,
        "decoder": {"type": "Fuse"},
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"},
    }
    (folder / "tokenizer.json").write_text(json.dumps(tok))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "unk_token": "<unk>", "model_max_length": 2048})
    )
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": VOCAB}))
    return folder


class TinyLM(torch.nn.Module):
    """A Llama-shaped decoder (RMSNorm, SDPA attention, SiLU-gated MLP): 2 layers, hidden 64, 4 heads."""

    def __init__(self, hidden: int = 64, layers: int = 2, heads: int = 4, inter: int = 128) -> None:
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(VOCAB, hidden)
        self.layers = torch.nn.ModuleList()
        for _ in range(layers):
            block = torch.nn.ModuleDict(
                {
                    "norm1": torch.nn.RMSNorm(hidden),
                    "qkv": torch.nn.Linear(hidden, 3 * hidden, bias=False),
                    "o": torch.nn.Linear(hidden, hidden, bias=False),
                    "norm2": torch.nn.RMSNorm(hidden),
                    "gate_up": torch.nn.Linear(hidden, 2 * inter, bias=False),
                    "down": torch.nn.Linear(inter, hidden, bias=False),
                }
            )
            self.layers.append(block)
        self.norm = torch.nn.RMSNorm(hidden)
        self.head = torch.nn.Linear(hidden, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)  # [T, H]
        t, h = x.shape
        for b in self.layers:
            q, k, v = b["qkv"](b["norm1"](x)).view(t, 3, self.heads, h // self.heads).unbind(1)
            a = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=True
            )
            x = x + b["o"](a.transpose(0, 1).reshape(t, h))
            g, u = b["gate_up"](b["norm2"](x)).chunk(2, dim=-1)
            x = x + b["down"](torch.nn.functional.silu(g) * u)
        return self.head(self.norm(x[-1:]))  # logits of the last position


@dataclass
class Request:
    rid: str
    prompt: list[int]
    max_tokens: int
    arrived: float = field(default_factory=time.monotonic)
    out: queue.Queue = field(default_factory=queue.Queue)  # token ids, then None when finished
    generated: list[int] = field(default_factory=list)
    scheduled: float | None = None
    first_token: float | None = None


class Metrics:
    """The engine's metrics under vLLM's or SGLang's names."""

    def __init__(self, flavor: str, model: str) -> None:
        self.flavor = flavor
        self.registry = r = CollectorRegistry()
        if flavor == "vllm":
            lab, self.lv = ["model_name", "engine"], (model, "0")
            self.running = Gauge(
                "vllm:num_requests_running", "Number of requests in model execution batches.", lab, registry=r
            )
            self.waiting = Gauge(
                "vllm:num_requests_waiting", "Number of requests waiting to be processed.", lab, registry=r
            )
            self.kv = Gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", lab, registry=r)
            self.gen = Counter("vllm:generation_tokens", "Number of generation tokens processed.", lab, registry=r)
            self.prompt = Counter("vllm:prompt_tokens", "Number of prefill tokens processed.", lab, registry=r)
            self.success = Counter(
                "vllm:request_success",
                "Count of successfully processed requests.",
                [*lab, "finished_reason"],
                registry=r,
            )
            self.e2e = Histogram(
                "vllm:e2e_request_latency_seconds",
                "Histogram of e2e request latency in seconds.",
                lab,
                buckets=[0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0],
                registry=r,
            )
            self.ttft = Histogram(
                "vllm:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                lab,
                buckets=[0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0],
                registry=r,
            )
            self.queue = Histogram(
                "vllm:request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
                lab,
                buckets=[0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0],
                registry=r,
            )
            self.prefill = Histogram(  # first SCHEDULED to first token, observed when the request finishes (as vLLM)
                "vllm:request_prefill_time_seconds",
                "Histogram of time spent in PREFILL phase for request.",
                lab,
                buckets=[0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0],
                registry=r,
            )
        else:
            lab, self.lv = ["model_name", "engine_type", "tp_rank", "pp_rank"], (model, "unified", "0", "0")
            self.running = Gauge("sglang:num_running_reqs", "The number of running requests.", lab, registry=r)
            self.waiting = Gauge(
                "sglang:num_queue_reqs", "The number of requests in the waiting queue.", lab, registry=r
            )
            self.kv = Gauge("sglang:token_usage", "The token usage.", lab, registry=r)
            self.gen_tput = Gauge("sglang:gen_throughput", "The generation throughput (token/s).", lab, registry=r)
            self.gen = Counter("sglang:generation_tokens", "Number of generation tokens processed.", lab, registry=r)
            self.prompt = Counter("sglang:prompt_tokens", "Number of prefill tokens processed.", lab, registry=r)
            self.success = Counter("sglang:num_requests", "Number of requests processed.", lab, registry=r)
            self.e2e = Histogram(
                "sglang:e2e_request_latency_seconds",
                "Histogram of End-to-end request latency in seconds",
                lab,
                buckets=[0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60],
                registry=r,
            )
            self.ttft = Histogram(
                "sglang:time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
                lab,
                buckets=[0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60],
                registry=r,
            )
            self.queue = Histogram(
                "sglang:queue_time_seconds",
                "Histogram of queueing time in seconds.",
                lab,
                buckets=[0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60],
                registry=r,
            )


class EngineServer:
    """The model, a scheduler thread (continuous batching), and the HTTP front end, all on 127.0.0.1."""

    def __init__(
        self,
        flavor: str = "vllm",
        model_name: str = "tracediag-test-tiny",
        max_num_seqs: int = 8,
        kv_blocks: int = 64,
        step_floor_s: float = 0.0,
        log_path: Path | None = None,
        log_interval_s: float = 1.0,
        profiler_dir: Path | None = None,
    ) -> None:
        torch.manual_seed(0)
        torch.set_num_threads(1)  # one engine thread; intra-op threads only contend with the HTTP threads here
        self.flavor, self.model_name = flavor, model_name
        self.model = TinyLM().eval()
        self.max_num_seqs, self.kv_blocks, self.step_floor_s = max_num_seqs, kv_blocks, step_floor_s
        self.profiler_dir = profiler_dir
        self.metrics = Metrics(flavor, model_name)
        self.inbox: queue.Queue[Request] = queue.Queue()
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.lock = threading.Lock()
        self.stop_event = threading.Event()
        self.steps = 0
        self.counter = 0
        self._profile_cmd: queue.Queue = queue.Queue()
        self._profiler: torch.profiler.profile | None = None
        self._profile_steps_left: int | None = None
        self.traces_written: list[Path] = []
        self.log = self._logger(log_path)
        self.log_interval_s = log_interval_s
        self._interval = {"prompt": 0, "gen": 0, "t": time.monotonic()}
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.threads = [
            threading.Thread(target=self.httpd.serve_forever, daemon=True),
            threading.Thread(target=self._engine_loop, daemon=True),
        ]

    # ------------------------------------------------------------------ logging
    def _logger(self, path: Path | None) -> logging.Logger | None:
        if path is None:
            return None
        log = logging.getLogger(f"engine-server-{id(self)}")
        log.propagate = False
        log.setLevel(logging.INFO)
        h = logging.FileHandler(path, mode="a", encoding="utf-8")
        if self.flavor == "vllm":  # vllm/logger.py _FORMAT with the multiprocessing prefix, _DATE_FORMAT
            fmt = logging.Formatter(
                f"(APIServer pid={os.getpid()}) %(levelname)s %(asctime)s [%(filename)s:%(lineno)d] %(message)s",
                "%m-%d %H:%M:%S",
            )
        else:  # sglang configure_logger: "[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S"
            fmt = logging.Formatter("[%(asctime)s] %(message)s", "%Y-%m-%d %H:%M:%S")
        h.setFormatter(fmt)
        log.addHandler(h)
        return log

    def _access(self, addr: tuple, method: str, path: str, code: int) -> None:
        if self.log is None:
            return
        phrase = {200: "OK", 404: "Not Found", 400: "Bad Request"}.get(code, "")
        if self.flavor == "vllm":
            for h in self.log.handlers:  # uvicorn's access line has no vLLM prefix
                h.stream.write(f'INFO:     {addr[0]}:{addr[1]} - "{method} {path} HTTP/1.1" {code} {phrase}\n')
                h.flush()
        else:
            self.log.info('INFO:     %s:%d - "%s %s HTTP/1.1" %d %s', addr[0], addr[1], method, path, code, phrase)

    def _log_stats(self) -> None:
        now = time.monotonic()
        dt = max(1e-9, now - self._interval["t"])
        with self.lock:
            running, waiting = len(self.running), len(self.waiting)
            kv = self._blocks_used() / self.kv_blocks
        p, g = self._interval["prompt"] / dt, self._interval["gen"] / dt
        self._interval = {"prompt": 0, "gen": 0, "t": now}
        if self.log is None:
            return
        if self.flavor == "vllm":  # vllm/v1/metrics/loggers.py LoggingStatLogger.log
            self.log.info(
                "Engine %03d: Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, "
                "Running: %d reqs, Waiting: %d reqs, GPU KV cache usage: %.1f%%, Prefix cache hit rate: %.1f%%",
                0,
                p,
                g,
                running,
                waiting,
                kv * 100,
                0.0,
            )
        elif running:  # sglang log_decode_stats (2025 form)
            self.log.info(
                "Decode batch. #running-req: %d, #token: %d, token usage: %.2f, cuda graph: False, "
                "gen throughput (token/s): %.2f, #queue-req: %d, ",
                running,
                self._blocks_used() * BLOCK,
                kv,
                g,
                waiting,
            )
            self.metrics.gen_tput.labels(*self.metrics.lv).set(g)

    # ------------------------------------------------------------------ engine
    def _blocks_used(self) -> int:
        return sum(-(-(len(r.prompt) + len(r.generated) + 1) // BLOCK) for r in self.running)

    def _admit(self) -> list[Request]:
        admitted = []
        while self.waiting and len(self.running) < self.max_num_seqs:
            r = self.waiting[0]
            need = -(-(len(r.prompt) + r.max_tokens) // BLOCK)
            if self._blocks_used() + need > self.kv_blocks and self.running:
                break
            self.waiting.pop(0)
            r.scheduled = time.monotonic()
            self.metrics.queue.labels(*self.metrics.lv).observe(r.scheduled - r.arrived)
            self.running.append(r)
            admitted.append(r)
        return admitted

    def _step(self) -> None:
        t0 = time.monotonic()
        with self.lock:
            while True:
                try:
                    self.waiting.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            new = self._admit()
            batch = list(self.running)
        if not batch:
            time.sleep(0.002)
            return
        prefill = [r for r in batch if r in new]
        decode = [r for r in batch if r not in new]
        name = (
            f"execute_context_{len(prefill)}({sum(len(r.prompt) for r in prefill)})"
            f"_generation_{len(decode)}({len(decode)})"
        )
        with torch.no_grad(), torch.profiler.record_function(name):
            for r in batch:
                ids = torch.tensor((r.prompt + r.generated)[-256:] or [0], dtype=torch.long)
                tok = int(torch.argmax(self.model(ids), dim=-1)[0])
                r.generated.append(tok)
        now = time.monotonic()
        finished = []
        for r in batch:
            if r.first_token is None:
                r.first_token = now
                self.metrics.ttft.labels(*self.metrics.lv).observe(now - r.arrived)
            r.out.put(r.generated[-1])
            if len(r.generated) >= r.max_tokens:
                finished.append(r)
        self._interval["prompt"] += sum(len(r.prompt) for r in prefill)
        self._interval["gen"] += len(batch)
        self.metrics.prompt.labels(*self.metrics.lv).inc(sum(len(r.prompt) for r in prefill))
        self.metrics.gen.labels(*self.metrics.lv).inc(len(batch))
        if self.flavor == "sglang" and prefill and self.log is not None:  # sglang log_prefill_stats (2025 form)
            self.log.info(
                "Prefill batch. #new-seq: %d, #new-token: %d, #cached-token: 0, token usage: %.2f, "
                "#running-req: %d, #queue-req: %d, ",
                len(prefill),
                sum(len(r.prompt) for r in prefill),
                self._blocks_used() / self.kv_blocks,
                len(decode),
                len(self.waiting),
            )
        with self.lock:
            for r in finished:
                self.running.remove(r)
                r.out.put(None)
                if self.flavor == "vllm":
                    self.metrics.success.labels(*self.metrics.lv, "length").inc()
                else:
                    self.metrics.success.labels(*self.metrics.lv).inc()
                self.metrics.e2e.labels(*self.metrics.lv).observe(now - r.arrived)
                if self.flavor == "vllm":
                    self.metrics.prefill.labels(*self.metrics.lv).observe(r.first_token - r.scheduled)
            self._update_gauges()
        self.steps += 1
        if self._profiler is not None:
            self._profiler.step()
            if self._profile_steps_left is not None:
                self._profile_steps_left -= 1
                if self._profile_steps_left <= 0:
                    self._stop_profiler()
        rest = self.step_floor_s - (time.monotonic() - t0)
        if rest > 0:
            time.sleep(rest)

    def _update_gauges(self) -> None:
        m = self.metrics
        m.running.labels(*m.lv).set(len(self.running))
        m.waiting.labels(*m.lv).set(len(self.waiting) + self.inbox.qsize())
        m.kv.labels(*m.lv).set(self._blocks_used() / self.kv_blocks)

    def _start_profiler(self, out_dir: Path, num_steps: int | None) -> None:
        out_dir.mkdir(parents=True, exist_ok=True)
        before = set(out_dir.glob("*.json*"))

        def ready(prof: torch.profiler.profile) -> None:
            torch.profiler.tensorboard_trace_handler(str(out_dir), worker_name="tracediag-test-worker", use_gzip=True)(
                prof
            )
            self.traces_written += sorted(set(out_dir.glob("*.json*")) - before)

        self._profiler = torch.profiler.profile(
            activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True, on_trace_ready=ready
        )
        self._profiler.start()
        self._profile_steps_left = num_steps

    def _stop_profiler(self) -> None:
        if self._profiler is not None:
            prof, self._profiler = self._profiler, None
            prof.stop()

    def _engine_loop(self) -> None:
        next_log = time.monotonic() + self.log_interval_s
        while not self.stop_event.is_set():
            try:
                cmd, arg, done = self._profile_cmd.get_nowait()
            except queue.Empty:
                pass
            else:
                if cmd == "start" and self._profiler is None:
                    self._start_profiler(*arg)
                elif cmd == "stop":
                    self._stop_profiler()
                done.set()
            self._step()
            with self.lock:
                self._update_gauges()
            if time.monotonic() >= next_log:
                self._log_stats()
                next_log += self.log_interval_s
        self._stop_profiler()

    # ------------------------------------------------------------------ HTTP
    def submit(self, prompt: list[int], max_tokens: int) -> Request:
        self.counter += 1
        r = Request(f"cmpl-{self.counter}", prompt or [0], max(1, int(max_tokens)))
        self.inbox.put(r)
        return r

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def _send(self, code: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
                server._access(self.client_address, self.command, self.path, code)

            def _body(self) -> dict:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n) if n else b""
                try:
                    return json.loads(raw or b"{}")
                except json.JSONDecodeError:
                    return {}

            def do_GET(self) -> None:
                if self.path == "/metrics":
                    self._send(
                        200, generate_latest(server.metrics.registry), "text/plain; version=0.0.4; charset=utf-8"
                    )
                elif self.path == "/health":
                    self._send(200, b"")
                elif self.path == "/v1/models":
                    data = {
                        "id": server.model_name,
                        "object": "model",
                        "owned_by": "tracediag-test",
                        "max_model_len": 2048,
                    }
                    self._send(200, json.dumps({"object": "list", "data": [data]}).encode())
                else:
                    self._send(404, b'{"detail":"Not Found"}')

            def do_POST(self) -> None:
                if self.path in ("/start_profile", "/stop_profile"):
                    self._profile()
                elif self.path == "/v1/completions":
                    self._completions()
                else:
                    self._send(404, b'{"detail":"Not Found"}')

            def _profile(self) -> None:
                body = self._body()
                out = body.get("output_dir") if server.flavor == "sglang" else None
                target = Path(out) if out else server.profiler_dir
                if self.path == "/stop_profile" and server.flavor == "sglang":
                    target = target or Path(".")  # SGLang's stop takes no directory
                if target is None:  # vLLM registers the routes only with a profiler directory configured
                    self._send(404, b'{"detail":"Not Found"}')
                    return
                done = threading.Event()
                if self.path == "/start_profile":
                    steps = body.get("num_steps") if server.flavor == "sglang" else body.get("max_iterations")
                    server._profile_cmd.put(("start", (target, int(steps) if steps else None), done))
                else:
                    server._profile_cmd.put(("stop", None, done))
                done.wait(30)
                self._send(200, b"")

            def _completions(self) -> None:
                body = self._body()
                prompt = body.get("prompt", "")
                ids = prompt if isinstance(prompt, list) else encode(str(prompt))
                r = server.submit([int(i) % VOCAB for i in ids], body.get("max_tokens") or 16)
                created = int(time.time())
                if not body.get("stream"):
                    toks = []
                    while (t := r.out.get()) is not None:
                        toks.append(t)
                    choice = {"index": 0, "text": decode(toks), "logprobs": None, "finish_reason": "length"}
                    usage = {
                        "prompt_tokens": len(r.prompt),
                        "completion_tokens": len(toks),
                        "total_tokens": len(r.prompt) + len(toks),
                    }
                    doc = {
                        "id": r.rid,
                        "object": "text_completion",
                        "created": created,
                        "model": server.model_name,
                        "choices": [choice],
                        "usage": usage,
                    }
                    self._send(200, json.dumps(doc).encode())
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def event(doc: object) -> None:
                    data = f"data: {doc if isinstance(doc, str) else json.dumps(doc)}\n\n".encode()
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()

                n = 0
                try:
                    while (t := r.out.get()) is not None:
                        n += 1
                        choice = {
                            "index": 0,
                            "text": decode([t]),
                            "logprobs": None,
                            "finish_reason": "length" if n >= r.max_tokens else None,
                        }
                        event(
                            {
                                "id": r.rid,
                                "object": "text_completion",
                                "created": created,
                                "model": server.model_name,
                                "choices": [choice],
                            }
                        )
                    if (body.get("stream_options") or {}).get("include_usage"):  # OpenAI's last chunk: usage only
                        usage = {
                            "prompt_tokens": len(r.prompt),
                            "completion_tokens": n,
                            "total_tokens": len(r.prompt) + n,
                        }
                        event(
                            {
                                "id": r.rid,
                                "object": "text_completion",
                                "created": created,
                                "model": server.model_name,
                                "choices": [],
                                "usage": usage,
                            }
                        )
                    event("[DONE]")
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return
                server._access(self.client_address, "POST", self.path, 200)

        return Handler

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> EngineServer:
        if self.log is not None:
            self.log.info("Starting the tracediag test server on %s (%s flavour)", self.url, self.flavor)
        for t in self.threads:
            t.start()
        return self

    def stop(self) -> None:
        self.stop_event.set()
        self.threads[1].join(30)
        self.httpd.shutdown()
        self.httpd.server_close()
        if self.log is not None:
            for h in list(self.log.handlers):
                h.close()
                self.log.removeHandler(h)

    def __enter__(self) -> EngineServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    """Run the server in the foreground: `python tests/engine_server.py --port-file F [--log L] [--profiler-dir D]`."""
    import argparse

    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--flavor", choices=["vllm", "sglang"], default="vllm")
    ap.add_argument("--port-file", type=Path, required=True, help="the URL is written here once the server listens")
    ap.add_argument("--log", type=Path)
    ap.add_argument("--profiler-dir", type=Path)
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--step-floor", type=float, default=0.0, help="seconds every engine step takes at least")
    ap.add_argument("--log-interval", type=float, default=1.0)
    ap.add_argument("--tokenizer-dir", type=Path, help="also write the clients' tokenizer folder here")
    a = ap.parse_args()
    if a.tokenizer_dir:
        write_tokenizer(a.tokenizer_dir)
    srv = EngineServer(
        a.flavor,
        max_num_seqs=a.max_num_seqs,
        step_floor_s=a.step_floor,
        log_path=a.log,
        log_interval_s=a.log_interval,
        profiler_dir=a.profiler_dir,
    ).start()
    a.port_file.write_text(srv.url)
    try:
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        srv.stop()


if __name__ == "__main__":
    main()
