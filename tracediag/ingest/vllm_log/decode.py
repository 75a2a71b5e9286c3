"""A vLLM log message's values: the stats line's fields, the speculative-decoding line's counts, the startup facts a
message states, and record times in seconds (Clock). Pure: what the values go into is tables.py and lines.py.
"""

from __future__ import annotations

import ast
import math
import re
from datetime import datetime, timedelta
from typing import Any

from tracediag.ingest.vllm_log.patterns import (
    _ARGS_KEYS,
    _CONFIG_PAIR,
    _ENGINE,
    _FIELD,
    _SPEC_FIELDS,
    _STARTUP,
    _UNITS,
    INT_FIELDS,
    STATS_FIELDS,
)

INT32_MAX = 2**31 - 1


class BadValue(ValueError):
    """A number in a line that no engine writes (out of range, not finite): the line is counted as bad."""


class Clock:
    """Record times -> seconds since the file's first record. 'MM-DD' dates carry no year (year rollover
    handled); 'YYYY-MM-DD' dates do."""

    BACKWARDS_S = 180 * 86400  # a time this far before the latest is the next year's (MM-DD dates)

    def __init__(self) -> None:
        self.t0: datetime | None = None
        self.year = 2000  # a leap year, so 02-29 parses
        self._day_key: str | None = None
        # whole seconds since t0 (exact in a float): the latest record, and midnight of the day of _day_key
        self._last_s: float | None = None
        self._day_s = 0.0

    @property
    def last(self) -> datetime | None:
        """The latest record's time."""
        return None if self._last_s is None else self.t0 + timedelta(seconds=self._last_s)

    def __call__(self, date: str, time: str) -> float | None:
        # fast path: the same day as the previous record (most lines of a long log), in seconds since t0 without
        # datetime arithmetic (a third of a long log's parse otherwise)
        if date == self._day_key and len(time) == 8 and time[2] == ":" and time[5] == ":":
            try:
                sec = int(time[:2]) * 3600 + int(time[3:5]) * 60 + int(time[6:8])
            except ValueError:
                sec = -1
            if 0 <= sec < 86400:
                t = self._day_s + sec
                if t >= self._last_s - self.BACKWARDS_S:
                    self._last_s = t
                    return t
        try:
            if len(date) == 10:
                dt = datetime.strptime(f"{date} {time}", "%Y-%m-%d %H:%M:%S")
            else:
                dt = datetime.strptime(f"{self.year}-{date} {time}", "%Y-%m-%d %H:%M:%S")
                last = self.last
                if last is not None and dt < last - timedelta(seconds=self.BACKWARDS_S):
                    self.year += 1
                    dt = dt.replace(year=self.year)
        except ValueError:
            return None
        if self.t0 is None:
            self.t0 = dt
        self._last_s = (dt - self.t0).total_seconds()
        self._day_key, self._day_s = date, (datetime(dt.year, dt.month, dt.day) - self.t0).total_seconds()
        return self._last_s


def checked_int(v: float, limit: int = INT32_MAX) -> int:
    if not math.isfinite(v) or abs(v) > limit:
        raise BadValue(f"{v:g} is out of range")
    return int(v)


def checked_float(v: float) -> float:
    if math.isinf(v) or abs(v) > 1e300:
        raise BadValue(f"{v:g} is not a finite number")
    return v


def parse_stats(msg: str) -> tuple[dict[str, Any], dict[str, Any]] | None:
    """({column: value}, {other field: value}) of a stats message, None when it is not one.

    Raises BadValue for a number no engine writes (a counter beyond 32 bits, an infinite throughput)."""
    m = _ENGINE.match(msg)
    engine = None
    body = msg
    if m:
        body = m["body"]
        engine = int(m["engine"]) if m["engine"] is not None and len(m["engine"]) < 9 else -1
    if not (body.startswith(("Avg prompt throughput:", "Throughput:")) or re.match(r"Running: \d+ reqs", body)):
        return None
    cols: dict[str, Any] = {"engine": engine, "log_format": "v1" if m or "Waiting:" in body else "v0"}
    if body.startswith("Throughput:"):
        cols["log_format"] = "v0-2023"
    extra: dict[str, Any] = {}
    for part in re.split(r",\s*", body.strip().rstrip(".").strip()):
        f = _FIELD.match(part.strip())
        if not f:
            continue
        key = f["key"].strip().lower()
        val = float(f["val"])
        col = STATS_FIELDS.get(key)
        if col:
            cols[col] = checked_int(val) if col in INT_FIELDS else checked_float(val)
        elif math.isfinite(val):
            extra[f["key"].strip()] = val
    if "Pending" in body and cols["log_format"] == "v1":
        cols["log_format"] = "v0"
    return cols, extra


def parse_spec(msg: str) -> dict[str, Any] | None:
    if not (msg.startswith("SpecDecoding metrics:") or msg.startswith("Speculative metrics:")):
        return None
    g: dict[str, Any] = {}
    for key, rx in _SPEC_FIELDS.items():
        m = rx.search(msg)
        if m:
            g[key] = m.group(1)

    def count(key: str) -> int | None:
        return checked_int(float(g[key]), 2**62) if key in g else None

    if msg.startswith("Speculative metrics:"):  # V0 (and V1 before PR #15902), totals since start
        k = count("num_spec_tokens")
        drafted = count("draft_v0")
        return {
            "log_format": "v0",
            "cumulative": True,
            "num_spec_tokens": checked_int(k) if k is not None else None,
            "draft_tokens": drafted,
            "accepted_tokens": count("accepted_v0"),
            "emitted_tokens": count("emitted_v0"),
            "num_drafts": drafted / k if drafted is not None and k else None,
            "acceptance_rate": _num(g.get("acceptance_frac")),
            "system_efficiency": _num(g.get("system_efficiency")),
        }
    per_pos = [float(x) for x in re.split(r"\s*,\s*", g["per_position"])] if "per_position" in g else None
    k = len(per_pos) if per_pos else None
    drafted = count("drafted")
    accepted = count("accepted")
    pct = _num(g.get("avg_acceptance_pct") or g.get("acceptance_pct"))
    return {
        "log_format": "v1",
        "cumulative": False,
        "num_spec_tokens": k,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "num_drafts": drafted / k if drafted is not None and k else None,
        "acceptance_rate": pct / 100
        if pct is not None
        else (accepted / drafted if drafted and accepted is not None else None),
        "mean_acceptance_length": _num(g.get("mean_acceptance_length")),
        "accepted_tput_tok_s": _num(g.get("accepted_tput")),
        "drafted_tput_tok_s": _num(g.get("drafted_tput")),
        "per_position": per_pos,
    }


def _num(s: str | None) -> float | None:
    if s is None:
        return None
    try:
        v = float(s.replace(",", ""))
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _literal_dict(text: str) -> dict[str, Any]:
    start = text.find("{")
    if start < 0:
        return {}
    try:
        d = ast.literal_eval(text[start : start + 20000])
        return d if isinstance(d, dict) else {}
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        found = {}
        for key in _ARGS_KEYS:
            m = re.search(rf"'{key}':\s*('[^']*'|[^,}}]+)", text)
            if m:
                found[key] = m.group(1).strip().strip("'")
        return found


def startup_facts(msg: str) -> list[tuple[str, str, float | None, str | None]]:
    facts: list[tuple[str, str, float | None, str | None]] = []
    for key, rx, group, unit in _STARTUP:
        m = rx.search(msg)
        if m:
            value = m.group(group)
            num = _num(value) if unit or key == "world_size" else None
            facts.append((key, value, num, unit))
    if "with config:" in msg and "LLM engine" in msg:
        for key, value in _CONFIG_PAIR.findall(msg):
            value = value.strip("'")
            if key == "chunked_prefill_enabled":
                key = "enable_chunked_prefill"
            facts.append(
                (key, value, _num(value) if key.endswith("_size") or key == "max_seq_len" else None, _UNITS.get(key))
            )
    if "non-default args:" in msg:
        for key, value in _literal_dict(msg).items():
            if key in _ARGS_KEYS:
                num = value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
                facts.append(
                    (f"arg_{key}", str(value)[:200], _num(str(num)) if num is not None else None, _UNITS.get(key))
                )
    return facts
