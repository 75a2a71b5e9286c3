"""The block reader (tracediag/ingest/log_blocks.py) against the line-by-line path it stands in for: every
vendored vLLM and SGLang log, with its stats or batch lines repeated into the long runs that are read in bulk,
must give exactly the tables and meta of reading each logical line on its own."""

from __future__ import annotations

import pytest
from conftest import EXTERNAL

from tracediag.ingest import sglang_log, vllm_log
from tracediag.ingest.base import IngestOptions
from tracediag.ingest.vllm_log import physical_lines

VLLM = sorted((EXTERNAL / "vllm" / "log_excerpts").glob("*.log"))
SGLANG = sorted((EXTERNAL / "sglang" / "log_excerpts").glob("*.log"))


def _repeated(src, tmp_path, marker: bytes, times: int = 40):
    lines = src.read_bytes().split(b"\n")
    out = tmp_path / src.name
    out.write_bytes(b"\n".join(x for ln in lines for x in [ln] * (times if marker in ln else 1)))
    return out


def _line_reader(path, st, joiner, fast, fast_rows):
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
