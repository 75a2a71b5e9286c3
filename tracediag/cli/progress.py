"""Progress on long runs, on stderr. On a terminal: a rich spinner with the current stage and the elapsed time.
Elsewhere (CI logs, pipes): a heartbeat, one plain line every HEARTBEAT_S seconds while the run lasts —
`tracediag: 15 s, deriving steps, collectives and kernel classes` — so a long job shows it is alive and where it
is; a run shorter than that prints nothing, and no control characters ever. `--quiet` turns both off,
`--progress/--no-progress` forces either way."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator

Report = Callable[[str], None]

HEARTBEAT_S = 5.0  # a few seconds: a CI log looks alive; a minute of run is a dozen lines


def wanted(forced: bool | None, quiet: bool) -> bool:
    """--progress / --no-progress when given, else on unless --quiet."""
    return forced if forced is not None else not quiet


@contextlib.contextmanager
def progress(enabled: bool = True, stream=None, every_s: float | None = None) -> Iterator[Report]:
    """Yields `report(stage)`: on a TTY each call replaces the spinner's text with the stage; elsewhere the stage is
    what the next heartbeat line says."""
    stream = stream or sys.stderr
    if not enabled:
        yield lambda stage: None
    elif getattr(stream, "isatty", lambda: False)():
        with _spinner(stream) as say:
            yield say
    else:
        with _heartbeat(stream, every_s if every_s is not None else HEARTBEAT_S) as say:
            yield say


@contextlib.contextmanager
def _spinner(stream) -> Iterator[Report]:
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=Console(file=stream), transient=True) as bar:
        task = bar.add_task("starting", total=None)
        yield lambda stage: bar.update(task, description=stage)


def heartbeat_line(elapsed_s: float, stage: str) -> str:
    return f"tracediag: {elapsed_s:.0f} s, {stage}\n"


@contextlib.contextmanager
def _heartbeat(stream, every_s: float) -> Iterator[Report]:
    """A daemon thread writes heartbeat_line() every `every_s` seconds until the block ends."""
    start = time.monotonic()
    stage = ["starting"]
    done = threading.Event()

    def beat() -> None:
        while not done.wait(every_s):
            try:
                stream.write(heartbeat_line(time.monotonic() - start, stage[0]))
                stream.flush()
            except (OSError, ValueError):  # stderr closed or gone (a pipe whose reader quit): nothing to tell
                return

    thread = threading.Thread(target=beat, name="tracediag-heartbeat", daemon=True)
    thread.start()
    try:
        yield lambda s: stage.__setitem__(0, s)
    finally:
        done.set()
        thread.join()
