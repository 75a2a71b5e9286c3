"""Metrics scraping (`tracediag scrape URL`): poll a live vLLM /metrics endpoint into a file that
`tracediag analyze --metrics` reads.

Each scrape is written as soon as it is taken — a marker comment `# tracediag-scrape seq=N unix_ms=T url=U`
followed by the exposition with every sample stamped with the scrape time (Prometheus text format:
`name{labels} value timestamp_ms`) — then flushed and fsynced, so a server that dies mid-run, or Ctrl-C,
loses none of the scrapes already taken. The HTTP client is the standard library's urllib; the request
asks for the plain text format (`Accept: text/plain;version=0.0.4`), not OpenMetrics.

Deadlines: `timeout` bounds each socket read, and each scrape must finish within the same time as a whole
(a server that drips one byte a second is cut off), and the run ends by `duration` plus one interval whatever
the server does. A response that is not a metrics exposition — no status line, a body shorter than its
Content-Length, broken chunked encoding, a truncated gzip body, binary or non-UTF-8 content, an HTTP error —
is a counted failed scrape and is not written.
"""

from __future__ import annotations

import gzip
import http.client
import os
import re
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tracediag.errors import UsageError, one_line

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
ACCEPT = "text/plain;version=0.0.4;q=1,*/*;q=0.1"


def parse_duration(text: str, what: str) -> float:
    """'500ms', '1s', '1.5s', '5m', '2h', '30' (seconds) -> seconds (> 0)."""
    m = _DURATION.match(text or "")
    if not m or float(m[1]) <= 0:
        raise UsageError(f"{what}: '{text}' is not a positive duration such as 500ms, 1s, 5m or 1h")
    return float(m[1]) * _UNIT_S[m[2]]


def metrics_url(url: str) -> str:
    """The URL to poll: http:// is assumed when absent; a bare host gets the /metrics path."""
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UsageError(f"URL: '{url}' is not an http(s) URL of a /metrics endpoint")
    path = parts.path if parts.path not in ("", "/") else "/metrics"
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


MAX_BODY = 256 << 20  # a scrape larger than this is not a metrics page
_SAMPLE = re.compile(r"(?m)^[A-Za-z_:][\w:]*(?:\{[^\n]*\})?[ \t]+\S")


class ScrapeError(ValueError):
    """A response that is not a usable metrics exposition."""


def fetch_checked(url: str, timeout_s: float, deadline: float | None = None) -> str:
    """GET the exposition; ScrapeError/OSError for anything that is not one, within `deadline` (monotonic)."""
    deadline = deadline if deadline is not None else time.monotonic() + timeout_s
    req = urllib.request.Request(
        url, headers={"Accept": ACCEPT, "Accept-Encoding": "gzip", "User-Agent": "tracediag-scrape"}
    )
    try:
        with urllib.request.urlopen(req, timeout=max(0.05, min(timeout_s, deadline - time.monotonic()))) as resp:
            chunks, size = [], 0
            while True:
                if time.monotonic() > deadline:
                    raise ScrapeError(f"the server took longer than {timeout_s:g} s to send the page")
                chunk = resp.read1(65536) if hasattr(resp, "read1") else resp.read(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > MAX_BODY:
                    raise ScrapeError(f"the page is larger than {MAX_BODY >> 20} MiB")
                chunks.append(chunk)
            body = b"".join(chunks)
            declared = resp.headers.get("Content-Length")
            if declared and declared.isdigit() and int(declared) != len(body):
                raise ScrapeError(f"body of {len(body)} bytes, Content-Length says {declared}")
            if resp.headers.get("Content-Encoding", "").lower() == "gzip":
                body = gzip.decompress(body)
    except urllib.error.HTTPError as exc:
        raise ScrapeError(f"HTTP {exc.code} {exc.reason}") from None
    except (http.client.HTTPException, EOFError, zlib.error) as exc:  # no status line, short body, bad gzip
        raise ScrapeError(f"malformed response ({type(exc).__name__}: {str(exc)[:80]})") from None
    if b"\x00" in body:
        raise ScrapeError("binary content, not a metrics exposition")
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise ScrapeError("content is not UTF-8 text, not a metrics exposition") from None
    if not _SAMPLE.search(text):
        raise ScrapeError("no metric sample in the response")
    return text


def scrape_block(body: str, seq: int, ts_ms: int, url: str) -> str:
    """One scrape as written to the file: the marker line, then the exposition stamped with the scrape time."""
    return f"# tracediag-scrape seq={seq} unix_ms={ts_ms} url={url}\n" + stamp(body, ts_ms)


def _has_timestamp(line: str) -> bool:
    close = line.rfind("}")
    rest = line[close + 1 :] if "{" in line and close >= 0 else line.split(None, 1)[1] if " " in line.strip() else ""
    return len(rest.split()) >= 2


def stamp(body: str, ts_ms: int) -> str:
    """Append the scrape time (ms) to every sample line that has no timestamp of its own."""
    out = []
    for line in body.splitlines():
        s = line.strip()
        if s and not s.startswith("#") and " # " not in s and not _has_timestamp(s):
            line = f"{s} {ts_ms}"
        out.append(line)
    return "\n".join(out) + "\n"


@dataclass
class ScrapeResult:
    scrapes: int = 0  # scrapes written
    failures: int = 0  # failed polls
    samples: int = 0  # sample lines written
    bytes: int = 0
    stopped: str = "duration elapsed"  # why the loop ended
    last_error: str | None = None


def scrape_to_file(
    url: str,
    out: Path,
    interval_s: float,
    duration_s: float,
    timeout_s: float = 5.0,
    max_failures: int = 5,
    progress: Callable[[ScrapeResult, int, str], None] | None = None,
) -> ScrapeResult:
    """Poll `url` every `interval_s` for `duration_s`, appending each scrape to `out` as it is taken.

    Stops after `max_failures` consecutive failed polls (the server went away). Ctrl-C ends the loop
    cleanly: everything already written stays; the result says 'interrupted'. The file is created at the first
    scrape taken: a run without one writes nothing (an earlier file at `out` stays as it was).
    """
    res = ScrapeResult()
    planned = max(1, int(duration_s / interval_s + 1e-9))
    start = time.monotonic()
    # The schedule is `planned` scrapes `interval_s` apart; one interval of grace past the duration keeps a
    # briefly stalled machine (or a slow endpoint) from silently dropping the last scrape.
    deadline = start + duration_s + interval_s
    consecutive = 0
    f = None  # opened at the first scrape taken: a run with none leaves no file (and an earlier one as it was)
    try:
        seq = 0
        while True:
            now = time.monotonic()
            if now >= deadline or seq >= planned:
                break
            ts_ms = int(time.time() * 1000)
            try:
                body = fetch_checked(url, timeout_s, deadline=min(time.monotonic() + timeout_s, deadline))
            except (OSError, ValueError) as exc:
                res.failures += 1
                consecutive += 1
                # one line: the reason may hold the server's own text ("HTTP/9.9 abc\r\n", urllib's redirect loop)
                res.last_error = one_line(str(getattr(exc, "reason", exc)))
                if progress:
                    progress(res, planned, f"failed: {res.last_error}")
                if consecutive >= max_failures:
                    res.stopped = f"server unreachable ({consecutive} failed polls in a row: {res.last_error})"
                    break
            else:
                consecutive = 0
                block = scrape_block(body, res.scrapes, ts_ms, url)
                f = f or open(out, "w", encoding="utf-8")  # noqa: SIM115 (closed below, whatever happens)
                f.write(block)  # one write per scrape, then flush + fsync: taken samples survive a crash
                f.flush()
                os.fsync(f.fileno())
                res.scrapes += 1
                res.bytes += len(block.encode())
                res.samples += sum(1 for ln in body.splitlines() if ln.strip() and not ln.lstrip().startswith("#"))
                if progress:
                    progress(res, planned, "ok")
            seq += 1
            wait = start + seq * interval_s - time.monotonic()
            if wait > 0:
                time.sleep(min(wait, max(0.0, deadline - time.monotonic())))
    except KeyboardInterrupt:
        res.stopped = "interrupted (Ctrl-C)"
    finally:
        if f is not None:
            f.close()
    return res
