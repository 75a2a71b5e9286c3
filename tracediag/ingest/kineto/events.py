"""The Kineto trace as msgspec decodes it: typed structs that keep only the fields the schema needs (unknown keys are
skipped inside the decoder, not materialised as dicts), their decoders, and the one-by-one decode of a chunk where
some item is not an event.

Field names are the ones Kineto and PyTorch write (pytorch/kineto libkineto/src/output_json.cpp,
torch/csrc/profiler/util.h).
"""

from __future__ import annotations

import operator
from typing import Any

import msgspec

from tracediag.ingest.validate import BadRecords

_EMPTY = msgspec.Raw(b"")


class _Args(msgspec.Struct, omit_defaults=True, gc=False):
    # Kineto writes some of these as numbers in one version and strings in another: Any keeps the
    # decoder from rejecting a real trace over a type it does not need to interpret.
    external_id: Any = msgspec.field(name="External id", default=None)
    device: Any = None
    stream: Any = None
    correlation: Any = None
    grid: Any = None
    block: Any = None
    bytes: Any = None
    input_dims: msgspec.Raw = msgspec.field(name="Input Dims", default=_EMPTY)
    input_types: msgspec.Raw = msgspec.field(name="Input type", default=_EMPTY)
    coll_name: Any = msgspec.field(name="Collective name", default=None)
    in_nelems: Any = msgspec.field(name="In msg nelems", default=None)
    out_nelems: Any = msgspec.field(name="Out msg nelems", default=None)
    in_size_old: Any = msgspec.field(name="In msg size", default=None)
    out_size_old: Any = msgspec.field(name="Out msg size", default=None)
    group_size: Any = msgspec.field(name="Group size", default=None)
    dtype: Any = None
    pg_name: Any = msgspec.field(name="Process Group Name", default=None)
    pg_id_old: Any = msgspec.field(name="Process Group ID", default=None)
    pg_desc: Any = msgspec.field(name="Process Group Description", default=None)
    pg_ranks: Any = msgspec.field(name="Process Group Ranks", default=None)
    seq: Any = msgspec.field(name="Seq", default=None)


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: Any = ""
    name: Any = ""
    pid: Any = None
    tid: Any = None
    ts: Any = None
    dur: Any = None
    id: Any = None
    args: _Args | None = None
    # Not Chrome-trace keys: filled by _timed (ts_ns from the raw JSON text when float64 cannot hold ns, see
    # _exact_ts), once both are validated.
    # (Any: a JSON key of the same name must not fail the decode; both are overwritten)
    ts_ns: Any = None
    dur_ns: Any = 0


class _RawTs(msgspec.Struct, gc=False):
    ts: msgspec.Raw = _EMPTY


class _EventTsText(_Event, gc=False):
    """An event as decoded: `ts` as its JSON text, turned into its value (and, when float64 cannot hold its ns, into
    exact integer ns) for all the events of a chunk at once by `_ts_from_text` while the text is still valid."""

    ts: msgspec.Raw = _EMPTY


class _Trace(msgspec.Struct):
    traceEvents: list[_Event] | None = None
    distributedInfo: Any = None
    deviceProperties: Any = None


_TraceOrArray = _Trace | list[_Event]


class _TraceTsText(msgspec.Struct):
    traceEvents: list[_EventTsText] | None = None
    distributedInfo: Any = None
    deviceProperties: Any = None


_TraceOrArrayTsText = _TraceTsText | list[_EventTsText]


class _TraceItems(msgspec.Struct):
    """A trace whose events are kept as raw JSON items, for a file where some item does not decode as _Event."""

    traceEvents: list[msgspec.Raw] | None = None
    distributedInfo: Any = None
    deviceProperties: Any = None


class _EventAnyArgs(_Event, gc=False):
    """An event whose `args` is not an object (a string, a number, a list): decoded as it is, then dropped."""

    args: Any = None


class _Loose(msgspec.Struct, gc=False):
    """The two fields an object item can fail _Event's decode on, as written."""

    ph: Any = ""


_ITEMS = msgspec.json.Decoder(list[msgspec.Raw])
_EVENT = msgspec.json.Decoder(_Event)
_EVENT_ANY_ARGS = msgspec.json.Decoder(_EventAnyArgs)
_LOOSE = msgspec.json.Decoder(_Loose)
_RAW_TS_ONE = msgspec.json.Decoder(_RawTs)

_EVENTS_TS_TEXT = msgspec.json.Decoder(list[_EventTsText])
_TOP = msgspec.json.Decoder(_Trace)


_get_ts = operator.attrgetter("ts")
_get_ts_ns = operator.attrgetter("ts_ns")
_get_dur = operator.attrgetter("dur")
_get_name = operator.attrgetter("name")
_get_pid = operator.attrgetter("pid")
_get_tid = operator.attrgetter("tid")
_get_cat = operator.attrgetter("cat")
_get_args = operator.attrgetter("args")


def _item_text(raw: msgspec.Raw) -> str:
    return bytes(memoryview(raw)[:80]).decode("utf-8", "replace")


def _events_one_by_one(items: list[msgspec.Raw], bad: BadRecords) -> tuple[list[_Event], list[msgspec.Raw]]:
    """(events, their raw items) of a chunk where some item is not an event: each item decoded alone. An item
    that is not an object (null, a number, a list) or whose `ph` is not text is dropped; an `args` that is not an
    object is dropped from its event, which is kept. Each is a bad record (`traceEvents`, `traceEvents.ph`,
    `traceEvents.args`); the other events of the chunk are kept as they are."""
    events: list[_Event] = []
    kept: list[msgspec.Raw] = []
    for raw in items:
        try:
            events.append(_EVENT.decode(raw))
            kept.append(raw)
            continue
        except msgspec.ValidationError:
            pass
        try:
            loose = _LOOSE.decode(raw)
        except msgspec.ValidationError:  # not an object
            bad.skipped("traceEvents", "record dropped (not an event object)", [_item_text(raw)])
            continue
        if type(loose.ph) is not str:
            bad.skipped("traceEvents.ph", "record dropped (ph is not text)", [loose.ph])
            continue
        try:
            e = _EVENT_ANY_ARGS.decode(raw)
        except msgspec.ValidationError:  # no field is typed but ph and args: not reached
            bad.skipped("traceEvents", "record dropped (not an event object)", [_item_text(raw)])
            continue
        bad.skipped("traceEvents.args", "args set to NULL (not an object), event kept", [e.args])
        e.args = None
        events.append(e)
        kept.append(raw)
    return events, kept


def _raw_ts_of(items: list[msgspec.Raw]) -> list[_RawTs]:
    return [_RAW_TS_ONE.decode(r) for r in items]
