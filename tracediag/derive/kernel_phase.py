"""A step's phase inferred from the attention kernels it launched, when no annotation or attention shape gives it.

Engines run different attention kernels for prefill and for decode: a prefill-only kernel (FlashAttention-2's
non-split `flash_fwd_kernel`, FlashInfer's BatchPrefill, Triton `_fwd_kernel` of context_attention_fwd, TRT-LLM
context FMHA, AITER fmha_fwd) runs only in steps that prefill, and a decode kernel (paged attention, Triton
`_fwd_kernel_stage1/2` and `_fwd_grouped_kernel_stage1` flash decoding, FlashInfer BatchDecode, XQA/MMHA,
FlashMLA, split-KV combine) only in steps that decode. The catalog (tracediag/catalog, `phase_hint` of each
attention pattern, from the sources cited there) says which; kernels that serve both (`any`: unified attention,
varlen FA with a paged KV cache) say nothing. Per step with no phase yet (steps.phase NULL): prefill-only
kernels alone → prefill, decode-only kernels alone → decode, both (or a kernel that runs a batch of both, such as
FlashInfer POD) → mixed; no phase-specific kernel → the phase stays unknown. The step's `phase_source` is
'inferred from kernels'. `step_kernel_phase` holds, for every step with a phase-specific attention kernel (an
annotated one too, so the two can be compared), the phase those kernels call for and the kernels it rests on.
A training job (derive/layout.py `workload`) gets none: its forward pass runs prefill kernels without prefilling.

The kernels are placed in steps as kernel_steps.sql does: by their launching runtime call (correlation id; graph
replays count in the step that launched the graph).
"""

from __future__ import annotations

import duckdb

from tracediag.catalog import classify_kernel
from tracediag.derive.layout import workload

# The derivation's declaration (tracediag/derive/__init__.py reads it from this source).
REQUIRES = ("kernels", "runtime", "cpu_ops", "annotations", "kernels.klass", "steps", "steps.T")
PROVIDES = ("step_kernel_phase",)
UPDATES = ("steps.phase",)

SOURCE = "inferred from kernels"
NAMES_KEPT = 3  # distinct kernel names kept per step and phase hint (evidence)

_PLACED_SQL = """
CREATE OR REPLACE TABLE step_kernel_phase AS
WITH launch AS (
    SELECT rank, correlation, min(ts_ns) AS ts_ns FROM runtime WHERE correlation > 0 GROUP BY rank, correlation
),
act AS (
    SELECT k.rank, k.name, h.hint, l.ts_ns AS launch_ts_ns
    FROM kernels k JOIN _kernel_phase_hint h ON h.name = k.name
    JOIN launch l ON l.rank = k.rank AND l.correlation = k.correlation
),
placed AS (
    SELECT a.*, s.step_id FROM act a ASOF JOIN (SELECT rank, step_id, ts_ns, dur_ns FROM steps) s
        ON a.rank = s.rank AND a.launch_ts_ns >= s.ts_ns
    WHERE a.launch_ts_ns < s.ts_ns + s.dur_ns
),
per AS (
    SELECT rank, step_id,
           count(*) FILTER (WHERE hint = 'prefill') AS prefill_kernels,   -- prefill-only attention kernels launched
           count(*) FILTER (WHERE hint = 'decode') AS decode_kernels,     -- decode-only attention kernels launched
           count(*) FILTER (WHERE hint = 'mixed') AS mixed_kernels,       -- kernels running both in one call
           list_sort(list_distinct(list(name) FILTER (WHERE hint = 'prefill')))[1:{keep}] AS prefill_names,
           list_sort(list_distinct(list(name) FILTER (WHERE hint = 'decode')))[1:{keep}] AS decode_names,
           list_sort(list_distinct(list(name) FILTER (WHERE hint = 'mixed')))[1:{keep}] AS mixed_names
    FROM placed GROUP BY rank, step_id
)
SELECT rank, step_id,
       CASE WHEN mixed_kernels > 0 OR (prefill_kernels > 0 AND decode_kernels > 0) THEN 'mixed'
            WHEN prefill_kernels > 0 THEN 'prefill' ELSE 'decode' END AS phase,
       prefill_kernels, decode_kernels, mixed_kernels, prefill_names, decode_names, mixed_names
FROM per
"""


def build(con: duckdb.DuckDBPyConnection) -> None:
    import pyarrow as pa  # here, not at import: the rules read SOURCE from a store opened without pyarrow

    cur = con.cursor()  # workload() leaves its one-row result open: on a cursor of its own
    try:
        training = workload(cur)[0] == "training"  # a training step's forward runs prefill kernels: not a prefill
    finally:
        cur.close()
    names = (
        []
        if training
        else [r[0] for r in con.execute("SELECT DISTINCT name FROM kernels WHERE klass = 'attention'").fetchall()]
    )
    hints = {n: classify_kernel(n).phase_hint for n in names}  # a few dozen distinct names, each classified once
    table = pa.table(
        {
            "name": pa.array([n for n, h in hints.items() if h in ("prefill", "decode", "mixed")], pa.string()),
            "hint": pa.array([h for h in hints.values() if h in ("prefill", "decode", "mixed")], pa.string()),
        }
    )
    con.register("_kernel_phase_hint", table)
    try:
        con.execute(_PLACED_SQL.format(keep=NAMES_KEPT))
    finally:
        con.unregister("_kernel_phase_hint")
    con.execute(
        "UPDATE steps SET phase = p.phase, phase_source = ? FROM step_kernel_phase p "
        "WHERE steps.phase IS NULL AND steps.rank = p.rank AND steps.step_id = p.step_id",
        [SOURCE],
    )
