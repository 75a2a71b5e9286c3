"""The file: a complete SQLite database (its header, its size a whole number of pages), opened read-only and
immutable; SQLite's messages for a damaged one.
"""

from __future__ import annotations

import os
import re
import sqlite3
import urllib.parse
from pathlib import Path

from tracediag.errors import InputError
from tracediag.inputfile import open_input

_SQLITE_MAGIC = b"SQLite format 3\x00"


def _check_file(p: Path) -> int:
    """Size of a readable, complete SQLite file; InputError naming the problem otherwise."""
    try:
        with open_input(p, "Nsight Systems export") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(100)
    except OSError as exc:
        raise InputError(p, f"cannot read file ({exc.strerror or exc})") from None
    if size == 0:
        raise InputError(p, "file is empty")
    if not head.startswith(_SQLITE_MAGIC):
        raise InputError(p, "not an SQLite database (Nsight Systems exports are made by `nsys export --type=sqlite`)")
    if len(head) < 100:
        raise InputError(p, f"truncated SQLite file ({size} bytes, less than its 100-byte header)")
    page_size = int.from_bytes(head[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    pages = int.from_bytes(head[28:32], "big")
    header_size_valid = head[24:28] == head[92:96]  # "in-header database size" is valid (SQLite file format §1.3)
    if page_size and header_size_valid and pages and size < pages * page_size:
        raise InputError(
            p,
            f"truncated SQLite file: its header says {pages} pages of {page_size} bytes "
            f"({pages * page_size} bytes) but the file has {size}; was the export or the copy interrupted?",
        )
    if page_size and size % page_size:
        raise InputError(p, f"truncated SQLite file: {size} bytes is not a whole number of {page_size}-byte pages")
    return size


def _connect(p: Path) -> sqlite3.Connection:
    # read-only and immutable: works on read-only media, never writes a journal next to the export
    uri = f"file:{urllib.parse.quote(str(p.resolve()))}?mode=ro&immutable=1"
    return sqlite3.connect(uri, uri=True)


# SQLite's messages for a damaged file (sqlite3.c: SQLITE_CORRUPT, SQLITE_NOTADB, SQLITE_IOERR, "malformed schema")
_DAMAGED = re.compile(r"malformed|not a database|disk I/O|corrupt|truncated|file is encrypted", re.IGNORECASE)
