"""Numbers in units people read: ms/µs, KiB/MiB/GiB, %, GB/s, times relative to the trace start, labels in words.

The unit of a value comes from its key, as the store and the rules name them (`*_ns`, `*_bytes`, `*_share`,
`*_gbs`, `ts_ns`...). Everything here returns plain text; the HTML layer escapes it. Raw values stay in
findings.json and trace.duckdb.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

NBSP = "\u00a0"  # between a number and its unit: "1.44 s" never wraps between the two
NAME_CHARS = 96  # a long name (kernel, annotation, path) is cut here where it is displayed
TITLE_CHARS = 2000  # and its hover text is cut here (the full name is in findings.json and trace.duckdb)

# Model symbols and other keys that are already the words people use.
_VERBATIM = {"L", "H", "I", "h", "H_kv", "D", "T", "B", "S", "p", "a", "b", "e_a", "2L", "T_star", "f", "k", "n"}

_LABELS = {
    "step_id": "step",
    "ts_ns": "start",
    "dur_ns": "duration",
    "T_star": "T*",
    "T_bucket": "T bucket",
    "t_source": "T from",
    "phase_source": "phase from",
    "marker_source": "step marker",
    "r2": "R²",
    "fit_r2": "fit R²",
    "alpha_us": "α",
    "alpha_s": "α",
    "bus_bw_gbs": "bus bandwidth",
    "algbw_gbs": "algorithm bandwidth",
    "busbw_gbs": "bus bandwidth",
    "klass": "class",
    "pg_name": "process group",
    "pg_desc": "process group description",
    "pg_size": "process group size",
    "in_nelems": "input elements",
    "out_nelems": "output elements",
    "rank_steps": "rank-steps",
    "median_abs_rel_residual": "median |relative residual|",
    "fit_median_abs_rel_residual": "fit median |relative residual|",
    "e2el": "end-to-end latency",
    "kv_usage_pct": "KV-cache usage",
    "prefix_hit_pct": "prefix-cache hit rate",
    "prompt_tput_tok_s": "prompt throughput",
    "gen_tput_tok_s": "generation throughput",
    "output_tput_tok_s": "output throughput",
    "request_throughput_rps": "request throughput",
    "request_rate_rps": "request rate",
    "time_ns": "time",
    "total_ns": "total time",
    "step_ns": "step time",
    "cpu_dur_ns": "host duration",
    "host_dur_ns": "host duration",
    "t_s": "time",
    "vs_phase_median_share": "vs phase median",
    "ts_text": "timestamp (as logged)",
}

_WORDS = {
    "gpu": "GPU",
    "cpu": "CPU",
    "kv": "KV",
    "hbm": "HBM",
    "bw": "bandwidth",
    "dur": "duration",
    "ts": "start",
    "num": "number of",
    "tput": "throughput",
    "avg": "mean",
    "pct": "",
    "nelems": "elements",
    "ttft": "TTFT",
    "tpot": "TPOT",
    "itl": "ITL",
    "mfu": "MFU",
    "sm": "SM",
    "sms": "SMs",
    "ar": "all-reduce",
    "nvlink": "NVLink",
    "nvlinks": "NVLinks",
    "pcie": "PCIe",
    "numa": "NUMA",
    "pci": "PCI",
    "id": "id",
    "p2p": "P2P",
    "tp": "TP",
    "w4a16": "W4A16",
    "rel": "relative",
    "abs": "absolute",
    "rps": "",
    "tok": "tokens",
    "gbs": "",
    "tflops": "",
    "qps": "",
}

_UNIT_TOKENS = ("ns", "us", "ms", "s", "bytes", "gbs", "tflops", "pct", "rps")


def _tokens(key: str) -> list[str]:
    return [t for t in key.split("_") if t]


def unit_of(key: str) -> str | None:
    """The unit a key's values are in: ts, ns, us, ms, s, bytes, share, pct, gbs, tflops, rps, tok_s,
    ns_per_token, ms_per_token, ratio, or None."""
    k = key.lower()
    t = _tokens(k)
    if not t:
        return None
    if k.startswith("vs_") or k.endswith("_change"):
        return "change"
    if "per" in t and "token" in t:
        return "ns_per_token" if "ns" in t else "ms_per_token" if "ms" in t else "us_per_token" if "us" in t else None
    if ("ts" in t and "ns" in t) or k.endswith(("_start_ns", "_end_ns")) or k in ("ts_ns", "first_ts_ns"):
        return "ts"
    if t[-1] == "s" and len(t) >= 2 and t[-2] == "tok":
        return "tok_s"
    for u in ("ns", "us", "ms", "bytes", "gbs", "tflops", "pct", "rps"):
        if u in t:
            return u
    if t[-1] == "s" and len(t) >= 2:
        return "s"
    if {"share", "fraction", "impact", "attainment"} & set(t) or k.startswith("share"):
        return "share"
    if "ratio" in t:
        return "ratio"
    return None


def label(key: str) -> str:
    """A column or value name in words: 'gpu_span_ns' -> 'GPU span', 'step_id' -> 'step'."""
    if key in _LABELS:
        return _LABELS[key]
    if key in _VERBATIM:
        return key
    t = _tokens(key)
    while len(t) > 1 and t[-1].lower() in _UNIT_TOKENS:
        t.pop()
    # a unit inside the name ('step_ns_median') is shown by the value: 'step median' (not before 'per': 'ns per token')
    t = [w for i, w in enumerate(t) if i == 0 or w.lower() not in _UNIT_TOKENS or t[i + 1 : i + 2] == ["per"]]
    if len(t) > 1 and t[-1] == "id":
        t.pop()
    words = [_WORDS.get(w.lower(), w) if w not in _VERBATIM else w for w in t]
    return " ".join(w for w in words if w) or key


def _sig(v: float, digits: int = 3) -> str:
    """v with `digits` significant digits, thousands separators, never an exponent for |v| >= 1e-3."""
    if v == 0:
        return "0"
    a = abs(v)
    if a >= 10 ** (digits - 1):
        return f"{v:,.0f}"
    if a < 1e-3:
        return f"{v:.2e}".replace("e-0", "e-")
    decimals = digits - 1 - math.floor(math.log10(a))
    s = f"{v:.{max(decimals, 0)}f}"
    return s.rstrip("0").rstrip(".") if "." in s else s


def duration(ns: float | None) -> str:
    """12.3 ms, 850 µs, 420 ns, 1.24 s, 2.5 min."""
    if ns is None:
        return "—"
    a = abs(ns)
    if a < 1e3:
        return f"{_sig(ns)}\u00a0ns"
    if a < 1e6:
        return f"{_sig(ns / 1e3)}\u00a0µs"
    if a < 1e9:
        return f"{_sig(ns / 1e6)}\u00a0ms"
    if a < 120e9:
        return f"{_sig(ns / 1e9)}\u00a0s"
    if a < 7200e9:
        return f"{_sig(ns / 60e9)}\u00a0min"
    return f"{_sig(ns / 3600e9)}\u00a0h"


def size(b: float | None) -> str:
    """Bytes in binary units: 512 B, 24 KiB, 1.5 MiB, 80 GiB."""
    if b is None:
        return "—"
    a = abs(b)
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if a >= scale:
            return f"{_sig(b / scale)}\u00a0{unit}"
    return f"{int(b):,}\u00a0B" if float(b).is_integer() else f"{_sig(b)}\u00a0B"


def percent(x: float | None) -> str:
    """A share (0-1) in percent: 65%, 4.9%, 0.42%."""
    if x is None:
        return "—"
    v = x * 100
    if v == 0:
        return "0%"
    if abs(v) >= 10:
        return f"{v:,.0f}%"
    if abs(v) >= 1:
        return f"{v:.1f}%"
    return f"{_sig(v, 2)}%"


def number(v: Any) -> str:
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if math.isnan(v):
            return "not a number"
        if math.isinf(v):
            return "unbounded" if v > 0 else "−unbounded"
        if v.is_integer() and abs(v) < 1e15:
            return f"{int(v):,}"
        return _sig(v)
    return str(v)


def relative_ts(ns: int | float, t0: int | None) -> str:
    """A timestamp as time since the trace start, in one unit for a whole column: '31.030 ms'."""
    if t0 is None:
        return f"{ns / 1000:,.3f}\u00a0µs"
    d = ns - t0
    if abs(d) < 1e12:
        return f"{d / 1e6:,.3f}\u00a0ms"
    return f"{d / 1e9:,.3f}\u00a0s"


def trace_us(ns: int | float) -> str:
    """The timestamp as the Chrome/Kineto JSON writes it (µs), to search the trace file for."""
    return f"{ns / 1000:.3f}"


def value_text(key: str, v: Any, t0: int | None = None) -> str:
    """One value in words and units, by the unit its key implies."""
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, (list, tuple)):
        if not v:
            return "none"
        items = [value_text(key, x, t0) for x in v]
        if "range" in key and len(items) == 2:
            return f"{items[0]} – {items[1]}"
        return ", ".join(items)
    if isinstance(v, dict):
        if not v:
            return "none"
        parts = []
        for k, x in v.items():
            sub = str(k) if unit_of(str(k)) else key  # a child key with no unit of its own takes the parent's
            parts.append(f"{label(str(k))}: {value_text(sub, x, t0)}")
        return "; ".join(parts)
    if not isinstance(v, (int, float)):
        return str(v)
    u = unit_of(key)
    if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
        return number(v)
    if u == "ts":
        return relative_ts(v, t0)
    if u == "ns":
        return duration(v)
    if u == "us":
        return duration(v * 1e3)
    if u == "ms":
        return duration(v * 1e6)
    if u == "s":
        return duration(v * 1e9)
    if u == "bytes":
        return size(v)
    if u == "share":
        return percent(v)
    if u == "change":
        return ("+" if v > 0 else "−" if v < 0 else "±") + percent(abs(v))
    if u == "pct":
        return f"{_sig(v)}%"
    if u == "gbs":
        return f"{_sig(v)}\u00a0GB/s"
    if u == "tflops":
        return f"{_sig(v)}\u00a0TFLOP/s"
    if u == "rps":
        return f"{_sig(v)}\u00a0req/s"
    if u == "tok_s":
        return f"{_sig(v)}\u00a0tok/s"
    if u in ("ns_per_token", "us_per_token", "ms_per_token"):
        scale = {"ns_per_token": 1, "us_per_token": 1e3, "ms_per_token": 1e6}[u]
        return f"{duration(v * scale)}/token"
    if u == "ratio":
        return f"{_sig(v)}×"
    if key in ("r2", "fit_r2"):
        return f"{v:.3f}"
    return number(v)


def ellipsize(text: str, limit: int = NAME_CHARS) -> tuple[str, str | None]:
    """(shown text, hover text or None): a long text cut in the middle-free way people read names —
    the start kept, then '…'. The hover text is itself bounded (TITLE_CHARS)."""
    if len(text) <= limit:
        return text, None
    hover = text if len(text) <= TITLE_CHARS else text[:TITLE_CHARS] + f"… ({len(text):,} characters)"
    return text[: limit - 1] + "…", hover


def ellipsize_path(text: str, limit: int = 60) -> tuple[str, str | None]:
    """A path cut at its start, keeping the file and its folders nearest to it: '…/wide_tp2/config.json'."""
    if len(text) <= limit:
        return text, None
    parts = text.replace("\\", "/").split("/")
    tail = parts[-1]
    for p in reversed(parts[:-1]):
        if len(p) + len(tail) + 2 > limit - 1:
            break
        tail = f"{p}/{tail}"
    shown = "…/" + tail if len(tail) < len(text) else text
    return (shown if len(shown) <= limit else "…" + text[-(limit - 1) :]), ellipsize(text, TITLE_CHARS)[0]


@dataclass(frozen=True)
class Cell:
    text: str
    title: str | None = None  # hover text (full name, absolute timestamp)
    cls: str = ""  # "num" (right-aligned, never wrapped), "name" (one line, ellipsised) or ""


def cell(key: str, v: Any, t0: int | None = None) -> Cell:
    """A table cell for the value `v` of column `key`."""
    if v is None:
        return Cell("—", cls="num")
    u = unit_of(key)
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        text = value_text(key, v, t0)
        title = f"{trace_us(v)} µs in the trace file" if u == "ts" else None
        return Cell(text, title, "num")
    if isinstance(v, (list, tuple, dict)):
        text, title = ellipsize(value_text(key, v, t0), 160)
        return Cell(text, title)
    text, title = ellipsize(str(v))
    return Cell(text, title, "name" if title or len(text) > 40 else "")
