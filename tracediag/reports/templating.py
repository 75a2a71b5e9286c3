"""The Jinja environment of report.html and diff.html: autoescaped, strict, and its templates compiled once per
machine rather than once per run.

Compiling the report's templates is ~50 ms of every `tracediag analyze` (a twentieth of a small trace's whole run);
Jinja's bytecode cache keeps the compiled code in a folder of the user's cache (`$TRACEDIAG_CACHE_DIR`, else
`$XDG_CACHE_HOME/tracediag` or `~/.cache/tracediag`; on Windows `%LOCALAPPDATA%\\tracediag`), keyed by each
template's name and source, and by Jinja's bytecode and Python's versions, so an edited template or another Jinja
is compiled again. The folder is used only when it is this user's own and writable by no one else (its files hold
code that is loaded); a cache that cannot be made, read or written is no cache, never an error, and every file is
written whole before it replaces another (Jinja writes a temporary file and renames it).
"""

from __future__ import annotations

import contextlib
import functools
import os
import stat
import sys
from pathlib import Path

import jinja2


def cache_dir() -> Path | None:
    """The folder for compiled templates, made when missing (mode 0700); None when it cannot be used."""
    base = os.environ.get("TRACEDIAG_CACHE_DIR")
    try:
        if base:
            folder = Path(base)
        elif sys.platform == "win32" and os.environ.get("LOCALAPPDATA"):
            folder = Path(os.environ["LOCALAPPDATA"]) / "tracediag"
        else:
            folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tracediag"
        folder = folder / "templates"
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = folder.stat()
    except (OSError, RuntimeError):  # RuntimeError: no home folder to expand
        return None
    if not stat.S_ISDIR(st.st_mode) or not os.access(folder, os.W_OK):
        return None
    if hasattr(os, "getuid") and (st.st_uid != os.getuid() or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        return None
    return folder


class _QuietCache(jinja2.FileSystemBytecodeCache):
    """Jinja's file cache, which never fails a render: what cannot be read is compiled, what cannot be written is
    not kept."""

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        try:
            super().load_bytecode(bucket)
        except Exception:  # a damaged or foreign cache file: compile the template as if there were none
            bucket.reset()

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        with contextlib.suppress(OSError):
            super().dump_bytecode(bucket)


@functools.cache
def environment() -> jinja2.Environment:
    """The one environment of the package's templates (tracediag/reports/templates)."""
    folder = cache_dir()
    return jinja2.Environment(
        loader=jinja2.PackageLoader("tracediag.reports", "templates"),
        autoescape=True,  # kernel names, annotation names, paths and titles are untrusted text
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        bytecode_cache=_QuietCache(str(folder)) if folder is not None else None,
    )
