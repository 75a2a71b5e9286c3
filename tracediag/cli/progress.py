"""Progress on long runs: a rich spinner with the current stage and the elapsed time, on a terminal only
(stderr is a TTY and --quiet is not given). In CI logs and pipes nothing is printed: no control characters,
no lines per stage."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

Report = Callable[[str], None]


@contextlib.contextmanager
def progress(enabled: bool = True, stream=None) -> Iterator[Report]:
    """Yields `report(stage)`; on a TTY each call replaces the spinner's text with the stage."""
    stream = stream or sys.stderr
    if not enabled or not getattr(stream, "isatty", lambda: False)():
        yield lambda stage: None
        return
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    with Progress(*columns, console=Console(file=stream), transient=True) as bar:
        task = bar.add_task("starting", total=None)
        yield lambda stage: bar.update(task, description=stage)
