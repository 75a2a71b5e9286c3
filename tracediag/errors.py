"""The one exception family users see: each names the input and what is wrong with it."""

from __future__ import annotations

from pathlib import Path


class TracediagError(Exception):
    """An error the user can fix (bad input, bad option). The CLI prints it as one line, exit 2."""


class InputError(TracediagError):
    """An input file that cannot be used: names the file and the problem."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self):  # raised in parser processes: must survive pickling back to the parent
        return (type(self), (self.path, self.problem))


class UsageError(TracediagError):
    """Options that do not fit together, or an option value that is not valid."""


MAX_MESSAGE = 1000  # characters of an error line (a message quoting a 1 MiB value stays readable)


def one_line(text: str) -> str:
    """An error message as the one line the exit contract promises (the CLI's and the MCP server's)."""
    line = " / ".join(part.strip() for part in str(text).splitlines() if part.strip())
    return line if len(line) <= MAX_MESSAGE else line[: MAX_MESSAGE - 1] + "…"
