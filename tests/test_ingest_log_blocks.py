"""The block reader (tracediag/ingest/log_blocks.py) against the line-by-line path it stands in for: every
vendored vLLM and SGLang log, with its stats or batch lines repeated into the long runs that are read in bulk,
must give exactly the tables and meta of reading each logical line on its own."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import EXTERNAL

from tracediag.errors import InputError
from tracediag.ingest import sglang_log, vllm_log
from tracediag.ingest.base import IngestOptions
from tracediag.ingest.log_blocks import ANSI
from tracediag.ingest.vllm_log import LogState
from tracediag.inputfile import open_stream, skip_nul_run
from tracediag.memory import read_bytes_budget

VLLM = sorted((EXTERNAL / "vllm" / "log_excerpts").glob("*.log"))
SGLANG = sorted((EXTERNAL / "sglang" / "log_excerpts").glob("*.log"))


def physical_lines(path: Path, st: LogState | None = None, memory_limit: int | None = None) -> Iterator[str]:
    """The readline-based reader the block reader replaced, kept here as the reference: decoded lines without
    ANSI codes; '\\r' inside a line is a tqdm redraw, not a line break.

    A run of NUL bytes where a line starts (at the head of a log logrotate's copytruncate emptied in place, a hole
    further on: `skip_nul_run`) is skipped, and a line longer than the read budget (memory.read_bytes_budget) is
    cut there, the rest of it skipped; all are counted in `st` (its meta: nul_head_bytes, nul_run_bytes,
    lines_cut)."""
    f, gz = open_stream(path, "log")
    longest = read_bytes_budget(memory_limit)
    try:
        nul_head = skip_nul_run(f, gz)
        if st is not None:
            st.nul_head_bytes = nul_head
        first = True
        while True:
            if f.peek(1)[:1] == b"\x00":
                skipped = skip_nul_run(f, gz)
                if st is not None:
                    st.nul_run_bytes += skipped
            raw = f.readline(longest)
            if not raw:
                break
            if len(raw) == longest and not raw.endswith(b"\n"):  # the rest of a line beyond the budget
                while True:
                    skip_nul_run(f, gz)  # a hole after the line's text: stepped over, not read
                    rest = f.readline(longest)
                    if not rest or rest.endswith(b"\n"):
                        break
                raw = raw.rstrip(b"\x00")
                if st is not None:
                    st.lines_cut += 1
            if first and b"\x00" in raw[:4096]:
                raise InputError(path, "not a log: binary content")
            first = False
            line = raw.decode("utf-8", errors="replace").rstrip("\n")
            if line.endswith("\r"):
                line = line[:-1]
            if "\x1b" in line or "[0m" in line:
                line = ANSI.sub("", line)
            yield line
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(path, f"corrupt or truncated log ({exc})") from None
    finally:
        f.close()


def _repeated(src, tmp_path, marker: bytes, times: int = 40):
    lines = src.read_bytes().split(b"\n")
    out = tmp_path / src.name
    out.write_bytes(b"\n".join(x for ln in lines for x in [ln] * (times if marker in ln else 1)))
    return out


def _line_reader(path, st, joiner, fast, fast_rows, longest=None):
    """read_blocks without blocks: every physical line (the readline-based reader) to the line-by-line path."""
    for i, line in enumerate(physical_lines(path, st), start=1):
        joiner.feed(i, line)


@pytest.mark.parametrize("src", VLLM + SGLANG, ids=lambda p: p.name[:40])
def test_bulk_equals_line_by_line(src, tmp_path, monkeypatch):
    is_vllm = src in VLLM
    path = _repeated(src, tmp_path, b"Avg prompt throughput" if is_vllm else b"Decode batch")
    mod = vllm_log if is_vllm else sglang_log
    parse = vllm_log.parse_vllm_log if is_vllm else sglang_log.parse_sglang_log
    parsed = parse(path, 0, IngestOptions())
    monkeypatch.setattr(mod, "read_blocks", _line_reader)
    expect = parse(path, 0, IngestOptions())
    assert parsed.inputs_rows == expect.inputs_rows
    for name, table in expect.tables.items():
        assert parsed.tables[name].equals(table), name


@pytest.mark.parametrize(
    "mod,name",
    [
        (vllm_log, "vllm-37307_v1_2026-03_waiting_drains_under_prefill.log"),
        (sglang_log, "sglang-14972_token_usage_0.94_queue_before_retract.log"),
    ],
)
def test_the_bulk_path_is_taken(mod, name, tmp_path, monkeypatch):
    """The repeated runs are read in bulk (else the comparison above proves nothing)."""
    is_vllm = mod is vllm_log
    calls = []
    bulk = "_bulk_stats" if is_vllm else "_bulk_decode"
    real = getattr(mod, bulk)
    monkeypatch.setattr(mod, bulk, lambda st, rows, *a: (calls.append(len(rows)), real(st, rows, *a)))
    src = EXTERNAL / ("vllm" if is_vllm else "sglang") / "log_excerpts" / name
    path = _repeated(src, tmp_path, b"Avg prompt throughput" if is_vllm else b"Decode batch")
    parse = vllm_log.parse_vllm_log if is_vllm else sglang_log.parse_sglang_log
    parsed = parse(path, 0, IngestOptions())
    assert sum(calls) >= 100 and sum(calls) < parsed.tables["serving_stats"].num_rows
