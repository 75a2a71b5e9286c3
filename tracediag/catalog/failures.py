"""Messages that say a serving process died, hung or lost a peer, as data.

The patterns live in ``engine_failures.json`` next to this file, each with the source file of the engine, of
PyTorch or of the device runtime that prints it, where that text was checked, and a real line it matches. The
log ingesters (tracediag/ingest/vllm_log/, sglang_log.py) store a matching line as a serving event whose kind
is the pattern's kind and whose ``pattern`` is its id; SCH011 names the first failure the cause and every
later one, and every ``cascade`` line (the TCPStore / c10d errors the other ranks print once a peer is gone),
its consequences.

A pattern is a ``re.search`` regex that is also valid RE2 (no look-around, no back-references), so a bulk
reader may run it in pyarrow; the first pattern in file order that matches a line wins, so the specific come
before the generic. Only the first ``MATCH_MAX_CHARS`` characters of a line are searched.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

_DATA_FILE = "engine_failures.json"
MATCH_MAX_CHARS = 4096
# what a kind means to SCH011: the process or the device failed (a cause), a peer's failure seen from here
# (a consequence), or the server's own verdict that it stopped making progress (evidence of a hang)
CAUSE_KINDS = frozenset(
    {
        "device_error",
        "fatal_signal",
        "cpp_abort",
        "oom",
        "collective_timeout",
        "engine_dead",
        "worker_died",
        "scheduler_exception",
        "watchdog_timeout",
    }
)
HANG_KINDS = frozenset({"health_check_failed"})
CASCADE_KINDS = frozenset({"cascade"})
# a watchdog that only reports (SGLang's py-spy dump of a slow scheduler): evidence, not a death
SOFT_KINDS = frozenset({"soft_watchdog"})
KINDS = CAUSE_KINDS | HANG_KINDS | CASCADE_KINDS | SOFT_KINDS
ENGINES = frozenset({"vllm", "sglang", "any"})


@dataclass(frozen=True)
class FailurePattern:
    id: str
    kind: str
    regex: re.Pattern[str]
    engines: frozenset[str]
    printed_by: str
    source_ref: str
    example: str


def _load(raw: dict) -> tuple[FailurePattern, ...]:
    out = []
    seen: set[str] = set()
    for p in raw["patterns"]:
        if p["kind"] not in KINDS:
            raise ValueError(f"{_DATA_FILE}: pattern {p['id']!r} has unknown kind {p['kind']!r}")
        if p["id"] in seen:
            raise ValueError(f"{_DATA_FILE}: pattern id {p['id']!r} appears twice")
        seen.add(p["id"])
        engines = frozenset(p.get("engines") or ["any"])
        if not engines <= ENGINES:
            raise ValueError(f"{_DATA_FILE}: pattern {p['id']!r} names unknown engines {sorted(engines - ENGINES)}")
        out.append(
            FailurePattern(
                id=p["id"],
                kind=p["kind"],
                regex=re.compile(p["regex"]),
                engines=engines,
                printed_by=p["printed_by"],
                source_ref=p["source_ref"],
                example=p["example"],
            )
        )
    return tuple(out)


@lru_cache(maxsize=1)
def patterns() -> tuple[FailurePattern, ...]:
    """The catalogue, in file order (the first match wins)."""
    text = resources.files("tracediag.catalog").joinpath(_DATA_FILE).read_text(encoding="utf-8")
    return _load(json.loads(text))


@lru_cache(maxsize=4)
def _prefilter(engine: str) -> tuple[re.Pattern[str], tuple[FailurePattern, ...]]:
    """One alternation of the engine's patterns: most lines match none, and one search rules them all out."""
    mine = tuple(p for p in patterns() if engine in p.engines or "any" in p.engines)
    return re.compile("|".join(f"(?:{p.regex.pattern})" for p in mine)), mine


def match(text: str, engine: str) -> FailurePattern | None:
    """The first pattern of `engine` ('vllm' or 'sglang') that the line matches, else None."""
    head = text[:MATCH_MAX_CHARS]
    any_rx, mine = _prefilter(engine)
    if not any_rx.search(head):
        return None
    return next((p for p in mine if p.regex.search(head)), None)


def by_id(pattern_id: str | None) -> FailurePattern | None:
    return next((p for p in patterns() if p.id == pattern_id), None)
