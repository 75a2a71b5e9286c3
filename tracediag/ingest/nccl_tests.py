"""nccl-tests output (`all_reduce_perf`, `all_gather_perf`, ...): the per-size result table.

The table format is nccl-tests' own (NVIDIA/nccl-tests src/common.cu, `Reporter`): a header line

    #       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong

with one column group per placement (out-of-place, then in-place), then one row per message size.
Older versions have no `root` column and an `error` column instead of `#wrong`; `-C 1` names the time
column `cputime`; validation off prints `N/A`. Lines that do not fit the header (NCCL INFO logs,
warnings) are skipped. `# Collective test starting: all_reduce_perf`, the `#  Rank N Group G Pid P on
HOST device D [BUS] NAME` lines and `# Avg bus bandwidth` are kept as facts of the run.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa

from tracediag.errors import InputError
from tracediag.ingest.base import IngestOptions, Parsed

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


def _num(tok: str, kind: type):
    if tok in ("N/A", "-"):
        return None
    return kind(tok)


def parse_nccl_tests(path: Path, order: int, options: IngestOptions) -> Parsed:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        raise InputError(path, f"cannot read file ({exc.strerror or exc})") from None
    test = version = avg = params = None
    ranks: list[dict] = []
    cols: list[str] | None = None
    rows: dict[str, list] = {f.name: [] for f in SCHEMA}
    skipped = 0
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
            ranks.append(
                {
                    "rank": int(m.group(1)),
                    "host": m.group(4),
                    "device": int(m.group(5)),
                    "bus_id": m.group(6),
                    "name": m.group(7),
                }
            )
            continue
        if m := AVG_RE.match(line):
            avg = float(m.group(1))
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
            row = dict(zip(cols, toks))
            t_idx = [i for i, c in enumerate(cols) if c in TIME_NAMES]
            lead = {
                "size_bytes": int(row["size"]),
                "count_elements": int(row["count"]),
                "dtype": row.get("type"),
                "redop": row.get("redop"),
                "root": _num(row["root"], int) if "root" in row else None,
            }
            for k, i in enumerate(t_idx):
                time_us = _num(toks[i], float)
                wrong_tok = toks[i + 3] if i + 3 < len(toks) else None
                wrong = _num(wrong_tok, int) if cols[i + 3] == "#wrong" and wrong_tok is not None else None
                rec = lead | {
                    "source_path": str(path),
                    "test": test,
                    "op": OPS.get(test or ""),
                    "nranks": None,
                    "placement": "out-of-place" if k == 0 else "in-place",
                    "time_ns": round(time_us * 1000) if time_us is not None else None,
                    "time_kind": cols[i],
                    "algbw_gbs": _num(toks[i + 1], float),
                    "busbw_gbs": _num(toks[i + 2], float),
                    "wrong": wrong,
                }
                for key, v in rec.items():
                    rows[key].append(v)
        except (ValueError, IndexError):
            skipped += 1
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
    names = sorted({r["name"] for r in ranks})
    inputs_row = {
        "profiler": f"nccl-tests {version}" if version else "nccl-tests",
        "file_bytes": Path(path).stat().st_size,
        "rank": None,
        "device_name": names[0] if len(names) == 1 else (", ".join(names) or None),
        "meta_json": json.dumps(meta),
    }
    return Parsed(
        path=str(path),
        format="nccl-tests",
        inputs_rows=[inputs_row],
        tables={"nccl_tests": pa.table(rows, schema=SCHEMA)},
    )
