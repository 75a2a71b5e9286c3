"""Metrics scraping (`tracediag scrape URL`): poll a live vLLM /metrics endpoint into a file that
`tracediag analyze --metrics` reads.

Each scrape is written as soon as it is taken — a marker comment `# tracediag-scrape seq=N unix_ms=T url=U`
followed by the exposition with every sample stamped with the scrape time (Prometheus text format:
`name{labels} value timestamp_ms`) — then flushed and fsynced, so a server that dies mid-run, or Ctrl-C,
loses none of the scrapes already taken. The HTTP client is the standard library's urllib; the request
asks for the plain text format (`Accept: text/plain;version=0.0.4`), not OpenMetrics.
"""

from __future__ import annotations

import gzip
import os
import re
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tracediag.errors import UsageError

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


def fetch(url: str, timeout_s: float) -> str:
    req = urllib.request.Request(
        url, headers={"Accept": ACCEPT, "Accept-Encoding": "gzip", "User-Agent": "tracediag-scrape"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        body = resp.read()
        if resp.headers.get("Content-Encoding", "").lower() == "gzip":
            body = gzip.decompress(body)
    return body.decode("utf-8", errors="replace")


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
    cleanly: everything already written stays; the result says 'interrupted'.
    """
    res = ScrapeResult()
    planned = max(1, int(duration_s / interval_s + 1e-9))
    start = time.monotonic()
    # The schedule is `planned` scrapes `interval_s` apart; one interval of grace past the duration keeps a
    # briefly stalled machine (or a slow endpoint) from silently dropping the last scrape.
    deadline = start + duration_s + interval_s
    consecutive = 0
    with open(out, "w", encoding="utf-8") as f:
        try:
            seq = 0
            while True:
                now = time.monotonic()
                if now >= deadline or seq >= planned:
                    break
                ts_ms = int(time.time() * 1000)
                try:
                    body = fetch(url, timeout_s)
                except (urllib.error.URLError, OSError, ValueError) as exc:
                    res.failures += 1
                    consecutive += 1
                    res.last_error = str(getattr(exc, "reason", exc))
                    if progress:
                        progress(res, planned, f"failed: {res.last_error}")
                    if consecutive >= max_failures:
                        res.stopped = f"server unreachable ({consecutive} failed polls in a row: {res.last_error})"
                        break
                else:
                    consecutive = 0
                    block = f"# tracediag-scrape seq={res.scrapes} unix_ms={ts_ms} url={url}\n" + stamp(body, ts_ms)
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
    return res
