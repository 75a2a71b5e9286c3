"""The engine's profiler endpoints (`POST /start_profile`, `/stop_profile`), asked with retries.

A busy or restarting server may refuse a connection or answer 5xx for a moment; one such failure should not cost
the incident's trace. A request is repeated, after a growing pause (0.5 s, 1 s, 2 s), only when it got no answer
because it never reached the server or the server dropped it unanswered (connection refused, reset, closed
before a status line, a connect timeout), or when the answer is a 5xx a server gives while it cannot act
(500, 502, 503, 504). Any other answer (200, 404, …) is final and never repeated, and neither is a request the
server received and is still working on when the timeout ends: starting a profiler can take seconds, and a
second start while the first is under way would fail or restart the window.
"""

from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

RETRY_STATUSES = frozenset({500, 502, 503, 504})
ATTEMPTS = 4
FIRST_PAUSE_S = 0.5


@dataclass
class ProfilerAnswer:
    """What a profiler request got: the final HTTP status (None: no answer) and each attempt in words."""

    endpoint: str
    status: int | None = None
    error: str | None = None  # the last attempt's failure when there was no answer
    attempts: list[str] = field(default_factory=list)


def _no_answer(exc: BaseException) -> tuple[str, bool]:
    """(what happened, whether the request may be sent again) for an exception that came instead of an answer."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused", True
    if isinstance(reason, http.client.RemoteDisconnected):  # before ConnectionResetError: it is one
        return "closed without an answer", True
    if isinstance(reason, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError)):
        return f"connection lost ({type(reason).__name__})", True
    if isinstance(exc, urllib.error.URLError) and isinstance(reason, (TimeoutError, socket.timeout)):
        return "no connection within the timeout", True  # urllib wraps a connect timeout, not a read timeout
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return "sent, no answer within the timeout (not repeated: the server may be acting on it)", False
    return f"{type(reason).__name__}: {reason}", False


def post_profiler(
    url: str,
    body: dict | None,
    timeout_s: float,
    *,
    deadline: float | None = None,
    attempts: int = ATTEMPTS,
    first_pause_s: float = FIRST_PAUSE_S,
    sleep: Callable[[float], None] = time.sleep,
) -> ProfilerAnswer:
    """POST `body` (JSON) to `url`, repeating it as the module says, never past `deadline` (time.monotonic())."""
    answer = ProfilerAnswer(endpoint=url.rsplit("/", 1)[-1])
    data = json.dumps(body).encode() if body is not None else b""
    pause = first_pause_s
    for n in range(1, attempts + 1):
        req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
        again = False
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                resp.read()
                answer.status, answer.error = resp.status, None
        except urllib.error.HTTPError as exc:
            answer.status, answer.error = exc.code, None
            again = exc.code in RETRY_STATUSES
        except (OSError, http.client.HTTPException) as exc:
            answer.error, again = _no_answer(exc)
        answer.attempts.append(f"HTTP {answer.status}" if answer.error is None else answer.error)
        if not again or n == attempts or (deadline is not None and time.monotonic() + pause > deadline):
            return answer
        answer.status = None
        sleep(pause)
        pause *= 2
    return answer
