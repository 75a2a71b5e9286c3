"""Kernels replayed from CUDA/HIP graphs: how much GPU time no CPU op launched, and — given the trace of the graph
capture (--graph-capture) — the op that captured each replayed kernel.

A `cudaGraphLaunch` / `hipGraphLaunch` runs every kernel of its graph under the launch's correlation id; the host
op around the launch (`graph.replay()`, vLLM's piecewise runner) did not launch them, so op-based attribution stops
at the launch. `replay_summary` states the share of GPU kernel time inside graph launches: unattributed unless a
capture trace is given.

Matching a capture to its replay (`attribute`): the capture trace records each capture as
`cudaStreamBeginCapture` … `cudaStreamEndCapture` on a thread, and inside it one launch call per captured kernel,
whose args name the kernel (`kernel`) and link to the CPU op that issued it (`External id`); the replay records
one graph launch per graph and, under its correlation id, the graph's kernels. Graphs are replayed in the order
they were captured here (vLLM's piecewise pieces run in model order); graph i of the replay is matched to capture i
only when both hold the same number of kernels and every kernel name agrees position by position (kernels of one
graph sorted by start). A graph that does not match is left unattributed and counted; nothing is guessed.

The capturing GEMM ops' input shapes then reach the rules that read `gemm_shapes` (`overlay_gemm_shapes`,
docs/method.md): they are not a derivation of the store, since only the analysis given the capture has them.
"""

from __future__ import annotations

import bisect
import math
import weakref
from pathlib import Path
from typing import Any

import duckdb
import orjson

from tracediag.errors import InputError
from tracediag.store import query_dicts

LAUNCH_CALLS = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "hipLaunchKernel",
    "hipModuleLaunchKernel",
    "hipExtModuleLaunchKernel",
    "hipExtLaunchKernel",
)
BEGIN = ("cudaStreamBeginCapture", "hipStreamBeginCapture")
END = ("cudaStreamEndCapture", "hipStreamEndCapture")

_REPLAY_SQL = """
SELECT k.rank, r.correlation, r.ts_ns AS launch_ts, k.name, k.ts_ns, k.dur_ns
FROM runtime r JOIN kernels k ON k.rank = r.rank AND k.correlation = r.correlation
WHERE r.name ILIKE '%GraphLaunch%'
ORDER BY k.rank, r.ts_ns, r.correlation, k.ts_ns
"""


def replay_summary(con: duckdb.DuckDBPyConnection) -> dict[str, Any] | None:
    """Graph launches, the kernels they replay and their share of the GPU kernel time; None without any."""
    row = con.execute(
        "SELECT count(DISTINCT (k.rank, k.correlation)), count(*), coalesce(sum(k.dur_ns), 0) FROM kernels k "
        "JOIN runtime r ON r.rank = k.rank AND r.correlation = k.correlation WHERE r.name ILIKE '%GraphLaunch%'"
    ).fetchone()
    launches, kernels, ns = row
    if not kernels:
        return None
    total = con.execute("SELECT coalesce(sum(dur_ns), 0) FROM kernels").fetchone()[0] or 1
    return {
        "graph_launches": launches,
        "replayed_kernels": kernels,
        "replayed_ns": int(ns),
        "kernel_ns": int(total),
        "replayed_share": ns / total,
    }


def read_capture(path: str | Path) -> Capture:
    """The captures of a Kineto capture trace, in order: per capture its launches (kernel name, the capturing op
    and its input dims), and the events left out as malformed. Read once per file version (a capture serves every
    analysis of its replay)."""
    p = Path(path)
    key = _file_version(p)
    if key is not None and key in _CACHE:
        return _CACHE[key]
    capture = _read_capture(p)
    if key is not None:
        _CACHE.clear()
        _CACHE[key] = capture
    return capture


class Capture(list):
    """The captures (a list of captures, each a list of launch rows) and `bad_records`: events of the capture
    trace left out because a field the matching reads is not of its type (args not an object, an External id that
    is not an integer or a string, a non-numeric ts or dur, a name that is not text, dims nested beyond JSON's
    depth): counted, never an internal error."""

    bad_records: int = 0


_CACHE: dict[tuple[str, int, int], Capture] = {}


def _file_version(p: Path) -> tuple[str, int, int] | None:
    """(resolved path, mtime ns, size) of the capture file: what its reading and its matching are cached by."""
    try:
        st = p.stat()
    except OSError:
        return None
    return (str(p.resolve()), st.st_mtime_ns, st.st_size)


def _number(v: Any) -> float | None:
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _record(e: Any) -> dict[str, Any] | None:
    """A complete event with the fields the matching reads, each of its type; None for anything else."""
    if not isinstance(e, dict) or e.get("ph") != "X":
        return None
    if _number(e.get("ts")) is None:
        raise ValueError
    args = e.get("args", {})
    ext = args.get("External id") if isinstance(args, dict) else None
    if (
        not isinstance(args, dict)
        or not isinstance(e.get("name"), str)
        or ("dur" in e and _number(e.get("dur")) is None)
        or (ext is not None and (isinstance(ext, bool) or not isinstance(ext, (int, str))))
        or ("kernel" in args and not isinstance(args["kernel"], str))
    ):
        raise ValueError
    return e


def _read_capture(p: Path) -> Capture:
    from tracediag.inputfile import read_input

    try:
        doc = orjson.loads(read_input(p, "graph-capture trace"))
    except orjson.JSONDecodeError as exc:
        raise InputError(p, f"graph-capture trace is not valid JSON ({exc})") from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise InputError(p, "graph-capture trace has no traceEvents list")
    xs, bad = [], 0
    for e in events:
        try:
            r = _record(e)
        except ValueError:
            bad += 1
            continue
        if r is not None:
            xs.append(r)
    ops: dict[Any, dict[str, Any]] = {}
    for e in xs:
        if e.get("cat") == "cpu_op":
            ext = e.get("args", {}).get("External id")
            if ext is not None and (ext not in ops or e.get("dur", 0) < ops[ext].get("dur", 0)):
                ops[ext] = e
    spans = sorted(e["ts"] for e in xs if e["name"] in BEGIN)
    ends = sorted(e["ts"] for e in xs if e["name"] in END)
    launches = sorted((e for e in xs if e["name"] in LAUNCH_CALLS), key=lambda e: e["ts"])
    starts = [e["ts"] for e in launches]
    captures = Capture()
    for b, end in zip(spans, ends):  # the launches inside each capture by bisection: n log n, not captures × launches
        rows = []
        for e in launches[bisect.bisect_left(starts, b) : bisect.bisect_right(starts, end)]:
            a = e.get("args", {})
            op = ops.get(a.get("External id")) or {}
            oa = op.get("args", {})
            try:
                dims, types = _json(oa.get("Input Dims")), _json(oa.get("Input type"))
            except orjson.JSONEncodeError:  # nested beyond what JSON text may hold: the op's dims are not read
                bad += 1
                dims = types = None
            rows.append(
                {"kernel": a.get("kernel"), "op": op.get("name"), "op_id": oa.get("External id"),
                 "op_input_dims": dims, "op_input_types": types}
            )  # fmt: skip
        captures.append(rows)
    captures.bad_records = bad
    return captures


def _json(v: Any) -> str | None:
    return orjson.dumps(v).decode() if v is not None else None


# the summary attribute() made on a connection, by capture path: the GEMM overlay and the fitness statement of one
# analysis both need it; the temporary table it wrote lives as long as the connection
_ATTRIBUTED: weakref.WeakKeyDictionary[duckdb.DuckDBPyConnection, dict[tuple[str, int, int], dict[str, Any]]] = (
    weakref.WeakKeyDictionary()
)


def attribute(con: duckdb.DuckDBPyConnection, path: str | Path) -> dict[str, Any]:
    """Match the replayed graphs to the captures (module docstring), write the temporary table `graph_kernel_ops` (rank,
    correlation, kernel ts_ns, kernel, capture index, position, op, op_id (its External id in the capture),
    op_input_dims, op_input_types) and return the summary; once per connection and capture file version."""
    key = _file_version(Path(path))
    done = _ATTRIBUTED.get(con, {})
    if key is not None and key in done and _has_ops_table(con):
        return done[key]
    summary = _attribute(con, path)
    if key is not None:
        _ATTRIBUTED[con] = {key: summary}
    return summary


def _has_ops_table(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(
        con.execute(
            "SELECT count(*) FROM duckdb_tables() WHERE temporary AND table_name = 'graph_kernel_ops'"
        ).fetchone()[0]
    )


def _ops_schema() -> list:
    import pyarrow as pa

    return [
        ("rank", pa.int32()), ("correlation", pa.int64()), ("ts_ns", pa.int64()), ("kernel", pa.string()),
        ("capture", pa.int32()), ("position", pa.int32()), ("op", pa.string()), ("op_id", pa.string()),
        ("op_input_dims", pa.string()), ("op_input_types", pa.string()),
    ]  # fmt: skip


def _attribute(con: duckdb.DuckDBPyConnection, path: str | Path) -> dict[str, Any]:
    rows = query_dicts(con, _REPLAY_SQL)
    # no graph launch in the replay: nothing to attribute, and the capture is not read
    captures = read_capture(path) if rows else Capture()
    graphs: dict[tuple[int, int], list[dict[str, Any]]] = {}
    for r in rows:
        graphs.setdefault((r["rank"], r["correlation"]), []).append(r)
    by_rank: dict[int, list[list[dict[str, Any]]]] = {}
    for (rank, _), ks in graphs.items():  # rows come in launch order
        by_rank.setdefault(rank, []).append(ks)
    out, matched, unmatched, ns = [], 0, 0, 0
    for rank, launched in by_rank.items():
        for i, ks in enumerate(launched):
            cap = captures[i] if i < len(captures) else None
            if cap is None or len(cap) != len(ks) or any(c["kernel"] != k["name"] for c, k in zip(cap, ks)):
                unmatched += 1
                continue
            matched += 1
            for pos, (c, k) in enumerate(zip(cap, ks)):
                ns += k["dur_ns"]
                op_id = None if c["op_id"] is None else str(c["op_id"])
                dims = (c["op_input_dims"], c["op_input_types"])
                out.append((rank, k["correlation"], k["ts_ns"], k["name"], i, pos, c["op"], op_id, *dims))
    import pyarrow as pa

    table = pa.table(
        {name: pa.array([r[i] for r in out], type=t) for i, (name, t) in enumerate(_ops_schema())}
    )  # one insert of all rows (executemany took 0.2 s for 361)
    con.register("_graph_kernel_ops_in", table)
    try:
        con.execute("CREATE OR REPLACE TEMP TABLE graph_kernel_ops AS SELECT * FROM _graph_kernel_ops_in")
    finally:
        con.unregister("_graph_kernel_ops_in")
    by_op = query_dicts(
        con,
        "SELECT g.op, count(*) AS kernels, sum(k.dur_ns) AS time_ns FROM graph_kernel_ops g JOIN kernels k "
        "ON k.rank = g.rank AND k.correlation = g.correlation AND k.ts_ns = g.ts_ns AND k.name = g.kernel "
        "GROUP BY g.op ORDER BY time_ns DESC, g.op",
    )
    return {
        "capture_trace": str(path),
        "captures": len(captures),
        "capture_read": bool(rows),  # False: the replay launches no graph, so the capture was not read
        "capture_bad_records": captures.bad_records,
        "graphs_matched": matched,
        "graphs_unmatched": unmatched,
        "kernels_attributed": len(out),
        "attributed_ns": int(ns),
        "by_op": by_op,
    }


def statement(con: duckdb.DuckDBPyConnection, capture: str | None = None) -> dict[str, Any] | None:
    """What the report says about graph-replayed kernels: the unattributed share, or what the capture attributed."""
    s = replay_summary(con)
    if s is None:
        return None
    if capture:
        a = attribute(con, capture)
        s |= a
        left = s["replayed_ns"] - a["attributed_ns"]
        s["unattributed_share"] = left / s["kernel_ns"]
        s["why"] = (
            f"{a['kernels_attributed']:,} of {s['replayed_kernels']:,} graph-replayed kernels attributed to the ops "
            f"that captured them ({a['graphs_matched']} of {s['graph_launches']} graph launches matched by graph "
            f"and kernel order, names equal; {a['graphs_unmatched']} left unattributed); "
            f"{s['unattributed_share']:.1%} of GPU kernel time has no CPU op"
        )
    else:
        s["unattributed_share"] = s["replayed_share"]
        s["why"] = (
            f"{s['replayed_share']:.1%} of GPU kernel time ({s['replayed_kernels']:,} kernels in {s['graph_launches']} "
            "graph launches) has no CPU op: the ops that captured the graphs are not in this trace (pass the capture "
            "trace with --graph-capture)"
        )
    return s


def overlay_gemm_shapes(con: duckdb.DuckDBPyConnection, path: str | Path) -> int:
    """Let the gemm_shapes readers (SHP001/SHP002, KRN007, the quantization check...) see the GEMMs a graph
    replayed: a temporary `gemm_shapes` over the stored one, with a `source` column ('cpu op' or 'graph capture';
    gemm_shapes_graph.sql), for the analysis that was given the capture. The capturing op's input dims are those
    the graph was captured with: its weight dims (K, N) hold for every replay, its activation rows are the capture's
    batch size. Returns the rows added; drop_gemm_overlay removes the table."""
    from importlib import resources

    attribute(con, path)
    base = f'"{con.execute("SELECT current_database()").fetchone()[0]}".main.gemm_shapes'
    sql = resources.files("tracediag.derive").joinpath("gemm_shapes_graph.sql").read_text(encoding="utf-8")
    con.execute(sql.replace("{base}", base))
    return con.execute("SELECT count(*) FROM temp.gemm_shapes WHERE source = 'graph capture'").fetchone()[0]


def drop_gemm_overlay(con: duckdb.DuckDBPyConnection) -> None:
    """Remove overlay_gemm_shapes' temporary table (the stored gemm_shapes is visible again)."""
    con.execute("DROP TABLE IF EXISTS temp.main.gemm_shapes")
