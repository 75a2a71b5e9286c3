"""The long-running surfaces as fuzz kinds of `--target commands`: the MCP server's tools and `tracediag scrape`.

`mcp-arguments`: one `tracediag mcp` server per case (a subprocess, stdio JSON-RPC written by hand, so that any
frame can be sent), the case's workspace (tests/fuzz/commands.py) as its only allowed root, a folder beside it that
is not a root (a secret file in it, a link to it from inside the root). The case sends 2-5 `tools/call` requests
whose arguments are drawn from the tools' input schemas and made hostile (paths outside the root, `..`, links,
NULs, huge strings, numbers where text goes, lists, dicts, 1e308, negative numbers, unknown keys, SQL that is not
a SELECT, huge max_rows), some malformed frames between them (a line that is not JSON, a request whose params are
a list, an unknown method, an unknown tool), then one valid call. Contract: every call answers, within the time
limit, a result or a tool error whose text is one line starting `tracediag: error:` (or a JSON-RPC error for a
frame the protocol refuses), never `tracediag: internal error`; the valid call at the end succeeds (the server is
alive); no file of the user's changed, nothing written in the folder outside the root, no `*.partial` left.

`scrape`: `tracediag scrape` for a few intervals against an HTTP server on 127.0.0.1 (a thread of the case's
process, an ephemeral port) that answers each poll with a hostile variant of a real /metrics page of
tests/data/external/*/metrics: truncated, binary, a huge line, not UTF-8, a wrong content type, gzip (whole or
cut), an HTTP error, a redirect (to itself, to a closed port), a body shorter than its Content-Length (the
connection closed mid-body), a slow drip, no status line, the connection closed at once. Contract: exit 0 or 2
(exit 2 one line on stderr), never 3, done within duration + interval + timeout (and a few seconds to start);
after exit 0 the output file is whole (one marker per scrape said written, ending in a newline), after exit 2 it
is absent (or, when it was there before, unchanged); no other file of the user's changed.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import queue
import random
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from fuzz import commands, harness

REPO = commands.REPO
METRICS = sorted((REPO / "tests" / "data" / "external").glob("*/metrics/*.prom"))
TOOLS = ("analyze", "findings", "explain", "query", "diff", "check")
PATH_ARGS = {
    "analyze": ("model", "out", "log", "metrics", "bench", "nccl_tests", "topology", "tp1_baseline", "config"),
    "check": ("model", "baseline", "config", "out", "log", "metrics", "bench", "tp1_baseline"),
    "diff": ("before", "after", "model", "out"),
}
OTHER_ARGS = {
    "analyze": ("tp", "slo", "hbm_bandwidth", "peak_tflops", "graph_capture", "ranks", "keep_python", "memory_limit"),
    "check": ("tp", "fail_on", "rules", "require", "slo", "hbm_bandwidth", "ranks", "memory_limit"),
    "diff": ("force_compare",),
    "query": ("max_rows", "time_limit_s"),
}
SQL = ["SELECT count(*) FROM steps", "DROP TABLE steps", "SELECT 1; DROP TABLE steps", "ATTACH '/tmp/x.db'",
       "COPY steps TO '{outside}/copied.csv'", "SELECT * FROM read_text('{outside}/secret.txt')", "", ";", "\x00",
       "SELECT " + "1+" * 5000 + "1", "PRAGMA memory_limit='1TB'", "INSTALL httpfs", "SELECT * FROM kernels",
       "CREATE TABLE t AS SELECT 1", "SELECT repeat('x', 100000000)", "SELECT * FROM range(1e12)",
       "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM r) SELECT count(*) FROM r",
       "EXPLAIN ANALYZE SELECT 1"]  # fmt: skip
VALUES = [None, 0, -1, 1, 2**63, -(2**70), 1e308, -1e308, 2.5, True, [], {}, [1, "a"], {"x": [1]}, "", " ", "\x00",
          "x" * 100_000, "nan", "inf", "-1", "1e400", "é" * 1000, ["a"] * 1000]  # fmt: skip


def _hostile_path(rnd: random.Random, ws: dict[str, Path], work: Path) -> object:
    user, outside = ws["folder"], work / "outside"
    return rnd.choice([
        str(ws["trace"]), str(ws["config"]), str(ws["log"]), str(ws["run"]), str(ws["findings"]), str(ws["db"]),
        str(ws["store"]), str(ws["notes"]), str(user), str(outside / "secret.txt"), str(user / "link" / "secret.txt"),
        str(user / "link"), str(user / ".." / "outside" / "secret.txt"), "../outside/secret.txt", "/proc/self/environ",
        "/etc/passwd", "/dev/zero", str(user / "dangling"), str(user / "new-out"), str(outside / "new-out"),
        "run/findings.json", "", " ", "\x00", f"{user}/\x00x", "~", "file:///etc/passwd", str(user / ("n" * 300)),
        "x" * 100_000, 7, 1e308, -1, [str(ws["trace"])], {"path": str(ws["trace"])}, None, True,
    ])  # fmt: skip


def _arguments(rnd: random.Random, tool: str, ws: dict[str, Path], work: Path) -> object:
    """A tool's arguments: mostly valid names with hostile values, sometimes unknown keys or not a dict at all."""
    if rnd.random() < 0.05:
        return rnd.choice([[1, 2], "x", 5, None, {"": 1}])
    run = str(ws["run"])
    args: dict[str, object] = {}
    if tool in ("analyze", "check"):
        args["inputs"] = rnd.choice([[str(ws["trace"])], [str(ws["trace"])], [], str(ws["trace"]),
                                     [_hostile_path(rnd, ws, work)], [str(ws["trace"])] * 50, None, {}])  # fmt: skip
    if tool in ("findings", "explain", "query"):
        args["run"] = rnd.choice([run, run, str(ws["store"]), _hostile_path(rnd, ws, work)])
    if tool == "explain":
        args["rule"] = rnd.choice(["SCH001", "sch001", "NOPE", "", "x" * 10_000, 5, None, ["SCH001"], "SCH001\x00"])
    if tool == "query":
        sql = rnd.choice(SQL).replace("{outside}", str(work / "outside"))
        args["sql"] = rnd.choice([sql, sql, sql, 1, None, [sql], {"sql": sql}])
    paths = PATH_ARGS.get(tool, ())
    others = OTHER_ARGS.get(tool, ())
    for name in rnd.sample(paths, rnd.randint(0, min(3, len(paths)))):
        args[name] = _hostile_path(rnd, ws, work)
    for name in rnd.sample(others, rnd.randint(0, min(3, len(others)))):
        valid = [1, 2, "ttft=500,tpot=50", "warning", "COL*", "1GiB", 200, 10_000_000, 0.5, False]
        args[name] = rnd.choice(valid if rnd.random() < 0.5 else VALUES)
    if tool == "diff":
        args.setdefault("before", run)
        args.setdefault("after", rnd.choice([run, str(ws["trace"])]))
    if rnd.random() < 0.2:
        args[rnd.choice(["unknown", "ctx", "roots", "Inputs", "__class__", "x" * 300])] = rnd.choice(VALUES)
    for name in list(args) if rnd.random() < 0.15 else ():  # a required argument left out
        if rnd.random() < 0.3:
            del args[name]
    return args


def _request(i: int, tool: str, arguments: object) -> dict:
    return {"jsonrpc": "2.0", "id": i, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}


MALFORMED = [
    "not json",
    "{",
    "[]",
    '{"jsonrpc": "2.0"}',
    '{"jsonrpc": "2.0", "id": 900, "method": "tools/call", "params": [1, 2]}',
    '{"jsonrpc": "2.0", "id": 901, "method": "tools/call", "params": "x"}',
    '{"jsonrpc": "2.0", "id": 902, "method": "tools/call", "params": {"name": "nope", "arguments": {}}}',
    '{"jsonrpc": "2.0", "id": 903, "method": "tools/call", "params": {"name": 5}}',
    '{"jsonrpc": "2.0", "id": 904, "method": "no/such/method", "params": {}}',
    '{"jsonrpc": "1.0", "id": 905, "method": "tools/list"}',
    '{"jsonrpc": "2.0", "id": {"a": 1}, "method": "tools/list"}',
    '{"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 77}}',
    "\x00\x01\x02",
    "x" * 200_000,
]


def mcp_frames(rnd: random.Random, ws: dict[str, Path], work: Path) -> list:
    """The frames of one case after the handshake: hostile calls, malformed frames, and the valid call last."""
    frames: list = []
    for n in range(rnd.randint(2, 5)):
        if rnd.random() < 0.25:
            frames.append(rnd.choice(MALFORMED))
        tool = rnd.choice(TOOLS)
        frames.append(_request(10 + n, tool, _arguments(rnd, tool, ws, work)))
    frames.append(_request(99, "findings", {"run": str(ws["run"])}))
    return frames


class _Server:
    """`tracediag mcp` in a subprocess, its stdout lines read by a thread into a queue."""

    def __init__(self, work: Path, user: Path) -> None:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tracediag", "mcp", "--runs-dir", str(work / "runs"), "--allow-root", str(user)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(user), env=env,
        )  # fmt: skip
        self.lines: queue.Queue = queue.Queue()
        self.stderr = bytearray()
        threading.Thread(target=self._read, args=(self.proc.stdout, True), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, False), daemon=True).start()

    def _read(self, stream, is_out: bool) -> None:
        for line in stream:
            if is_out:
                self.lines.put(line)
            else:
                self.stderr += line[:2000]
        if is_out:
            self.lines.put(None)

    def send(self, frame) -> bool:
        data = frame if isinstance(frame, str) else json.dumps(frame)
        try:
            self.proc.stdin.write(data.encode("utf-8", "surrogatepass") + b"\n")
            self.proc.stdin.flush()
        except OSError:
            return False
        return True

    def answer(self, rid: object, seconds: float) -> dict | None:
        """The response to request `rid` (notifications and other responses skipped); None: none in time."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                return None
            if line is None:
                return {"closed": True}
            try:
                msg = json.loads(line)
            except ValueError:
                return {"not_json": line[:200].decode("utf-8", "replace")}
            if isinstance(msg, dict) and msg.get("id") == rid and "method" not in msg:
                return msg
        return None

    def close(self) -> None:
        for act in (lambda: self.proc.stdin.close(), lambda: self.proc.wait(5), self.proc.kill, self.proc.wait):
            try:
                act()
            except (OSError, subprocess.TimeoutExpired):
                continue


def _judge_answer(frame, msg: dict | None, seconds: float) -> harness.Outcome:
    shown = (frame if isinstance(frame, str) else json.dumps(frame))[:160]
    if msg is None:
        return harness.Outcome("hang", f"no answer within {seconds} s to {shown}")
    if "closed" in msg or "not_json" in msg:
        return harness.Outcome("internal", f"server {'stopped' if 'closed' in msg else 'wrote non-JSON'}: {shown}",
                               "mcp")  # fmt: skip
    if "error" in msg:  # the protocol's own refusal (invalid params, unknown method)
        err = msg["error"] if isinstance(msg["error"], dict) else {}
        return harness.Outcome("input_error", f"JSON-RPC {err.get('code')}: {err.get('message')}"[:300])
    result = msg.get("result") or {}
    if not result.get("isError"):
        return harness.Outcome("ok")
    text = " ".join(c.get("text", "") for c in result.get("content") or [])
    if "internal error" in text:
        return harness.Outcome("internal", text[:300], "mcp")
    if not text.startswith("tracediag: error:") or "\n" in text.strip():
        return harness.Outcome("bad_error", f"{text[:200]!r} for {shown}")
    return harness.Outcome("input_error", text[:300])


def _calls(server: _Server, frames: list, seconds: float) -> harness.Outcome:
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "fuzz", "version": "0"}}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
    server.send(init)
    if server.answer(1, 60) is None:
        return harness.Outcome("hang", "no answer to initialize within 60 s")
    server.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
    worst = harness.Outcome("ok")
    for frame in frames:
        if not server.send(frame):
            return harness.Outcome("internal", f"server stdin closed before {str(frame)[:160]}", "mcp")
        if isinstance(frame, str):  # malformed: an answer (an error) or none, both fine; the last call says alive
            rid = next((i for i in range(900, 906) if f'"id": {i},' in frame), None)
            msg = server.answer(rid, 2) if rid is not None else None
            out = _judge_answer(frame, msg, 2) if msg is not None else harness.Outcome("ok")
        else:
            out = _judge_answer(frame, server.answer(frame["id"], seconds), seconds)
            if frame["id"] == 99 and out.status != "ok":
                return harness.Outcome(out.status if out.defect else "internal",
                                       f"the valid call after the others: {out.detail}", "mcp")  # fmt: skip
        if out.defect:
            return out
        if out.status == "input_error":
            worst = out
    return worst


def check_mcp(case: commands.Case, seconds: float) -> harness.Outcome:
    user, outside = case.work / "user", case.work / "outside"
    before_user, before_out = commands._digests(user), commands._digests(outside)
    outs = {str(a.get("out")) for f in case.args if isinstance(f, dict) for a in [f["params"].get("arguments")]
            if isinstance(a, dict) and isinstance(a.get("out"), str)}  # fmt: skip
    server = _Server(case.work, user)
    try:
        out = _calls(server, case.args, seconds)
    finally:
        server.close()
    if out.defect:
        if "Traceback" in server.stderr.decode("utf-8", "replace"):
            out = harness.Outcome(out.status, out.detail + " | " + server.stderr.decode("utf-8", "replace")[-200:],
                                  out.where)  # fmt: skip
        return out
    after = commands._digests(user)
    changed = sorted(p for p, h in before_user.items()
                     if after.get(p) != h and not any(p.startswith(o.rstrip("/") + "/") for o in outs))  # fmt: skip
    if changed:
        return harness.Outcome("partial", f"the calls changed or removed the user's {changed[:3]}")
    if commands._digests(outside) != before_out or sorted(p.name for p in outside.iterdir()) != ["secret.txt"]:
        return harness.Outcome("partial", f"a file was written outside the root: {sorted(outside.iterdir())[:3]}")
    staging = [str(p) for p in case.work.rglob("*.partial")]
    if staging:
        return harness.Outcome("partial", f"staging left: {staging[:2]}")
    return out


def mcp_workspace(ws: dict[str, Path], work: Path) -> None:
    outside = work / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("sk-live-7f3b9c0d1e2a4b5c6d7e8f9a0b1c2d3e\n")
    (ws["folder"] / "link").symlink_to(outside)
    (ws["folder"] / "dangling").symlink_to(work / "nowhere")


# --- scrape ------------------------------------------------------------------------------------------------

BEHAVIOURS = ("ok", "truncated", "binary", "huge-line", "not-utf8", "content-type", "gzip", "gzip-cut", "http-error",
              "redirect-self", "redirect-closed", "short-body", "drip", "no-status", "close", "empty", "comments-only",
              "chunked-bad")  # fmt: skip


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _body(rnd: random.Random, how: str) -> bytes:
    page = rnd.choice(METRICS).read_bytes()
    if how == "truncated":
        return page[: rnd.randrange(len(page))]
    if how == "binary":
        i = rnd.randrange(len(page))
        return page[:i] + bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 64))) + b"\x00" + page[i:]
    if how == "huge-line":
        return page + b'vllm:huge{a="' + b"x" * rnd.choice([10_000, 1_000_000, 8_000_000]) + b'"} 1\n'
    if how == "not-utf8":
        return page.replace(b"vllm", b"vllm\xff", 1) if b"vllm" in page else b"\xff" + page
    if how == "comments-only":
        return b"".join(ln + b"\n" for ln in page.splitlines() if ln.startswith(b"#"))
    return page


def _respond(h: BaseHTTPRequestHandler, rnd: random.Random, how: str, closed: int) -> None:
    w = h.wfile
    if how == "close":
        return
    if how == "no-status":
        w.write(rnd.choice([b"garbage\r\n\r\n", b"\x00\x01", b"HTTP/9.9 abc\r\n\r\n"]))
        return
    body = _body(rnd, how)
    status, headers = 200, {"Content-Type": "text/plain; version=0.0.4"}
    if how == "content-type":
        headers["Content-Type"] = rnd.choice(["text/html", "application/octet-stream", "application/openmetrics-text",
                                              "image/png", "text/plain; charset=latin-1", ""])  # fmt: skip
    elif how == "gzip" or how == "gzip-cut":
        body = gzip.compress(body)
        body = body[: rnd.randrange(len(body))] if how == "gzip-cut" else body
        headers["Content-Encoding"] = "gzip"
    elif how == "http-error":
        status = rnd.choice([400, 401, 403, 404, 429, 500, 502, 503])
    elif how.startswith("redirect"):
        status = rnd.choice([301, 302, 307])
        headers["Location"] = "/metrics" if how == "redirect-self" else f"http://127.0.0.1:{closed}/metrics"
        body = b""
    elif how == "empty":
        body = b""
    w.write(f"HTTP/1.1 {status} X\r\n".encode())
    for k, v in headers.items():
        w.write(f"{k}: {v}\r\n".encode())
    if how == "chunked-bad":
        w.write(b"Transfer-Encoding: chunked\r\n\r\n" + f"{len(body) + 99:x}\r\n".encode() + body[:100])
        return
    declared = len(body) * 2 + 10 if how == "short-body" else len(body)
    w.write(f"Content-Length: {declared}\r\nConnection: close\r\n\r\n".encode())
    if how == "drip":
        for i in range(0, min(len(body), 40), 4):
            w.write(body[i : i + 4])
            w.flush()
            time.sleep(0.1)
        w.write(body[40:])
        return
    w.write(body)


def serve(plan: list[str], seed: str) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 whose n-th GET gets the behaviour plan[n % len(plan)]."""
    state = {"n": 0}
    closed = _closed_port()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            n = state["n"]
            state["n"] += 1
            with contextlib.suppress(OSError):
                _respond(self, random.Random(f"{seed}:{n}"), plan[n % len(plan)], closed)
            self.close_connection = True

        def log_message(self, *args) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True).start()
    return httpd


def scrape_case(rnd: random.Random, ws: dict[str, Path], work: Path) -> dict:
    plan = [rnd.choice(BEHAVIOURS) for _ in range(rnd.randint(1, 4))]
    if rnd.random() < 0.4:
        plan.insert(rnd.randrange(len(plan) + 1), "ok")
    interval = rnd.choice([0.1, 0.2, 0.3])
    duration = rnd.choice([0.3, 0.6, 1.0])
    timeout = rnd.choice([0.2, 0.5, 1.0])
    out = rnd.choice([work / "out.prom", work / "out.prom", work / "out.prom", ws["notes"], work / "prev.prom"])
    if out.name == "prev.prom":  # a file of an earlier scrape, which tracediag may replace
        out.write_text("# tracediag-scrape seq=0 unix_ms=1 url=http://x/metrics\nvllm:x 1 1\n")
    options = ["--interval", f"{interval * 1000:g}ms", "--duration", f"{duration:g}s", "--timeout", f"{timeout:g}s",
               "--max-failures", str(rnd.choice([1, 2, 5])), "-o", str(out), "-q"]  # fmt: skip
    return {"plan": plan, "options": options, "out": str(out), "limit": duration + interval + timeout,
            "seed": f"{rnd.random()}"}  # fmt: skip


def check_scrape(case: commands.Case, seconds: float) -> harness.Outcome:
    spec = case.args[0]
    out = Path(spec["out"])
    before = commands._digests(case.work)
    was = before.get(str(out))
    httpd = serve(spec["plan"], spec["seed"])
    args = ["scrape", f"http://127.0.0.1:{httpd.server_address[1]}/metrics", *spec["options"]]
    shown = f"{spec['plan']} {' '.join(spec['options'][:8])}"
    t0 = time.monotonic()
    try:
        status, err = harness.run_cli(args, min(seconds, spec["limit"] + 30))
    finally:
        httpd.shutdown()
        httpd.server_close()
    took = time.monotonic() - t0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if status is None or took > spec["limit"] + 5:
        return harness.Outcome("hang", f"scrape ran {took:.1f} s (limit {spec['limit']:.1f} s + 5): {shown}")
    if status not in (0, 2):
        return harness.Outcome("internal", f"exit {status}: {' | '.join(lines)[-300:]} ({shown})", "cli")
    if status == 2 and len(lines) != 1:
        return harness.Outcome("bad_error", f"exit 2 with {len(lines)} lines: {' | '.join(lines)[:300]}")
    after = commands._digests(case.work)
    changed = sorted(p for p, h in before.items() if after.get(p) != h and p != str(out))
    if changed:
        return harness.Outcome("partial", f"scrape changed the user's {changed[:3]} ({shown})")
    if status == 2:
        if after.get(str(out)) != was:
            return harness.Outcome("partial", f"exit 2 left {out.name} {'changed' if was else 'behind'} ({shown})")
        return harness.Outcome("input_error", lines[0][:300])
    text = out.read_text()
    said = int(lines[-1].split()[0]) if lines and lines[-1].split()[0].isdigit() else -1
    if text.count("# tracediag-scrape seq=") != said or not text.endswith("\n"):
        return harness.Outcome("partial", f"{said} scrapes said, the file holds {text.count('# tracediag-scrape')}")
    return harness.Outcome("ok")
