"""Where the `tracediag mcp` tools may read and write: the allowed roots, and the checks of every path argument.

An MCP host runs the server with the user's permissions, and the agent that calls it may be prompt-injected by the
very traces and logs it reads; so a path argument is not consent the way a path typed on the command line is.
The roots are, first found:
1. the client's `roots` (the folders the user opened in the host), when the client offers at least one `file:`
   root;
2. the server's `--allow-root DIR` options;
3. the folder the server was started in.
The server's runs folder (where `analyze` writes without `out`) is always a root too.

Every path is resolved before the check: relative to the server's folder, symbolic links followed, `..` taken
after them (os.path.realpath), so a link inside a root that points out of it is outside. A folder given as a read
argument is looked into (two levels: the trace files of a folder, the `traces/` of a capture folder, the parts of
a Parquet store): an entry that is a link out of the roots refuses the folder. A write (`out`) must also not land
inside a source checkout of tracediag itself. Every refusal is a UsageError naming the argument, the path and the
roots. NUL bytes and over-long paths are input errors naming the argument, CLI and MCP alike (`clean_path`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from tracediag.errors import UsageError
from tracediag.inputspec import checked_path

_WALK_DEPTH = 2
_WALK_ENTRIES = 20_000  # entries looked at in a folder argument before it is refused as too big to check


def clean_path(arg: str, value: object) -> str:
    """`value` as a path string, or a UsageError naming the argument: not a string (JSON gives no other path), empty,
    a NUL byte, too long (tracediag.inputspec.checked_path, the check every entry point makes)."""
    if not isinstance(value, str):
        raise UsageError(f"{arg}: a path must be a string, got {type(value).__name__}")
    checked_path(arg, value)
    return value


def resolve(value: str, base: Path | None = None) -> Path:
    """The path as the file system will find it: relative to `base` (default: the working folder), symbolic links
    followed, `..` after them."""
    p = os.path.expanduser(value)
    if base is not None and not os.path.isabs(p):
        p = os.path.join(base, p)
    return Path(os.path.realpath(p))


def tracediag_checkout() -> Path | None:
    """The source checkout this tracediag runs from (the folder with pyproject.toml beside the package), if any."""
    pkg = Path(os.path.realpath(__file__)).parent.parent  # tracediag/
    top = pkg.parent
    if (top / "pyproject.toml").is_file() and (pkg / "__init__.py").is_file():
        try:
            if 'name = "tracediag"' in (top / "pyproject.toml").read_text(encoding="utf-8", errors="replace"):
                return top
        except OSError:
            return None
    return None


def file_roots(uris: Iterable[str]) -> list[Path]:
    """The folders of the `file:` URIs among a client's roots (others — http:, a repository URL — are no folder)."""
    out = []
    for uri in uris:
        u = urlparse(str(uri))
        if u.scheme == "file" and u.path and u.netloc in ("", "localhost"):
            out.append(resolve(unquote(u.path)))
    return out


@dataclass(frozen=True)
class Access:
    """The roots of one tool call, and where they came from (said in a refusal)."""

    roots: tuple[Path, ...]
    source: str  # "the client's roots", "--allow-root", "the server's working folder"
    base: Path = field(default_factory=Path.cwd)  # relative paths are read from here
    no_write: tuple[Path, ...] = ()  # never written into, even inside a root (tracediag's own checkout)

    @classmethod
    def of(cls, client: Sequence[Path], allow: Sequence[Path], runs_dir: Path, base: Path | None = None) -> Access:
        base = base or Path.cwd()
        if client:
            roots, source = list(client), "the client's roots"
        elif allow:
            roots, source = [resolve(str(p), base) for p in allow], "--allow-root"
        else:
            roots, source = [resolve(str(base))], "the server's working folder"
        runs = resolve(str(runs_dir), base)
        checkout = tracediag_checkout()
        return cls(tuple(dict.fromkeys([*roots, runs])), source, base, (checkout,) if checkout else ())

    def roots_text(self) -> str:
        return ", ".join(str(r) for r in self.roots) + f" ({self.source} and the runs folder)"

    def _inside(self, p: Path) -> bool:
        return any(p == r or p.is_relative_to(r) for r in self.roots)

    def _refuse(self, arg: str, value: str, p: Path, why: str = "is outside the allowed roots") -> UsageError:
        shown = str(p) if value == str(p) else f"{value} (resolved: {p})"
        return UsageError(f"{arg}: {shown} {why}: {self.roots_text()}")

    def read(self, arg: str, value: object) -> Path:
        """The resolved path of a read argument inside the roots; a UsageError naming it otherwise."""
        value = clean_path(arg, value)
        p = resolve(value, self.base)
        if not self._inside(p):
            raise self._refuse(arg, value, p)
        try:
            folder = p.is_dir()
        except OSError as exc:  # a name too long for the file system: is_dir raises, not False
            raise UsageError(f"{arg}: {p}: {exc.strerror or exc}") from None
        if folder:
            self._walk(arg, value, p)
        return p

    def write(self, arg: str, value: object) -> Path:
        """The resolved path of an output folder or file inside the roots and outside tracediag's own checkout."""
        value = clean_path(arg, value)
        p = resolve(value, self.base)
        if not self._inside(p):
            raise self._refuse(arg, value, p)
        for top in self.no_write:
            if p == top or p.is_relative_to(top):
                raise UsageError(
                    f"{arg}: {p} is inside tracediag's own source checkout ({top}); give a folder outside it"
                )
        return p

    def _walk(self, arg: str, value: str, folder: Path) -> None:
        """Refuse a folder argument that holds a link out of the roots (to its depth of two)."""
        seen = 0
        todo = [(folder, 0)]
        while todo:
            d, depth = todo.pop()
            try:
                entries = list(os.scandir(d))
            except OSError:
                continue  # unreadable: the reader says so, naming it
            for e in entries:
                seen += 1
                if seen > _WALK_ENTRIES:
                    raise UsageError(
                        f"{arg}: {folder} holds over {_WALK_ENTRIES:,} entries; give its files or a smaller one"
                    )
                target = resolve(e.path) if e.is_symlink() else Path(e.path)
                if target != Path(e.path) and not self._inside(target):
                    why = f"holds {e.name}, a link to {target}, outside the allowed roots"
                    raise self._refuse(arg, value, folder, why)
                if depth + 1 < _WALK_DEPTH and target.is_dir():
                    todo.append((target, depth + 1))
