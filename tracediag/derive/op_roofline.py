"""Table `op_roofline`: per CPU op, shape, dtype and phase, the kernel time its calls launched against the roofline
of the trace's GPU (SQL and column docs in op_roofline.sql).

A kernel belongs to the CPU op its External id names: the op open when the kernel was launched, i.e. the innermost
(aten::addmm, not the aten::linear around it; aten::_flash_attention_forward, not the SDPA ops above it), so no
kernel counts twice. Every op that launched a kernel gets a row; an op the cost model (tracediag/model/op_cost.py)
does not know, or a trace without shapes, gives a row without cost and a note saying why. Kernels replayed from a
CUDA/HIP graph (their launch is a graph launch) are left out: the op that captured them did not run in this trace.
The phase is that of the engine step holding the op's start. The roofs come from the GPU catalogue
(tracediag.derive.device, tracediag.catalog.gpus): the dense peak of the op's math class (its first input's dtype)
and the memory bandwidth; a GPU the catalogue does not know leaves the roofline columns NULL, and `peak_source`
says why.
"""

from __future__ import annotations

import duckdb

from tracediag.model import op_cost
from tracediag.store import run_sql_file

# The derivation's declaration (tracediag/derive/__init__.py reads it from this source).
REQUIRES = ("kernels", "runtime", "cpu_ops", "inputs", "steps", "steps.phase")
PROVIDES = ("op_roofline",)

LAUNCH_BOUND_NS = 5000  # mean kernel time per call below this: launch latency bounds it (op_roofline.sql says 5000)

_CALLS_SQL = """
CREATE OR REPLACE TEMP TABLE _op_calls AS
WITH graph AS (
    SELECT DISTINCT rank, correlation FROM runtime WHERE correlation IS NOT NULL AND name ILIKE '%GraphLaunch%'
),
kern AS (
    SELECT k.rank, k.external_id, sum(k.dur_ns) AS kernel_ns, count(*) AS kernels
    FROM kernels k ANTI JOIN graph g ON g.rank = k.rank AND g.correlation = k.correlation
    WHERE k.external_id IS NOT NULL
    GROUP BY k.rank, k.external_id
),
ops AS (
    SELECT o.rank, o.external_id, arg_min(o.name, o.ts_ns) AS name, min(o.ts_ns) AS ts_ns,
           arg_min(o.input_dims, o.ts_ns) AS input_dims, arg_min(o.input_types, o.ts_ns) AS input_types
    FROM cpu_ops o SEMI JOIN kern k ON k.rank = o.rank AND k.external_id = o.external_id
    GROUP BY o.rank, o.external_id
),
placed AS (
    SELECT o.*, k.kernel_ns, k.kernels, CASE WHEN o.ts_ns < s.ts_ns + s.dur_ns THEN s.phase END AS phase
    FROM ops o JOIN kern k USING (rank, external_id)
    ASOF LEFT JOIN (SELECT rank, ts_ns, dur_ns, phase FROM steps) s ON o.rank = s.rank AND o.ts_ns >= s.ts_ns
)
SELECT rank, name, phase, input_dims, input_types,
       name || chr(0) || coalesce(input_dims, '') || chr(0) || coalesce(input_types, '') AS sig,
       count(*) AS calls, sum(kernels) AS kernels, sum(kernel_ns) AS kernel_ns
FROM placed GROUP BY rank, name, phase, input_dims, input_types
"""

# canonical dtype of an op's first tensor input -> the math class its matrix work runs at (catalogue key); fp32
# matmuls run without TF32 by default (torch.backends.cuda.matmul.allow_tf32 = False)
_MATH_CLASS = {"bf16": "bf16", "fp16": "fp16", "fp32": "fp32", "fp64": "fp64_matrix", "fp8_e4m3": "fp8",
               "fp8_e5m2": "fp8", "int8": "int8"}  # fmt: skip


class _Roofs:
    """The trace's GPU from the catalogue, and its roofs per math class (or why there are none)."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.spec = None
        self.gpu: str | None = None
        self.why: str | None = None
        from tracediag.catalog.gpus import UPPER_BOUND, catalog_label, peak
        from tracediag.derive import device

        cur = con.cursor()
        named = None
        try:
            named = device.device_named(cur)
            self.spec = device.trace_gpu(cur)
        except Exception as exc:  # the roofs are optional: a catalogue that fails must not fail the store
            self.gpu = named
            self.why = f"the GPU catalogue could not be read ({type(exc).__name__}: {exc})"
            return
        finally:
            cur.close()
        self._peak, self._catalog_label, self._upper = peak, catalog_label, UPPER_BOUND
        if self.spec is None:
            self.gpu = named
            self.why = f"the GPU '{named}' is not in the GPU catalogue" if named else "no GPU named in the trace"
        else:
            self.gpu = self.spec.name

    def _label(self, spec, key: str) -> str:
        try:
            return self._catalog_label(spec, key)
        except KeyError:
            return f"from the GPU catalogue: {spec.name} (no source for {key})"

    def for_dtype(self, kind: str | None, dtype: str | None) -> tuple[float | None, float | None, str]:
        """(peak FLOP/s or None, bandwidth bytes/s or None, source) for an op of this cost family and dtype."""
        if self.spec is None:
            return None, None, self.why or "no GPU"
        if not self.spec.hbm_gbs:
            bw, src = None, f"memory: the GPU catalogue has no memory bandwidth for {self.spec.name}"
        else:
            bw = self.spec.hbm_gbs * 1e9
            src = f"memory: {self._label(self.spec, 'hbm_gbs')}, {self.spec.hbm_gbs:g} GB/s"
        if kind not in (op_cost.GEMM, op_cost.ATTENTION):
            return None, bw, f"{src}; {self._upper}"
        first = (dtype or "").split(",")[0]
        cls = _MATH_CLASS.get(first)
        if cls is None:
            return None, bw, f"{src}; no math class for dtype {first or 'unknown'}: no compute roof"
        tflops, used = self._peak(self.spec, cls)
        if tflops is None:
            return None, bw, f"{src}; the GPU catalogue has no {cls} peak for {self.spec.name}"
        comp = f"compute: {self._label(self.spec, used)}, {used} dense {tflops:g} TFLOP/s"
        return tflops * 1e12, bw, f"{comp}; {src}; {self._upper}"


def _no_cost_note(name: str, dims: str | None) -> str:
    if dims is None or dims in ("", "[]"):
        return "no input shapes in the trace (Kineto record_shapes=False, or an Nsight export)"
    if not op_cost.known(name):
        return "no cost model for this op"
    return "the recorded dims and types do not fit the op's signature: no cost"


def _cost_table(con: duckdb.DuckDBPyConnection):  # -> pa.Table
    import pyarrow as pa

    roofs = _Roofs(con)
    sigs = con.execute("SELECT DISTINCT sig, name, input_dims, input_types FROM _op_calls").fetchall()
    keys = ("sig", "shape", "dtype", "model", "family", "flops", "bytes", "causal", "note", "peak_flops_s",
            "bandwidth_bytes_s", "gpu", "peak_source")  # fmt: skip
    cols: dict[str, list] = {k: [] for k in keys}
    for sig, name, dims_json, types_json in sigs:
        dims, types = op_cost.parse_json(dims_json), op_cost.parse_json(types_json)
        cost = op_cost.op_cost(name, dims, types)
        dtype = op_cost.dtype_text(dims, types)
        kind = cost.kind if cost else None
        peak, bw, source = roofs.for_dtype(kind, dtype)
        cols["sig"].append(sig)
        cols["shape"].append(op_cost.shape_text(dims))
        cols["dtype"].append(dtype)
        cols["model"].append(kind)
        cols["family"].append(op_cost.family(name))
        cols["flops"].append(cost.flops if cost else None)
        cols["bytes"].append(cost.bytes if cost else None)
        cols["causal"].append(cost.causal if cost else None)
        cols["note"].append(cost.note if cost else _no_cost_note(name, dims_json))
        cols["peak_flops_s"].append(peak)
        cols["bandwidth_bytes_s"].append(bw)
        cols["gpu"].append(roofs.gpu)
        cols["peak_source"].append(source)
    types = {"flops": pa.float64(), "bytes": pa.float64(), "causal": pa.bool_(), "peak_flops_s": pa.float64(),
             "bandwidth_bytes_s": pa.float64()}  # fmt: skip
    return pa.table({k: pa.array(v, types.get(k, pa.string())) for k, v in cols.items()})


def build(con: duckdb.DuckDBPyConnection) -> None:
    con.execute(_CALLS_SQL)
    con.register("_op_cost", _cost_table(con))
    try:
        run_sql_file(con, "tracediag.derive", "op_roofline.sql")
    finally:
        con.unregister("_op_cost")
        con.execute("DROP TABLE IF EXISTS _op_calls")


_GIVEN_PEAK = "$peak IS NOT NULL AND flops IS NOT NULL AND split_part(dtype, ',', 1) = $dtype"
_MEASURED_ROOFS_SQL = (
    f"""
UPDATE op_roofline SET
    peak_tflops = CASE WHEN {_GIVEN_PEAK} THEN $peak ELSE peak_tflops END,
    peak_tb_s = coalesce($tb_s, peak_tb_s),
    peak_source = concat_ws('; ',
        CASE WHEN {_GIVEN_PEAK}
             THEN 'compute: --peak-tflops ' || $peak || ' TFLOP/s (given, for the activation dtype ' || $dtype || ')'
        END,
        CASE WHEN $tb_s IS NOT NULL THEN 'memory: --hbm-bandwidth ' || ($tb_s * 1000) || ' GB/s (given)' END,
        'in place of the GPU catalogue''s where given (' || peak_source || ')')
WHERE ({_GIVEN_PEAK}) OR $tb_s IS NOT NULL""",
    """
UPDATE op_roofline SET
    bound = CASE WHEN model = 'memory' AND bytes IS NOT NULL THEN 'memory'
                 WHEN flops IS NOT NULL AND bytes > 0 AND peak_tflops > 0 AND peak_tb_s > 0
                 THEN CASE WHEN flops / bytes >= peak_tflops / peak_tb_s THEN 'compute' ELSE 'memory' END END,
    roofline_ns = CASE WHEN bytes > 0 AND peak_tb_s > 0 AND (flops IS NULL OR peak_tflops > 0)
                       THEN calls * greatest(coalesce(flops / (peak_tflops * 1e12), 0), bytes / (peak_tb_s * 1e12))
                            * 1e9 END""",
    """
UPDATE op_roofline SET pct_of_roofline = CASE WHEN kernel_ns > 0 THEN 100.0 * roofline_ns / kernel_ns END,
                       buyable_ns = kernel_ns - roofline_ns""",
)


def apply_measured_roofs(con: duckdb.DuckDBPyConnection, peak_tflops: float | None, hbm_gbs: float | None) -> None:
    """Replace the catalogue's roofs with measured ones given by flag (--peak-tflops, --hbm-bandwidth), as KRN005
    and KRN007 take them: the bandwidth for every row, the peak for the GEMM and attention rows of the activation
    dtype (the first dtype of the GEMM rows with the most kernel time), and recompute the columns that follow."""
    if not (peak_tflops or hbm_gbs):
        return
    dtype = con.execute(
        "SELECT split_part(dtype, ',', 1) FROM op_roofline WHERE model = 'gemm' AND dtype IS NOT NULL "
        "GROUP BY 1 ORDER BY sum(kernel_ns) DESC, 1 LIMIT 1"
    ).fetchone()
    params = {
        "peak": peak_tflops or None,
        "tb_s": hbm_gbs / 1e3 if hbm_gbs else None,
        "dtype": dtype[0] if dtype else None,
    }
    for statement in _MEASURED_ROOFS_SQL:
        con.execute(statement, params if "$" in statement else None)
