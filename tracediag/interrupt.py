"""Stopping work part-way. A caller that may have to stop the work it runs in this thread (the MCP server, for a call
its client cancels) installs a stop flag around it (`stopping(flag)`); the long loops of the pipeline call
`checkpoint()` — per parsed chunk and file, per derivation, per rule, per report section — which raises the flag's
error once it is set, and a DuckDB connection doing the work is interrupted at once (`interrupting(con)`), its
statement ending with that error too. Without a flag installed both are no-ops, so the CLI and the library pay a
context-variable read per checkpoint. The flag is tracediag.agent.cancel.Cancel (is_set, check(), hook(fn)). A leaf:
every floor can mark its loops."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

_FLAG: ContextVar[Any] = ContextVar("tracediag_stop_flag", default=None)


@contextlib.contextmanager
def stopping(flag: Any) -> Iterator[None]:
    """Within: `checkpoint()` and `interrupting()` in this thread obey `flag` (None: nothing to obey)."""
    token = _FLAG.set(flag)
    try:
        yield
    finally:
        _FLAG.reset(token)


def checkpoint() -> None:
    """Raise the stop flag's error when it is set (the work stops here, its `finally` blocks cleaning up)."""
    flag = _FLAG.get()
    if flag is not None:
        flag.check()


@contextlib.contextmanager
def interrupting(con: Any) -> Iterator[None]:
    """Within: the stop flag, when set, interrupts `con`'s running statement; the interrupted statement's error
    becomes the flag's (a stop, not a DuckDB failure)."""
    flag = _FLAG.get()
    if flag is None:
        yield
        return
    try:
        with flag.hook(con.interrupt):
            yield
    except Exception:
        if flag.is_set:
            flag.check()
        raise
