"""Cancellation of one tool call: the MCP server sets it when the client cancels the call or goes away; the work
(in a worker thread) stops at its next check (`check`, between the pipeline's stages) or at once through a hook
(`hook(con.interrupt)`: a DuckDB query)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from tracediag.errors import TracediagError


class Cancelled(TracediagError):
    """The call was cancelled by the client (or the client went away); nothing is answered."""

    def __init__(self) -> None:
        super().__init__("cancelled by the client; staged files removed")


class Cancel:
    """A flag set once, from any thread, that runs its hooks when it is set."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._set = False
        self._hooks: list[Callable[[], object]] = []

    @property
    def is_set(self) -> bool:
        return self._set

    def set(self) -> None:
        with self._lock:
            if self._set:
                return
            self._set = True
            hooks = list(self._hooks)
        for h in hooks:
            with contextlib.suppress(Exception):
                h()

    def check(self) -> None:
        """Raise Cancelled when the call was cancelled."""
        if self._set:
            raise Cancelled()

    @contextlib.contextmanager
    def hook(self, fn: Callable[[], object]) -> Iterator[None]:
        """Run `fn` when the call is cancelled while the block runs (at once if it already was)."""
        with self._lock:
            self._hooks.append(fn)
            already = self._set
        try:
            if already:
                fn()
            yield
        finally:
            with self._lock:
                self._hooks.remove(fn)
