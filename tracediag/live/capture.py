"""`tracediag capture URL`: record an incident in progress from a live vLLM or SGLang server into one folder.

One bounded window: start the engine's torch profiler through its HTTP API (`POST /start_profile`; vLLM
registers the route only when the server runs with a profiler directory — `--profiler-config` /
VLLM_TORCH_PROFILER_DIR — and answers 404 otherwise; SGLang takes `{"output_dir", "num_steps"}` and needs
SGLANG_TORCH_PROFILER_DIR or the output_dir), scrape `/metrics` during the same window (as `tracediag scrape`),
copy the lines the server log gained in that window from a file, `POST /stop_profile` (both profiler requests
with retries: tracediag.live.profiler_requests), wait for the trace files to be written (their size stops
changing), and analyze the bundle. The folder holds `capture.json` (the window, what was asked and answered),
`metrics.prom`, `server.log`, `traces/` and the analysis outputs (report.html, findings.json, trace.duckdb);
`tracediag analyze/check/diff FOLDER` read it again later.

Bounded: `duration` (the window), `steps` (engine steps to profile, passed to the engine when it takes them),
and a whole-run deadline; Ctrl-C ends the window early and keeps everything captured so far.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tracediag.errors import UsageError
from tracediag.ingest.capture_folder import MANIFEST, TRACE_SUFFIXES
from tracediag.live.profiler_requests import ProfilerAnswer, post_profiler
from tracediag.live.scrape import fetch_checked, scrape_block


@dataclass
class CaptureResult:
    url: str
    engine: str | None = None  # 'vllm' or 'sglang' (from the metric names)
    started_unix_s: float | None = None
    stopped_unix_s: float | None = None
    profiler: str = "not started"  # 'recorded', 'not enabled on the server (404)', 'failed: …'
    traces: list[str] = field(default_factory=list)
    scrapes: int = 0
    scrape_failures: int = 0
    log_lines: int | None = None
    stopped: str = "duration elapsed"
    notes: list[str] = field(default_factory=list)
    # each profiler request and what every attempt got, e.g. {"endpoint": "start_profile", "status": 200,
    # "attempts": ["HTTP 503", "HTTP 200"]} (tracediag.live.profiler_requests)
    profiler_requests: list[dict] = field(default_factory=list)


def base_url(url: str) -> str:
    """scheme://host:port of the server (a /metrics or other path is dropped)."""
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"URL: '{url}' is not an http(s) URL of a vLLM or SGLang server")
    return urlunsplit((parts.scheme, parts.netloc, "", "", ""))


def _ask_profiler(
    res: CaptureResult, url: str, body: dict | None, timeout_s: float, deadline: float, say
) -> ProfilerAnswer:
    """One profiler request with its retries, recorded in the result; one that took several tries says so."""
    answer = post_profiler(url, body, timeout_s, deadline=deadline)
    res.profiler_requests.append({"endpoint": answer.endpoint, "status": answer.status, "attempts": answer.attempts})
    if len(answer.attempts) > 1:
        say(f"/{answer.endpoint}: {len(answer.attempts)} attempts ({'; '.join(answer.attempts)})")
    return answer


def _new_traces(folders: list[Path], since: float) -> list[Path]:
    out = []
    for d in folders:
        if d.is_dir():
            for p in d.rglob("*"):
                if p.is_file() and p.name.endswith(TRACE_SUFFIXES) and p.stat().st_mtime >= since - 1:
                    out.append(p)
    return sorted(set(out))


def _wait_written(paths: list[Path], deadline: float, poll_s: float = 0.5) -> list[Path]:
    """Wait until every file's size is the same on two polls in a row (the profiler finished writing)."""
    last: dict[Path, int] = {}
    while time.monotonic() < deadline:
        sizes = {p: p.stat().st_size for p in paths if p.exists()}
        if sizes and sizes == last:
            return list(sizes)
        last = sizes
        time.sleep(poll_s)
    return [p for p in paths if p.exists()]


def _scrape_window(
    res: CaptureResult,
    root: str,
    metrics_path: Path,
    times: tuple[float, float, float],
    interval_s: float,
    timeout_s: float,
    say: Callable[[str], None],
) -> None:
    """Scrape /metrics every interval_s into `metrics_path` (each scrape flushed to disk, so a capture cut short
    keeps what it got) from the window's start until its end or the hard deadline (`times`, monotonic); Ctrl-C
    ends the window early."""
    started_mono, window_end, hard_deadline = times
    try:
        with open(metrics_path, "w", encoding="utf-8") as f:
            seq = 0
            while time.monotonic() < min(window_end, hard_deadline):
                ts_ms = int(time.time() * 1000)
                try:
                    text = fetch_checked(
                        root + "/metrics", timeout_s, deadline=min(window_end + timeout_s, hard_deadline)
                    )
                except (OSError, ValueError) as exc:
                    res.scrape_failures += 1
                    say(f"scrape failed: {exc}")
                else:
                    f.write(scrape_block(text, seq, ts_ms, root + "/metrics"))
                    f.flush()
                    os.fsync(f.fileno())
                    res.scrapes += 1
                    seq += 1
                wait = started_mono + (res.scrapes + res.scrape_failures) * interval_s - time.monotonic()
                if wait > 0:
                    time.sleep(min(wait, max(0.0, window_end - time.monotonic())))
    except KeyboardInterrupt:
        res.stopped = "interrupted (Ctrl-C)"


def _stop_and_collect(
    res: CaptureResult,
    root: str,
    traces_dir: Path,
    profile_dir: Path | None,
    timeout_s: float,
    hard_deadline: float,
    say: Callable[[str], None],
) -> None:
    """Stop the profiler, wait for the trace files it writes (in the capture's folder or --profile-dir) to be
    complete, and copy them into `traces_dir`."""
    stop = _ask_profiler(res, root + "/stop_profile", {}, max(timeout_s, 30.0), hard_deadline, say)
    if stop.status is None:
        res.profiler = f"stop failed: {stop.error}"
    else:
        res.profiler = "recorded" if stop.status == 200 else f"stop failed: HTTP {stop.status}"
    folders = [traces_dir] + ([profile_dir] if profile_dir else [])
    found: list[Path] = []
    while time.monotonic() < hard_deadline and not found:
        found = _new_traces(folders, res.started_unix_s)
        if not found:
            time.sleep(0.5)
    found = _wait_written(found, hard_deadline)
    for p in found:
        dest = traces_dir / p.name
        if p.resolve() != dest.resolve():
            shutil.copy2(p, dest)
        res.traces.append(dest.name)
    if not found:
        res.notes.append(
            "No trace file appeared"
            + (f" in {profile_dir}" if profile_dir else "")
            + ": pass --profile-dir with the server's profiler directory (it must be readable from here)."
        )


def capture(
    url: str,
    out: Path,
    duration_s: float,
    interval_s: float = 1.0,
    steps: int | None = None,
    deadline_s: float | None = None,
    profile_dir: Path | None = None,
    log_file: Path | None = None,
    timeout_s: float = 5.0,
    progress: Callable[[str], None] | None = None,
) -> CaptureResult:
    """Record one window into `out` (created; must be empty). Returns what was captured; never raises for a
    server that dies or refuses the profiler — the result says so."""
    say = progress or (lambda _msg: None)
    root = base_url(url)
    out = Path(out)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out: {out} exists and is not empty; captures go into a new folder")
    traces_dir = out / "traces"
    traces_dir.mkdir(parents=True, exist_ok=True)
    res = CaptureResult(url=root)
    hard_deadline = time.monotonic() + (deadline_s if deadline_s else duration_s + 120.0)
    log_offset = log_file.stat().st_size if log_file and log_file.exists() else None
    # What the server is: its metric names.
    try:
        first = fetch_checked(root + "/metrics", timeout_s, deadline=hard_deadline)
        res.engine = "sglang" if "sglang:" in first else "vllm" if "vllm:" in first else None
    except (OSError, ValueError) as exc:
        raise UsageError(f"{root}/metrics did not answer: {exc}") from None
    body: dict | None = {}
    if res.engine == "sglang":
        body = {"output_dir": str(traces_dir.resolve())} | ({"num_steps": steps} if steps else {})
    elif steps:
        body = {"max_iterations": steps}
    res.started_unix_s = time.time()
    # starting a profiler can take seconds on a busy host
    started = _ask_profiler(res, root + "/start_profile", body, max(timeout_s, 30.0), hard_deadline, say)
    code = started.status
    if code is None:
        res.profiler = f"failed: {started.error}"
    if code == 200:
        res.profiler = "recording"
        say(f"profiler started on {root}")
    elif code == 404:
        res.profiler = "not enabled on the server (404)"
        res.notes.append(
            "The server has no profiler endpoints: start vLLM with a profiler directory (--profiler-config "
            '\'{"profiler": "torch", "torch_profiler_dir": DIR}\' or VLLM_TORCH_PROFILER_DIR=DIR on older versions), '
            "SGLang with SGLANG_TORCH_PROFILER_DIR=DIR; metrics and the log were still captured."
        )
        say(res.notes[-1])
    elif code is not None:
        res.profiler = f"failed: /start_profile answered HTTP {code}"
    started_mono = time.monotonic()  # the window starts once the profiler runs
    window_end = started_mono + duration_s
    metrics_path = out / "metrics.prom"
    _scrape_window(res, root, metrics_path, (started_mono, window_end, hard_deadline), interval_s, timeout_s, say)
    if time.monotonic() >= hard_deadline and res.stopped == "duration elapsed":
        res.stopped = "deadline"
    res.stopped_unix_s = time.time()
    if res.profiler == "recording":
        _stop_and_collect(res, root, traces_dir, profile_dir, timeout_s, hard_deadline, say)
    if log_file is not None:
        if not log_file.exists():
            res.notes.append(f"{log_file}: no such log file; no log lines copied")
        else:
            with open(log_file, "rb") as src, open(out / "server.log", "wb") as dst:
                start = log_offset or 0
                if src.seek(0, 2) < start:
                    start = 0  # the log was rotated or truncated: take it from the start
                src.seek(start)
                data = src.read()
                dst.write(data)
            res.log_lines = data.count(b"\n")
    (out / MANIFEST).write_text(json.dumps({"schema": "tracediag/capture-v1", **asdict(res)}, indent=2) + "\n")
    return res
