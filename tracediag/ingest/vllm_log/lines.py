"""A vLLM log's lines into its tables: physical lines joined into logical ones (Joiner: hard-wraps), each logical
line split into its records (several may be glued on one line), and each record's message, or a line that holds
none (an access line, a uvicorn line, a PyTorch/NCCL message, or an unknown one), into LogState.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, BinaryIO

from tracediag.catalog import failures
from tracediag.ingest.vllm_log.decode import BadValue, Clock, parse_spec, parse_stats, startup_facts
from tracediag.ingest.vllm_log.patterns import (
    _ACCESS,
    _BANNER,
    _CONTINUES,
    _FAST,
    _OUTER_TIME,
    _PREEMPT,
    _STARTS_RECORD,
    _UVICORN,
    _V0_PREFIX_HIT,
    EVENT_PATTERNS,
    RECORD,
)
from tracediag.ingest.vllm_log.tables import MAX_TEXT, LogState
from tracediag.inputfile import open_stream
from tracediag.memory import read_bytes_budget


def open_log(path: Path) -> BinaryIO:
    """The log as a buffered binary stream, gunzipped when it starts with the gzip magic (a regular file only, and
    a gzip stream bounded: inputfile.open_stream)."""
    return open_stream(path, "log")[0]


class Joiner:
    """Physical lines in, logical lines out (to `emit(first physical line number, text)`), hard-wraps joined.

    A line that starts no record continues the previous one when it starts in lower case or with a digit or
    '%' (a wrap mid-word or mid-number), or when the previous line ended at a width the file already wrapped at.
    The pieces are joined once, at the end (joining as they come copied the whole so far for each: 200,000 wrapped
    lines ran for hours), and a joined line ends at the read budget (memory.read_bytes_budget) like a physical one.
    """

    def __init__(self, emit: Any, starts_record: re.Pattern[str] = _STARTS_RECORD, longest: int | None = None) -> None:
        self.emit = emit
        self.starts_record = starts_record
        self.widths: set[int] = set()
        self.start = 0  # physical line number of the pending logical line (0: none)
        self.parts: list[str] = []
        self.size = 0
        self.longest = longest if longest is not None else read_bytes_budget()
        self.last_len = 0

    def feed(self, i: int, line: str) -> None:
        if (
            self.start
            and line
            and self.last_len >= 60
            and self.size + len(line) <= self.longest
            and not self.starts_record.match(line)
            and (_CONTINUES.match(line) or self.last_len in self.widths)
        ):
            self.widths.add(self.last_len)
            self.parts.append(line)
            self.size += len(line)
        else:
            if self.start:
                self.emit(self.start, self.parts[0] if len(self.parts) == 1 else "".join(self.parts))
            self.start, self.parts, self.size = i, [line], len(line)
        self.last_len = len(line)

    def flush(self) -> None:
        """Emit the pending line: the next line starts a record."""
        if self.start:
            self.emit(self.start, self.parts[0] if len(self.parts) == 1 else "".join(self.parts))
        self.start, self.parts, self.size = 0, [], 0


def _message(st: LogState, n: int, msg: str, base: dict) -> None:
    """One vLLM record's message into the tables."""
    try:
        parsed = parse_stats(msg)
    except BadValue as exc:
        st.bad(n, msg, str(exc))
        return
    if parsed is not None:
        cols, extra = parsed
        if "running" not in cols or ("waiting" not in cols and "swapped" not in cols):
            st.bad(n, msg, "stats line without Running and Waiting/Pending (truncated?)")
            return
        st.stats.add({**base, **cols, "extra_json": json.dumps(extra) if extra else None})
        st.last_engine[base["pid"]] = cols.get("engine")
        st.run_active = True
        return
    m = _V0_PREFIX_HIT.match(msg)
    if m:  # V0's own line right after the stats line of the same interval
        if st.stats.n and st.stats.last("pid") == base["pid"] and st.stats.last("prefix_hit_pct") is None:
            st.stats.set_last("prefix_hit_pct", float(m["gpu"]))
        return
    try:
        sp = parse_spec(msg)
    except BadValue as exc:
        st.bad(n, msg, str(exc))
        return
    if sp is not None:
        if sp.get("draft_tokens") is None:
            st.bad(n, msg, "speculative-decoding line without a drafted-token count")
            return
        st.spec.add({**base, **sp, "engine": st.last_engine.get(base["pid"]), "text": msg[:MAX_TEXT]})
        st.run_active = True
        return
    pm = _PREEMPT.search(msg)
    if pm:
        cum = int(pm["cum"]) if pm["cum"] and len(pm["cum"]) < 18 else None
        st.event(
            base, "preemption", msg, seq_group=pm["seq"][:100], mode=pm["mode"][:20], cumulative=cum, own_time=True
        )
        st.run_active = True
        return
    if _BANNER.search(msg) and st.run_active:
        st.new_run(n, "startup banner")
        base = {**base, "run": st.run}
    if _event(st, base, msg, own_time=True):
        return
    for key, value, num, unit in startup_facts(msg):
        st.fact(base, key, value, num, unit, msg)


def _event(st: LogState, base: dict, text: str, own_time: bool, engine: str = "vllm") -> bool:
    fail = failures.match(text, engine)
    if fail is not None:
        st.event(base, fail.kind, text, own_time=own_time, pattern=fail.id)
        st.run_active = True
        return True
    for kind, rx in EVENT_PATTERNS:
        if rx.search(text):
            st.event(base, kind, text, own_time=own_time)
            if kind in ("shm_broadcast_wait", "request_finished", "shutdown"):
                st.run_active = True
            return True
    if _BANNER.search(text):
        st.event(base, "startup", text, own_time=own_time)
        return False  # the banner also carries the version fact
    return False


def _other_line(st: LogState, n: int, line: str) -> None:
    """A line that holds no vLLM record: an access line, a uvicorn line, a PyTorch/NCCL message, or unknown."""
    stripped = line.strip()
    if not stripped:
        return
    base = st.at(None, n, st.last_ts_text, None, None) | {"t_s": st.last_t}
    a = _ACCESS.search(line)
    own = False
    o = _OUTER_TIME.match(line)
    if o and (st.outer_clock or st.records == 0):  # only when no vLLM record gives the file its clock
        st.outer_clock = True
        t = st.clock(o["date"], o["time"])
        base = st.at(t, n, f"{o['date']} {o['time']}", None, None)
        own = t is not None
    if a:
        st.event(base, "access", f"{a['method']} {a['path']} {a['status']}", http_status=int(a["status"]), own_time=own)
        st.run_active = True
        return
    u = _UVICORN.search(line)
    if u:
        msg = u["msg"]
        kind = "shutdown" if msg.startswith(("Shutting down", "Application shutdown", "Finished server")) else "ready"
        if msg.startswith(("Started server process", "Waiting for application", "Uvicorn running")):
            kind = "startup"
        st.event(base, kind, msg, own_time=own)
        if kind == "shutdown":
            st.run_active = True  # whatever starts next is a new run
        return
    if _event(st, base, line, own_time=own):
        return
    st.unknown_line(n, stripped)


def _logical_line(st: LogState, n: int, line: str) -> None:
    """One logical line of a vLLM log into the tables."""
    f = _FAST.match(line)
    if f:
        g = f.groupdict()  # one call for every group (a subscript each costs as much as the match)
        st.records += 1
        pid = int(g["pid"]) if g["pid"] else None
        engine = int(g["engine"]) if g["engine"] else None
        v1 = g["w"] is not None
        row = st.at(st.clock(g["date"], g["time"]), n, f"{g['date']} {g['time']}", g["proc"], pid)  # a new dict
        row["engine"] = engine
        row["log_format"] = "v1" if v1 else "v0"
        row["prompt_tput_tok_s"] = float(g["p"])
        row["gen_tput_tok_s"] = float(g["g"])
        row["running"] = int(g["r"])
        row["waiting"] = int(g["w"] if v1 else g["pe"])
        row["swapped"] = None if v1 else int(g["sw"])
        row["kv_usage_pct"] = float(g["kv"])
        row["prefix_hit_pct"] = float(g["ph"]) if g["ph"] else None
        row["cpu_kv_usage_pct"] = float(g["cpu"]) if g["cpu"] else None
        st.stats.add(row)
        st.last_engine[pid] = engine
        st.run_active = True
        return
    matches = list(RECORD.finditer(line)) if (".py:" in line or " - vllm" in line or ":vllm." in line) else []
    if not matches:
        _other_line(st, n, line)
        return
    if matches[0].start() > 0:
        head = line[: matches[0].start()]
        if _ACCESS.search(head) or failures.match(head, "vllm") or any(rx.search(head) for _, rx in EVENT_PATTERNS):
            _other_line(st, n, head)
    for j, m in enumerate(matches):
        st.records += 1
        end = matches[j + 1].start() if j + 1 < len(matches) else len(line)
        msg = line[m.end() : end].strip()
        if m["ydate"]:
            date, time_, proc, pid_s = m["ydate"], m["ytime"], None, None
        elif m["dlevel"]:  # Python's default layout carries no time
            date, time_, proc, pid_s = None, None, None, None
        else:
            date, time_, proc, pid_s = m["date"], m["time"], m["proc"], m["pid"]
        pid = int(pid_s) if pid_s and len(pid_s) < 10 else None
        if st.outer_clock:  # a record after wrapper-timed lines: its own clock wins from here on
            st.outer_clock, st.clock = False, Clock()
        t_s = st.clock(date, time_) if date else None
        base = st.at(t_s, n, f"{date} {time_}" if date else None, proc, pid)
        _message(st, n, msg, base)
