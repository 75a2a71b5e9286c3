"""Candidate engine-step markers per rank (table `step_markers`), read with the grammar of step_grammar.py.

One row per marker range that counts as a step, best kind first (`precedence`: engine annotations, then
ProfilerStep#N, then vLLM `execute_model` frames; steps.sql keeps the best kind present on each rank).
Engine annotations nested in another engine annotation on the same thread (SGLang's forward span
`step[...]` inside the scheduler's `execute_...` span) are not steps of their own: the outer one is the
step, and the inner one is recorded as its forward window (`fwd_ts_ns`, `fwd_dur_ns`), filling the
numbers the outer one lacks.

Names that look like step annotations but match no form are counted per rank in
`step_annotations_unparsed` (rank, name, occurrences) and reported with the inputs.
"""

from __future__ import annotations

import duckdb
import pyarrow as pa

from tracediag.derive.step_grammar import ENGINE, StepMarker, looks_like_step, parse

# The derivation's declaration (tracediag/derive/__init__.py reads it from this source).
REQUIRES = ("annotations", "cpu_ops")
PROVIDES = ("step_annotations_unparsed",)
SCRATCH = ("step_markers",)

SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),
        ("name", pa.string()),
        ("ts_ns", pa.int64()),
        ("dur_ns", pa.int64()),
        ("tid", pa.string()),
        ("precedence", pa.int32()),
        ("marker_source", pa.string()),
        ("marker_form", pa.string()),
        ("ctx_reqs", pa.int32()),
        ("ctx_tokens", pa.int32()),
        ("gen_reqs", pa.int32()),
        ("gen_tokens", pa.int32()),
        ("marker_T", pa.int64()),
        ("marker_phase", pa.string()),
        ("ctx_kv_tokens", pa.int64()),
        ("gen_kv_tokens", pa.int64()),
        ("engine_mode", pa.string()),
        ("marker_extra", pa.string()),
        ("fwd_name", pa.string()),
        ("fwd_ts_ns", pa.int64()),
        ("fwd_dur_ns", pa.int64()),
    ]
)
STEP_ANNOTATIONS_UNPARSED_SCHEMA = pa.schema(
    [
        ("rank", pa.int32()),  # global rank
        ("name", pa.string()),  # the annotation as written
        ("occurrences", pa.int64()),  # how many times it occurs on the rank
    ]
)

# Host-side ranges that can be markers: annotations (not their GPU-side copies), record_function ranges that
# some exporters write as cpu_op events, and the execute_model frames kept from python_function events.
CANDIDATES_SQL = """
SELECT rank, name, ts_ns, dur_ns, tid FROM annotations WHERE source <> 'gpu_user_annotation'
UNION ALL
SELECT rank, name, ts_ns, dur_ns, tid FROM cpu_ops
WHERE name LIKE 'ProfilerStep#%' OR name LIKE 'execute\\_%' ESCAPE '\\' OR name LIKE '%step[%'
ORDER BY rank, tid, ts_ns, dur_ns DESC
"""


def _row(r: tuple, m: StepMarker) -> dict:
    rank, name, ts, dur, tid = r
    return {
        "rank": rank,
        "name": name,
        "ts_ns": ts,
        "dur_ns": dur,
        "tid": tid,
        "precedence": m.precedence,
        "marker_source": m.source,
        "marker_form": m.form,
        "ctx_reqs": m.ctx_reqs,
        "ctx_tokens": m.ctx_tokens,
        "gen_reqs": m.gen_reqs,
        "gen_tokens": m.gen_tokens,
        "marker_T": m.step_tokens(),
        "marker_phase": m.step_phase(),
        "ctx_kv_tokens": m.ctx_kv_tokens,
        "gen_kv_tokens": m.gen_kv_tokens,
        "engine_mode": m.mode,
        "marker_extra": m.extra,
        "fwd_name": None,
        "fwd_ts_ns": None,
        "fwd_dur_ns": None,
    }


_FILLABLE = ("ctx_reqs", "ctx_tokens", "gen_reqs", "gen_tokens", "marker_T", "marker_phase", "ctx_kv_tokens",
             "gen_kv_tokens", "engine_mode")  # fmt: skip


def _fold_nested(rows: list[dict]) -> list[dict]:
    """Engine markers nested in an engine marker on the same rank and thread become the outer one's forward."""
    out: list[dict] = []
    open_outer: dict[tuple, dict] = {}  # (rank, tid) -> the enclosing engine marker
    for r in rows:  # sorted by rank, tid, start, longer first
        key = (r["rank"], r["tid"])
        outer = open_outer.get(key)
        if (
            r["precedence"] == ENGINE
            and outer is not None
            and r["ts_ns"] + r["dur_ns"] <= outer["ts_ns"] + outer["dur_ns"]
        ):
            if outer["fwd_name"] is None:
                outer |= {"fwd_name": r["name"], "fwd_ts_ns": r["ts_ns"], "fwd_dur_ns": r["dur_ns"]}
                if outer["marker_form"] == "detailed" and r["marker_form"] == "sglang_step":
                    # TraceLens' SGLang patch writes the detailed form around SGLang's own forward span
                    outer["marker_source"] = "sglang scheduler annotation (detailed)"
            for k in _FILLABLE:
                if outer[k] is None:
                    outer[k] = r[k]
            continue
        if r["precedence"] == ENGINE:
            open_outer[key] = r
        out.append(r)
    return out


def build(con: duckdb.DuckDBPyConnection) -> None:
    cands = con.execute(CANDIDATES_SQL).fetchall()
    parsed: dict[str, StepMarker | None] = {}
    rows: list[dict] = []
    unparsed: dict[tuple[int, str], int] = {}
    not_steps: list[tuple] = []
    for r in cands:
        name = r[1]
        if name not in parsed:
            parsed[name] = parse(name)
        m = parsed[name]
        if m is None:
            if looks_like_step(name):
                unparsed[(r[0], name)] = unparsed.get((r[0], name), 0) + 1
            continue
        if not m.counts_as_step:
            not_steps.append(r)
            continue
        rows.append(_row(r, m))
    rows = _fold_nested(rows)
    cols = {f.name: [row[f.name] for row in rows] for f in SCHEMA}
    con.register("_markers_in", pa.table(cols, schema=SCHEMA))
    con.execute("CREATE OR REPLACE TEMP TABLE step_markers AS SELECT * FROM _markers_in")
    con.unregister("_markers_in")
    un = pa.table(
        {
            "rank": [k[0] for k in unparsed],
            "name": [k[1] for k in unparsed],
            "occurrences": list(unparsed.values()),
        },
        schema=STEP_ANNOTATIONS_UNPARSED_SCHEMA,
    )
    con.register("_unparsed_in", un)
    # rank, name as written, occurrences: step-like annotations no form of the grammar understands
    con.execute("CREATE OR REPLACE TABLE step_annotations_unparsed AS SELECT * FROM _unparsed_in")
    con.unregister("_unparsed_in")
