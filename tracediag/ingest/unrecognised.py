"""How an error names a file that is not the format asked for, without a byte of its content.

An input that is not a log, a metrics scrape or a benchmark result may be anything the caller could name:
/etc/shadow, a `.env` of API keys, /proc/self/environ. An agent reads the error, and whatever the error quotes
reaches the agent's context (and whoever injected the agent). So the error says what was expected and what the
file looks like — its size, its line count, the shape of its first line (length, text or not, a timestamp or
not) — and never its text. Content is quoted only from a file already recognised as the format.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# a date (2025-06-26, 06-26, 26/06/2025) or a clock time (07:25:31) anywhere in the line
_TIMESTAMP = re.compile(r"\d{1,4}[-/]\d{1,2}(?:[-/]\d{1,4})?|\b\d{1,2}:\d{2}:\d{2}")


def size_text(path: str | Path) -> str:
    """'412 bytes' (or '' when the size cannot be read, or is 0 for a file with content: a /proc file)."""
    try:
        n = os.stat(path).st_size
    except (OSError, ValueError):
        return ""
    if n == 0:  # called only for a file with content: a size of 0 is the kernel's, not the file's
        return ""
    for unit, div in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} byte" + ("" if n == 1 else "s")


def line_shape(text: str, cap: int | None = None) -> str:
    """'37 characters, no timestamp': a line's length (at least `cap` when it was cut at `cap`), whether it is
    text, and whether it holds a date or time — never the line itself."""
    n = len(text)
    parts = [f"{cap}+ characters" if cap is not None and n >= cap else f"{n} character" + ("" if n == 1 else "s")]
    if "\ufffd" in text or any((ord(c) < 32 and c != "\t") or 0x7F <= ord(c) < 0xA0 for c in text):
        parts.append("not text (control or undecodable bytes)")
    parts.append("with a timestamp" if _TIMESTAMP.search(text) else "no timestamp")
    return ", ".join(parts)


def not_a_record(what: str, line_no: int | None, text: str, cap: int | None = None) -> str:
    """'line 1 is not a vLLM record: 37 characters, no timestamp'."""
    where = f"line {line_no}" if line_no is not None else "the first line"
    return f"{where} is not {what}: {line_shape(text, cap)}"


def file_text(path: str | Path, lines: int | None = None) -> str:
    """'412 bytes, 12 lines' of a file, for an error that says what was found instead of the format."""
    parts = [s for s in (size_text(path),) if s]
    if lines is not None:
        parts.append(f"{lines:,} line" + ("" if lines == 1 else "s"))
    return ", ".join(parts)
