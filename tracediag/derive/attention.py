"""Classes the name catalog cannot decide alone: eager attention structure, and unknown kernels.

Runs first among the derivations (it only reads the canonical tables) and updates `cpu_ops.klass` and
`kernels.klass` in place; table `kernel_op_class` records every kernel name whose class came from its
launching op, with that op (evidence for the reader).

1. **Math attention fallback needs attention structure.** A softmax alone is not attention (samplers,
   MoE routers, weighted sums run softmax too). An eager softmax op is attention when it sits between the
   two matmuls of one attention on its thread: the nearest GEMM op before it multiplies `[..., m, k] ×
   [..., k, n]` with `[m, n]` the softmax's last two dims (QKᵀ), and the nearest GEMM op after it takes
   the softmax's shape as its first input (`[..., m, n] × [..., n, d]`: PV). The three ops become
   `attention_fallback` (family `eager_attention`). `aten::_scaled_dot_product_attention_math` is the
   fallback by name, and what it launches is too.
2. **Unknown kernels take their launching op's class.** A kernel the catalog does not know (`other`),
   launched (by correlation id: the runtime call on the host, and the CPU ops around it on its thread)
   inside an op of a known class — `aten::_scaled_dot_product_flash_attention` launching a vendor
   attention kernel — gets that op's class and family. Kernels replayed from a CUDA/HIP graph are left
   as they are: the op around `graph.replay()` did not launch them. A softmax kernel launched inside a
   fallback op (class 1) becomes the fallback too.
"""

from __future__ import annotations

import duckdb
import orjson
import pyarrow as pa

# The derivation's declaration (tracediag/derive/__init__.py reads it from this source).
REQUIRES = ("kernels", "cpu_ops", "runtime")
PROVIDES = ("kernel_op_class",)
# the classes decided from the launching op
UPDATES = ("kernels.klass", "cpu_ops.klass")

SOFTMAX_OPS = ("aten::softmax", "aten::_softmax", "aten::_safe_softmax")
GEMM_OPS = ("aten::matmul", "aten::bmm", "aten::baddbmm", "aten::einsum")
# classes an op may hand to a kernel it launched that the catalog does not know
INHERITABLE = ("attention", "attention_fallback", "gemm", "wo_gemm", "dequant", "norm")

_STRUCTURE_SQL = f"""
WITH g AS (
    SELECT rank, tid, name, ts_ns, ts_ns + dur_ns AS end_ns, input_dims FROM cpu_ops
    WHERE name IN {GEMM_OPS} AND input_dims IS NOT NULL
),
s AS (
    SELECT rank, tid, name, ts_ns, ts_ns + dur_ns AS end_ns, input_dims FROM cpu_ops
    WHERE name IN {SOFTMAX_OPS} AND input_dims IS NOT NULL
),
prev AS (
    SELECT s.*, g.name AS prev_name, g.ts_ns AS prev_ts, g.input_dims AS prev_dims
    FROM s ASOF LEFT JOIN g ON s.rank = g.rank AND s.tid = g.tid AND s.ts_ns >= g.end_ns
)
SELECT p.rank, p.tid, p.ts_ns, p.end_ns, p.input_dims, p.prev_name, p.prev_ts, p.prev_dims,
       n.name AS next_name, n.ts_ns AS next_ts, n.input_dims AS next_dims
FROM prev p ASOF LEFT JOIN (SELECT * FROM g) n ON p.rank = n.rank AND p.tid = n.tid AND p.end_ns <= n.ts_ns
"""


def _dims(raw: str | None) -> list:
    try:
        d = orjson.loads(raw) if raw else []
    except orjson.JSONDecodeError:
        return []
    return d if isinstance(d, list) else []


def _tensor(d: list, i: int) -> list[int] | None:
    t = d[i] if len(d) > i else None
    return t if isinstance(t, list) and len(t) >= 2 and all(isinstance(x, int) for x in t) else None


def is_attention_triple(softmax_dims: str | None, prev_dims: str | None, next_dims: str | None) -> bool:
    """QKᵀ [.., m, k]×[.., k, n] -> softmax [.., m, n] -> PV [.., m, n]×[.., n, d] (shapes as recorded)."""
    s = _tensor(_dims(softmax_dims), 0)
    a, b = _tensor(_dims(prev_dims), 0), _tensor(_dims(prev_dims), 1)
    p, v = _tensor(_dims(next_dims), 0), _tensor(_dims(next_dims), 1)
    if None in (s, a, b, p, v):
        return False
    m, n = s[-2], s[-1]
    qk = a[-2] == m and b[-1] == n and a[-1] == b[-2]
    pv = p[-2:] == [m, n] and v[-2] == n
    return qk and pv


def _as_base_table(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """Make `name` an updatable table when it is a view (a Parquet store attaches canonical tables as views):
    the classes decided here then live in this database's copy, and the derived tables built from it."""
    is_view = con.execute(
        "SELECT count(*) FROM duckdb_views() WHERE view_name = ? AND NOT internal", [name]
    ).fetchall()[0][0]
    if is_view:
        con.execute(f"CREATE TABLE _{name}_copy AS SELECT * FROM {name}")
        con.execute(f"DROP VIEW {name}")
        con.execute(f"ALTER TABLE _{name}_copy RENAME TO {name}")


def _mark_eager_attention(con: duckdb.DuckDBPyConnection) -> int:
    rows = con.execute(_STRUCTURE_SQL).fetchall()
    marks: list[tuple] = []
    for rank, tid, ts, _end, dims, _pn, prev_ts, prev_dims, _nn, next_ts, next_dims in rows:
        if prev_ts is not None and next_ts is not None and is_attention_triple(dims, prev_dims, next_dims):
            marks += [(rank, tid, ts), (rank, tid, prev_ts), (rank, tid, next_ts)]
    if marks:
        _as_base_table(con, "cpu_ops")
        t = pa.table({"rank": [m[0] for m in marks], "tid": [m[1] for m in marks], "ts_ns": [m[2] for m in marks]})
        con.register("_eager_in", t)
        con.execute(
            """UPDATE cpu_ops SET klass = 'attention_fallback', family = 'eager_attention'
            FROM (SELECT DISTINCT * FROM _eager_in) e
            WHERE cpu_ops.rank = e.rank AND cpu_ops.tid = e.tid AND cpu_ops.ts_ns = e.ts_ns
              AND list_contains(?::VARCHAR[], cpu_ops.name)""",
            [list(SOFTMAX_OPS + GEMM_OPS)],
        )
        con.unregister("_eager_in")
    return len(marks) // 3


_LAUNCHING_OPS_SQL = """
-- kernels to decide: unknown to the catalog, or softmax kernels; not replayed from a graph
CREATE OR REPLACE TEMP TABLE _k AS
SELECT k.rank, k.correlation, k.name, k.klass, k.family, r.tid, r.ts_ns AS launch_ts
FROM kernels k JOIN runtime r ON r.rank = k.rank AND r.correlation = k.correlation
WHERE (k.klass = 'other' OR k.family = 'softmax') AND r.name NOT ILIKE '%GraphLaunch%';

CREATE OR REPLACE TEMP TABLE _k_ops AS
SELECT k.rank, k.correlation, k.name AS kernel, k.klass AS kernel_klass,
       o.name AS op, o.klass, o.family, o.dur_ns
FROM _k k JOIN cpu_ops o ON o.rank = k.rank AND o.tid = k.tid
    AND o.ts_ns <= k.launch_ts AND o.ts_ns + o.dur_ns >= k.launch_ts
WHERE o.klass IN ('attention', 'attention_fallback', 'gemm', 'wo_gemm', 'dequant', 'norm');

CREATE OR REPLACE TEMP TABLE _k_decided AS
SELECT rank, correlation, any_value(kernel) AS kernel,
       -- a fallback op around the launch decides first; else the innermost classified op
       coalesce(arg_min(op, dur_ns) FILTER (WHERE klass = 'attention_fallback'), arg_min(op, dur_ns)) AS op,
       coalesce(arg_min(klass, dur_ns) FILTER (WHERE klass = 'attention_fallback'), arg_min(klass, dur_ns)) AS klass,
       coalesce(arg_min(family, dur_ns) FILTER (WHERE klass = 'attention_fallback'), arg_min(family, dur_ns)) AS family,
       any_value(kernel_klass) AS kernel_klass
FROM _k_ops GROUP BY rank, correlation;

DELETE FROM _k_decided WHERE kernel_klass <> 'other' AND klass <> 'attention_fallback';

UPDATE kernels SET klass = d.klass, family = d.family
FROM _k_decided d WHERE kernels.rank = d.rank AND kernels.correlation = d.correlation;

-- rank, kernel name, launching op, class/family given, kernels: classes that came from the launching op
CREATE OR REPLACE TABLE kernel_op_class AS
SELECT rank, kernel AS name, op, klass, family, count(*) AS kernels FROM _k_decided GROUP BY ALL;

DROP TABLE IF EXISTS _k; DROP TABLE IF EXISTS _k_ops; DROP TABLE IF EXISTS _k_decided;
"""


def build(con: duckdb.DuckDBPyConnection) -> None:
    _mark_eager_attention(con)
    pending = con.execute("SELECT count(*) FROM kernels WHERE klass = 'other' OR family = 'softmax'").fetchall()[0][0]
    if not pending:
        con.execute(
            "CREATE OR REPLACE TABLE kernel_op_class (rank INTEGER, name VARCHAR, op VARCHAR, klass VARCHAR, "
            "family VARCHAR, kernels BIGINT)"
        )
        return
    _as_base_table(con, "kernels")
    con.execute(_LAUNCHING_OPS_SQL)
