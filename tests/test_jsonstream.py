"""Chunked decoding of a document's big array: the same items as a whole-file decode, on every real trace,
at chunk sizes small enough that every boundary kind is crossed; and clear failures on broken documents."""

from __future__ import annotations

import gzip
import io

import msgspec
import pytest
from conftest import KINETO_DATA, SAMPLES

from tracediag.ingest import kineto as k
from tracediag.ingest.jsonstream import ArrayChunks, NotAnArray, map_file

FILES = [*sorted(KINETO_DATA.glob("*.json.gz")), SAMPLES / "healthy_tp2" / "rank0.pt.trace.json.gz"]
DECODER = msgspec.json.Decoder(list[k._Event])


def _stream(raw: bytes, chunk: int) -> tuple[list, bytes | None]:
    ac = ArrayChunks(io.BytesIO(raw), DECODER.decode, msgspec.DecodeError, chunk_bytes=chunk)
    return [e for c in ac for e in c], ac.rest


def _mapped(raw: bytes, chunk: int, tmp_path, decode=DECODER.decode) -> tuple[list, bytes | None]:
    """The same through a private map of a plain file (how a plain trace is read)."""
    f = tmp_path / "doc.json"
    f.write_bytes(raw)
    with open(f, "rb") as fh:
        m = map_file(fh)
        ac = ArrayChunks(m, decode, msgspec.DecodeError, chunk_bytes=chunk)
        return [e for c in ac for e in c], ac.rest


@pytest.mark.parametrize("source", ["stream", "mapped"])
@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_chunks_hold_exactly_the_items_of_the_whole_decode(path, source, tmp_path):
    raw = gzip.decompress(path.read_bytes())
    whole = msgspec.json.decode(raw, type=k._TraceOrArray)
    events = whole if isinstance(whole, list) else whole.traceEvents
    for chunk in (4096, 1 << 20):
        got, rest = _stream(raw, chunk) if source == "stream" else _mapped(raw, chunk, tmp_path)
        assert got == events, chunk
        if isinstance(whole, list):
            assert rest is None
        else:
            top = msgspec.json.decode(rest, type=k._Trace)
            assert top.traceEvents == [] and top.distributedInfo == whole.distributedInfo
            assert top.deviceProperties == whole.deviceProperties


def test_braces_inside_strings_do_not_cut_an_item():
    items = [{"ph": "X", "name": 'void f<{},{}>(}, {"x": 1}, {)', "ts": i} for i in range(50)]
    raw = msgspec.json.encode({"traceEvents": items, "after": {"k": [1, 2, {"a": "]}"}]}})
    got, rest = _stream(raw, 64)
    assert [e.name for e in got] == [i["name"] for i in items] and [e.ts for e in got] == list(range(50))
    assert msgspec.json.decode(rest) == {"traceEvents": [], "after": {"k": [1, 2, {"a": "]}"}]}}


def test_one_item_larger_than_the_chunk():
    raw = msgspec.json.encode([{"ph": "X", "name": "n" * 100_000}, {"ph": "X", "name": "b"}])
    got, rest = _stream(raw, 1024)
    assert [len(e.name) for e in got] == [100_000, 1] and rest is None


@pytest.mark.parametrize(
    "raw",
    [b'{"traceEvents": [{"ph": "X"}, {"ph": "X"', b'{"other": 1}', b'"just a string"', b'{"traceEvents": [{"ph": '],
)
def test_broken_documents_fail_clearly(raw, tmp_path):
    with pytest.raises(NotAnArray):
        _stream(raw, 8)
    with pytest.raises(NotAnArray):
        _mapped(raw, 8, tmp_path)


@pytest.mark.parametrize(
    "raw",
    [
        gzip.decompress((SAMPLES / "healthy_tp2" / "rank0.pt.trace.json.gz").read_bytes()),
        msgspec.json.encode([{"ph": "X", "name": "n" * 100_000}, {"ph": "X", "name": "b"}] * 3),
        b'{"traceEvents": [' + b'{"ph": "X"}, ' * 30_000 + b'{"ph": "X"}], "x": "\x00"}',
        b" " * 200 + b'{"a": "]", "traceEvents": [{"ph": "X", "name": "]}, {"}, {"ph": "X"}], "b": [1, "]"]}',
        b'{"traceEvents": [{"ph": "X"}, ' + b"\x00" * 10 + b'{"ph": "X"}]}',
    ],
    ids=["trace", "huge-items", "escaped-nul", "brackets", "nul-bytes"],
)
@pytest.mark.parametrize("chunk", [64, 4096, 1 << 20])
def test_the_mapped_file_is_cut_and_decoded_as_the_stream_is(raw, chunk, tmp_path):
    # the same reads, so the same candidate cuts, decode calls, items, rest and errors
    def recorder(calls):
        def decode(b):
            calls.append(bytes(b))
            return DECODER.decode(b)

        return decode

    def run(fn):
        calls = []
        try:
            return fn(recorder(calls)), calls
        except NotAnArray as exc:
            return ("NotAnArray", str(exc)), calls

    def stream(decode):
        ac = ArrayChunks(io.BytesIO(raw), decode, msgspec.DecodeError, chunk_bytes=chunk)
        return [e for c in ac for e in c], ac.rest, ac.prefix, ac.items_bytes, ac.read_bytes

    def mapped(decode):
        f = tmp_path / "doc.json"
        f.write_bytes(raw)
        with open(f, "rb") as fh:
            ac = ArrayChunks(map_file(fh), decode, msgspec.DecodeError, chunk_bytes=chunk)
            return [e for c in ac for e in c], ac.rest, ac.prefix, ac.items_bytes, ac.read_bytes

    assert run(mapped) == run(stream)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_the_last_items_are_decoded_once(path):
    # keys after the array can hold ']' (HTA's V100 trace: deviceProperties after traceEvents): the array's own
    # end is found without decoding the last items at a wrong ']' first
    raw = gzip.decompress(path.read_bytes())
    calls = []

    def decode(b):
        try:
            return DECODER.decode(b)
        finally:
            calls.append(len(b))

    items = [e for c in ArrayChunks(io.BytesIO(raw), decode, msgspec.DecodeError, chunk_bytes=1 << 30) for e in c]
    whole = msgspec.json.decode(raw, type=k._TraceOrArray)
    assert len(calls) == 1 and items == (whole if isinstance(whole, list) else whole.traceEvents)
