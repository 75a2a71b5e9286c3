"""nccl-tests output (`all_reduce_perf`, `all_gather_perf`, ...): the per-size result table.

The table format is nccl-tests' own (NVIDIA/nccl-tests src/common.cu, `Reporter`): a header line

    #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong

with one column group per placement (out-of-place, then in-place), then one row per message size.
Older versions have no `root` column and an `error` column instead of `#wrong`; `-C 1` names the time
column `cputime`; validation off prints `N/A`. Lines that do not fit the header (NCCL INFO logs,
warnings) are skipped. `# Collective test starting: all_reduce_perf`, the `#  Rank N Group G Pid P on
HOST device D [BUS] NAME` lines and `# Avg bus bandwidth` are kept as facts of the run.

A row that fits the header but holds a value out of range or not a number (a size beyond 2**48, a time of
1e30 or nan, `²` for a digit) is a bad record: left out and counted (`inputs.bad_records`, examples in
`meta_json.bad_records`); the rest of the table still counts.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa

from tracediag.errors import InputError
from tracediag.ingest import validate as val
from tracediag.ingest.base import IngestOptions, Parsed
from tracediag.ingest.validate import BadRecords
from tracediag.inputfile import read_input

TEST_RE = re.compile(r"^#\s*Collective test starting:\s*(\S+)")
VERSION_RE = re.compile(r"^#\s*nccl-tests version\s+(\S+)")
RANK_RE = re.compile(
    r"^#\s+Rank\s+(\d+)\s+Group\s+(\d+)\s+Pid\s+(\d+)\s+on\s+(\S+)\s+device\s+(\d+)\s+\[([^\]]*)\]\s*(.*?)\s*$"
)
AVG_RE = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([0-9.eE+-]+)")
PARAMS_RE = re.compile(r"^#\s*nThread\s+\d+")
TIME_NAMES = ("time", "cputime")
WRONG_NAMES = ("#wrong", "error")
# test binary -> collective (nccl-tests src/*.cu file names)
OPS = {
    "all_reduce_perf": "all_reduce",
    "all_gather_perf": "all_gather",
    "reduce_scatter_perf": "reduce_scatter",
    "alltoall_perf": "all_to_all",
    "broadcast_perf": "broadcast",
    "reduce_perf": "reduce",
    "gather_perf": "gather",
    "scatter_perf": "scatter",
    "sendrecv_perf": "send_recv",
    "hypercube_perf": "hypercube",
}
SCHEMA = pa.schema(
    [
        ("source_path", pa.string()),
        ("test", pa.string()),
        ("op", pa.string()),
        ("nranks", pa.int32()),
        ("placement", pa.string()),
        ("size_bytes", pa.int64()),
        ("count_elements", pa.int64()),
        ("dtype", pa.string()),
        ("redop", pa.string()),
        ("root", pa.int32()),
        ("time_ns", pa.int64()),
        ("time_kind", pa.string()),
        ("algbw_gbs", pa.float64()),
        ("busbw_gbs", pa.float64()),
        ("wrong", pa.int64()),
    ]
)


def _header(line: str) -> list[str] | None:
    """Column names of a result-table header line, or None."""
    if not line.startswith("#"):
        return None
    cols = line[1:].split()
    if len(cols) >= 6 and cols[:2] == ["size", "count"] and "busbw" in cols and any(t in cols for t in TIME_NAMES):
        return cols
    return None


_TIME_US_MAX = 1e12  # 11.6 days for one collective: beyond any benchmark
_GBS_MAX = 1e9  # GB/s


class _BadValue(ValueError):
    pass


def _int(tok: str, lo: int = 0, hi: int = val.COUNT_MAX) -> int:
    """A decimal integer token (ASCII digits only: `²` passes str.isdigit but is no number) in [lo, hi]."""
    digits = tok[1:] if tok.startswith("-") else tok
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 20) or not lo <= int(tok) <= hi:
        raise _BadValue(tok)
    return int(tok)


def _float(tok: str, hi: float) -> float:
    try:
        x = float(tok)
    except ValueError:
        raise _BadValue(tok) from None
    if not (0 <= x <= hi):  # also false for nan
        raise _BadValue(tok)
    return x


def _num(tok: str, kind, *bounds):
    """A value of the table; N/A (validation off) and - are None."""
    if tok in ("N/A", "-"):
        return None
    return kind(tok, *bounds)


def _result_records(source_path: str, test: str | None, cols: list[str], toks: list[str]) -> list[dict]:
    """One result row as records: one per placement (out-of-place, in-place) with its time, algorithm and bus
    bandwidth and #wrong. Raises _BadValue for a value out of bounds, ValueError or IndexError for a malformed row."""
    row = dict(zip(cols, toks))
    t_idx = [i for i, c in enumerate(cols) if c in TIME_NAMES]
    lead = {
        "size_bytes": _int(row["size"]),
        "count_elements": _int(row["count"]),
        "dtype": row.get("type"),
        "redop": row.get("redop"),
        "root": _num(row["root"], _int, -1, val.RANK_MAX) if "root" in row else None,  # -1: none
    }
    recs = []
    for k, i in enumerate(t_idx):
        time_us = _num(toks[i], _float, _TIME_US_MAX)
        wrong_tok = toks[i + 3] if i + 3 < len(toks) else None
        wrong = _num(wrong_tok, _int, 0, val.INT64_MAX) if cols[i + 3] == "#wrong" and wrong_tok is not None else None
        recs.append(
            lead
            | {
                "source_path": source_path,
                "test": test,
                "op": OPS.get(test or ""),
                "nranks": None,
                "placement": "out-of-place" if k == 0 else "in-place",
                "time_ns": round(time_us * 1000) if time_us is not None else None,
                "time_kind": cols[i],
                "algbw_gbs": _num(toks[i + 1], _float, _GBS_MAX),
                "busbw_gbs": _num(toks[i + 2], _float, _GBS_MAX),
                "wrong": wrong,
            }
        )
    return recs


def parse_nccl_tests(path: Path, order: int, options: IngestOptions) -> Parsed:
    text = read_input(path, "nccl-tests output", options.memory_limit).decode("utf-8", errors="replace")
    test = version = avg = params = None
    ranks: list[dict] = []
    cols: list[str] | None = None
    rows: dict[str, list] = {f.name: [] for f in SCHEMA}
    skipped = 0
    bad = BadRecords()
    for raw in text.splitlines():
        line = raw.rstrip()
        if not line.strip():
            continue
        if m := TEST_RE.match(line):
            test, cols = m.group(1), None
            continue
        if m := VERSION_RE.match(line):
            version = m.group(1)
            continue
        if m := RANK_RE.match(line):
            try:
                rank, device = _int(m.group(1), 0, val.RANK_MAX), _int(m.group(5), 0, val.INT32_MAX)
            except _BadValue as exc:
                bad.skipped("rank line", "line ignored", [f"{exc}: {line}"])
                continue
            ranks.append({"rank": rank, "host": m.group(4), "device": device, "bus_id": m.group(6), "name": m.group(7)})
            continue
        if m := AVG_RE.match(line):
            try:
                avg = _float(m.group(1), _GBS_MAX)
            except _BadValue:
                bad.skipped("# Avg bus bandwidth", "value ignored", [line])
            continue
        if PARAMS_RE.match(line):
            params = line.lstrip("#").strip()
            continue
        if h := _header(line):
            cols = h
            continue
        if line.lstrip().startswith("#") or cols is None:
            continue
        toks = line.split()
        if len(toks) != len(cols) or not toks[0].isdigit():
            skipped += 1  # interleaved logs (NCCL INFO ...), truncated rows
            continue
        try:
            recs = _result_records(str(path), test, cols, toks)
        except _BadValue as exc:
            bad.skipped("result row", "row left out", [f"{exc} in: {line}"])
            continue
        except (ValueError, IndexError):
            skipped += 1
            continue
        for rec in recs:  # both placements of a row, or neither
            for key, v in rec.items():
                rows[key].append(v)
    n = len(rows["size_bytes"])
    if not n:
        raise InputError(
            path,
            "no nccl-tests result table: expected a '#  size  count  type ... time  algbw  busbw' header "
            "followed by one row per message size",
        )
    nranks = len({r["rank"] for r in ranks}) or None
    rows["nranks"] = [nranks] * n
    meta = {
        "test": test,
        "nccl_tests_version": version,
        "nranks": nranks,
        "hosts": sorted({r["host"] for r in ranks}),
        "devices": ranks,
        "parameters": params,
        "avg_busbw_gbs": avg,
        "rows": n,
        "lines_skipped": skipped,
    }
    if bad:
        meta["bad_records"] = bad.to_meta()
    names = sorted({r["name"] for r in ranks})
    inputs_row = {
        "profiler": f"nccl-tests {version}" if version else "nccl-tests",
        "file_bytes": Path(path).stat().st_size,
        "rank": None,
        "device_name": names[0] if len(names) == 1 else (", ".join(names) or None),
        "meta_json": json.dumps(meta),
        "bad_records": bad.records,
    }
    return Parsed(
        path=str(path),
        format="nccl-tests",
        inputs_rows=[inputs_row],
        tables={"nccl_tests": pa.table(rows, schema=SCHEMA)},
    )
